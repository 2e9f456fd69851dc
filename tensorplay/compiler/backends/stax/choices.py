"""Named, replaceable heuristics of Stax (invariant 7; chapter §6.6, §7.3, §8.4).

* :func:`should_realize` — materialisation (§6.6): write a value to memory, or recompute it in
  every reader?
* :func:`can_fuse` — legality of putting two scheduler groups in one kernel (§7.3, Prop. 7.1–7.3).
* :func:`score_fusion` — the benefit of a legal fusion, a tuple compared lexicographically:
  (shared bytes, -distance in the node order) — bytes saved first, then prefer near pairs.
* :func:`aot_decompose` — expand a training region's forward node by its decomposition (§5)?

The CPU's own heuristics (parallel depth, streaming stores, prefetching, the OpenMP schedule) are
the CPU backend's: cpp/choices.py.

Every threshold they use is a knob of tensorplay/compiler/config.py (``stax.*``; the C++
kernels' ``stax.cpp.*``), read at each use, so ``config.patch`` changes a decision and the
compiled-graph key alike.  The chapter's names stay readable here: ``choices.MAX_INLINE_OPS``,
``choices.HORIZONTAL_FUSION`` ... are read-only views of those knobs (:data:`KNOB_NAMES`); setting
one raises, naming the knob to patch.  Experiment 4 changes ``score_fusion`` or disables
horizontal fusion (``stax.horizontal_fusion``); experiment 2 compares example 7.2 with the
chapter's CPU materialisation (``stax.keep_realized_local``).

The measurements behind each rule are in docs/PERFORMANCE.md, "Heuristic measurements".
"""
from __future__ import annotations

import math
import sys
import types

import sympy

from ... import config
from .ops_handler import CountingHandler, set_handler

__all__ = ["should_realize", "realize_reread", "can_fuse", "score_fusion", "price", "aot_decompose", "eager_random",
           "keep_buffers", "KNOB_NAMES", "knob_views"]

#: the chapter's names of the heuristics' knobs -> their names in tensorplay/compiler/config.py
KNOB_NAMES = {
    "MAX_INLINE_OPS": "stax.max_inline_ops",
    "MAX_INLINE_LOADS": "stax.max_inline_loads",
    "HORIZONTAL_FUSION": "stax.horizontal_fusion",
    "KEEP_REALIZED_LOCAL": "stax.keep_realized_local",
    "SDPA_DECOMPOSE_MAX_SCORES": "stax.sdpa_decompose_max_scores",
}


def knob_views(module_name, names, computed=None):
    """Make the UPPERCASE ``names`` ({chapter's name: knob}) of module ``module_name`` read-only
    views of their knobs: reading one gives the knob's value now (``computed``: {name: function}
    for a value derived from its knob), assigning one raises, naming the knob to patch."""
    mod = sys.modules[module_name]
    computed = computed or {}

    def __getattr__(name):
        if name in computed:
            return computed[name]()
        if name in names:
            return config.get(names[name])
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    class _Module(types.ModuleType):
        def __setattr__(self, name, value):
            if name in names:
                short = module_name.rsplit(".", 2)
                raise AttributeError(f"{'.'.join(short[-2:]) if short[-2] == 'cpp' else short[-1]}.{name} is the "
                                     f"configuration knob {names[name]!r}: set it with "
                                     f"tensorplay.compiler.config.patch({{{names[name]!r}: {value!r}}}) "
                                     f"(a with block or a decorator; docs/config.md)")
            super().__setattr__(name, value)
    mod.__getattr__ = __getattr__
    mod.__class__ = _Module


knob_views(__name__, KNOB_NAMES)


def price(loops) -> CountingHandler:
    """Count ops/loads/transcendental calls of one element of an unrealized value."""
    h = CountingHandler()
    idx = [sympy.Symbol(f"p{i}", integer=True) for i in range(len(loops.ranges))]
    with set_handler(h):
        if hasattr(loops, "reduction_ranges"):
            ridx = [sympy.Symbol(f"q{i}", integer=True) for i in range(len(loops.reduction_ranges))]
            loops.inner_fn(idx, ridx)
        else:
            loops.inner_fn(idx)
    return h


def should_realize(loops, node) -> bool:
    """Materialisation cost model (§6.6, CPU).  A pointwise value with one reader is always
    inlined (recomputing it costs nothing extra).  With several readers it is written to memory
    when recomputation is expensive: it calls a transcendental function (exp, log, tanh, erf...:
    tens of cycles per element, more than reading it back from cache), has more than
    MAX_INLINE_OPS ops (``stax.max_inline_ops``) or makes more than MAX_INLINE_LOADS loads
    (``stax.max_inline_loads``: r readers recomputing a value of n loads read r·n elements per
    element, writing it once and reading it back 1 + r -- a transformer's residual stream, a chain of
    adds each read by a layer norm and the next add, would otherwise be re-read from all of its
    terms by every layer, quadratically in depth).  Otherwise each reader recomputes it (no write,
    no extra read)."""
    users = [u for u in node.users if u.op != "output"]
    n_readers = len(users) + (1 if any(u.op == "output" for u in node.users) else 0)
    if n_readers <= 1:
        return False
    p = price(loops)
    return p.transcendental > 0 or p.ops > config.get("stax.max_inline_ops") or \
        p.n_loads > config.get("stax.max_inline_loads")


