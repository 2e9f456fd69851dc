"""Where a single call's time goes on a GPU: the host's part and the device's (seed §9.9, §13).

For each case (``x + 1`` and a row sum over 32768 x 2048 float32, and ``x + 1`` over 8 elements)
and each variant (torch eager, ``tp.compile(strict_native=True)``, ``torch.compile``) it reports,
as medians over ``--repeats`` readings:

* ``host``: microseconds of the host to make one call (``time.perf_counter`` around ``--number``
  calls with no synchronisation, divided);
* ``one call``: CUDA events around one call after a synchronisation (what table13.py reports: the
  host's latency to the first kernel plus the device's work);
* ``back to back``: CUDA events around ``--number`` calls, divided (the host's launches overlap the
  device's work, as in a program that never waits);
* from one profiled call (``torch.profiler``, CPU and CUDA activities): ``to kernel`` -- the time
  from the call's start on the host to its first kernel's start on the device -- and ``kernels``,
  the summed kernel time; their sum approximates ``one call``.

The model: one call = max(host latency to the last launch, host latency to the first kernel +
kernel time); a variant loses a synchronised single-call comparison by its extra ``to kernel``
even when its kernel is as fast.

``--pieces`` also times each piece of the host path of ``tp.compile``'s ``x + 1`` on 8 elements
on its own (µs per call, the best of 5 ``timeit`` repeats): the front end, the wrapper's
``call(args)``, the output's allocation (``torch.empty_strided`` against the wrapper's allocator),
the kernel's launcher, Triton's C launcher with tensors and with data pointers, the stream look-up.

    python benchmarks/launch_latency.py [--repeats 9] [--number 20] [--json PATH] [--pieces]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import tensorplay as tp
from tensorplay.utils.benchmark import cuda_time_fn


def _cases():
    big = (32768, 2048)
    return {
        "x + 1 (256 MiB)": (lambda x: x + 1, big),
        "row sum (256 MiB)": (lambda x: x.sum(-1), big),
        "x + 1 (8 elems)": (lambda x: x + 1, (8,)),
    }


def _variants(fn, shape, wrappers=None):
    xt = torch.randn(*shape, device="cuda")
    xp = tp.from_torch(xt)
    cf = tp.compile(fn, strict_native=True)
    tc = torch.compile(fn)
    if wrappers is not None:
        wrappers.append(cf)
    return {
        "torch eager": lambda: fn(xt),
        "tp.compile": lambda: cf(xp),
        "torch.compile": lambda: tc(xt),
    }


def _host_us(f, number):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(number):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / number * 1e6


def _profiled(f, calls=4):
    """(µs from the call's start to its first kernel's start, summed kernel µs) of the last of
    ``calls`` calls in one profile (the first calls of a profile pay its start-up: CUPTI's
    activity buffers), each call after a synchronisation."""
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for k in range(calls):
            with record_function(f"__call__{k}"):
                f()
            torch.cuda.synchronize()
    evs = prof.events()
    call = next(e for e in evs if e.name == f"__call__{calls - 1}" and e.device_type == torch.autograd.DeviceType.CPU)
    t0 = call.time_range.start
    kernels = [e for e in evs if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith("__call__") and e.time_range.start >= t0]
    if not kernels:
        return float("nan"), 0.0
    first = min(k.time_range.start for k in kernels)
    return first - t0, sum(k.time_range.elapsed_us() for k in kernels if k.time_range.start >= t0)


def _host_profile(number=300):
    """cProfile of the host side of ``tp.compile``'s call of ``x + 1`` (256 MiB): where the host's
    microseconds go (dispatch, guards, the wrapper, allocation, the launch)."""
    import cProfile
    import pstats
    fn, shape = _cases()["x + 1 (256 MiB)"]
    f = _variants(fn, shape)["tp.compile"]
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(number):
        f()
    pr.disable()
    torch.cuda.synchronize()
    print(f"\ncProfile of {number} calls of tp.compile(x + 1), 256 MiB:")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def _pieces(number=20000):
    """µs per call of each piece of the host path of a compiled ``x + 1`` on 8 float32."""
    import timeit

    from tensorplay.compiler.backends.stax.runtime import allocator
    xt = torch.randn(8, device="cuda")
    xp = tp.from_torch(xt)
    cf = tp.compile(lambda x: x + 1, strict_native=True)
    for _ in range(3):
        cf(xp)
    mod = cf._cache[0].artifact.module
    launch = mod.__dict__["_kernel0_launch"]
    out = torch.empty(8, device="cuda")
    (run, function, middle, blocks, _), = launch.compiled.values()
    stream = torch._C._cuda_getCurrentRawStream
    pa, pb = xt.data_ptr(), out.data_ptr()
    dev = torch.device("cuda:0")
    fast = allocator("cuda:0")
    wrap = tp.from_torch
    pieces = {
        "torch eager x + 1": lambda: xt + 1,
        "tp eager x + 1": lambda: xp + 1,
        "tp.compile call (first-level entry)": lambda: cf(xp),
        "wrapper call(args)": lambda: mod.call([xt]),
        "torch.empty_strided(device=)": lambda: torch.empty_strided((8,), (1,), dtype=torch.float32, device=dev),
        "runtime.allocator('cuda:0')": lambda: fast((8,), (1,), torch.float32),
        "Launcher(8, x, out)": lambda: launch(8, xt, out),
        "C launcher, tensors": lambda: run(1, 1, 1, stream(0), function, *middle, xt, out, *blocks),
        "C launcher, data pointers": lambda: run(1, 1, 1, stream(0), function, *middle, pa, pb, *blocks),
        "current raw stream": lambda: stream(0),
        "x.data_ptr()": lambda: xt.data_ptr(),
        "wrap an output (tp.from_torch)": lambda: wrap(out),
    }
    print(f"\nhost path pieces, x + 1 on 8 float32 (µs per call, best of 5 x {number}):")
    for name, f in pieces.items():
        f()
        torch.cuda.synchronize()
        best = min(timeit.repeat(f, number=number, repeat=5)) / number * 1e6
        torch.cuda.synchronize()
        print(f"  {name:40} {best:7.2f}")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--json", default=None)
    p.add_argument("--pieces", action="store_true", help="time each piece of the compiled call's host path")
    a = p.parse_args(argv)
    if a.pieces:
        _pieces()
    rows, compiled = [], []
    for case, (fn, shape) in _cases().items():
        vs = _variants(fn, shape, compiled)
        for f in vs.values():          # capture, compile, warm
            for _ in range(3):
                f()
        readings = {name: {"host": [], "one": [], "b2b": [], "to_kernel": [], "kernels": []} for name in vs}
        for _ in range(a.repeats):
            for name, f in vs.items():
                r = readings[name]
                r["host"].append(_host_us(f, a.number))
                r["one"].append(cuda_time_fn(f) * 1e6)
                r["b2b"].append(cuda_time_fn(f, number=a.number) * 1e6)
        for name, f in vs.items():
            for _ in range(3):
                tk, kt = _profiled(f)
                readings[name]["to_kernel"].append(tk)
                readings[name]["kernels"].append(kt)
        for name, r in readings.items():
            row = {"case": case, "variant": name, **{k: statistics.median(v) for k, v in r.items()}}
            rows.append(row)
    hdr = f"{'case':20} {'variant':14} {'host us':>9} {'one call us':>12} {'back to back us':>16} " \
          f"{'to kernel us':>13} {'kernels us':>11}"
    print(hdr)
    for r in rows:
        print(f"{r['case']:20} {r['variant']:14} {r['host']:9.1f} {r['one']:12.1f} {r['b2b']:16.1f} "
              f"{r['to_kernel']:13.1f} {r['kernels']:11.1f}")
    for case, cf in zip(_cases(), compiled):     # what each call runs: the generated wrapper
        path = cf._cache[0].artifact.module.__file__
        print(f"\nwrapper of tp.compile({case}): {path}")
        with open(path, encoding="utf-8") as fh:
            print(fh.read())
    _host_profile()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
