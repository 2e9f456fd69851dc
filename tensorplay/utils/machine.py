"""Machine parameters of the roofline (chapter §13.1, experiment 1 (1)): read bandwidth B, compute
peak P, the ridge point P/B, and the cache sizes.

Rules (Def. 13.1, Prop. 13.1): a timing reading is ``t0 + eps`` with ``eps >= 0``, so a
*capability* parameter takes the best over repetitions -- noise only ever slows a reading down:

* **B**, the main-memory read bandwidth: the row sum of a 64 MiB float32 tensor (torch eager),
  each reading preceded by an untimed pass over a buffer of four times the last-level cache
  (``evict_caches``), so that what the probe reads comes from main memory (§13.5, construct
  validity: the cases the roofline judges read more than the LLC holds).  One *round* is
  ``readings`` such readings summarised by their median; B = bytes / (the smallest round median)
  over the rounds of a run (``read_bandwidth``).  A shared host's bandwidth drifts by up to 2x
  within minutes, so rounds are spread over a run and the best one is kept.
* **P**, the compute peak: ``n x n`` float32 matrix products (torch eager); P = 2 n^3 / (the
  fastest reading) (``matmul_peak``).
* **ridge point** P / B in FLOP/byte: a kernel of lower arithmetic intensity (FLOPs / model bytes)
  is bound by memory, one of higher intensity by compute; the attainable rate is
  ``min(P, I * B)`` and the roofline time ``max(FLOPs / P, bytes / B)`` (``roofline_point``).
* **cache sizes** (``cache_sizes``): cpu0's data and unified caches per level from sysfs; where
  sysfs cannot be read, glibc's ``sysconf`` values; else ``CACHE_DEFAULTS``.

On a CUDA device B is the row sum of at least 1 GiB (16x the L2: nothing to evict), and beside it
the device-to-device copy bandwidth (``cuda_bandwidth_round``).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

__all__ = ["CACHE_DEFAULTS", "PROBE_BYTES", "CUDA_PROBE_BYTES", "cache_sizes", "last_level_cache_bytes",
           "evict_caches", "probe_tensor", "bandwidth_round", "read_bandwidth", "cuda_probe_tensors",
           "cuda_bandwidth_round", "matmul_peak", "roofline_point", "MachineParameters", "measure_machine"]

#: used for a level that neither sysfs nor sysconf reports, where neither reports any level
CACHE_DEFAULTS = {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}
PROBE_BYTES = 64 << 20          # B's probe on the CPU: the row sum of this many bytes
CUDA_PROBE_BYTES = 1 << 30      # B's probe on a GPU: at least this, and at least 16x the L2
_SYSFS = "/sys/devices/system/cpu/cpu0/cache"
_SYSCONF = {"L1": "SC_LEVEL1_DCACHE_SIZE", "L2": "SC_LEVEL2_CACHE_SIZE", "L3": "SC_LEVEL3_CACHE_SIZE"}


def _size(text: str) -> int:
    """Bytes of a sysfs cache size such as ``48K`` or ``32768K``."""
    t = text.strip()
    return int(t.rstrip("KMGkmg")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:].upper(), 1)


def _read(index, name) -> str:
    with open(os.path.join(_SYSFS, index, name)) as f:
        return f.read().strip()


def cache_sizes() -> dict:
    """``{"L1": bytes, "L2": bytes, "L3": bytes}``: cpu0's data or unified cache of each level (L1
    and L2 are per core on most machines, L3 is shared).  Read from sysfs (instruction caches
    skipped); a machine without sysfs: glibc's ``os.sysconf`` values; where neither says anything,
    ``CACHE_DEFAULTS``.  A level the machine has not (no L3) is absent from the dict."""
    out = {}
    try:
        for d in sorted(os.listdir(_SYSFS)):
            if not d.startswith("index"):
                continue
            if _read(d, "type") == "Instruction":
                continue
            key = f"L{_read(d, 'level')}"
            out[key] = max(out.get(key, 0), _size(_read(d, "size")))
    except (OSError, ValueError):
        out = {}
    if not out:
        for key, name in _SYSCONF.items():
            try:
                v = os.sysconf(name)
            except (ValueError, OSError):
                continue
            if v > 0:
                out[key] = int(v)
    return out or dict(CACHE_DEFAULTS)


def last_level_cache_bytes() -> int:
    """The largest cache of ``cache_sizes()``."""
    return max(cache_sizes().values())


_PROBES: dict = {}     # nbytes -> B's probe tensor
_EVICT = []            # [the eviction buffer], made on first use


def probe_tensor(nbytes=PROBE_BYTES):
    """B's probe: a float32 tensor of ``nbytes`` in rows of 2048 (fewer columns for a smaller one),
    made once per size (a fresh tensor of the same size can read 20 % faster or slower on a VM)."""
    if nbytes not in _PROBES:
        import torch
        cols = min(2048, max(nbytes // 4, 1))
        _PROBES[nbytes] = torch.randn(max(nbytes // (4 * cols), 1), cols)
    return _PROBES[nbytes]


def evict_caches():
    """An untimed pass over a buffer of four times the last-level cache (at least 64 MiB): what
    was in the caches before is gone."""
    if not _EVICT:
        import torch
        _EVICT.append(torch.randn(max(4 * last_level_cache_bytes(), 64 << 20) // 4))
    return _EVICT[0].sum()


def bandwidth_round(readings=7, nbytes=PROBE_BYTES, evict=True) -> tuple:
    """One round of the read-bandwidth probe: the row sum of ``probe_tensor(nbytes)`` (torch eager),
    ``readings`` readings each after ``evict_caches()`` (``evict=False``: none), after one warm-up
    call, then as many back-to-back readings.  Returns (bytes per second of the median cold
    reading, of the median back-to-back reading).  B uses the cold ones: on a machine whose LLC
    holds a large part of the probe (32 MiB of 64 here), a back-to-back re-read is partly served
    from it (up to twice the main-memory rate), which no case larger than the LLC gets."""
    x = probe_tensor(nbytes)
    x.sum(-1)
    cold, warm = [], []
    for _ in range(readings):
        if evict:
            evict_caches()
        t0 = time.perf_counter()
        x.sum(-1)
        cold.append(time.perf_counter() - t0)
    for _ in range(readings):
        t0 = time.perf_counter()
        x.sum(-1)
        warm.append(time.perf_counter() - t0)
    n = x.numel() * 4
    return n / statistics.median(cold), n / statistics.median(warm)


def read_bandwidth(rounds=3, readings=7, nbytes=PROBE_BYTES, evict=True) -> dict:
    """B by Prop. 13.1: ``rounds`` rounds of ``bandwidth_round``; B = bytes / (the smallest round
    median).  Returns ``{"B": bytes/s, "rounds": [each round's cold rate], "back_to_back": [...],
    "probe_bytes": ...}``; a caller that measures more rounds later in its run appends to
    ``rounds`` and takes the max again."""
    rs = [bandwidth_round(readings, nbytes, evict) for _ in range(rounds)]
    cold = [c for c, _ in rs]
    return {"B": max(cold), "rounds": cold, "back_to_back": [w for _, w in rs],
            "probe_bytes": probe_tensor(nbytes).numel() * 4}


_CUDA = []     # [B's probe on the GPU, the copy's destination]


def cuda_probe_tensors():
    """(x, y): B's probe on the current CUDA device, a float32 tensor of at least
    ``CUDA_PROBE_BYTES`` and 16x the L2, and a tensor like it for the copy probe."""
    if not _CUDA:
        import torch

        from .benchmark import cuda_l2_bytes
        nbytes = max(CUDA_PROBE_BYTES, 16 * cuda_l2_bytes())
        x = torch.randn(-(-nbytes // (4 * 2048)), 2048, device="cuda")
        _CUDA.extend([x, torch.empty_like(x)])
    return _CUDA[0], _CUDA[1]


def cuda_bandwidth_round(readings=7, number=1) -> tuple:
    """One round of the GPU's probes, timed with CUDA events (``compare(device="cuda")``): the row
    sum of ``x`` (B: the device's read bandwidth) and ``y.copy_(x)`` (read + write), ``readings``
    readings of ``number`` back-to-back calls each, interleaved, after one warm-up call.  Nothing is evicted: ``x`` is at least
    16x the L2.  Returns (bytes per second of the median read, of the median copy)."""
    from .benchmark import compare
    x, y = cuda_probe_tensors()
    r = compare({"read": lambda: x.sum(-1), "copy": lambda: y.copy_(x)}, repeats=readings, warmup=1,
                device="cuda", number=number)
    n = x.numel() * 4
    return n / r["read"].median, 2 * n / r["copy"].median


def matmul_peak(n=2048, readings=7) -> float:
    """P: FLOP/s (2 n^3 per product) of the fastest of ``readings`` n x n float32 matrix products
    (torch eager), after one warm-up product."""
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(readings):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def roofline_point(flops, nbytes, seconds, B, P) -> dict:
    """Where a kernel of ``flops`` and ``nbytes`` (model bytes) that took ``seconds`` sits under the
    roof of B (bytes/s) and P (FLOP/s): intensity I = flops / nbytes, ``bound`` ("memory" below the
    ridge P/B, else "compute"), the attainable rate min(P, I·B), the roofline time
    max(flops/P, nbytes/B), the achieved rate flops / seconds, and ``roof_fraction`` = roofline time
    / measured time (1.0: on the roof; above 1: faster than this B allows, i.e. served by a cache)."""
    intensity = flops / nbytes
    roof_t = max(flops / P, nbytes / B)
    return {"intensity": intensity, "bound": "memory" if intensity < P / B else "compute",
            "attainable_flops": min(P, intensity * B), "roof_s": roof_t, "achieved_flops": flops / seconds,
            "roof_fraction": roof_t / seconds}


@dataclass
class MachineParameters:
    """The roofline's parameters of one run: ``B`` (bytes/s), ``P`` (FLOP/s), ``caches`` (bytes per
    level), the B rounds and the machine's description."""
    B: float
    P: float
    caches: dict
    description: str
    bandwidth_rounds: list = field(default_factory=list)
    matmul_n: int = 2048

    @property
    def ridge(self) -> float:
        """The ridge point P / B, FLOP/byte."""
        return self.P / self.B

    def add_round(self, readings=7, nbytes=PROBE_BYTES, evict=True) -> None:
        """One more B round (later in the run); B stays the best round."""
        self.bandwidth_rounds.append(bandwidth_round(readings, nbytes, evict)[0])
        self.B = max(self.bandwidth_rounds)

    def summary(self, readings=7) -> str:
        """B, P and the ridge in one sentence, with how they were measured."""
        r = self.bandwidth_rounds or [self.B]
        return (f"B = {self.B / 1e9:.1f} GB/s (best of {len(r)} rounds of {readings} evicted-cache row sums of "
                f"{PROBE_BYTES >> 20} MiB; round medians {min(r) / 1e9:.1f}-{max(r) / 1e9:.1f} GB/s), "
                f"P = {self.P / 1e9:.0f} GFLOP/s ({self.matmul_n}^3 float32 matmul, fastest of {readings}), "
                f"ridge P/B = {self.ridge:.1f} FLOP/byte")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ridge"] = self.ridge
        return d


def measure_machine(rounds=3, readings=7, nbytes=PROBE_BYTES, n=2048, evict=True) -> MachineParameters:
    """B (``read_bandwidth``), P (``matmul_peak(n)``) and the cache sizes of this machine."""
    from .benchmark import machine_description
    bw = read_bandwidth(rounds, readings, nbytes, evict)
    return MachineParameters(B=bw["B"], P=matmul_peak(n, readings), caches=cache_sizes(),
                             description=machine_description(), bandwidth_rounds=bw["rounds"], matmul_n=n)
