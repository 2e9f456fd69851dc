"""The CPU's decisions for a kernel plan (the chapter, §8.2–§8.3: Alg. 8.1, vector accumulators).

A :class:`~..kernel_plan.KernelPlan` says what a kernel computes; :func:`plan_cpp` adds what the
C++ kernel of it does on this CPU, as the named fields of a :class:`CppPlan` (``plan.device``):

* ``threads`` (OpenMP, ``torch.get_num_threads()``) and ``parallel_depth``: how many outer loops
  the ``#pragma omp parallel for collapse`` covers (``choices.parallel_depth``, Alg. 8.1);
  ``parallel_inner``: a purely elementwise kernel with no outer loop splits its vector loop;
* the vector loop: ``vector_var`` -- the innermost loop (row mode), or in **column mode** the last
  outer loop, whose lanes are then output columns (knob ``stax.cpp.column_reductions``; taken for a plan's
  ``column_candidate`` unless it would leave threads idle, ``_column_loses_threads``):
  ``column_unroll`` (at most ``stax.cpp.column_unroll``) vectors of columns per block, ``column_blocks`` blocks;
* per phase, ``accumulators``: vector accumulators per reduction in row mode (``stax.cpp.unroll``, or
  ``stax.cpp.welford_unroll`` beside a Welford update: latency hiding, invariant 6), and ``cascades``:
  the levels of cascaded summation (blocking.py, sized for the narrowest vector) and the
  accumulators they apply to.

Guarantee: nothing here prints C++; the printer (kernel.py) reads these fields only.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .... import config
from . import choices
from ..ir import Unsupported
from ..sizevars import is_static, size_hint, size_upper_bound
from . import blocking

__all__ = ["CppPlan", "Cascade", "plan_cpp", "n_accumulators"]

# knobs (tensorplay/compiler/config.py): stax.cpp.unroll (vector accumulators per reduction, latency
# hiding: invariant 6), stax.cpp.welford_unroll (... in a phase with a Welford reduction),
# stax.cpp.column_reductions (column mode), stax.cpp.column_unroll (column mode: vectors of output
# columns per block)
_LANES_GUESS = 16   # a guess at VL (AVX-512 floats): only sizes column blocks for Alg. 8.1


@dataclasses.dataclass(frozen=True)
class Cascade:
    """Cascaded accumulation in one phase: ``levels`` (> 1) and the accumulators (their leaders'
    names) it applies to: long floating sums and narrow Welford states (blocking.blockable)."""
    levels: int
    leaders: tuple


@dataclasses.dataclass(frozen=True)
class CppPlan:
    """The CPU decisions of one kernel (module doc)."""
    threads: int
    column: bool
    vector_var: object
    parallel_depth: int
    parallel_inner: bool
    accumulators: dict
    cascades: dict
    column_unroll: int = 0
    column_blocks: int = 0
    lanes_guess: int = _LANES_GUESS

    def describe(self) -> str:
        mode = (f"column mode ({self.column_unroll} column vectors x {self.column_blocks} blocks)" if self.column
                else "row mode")
        parts = [f"cpu {mode}, vector loop {self.vector_var}, {self.threads} threads, "
                 f"parallel depth {self.parallel_depth}" + (", parallel vector loop" if self.parallel_inner else "")]
        if self.accumulators:
            parts.append("accumulators " + ", ".join(f"phase {p}: {n}" for p, n in self.accumulators.items()))
        if self.cascades:
            parts.append("cascades " + ", ".join(f"phase {p}: {c.levels} levels of {list(c.leaders)}"
                                                 for p, c in self.cascades.items()))
        return "; ".join(parts)


def choices_threads():
    try:
        return torch.get_num_threads()
    except Exception:  # noqa: BLE001
        return 1


def n_accumulators(plan, phase) -> int:
    """Accumulators per reduction in one phase (row mode): ``stax.cpp.unroll``, or
    ``stax.cpp.welford_unroll`` when a Welford update (a dependent sub-mul-add chain per element,
    ~3x the latency of an add) is among them."""
    welford = any(plan.nodes[r].reduction.kind == "welford" for r in phase.reductions)
    return config.get("stax.cpp.welford_unroll") if welford else config.get("stax.cpp.unroll")


def plan_cpp(plan) -> CppPlan:
    """The CPU decisions of ``plan`` (module doc); raises Unsupported when a row's scratch array
    would not fit in cache (``choices.row_scratch_fits``)."""
    threads = choices_threads()
    outer = [size_hint(lp.size) for lp in plan.outer_loops]      # heuristics: the size hints
    inner_work = math.prod(size_hint(lp.size) for lp in plan.inner_loops)
    column = config.get("stax.cpp.column_reductions") and plan.column_candidate and not _column_loses_threads(plan, threads)
    if column:
        sl = outer[-1]
        lanes = _LANES_GUESS
        rest = math.prod(outer[:-1])
        cu = max(1, min(config.get("stax.cpp.column_unroll"), sl // (lanes * max(1, -(-threads // max(1, rest))))))   # rest == 0: no work
        nblk = -(-sl // (cu * lanes))
        depth = choices.parallel_depth(outer[:-1] + [nblk], inner_work * cu * lanes, threads)
        cascades = {ph.number: c for ph in plan.phases if ph.inner for c in [_cascade(plan, ph, cu, True)] if c}
        return CppPlan(threads, True, plan.outer_loops[-1].var, depth, False, {}, cascades, cu, nblk)
    depth = choices.parallel_depth(outer, inner_work, threads)
    # a purely elementwise kernel with no outer loop: parallelise its (vector) loop
    parallel_inner = (not plan.outer_loops and not plan.has_reduction and bool(plan.inner_loops)
                      and inner_work >= choices.PARALLEL_MIN_WORK)
    if plan.scratch and not choices.row_scratch_fits(math.prod((lp.size for lp in plan.inner_loops), start=1)):
        raise Unsupported("row too long for an in-cache scratch buffer")
    accs, cascades = {}, {}
    for ph in plan.phases:
        if ph.reductions:
            accs[ph.number] = nacc = n_accumulators(plan, ph)
            c = _cascade(plan, ph, nacc, False) if nacc > 1 else None
            if c:
                cascades[ph.number] = c
    vec = plan.inner_loops[-1].var if plan.inner_loops else None
    return CppPlan(threads, False, vec, depth, parallel_inner, accs, cascades)


def _column_loses_threads(plan, threads):
    """Fewer output columns than one vector, and fewer parallel blocks than the row mode's
    parallel rows: e.g. ``(10**6, 4).sum(0)`` — the row mode's threads win (column mode does
    not split the reduced loop across threads)."""
    sizes = [size_hint(lp.size) for lp in plan.outer_loops]
    if sizes[-1] >= _LANES_GUESS or \
            math.prod(sizes) * math.prod(size_hint(lp.size) for lp in plan.inner_loops) < choices.PARALLEL_MIN_WORK:
        return False
    rest = math.prod(sizes[:-1])
    return min(threads, rest * sizes[-1]) > min(threads, rest)


def _cascade(plan, phase, nacc, column):
    """The phase's cascade (blocking.py) or None: the innermost reduced loop makes ``v`` steps
    per pass (row mode: of ``nacc`` vectors, sized for the narrowest vector), each adding one
    term to every lane of every accumulator."""
    reds = [plan.nodes[r].reduction for r in phase.reductions]
    leaders = tuple(name for name, r in zip(phase.reductions, reds) if r.leader == name
                    and blocking.blockable(r.kind, r.acc_dtype, r.src_dtype))
    # a symbolic length: the levels its largest value needs (the cascade bounds the error for
    # every size, Prop. 10.1), 2**31 terms when its range has no upper bound
    sizes = [size_hint(lp.size) if is_static(lp.size) else (size_upper_bound(lp.size) or 2 ** 31)
             for lp in plan.inner_loops]
    if not leaders or not sizes or 0 in sizes or not config.get("stax.cpp.cascade"):
        return None
    v, passes = sizes[-1], math.prod(sizes[:-1])
    m = blocking.levels(v if column else -(-v // (nacc * blocking.MIN_LANES)) + nacc, passes)
    return Cascade(m, leaders) if m > 1 else None
