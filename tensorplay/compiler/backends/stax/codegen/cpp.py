"""C++ code generation for one fused group (chapter §8).

The kernel of a group with iteration space (outer, inner) reads::

    extern "C" void kernel3(const float* __restrict__ arg0, float* __restrict__ buf2) {
        #pragma omp parallel for                       // Alg. 8.1: parallel depth
        for (int64_t x0 = 0; x0 < 8192; x0 += 1) {     // rows (merged outer loops)
            // phase 0: reductions and the elementwise work they read
            tp::Vec<float> acc_buf1_0(0.0f), acc_buf1_1(0.0f);   // several accumulators
            int64_t r0 = 0;
            for (; r0 + 2 * VL <= 2048; r0 += 2 * VL) { ... }    // unrolled vector body
            for (; r0 + VL <= 2048; r0 += VL) { ... }
            if (r0 < 2048) { const int n = 2048 - r0; ... }      // masked tail (loadn/storen)
            float buf1_v = tp::reduce_add(acc_buf1_0 + acc_buf1_1);
            // phase 1: elementwise work that reads the row's reductions ...
        }
    }

Vectorisation is visible in the source: ``tp::Vec<T>`` (cpp_prelude.h, GCC vector extensions,
AVX-512 / AVX2 / scalar chosen by the compile flags) with one instruction stream for every dtype.
Loops whose every access is mergeable (Prop. 6.3: stride of the outer = size x stride of the inner)
are merged.  Each compute function is evaluated with :class:`CppHandler`, which prints every
``ops`` call as one line of C++ (common subexpressions are printed once).
"""
from __future__ import annotations

import math

import sympy
import torch

from .. import choices
from ..ir import Unsupported
from ..ops_handler import COMPARE, set_handler
from ..scheduler import Group, kernel_index, kernel_vars

__all__ = ["generate_kernel", "CTYPE"]

CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
         torch.bool: "int32_t"}   # bool values live as 0/1 int32 lanes in registers
STORAGE_CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
                 torch.bool: "bool"}
UNROLL = 2   # vector accumulators per reduction (latency hiding, invariant 6)


def _vt(dtype):
    try:
        return f"tp::Vec<{CTYPE[dtype]}>"
    except KeyError:
        raise Unsupported(f"dtype {dtype} in a native kernel") from None


def _lit(v, dtype):
    if dtype == torch.bool:
        return "1" if v else "0"
    if dtype.is_floating_point:
        ct = CTYPE[dtype]
        v = float(v)
        if math.isnan(v):
            return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{ct}>::infinity()"
        r = repr(v)
        if "e" not in r and "." not in r:
            r += ".0"
        return r + ("f" if dtype == torch.float32 else "")
    iv = int(v)
    if dtype == torch.int64:
        return f"int64_t({iv}LL)" if abs(iv) > 2**31 - 1 else f"int64_t({iv})"
    return f"int32_t({iv})"


class _Val:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype

    def __str__(self):
        return self.name


