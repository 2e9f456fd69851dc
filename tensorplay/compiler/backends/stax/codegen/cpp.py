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
are merged.  A reduction over non-trailing dims whose reduced loop is strided is generated in
*column mode* instead (``KernelGen._column_mode``): the lanes run across the last outer loop (VL
output columns per vector, one accumulator vector per column vector), the reduced loops are scalar
loops, so every load is a plain vector load — no gathers, no horizontal reduce.  Each compute function is evaluated with :class:`CppHandler`, which prints every
``ops`` call as one line of C++ (common subexpressions are printed once).
"""
from __future__ import annotations

import contextlib
import math
import operator
import re

import sympy
import torch

from .... import config
from .. import choices
from . import blocking
from ..bounds import IndirectIndex, _fraction, bound
from ..ir import Reduction, Unsupported
from ..ops_handler import COMPARE, set_handler
from ..scheduler import Group, kernel_index, kernel_vars

__all__ = ["generate_kernel", "CTYPE"]

CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
         torch.bool: "int32_t"}   # bool values live as 0/1 int32 lanes in registers
STORAGE_CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
                 torch.bool: "bool"}
# knobs (tensorplay/compiler/config.py): stax.cpp.unroll (vector accumulators per reduction, latency
# hiding: invariant 6), stax.cpp.welford_unroll (... in a phase with a Welford reduction),
# stax.cpp.column_reductions (KernelGen._column_mode), stax.cpp.column_unroll (column mode: vectors of
# output columns per block)
_LANES_GUESS = 16   # a guess at VL (AVX-512 floats): only sizes column blocks for Alg. 8.1
LOOP_STEP_MARGIN = 1 << 16   # > the largest step of a generated loop (a cascade block: 64 * 4 * VL)
_SCHEDULE = " @schedule@"   # stands for the schedule clause of a parallel loop until _finish knows it


def _tail_if(var, size) -> str:
    """The head of a loop's tail ``if (var < size) {`` -- after vector loops that leave ``var`` at a
    multiple of VL.  For a constant size the tail exists only when VL does not divide it, which
    ``if constexpr`` decides at compile time: g++ then never sees an unreachable tail (whose
    impossible lane counts it would warn about with -Waggressive-loop-optimizations)."""
    if str(size).isdigit():
        return f"if constexpr ({size} % VL != 0) if ({var} < {size}) {{"
    return f"if ({var} < {size}) {{"


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
    """Print a sympy index expression as C++ integer arithmetic: affine terms, ``Mod(a, q)`` as
    ``a % q`` and ``floor(p / q)`` as ``p / q`` (truncation == floor: bounds.py proves ``a, p >= 0``
    before a kernel is generated).  Symbols print as C++ variables (loop variables, or a
    ``tp::Vec<int64_t>`` of lane indices / checked indices in gathers)."""
    e = sympy.expand(e)
    if e.is_Integer:
        return f"{int(e)}"
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        return "(" + " + ".join(cexpr(a) for a in e.args) + ")"
    if e.is_Mul:
        if any(a.is_Rational and not a.is_Integer for a in e.args):
            raise Unsupported(f"fractional index expression {e}")
        return "(" + " * ".join(cexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer:
        return f"({cexpr(e.args[0])} % {int(e.args[1])})"
    if isinstance(e, sympy.floor):
        num, den = _fraction(e.args[0])
        return f"({cexpr(num)} / {den})"
    raise Unsupported(f"non-affine index expression {e}")


class CppHandler:
    """Prints ``ops`` calls as C++ lines inside the current loop body."""

    def __init__(self, kernel, mode):
        self.k = kernel
        self.mode = mode           # "vec", "tail" or "row"
        self.lines = []
        self.cse = {}
        self._mask = None          # the enclosing ops.masked condition (a bool _Val), if any
        self._ind = {}             # IndirectIndex tag -> C++ variable of the checked index
        self._ind_expr = {}        # IndirectIndex tag -> its value as an index expression, when proved in range
        self._uniform = set()      # variables with the same value in every lane (broadcast loads)
        self._sym = {}             # variable -> sympy value of index arithmetic and its comparisons (masks)
        self._ind_op = {}          # IndirectIndex tag -> the op its check message names ("tp.gather")

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
        k.loaded.add(name)
        expr = k.scratch_expr() if name in k.scratch else k.translate(index)
        vt = _vt(dtype)
        ptr = k.ptr(name)
        ind = expr.atoms(IndirectIndex)
        known = {a: self._ind_expr[int(a.args[0])] for a in ind if int(a.args[0]) in self._ind_expr}
        if known:   # indices computed from loop variables (arange in embedding): a direct access
            expr = sympy.expand(expr.xreplace(known))
            ind = expr.atoms(IndirectIndex)
        if any(int(a.args[1]) == 0 for a in ind):
            # an index into an empty dim: every active lane has reported an error; read nothing
            return self._emit(f"{vt}({_lit(0, dtype)})", dtype)
        if ind and name in k.checked_loads:
            return self._checked_gather(ptr, name, expr, dtype, ind)
        if ind and all(self._ind[int(a.args[0])] in self._uniform for a in ind):
            # the same checked index in every lane (e.g. embedding rows): an ordinary affine load
            expr = expr.xreplace({a: sympy.Symbol(f"{self._ind[int(a.args[0])]}[0]", integer=True) for a in ind})
            ind = ()
        if ind or not self._affine_in_vec(expr):
            return self._gather(ptr, expr, dtype)
        coeff = k.inner_coeff(expr)
        base = cexpr(expr)
        if self._mask is not None:   # only active lanes read memory (stax_kernel.h)
            fn = "tp_masked_load_bool" if dtype == torch.bool else f"tp_masked_load<{CTYPE[dtype]}>"
            return self._emit(f"{fn}({ptr}, {base}, {coeff}, {self._mask}, {self._nl()})", dtype)
        if dtype == torch.bool:
            return self._emit(f"tp_load_bool({ptr} + {base}, {coeff}, {self._n()})", dtype)
        if self.mode == "row" or coeff == 0:
            v = self._emit(f"{vt}({ptr}[{base}])", dtype)
            self._uniform.add(v.name)
            return v
        if coeff == 1:
            if self.mode == "tail":
                return self._emit(f"{vt}::loadn({ptr} + {base}, n)", dtype)
            if k.stream_loads is not None:
                k.vec_loads.add((name, base))    # every unit-stride load of the loop (split_loads)
                if k.vec_var is k.prefetch_var:
                    k.stream_loads.setdefault((name, base), dtype)
            return self._emit(f"{vt}::load({ptr} + {base})", dtype)
        return self._emit(f"tp_gather<{CTYPE[dtype]}>({ptr} + {base}, {coeff}, {self._n()})", dtype)

    def _n(self):
        return "n" if self.mode == "tail" else "VL"

    def _nl(self):
        """Active lanes: a row value lives in lane 0 only."""
        return "1" if self.mode == "row" else self._n()

    def _active(self):
        return str(self._mask) if self._mask is not None else "tp::Vec<int32_t>(1)"

    # -- masks, per-lane index vectors and gathers (bounds.py proves them; stax_kernel.h) ---------------
    def _affine_in_vec(self, expr):
        v = self.k.vec_var
        return v is None or self.mode == "row" or not any(
            v in a.free_symbols for a in expr.atoms(sympy.Mod, sympy.floor))

    def _lane_expr(self, expr, emit=True):
        """``expr`` as a C++ ``tp::Vec<int64_t>``: one index per lane (the vector-loop variable
        becomes its lane vector, checked indices their variables); ``emit=False``: the C++
        expression itself, not a variable."""
        subs = {a: self._ind_expr[t] if t in self._ind_expr else sympy.Symbol(self._ind[t], integer=True)
                for a in expr.atoms(IndirectIndex) for t in (int(a.args[0]),)}
        v = self.k.vec_var
        if v is not None and self.mode != "row" and v in expr.free_symbols:
            lanes = f"(tp::Vec<int64_t>::iota(0) + tp::Vec<int64_t>({v}))"
            subs[v] = sympy.Symbol(self._emit(lanes, torch.int64).name if emit else lanes, integer=True)
        e = f"tp::Vec<int64_t>({cexpr(expr.xreplace(subs))})"
        return self._emit(e, torch.int64) if emit else e

    def _gather(self, ptr, expr, dtype):
        fn = "tp_gather_off_bool" if dtype == torch.bool else f"tp_gather_off<{CTYPE[dtype]}>"
        fast = None if dtype == torch.bool or expr.atoms(IndirectIndex) else self._periodic(expr)
        pattern = None if dtype == torch.bool or expr.atoms(IndirectIndex) or self._mask is not None \
            else self._lane_pattern(expr)
        if fast is None and pattern is None:
            off = self._lane_expr(expr)
            return self._emit(f"{fn}({ptr}, {off}, {self._active()}, {self._nl()})", dtype)
        code = f"{fn}({ptr}, {self._lane_expr(expr, emit=False)}, {self._active()}, {self._nl()})"   # lane by lane
        if fast is not None:
            # Mod/floor of the vector variable (repeat, tile): a vector inside one period is an affine
            # load from the scalar index of its first lane; only one that wraps is gathered lane by lane
            test, base, coeff = fast
            direct = f"tp_masked_load<{CTYPE[dtype]}>({ptr}, {base}, {coeff}, {self._active()}, {self._nl()})"
            code = f"(({test}) ? {direct} : [&] {{ return {code}; }}())"
        if pattern is not None:
            test, base, lanes = pattern
            code = (f"(({test}) ? tp_pattern_load<{CTYPE[dtype]}, {', '.join(map(str, lanes))}>({ptr} + {base}, "
                    f"{self._nl()}) : {code})")
        return self._emit(code, dtype)

    def _checked_gather(self, ptr, name, expr, dtype, ind):
        """A data-dependent load that bounds.py could not prove in range: its element offsets are
        checked in the kernel against the buffer's extent like a checked index (a bad active lane
        reports an IndexError naming the ops of its indices and reads element 0), so no lane ever
        reads outside the buffer.  The indices were checked against their dims first, so with a
        correct lowering this check never fires; it makes a weak proof cost speed, not safety."""
        ops_ = sorted({self._ind_op.get(int(a.args[0]), "tp.index") for a in ind})
        extent = int(self.k.extents[name])
        msg = (f"IndexError: {'/'.join(ops_)}: element offset {{value}} is out of bounds for {name} of "
               f"{extent} elements (run-time check of an index Stax could not prove in range)")
        tag = self.indirect_indexing(self._lane_expr(expr), extent, False, msg)
        off = self._ind[tag]
        fn = "tp_gather_off_bool" if dtype == torch.bool else f"tp_gather_off<{CTYPE[dtype]}>"
        return self._emit(f"{fn}({ptr}, {off}, {self._active()}, {self._nl()})", dtype)

    def _lane_pattern(self, expr):
        """For an index linear in Mod/floor atoms of the vector variable v (``floor((c*v + r)/q)``,
        ``Mod(c*v + r, q)``, integer c, q) whose period L in v divides 16: (C++ test that the
        vector starts a period -- every atom's argument at lane 0 is a multiple of its q, and VL %
        L == 0 --, C++ scalar index of lane 0, the 16 lane offsets from it), or None.  Inside a
        period the offsets do not depend on where the vector is: lane k adds ``floor(c*k/q)``
        (``Mod(c*k, q)``) per atom, times its coefficient, to the linear part's ``a*k``."""
        v = self.k.vec_var
        if v is None or self.mode == "row":
            return None
        atoms = [a for a in expr.atoms(sympy.Mod, sympy.floor) if v in a.free_symbols]
        if not atoms:
            return None
        syms, parts, period, tests = {}, [], 1, []
        for j, a in enumerate(atoms):
            if isinstance(a, sympy.Mod):
                arg, q = sympy.expand(a.args[0]), a.args[1]
                if not q.is_Integer:
                    return None
            else:
                arg, q = _fraction(a.args[0])
            if int(q) <= 0 or arg.atoms(sympy.Mod, sympy.floor):
                return None
            q, c = int(q), sympy.diff(arg, v)
            if not c.is_Integer:
                return None
            period = math.lcm(period, q // math.gcd(int(c), q))
            syms[a] = sympy.Symbol(f"_atom{j}", integer=True)
            parts.append((syms[a], isinstance(a, sympy.Mod), int(c), q))
            tests.append(f"(({cexpr(arg)}) % {q} == 0)")
        lin = expr.xreplace(syms)
        coef = {s: sympy.diff(lin, s) for s in syms.values()}
        a_v = sympy.diff(lin, v)
        # integer coefficients also mean lin is linear in v and in every atom (no products)
        if not (a_v.is_Integer and all(c.is_Integer for c in coef.values())) or 16 % period:
            return None
        lanes = [int(a_v) * k + sum(int(coef[s]) * ((c * k) % q if is_mod else (c * k) // q)
                                    for s, is_mod, c, q in parts) for k in range(16)]
        if min(lanes) < 0 or max(lanes) > 15 or lanes[0] != 0:
            return None
        return f"(VL % {period} == 0) && " + " && ".join(tests), cexpr(expr), lanes

    def _periodic(self, expr):
        """For an index with Mod/floor atoms of the vector variable v: (C++ test that the vector's
        lanes see no wrap, C++ scalar index of lane 0, lane stride), or None."""
        v = self.k.vec_var
        if v is None or self.mode == "row":
            return None
        last = v + sympy.Symbol("n" if self.mode == "tail" else "VL", integer=True) - 1
        tests, lin = [], {}
        for a in expr.atoms(sympy.Mod, sympy.floor):
            if v not in a.free_symbols:
                continue
            if isinstance(a, sympy.Mod):
                arg, q = a.args
                c = sympy.diff(arg, v)
                if not (c.is_Integer and q.is_Integer) or arg.atoms(sympy.Mod, sympy.floor):
                    return None
                tests.append(f"({cexpr(a.subs(v, last))} - {cexpr(a)} == {int(c)} * ({cexpr(last - v)}))")
                lin[a] = arg
            else:
                if a.args[0].atoms(sympy.Mod, sympy.floor):
                    return None
                tests.append(f"({cexpr(a.subs(v, last))} == {cexpr(a)})")
                lin[a] = sympy.Integer(0)
        coeff = sympy.diff(expr.xreplace(lin), v)
        if not coeff.is_Integer or not tests:
            return None
        return " && ".join(tests), cexpr(expr), int(coeff)

    def masked(self, mask, body, other):
        """Lanes where ``mask`` is false never touch memory (every load of ``body`` is a masked
        load, see :meth:`load`) and give ``other``.  The body runs only if some lane is active;
        when the mask is a conjunction of affine index conditions (cat, pad, roll) it is tested on
        the first and last lane of the vector (monotone): a vector entirely inside runs the body with
        plain loads, one entirely outside skips it — a per-vector loop split."""
        prev = self._mask
        o = other if isinstance(other, _Val) else None
        r = self.k.tmp()
        tests = self._range_tests(self._sym.get(mask.name))
        masked_mask = mask if prev is None else self.logical_and(prev, mask)
        branches = []
        if tests is not None:
            branches.append((tests[0], prev, False))
            if tests[1] == "false":
                tests = None
        branches.append((None if tests is None else f"!({tests[1]})", masked_mask, True))
        lines = []
        for k, (test, m, select) in enumerate(branches):
            body_lines, v = self._in_block(m, body)
            if o is None:
                o = self.to_dtype(self.constant(other, v.dtype), v.dtype)
            head = "if" if k == 0 else "} else if"
            lines.append(f"{head} ({test if test is not None else f'tp::reduce_max({mask}) != 0'}) {{")
            lines += ["    " + ln for ln in body_lines]
            lines.append(f"    {r} = tp::where(tp_mask_from_bool<{CTYPE[v.dtype]}>({mask}), {v}, {o});" if select
                         else f"    {r} = {v};")
        o = self.to_dtype(o, v.dtype)
        self.lines.append(f"{_vt(v.dtype)} {r} = {o};")
        self.lines += lines + ["}"]
        return _Val(r, v.dtype)

    def _in_block(self, mask, body):
        """Evaluate ``body`` under ``mask`` into separate lines; its values stay in the block."""
        outer_lines, outer_cse, prev = self.lines, self.cse, self._mask
        self.lines, self.cse, self._mask = [], dict(outer_cse), mask
        try:
            v = body()
        finally:
            body_lines, self.lines, self.cse, self._mask = self.lines, outer_lines, outer_cse, prev
        return body_lines, v

    def _range_tests(self, cond):
        """C++ (all lanes hold, no lane holds) for a conjunction of affine conditions in the loop
        variables, or None.  Affine in the vector variable means monotone over the lanes, so the
        first and the last active lane decide."""
        if cond is None:
            return None
        atoms = cond.args if isinstance(cond, sympy.And) else (cond,)
        v = self.k.vec_var if self.mode != "row" else None
        last = sympy.Symbol("n" if self.mode == "tail" else "VL", integer=True) - 1
        alls, nones = [], []
        for c in atoms:
            if c is sympy.true:
                continue
            if c is sympy.false:
                return "false", "true"
            if not isinstance(c, sympy.core.relational.Relational) or c.rel_op == "!=" or \
                    c.atoms(sympy.Function):
                return None
            e = sympy.expand(c.lhs - c.rhs)
            if v is not None and not sympy.diff(e, v).is_Integer:
                return None
            ends = [e] if v is None or v not in e.free_symbols else [e, e.subs(v, v + last)]
            holds = [f"({cexpr(x)} {c.rel_op} 0)" for x in ends]
            alls += holds
            if c.rel_op == "==" and len(ends) == 2:
                # e == 0 fails at both ends and may hold in between (select_backward's eq(i0, 1)
                # on lanes 0..3): no lane holds only if e keeps one strict sign over the lanes
                first, end = (cexpr(x) for x in ends)
                nones.append(f"((({first}) > 0 && ({end}) > 0) || (({first}) < 0 && ({end}) < 0))")
                continue
            nones.append("(" + " && ".join(f"!{h}" for h in holds) + ")")
        if not alls:
            return "true", "false"
        return " && ".join(alls), " || ".join(nones) if nones else "false"

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        """Check a loaded index against ``[0, size)`` in the kernel (see bounds.py); returns the tag
        of an :class:`IndirectIndex`.  ``check``: the error message, with ``{value}`` for the bad
        index; it starts with the exception's name ("IndexError: ..."), which the kernel's call
        raises (runtime.checked_kernel)."""
        if value.dtype.is_floating_point:
            raise Unsupported("a floating-point index")
        proved = self._proved_index(value, size)
        if proved is not None:       # index arithmetic on loop variables, provably in [0, size)
            tag = len(self._ind)
            self._ind[tag] = str(value)
            self._ind_expr[tag] = proved
            return tag
        msg = (check or "IndexError: index {value} is out of bounds for size " + str(size))
        op = re.match(r"\w+: (tp\.\w+)", msg)
        fmt = msg.replace("%", "%%").replace("{value}", "%lld").replace("\\", "\\\\").replace('"', '\\"')
        key = ("check", str(value), int(size), bool(wrap_negative), self._active(), self._nl(), fmt)
        if key not in self.cse:
            c = self.k.tmp()
            w = 1 if wrap_negative else 0
            if value.name in self._uniform and self._mask is None:   # every lane active, one value
                self.lines.append(f"const auto {c} = tp_check_index1(int64_t({value}[0]), int64_t({int(size)}), {w});")
            else:
                self.lines.append(f"const auto {c} = tp_check_index({value}, int64_t({int(size)}), {w}, "
                                  f"{self._active()}, {self._nl()});")
            self.lines.append(f'if ({c}.bad) tp_report_error(tp_index_text("{fmt}", {c}.value));')
            self.cse[key] = self._emit(f"{c}.idx", torch.int64)
            if value.name in self._uniform:
                self._uniform.add(self.cse[key].name)
        tag = len(self._ind)
        self._ind[tag] = self.cse[key].name
        if op:
            self._ind_op[tag] = op.group(1)
        return tag

    def _proved_index(self, value, size):
        """The index expression of ``value`` when it is arithmetic on loop variables (index_expr,
        constants, + - *) and bounds.py proves it in ``[0, size)``; else None."""
        e = self._sym.get(value.name)
        if not isinstance(e, sympy.Expr):
            return None
        k = self.k
        ranges = {m: (0, int(n) - 1) for m, n in k.outer_loops + k.inner_loops}
        if k.vec_var is not None and k.inner_loops and not k.column:
            # the unrolled copy rm0_u = rm0 + u*VL of the vector variable stays in rm0's range
            ranges.setdefault(k.vec_var, ranges[k.inner_loops[-1][0]])
        try:
            iv = bound(e, ranges)
        except Unsupported:
            return None
        return e if iv.within(0, int(size) - 1) else None

    def index_expr(self, expr, dtype):
        e = self.k.translate(expr)
        if e.atoms(IndirectIndex) or not self._affine_in_vec(e):
            v = self._lane_expr(e)
            return v if dtype == torch.int64 else self.to_dtype(v, dtype)
        coeff = self.k.inner_coeff(e) if self.mode != "row" else 0
        base = cexpr(e)
        v = self._emit(f"(tp::Vec<int64_t>::iota(0) * tp::Vec<int64_t>({coeff}) + tp::Vec<int64_t>({base}))"
                       if coeff else f"tp::Vec<int64_t>({base})", torch.int64)
        self._sym[v.name] = e
        return v if dtype == torch.int64 else self.to_dtype(v, dtype)

    def constant(self, value, dtype):
        from ..op_lowerings import cdt
        dtype = dtype or cdt()
        v = self._emit(f"{_vt(dtype)}({_lit(value, dtype)})", dtype)
        if not dtype.is_floating_point and dtype != torch.bool:
            self._sym[v.name] = sympy.Integer(int(value))
        return v

    # -- random numbers: Philox4x32-10 of (seed, stream, element offset), cpp_prelude.h --------------
    def rand(self, seed, offset, stream, dtype):
        return self._emit(f"tp::philox_rand<{CTYPE[dtype]}>({seed}, {offset}, {int(stream)})", dtype)

    def randn(self, seed, offset, stream, dtype):
        return self._emit(f"tp::philox_randn<{CTYPE[dtype]}>({seed}, {offset}, {int(stream)})", dtype)

    def randint64(self, seed, offset, stream, low, high):
        return self._emit(f"tp::philox_randint({seed}, {offset}, {int(stream)}, {_lit(low, torch.int64)}, "
                          f"{int(high) - int(low)}ULL)", torch.int64)

    def to_dtype(self, x, dtype, src_dtype=None):
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"tp_bool_from_mask({x} != {_vt(x.dtype)}(0))", torch.bool)
        return self._emit(f"tp::cast<{CTYPE[dtype]}>({x})", dtype)

    def where(self, c, a, b):
        return self._emit(f"tp::where(tp_mask_from_bool<{CTYPE[a.dtype]}>({c}), {a}, {b})", a.dtype)

    # -- arithmetic -------------------------------------------------------------------------------------
    def _int_arith(self, v, a, b, op):
        """Track integer index arithmetic symbolically (see _proved_index)."""
        if a.name in self._sym and b.name in self._sym and not v.dtype.is_floating_point:
            x, y = self._sym[a.name], self._sym[b.name]
            if isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr):   # not a comparison (mask)
                self._sym[v.name] = sympy.expand(op(x, y))
        return v

    def add(self, a, b):
        return self._int_arith(self._emit(f"({a} + {b})", a.dtype), a, b, operator.add)

    def sub(self, a, b):
        return self._int_arith(self._emit(f"({a} - {b})", a.dtype), a, b, operator.sub)

    def mul(self, a, b):
        return self._int_arith(self._emit(f"({a} * {b})", a.dtype), a, b, operator.mul)

    def truediv(self, a, b):
        return self._emit(f"({a} / {b})", a.dtype)

    def neg(self, a):
        return self._emit(f"(-{a})", a.dtype)

    def reciprocal(self, a):
        return self._emit(f"({_vt(a.dtype)}({_lit(1, a.dtype)}) / {a})", a.dtype)

    def logical_and(self, a, b):
        v = self._emit(f"({a} & {b})", torch.bool)
        if a.name in self._sym and b.name in self._sym:
            self._sym[v.name] = sympy.And(self._sym[a.name], self._sym[b.name])
        return v

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

    def bitwise_left_shift(self, a, b):
        return self._emit(f"({a} << {b})", a.dtype)   # torch: a count outside [0, bits) gives 0

    def bitwise_right_shift(self, a, b):
        return self._emit(f"({a} >> {b})", a.dtype)   # torch: ... gives the sign fill

    def _int_division(self, name, a, b):
        """Integer floordiv/truncdiv/remainder/fmod: a zero divisor in an active lane makes the
        kernel report ZeroDivisionError (eager raises it; tp::floordiv etc. themselves return 0 and
        never trap).  The wrapper's kernel call raises it (async_compile, stax_kernel.h)."""
        from ..op_lowerings import current_op
        vt = _vt(b.dtype)
        zero = f"({b} == {vt}(0))"
        if self.mode == "tail":   # lanes past n were loaded as 0
            zero = f"({zero} & tp_tail_mask<{CTYPE[b.dtype]}>(n))"
        op = current_op() or {"floordiv": "floor_divide", "truncdiv": "div"}.get(name, name)
        self.lines.append(f'if (tp::any({zero})) tp_report_error("tp.{op}: ZeroDivisionError '
                          f'(integer division by zero in a compiled kernel)");')
        return self._emit(f"tp::{name}({a}, {b})", a.dtype)

    def __getattr__(self, name):
        if name in COMPARE:
            sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
            return lambda a, b: self._emit(f"tp_bool_from_mask({a} {sym} {b})", torch.bool)
        if name in ("isnan", "isinf"):
            return lambda a: self._emit(f"tp_bool_from_mask(tp::{name}({a}))", torch.bool) \
                if a.dtype.is_floating_point else self._emit("tp::Vec<int32_t>(0)", torch.bool)
        if name in ("floordiv", "truncdiv", "remainder", "fmod"):
            return lambda a, b: self._emit(f"tp::{name}({a}, {b})", a.dtype) if a.dtype.is_floating_point \
                else self._int_division(name, a, b)
        if name in ("maximum", "minimum", "pow", "atan2", "hypot"):
            return lambda a, b: self._emit(f"tp::{name}({a}, {b})", a.dtype)
        if name in ("abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin",
                    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "erf", "erfc", "floor",
                    "ceil", "trunc", "round"):
            return lambda a: self._emit(f"tp::{name}({a})", a.dtype)
        raise AttributeError(name)


