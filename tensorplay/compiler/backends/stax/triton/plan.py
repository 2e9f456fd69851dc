"""The GPU's decisions for a kernel plan: kernel kind, block sizes, warps (the chapter, §9.2–§9.7).

A :class:`~..kernel_plan.KernelPlan` says what a kernel computes; :func:`plan_triton` adds how
its Triton kernel covers the iteration space, as the fields of a :class:`TritonPlan`
(``plan.device``):

* ``kind``: ``pointwise`` -- every loop of the nest flattened onto one block index ``xindex``
  (``XBLOCK`` elements per program, a 1-D grid), or *tiled* when its two loops disagree on the fast
  axis (stores contiguous along the inner loop, a load along the outer: a transpose) -- a
  ``[YBLOCK, XBLOCK]`` tile of (outer, inner) per program, whose loads and stores both run along
  whole lines (:data:`TILE`) -- or ``reduction``: the outer loops flattened onto
  ``xindex`` (``XBLOCK`` rows per program, shape ``[XBLOCK, 1]``), the reduced loops onto
  ``rindex`` (``[1, RBLOCK]``);
* ``persistent``: the whole row is one ``RBLOCK`` block held in registers (every phase of the
  row reads its values from there: no second pass through memory) when the row has at most
  :data:`PERSISTENT_MAX_ROW` elements (its upper bound, for a symbolic row); otherwise each phase
  loops over the row in blocks of ``RBLOCK`` with per-lane accumulators (*looped*), recomputing
  what a later phase reads;
* ``column``: the plan's ``column_candidate`` (a reduction over a strided dim whose accesses are
  contiguous along the rows): many rows per program (:data:`COLUMN_XBLOCK`), short row blocks,
  so that a warp's loads run along the contiguous output columns;
* ``split``: a reduction of few rows and long ones (a full sum, a column sum of few columns) would
  keep a few SMs busy; its rows are cut into ``split`` chunks, a first kernel writes one partial
  result per (row, chunk) to a workspace and a second combines them (:data:`SPLIT_BELOW_PROGRAMS`,
  :data:`SPLITTABLE`);
* ``XBLOCK``, ``RBLOCK``, ``num_warps``, ``num_stages``: the named heuristics below, at the size
  hints (Little's law, §9.6: enough independent loads in flight per SM -- a block of
  :data:`POINTWISE_XBLOCK` elements over :data:`POINTWISE_WARPS` warps keeps 8 per thread);
  ``max-autotune`` searches around them (autotune.py).

Guarantee: nothing here prints Triton; the printer (kernel.py) reads these fields only, and every
block size is a power of two (``tl.arange``'s requirement).
"""
from __future__ import annotations

import dataclasses
import math

import sympy

from ..sizevars import is_static, size_hint, size_upper_bound

__all__ = ["TritonPlan", "plan_triton", "PERSISTENT_MAX_ROW", "PERSISTENT_MAX_ROW_LOADS", "POINTWISE_XBLOCK", "POINTWISE_WARPS",
           "REDUCTION_BLOCK_ELEMS", "LOOPED_RBLOCK", "COLUMN_XBLOCK", "COLUMN_RBLOCK", "MAX_WARPS"]

#: the longest row a persistent reduction keeps in registers (elements)
PERSISTENT_MAX_ROW = 4096
#: elements per program of a pointwise kernel, and its warps (8 elements per thread)
POINTWISE_XBLOCK = 1024
POINTWISE_WARPS = 4
#: elements (XBLOCK * RBLOCK) a reduction program holds per value
REDUCTION_BLOCK_ELEMS = 4096
#: a persistent reduction's block (XBLOCK rows of RBLOCK) and its elements per warp: 4 rows of 2048 on
#: 4 warps ran LayerNorm -> GELU at 246 µs on an H200 where 2 rows on 8 warps took 386 µs, softmax
#: and row sums within 2 % of their best (benchmarks/triton_configs.py, docs/PERFORMANCE.md)
PERSISTENT_BLOCK_ELEMS = 8192
PERSISTENT_ELEMS_PER_WARP = 2048
#: ... unless the row reads more than this many buffers: each row-wide load is a block of values held
#: in registers until its last phase, and a backward kernel reading a GPT residual stream's dozen
#: tensors over 8 rows of 1024 on 4 warps spilled, at 0.5 TB/s on an H200.  Such a kernel takes one row
#: per program and a warp per PERSISTENT_LOADED_PER_WARP of its row-wide values (32 a thread; at most
#: MAX_WARPS)
PERSISTENT_MAX_ROW_LOADS = 4
PERSISTENT_LOADED_PER_WARP = 1024
#: the row block of a looped reduction
LOOPED_RBLOCK = 1024
#: column reductions: rows (output columns) per program and the row block
COLUMN_XBLOCK = 64
COLUMN_RBLOCK = 32
#: a tiled pointwise kernel (a transpose): TILE x TILE elements on TILE_WARPS warps
TILE = 64
TILE_WARPS = 4
#: at most this many warps per program; one warp per this many elements of a block
MAX_WARPS = 8
ELEMS_PER_WARP = 256