def cexpr(e) -> str:
    """Print an affine sympy index expression as C++ int64 arithmetic."""
    e = sympy.expand(e)
    if e.is_Integer:
        return f"{int(e)}"
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        return "(" + " + ".join(cexpr(a) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(cexpr(a) for a in e.args) + ")"
    raise Unsupported(f"non-affine index expression {e}")


class CppHandler:
    """Prints ``ops`` calls as C++ lines inside the current loop body."""

    def __init__(self, kernel, mode):
        self.k = kernel
        self.mode = mode           # "vec", "tail" or "row"
        self.lines = []
        self.cse = {}

    def _emit(self, expr, dtype):
        key = (expr, dtype)
        if key in self.cse:
            return self.cse[key]
        name = self.k.tmp()
        self.lines.append(f"auto {name} = {expr};")
        v = _Val(name, dtype)
        self.cse[key] = v
        return v

    # -- memory and indices ---------------------------------------------------------------------------
    def load(self, name, index):
        k = self.k
        local = k.local_value(name, self)
        if local is not None:
            return local
        dtype = k.dtype_of(name)
        expr = k.scratch_expr() if name in k.scratch else k.translate(index)
        vt = _vt(dtype)
        ptr = k.ptr(name)
        coeff = k.inner_coeff(expr)
        base = cexpr(expr)
        if dtype == torch.bool:
            return self._emit(f"tp_load_bool({ptr} + {base}, {coeff}, {self._n()})", dtype)
        if self.mode == "row" or coeff == 0:
            return self._emit(f"{vt}({ptr}[{base}])", dtype)
        if coeff == 1:
            if self.mode == "tail":
                return self._emit(f"{vt}::loadn({ptr} + {base}, n)", dtype)
            return self._emit(f"{vt}::load({ptr} + {base})", dtype)
        return self._emit(f"tp_gather<{CTYPE[dtype]}>({ptr} + {base}, {coeff}, {self._n()})", dtype)

    def _n(self):
        return "n" if self.mode == "tail" else "VL"

    def index_expr(self, expr, dtype):
        e = self.k.translate(expr)
        coeff = self.k.inner_coeff(e) if self.mode != "row" else 0
        base = cexpr(e)
        v = self._emit(f"(tp::Vec<int64_t>::iota(0) * tp::Vec<int64_t>({coeff}) + tp::Vec<int64_t>({base}))"
                       if coeff else f"tp::Vec<int64_t>({base})", torch.int64)
        return v if dtype == torch.int64 else self.to_dtype(v, dtype)

    def constant(self, value, dtype):
        from ..op_lowerings import cdt
        dtype = dtype or cdt()
        return self._emit(f"{_vt(dtype)}({_lit(value, dtype)})", dtype)

    def to_dtype(self, x, dtype, src_dtype=None):
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"tp_bool_from_mask({x} != {_vt(x.dtype)}(0))", torch.bool)
        return self._emit(f"tp::cast<{CTYPE[dtype]}>({x})", dtype)

    def where(self, c, a, b):
        return self._emit(f"tp::where(tp_mask_from_bool<{CTYPE[a.dtype]}>({c}), {a}, {b})", a.dtype)

    def masked(self, mask, body, other):
        raise Unsupported("masked loads")

    # -- arithmetic -------------------------------------------------------------------------------------
    def add(self, a, b):
        return self._emit(f"({a} + {b})", a.dtype)

    def sub(self, a, b):
        return self._emit(f"({a} - {b})", a.dtype)

    def mul(self, a, b):
        return self._emit(f"({a} * {b})", a.dtype)

    def truediv(self, a, b):
        return self._emit(f"({a} / {b})", a.dtype)

    def neg(self, a):
        return self._emit(f"(-{a})", a.dtype)

    def reciprocal(self, a):
        return self._emit(f"({_vt(a.dtype)}({_lit(1, a.dtype)}) / {a})", a.dtype)

    def logical_and(self, a, b):
        return self._emit(f"({a} & {b})", torch.bool)

    def logical_or(self, a, b):
        return self._emit(f"({a} | {b})", torch.bool)

    def logical_xor(self, a, b):
        return self._emit(f"({a} ^ {b})", torch.bool)

    def bitwise_and(self, a, b):
        return self._emit(f"({a} & {b})", a.dtype)

    def bitwise_or(self, a, b):
        return self._emit(f"({a} | {b})", a.dtype)

    def bitwise_xor(self, a, b):
        return self._emit(f"({a} ^ {b})", a.dtype)

    def bitwise_not(self, a):
        return self._emit(f"(~{a})", a.dtype)

    def logical_not(self, a):
        return self._emit(f"({a} ^ tp::Vec<int32_t>(1))", torch.bool)

    def __getattr__(self, name):
        if name in COMPARE:
            sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
            return lambda a, b: self._emit(f"tp_bool_from_mask({a} {sym} {b})", torch.bool)
        if name in ("isnan", "isinf"):
            return lambda a: self._emit(f"tp_bool_from_mask(tp::{name}({a}))", torch.bool) \
                if a.dtype.is_floating_point else self._emit("tp::Vec<int32_t>(0)", torch.bool)
        if name in ("maximum", "minimum", "pow", "fmod", "remainder", "floordiv"):
            return lambda a, b: self._emit(f"tp::{name}({a}, {b})", a.dtype)
        if name in ("abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin",
                    "cos", "tan", "tanh", "sigmoid", "erf", "erfc", "floor", "ceil", "trunc", "round"):
            return lambda a: self._emit(f"tp::{name}({a})", a.dtype)
        raise AttributeError(name)


_IDENTITY = {"sum": 0, "prod": 1, "any": 0, "all": 1}
_COMBINE = {"sum": "({a} + {b})", "prod": "({a} * {b})", "max": "tp::maximum({a}, {b})",
            "min": "tp::minimum({a}, {b})", "any": "({a} | {b})", "all": "({a} & {b})"}
