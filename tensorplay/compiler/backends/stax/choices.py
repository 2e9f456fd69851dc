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

Experiment 4 changes ``score_fusion`` or disables horizontal fusion (``HORIZONTAL_FUSION``);
experiment 2 compares example 7.2 with the chapter's CPU materialisation (``KEEP_REALIZED_LOCAL``).
"""
from __future__ import annotations

import math
import os

import sympy

from .ops_handler import CountingHandler, set_handler

__all__ = ["should_realize", "realize_reread", "can_fuse", "score_fusion", "parallel_depth", "stream_stores", "HORIZONTAL_FUSION", "KEEP_REALIZED_LOCAL",
           "MAX_INLINE_OPS", "PARALLEL_MIN_WORK", "SCRATCH_MAX_BYTES", "STREAM_STORE_MIN_BYTES", "aot_decompose",
           "SDPA_DECOMPOSE_MAX_SCORES", "from_memory", "prefetch_chunk", "PREFETCH_BYTES",
           "PREFETCH_MAX_OPS", "PREFETCH_MAX_STREAMS",
           "omp_schedule", "OMP_SCHEDULE"]

#: a value read by several consumers is recomputed by each unless it costs more than this many ops
MAX_INLINE_OPS = 24
#: fuse groups that share an input but do not depend on each other (example 7.2: sum and amax of e)
HORIZONTAL_FUSION = os.environ.get("TP_STAX_HORIZONTAL_FUSION", "1") != "0"
#: keep a value realized for several readers, all reductions, in registers when they fuse with it
#: (example 7.2's exp).  False (``TP_STAX_KEEP_REALIZED_LOCAL=0``) gives the chapter's CPU model of
#: §6.6 instead: the value is written to memory and the reductions read it back (one more kernel)
KEEP_REALIZED_LOCAL = os.environ.get("TP_STAX_KEEP_REALIZED_LOCAL", "1") != "0"
#: below this many elements of work a kernel runs on one thread (fork/join costs ~µs)
PARALLEL_MIN_WORK = 1 << 15
#: the largest per-row scratch array a kernel keeps on its stack (a value read by a later phase of
#: the row, e.g. softmax's exp); a longer row recomputes such a value instead
SCRATCH_MAX_BYTES = 1 << 20


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


#: buffers of at least this many bytes are written with streaming stores (see stream_stores);
#: ``TP_STAX_STREAM_MIN_BYTES`` overrides it (a huge value turns streaming off)
STREAM_STORE_MIN_BYTES = int(os.environ.get("TP_STAX_STREAM_MIN_BYTES", 0)) or _last_level_cache_bytes()

#: streaming stores must cover every line alone: stores and rows start on multiples of this many
#: bytes (``TP_STAX_STREAM_PIECE_BYTES``; 64 keeps rows that start mid-line plain)
STREAM_PIECE_BYTES = int(os.environ.get("TP_STAX_STREAM_PIECE_BYTES", 32))


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
    MAX_INLINE_OPS ops.  Otherwise each reader recomputes it (no write, no extra read)."""
    users = [u for u in node.users if u.op != "output"]
    n_readers = len(users) + (1 if any(u.op == "output" for u in node.users) else 0)
    if n_readers <= 1:
        return False
    p = price(loops)
    return p.transcendental > 0 or p.ops > MAX_INLINE_OPS


def realize_reread(loops, factor) -> bool:
    """Materialisation of a value whose one reader computes each of its elements ``factor`` > 1
    times on average: a pooling window reads every input about (k/s)^2 times, 2x nearest
    upsampling every element 4 times.  ``should_realize``'s "one reader: inline" assumes one
    evaluation per element; here the value is written to memory when it calls a transcendental
    function, makes more than one load (it is a window or a gather itself: windows of windows
    multiply), or the repeated evaluations cost more than MAX_INLINE_OPS ops.  Measured: the CNN
    step of benchmarks/training.py recomputed batch_norm (an rsqrt) and a 3x3 average window 36
    times per element of an upsampled output -- one kernel took 30 % of the step."""
    if factor <= 1:
        return False
    p = price(loops)
    return p.transcendental > 0 or p.n_loads > 1 or p.ops * (factor - 1) > MAX_INLINE_OPS


