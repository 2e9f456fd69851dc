"""Named, replaceable heuristics of Stax (invariant 7; chapter §6.6, §7.3, §8.4).

* :func:`should_realize` — materialisation (§6.6): write a value to memory, or recompute it in
  every reader?
* :func:`can_fuse` — legality of putting two scheduler groups in one kernel (§7.3, Prop. 7.1–7.3).
* :func:`score_fusion` — the benefit of a legal fusion, a tuple compared lexicographically:
  (shared bytes, -distance in the node order) — bytes saved first, then prefer near pairs.
* :func:`parallel_depth` — how many outer loops an OpenMP kernel parallelises (Alg. 8.1).
* :func:`stream_stores` — write a buffer with streaming (non-temporal) stores (§8 kernel quality)?
* :func:`prefetch_chunk` — request a vector loop's read streams from memory a block at a time (§8)?
* :func:`omp_schedule` — the OpenMP schedule of a kernel's parallel loop (Alg. 8.1)?
* :func:`aot_decompose` — expand a training region's forward node by its decomposition (§5)?

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

import functools
import math
import os
import sys
import types

import sympy

from ... import config
from .ops_handler import CountingHandler, set_handler

__all__ = ["should_realize", "realize_reread", "can_fuse", "score_fusion", "parallel_depth", "stream_stores",
           "stream_store_min_bytes", "aot_decompose", "from_memory", "prefetch_chunk", "split_loads",
           "omp_schedule", "eager_random", "keep_buffers", "KNOB_NAMES"]

#: the chapter's names of the heuristics' knobs -> their names in tensorplay/compiler/config.py
KNOB_NAMES = {
    "MAX_INLINE_OPS": "stax.max_inline_ops",
    "HORIZONTAL_FUSION": "stax.horizontal_fusion",
    "KEEP_REALIZED_LOCAL": "stax.keep_realized_local",
    "SDPA_DECOMPOSE_MAX_SCORES": "stax.sdpa_decompose_max_scores",
    "PARALLEL_MIN_WORK": "stax.cpp.parallel_min_work",
    "SCRATCH_MAX_BYTES": "stax.cpp.scratch_max_bytes",
    "STREAM_STORE_MIN_BYTES": "stax.cpp.stream_min_bytes",
    "STREAM_PIECE_BYTES": "stax.cpp.stream_piece_bytes",
    "OMP_SCHEDULE": "stax.cpp.omp_schedule",
    "PREFETCH_BYTES": "stax.cpp.prefetch_bytes",
    "PREFETCH_MAX_OPS": "stax.cpp.prefetch_max_ops",
    "PREFETCH_MAX_STREAMS": "stax.cpp.prefetch_max_streams",
    "SPLIT_LOADS": "stax.cpp.split_loads",
}


def __getattr__(name):     # choices.MAX_INLINE_OPS: the knob's value now
    if name == "STREAM_STORE_MIN_BYTES":
        return stream_store_min_bytes()
    if name in KNOB_NAMES:
        return config.get(KNOB_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Module(types.ModuleType):
    def __setattr__(self, name, value):
        if name in KNOB_NAMES:
            raise AttributeError(f"choices.{name} is the configuration knob {KNOB_NAMES[name]!r}: set it with "
                                 f"tensorplay.compiler.config.patch({{{KNOB_NAMES[name]!r}: {value!r}}}) "
                                 f"(a with block or a decorator; docs/config.md)")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Module


@functools.lru_cache(maxsize=None)
def _last_level_cache_bytes(default=32 << 20) -> int:
    """Size of the largest CPU cache (sysfs), or ``default`` where it cannot be read."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in os.listdir(base):
            if d.startswith("index"):
                with open(os.path.join(base, d, "size")) as f:
                    t = f.read().strip()
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:].upper(), 1)
                sizes.append(int(t.rstrip("KMGkmg")) * mult)
    except (OSError, ValueError):
        pass
    return max(sizes) if sizes else default


