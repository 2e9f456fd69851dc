"""C++ code generation: a kernel plan printed as one C++ function (the chapter, §8).

The kernel of a plan (kernel_plan.py) with iteration space (outer, inner) reads::

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
The loops, their merges (Prop. 6.3), the phases and where each value lives come from the plan;
the parallel depth, the vector loop, the accumulators and cascades from its CPU section
(cpp/plan.py).  In *column mode* (a reduction over non-trailing dims whose reduced loop
is strided) the lanes run across the last outer loop (VL output columns per vector, one
accumulator vector per column vector), the reduced loops are scalar loops, so every load is a
plain vector load — no gathers, no horizontal reduce.  Each compute function is evaluated with
:class:`~.ops.CppHandler`, which prints every ``ops`` call as one line of C++ (common
subexpressions are printed once); accumulators are printed by reduce.py.  What is decided
here, from the code being printed, is only how each access is printed: streaming stores
(choices.stream_stores), block prefetches or split loads (choices.prefetch_chunk,
choices.split_loads) and the OpenMP schedule clause (choices.omp_schedule).
"""
from __future__ import annotations

import contextlib
import math
import re

import sympy
import torch

from . import choices
from ..ir import Unsupported
from ..kernel_plan import KernelPlan
from .. import sizevars
from ..sizevars import size_upper_bound
from ..ops_handler import set_handler
from . import blocking
from .ops import CTYPE, STORAGE_CTYPE, CppHandler, _Val, cexpr, vec_type
from .plan import plan_cpp
from .reduce import acc_decl, acc_final, acc_final_columns, acc_update

__all__ = ["generate_kernel", "KernelGen", "CTYPE", "SIZE_CTYPE"]

#: the C++ type of a kernel's size arguments (a parameter whose entry in ``params`` is ``(SIZE_CTYPE, None)``)
SIZE_CTYPE = "int64_t"

_SCHEDULE = " @schedule@"   # stands for the schedule clause of a parallel loop until _finish knows it


def _tail_if(var, size) -> str:
    """The head of a loop's tail ``if (var < size) {`` -- after vector loops that leave ``var`` at a
    multiple of VL.  For a constant size the tail exists only when VL does not divide it, which
    ``if constexpr`` decides at compile time: g++ then never sees an unreachable tail (whose
    impossible lane counts it would warn about with -Waggressive-loop-optimizations)."""
    if str(size).isdigit():
        return f"if constexpr ({size} % VL != 0) if ({var} < {size}) {{"
    return f"if ({var} < {size}) {{"