def _tracked_compare(name):
    """Comparisons as printed by ``CppHandler.__getattr__``, plus their sympy form when both sides
    are index arithmetic (a mask ``masked`` can test per vector, see ``_range_tests``)."""
    rel = {"lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge, "eq": sympy.Eq}[name]

    def compare(self, a, b):
        v = CppHandler.__getattr__(self, name)(a, b)
        if a.name in self._sym and b.name in self._sym:
            self._sym[v.name] = rel(self._sym[a.name], self._sym[b.name])
        return v
    return compare


for _name in ("lt", "le", "gt", "ge", "eq"):
    setattr(CppHandler, _name, _tracked_compare(_name))


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


# ---- reduction accumulators ---------------------------------------------------------------------------
# A monoid reduction (sum ... all) keeps ``stax.cpp.unroll`` vectors ``acc_<buf>_<u>`` combined with _COMBINE and
# reduced across lanes with _HREDUCE.  argmax/argmin keep a tp::ArgAcc (per-lane value + int64
# index) and welford a tp::WelfordAcc (per-lane n, mean, m2; Chan combine): cpp_prelude.h.  The
# nodes of one multi-result reduction (Reduction.multi: same inner_fn) share the accumulator of the
# first of them in the kernel (the *leader*); the others only read its results.
def _accumulators(reds):
    """buffer name -> the node whose accumulator computes it."""
    leader, first = {}, {}
    for n in reds:
        r = n.buf.data
        key = (r.reduction_type, id(r.inner_fn)) if r.reduction_type in r.OUTPUTS else n.name
        leader[n.name] = first.setdefault(key, n)
    return leader


def _is_max(rt):
    return "true" if rt == "argmax" else "false"


def _acc_decl(n, acc_dt, nacc):
    rt, ct = n.buf.data.reduction_type, CTYPE[acc_dt]
    if rt in ("argmax", "argmin"):
        return [f"tp::ArgAcc<{ct}> acc_{n.name}_{u} = tp::arg_identity<{_is_max(rt)}, {ct}>();" for u in range(nacc)]
    if rt == "welford":
        return [f"tp::WelfordAcc<{ct}> acc_{n.name}_{u};" for u in range(nacc)]
    return [f"{_vt(acc_dt)} acc_{n.name}_{u}({_identity(rt, acc_dt)});" for u in range(nacc)]


def _acc_update(n, acc_dt, unroll, v, mode):
    """The statement folding this iteration's value ``v`` (argmax: (value, index)) into
    accumulator ``unroll``; in a tail only the first ``n`` lanes count."""
    rt = n.buf.data.reduction_type
    acc = f"acc_{n.name}_{unroll}"
    tail = mode in ("tail", "tail1")
    mask = ", tp_tail_mask<float>(n)" if tail else ""
    if rt in ("argmax", "argmin"):
        return f"tp::arg_update<{_is_max(rt)}>({acc}, {v[0]}, {v[1]}{mask});"
    if rt == "welford":
        return f"tp::welford_update({acc}, {v}{mask});"
    val = v.name
    if acc_dt == torch.bool and v.dtype != torch.bool:
        val = f"tp_bool_from_mask({v} != {_vt(v.dtype)}(0))"
    if tail:
        val = f"tp::where(tp_tail_mask<{CTYPE[acc_dt]}>(n), {val}, {_vt(acc_dt)}({_identity(rt, acc_dt)}))"
    return f"{acc} = {_COMBINE[rt].format(a=acc, b=val)};"


def _n_acc(reds):
    """Accumulators per reduction in one phase: ``stax.cpp.unroll``, or ``stax.cpp.welford_unroll``
    when a Welford update (a dependent sub-mul-add chain per element, ~3x the latency of an add) is
    among them."""
    welford = any(n.buf.data.reduction_type == "welford" for n in reds)
    return config.get("stax.cpp.welford_unroll") if welford else config.get("stax.cpp.unroll")


def _acc_final(n, acc_dt, sibs, nacc):
    """Combine the ``nacc`` accumulators, then the lanes, into ``v_<buf>`` of every sibling."""
    rt, ct = n.buf.data.reduction_type, CTYPE[acc_dt]
    acc = [f"acc_{n.name}_{u}" for u in range(nacc)]
    if rt in Reduction.OUTPUTS:
        comb = acc[0]
        for a in acc[1:]:
            comb = (f"tp::arg_combine<{_is_max(rt)}>({comb}, {a})" if rt != "welford"
                    else f"tp::welford_combine({comb}, {a})")
        res = {o: f"r_{n.name}_{o}" for o in Reduction.OUTPUTS[rt]}
        rct = {o: ("int64_t" if o == "index" else ct) for o in res}
        out = [f"{rct[o]} {var};" for o, var in res.items()]
        if rt == "welford":
            out.append(f"tp::welford_reduce({comb}, {res['mean']}, {res['m2']}, {res['count']});")
        else:
            out.append(f"tp::arg_reduce<{_is_max(rt)}>({comb}, {res['value']}, {res['index']});")
        return out + [f"v_{o.name} = {res[o.buf.data.output]};" for o in sibs]
    comb = acc[0]
    for a in acc[1:]:
        comb = _COMBINE[rt].format(a=comb, b=a)
    red = f"{_HREDUCE[rt]}({comb})"
    if acc_dt == torch.bool:
        red = f"(int32_t)({red} != 0)"
    return [f"v_{n.name} = {red};"]


def _acc_final_columns(n, sibs, u):
    """Column mode: accumulator ``u`` holds one output column per lane, so its results are the
    vectors ``v_<buf>_<u>`` of every sibling as they are (no combine, no horizontal reduce)."""
    rt, acc = n.buf.data.reduction_type, f"acc_{n.name}_{u}"
    res = {"index": f"{acc}.idx", "value": f"{acc}.val"} if rt in ("argmax", "argmin") else \
        {"mean": f"{acc}.mean", "m2": f"{acc}.m2", "count": f"{acc}.counts()"} if rt == "welford" else {None: acc}
    return [f"v_{o.name}_{u} = {res[o.buf.data.output]};" for o in sibs]


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
        self.streamed = set()     # buffers written with streaming stores (choices.stream_stores)
        self.loaded = set()       # buffers loaded so far (by earlier phases: in cache for later ones)
        self.stream_loads = None  # while a vector loop is generated: (buffer, C++ index) -> dtype of its
        self.prefetch_var = None  # unit-stride loads in the loop variable ``prefetch_var`` (_prefetch)
        self.large_store = False  # ... and whether it stores to a buffer from_memory
        self.vec_loads = set()    # ... and every unit-stride (buffer, C++ index) load in it (split_loads)
        self.plain_large_store = False   # the kernel stores to a buffer from_memory without streaming
        self.column = False       # column mode (see _column_mode): lanes = output columns
        self.col_u = 0            # column mode: which vector of the block's columns is generated
        self.checked_loads = set()   # buffers whose indirect loads check their offsets at run time

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
            if self.column:   # a vector of this block's columns (one row value per lane)
                return _Val(f"{self.row_values[name]}_{self.col_u}", dt)
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
        from ..bounds import record_accesses
        exprs = []
        self.accesses = []        # (buffer, index, mask condition or None)
        self.index_exprs = []     # ops.index_expr arguments: they pin the loops they use (no merging)
        for n in self.g.nodes:
            pl = self.placements[n.name]
            idx = kernel_index(n, pl, self.sig)
            rec = record_accesses(n.buf.data.inner_fn, *(idx if n.is_reduction else idx[:1]))
            for name, e, cond in rec.loads:
                exprs.append(e)
                self.accesses.append((name, e, cond))
            exprs += rec.index_exprs
            self.index_exprs += rec.index_exprs
            if n.name not in self.locals:
                e = n.buf.layout.index(idx[0])
                exprs.append(e)
                self.accesses.append((n.name, e, None))
        return exprs

    def _check_bounds(self):
        """§6.8: prove every access in range (no run-time checks) and pick the index width."""
        from ..bounds import Interval, bound, check_access, index_type, magnitude
        outer, inner = self.sig
        ranges = {v: (0, n - 1) for v, n in zip(self.xs, outer)}
        ranges.update({v: (0, n - 1) for v, n in zip(self.rs, inner)})
        extents = {b.name: b.layout.storage_extent() for b in list(self.graph.inputs) + list(self.graph.buffers)}
        for name, t in self.graph.constants.items():
            extents[name] = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
        ivs = []
        nonempty = all(hi >= lo for lo, hi in ranges.values())
        self.extents = extents
        for name, e, cond in self.accesses:
            if name in self.locals:
                continue
            try:
                check_access(name, e, ranges, extents[name], cond)   # a masked load: where its mask holds
            except Unsupported:
                if not e.atoms(IndirectIndex):
                    raise
                # a data-dependent access bounds.py cannot prove: every indirect load of this buffer
                # checks its element offsets in the kernel (CppHandler._checked_gather)
                self.checked_loads.add(name)
            if nonempty:
                ivs.append(bound(e, ranges))   # computed in every lane (masked or not): sets the width
        if nonempty:
            ivs += [bound(e, ranges) for e in self.index_exprs]
            # every partial sum C++ forms on the way (|term| maxima added up), and the loop counters:
            # a merged loop runs to the product of its sizes and a vector loop tests `rm0 + 2 * VL
            # <= size` -- an expanded input (stride 0) has small indices over a huge loop
            # (x.expand(1, 2**31 - 1).sum(-1) looped forever with int32 counters)
            ivs += [Interval(-m, m) for m in (magnitude(e, ranges) for _, e, _ in self.accesses)]
            ivs.append(Interval(0, math.prod(outer) * math.prod(inner) + LOOP_STEP_MARGIN))
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

    def _memory_order(self):
        """Loop order of a purely elementwise group: its variables sorted by the stride of its stored
        buffers, largest outermost (stable), so that the vector loop runs along the unit stride
        of what it writes -- ``x.t().exp()`` keeps eager's column-major output and now reads and
        writes it contiguously instead of gathering and scattering.  Returns the nest's (vars, sizes)
        and how many of them are outer loops (the rest are the inner, vectorised ones)."""
        outer, inner = self.sig
        vars_, sizes = list(self.xs) + list(self.rs), list(outer) + list(inner)
        keep = vars_, sizes, len(self.xs)
        if self.g.sig[0] != "pw" or any(p != "inner" for p in self.placements.values()) or len(vars_) < 2:
            return keep
        stores = [e for name, e, _ in self.accesses if name in {n.name for n in self.g.nodes}]
        if not stores:
            return keep

        def stride(v):
            cs = [sympy.diff(e, v) for e in stores]
            return min(abs(int(c)) for c in cs) if all(c.is_Integer for c in cs) else None
        st = [stride(v) for v in vars_]
        if None in st or st[-1] == min(st):
            return keep
        order = sorted(range(len(vars_)), key=lambda k: -st[k])
        return [vars_[k] for k in order], [sizes[k] for k in order], len(vars_) - 1

    def generate(self) -> str:
        exprs = self._collect_exprs()
        self.index_t = self._check_bounds()
        nest, nsz, n_out = self._memory_order()
        outer, inner = tuple(nsz[:n_out]), tuple(nsz[n_out:])
        og, osz = self._merge(nest[:n_out], outer, exprs)
        ig, isz = self._merge(nest[n_out:], inner, exprs)
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
        if self._column_mode():
            return self._finish(self._gen_columns(nphase, inner))
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
                                            else "#pragma omp parallel for") + _SCHEDULE)
            lines.append(ind * level + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
            level += 1
        # scratch arrays for inner locals read in a later phase
        for n in self._scratch_nodes():
            arr = f"scratch_{n.name}"
            self.scratch[n.name] = arr
            cnt = math.prod(s for _, s in self.inner_loops)
            if cnt * 8 > choices.SCRATCH_MAX_BYTES:
                raise Unsupported("row too long for an in-cache scratch buffer")
            lines.append(ind * level + f"alignas(64) {STORAGE_CTYPE[self.dtypes[n.name]]} {arr}[{max(cnt, 1)}];")
        for p in range(nphase):
            lines += self._gen_phase(p, level)
        for _ in self.outer_loops:
            level -= 1
            lines.append(ind * level + "}")
        return self._finish(lines)

    def _finish(self, lines):
        """The kernel function around its loop nest ``lines``; the parallel loops get the schedule
        clause of choices.omp_schedule, which depends on the kernel's stores."""
        clause = choices.omp_schedule(any(choices.from_memory(self.sched.buffer_bytes(n)) for n in self.params),
                                      self.plain_large_store)
        lines = [ln.replace(_SCHEDULE, clause) for ln in lines]
        params = []
        for name, (ct, out) in self.params.items():
            params.append(f"{'' if out else 'const '}{ct}* __restrict__ {name}")
        head = [f'extern "C" void {self.name}({", ".join(params)}) {{',
                f"    using idx_t = {self.index_t};   // every index proved to fit (bounds.py)",
                "    constexpr idx_t VL = tp::Vec<float>::size;", "    (void)VL;"]
        if self.streamed:
            lines = _fence_streams(lines) + ["    tp::stream_fence();   // streaming stores of " +
                                             ", ".join(sorted(self.streamed))]
        return "\n".join(head + lines + ["}"])

    def _scratch_nodes(self):
        """Inner locals read in a later phase: they need a per-row scratch array."""
        ph = self.ph
        return [n for n in self.g.nodes if n.name in self.locals and self.placements[n.name] == "inner"
                and any(ph[o.name][0] > ph[n.name][0] for o in self.g.nodes if n.name in o.reads)]

    # -- column mode: reductions over non-trailing dims --------------------------------------------------
    def _column_mode(self):
        """Generate the group in column mode?  When it has a reduction whose innermost reduced loop
        walks memory with a stride (coefficient != 1) for some load, and every access to memory has
        coefficient 0 or 1 in the last (merged) outer loop: then the lanes can run across that loop
        (VL output columns at once) with plain vector loads instead of gathers.  Groups needing a
        scratch array, indirect indices or Mod/floor of the column variable keep the row mode."""
        if not (config.get("stax.cpp.column_reductions") and self.outer_loops and self.inner_loops) or self._scratch_nodes():
            return False
        if not any(p == "reduce" for p in self.placements.values()):
            return False
        xl, rl = self.outer_loops[-1][0], self.inner_loops[-1][0]
        produced = {n.name for n in self.g.nodes}
        strided = False
        for name, e, _ in self.accesses:
            if name in self.locals:
                continue
            t = self.translate(e)
            if t.atoms(IndirectIndex) or any(xl in a.free_symbols for a in t.atoms(sympy.Mod, sympy.floor)):
                return False
            c, cr = sympy.diff(t, xl), sympy.diff(t, rl)
            if not (c.is_Integer and int(c) in (0, 1)):
                return False
            if name not in produced and cr != 1:
                strided = True
        return strided and not self._column_loses_threads()

    def _column_loses_threads(self):
        """Fewer output columns than one vector, and fewer parallel blocks than the row mode's
        parallel rows: e.g. ``(10**6, 4).sum(0)`` — the row mode's threads win (column mode does
        not split the reduced loop across threads)."""
        sizes = [s for _, s in self.outer_loops]
        threads = choices_threads()
        if sizes[-1] >= _LANES_GUESS or \
                math.prod(sizes) * math.prod(s for _, s in self.inner_loops) < choices.PARALLEL_MIN_WORK:
            return False
        rest = math.prod(sizes[:-1])
        return min(threads, rest * sizes[-1]) > min(threads, rest)

    @contextlib.contextmanager
    def _column(self, u):
        """Context: generate column vector ``u`` of the block (lanes ``xl + u*VL ...``, the C++
        variable ``xl_u``)."""
        xl = self.outer_loops[-1][0]
        saved = self._merge_subs, self.vec_var, self.col_u
        self.vec_var, self.col_u = xl, u
        if u:
            s = sympy.Symbol(f"{xl}_{u}", integer=True, nonnegative=True)
            self._merge_subs = {k: (v.xreplace({xl: s}) if isinstance(v, sympy.Basic) else v)
                                for k, v in self._merge_subs.items()}
            self.vec_var = s
        try:
            yield
        finally:
            self._merge_subs, self.vec_var, self.col_u = saved

    def _gen_columns(self, nphase, inner):
        """The loop nest of column mode::

            #pragma omp parallel for collapse(depth)       // outer loops + blocks of columns
            for (idx_t xm0 = 0; ...) for (int64_t xm1_b = 0; xm1_b < blocks; ...) {
                idx_t xm1 = xm1_b * (U * VL);
                if (xm1 + U * VL <= N) { phases on U column vectors }
                else { phases on one vector at a time; masked tail (n lanes) }
            }

        Each phase runs the reduced loops as scalar loops; reductions keep one accumulator per
        column vector, row values are vectors (one column per lane)."""
        ind = "    "
        self.column = True
        self.parallel_inner = False
        xl, sl = self.outer_loops[-1]
        threads = choices_threads()
        lanes = _LANES_GUESS
        rest = math.prod(s for _, s in self.outer_loops[:-1])
        cu = max(1, min(config.get("stax.cpp.column_unroll"), sl // (lanes * max(1, -(-threads // max(1, rest))))))   # rest == 0: no work
        nblk = -(-sl // (cu * lanes))
        sizes = [s for _, s in self.outer_loops[:-1]] + [nblk]
        depth = choices.parallel_depth(sizes, (math.prod(inner) if inner else 1) * cu * lanes, threads)
        width = f"{cu} * VL"
        lines, level = [], 1
        for d, (m, size) in enumerate(self.outer_loops[:-1] + [(f"{xl}_b", None)]):
            if d == 0 and depth > 0:
                lines.append(ind * level + (f"#pragma omp parallel for collapse({depth})" if depth > 1
                                            else "#pragma omp parallel for") + _SCHEDULE)
            if size is None:
                lines.append(ind * level + f"for (int64_t {m} = 0; {m} < ({sl} + {width} - 1) / ({width}); {m} += 1) {{")
            else:
                lines.append(ind * level + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
            level += 1
        lines.append(ind * level + f"idx_t {xl} = (idx_t)({xl}_b * ({width}));")

        def phases(mode, ncols, lvl):
            out = [ind * lvl + f"const idx_t {xl}_{u} = {xl} + {u} * VL;" for u in range(1, ncols)]
            self.row_values = {}
            for p in range(nphase):
                out += self._gen_column_phase(p, lvl, mode, ncols)
            return out

        lines.append(ind * level + f"if ({xl} + {width} <= {sl}) {{")   # a full block
        lines += phases("vec", cu, level + 1)
        lines.append(ind * level + "} else {")                       # the last block: vectors, tail
        if cu > 1:
            lines.append(ind * (level + 1) + f"for (; {xl} + VL <= {sl}; {xl} += VL) {{")
            lines += phases("vec", 1, level + 2)
            lines.append(ind * (level + 1) + "}")
        lines.append(ind * (level + 1) + _tail_if(xl, sl))
        lines.append(ind * (level + 2) + f"const int n = (int)({sl} - {xl});")
        lines += phases("tail", 1, level + 2)
        lines.append(ind * (level + 1) + "}")
        lines.append(ind * level + "}")
        for _ in range(len(self.outer_loops)):
            level -= 1
            lines.append(ind * level + "}")
        return lines

    def _gen_column_phase(self, p, level, mode, ncols):
        """One phase in column mode on ``ncols`` column vectors (``mode``: "vec" or "tail")."""
        ind = "    "
        nodes = [n for n in self.g.nodes if self.ph[n.name][0] == p]
        inner_nodes = [n for n in nodes if self.placements[n.name] in ("inner", "reduce")]
        reds = [n for n in inner_nodes if self.placements[n.name] == "reduce"]
        lines = [ind * level + f"// phase {p} (columns): {', '.join(n.name for n in nodes)}"]
        cols = range(ncols)
        if inner_nodes:
            lines += [ind * level + f"{_vt(self.dtypes[n.name])} v_{n.name}_{u};" for n in reds for u in cols]
            lines.append(ind * level + "{")
            lvl = level + 1
            self.acc_leader = _accumulators(reds)
            leaders = [n for n in reds if self.acc_leader[n.name] is n]
            for n in leaders:
                lines += [ind * lvl + ln for ln in _acc_decl(n, self._acc_dtype(n), ncols)]
            blk = self._blocking(p, reds, ncols, column=True)
            lines += [ind * lvl + ln for ln in (blk.decls if blk else [])]
            for j, (m, size) in enumerate(self.inner_loops):   # the reduced loops: scalar, no tail
                last = j == len(self.inner_loops) - 1
                lines += ([ind * lvl + ln for ln in blk.counted_head(m, size)] if blk and last
                          else [ind * lvl + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{"])
                lvl += 2 if blk and last else 1
            for u in cols:
                with self._column(u):
                    lines += self._body(inner_nodes, mode, lvl, u)
            for j in range(len(self.inner_loops)):
                if blk and j == 0:
                    lvl -= 2
                    lines += [ind * lvl + ln for ln in blk.foot() + blk.pass_end()]
                else:
                    lvl -= 1
                    lines.append(ind * lvl + "}")
            lines += [ind * lvl + ln for ln in (blk.finals() if blk else [])]
            for n in leaders:
                sibs = [o for o in reds if self.acc_leader[o.name] is n]
                lines += [ind * lvl + ln for u in cols for ln in _acc_final_columns(n, sibs, u)]
            lines.append(ind * level + "}")
            for n in reds:
                self.row_values[n.name] = f"v_{n.name}"
                if n.name not in self.locals:
                    self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                    idx = n.buf.layout.index(kernel_index(n, "reduce", self.sig)[0])
                    for u in cols:
                        with self._column(u):
                            lines.append(ind * level + self._store(n.name, self.translate(idx), f"v_{n.name}_{u}",
                                                                   mode, n.buf.layout.dtype))
        for n in (n for n in nodes if self.placements[n.name] == "outer"):
            idx, _ = kernel_index(n, "outer", self.sig)
            dt = self.dtypes[n.name]
            for u in cols:
                with self._column(u):
                    h = CppHandler(self, mode)
                    with set_handler(h):
                        v = h.to_dtype(n.buf.data.inner_fn(idx), dt)
                    lines += [ind * level + ln for ln in h.lines]
                    lines.append(ind * level + f"const {_vt(dt)} v_{n.name}_{u} = {v};")
                    if n.name not in self.locals:
                        self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                        sidx = self.translate(n.buf.layout.index(idx))
                        lines.append(ind * level + self._store(n.name, sidx, f"v_{n.name}_{u}", mode,
                                                               n.buf.layout.dtype))
            self.row_values[n.name] = f"v_{n.name}"
        return lines

    def _blocking(self, p, reds, nacc, column=False):
        """blocking.Plan of this phase's long floating sums and Welford reductions, or None: the
        innermost reduced loop makes ``steps`` steps per pass (row mode: of ``nacc`` vectors),
        each adding one term to every lane of every accumulator."""
        specs = [(n.name, n.buf.data.reduction_type, CTYPE[self._acc_dtype(n)]) for n in reds
                 if self.acc_leader[n.name] is n and
                 blocking.blockable(n.buf.data.reduction_type, self._acc_dtype(n), n.buf.data.src_dtype)]
        sizes = [s for _, s in self.inner_loops]
        if not specs or not sizes or 0 in sizes or not config.get("stax.cpp.cascade"):
            return None
        v, passes = sizes[-1], math.prod(sizes[:-1])
        m = blocking.levels(v if column else -(-v // (nacc * blocking.MIN_LANES)) + nacc, passes)
        if m == 1:
            return None
        steps = str(v) if column else f"{v} / ({nacc} * VL)"
        terms = str(v) if column else f"{v} / ({nacc} * VL) + ({v} % ({nacc} * VL)) / VL + ({v} % VL != 0)"
        return blocking.Plan(p, specs, nacc, steps, terms, passes, m)

    def scratch_expr(self):
        """Index into a row scratch array, in the current vector-loop variable."""
        e = self._scratch_index()
        if self.inner_loops and self.vec_var is not None:
            e = e.subs(self.inner_loops[-1][0], self.vec_var)
        return e

    def _acc_dtype(self, n):
        """The dtype the accumulator holds (argmax/argmin: of the values compared)."""
        r = n.buf.data
        if r.reduction_type in ("any", "all"):
            return torch.bool
        return r.src_dtype if r.reduction_type in ("argmax", "argmin") else r.dtype

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
                lines.append(ind * level + f"{CTYPE[n.buf.data.dtype]} v_{n.name};")
            lines.append(ind * level + "{")
            lvl = level + 1
            self.acc_leader = _accumulators(reds)
            nacc = _n_acc(reds)
            for n in reds:
                if self.acc_leader[n.name] is n:
                    lines += [ind * lvl + ln for ln in _acc_decl(n, self._acc_dtype(n), nacc)]
            blk = self._blocking(p, reds, nacc) if reds and nacc > 1 else None
            lines += [ind * lvl + ln for ln in (blk.decls if blk else [])]
            for k, (m, size) in enumerate(self.inner_loops[:-1]):
                lines.append(ind * lvl + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
                lvl += 1
            if self.inner_loops:
                vm, vsize = self.inner_loops[-1]
                self.vec_var = vm
                earlier = set(self.loaded)
                lines.append(ind * lvl + f"idx_t {vm} = 0;")
                first = True   # the first vector loop runs over (nearly) all of the row: it prefetches
                if reds and nacc > 1:
                    step, blvl = f"{nacc} * VL", lvl + (2 if blk else 1)
                    lines += ([ind * lvl + ln for ln in blk.split_head(vm, vsize, step)]
                              if blk else [ind * lvl + f"for (; {vm} + {step} <= {vsize}; {vm} += {step}) {{"])
                    with self._prefetch(vm, inner_nodes, earlier, lines, blvl):
                        for u in range(nacc):
                            lines += self._body(inner_nodes, "vec", blvl, u, offset=u)
                    lines += [ind * lvl + ln for ln in (blk.foot(vm) if blk else ["}"])]
                    first = False
                if self.parallel_inner:
                    lines.append(ind * lvl + "#pragma omp parallel for" + _SCHEDULE)
                    lines.append(ind * lvl + f"for (idx_t {vm}_b = 0; {vm}_b < {vsize} / VL; {vm}_b += 1) {{")
                    lines.append(ind * (lvl + 1) + f"const idx_t {vm} = {vm}_b * VL;")
                    with self._prefetch(vm, inner_nodes, earlier, lines, lvl + 1, first):
                        lines += self._body(inner_nodes, "vec", lvl + 1, 0)
                    lines.append(ind * lvl + "}")
                    lines.append(ind * lvl + f"{vm} = ({vsize} / VL) * VL;")
                else:
                    lines.append(ind * lvl + f"for (; {vm} + VL <= {vsize}; {vm} += VL) {{")
                    with self._prefetch(vm, inner_nodes, earlier, lines, lvl + 1, first):
                        lines += self._body(inner_nodes, "vec", lvl + 1, 0)
                    lines.append(ind * lvl + "}")
                lines.append(ind * lvl + _tail_if(vm, vsize))
                lines.append(ind * (lvl + 1) + f"const int n = (int)({vsize} - {vm});")
                lines += self._body(inner_nodes, "tail", lvl + 1, 0)
                lines.append(ind * lvl + "}")
                lines += [ind * lvl + ln for ln in (blk.pass_end() if blk else [])]
            else:   # no inner loop: one element per row
                self.vec_var = None
                lines += self._body(inner_nodes, "tail1", lvl, 0)
            for _ in self.inner_loops[:-1]:
                lvl -= 1
                lines.append(ind * lvl + "}")
            self.vec_var = None
            lines += [ind * lvl + ln for ln in (blk.finals() if blk else [])]
            for n in reds:
                if self.acc_leader[n.name] is n:
                    sibs = [o for o in reds if self.acc_leader[o.name] is n]
                    lines += [ind * lvl + ln for ln in _acc_final(n, self._acc_dtype(n), sibs, nacc)]
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

    @contextlib.contextmanager
    def _prefetch(self, vm, nodes, earlier, lines, level, active=True):
        """Context around the generation of a vector loop's body (appended to ``lines`` after the
        loop header): records the body's unit-stride loads.  When choices.prefetch_chunk picks the
        loop, either every load of its read streams from memory becomes ``load_split``
        (choices.split_loads, the default), or it inserts at the head of the body one block
        prefetch per read stream every ``chunk`` elements::

            if ((rm0 & 511) == 0) { tp::prefetch_block(arg0 + (rm0 + 2048 * xm0), 2048); ... }

        A buffer an earlier phase of the kernel loaded is in cache already (the row's second pass)."""
        if not active:
            yield
            return
        head = len(lines)
        self.stream_loads, self.prefetch_var, self.large_store, self.vec_loads = {}, vm, False, set()
        try:
            yield
        finally:
            loads, self.stream_loads, self.prefetch_var = self.stream_loads, None, None
        big = {key: dt for key, dt in loads.items()
               if key[0] not in earlier and choices.from_memory(self.sched.buffer_bytes(key[0]))}
        chunk = choices.prefetch_chunk(len(big), self.large_store, [n.buf.data for n in nodes])
        if chunk and choices.split_loads():
            # a cheap loop streaming from memory: every load of its streams at half width, no
            # block prefetch (choices.split_loads measured both)
            names = {name for name, _ in big}
            split = [(n, b) for n, b in self.vec_loads if n in names]
            for i in range(head, len(lines)):
                for name, base in split:
                    lines[i] = lines[i].replace(f"::load({name} + {base})", f"::load_split({name} + {base})")
        elif chunk:
            calls = " ".join(f"tp::prefetch_block({name} + {base}, {chunk * dt.itemsize});"
                             for (name, base), dt in big.items())
            lines.insert(head, "    " * level + f"if (({vm} & {chunk - 1}) == 0) {{ {calls} }}")

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
            if pl == "reduce" and self.acc_leader[n.name] is not n:
                continue    # a sibling output of another node's accumulator (argmax value, welford m2)
            idx, ridx = kernel_index(n, pl, self.sig)
            with set_handler(h):
                v = n.buf.data.inner_fn(idx, ridx) if pl == "reduce" else n.buf.data.inner_fn(idx)
                if pl == "reduce" and n.buf.data.reduction_type in ("argmax", "argmin"):
                    flat = sum((r * math.prod(n.rranges[k + 1:]) for k, r in enumerate(ridx)), sympy.Integer(0))
                    v = (v, h.index_expr(flat, torch.int64))
            out += [ind * level + ln for ln in h.lines]
            h.lines = []
            if pl == "reduce":   # column mode: the reduced loop has no tail, every lane is a column
                out.append(ind * level + _acc_update(n, self._acc_dtype(n), unroll, v, "vec" if self.column else mode))
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

    def _streamable(self, target, expr, dtype):
        """Write this store with streaming stores?  choices.stream_stores decides by size; the
        stores must also cover every line with streaming stores only: each vector store and each
        row starts on a ``choices.STREAM_PIECE_BYTES`` boundary (given a line-aligned buffer), so
        the row's tail is whole pieces too and streams (``storen_stream``).  A line that a plain
        store brings into cache and a streaming store then writes costs more than the streaming
        saves (16384 x 1000 softmax with plain row tails beside streamed heads: 1.4x slower)."""
        if self.column or target in self.scratch.values() or not choices.stream_stores(self.sched.buffer_bytes(target)):
            return False
        piece = max(1, choices.STREAM_PIECE_BYTES // dtype.itemsize)
        e = sympy.expand(expr)
        loops = self.outer_loops + self.inner_loops[:-1]
        if loops and int(self.inner_loops[-1][1]) % piece:
            return False   # rows end mid-piece: a plain tail per row
        for sym in e.free_symbols:
            if sym != self.vec_var and sympy.diff(e, sym) % piece != 0:
                return False
        return e.subs({sym: 0 for sym in e.free_symbols}) % piece == 0

    def _store(self, target, expr, v, mode, dtype):
        coeff = self.inner_coeff(expr) if self.vec_var is not None else 0
        base = cexpr(expr)
        stream = mode in ("vec", "tail") and coeff == 1 and dtype != torch.bool and self._streamable(target, expr, dtype)
        if mode == "vec" and choices.from_memory(self.sched.buffer_bytes(target)):
            self.large_store = True
            self.plain_large_store = self.plain_large_store or not stream
        if dtype == torch.bool:
            return f"tp_store_bool({target} + {base}, {coeff}, {v}, {'n' if mode in ('tail', 'tail1') else 'VL'});"
        if mode == "tail1":
            return f"{target}[{base}] = {v}[0];"
        if coeff == 1:
            if stream:
                self.streamed.add(target)
            how = "_stream" if stream else ""   # store / store_stream, storen / storen_stream
            return f"{v}.store{how}({target} + {base});" if mode == "vec" else f"{v}.storen{how}({target} + {base}, n);"
        return f"tp_scatter({target} + {base}, {coeff}, {v}, {'n' if mode == 'tail' else 'VL'});"


def _fence_streams(lines):
    """Every ``#pragma omp parallel for`` loop becomes a parallel region whose threads fence their
    streaming stores before the region's closing barrier::

        #pragma omp parallel
        {
        #pragma omp for nowait
        for (...) { ... }
        tp::stream_fence();
        }
    """
    out, i = [], 0
    while i < len(lines):
        ln = lines[i]
        if ln.lstrip().startswith("#pragma omp parallel for"):
            ind = ln[:len(ln) - len(ln.lstrip())]
            loop_ind = lines[i + 1][:len(lines[i + 1]) - len(lines[i + 1].lstrip())]
            end = next(j for j in range(i + 2, len(lines)) if lines[j] == loop_ind + "}")
            body = _fence_streams(lines[i + 1:end + 1])
            out += [ind + "#pragma omp parallel", ind + "{",
                    ind + ln.lstrip().replace("#pragma omp parallel for", "#pragma omp for", 1) + " nowait",
                    *body, ind + "tp::stream_fence();", ind + "}"]
            i = end + 1
        else:
            out.append(ln)
            i += 1
    return out


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