def can_fuse(sched, g1, g2) -> bool:
    """Legality (§7.3): same iteration space (Def. 7.2), every dependency between them reads the
    element computed in the same (or an earlier) iteration (Prop. 7.2/7.3), and no path
    g1 -> x -> g2 through a node outside both (Prop. 7.1: fusion must keep the graph acyclic)."""
    if g1.is_extern or g2.is_extern:
        return False
    sig = sched.merged_signature(g1, g2)
    if sig is None:
        return False
    if not HORIZONTAL_FUSION and not sched.depends(g1, g2) and not sched.depends(g2, g1):
        return False
    if not KEEP_REALIZED_LOCAL:
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
    thread work (>= threads), and only if the total work pays for the fork/join."""
    total = math.prod(outer_sizes) * max(inner_numel, 1)
    if total < PARALLEL_MIN_WORK or not outer_sizes:
        return 0
    acc = 1
    for depth, s in enumerate(outer_sizes, start=1):
        acc *= s
        if acc >= threads:
            return depth
    return len(outer_sizes)


def from_memory(nbytes) -> bool:
    """Is a buffer of ``nbytes`` read from (or written to) main memory rather than a cache?  When it
    is at least the last-level cache (``STREAM_STORE_MIN_BYTES``)."""
    return nbytes >= STREAM_STORE_MIN_BYTES


#: schedule clause of parallel loops over memory (``TP_STAX_OMP_SCHEDULE``, e.g. "guided, 16";
#: "static", the default, gives OpenMP's default static split)
OMP_SCHEDULE = os.environ.get("TP_STAX_OMP_SCHEDULE", "static")


def omp_schedule(from_memory_buffers, plain_large_store) -> str:
    """The ``schedule(...)`` clause of a kernel's parallel loops (Alg. 8.1 decides which loops):
    none by default (OpenMP's static split: each thread one contiguous block of rows).

    Until 2026-11-30 the default was ``guided, 16`` for a kernel that reads or writes a buffer
    from memory, chosen on the measurements below.  Those were taken with two biases since removed
    from the benchmarks (a fixed order of the variants in each round, and tp reading a copy of
    torch's input).  Under the fair protocol (shuffled rounds, one buffer; both with split loads),
    static against guided, t(static)/t(guided) as the quotient of the two paired medians against
    one reference, 41 rounds, two runs: row sum
    1.01 and 0.96, row amax 0.97 and 1.00, ex 7.1 0.97 and 1.01, ex 1.1 1.03 and 1.00, exp 1.03 and
    1.00, ex 7.2 1.01 and 1.02, five-op softmax 0.97 and 0.99 -- a tie.  But when the host's LLC
    served much of a 64 MiB input (torch eager's row sum at 0.78 ms), static row sums kept pace with
    torch eager and guided ones did not.  Two such runs, time relative to guided loops with the
    block prefetch: static with split loads 0.78 and 0.72, guided with split loads 1.01 and 0.88,
    torch eager 0.78 and 0.80.  In that state the table's row reductions, with guided loops, ran
    at 0.65-0.76x of torch eager.

    With ``TP_STAX_OMP_SCHEDULE="guided, 16"`` the former rule applies:
    each thread takes a chunk of half the remaining iterations divided by the thread count (at
    least 16), so a thread that runs slower (a vCPU shared with other tenants) or starts late gets
    less work, where the default static split makes the whole kernel wait for it.  Static for the
    rest: a kernel whose buffers are all cache-sized, and one that writes a large buffer with plain
    stores (``plain_large_store``: 16384 x 1000 softmax ran 0.87-0.93x as fast guided).

    Measured on the 2-core AMD EPYC, interleaved, guided / static: ex 1.1 0.99-1.05x faster, row
    sum 0.97-1.13x, row amax 1.02-1.08x, ex 7.1 1.04-1.07x, exp and x + 1 1.02-1.03x, ex 7.2,
    LayerNorm and five-op softmax 0.98-1.01x.  Small kernels alone ran 1.06-1.09x faster guided
    (256 x 256 LayerNorm, 512 x 256 add + relu), but the GPT training step, whose kernels are
    small and interleaved with ATen calls, ran 0.88-0.89x of torch.compile guided against 0.93-0.94x
    static in alternating runs -- and its torch ops slowed down as much as its kernels."""
    if not from_memory_buffers or plain_large_store or not OMP_SCHEDULE or OMP_SCHEDULE == "static":
        return ""
    return f" schedule({OMP_SCHEDULE})"


def stream_stores(nbytes) -> bool:
    """Write a buffer of ``nbytes`` with streaming (non-temporal) stores?  Yes when it is at least
    the last-level cache: it would be evicted before any reader came, so the read-for-ownership a
    plain store of an uncached line costs is wasted traffic (a third of a read-one-write-one
    kernel's).  Smaller buffers keep plain stores, so a consumer kernel finds them in cache."""
    return from_memory(nbytes)


#: bytes a cheap loop requests at once of its read stream from memory (``TP_STAX_PREFETCH_BYTES``;
#: 0 turns block prefetching off)
PREFETCH_BYTES = int(os.environ.get("TP_STAX_PREFETCH_BYTES", 4096))


#: split 64-byte loads of read streams from memory in two (``TP_STAX_SPLIT_LOADS=0`` turns it off)
SPLIT_LOADS = os.environ.get("TP_STAX_SPLIT_LOADS", "1") != "0"


def split_loads() -> bool:
    """Should a loop that :func:`prefetch_chunk` picks (one or two read streams from memory, no
    large store, cheap) load its streams with ``Vec::load_split`` -- each 64-byte chunk as two
    32-byte loads (AVX-512 builds; other widths are unchanged) -- *instead of* the block prefetch?

    Measured on the 2-core AMD EPYC (Zen 4), 8192 x 2048 float32 row sum, hand-written loops,
    shuffled interleaved rounds on one buffer (2026-11-30): two 64-byte accumulators with 64-byte
    loads ran 0.89x as fast as torch eager, the same with split loads 1.03-1.05x, plain 32-byte
    vectors 1.03-1.06x; one thread and two alike.  Why the core streams faster with half-width
    loads is not established (Zen 4 executes a 64-byte load as two halves; the split form may
    let more independent line misses be outstanding).  In the generated kernels, split loads
    against the block prefetch, paired medians of 101 rounds in two runs: row sum 0.975 and 0.969
    of the time, ex 7.1 0.968 and 0.992, row amax 0.997 and 1.006, ex 1.1 1.000 and 0.993; both
    together were no better than split loads alone.  Loops that compute more (exp 1.04x the time,
    ex 7.2 1.045x) or store beside the read (x + 1, 1.015x) lost, so they keep 64-byte loads."""
    return SPLIT_LOADS


#: a loop whose values cost more ops per element than this is compute-bound: no block prefetch
PREFETCH_MAX_OPS = 8
#: a loop with more read streams from memory than this gets no block prefetch
PREFETCH_MAX_STREAMS = 2


def prefetch_chunk(n_streams, large_store, values) -> int:
    """Elements per block prefetch of each read stream of a vector loop computing ``values`` (IR
    nodes), or 0 for none.  A loop that reads one or two streams from memory (unit-stride loads of
    buffers :func:`from_memory`), stores to no large buffer and is cheap (no transcendental
    function, no Welford update, at most PREFETCH_MAX_OPS ops per element) -- a row sum or max,
    ex 1.1 -- asks at the start of every chunk for all of the chunk's lines of each stream
    (``tp::prefetch_block``): PREFETCH_BYTES of misses in flight together, where the hardware
    prefetcher alone stops at each 4 KiB page and ramps up again.  The chunk is a power of two of
    at least 256 elements (a multiple of every vector step).

    Measured on the 2-core AMD EPYC (8192 x 2048 float32, interleaved with torch.compile): row sum
    1.01-1.14x faster in nine runs (median 1.07x), row amax 1.00-1.08x in five, ex 1.1 (two
    streams, 2 KiB each) 0.99-1.07x in thirteen (median 1.045x).  Everything else gained nothing or
    lost: a streaming store beside the read (x + 1, relu, exp: 0.92-1.04x), plain stores (softmax:
    0.93-1.0x; a hand-written loop 15 % slower), exp in the loop (ex 7.2: 0.84-0.96x), a Welford
    update (LayerNorm: 0.98x)."""
    if not PREFETCH_BYTES or not 1 <= n_streams <= PREFETCH_MAX_STREAMS or large_store:
        return 0
    for v in values:
        p = price(v)
        if p.transcendental or p.ops > PREFETCH_MAX_OPS or getattr(v, "reduction_type", None) == "welford":
            return 0
    per = max(1024, PREFETCH_BYTES // n_streams) // 4     # in float32 elements
    return 1 << (per.bit_length() - 1)


#: attention whose score matrix has at most this many elements is decomposed in training regions
SDPA_DECOMPOSE_MAX_SCORES = 1 << 20


def aot_decompose(node) -> bool:
    """Expand this forward node of a training region by its decomposition before AOT differentiates
    it?  Yes for scaled_dot_product_attention with a small score matrix (at most
    ``SDPA_DECOMPOSE_MAX_SCORES`` elements, 4 MiB in float32): the forward then computes the
    probabilities P itself (two matmuls around one fused mask + softmax kernel), the min-cut
    partitioner saves P (a reduction output), and the backward reads it instead of recomputing
    q kᵀ and the softmax as the fused op's derivative formula must.  Long sequences keep the fused
    library kernel, which never materialises the L x S scores."""
    d = node.opdef
    if d is None or d.name != "scaled_dot_product_attention":
        return False
    q, k = (a.meta.get("val") for a in node.args[:2])
    if q is None or k is None or q.dim() < 2:   # (meta values; Stax compiles CPU regions only)
        return False
    return math.prod(q.shape[:-1]) * k.shape[-2] <= SDPA_DECOMPOSE_MAX_SCORES


def eager_random() -> bool:
    """Random ops as calls into eager (ATen's generator: the numbers eager gives after the same
    ``manual_seed``) instead of Philox streams in the kernels?  ``TP_STAX_FALLBACK_RANDOM=1`` asks
    for it, to compare a compiled program with eager bit for bit.  Read per compilation (the
    variable is part of the graph-cache key, like every ``TP_*`` variable)."""
    return os.environ.get("TP_STAX_FALLBACK_RANDOM", "0") not in ("", "0")


def keep_buffers() -> bool:
    """Keep a wrapper's dead intermediate buffers from one call to the next (runtime.take/stash)?
    A fresh buffer costs a page fault per 4 KiB page once glibc has returned the memory to the
    system, which it does for large blocks: the CNN training step of benchmarks/training.py took
    11.4 k faults and 50 ms per step with fresh buffers, 6.7 k faults and 37.7 ms with kept ones
    (torch.compile: 4.0 k, 35.0 ms, same run).  The cost is the memory of those buffers between
    calls (at most the graph's peak of intermediates).  ``TP_STAX_KEEP_BUFFERS=0`` turns it off."""
    return os.environ.get("TP_STAX_KEEP_BUFFERS", "1") != "0"