def stream_store_min_bytes() -> int:
    """Buffers of at least this many bytes are written with streaming stores (:func:`stream_stores`)
    and count as read from memory (:func:`from_memory`): ``stax.cpp.stream_min_bytes``
    (``TP_STAX_STREAM_MIN_BYTES``; a huge value turns streaming off), or the last-level cache size
    when it is 0 (the default)."""
    return config.get("stax.cpp.stream_min_bytes") or _last_level_cache_bytes()


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
    tens of cycles per element, more than reading it back from cache) or has more than
    MAX_INLINE_OPS ops (``stax.max_inline_ops``).  Otherwise each reader recomputes it (no write, no
    extra read)."""
    users = [u for u in node.users if u.op != "output"]
    n_readers = len(users) + (1 if any(u.op == "output" for u in node.users) else 0)
    if n_readers <= 1:
        return False
    p = price(loops)
    return p.transcendental > 0 or p.ops > config.get("stax.max_inline_ops")


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
            readers = [n for n in sched.nodes if name in n.reads]
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


def parallel_depth(outer_sizes, inner_numel, threads) -> int:
    """Algorithm 8.1: parallelise the fewest outer loops whose combined trip count gives every
    thread work (>= threads), and only if the total work pays for the fork/join (at least
    PARALLEL_MIN_WORK elements, ``stax.cpp.parallel_min_work``: fork/join costs ~µs)."""
    total = math.prod(outer_sizes) * max(inner_numel, 1)
    if total < config.get("stax.cpp.parallel_min_work") or not outer_sizes:
        return 0
    acc = 1
    for depth, s in enumerate(outer_sizes, start=1):
        acc *= s
        if acc >= threads:
            return depth
    return len(outer_sizes)


def from_memory(nbytes) -> bool:
    """Is a buffer of ``nbytes`` read from (or written to) main memory rather than a cache?  When it
    is at least the last-level cache (:func:`stream_store_min_bytes`)."""
    return nbytes >= stream_store_min_bytes()


def omp_schedule(from_memory_buffers, plain_large_store) -> str:
    """The ``schedule(...)`` clause of a kernel's parallel loops (Alg. 8.1 decides which loops):
    ``stax.cpp.omp_schedule`` (``TP_STAX_OMP_SCHEDULE``), by default ``static``: no clause, OpenMP's
    static split (each thread one contiguous block of rows).

    With ``"guided, 16"`` the former rule (the default until 2026-11-30) applies to a kernel that
    reads or writes a buffer from memory: each thread takes a chunk of half the remaining
    iterations divided by the thread count (at least 16), so a thread that runs slower (a vCPU
    shared with other tenants) or starts late gets less work, where the static split makes the
    whole kernel wait for it.  Static for the rest: a kernel whose buffers are all cache-sized, and
    one that writes a large buffer with plain stores (``plain_large_store``).  Static and guided
    tie under the fair protocol, and static keeps pace with torch eager when the host's LLC serves
    the input: docs/PERFORMANCE.md, "Heuristic measurements"."""
    sched = config.get("stax.cpp.omp_schedule")
    if not from_memory_buffers or plain_large_store or not sched or sched == "static":
        return ""
    return f" schedule({sched})"


def stream_stores(nbytes) -> bool:
    """Write a buffer of ``nbytes`` with streaming (non-temporal) stores?  Yes when it is at least
    the last-level cache: it would be evicted before any reader came, so the read-for-ownership a
    plain store of an uncached line costs is wasted traffic (a third of a read-one-write-one
    kernel's).  Smaller buffers keep plain stores, so a consumer kernel finds them in cache."""
    return from_memory(nbytes)


def split_loads() -> bool:
    """Should a loop that :func:`prefetch_chunk` picks (one or two read streams from memory, no
    large store, cheap) load its streams with ``Vec::load_split`` -- each 64-byte chunk as two
    32-byte loads (AVX-512 builds; other widths are unchanged) -- *instead of* the block prefetch?
    ``stax.cpp.split_loads`` (``TP_STAX_SPLIT_LOADS=0`` turns it off), on by default: on Zen 4 a
    row sum streams faster with half-width loads (why is not established), and split loads beat
    the block prefetch on the loops it picks; loops that compute more or store beside the read
    keep 64-byte loads.  Measurements: docs/PERFORMANCE.md, "Heuristic measurements"."""
    return config.get("stax.cpp.split_loads")


def prefetch_chunk(n_streams, large_store, values) -> int:
    """Elements per block prefetch of each read stream of a vector loop computing ``values`` (IR
    nodes), or 0 for none.  A loop that reads one or two streams from memory (unit-stride loads of
    buffers :func:`from_memory`; at most PREFETCH_MAX_STREAMS, ``stax.cpp.prefetch_max_streams``),
    stores to no large buffer and is cheap (no transcendental function, no Welford update, at most
    PREFETCH_MAX_OPS ops per element, ``stax.cpp.prefetch_max_ops``) -- a row sum or max, ex 1.1 --
    asks at the start of every chunk for all of the chunk's lines of each stream
    (``tp::prefetch_block``): PREFETCH_BYTES (``stax.cpp.prefetch_bytes``, 0: none) of misses in
    flight together, where the hardware prefetcher alone stops at each 4 KiB page and ramps up
    again.  The chunk is a power of two of at least 256 elements (a multiple of every vector step).
    Row sums and ex 1.1 gained, everything else gained nothing or lost: docs/PERFORMANCE.md,
    "Heuristic measurements"."""
    nbytes = config.get("stax.cpp.prefetch_bytes")
    if not nbytes or not 1 <= n_streams <= config.get("stax.cpp.prefetch_max_streams") or large_store:
        return 0
    max_ops = config.get("stax.cpp.prefetch_max_ops")
    for v in values:
        p = price(v)
        if p.transcendental or p.ops > max_ops or getattr(v, "reduction_type", None) == "welford":
            return 0
    per = max(1024, nbytes // n_streams) // 4     # in float32 elements
    return 1 << (per.bit_length() - 1)


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
    if q is None or k is None or q.dim() < 2:   # (meta values; Stax compiles CPU regions only)
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
