"""Experiment 1 (4) of the chapter: speed-up against problem size, 2^10 .. 2^26 elements.

For each size N (a power of two) one case of tables 13.1/13.2 (``tensorplay.experiments.cases``)
is run on inputs of N elements, rows of ``--cols`` elements (fewer when N is smaller: one row of
N), and four variants are timed interleaved in shuffled rounds (``utils.benchmark.compare``): tp
eager, tp compiled (``strict_native=True``), torch eager, torch.compile.  Small sizes average
``number`` calls per reading so that a reading lasts about a millisecond.  The measurement is
``tensorplay.experiments.roofline.size_sweep``, which ``python -m tensorplay.experiments.roofline``
runs as part 4 of the whole experiment.

Printed per size: the input bytes and the cache level they fit in (L1, L2 per core, L3, or
memory: the sizes come from sysfs, ``utils.machine.cache_sizes``), each variant's median time per
call, S = t(tp eager) / t(tp compiled), the effective
bandwidth of the compiled call (model bytes / time: above the main-memory bandwidth B while the
inputs stay in cache), and the paired ratios t(torch eager) / t(tp compiled) and
t(torch.compile) / t(tp compiled) (median [95% CI] of the per-round ratios; > 1: tp is faster).
What to read (chapter §13.4, Prop. 13.6): at small N every variant pays its fixed call overhead
(µs); the curves settle once the time per byte dominates, and move again when the inputs
outgrow L2 and the LLC.

    python benchmarks/size_sweep.py [--case ex1.1] [--min-exp 10] [--max-exp 26] [--step 1] [--cols 2048]
                                    [--repeats 15] [--no-torch-compile] [--steady] [--plot sweep.png]

``--plot`` draws the ratios against N with matplotlib when it is installed (it is not required),
with the cache sizes as vertical lines.
``--steady`` keeps freed memory mapped, so that no variant pays page faults for its fresh outputs
(torch eager allocates one per op: at 2^26 elements those faults dominate its time).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tensorplay.experiments.roofline import plot_sweep, size_sweep, sweep_rows  # noqa: E402
from tensorplay.utils.benchmark import format_table, machine_description  # noqa: E402
from tensorplay.utils.machine import cache_sizes  # noqa: E402


def reexec_steady() -> None:
    """Re-execute this script with glibc told to keep freed memory mapped (as ``table13.py
    --steady``): a fresh output then reuses mapped pages, with no page faults.  glibc reads these
    variables at start-up only."""
    if os.environ.get("MALLOC_MMAP_MAX_") != "0":
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="ex1.1", help="a case of table13.py, by the start of its name")
    p.add_argument("--min-exp", type=int, default=10)
    p.add_argument("--max-exp", type=int, default=26)
    p.add_argument("--step", type=int, default=1, help="exponent step (2: every fourth size)")
    p.add_argument("--cols", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--plot", default="", help="write a plot of the ratios to this file (needs matplotlib)")
    p.add_argument("--steady", action="store_true",
                   help="freed memory stays mapped (glibc settings, as table13.py --steady): no page faults on outputs")
    a = p.parse_args(argv)
    if a.steady:
        reexec_steady()
    caches = cache_sizes()
    print(f"machine: {machine_description()}")
    print("caches: " + ", ".join(f"{k} {v >> 10} KiB" for k, v in sorted(caches.items()))
          + f"; {a.repeats} shuffled interleaved rounds after 3 warm-up calls; time per call, median\n")
    pts = size_sweep(a.case, range(a.min_exp, a.max_exp + 1, a.step), cols=a.cols, repeats=a.repeats,
                     torch_compile=not a.no_torch_compile, caches=caches)
    rows, headers = sweep_rows(pts)
    print(f"case: {pts[0]['case']}\n")
    print(format_table(rows, headers))
    print("\nS = t(tp eager)/t(tp compiled); ratios: median [95% CI] of the per-round ratios t(X)/t(tp compiled); "
          "> 1: tp compiled is faster. beta_c = model bytes of the compiled call / its median time.")
    if a.plot:
        plot_sweep(a.plot, pts, caches)
    return rows


if __name__ == "__main__":
    main()