_HREDUCE = {"sum": "tp::reduce_add", "prod": "tp::reduce_mul", "max": "tp::reduce_max", "min": "tp::reduce_min",
            "any": "tp::reduce_max", "all": "tp::reduce_min"}


def _identity(rtype, dtype):
    if rtype in _IDENTITY:
        return _lit(_IDENTITY[rtype], dtype)
    ct = CTYPE[dtype]
    if dtype.is_floating_point:
        return f"{'-' if rtype == 'max' else ''}std::numeric_limits<{ct}>::infinity()"
    return f"std::numeric_limits<{ct}>::{'lowest' if rtype == 'max' else 'max'}()"


class KernelGen:
    def __init__(self, sched, group: Group, name: str):
        self.sched, self.g, self.name = sched, group, name
        self.sig = sched.kernel_sig(group)
        self._tmp = 0
        self.graph = sched.graph
        self.dtypes = {b.name: b.layout.dtype for b in list(self.graph.inputs) + list(self.graph.buffers)}
        for n, t in self.graph.constants.items():
            self.dtypes[n] = t.dtype
        self.locals = sched.local_buffers(group)
        self.placements = {n.name: Group.placement(n, self.sig) for n in group.nodes}
        if any(p is None for p in self.placements.values()):
            raise Unsupported(f"node placement in group {group}")
        self.xs, self.rs = kernel_vars(self.sig)
        self.row_values = {}      # local reduce/outer results: name -> C++ scalar variable
        self.phase_values = {}    # local inner values of the current iteration: name -> _Val
        self.scratch = {}         # local inner values read in a later phase: name -> array name
        self.params = {}          # buffer name -> (ctype, is_output)

    def tmp(self):
        self._tmp += 1
        return f"t{self._tmp}"

    def dtype_of(self, name):
        return self.dtypes[name]

    def ptr(self, name):
        if name in self.scratch:
            return self.scratch[name]
        if name not in self.params:
            self.params[name] = (STORAGE_CTYPE[self.dtypes[name]], False)
        return name

    # -- indices ----------------------------------------------------------------------------------------
    def translate(self, expr):
        """Rewrite an index over the per-dim kernel vars into the merged loop vars."""
        e = sympy.expand(sympy.sympify(expr))
        return e.xreplace(self._merge_subs) if self._merge_subs else e

    def inner_coeff(self, expr):
        v = self.vec_var
        if v is None:
            return 0
        c = sympy.diff(expr, v)
        if not c.is_Integer:
            raise Unsupported(f"index {expr} is not affine in the vector loop")
        return int(c)

    def local_value(self, name, handler):
        if name in self.row_values:
            dt = self.dtypes[name]
            return handler._emit(f"{_vt(dt)}({self.row_values[name]})", dt)
        if name in self.phase_values:
            return self.phase_values[name]
        return None

    # -- structure --------------------------------------------------------------------------------------
    def _phases(self):
        ph = {}
        for n in self.g.nodes:
            pl = self.placements[n.name]
            p = 0
            for r in n.reads:
                if r in ph:
                    rp, rpl = ph[r]
                    if rpl in ("reduce", "outer"):
                        p = max(p, rp + (0 if pl == "outer" else 1))
                    else:
                        p = max(p, rp)
            ph[n.name] = (p, pl)
        nphase = 1 + max((p for p, _ in ph.values()), default=0)
        return ph, nphase

    def _collect_exprs(self):
        """All (buffer, index) accesses of the group, over the per-dim kernel variables."""
        exprs = []
        self.accesses = []
        for n in self.g.nodes:
            pl = self.placements[n.name]
            idx = kernel_index(n, pl, self.sig)
            for name, e in n.record(idx):
                exprs.append(e)
                self.accesses.append((name, e))
            if n.name not in self.locals:
                e = n.buf.layout.index(idx[0])
                exprs.append(e)
                self.accesses.append((n.name, e))
        return exprs

    def _check_bounds(self):
        """§6.8: prove every access in range (no run-time checks) and pick the index width."""
        from ..bounds import bound, check_access, index_type
        outer, inner = self.sig
        ranges = {v: (0, n - 1) for v, n in zip(self.xs, outer)}
        ranges.update({v: (0, n - 1) for v, n in zip(self.rs, inner)})
        extents = {b.name: b.layout.storage_extent() for b in list(self.graph.inputs) + list(self.graph.buffers)}
        for name, t in self.graph.constants.items():
            extents[name] = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
        ivs = []
        for name, e in self.accesses:
            if name in self.locals:
                continue
            check_access(name, e, ranges, extents[name])
            if all(hi >= lo for lo, hi in ranges.values()):
                ivs.append(bound(e, ranges))
        return index_type(ivs)

    def _merge(self, vars_, sizes, exprs):
        """Prop. 6.3: merge adjacent loops (a outer, b inner) when every access has
        coeff(a) == coeff(b) * size(b).  Returns [(merged var, size, [original vars])]."""
        groups = [[v] for v in vars_]
        gsizes = list(sizes)
        i = 0
        while i + 1 < len(groups):
            a = groups[i][-1]
            inner_size = gsizes[i + 1]
            ok = True
            for e in exprs:
                ca, cb = sympy.diff(e, a), sympy.diff(e, groups[i + 1][-1])
                if not (ca.is_Integer and cb.is_Integer):
                    ok = False
                    break
                if int(ca) != int(cb) * inner_size:
                    ok = False
                    break
            if ok and len(groups[i + 1]) == 1:
                groups[i] = groups[i] + groups[i + 1]
                gsizes[i] = gsizes[i] * gsizes[i + 1]
                del groups[i + 1]
                del gsizes[i + 1]
            else:
                i += 1
        return groups, gsizes

    def generate(self) -> str:
        outer, inner = self.sig
        exprs = self._collect_exprs()
        self.index_t = self._check_bounds()
        og, osz = self._merge(self.xs, outer, exprs)
        ig, isz = self._merge(self.rs, inner, exprs)
        self._merge_subs = {}
        self.outer_loops = []
        for k, (grp, size) in enumerate(zip(og, osz)):
            m = sympy.Symbol(f"xm{k}", integer=True, nonnegative=True)
            for v in grp[:-1]:
                self._merge_subs[v] = 0
            self._merge_subs[grp[-1]] = m
            self.outer_loops.append((m, size))
        self.inner_loops = []
        for k, (grp, size) in enumerate(zip(ig, isz)):
            m = sympy.Symbol(f"rm{k}", integer=True, nonnegative=True)
            for v in grp[:-1]:
                self._merge_subs[v] = 0
            self._merge_subs[grp[-1]] = m
            self.inner_loops.append((m, size))
        # every merged group must translate consistently: replacing the inner-most var of a group
        # by the merged var is exact because of the mergeability check above
        ph, nphase = self._phases()
        self.ph = ph
        ind = "    "
        threads = choices_threads()
        depth = choices.parallel_depth([s for _, s in self.outer_loops], math.prod(inner) if inner else 1, threads)
        has_red = any(p == "reduce" for p in self.placements.values())
        if not self.outer_loops and not has_red and self.inner_loops:
            # a purely elementwise kernel: parallelise the outermost (vector) loop
            work = math.prod(s for _, s in self.inner_loops)
            self.parallel_inner = work >= choices.PARALLEL_MIN_WORK
        else:
            self.parallel_inner = False
        lines = []
        level = 1
        for d, (m, size) in enumerate(self.outer_loops):
            if d == 0 and depth > 0:
                lines.append(ind * level + (f"#pragma omp parallel for collapse({depth})" if depth > 1
                                            else "#pragma omp parallel for"))
            lines.append(ind * level + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
            level += 1
        # scratch arrays for inner locals read in a later phase
        for n in self.g.nodes:
            if n.name in self.locals and self.placements[n.name] == "inner":
                p = ph[n.name][0]
                if any(ph[o.name][0] > p for o in self.g.nodes if n.name in o.reads):
                    arr = f"scratch_{n.name}"
                    self.scratch[n.name] = arr
                    cnt = math.prod(s for _, s in self.inner_loops)
                    if cnt * 8 > (1 << 20):
                        raise Unsupported("row too long for an in-cache scratch buffer")
                    lines.append(ind * level + f"alignas(64) {STORAGE_CTYPE[self.dtypes[n.name]]} {arr}[{max(cnt, 1)}];")
        for p in range(nphase):
            lines += self._gen_phase(p, level)
        for _ in self.outer_loops:
            level -= 1
            lines.append(ind * level + "}")
        params = []
        for name, (ct, out) in self.params.items():
            params.append(f"{'' if out else 'const '}{ct}* __restrict__ {name}")
        head = [f'extern "C" void {self.name}({", ".join(params)}) {{',
                f"    using idx_t = {self.index_t};   // every index proved to fit (bounds.py)",
                "    constexpr idx_t VL = tp::Vec<float>::size;", "    (void)VL;"]
        return "\n".join(head + lines + ["}"])

    def scratch_expr(self):
        """Index into a row scratch array, in the current vector-loop variable."""
        e = self._scratch_index()
        if self.inner_loops and self.vec_var is not None:
            e = e.subs(self.inner_loops[-1][0], self.vec_var)
        return e

    def _acc_dtype(self, n):
        return torch.bool if n.buf.data.reduction_type in ("any", "all") else n.buf.data.dtype

    def _scratch_index(self):
        # flat position within the row (inner loops are laid out contiguously in the scratch)
        e = sympy.Integer(0)
        acc = 1
        for m, size in reversed(self.inner_loops):
            e = e + m * acc
            acc *= size
        return e

    def _gen_phase(self, p, level):
        ind = "    "
        nodes = [n for n in self.g.nodes if self.ph[n.name][0] == p]
        inner_nodes = [n for n in nodes if self.placements[n.name] in ("inner", "reduce")]
        outer_nodes = [n for n in nodes if self.placements[n.name] == "outer"]
        lines = [ind * level + f"// phase {p}: {', '.join(n.name for n in nodes)}"]
        reds = [n for n in inner_nodes if self.placements[n.name] == "reduce"]
        if inner_nodes:
            # row values computed by this phase's reductions outlive its block
            for n in reds:
                lines.append(ind * level + f"{CTYPE[self._acc_dtype(n)]} v_{n.name};")
            lines.append(ind * level + "{")
            lvl = level + 1
            for n in reds:
                acc_dt = self._acc_dtype(n)
                ident = _identity(n.buf.data.reduction_type, acc_dt)
                for u in range(UNROLL):
                    lines.append(ind * lvl + f"{_vt(acc_dt)} acc_{n.name}_{u}({ident});")
            for k, (m, size) in enumerate(self.inner_loops[:-1]):
                lines.append(ind * lvl + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
                lvl += 1
            if self.inner_loops:
                vm, vsize = self.inner_loops[-1]
                self.vec_var = vm
                lines.append(ind * lvl + f"idx_t {vm} = 0;")
                if reds and UNROLL > 1:
                    lines.append(ind * lvl + f"for (; {vm} + {UNROLL} * VL <= {vsize}; {vm} += {UNROLL} * VL) {{")
                    for u in range(UNROLL):
                        lines += self._body(inner_nodes, "vec", lvl + 1, u, offset=u)
                    lines.append(ind * lvl + "}")
                if self.parallel_inner:
                    lines.append(ind * lvl + "#pragma omp parallel for")
                    lines.append(ind * lvl + f"for (idx_t {vm}_b = 0; {vm}_b < {vsize} / VL; {vm}_b += 1) {{")
                    lines.append(ind * (lvl + 1) + f"const idx_t {vm} = {vm}_b * VL;")
                    lines += self._body(inner_nodes, "vec", lvl + 1, 0)
                    lines.append(ind * lvl + "}")
                    lines.append(ind * lvl + f"{vm} = ({vsize} / VL) * VL;")
                else:
                    lines.append(ind * lvl + f"for (; {vm} + VL <= {vsize}; {vm} += VL) {{")
                    lines += self._body(inner_nodes, "vec", lvl + 1, 0)
                    lines.append(ind * lvl + "}")
                lines.append(ind * lvl + f"if ({vm} < {vsize}) {{")
                lines.append(ind * (lvl + 1) + f"const int n = (int)({vsize} - {vm});")
                lines += self._body(inner_nodes, "tail", lvl + 1, 0)
                lines.append(ind * lvl + "}")
            else:   # no inner loop: one element per row
                self.vec_var = None
                lines += self._body(inner_nodes, "tail1", lvl, 0)
            for _ in self.inner_loops[:-1]:
                lvl -= 1
                lines.append(ind * lvl + "}")
            self.vec_var = None
            for n in reds:
                rt = n.buf.data.reduction_type
                acc_dt = self._acc_dtype(n)
                comb = f"acc_{n.name}_0"
                for u in range(1, UNROLL):
                    comb = _COMBINE[rt].format(a=comb, b=f"acc_{n.name}_{u}")
                red = f"{_HREDUCE[rt]}({comb})"
                if acc_dt == torch.bool:
                    red = f"(int32_t)({red} != 0)"
                lines.append(ind * lvl + f"v_{n.name} = {red};")
            lines.append(ind * level + "}")
            for n in reds:
                var = f"v_{n.name}"
                self.row_values[n.name] = var
                if n.name not in self.locals:
                    self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                    idx = self.translate(n.buf.layout.index(kernel_index(n, "reduce", self.sig)[0]))
                    lines.append(ind * level + f"{n.name}[{cexpr(idx)}] = {var};")
        for n in outer_nodes:
            h = CppHandler(self, "row")
            idx, _ = kernel_index(n, "outer", self.sig)
            with set_handler(h):
                v = n.buf.data.inner_fn(idx)
            lines += [ind * level + ln for ln in h.lines]
            var = f"v_{n.name}"
            lines.append(ind * level + f"const {CTYPE[v.dtype]} {var} = {v}[0];")
            self.row_values[n.name] = var
            if n.name not in self.locals:
                self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                sidx = self.translate(n.buf.layout.index(idx))
                lines.append(ind * level + f"{n.name}[{cexpr(sidx)}] = {var};")
        return lines

    def _body(self, nodes, mode, level, unroll, offset=0):
        ind = "    "
        h = CppHandler(self, "tail" if mode == "tail1" else mode)
        out = []
        vm = self.vec_var
        if offset:
            out.append(ind * level + "{")
            level += 1
            out.append(ind * level + f"const idx_t {vm}_u = {vm} + {offset} * VL;")
        saved = dict(self.phase_values)
        subs_backup = None
        if offset:
            subs_backup = self._merge_subs
            self._merge_subs = {k: (v.subs(vm, sympy.Symbol(f"{vm}_u", integer=True)) if hasattr(v, "subs") else v)
                                for k, v in self._merge_subs.items()}
            self.vec_var = sympy.Symbol(f"{vm}_u", integer=True)
        if mode == "tail1":
            out.append(ind * level + "const int n = 1;")
        for n in nodes:
            pl = self.placements[n.name]
            idx, ridx = kernel_index(n, pl, self.sig)
            with set_handler(h):
                v = n.buf.data.inner_fn(idx, ridx) if pl == "reduce" else n.buf.data.inner_fn(idx)
            out += [ind * level + ln for ln in h.lines]
            h.lines = []
            if pl == "reduce":
                rt = n.buf.data.reduction_type
                acc = f"acc_{n.name}_{unroll}"
                acc_dt = torch.bool if rt in ("any", "all") else n.buf.data.dtype
                val = v.name
                if acc_dt == torch.bool and v.dtype != torch.bool:
                    val = f"tp_bool_from_mask({v} != {_vt(v.dtype)}(0))"
                if mode in ("tail", "tail1"):
                    val = f"tp::where(tp_tail_mask<{CTYPE[acc_dt]}>(n), {val}, {_vt(acc_dt)}({_identity(rt, acc_dt)}))"
                out.append(ind * level + f"{acc} = {_COMBINE[rt].format(a=acc, b=val)};")
                continue
            self.phase_values[n.name] = v
            if n.name in self.locals and n.name not in self.scratch:
                continue
            if n.name in self.scratch:
                target, expr = self.scratch[n.name], self.scratch_expr()
            else:
                self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                target, expr = n.name, self.translate(n.buf.layout.index(idx))
            out.append(ind * level + self._store(target, expr, v, mode, n.buf.layout.dtype))
        # values of this iteration do not outlive it
        self.phase_values = saved
        if offset:
            self._merge_subs = subs_backup
            self.vec_var = vm
            level -= 1
            out.append(ind * level + "}")
        return out

    def _store(self, target, expr, v, mode, dtype):
        coeff = self.inner_coeff(expr) if self.vec_var is not None else 0
        base = cexpr(expr)
        if dtype == torch.bool:
            return f"tp_store_bool({target} + {base}, {coeff}, {v}, {'n' if mode in ('tail', 'tail1') else 'VL'});"
        if mode == "tail1":
            return f"{target}[{base}] = {v}[0];"
        if coeff == 1:
            return f"{v}.store({target} + {base});" if mode == "vec" else f"{v}.storen({target} + {base}, n);"
        return f"tp_scatter({target} + {base}, {coeff}, {v}, {'n' if mode == 'tail' else 'VL'});"


def choices_threads():
    try:
        return torch.get_num_threads()
    except Exception:  # noqa: BLE001
        return 1


def generate_kernel(sched, group, name) -> tuple[str, dict]:
    kg = KernelGen(sched, group, name)
    kg.vec_var = None
    kg._merge_subs = {}
    src = kg.generate()
    return src, kg.params
