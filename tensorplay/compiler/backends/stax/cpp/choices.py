"""The CPU's named, replaceable heuristics (invariant 7; the chapter, §8.1, §8.4): what the C++
backend decides that another device would decide differently.

* :func:`parallel_depth` — how many outer loops an OpenMP kernel parallelises (Alg. 8.1).
* :func:`stream_stores` — write a buffer with streaming (non-temporal) stores (§8 kernel quality)?
* :func:`prefetch_chunk` — request a vector loop's read streams from memory a block at a time (§8)?
  :func:`split_loads` — or load them as half-width pieces instead?
* :func:`omp_schedule` — the OpenMP schedule of a kernel's parallel loop (Alg. 8.1)?
* :func:`row_scratch_fits` — may a kernel keep a per-row scratch array of this length on its stack?

The device-neutral ones (should_realize, can_fuse, score_fusion, ...) are ../choices.py.  Every
threshold is a knob ``stax.cpp.*`` of tensorplay/compiler/config.py, read at each use; the
chapter's names (``PARALLEL_MIN_WORK``, ``STREAM_STORE_MIN_BYTES`` ...) are read-only views of them
(:data:`KNOB_NAMES`).  The measurements behind each rule: docs/PERFORMANCE.md, "Heuristic
measurements".
"""
from __future__ import annotations

import functools
import math

from .... import config
from ..choices import knob_views, price

__all__ = ["parallel_depth", "stream_stores", "stream_store_min_bytes", "from_memory", "prefetch_chunk",
           "split_loads", "omp_schedule", "row_scratch_fits", "scratch_on_heap", "KNOB_NAMES"]

#: the chapter's names of the CPU heuristics' knobs -> their names in tensorplay/compiler/config.py
KNOB_NAMES = {
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


@functools.lru_cache(maxsize=None)
def _last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (``tensorplay.utils.machine.cache_sizes``: sysfs, else sysconf,
    else 32 MiB)."""
    from .....utils.machine import last_level_cache_bytes
    return last_level_cache_bytes()


def stream_store_min_bytes() -> int:
    """Buffers of at least this many bytes are written with streaming stores (:func:`stream_stores`)
    and count as read from memory (:func:`from_memory`): ``stax.cpp.stream_min_bytes``
    (``TP_STAX_STREAM_MIN_BYTES``; a huge value turns streaming off), or the last-level cache size
    when it is 0 (the default)."""
    return config.get("stax.cpp.stream_min_bytes") or _last_level_cache_bytes()


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


def row_scratch_fits(elements) -> bool:
    """A per-row scratch array of ``elements`` values (at most 8 bytes each) is kept on the kernel's
    stack only up to ``SCRATCH_MAX_BYTES`` (``stax.cpp.scratch_max_bytes``): the row must stay in
    cache.  Asked by the plan (cpp/plan.py refuses a longer one) and, through
    ``CppBackend.fits_row_scratch``, by the lowerings that would make one."""
    from ..sizevars import size_hint, size_upper_bound
    n = size_upper_bound(elements)      # a symbolic row: its longest
    if n is None:   # unbounded: a heuristic at the hint; the kernel then takes a heap scratch of
        n = size_hint(elements)         # the call's row length (scratch_on_heap), correct for any
    return n * 8 <= config.get("stax.cpp.scratch_max_bytes")


def scratch_on_heap(elements) -> bool:
    """Is a row scratch of ``elements`` values too long for the stack for some size (a symbolic row
    with no upper bound that fits, or larger than ``SCRATCH_MAX_BYTES``)?  Then the kernel takes a
    per-thread heap buffer grown to the call's row length (``tp_row_scratch``)."""
    from ..sizevars import size_upper_bound
    n = size_upper_bound(elements)
    return n is None or n * 8 > config.get("stax.cpp.scratch_max_bytes")


knob_views(__name__, KNOB_NAMES, {"STREAM_STORE_MIN_BYTES": lambda: stream_store_min_bytes()})

