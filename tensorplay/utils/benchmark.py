"""Timing statistics as chapter §13.1 prescribes.

Model (Def. 13.1): a reading is ``T = t0 + eps`` with non-negative noise, so

* the **minimum** of n readings estimates what the machine can do (Prop. 13.1) — use it for
  capability parameters (bandwidth, FLOP/s);
* the **median** describes what usually happens — use it to compare two ways of running;
* the median has a distribution-free confidence interval (Prop. 13.2): with order statistics
  X(1) <= ... <= X(n), ``P[X(j) <= m < X(k)] = sum_{i=j}^{k-1} C(n,i) 2^-n``; for n = 15,
  (j, k) = (4, 12) covers 96.5 %.

``compare`` times several callables *interleaved* (A, B, C, A, B, C, ...) in one run, so slow drifts
of the shared machine hit all of them alike; compare ratios only within one run.
On a GPU (``device="cuda"``) a reading must include the device's work, which a host clock around an
asynchronous launch does not see: ``time_fn``/``compare`` then time by CUDA events on the current
stream (``cuda_time_fn``); on the CPU (``device=None`` or ``"cpu"``) they read ``time.perf_counter``.
Speed-up decomposition (Prop. 13.3): ``S = rho * beta_c / beta_e`` where rho is the model byte ratio
and beta the effective bandwidths (bytes moved by the model / time).
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass

__all__ = ["Stats", "median_ci", "time_fn", "cuda_time_fn", "is_cuda", "synchronize", "cuda_l2_bytes", "compare",
           "paired_ratio", "speedup_decomposition", "machine_description", "format_table", "json_safe",
           "keep_freed_memory"]


def median_ci(sorted_xs, confidence=0.95):
    """Smallest symmetric order-statistic interval (X(j), X(k)) covering the median with at least
    ``confidence`` (Prop. 13.2).  Returns (lo, hi, coverage)."""
    n = len(sorted_xs)
    if n == 0:
        raise ValueError("median_ci: no readings")
    best = (sorted_xs[0], sorted_xs[-1], 1 - 2 * 0.5 ** n)
    for j in range(1, n // 2 + 1):
        k = n + 1 - j
        cov = sum(math.comb(n, i) for i in range(j, k)) / 2 ** n
        if cov >= confidence:
            best = (sorted_xs[j - 1], sorted_xs[k - 1], cov)
        else:
            break
    return best


@dataclass
class Stats:
    name: str
    times: list  # seconds

    @property
    def sorted(self):
        return sorted(self.times)

    @property
    def median(self):
        s = self.sorted
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    @property
    def min(self):
        return min(self.times)

    @property
    def ci(self):
        return median_ci(self.sorted)

    def ms(self) -> str:
        """``median [lo, hi]`` of the 95% CI, in milliseconds (a table cell)."""
        lo, hi, _ = self.ci
        return f"{self.median * 1e3:.2f} [{lo * 1e3:.2f}, {hi * 1e3:.2f}]"

    def as_dict(self, scale=1e3) -> dict:
        """The readings and their summary, each multiplied by ``scale`` (1e3: milliseconds), for JSON:
        ``{"median", "ci": [lo, hi], "coverage", "min", "readings"}``."""
        lo, hi, cov = self.ci
        return {"median": self.median * scale, "ci": [lo * scale, hi * scale], "coverage": cov,
                "min": self.min * scale, "readings": [t * scale for t in self.times]}


def _sync(sync):
    if sync:
        sync()


def is_cuda(device) -> bool:
    """Whether ``device`` (None, a string such as ``"cuda:0"``, or a ``torch.device``) is a CUDA device."""
    if device is None:
        return False
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


def synchronize(device=None):
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if is_cuda(device):
        import torch
        torch.cuda.synchronize(device)


def cuda_l2_bytes(device="cuda") -> int:
    """The L2 cache of a CUDA device, in bytes (60 MB on an H200; 50 MiB where torch does not say)."""
    import torch
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 << 20)


def cuda_time_fn(fn, *, number=1, device=None):
    """Seconds per call of ``fn``, the device's work included, over ``number`` calls on the current
    stream of ``device`` (None: the current device).

    The device is synchronised first, so nothing queued earlier (another variant, an untimed
    ``before``) runs inside the reading; then CUDA events are recorded on the current stream before
    and after the calls, and the reading waits for the second.  On an idle device the first event
    completes when it is recorded, the second once the calls' kernels are done and the host has
    reached it: the reading covers the device's work and the host's launches alike (whichever is
    longer), which is what a caller waits for."""
    import torch
    stream = torch.cuda.current_stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record(stream)
    for _ in range(number):
        fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / number     # elapsed_time is in milliseconds


def time_fn(fn, *, number=1, sync=None, device=None):
    """Seconds per call of ``fn`` over ``number`` calls: ``time.perf_counter`` around them (``sync``
    called before and after), or on a CUDA ``device`` ``cuda_time_fn``."""
    if is_cuda(device):
        return cuda_time_fn(fn, number=number, device=device)
    _sync(sync)
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    _sync(sync)
    return (time.perf_counter() - t0) / number


def compare(fns: dict, *, repeats=15, warmup=3, number=1, sync=None, shuffle=True, seed=0, before=None,
            device=None) -> dict:
    """Time each callable ``repeats`` times, interleaved, after ``warmup`` calls each.  ``number``
    calls are averaged inside one reading (for microsecond-scale functions).

    Each round runs every callable once, in an order drawn afresh (seeded, so a run is
    repeatable), so each callable follows each of the others about equally often.  With a fixed
    order a reading always follows the same predecessor, and what that predecessor leaves in the
    caches is part of the reading: for a 64 MiB row sum on a 32 MiB LLC, the same ATen kernel read
    2.46 ms in one place of a fixed round and 2.00 ms in another (2026-11-30).  (Rotating the order
    is not enough: it keeps every callable's predecessor.)  ``shuffle=False`` keeps the fixed order.
    ``before``: called untimed before every reading (e.g. to evict the caches), or a dict
    {name: callable} for some of the callables only.  ``device``: the device the callables run on;
    on a CUDA device every reading includes the device's work (``time_fn``, ``cuda_time_fn``)."""
    import random
    for _ in range(warmup):
        for f in fns.values():
            f()
    res = {k: Stats(k, []) for k in fns}
    items = list(fns.items())
    rng = random.Random(seed)
    for _ in range(repeats):
        order = rng.sample(items, len(items)) if shuffle else items
        for k, f in order:
            b = before.get(k) if isinstance(before, dict) else before
            if b is not None:
                b()
            res[k].times.append(time_fn(f, number=number, sync=sync, device=device))
    return res


def comparison_row(name, variants: dict, *, repeats=15, warmup=3, base="tp compiled") -> tuple:
    """Time ``variants`` interleaved (``compare``) and make one table row: ``name``, each variant's
    median [95% CI] in ms, then t(variant) / t(base) for every other variant (> 1: base is faster).
    ``comparison_headers`` gives the matching column names."""
    r = compare(variants, repeats=repeats, warmup=warmup)
    cells = [name] + [r[k].ms() for k in variants]
    cells += [f"{r[k].median / r[base].median:.2f}" for k in variants if k != base]
    return tuple(cells)


def comparison_args(argv, quick_help):
    """The options of the comparison scripts (``--repeats``, ``--quick``, ``--no-torch-compile``);
    prints the machine and the reading protocol."""
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--no-torch-compile", action="store_true")
    a = p.parse_args(argv)
    print(f"machine: {machine_description()}")
    print(f"{a.repeats} interleaved readings after 3 warm-up calls; ms, median [95% CI]\n")
    return a


def torch_variants(f_torch, *args, torch_compile=True) -> dict:
    """``{"torch eager": ..., "torch.compile": ...}`` calls of ``f_torch(*args)``, torch.compile'd
    once and called once (its compilation) before any timing."""
    out = {"torch eager": lambda: f_torch(*args)}
    if torch_compile:
        import torch
        torch._dynamo.reset()
        tc = torch.compile(f_torch)
        tc(*args)
        out["torch.compile"] = lambda: tc(*args)
    return out


def comparison_headers(names, base="tp compiled") -> list:
    return ["case", *names] + [f"vs {k}" for k in names if k != base]


def tp_vs_torch_row(name, tp_call, f_torch, *args, opts) -> tuple:
    """One ``comparison_row`` of tp compiled (``tp_call()``) against ``f_torch(*args)`` eager and
    torch.compile'd; ``opts`` from ``comparison_args``."""
    variants = {"tp compiled": tp_call, **torch_variants(f_torch, *args, torch_compile=not opts.no_torch_compile)}
    return comparison_row(name, variants, repeats=opts.repeats)


def print_tp_vs_torch(rows, opts):
    names = ["tp compiled", "torch eager"] + ([] if opts.no_torch_compile else ["torch.compile"])
    print(format_table(rows, comparison_headers(names)))
    return rows


def paired_ratio(res: dict, num: str, den: str) -> tuple:
    """Median [95% CI] of the per-round ratios t(num) / t(den) of a ``compare`` result.  Readings
    of one round are adjacent in time, so a drift of the machine's speed during the run (the
    memory bandwidth of a shared host moves +-10-20 %) cancels in each ratio, where it widens the
    ratio of the two medians.  Returns (median, lo, hi)."""
    s = Stats(f"{num}/{den}", [a / b for a, b in zip(res[num].times, res[den].times)])
    lo, hi, _ = s.ci
    return s.median, lo, hi


def speedup_decomposition(t_eager, t_compiled, bytes_eager, bytes_compiled):
    """Prop. 13.3: S = t_e / t_c = rho * beta_c / beta_e with rho = bytes_e / bytes_c (the model
    byte ratio: the structural factor, known before running) and beta = bytes / time (the
    effective bandwidths: their ratio is the kernels' quality, which the byte model says nothing
    about).  Returns ``{"S", "rho", "beta_e", "beta_c"}`` (bytes/s)."""
    rho = bytes_eager / bytes_compiled
    be = bytes_eager / t_eager
    bc = bytes_compiled / t_compiled
    return {"S": t_eager / t_compiled, "rho": rho, "beta_e": be, "beta_c": bc}


def machine_description(device=None) -> str:
    """The CPU, torch and Python; for a CUDA ``device`` also the GPU (name, multiprocessors, L2,
    memory) and CUDA's version."""
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        for line in info.splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
        isa = "avx512f" if "avx512f" in flags else ("avx2" if "avx2" in flags else "sse")
    except OSError:
        isa = "?"
    import os
    desc = (f"{cpu}, {os.cpu_count()} logical cores, ISA {isa}, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}")
    if is_cuda(device):
        g = torch.cuda.get_device_properties(device)
        desc += (f"; GPU {g.name} ({g.multi_processor_count} SMs, {cuda_l2_bytes(device) / 2 ** 20:.0f} MiB L2, "
                 f"{g.total_memory / 2 ** 30:.0f} GiB), CUDA {torch.version.cuda}")
    return desc


def format_table(rows, headers) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, sep] + body)


def json_safe(x):
    """``x`` (dicts, lists, tuples, numbers) with every float that is not finite as None, for
    ``json.dump(..., allow_nan=False)``: a ratio to a variant that did not run, or N* = inf."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def keep_freed_memory() -> bool:
    """The steady state of a long-running program, from now on: glibc keeps freed memory mapped
    (``mallopt``: no mmap-ed chunks, M_MMAP_MAX = 0; trim only above 2 GiB, M_TRIM_THRESHOLD), so a
    fresh output reuses pages that are already mapped and costs no page faults.  (A fresh 64 MiB
    output costs 16 K faults: example 1.1's eager chain read 164 ms per call before, 44 ms after, on
    the 2-core development VM, 2026-12-03.)  The same as starting the process with
    ``MALLOC_MMAP_MAX_=0`` (``benchmarks/table13.py --steady``).  Returns False where the C library
    is not glibc (nothing changed)."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2 ** 31 - 1)))