class KernelGen:
    """Prints the C++ function of one :class:`~..kernel_plan.KernelPlan` whose ``device`` holds
    the CPU decisions (cpp/plan.py): it reads the plan's fields and decides nothing about
    loops, phases or placements; only how each access and store is printed (vector load, gather,
    streaming store, prefetch) is chosen here, from the code it prints."""

    def __init__(self, plan: KernelPlan, name: str):
        self.plan, self.cpu, self.name = plan, plan.device, name
        self._tmp = 0
        self.dtypes = {b: f.dtype for b, f in plan.buffers.items()}
        # sizes: literals when static; symbolic ones are the kernel's size arguments (the graph's
        # symbols, ``const int64_t s0``) and constants computed from them at its head (``ks0``)
        self.size_consts = {}     # C++ constant (a sympy Symbol) -> the size expression it holds
        self.extents = {b: f.extent for b, f in plan.buffers.items()}
        self.locals = plan.locals
        self.placements = {n.name: n.placement for n in plan.nodes.values()}
        self.index_t = CTYPE[plan.index_dtype]
        self.checked_loads = set(plan.checked_loads)   # buffers whose indirect loads check their offsets at run time
        self.outer_loops = [(lp.var, self._size(lp.size)) for lp in plan.outer_loops]
        self.inner_loops = [(lp.var, self._size(lp.size)) for lp in plan.inner_loops]
        self._merge_subs = dict(plan.substitution)
        self.vec_var = None       # the variable of the vector loop being printed (its lanes)
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
        self.column = False       # column mode (plan.py): lanes = output columns
        self.col_u = 0            # column mode: which vector of the block's columns is generated

    def _size(self, e):
        """A loop size as the kernel prints it: an int, a size symbol, or a constant ``ksN``
        holding a compound expression of them (declared at the kernel's head)."""
        e = sympy.expand(sympy.sympify(e))
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return e
        for c, v in self.size_consts.items():
            if v == e:
                return c
        c = sympy.Symbol(f"ks{len(self.size_consts)}", integer=True, positive=True)
        self.size_consts[c] = e
        return c

    def size_params(self, body: str) -> list:
        """The graph's size symbols the kernel reads (in its loops, index expressions and size
        constants), sorted by name: its size arguments."""
        from ..sizevars import current
        text = body + " ".join(cexpr(e) for e in self.size_consts.values())
        return sorted((s for s in current().symbols if re.search(rf"\b{s.name}\b", text)),
                      key=lambda s: (len(s.name), s.name))

    def nbytes(self, name):
        """Bytes of a buffer the kernel touches (0: a scratch array)."""
        f = self.plan.buffers.get(name)
        return f.nbytes if f is not None else 0

    def phase_nodes(self, p):
        """The scheduler nodes of phase ``p`` (program order)."""
        return [self.plan.nodes[k].ir for k in self.plan.phases[p].nodes]

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
        """The index's stride along the vector loop: an int, or (a symbolic stride) its C++ text."""
        v = self.vec_var
        if v is None:
            return 0
        c = sympy.expand(sympy.diff(expr, v))
        if c.is_Integer:
            return int(c)
        if c.free_symbols <= sizevars.current().symbols and v not in c.free_symbols:
            return cexpr(c)     # a stride of size arguments: C++ text (a gather / scatter with that stride)
        raise Unsupported(f"index {expr} is not affine in the vector loop")

    def local_value(self, name, handler):
        if name in self.row_values:
            dt = self.dtypes[name]
            if self.column:   # a vector of this block's columns (one row value per lane)
                return _Val(f"{self.row_values[name]}_{self.col_u}", dt)
            return handler._emit(f"{vec_type(dt)}({self.row_values[name]})", dt)
        if name in self.phase_values:
            return self.phase_values[name]
        return None

    def generate(self) -> str:
        nphase = len(self.plan.phases)
        if self.cpu.column:
            return self._finish(self._gen_columns(nphase))
        ind = "    "
        depth = self.cpu.parallel_depth
        self.parallel_inner = self.cpu.parallel_inner
        lines = []
        level = 1
        for d, (m, size) in enumerate(self.outer_loops):
            if d == 0 and depth > 0:
                lines.append(ind * level + (f"#pragma omp parallel for collapse({depth})" if depth > 1
                                            else "#pragma omp parallel for") + _SCHEDULE)
            lines.append(ind * level + f"for (idx_t {m} = 0; {m} < {size}; {m} += 1) {{")
            level += 1
        # scratch arrays for inner locals read in a later phase
        for slot, name in enumerate(self.plan.scratch):
            arr = f"scratch_{name}"
            self.scratch[name] = arr
            ct = STORAGE_CTYPE[self.dtypes[name]]
            cnt = math.prod(s for _, s in self.inner_loops)
            if not isinstance(cnt, int):    # a symbolic row: on the stack sized for its longest, or on the heap
                row = math.prod((lp.size for lp in self.plan.inner_loops), start=1)
                if choices.scratch_on_heap(row):
                    if slot >= 8 or ct == "bool":   # (tp_row_scratch: 8 slots; std::vector<bool> packs bits)
                        raise Unsupported("a heap row scratch of bools, or more than 8 of them")
                    lines.append(ind * level + f"{ct}* __restrict__ {arr} = tp_row_scratch<{ct}>({slot}, {cexpr(row)});")
                    continue
                cnt = size_upper_bound(row)
            lines.append(ind * level + f"alignas(64) {ct} {arr}[{max(cnt, 1)}];")
        for p in range(nphase):
            lines += self._gen_phase(p, level)
        for _ in self.outer_loops:
            level -= 1
            lines.append(ind * level + "}")
        return self._finish(lines)

    def _finish(self, lines):
        """The kernel function around its loop nest ``lines``; the parallel loops get the schedule
        clause of choices.omp_schedule, which depends on the kernel's stores."""
        clause = choices.omp_schedule(any(choices.from_memory(self.nbytes(n)) for n in self.params),
                                      self.plain_large_store)
        lines = [ln.replace(_SCHEDULE, clause) for ln in lines]
        params = []
        for name, (ct, out) in self.params.items():
            params.append(f"{'' if out else 'const '}{ct}* __restrict__ {name}")
        for sym in self.size_params("\n".join(lines)):
            self.params[sym.name] = (SIZE_CTYPE, None)      # a size argument (sizevars.py)
            params.append(f"const {SIZE_CTYPE} {sym.name}")
        head = [f'extern "C" void {self.name}({", ".join(params)}) {{',
                f"    using idx_t = {self.index_t};   // every index proved to fit (bounds.py)",
                "    constexpr idx_t VL = tp::Vec<float>::size;", "    (void)VL;"]
        head += [f"    const idx_t {c} = {cexpr(e)};" for c, e in self.size_consts.items()]
        if self.streamed:
            lines = _fence_streams(lines) + ["    tp::stream_fence();   // streaming stores of " +
                                             ", ".join(sorted(self.streamed))]
        return "\n".join(head + lines + ["}"])

    # -- column mode: reductions over non-trailing dims (plan.py) ---------------------------------------
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

    def _gen_columns(self, nphase):
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
        cu, depth = self.cpu.column_unroll, self.cpu.parallel_depth
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
        nodes = self.phase_nodes(p)
        inner_nodes = [n for n in nodes if self.placements[n.name] in ("inner", "reduce")]
        reds = [n for n in inner_nodes if self.placements[n.name] == "reduce"]
        lines = [ind * level + f"// phase {p} (columns): {', '.join(n.name for n in nodes)}"]
        cols = range(ncols)
        if inner_nodes:
            lines += [ind * level + f"{vec_type(self.dtypes[n.name])} v_{n.name}_{u};" for n in reds for u in cols]
            lines.append(ind * level + "{")
            lvl = level + 1
            leaders = [n for n in reds if self.is_leader(n)]
            for n in leaders:
                lines += [ind * lvl + ln for ln in acc_decl(n, self.acc_dtype(n), ncols)]
            blk = self._cascade(p, ncols)
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
                sibs = self.siblings(n, reds)
                lines += [ind * lvl + ln for u in cols for ln in acc_final_columns(n, sibs, u)]
            lines.append(ind * level + "}")
            for n in reds:
                self.row_values[n.name] = f"v_{n.name}"
                if n.name not in self.locals:
                    self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                    idx = self.plan.nodes[n.name].store.index
                    for u in cols:
                        with self._column(u):
                            lines.append(ind * level + self._store(n.name, self.translate(idx), f"v_{n.name}_{u}",
                                                                   mode, n.buf.layout.dtype))
        for n in (n for n in nodes if self.placements[n.name] == "outer"):
            idx = self.plan.nodes[n.name].index[0]
            dt = self.dtypes[n.name]
            for u in cols:
                with self._column(u):
                    h = CppHandler(self, mode)
                    with set_handler(h):
                        v = h.to_dtype(n.buf.data.inner_fn(idx), dt)
                    lines += [ind * level + ln for ln in h.lines]
                    lines.append(ind * level + f"const {vec_type(dt)} v_{n.name}_{u} = {v};")
                    if n.name not in self.locals:
                        self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                        sidx = self.translate(self.plan.nodes[n.name].store.index)
                        lines.append(ind * level + self._store(n.name, sidx, f"v_{n.name}_{u}", mode,
                                                               n.buf.layout.dtype))
            self.row_values[n.name] = f"v_{n.name}"
        return lines

    def _cascade(self, p, nacc):
        """blocking.Plan of phase ``p``'s cascaded accumulators (plan.device.cascades) with
        ``nacc`` accumulators each, or None: the innermost reduced loop makes ``steps`` steps per
        pass (row mode: of ``nacc`` vectors), each adding one term to every lane of every one."""
        c = self.cpu.cascades.get(p)
        if c is None:
            return None
        specs = [(name, self.plan.nodes[name].reduction.kind, CTYPE[self.plan.nodes[name].reduction.acc_dtype])
                 for name in c.leaders]
        sizes = [s for _, s in self.inner_loops]
        v, passes = sizes[-1], math.prod(sizes[:-1])
        column = self.column
        steps = str(v) if column else f"{v} / ({nacc} * VL)"
        terms = str(v) if column else f"{v} / ({nacc} * VL) + ({v} % ({nacc} * VL)) / VL + ({v} % VL != 0)"
        return blocking.Plan(p, specs, nacc, steps, terms, passes, c.levels,
                             static=all(isinstance(s, int) for s in sizes))

    # -- reductions (plan.nodes[...].reduction) -----------------------------------------------------------
    def acc_dtype(self, n):
        """The dtype the accumulator of reduction node ``n`` holds."""
        return self.plan.nodes[n.name].reduction.acc_dtype

    def is_leader(self, n):
        """Does reduction node ``n`` own its accumulator (kernel_plan.ReductionPlan.leader)?"""
        return self.plan.nodes[n.name].reduction.leader == n.name

    def siblings(self, n, reds):
        """The nodes among ``reds`` computed by ``n``'s accumulator (``n`` first)."""
        return [o for o in reds if self.plan.nodes[o.name].reduction.leader == n.name]

    def scratch_expr(self):
        """Index into a row scratch array, in the current vector-loop variable."""
        e = self._scratch_index()
        if self.inner_loops and self.vec_var is not None:
            e = e.subs(self.inner_loops[-1][0], self.vec_var)
        return e

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
        nodes = self.phase_nodes(p)
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
            nacc = self.cpu.accumulators.get(p, 1)   # (a phase without reductions has none)
            for n in reds:
                if self.is_leader(n):
                    lines += [ind * lvl + ln for ln in acc_decl(n, self.acc_dtype(n), nacc)]
            blk = self._cascade(p, nacc)
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
                if self.is_leader(n):
                    lines += [ind * lvl + ln for ln in acc_final(n, self.acc_dtype(n), self.siblings(n, reds), nacc)]
            lines.append(ind * level + "}")
            for n in reds:
                var = f"v_{n.name}"
                self.row_values[n.name] = var
                if n.name not in self.locals:
                    self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                    idx = self.translate(self.plan.nodes[n.name].store.index)
                    lines.append(ind * level + f"{n.name}[{cexpr(idx)}] = {var};")
        for n in outer_nodes:
            h = CppHandler(self, "row")
            idx = self.plan.nodes[n.name].index[0]
            with set_handler(h):
                v = n.buf.data.inner_fn(idx)
            lines += [ind * level + ln for ln in h.lines]
            var = f"v_{n.name}"
            lines.append(ind * level + f"const {CTYPE[v.dtype]} {var} = {v}[0];")
            self.row_values[n.name] = var
            if n.name not in self.locals:
                self.params[n.name] = (STORAGE_CTYPE[n.buf.layout.dtype], True)
                sidx = self.translate(self.plan.nodes[n.name].store.index)
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
               if key[0] not in earlier and choices.from_memory(self.nbytes(key[0]))}
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
            if pl == "reduce" and not self.is_leader(n):
                continue    # a sibling output of another node's accumulator (argmax value, welford m2)
            idx, ridx = self.plan.nodes[n.name].index
            with set_handler(h):
                v = n.buf.data.inner_fn(idx, ridx) if pl == "reduce" else n.buf.data.inner_fn(idx)
                if pl == "reduce" and n.buf.data.reduction_type in ("argmax", "argmin"):
                    flat = sum((r * math.prod(n.rranges[k + 1:]) for k, r in enumerate(ridx)), sympy.Integer(0))
                    v = (v, h.index_expr(flat, torch.int64))
            out += [ind * level + ln for ln in h.lines]
            h.lines = []
            if pl == "reduce":   # column mode: the reduced loop has no tail, every lane is a column
                out.append(ind * level + acc_update(n, self.acc_dtype(n), unroll, v, "vec" if self.column else mode))
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
        if self.column or target in self.scratch.values() or not choices.stream_stores(self.nbytes(target)):
            return False
        piece = max(1, choices.STREAM_PIECE_BYTES // dtype.itemsize)
        e = sympy.expand(expr)
        loops = self.outer_loops + self.inner_loops[:-1]
        if loops and (not isinstance(self.inner_loops[-1][1], int) or self.inner_loops[-1][1] % piece):
            return False   # rows end mid-piece: a plain tail per row
        for sym in e.free_symbols:
            if sym != self.vec_var and sympy.diff(e, sym) % piece != 0:
                return False
        return e.subs({sym: 0 for sym in e.free_symbols}) % piece == 0

    def _store(self, target, expr, v, mode, dtype):
        coeff = self.inner_coeff(expr) if self.vec_var is not None else 0
        base = cexpr(expr)
        stream = mode in ("vec", "tail") and coeff == 1 and dtype != torch.bool and self._streamable(target, expr, dtype)
        if mode == "vec" and choices.from_memory(self.nbytes(target)):
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


def generate_kernel(plan: KernelPlan, name: str) -> tuple[str, dict]:
    """The C++ source of kernel ``name`` for ``plan`` and its parameters (buffer -> (C++ element
    type, written?)).  Fills ``plan.device`` with the CPU decisions first (plan.plan_cpp)."""
    if plan.device is None:
        plan.device = plan_cpp(plan)
    kg = KernelGen(plan, name)
    return kg.generate(), kg.params