@dataclasses.dataclass(frozen=True)
class TritonPlan:
    """The GPU decisions of one kernel (module doc)."""
    kind: str
    persistent: bool
    column: bool
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    XBLOCK: int
    RBLOCK: int
    num_warps: int
    num_stages: int = 1
    #: a tiled 2-D pointwise kernel: the rows (the outer of its two loops) in blocks of YBLOCK
    YBLOCK: int = 0
    ynumel: sympy.Expr = sympy.Integer(1)
    #: a split reduction: each row cut into ``split`` chunks of ``chunk`` elements, one program per
    #: (row block, chunk) writing a partial result, a second kernel combining them (0: not split)
    split: int = 0
    chunk: int = 0

    @property
    def config(self) -> dict:
        """The launch configuration (what autotuning varies)."""
        c = {"XBLOCK": self.XBLOCK, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.kind == "reduction":
            c["RBLOCK"] = self.RBLOCK
        if self.YBLOCK:
            c["YBLOCK"] = self.YBLOCK
        return c

    def describe(self) -> str:
        if self.kind == "pointwise" and self.YBLOCK:
            return (f"triton tiled pointwise, {self.ynumel} x {self.xnumel}, YBLOCK {self.YBLOCK} x XBLOCK "
                    f"{self.XBLOCK}, {self.num_warps} warps")
        if self.kind == "pointwise":
            return f"triton pointwise, {self.xnumel} elements, XBLOCK {self.XBLOCK}, {self.num_warps} warps"
        how = "persistent" if self.persistent else f"split x{self.split}" if self.split else "looped"
        return (f"triton {how} reduction{' (column)' if self.column else ''}, {self.xnumel} rows x {self.rnumel}, "
                f"XBLOCK {self.XBLOCK}, RBLOCK {self.RBLOCK}, {self.num_warps} warps")


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _warps(elems: int, per_warp: int = ELEMS_PER_WARP) -> int:
    return max(1, min(MAX_WARPS, _pow2(max(1, elems // per_warp))))


def _transposing(plan) -> bool:
    """Two loops, stores contiguous along the inner one and some load contiguous along the outer
    one (a transpose): a tiled kernel reads and writes whole lines (Triton moves the tile through
    shared memory between the two layouts)."""
    loops = plan.outer_loops + plan.inner_loops
    if len(loops) != 2:
        return False
    outer, inner = (lp.var for lp in loops)
    for a in plan.accesses:
        if a.buffer in plan.locals or a.kind != "load":
            continue
        e = plan.translate(a.index)
        if sympy.diff(e, outer) == 1 and sympy.diff(e, inner) != 1:
            return True
    return False


def _row_loads(plan) -> int:
    """The buffers a reduction kernel loads along its rows (an index over a reduced loop)."""
    inner = {lp.var for lp in plan.inner_loops}
    return len({a.buffer for a in plan.accesses if a.kind == "load" and a.buffer not in plan.locals
                and plan.translate(a.index).free_symbols & inner})


def _bound(e) -> int | None:
    """A size's value when static, else its upper bound (None: unbounded)."""
    return size_hint(e) if is_static(e) else size_upper_bound(e)


def plan_triton(plan) -> TritonPlan:
    """The GPU decisions of ``plan`` (module doc)."""
    p = _plan_triton(plan)
    return _with_split(plan, p) if p.kind == "reduction" else p


#: a reduction kernel of fewer programs than this leaves SMs idle: split its rows (an H100/H200 has
#: 132 SMs; a few programs each keep it busy) ...
SPLIT_BELOW_PROGRAMS = 264
#: ... when a program would reduce at least this many elements (XBLOCK rows of the row length: a
#: column reduction's 64 columns of 8192 rows -- a bias gradient of a GPT step -- ran on 12 programs
#: at 200-800 GB/s on an H200, docs/PERFORMANCE.md); the split aims at this many programs
SPLIT_MIN_ROW = 1 << 14
SPLIT_TARGET_PROGRAMS = 528
#: the reductions whose partial results combine by their own monoid (argmax / welford do not split)
SPLITTABLE = frozenset({"sum", "prod", "max", "min", "any", "all"})


def _with_split(plan, p):
    """``p`` with a split of its rows (the module doc's split reduction) when it has too few
    programs: one phase whose inner values stay local (its reductions and the row values computed
    from them are the combining kernel's), static sizes, monoids of :data:`SPLITTABLE`."""
    if not (is_static(p.xnumel) and is_static(p.rnumel)) or len(plan.phases) != 1 or plan.scratch:
        return p
    ph = plan.phases[0]
    if any(plan.nodes[n].placement == "inner" and plan.nodes[n].storage == "memory" for n in ph.nodes):
        return p
    if any(plan.nodes[n].reduction.kind not in SPLITTABLE for n in ph.reductions):
        return p
    rows, row = int(p.xnumel), int(p.rnumel)
    programs = -(-rows // p.XBLOCK)
    if programs >= SPLIT_BELOW_PROGRAMS or p.XBLOCK * row < SPLIT_MIN_ROW:
        return p
    split = min(SPLIT_TARGET_PROGRAMS // programs, max(1, row // (4 * p.RBLOCK)))
    split = 1 << max(0, split.bit_length() - 1)      # (a power of two: the combine's tl.arange)
    if split < 2:
        return p
    chunk = -(-(-(-row // split)) // p.RBLOCK) * p.RBLOCK
    return dataclasses.replace(p, persistent=False, split=split, chunk=chunk)


def _plan_triton(plan) -> TritonPlan:
    xn = math.prod((lp.size for lp in plan.outer_loops), start=sympy.Integer(1))
    rn = math.prod((lp.size for lp in plan.inner_loops), start=sympy.Integer(1))
    if not plan.has_reduction and _transposing(plan):
        (outer, inner) = (plan.outer_loops + plan.inner_loops)
        return TritonPlan("pointwise", False, False, inner.size, sympy.Integer(1),
                          min(TILE, _pow2(max(1, size_hint(inner.size)))), 1, TILE_WARPS,
                          YBLOCK=min(TILE, _pow2(max(1, size_hint(outer.size)))), ynumel=outer.size)
    if not plan.has_reduction:
        total = sympy.expand(xn * rn)
        xb = min(POINTWISE_XBLOCK, _pow2(max(1, size_hint(total))))
        return TritonPlan("pointwise", False, False, total, sympy.Integer(1), xb, 1, _warps(xb) if xb < POINTWISE_XBLOCK
                          else POINTWISE_WARPS)
    rows, row = max(1, size_hint(xn)), max(1, size_hint(rn))
    top = _bound(rn)
    if plan.column_candidate:
        xb = min(COLUMN_XBLOCK, _pow2(rows))
        rb = min(COLUMN_RBLOCK, _pow2(row))
        persistent = top is not None and top <= rb
        return TritonPlan("reduction", persistent, True, xn, rn, xb, rb, _warps(xb * rb))
    if top is not None and top <= PERSISTENT_MAX_ROW:
        rb = _pow2(max(1, top))
        loads = _row_loads(plan)
        if loads > PERSISTENT_MAX_ROW_LOADS:
            return TritonPlan("reduction", True, False, xn, rn, 1, rb, _warps(loads * rb, PERSISTENT_LOADED_PER_WARP))
        xb = max(1, min(_pow2(rows), PERSISTENT_BLOCK_ELEMS // rb))
        return TritonPlan("reduction", True, False, xn, rn, xb, rb, _warps(xb * rb, PERSISTENT_ELEMS_PER_WARP))
    rb = min(LOOPED_RBLOCK, _pow2(row))
    xb = max(1, min(_pow2(rows), REDUCTION_BLOCK_ELEMS // (4 * rb)))
    return TritonPlan("reduction", False, False, xn, rn, xb, rb, _warps(xb * rb))