def realize_reread(loops, factor) -> bool:
    """Materialisation of a value whose one reader computes each of its elements ``factor`` > 1
    times on average: a pooling window reads every input about (k/s)^2 times, 2x nearest
    upsampling every element 4 times.  ``should_realize``'s "one reader: inline" assumes one
    evaluation per element; here the value is written to memory when it calls a transcendental
    function, makes more than one load (it is a window or a gather itself: windows of windows
    multiply), or the repeated evaluations cost more than MAX_INLINE_OPS ops.  Why (the CNN step
    that recomputed a window 36 times per element): docs/PERFORMANCE.md, "Heuristic measurements"."""
    if factor <= 1:
        return False
    p = price(loops)
    return p.transcendental > 0 or p.n_loads > 1 or p.ops * (factor - 1) > config.get("stax.max_inline_ops")


def can_fuse(sched, g1, g2) -> bool:
    """Legality (§7.3): same iteration space (Def. 7.2), every dependency between them reads the
    element computed in the same (or an earlier) iteration (Prop. 7.2/7.3), and no path
    g1 -> x -> g2 through a node outside both (Prop. 7.1: fusion must keep the graph acyclic)."""
    if g1.is_extern or g2.is_extern:
        return False
    sig = sched.merged_signature(g1, g2)
    if sig is None:
        return False
    if not config.get("stax.horizontal_fusion") and not sched.depends(g1, g2) and not sched.depends(g2, g1):
        return False
    if not config.get("stax.keep_realized_local"):
        for name in (g1.writes & g2.reads) | (g2.writes & g1.reads):
            readers = sched.node_readers(name)
            if not sched.by_name[name].is_reduction and len(readers) > 1 and all(n.is_reduction for n in readers):
                return False
    if sched.path_through_other(g1, g2) or sched.path_through_other(g2, g1):
        return False
    return sched.dependencies_aligned(g1, g2, sig)


def score_fusion(sched, g1, g2):
    """Lexicographic score: bytes the fusion saves (buffers one writes and the other reads, plus
    inputs both read), then closeness in the original order."""
    shared = 0
    for name in (g1.writes & g2.reads) | (g2.writes & g1.reads) | (g1.reads & g2.reads):
        shared += sched.buffer_bytes(name)
    distance = abs(g1.order - g2.order)
    return (shared, -distance)


def aot_decompose(node) -> bool:
    """Expand this forward node of a training region by its decomposition before AOT differentiates
    it?  Yes for scaled_dot_product_attention with a small score matrix (at most
    SDPA_DECOMPOSE_MAX_SCORES elements, ``stax.sdpa_decompose_max_scores``, 4 MiB in float32): the
    forward then computes the probabilities P itself (two matmuls around one fused mask + softmax kernel), the min-cut
    partitioner saves P (a reduction output), and the backward reads it instead of recomputing
    q kᵀ and the softmax as the fused op's derivative formula must.  Long sequences keep the fused
    library kernel, which never materialises the L x S scores."""
    d = node.opdef
    if d is None or d.name != "scaled_dot_product_attention":
        return False
    q, k = (a.meta.get("val") for a in node.args[:2])
    if q is None or k is None or q.dim() < 2:   # (meta values)
        return False
    return math.prod(q.shape[:-1]) * k.shape[-2] <= config.get("stax.sdpa_decompose_max_scores")


def eager_random() -> bool:
    """Random ops as calls into eager (ATen's generator: the numbers eager gives after the same
    ``manual_seed``) instead of Philox streams in the kernels?  ``stax.fallback_random``
    (``TP_STAX_FALLBACK_RANDOM=1``) asks for it, to compare a compiled program with eager bit for
    bit.  Read per compilation (the knob is part of the graph-cache key)."""
    return config.get("stax.fallback_random")


def keep_buffers() -> bool:
    """Keep a wrapper's dead intermediate buffers from one call to the next (runtime.take/stash)?
    A fresh buffer costs a page fault per 4 KiB page once glibc has returned the memory to the
    system, which it does for large blocks (the CNN training step of benchmarks/training.py:
    docs/PERFORMANCE.md, "Heuristic measurements").  The cost is the memory of those buffers
    between calls (at most the graph's peak of intermediates).  ``stax.keep_buffers``
    (``TP_STAX_KEEP_BUFFERS=0`` turns it off)."""
    return config.get("stax.keep_buffers")
