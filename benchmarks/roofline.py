"""Experiment 1 (1)-(2) of the chapter: the measured roofline of this machine, and the cases of
``benchmarks/table13.py`` placed on it.

* **B**, the main-memory read bandwidth: the row sum of a 64 MiB tensor with the last-level cache
  evicted before each reading (``table13.bandwidth_round``), ``--rounds`` rounds of 7 readings at
  the start and one round after every case, B = bytes / (the smallest round median).  **P**, the
  compute peak: ``--n`` x ``--n`` float32 matrix products (torch eager), P = 2 n^3 / (the fastest
  reading).  Capability parameters take
  the best over repetitions (chapter §13.1, Prop. 13.1): noise only ever slows a reading down.
* The ridge point P / B (FLOP/byte): a kernel of lower arithmetic intensity is bound by memory.
* For every case: FLOPs (``compiler.cost``: one per output element of a pointwise op, one per
  input element of a reduction), the model bytes of the compiled call (inputs + outputs + what
  Stax writes and reads back), the intensity I = FLOPs / bytes, the roofline's attainable rate
  min(P, I * B) and time max(FLOPs / P, bytes / B), and the measured median of ``tp compiled``
  (interleaved with torch eager): achieved GFLOP/s, and the roofline time as a fraction of the
  measured one (1.0 = on the roof).

    python benchmarks/roofline.py [--quick] [--cases ex1.1,ex7.2] [--repeats 7] [--rounds 3]
                                  [--n 2048] [--steady] [--plot roofline.png]

``--quick`` inputs (4 MiB) fit in the last-level cache, so the memory roof does not apply to them.
Outputs are fresh on every call: a 64 MiB output costs page faults, part of the measured time
(``--steady`` removes them, as for table13.py).

``--plot`` draws the roof and the cases with matplotlib when it is installed (not required).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorplay as tp  # noqa: E402
from size_sweep import pyplot, reexec_steady, save_plot  # noqa: E402
from table13 import _compiled_bytes, bandwidth_round, cases  # noqa: E402
from tensorplay.utils.benchmark import compare, format_table, machine_description  # noqa: E402


def matmul_peak(n=2048, readings=7) -> float:
    """FLOP/s of the fastest of ``readings`` n x n float32 matrix products (after one warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(readings):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def _flops(cf) -> float:
    from tensorplay.compiler.cost import cost_analysis
    return cost_analysis(cf._cache[0].lowered.graph_module)["flops"]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="1/16 of table13's sizes")
    p.add_argument("--cases", default="")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--plot", default="")
    p.add_argument("--steady", action="store_true", help="no page faults on fresh outputs (as table13.py --steady)")
    a = p.parse_args(argv)
    if a.steady:
        reexec_steady()
    print(f"machine: {machine_description()}")
    bw = [bandwidth_round()[0] for _ in range(a.rounds)]    # and one more round after every case
    P = matmul_peak(a.n)
    s = 4 if a.quick else 1
    table = cases(8192 // s, 2048 // s, 16384 // s, 1000 // s)
    if a.cases:
        want = [c.strip() for c in a.cases.split(",")]
        table = {k: v for k, v in table.items() if any(k.startswith(w) for w in want)}
    rows, pts = [], []
    g = torch.Generator().manual_seed(0)
    for name, (fn, shapes, _) in table.items():
        tins = [torch.randn(sh, generator=g) for sh in shapes]
        pins = [tp.from_torch(t) for t in tins]
        cf = tp.compile(lambda *xs, _fn=fn: _fn(*xs, tp), strict_native=True)
        cf(*pins)
        flops, nbytes = _flops(cf), _compiled_bytes(cf)
        r = compare({"tp compiled": lambda: cf(*pins), "torch eager": lambda: fn(*tins, torch)},
                    repeats=a.repeats, warmup=2)
        bw.append(bandwidth_round()[0])
        pts.append((name, flops, nbytes, r["tp compiled"]))
    B = max(bw)     # the host's bandwidth drifts during a run: B is the best round of the whole run
    print(f"B = {B / 1e9:.1f} GB/s (best of {len(bw)} rounds of 7 evicted-cache 64 MiB row sums, one after "
          f"every case; round medians {min(bw) / 1e9:.1f}-{B / 1e9:.1f} GB/s), P = {P / 1e9:.0f} GFLOP/s "
          f"({a.n}^3 float32 matmul, fastest of 7), ridge P/B = {P / B:.1f} FLOP/byte\n")
    for name, flops, nbytes, st in pts:
        t = st.median
        intensity = flops / nbytes
        roof_t = max(flops / P, nbytes / B)
        rows.append((name, f"{flops / 1e6:.1f}", f"{nbytes / 2**20:.1f}", f"{intensity:.3f}",
                     "memory" if intensity < P / B else "compute", f"{min(P, intensity * B) / 1e9:.1f}",
                     f"{roof_t * 1e3:.2f}", st.ms(), f"{flops / t / 1e9:.1f}", f"{roof_t / t:.2f}"))
    print(format_table(rows, ["case", "MFLOP", "MiB (compiled)", "I FLOP/byte", "bound", "roof GFLOP/s",
                              "roof ms", "tp compiled ms", "achieved GFLOP/s", "roof ms / measured"]))
    plt = pyplot() if a.plot else None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [2 ** (k / 4) for k in range(-16, 25)]
        ax.loglog(xs, [min(P, x * B) / 1e9 for x in xs], "k-",
                  label=f"roof: B={B / 1e9:.0f} GB/s, P={P / 1e9:.0f} GFLOP/s")
        for name, flops, nbytes, st in pts:
            ax.loglog([flops / nbytes], [flops / st.median / 1e9], "o", label=name)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("GFLOP/s")
        ax.legend(fontsize=7)
        save_plot(fig, a.plot)
    return rows


if __name__ == "__main__":
    main()
