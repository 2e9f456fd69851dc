"""Reductions over non-trailing dims: row mode vs column mode vs torch eager (docs/stax.md,
"Column reductions").

``python benchmarks/column_reductions.py [R C [rounds]]`` compiles ``sum(0)``, ``softmax(0)`` and
``var(0)`` of an (R, C) float32 tensor (default 4096 x 2048) twice — with
the knob ``stax.cpp.column_reductions`` False (before: one row per output column, gathered loads)
and True (after) — and times both and torch eager interleaved, one call of each per round.  Prints the
medians (ms) and the paired ratios (median over rounds of reading i / eager's reading i), which
stay meaningful on a loaded machine.
"""
import argparse
import statistics
import time

import torch

import tensorplay as tp
from tensorplay.compiler import config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("R", type=int, nargs="?", default=4096)
    ap.add_argument("C", type=int, nargs="?", default=2048)
    ap.add_argument("rounds", type=int, nargs="?", default=21)
    a = ap.parse_args()
    R, C, rounds = a.R, a.C, a.rounds
    xt = torch.randn(R, C)
    x = tp.from_torch(xt)
    cases = {"sum(0)": (lambda x: x.sum(0), lambda t: t.sum(0)),
             "softmax(0)": (lambda x: x.softmax(0), lambda t: t.softmax(0)),
             "var(0)": (lambda x: x.var(0), lambda t: t.var(0))}
    print(f"({R}, {C}) float32, torch threads {torch.get_num_threads()}, rounds {rounds}")
    for name, (f, ft) in cases.items():
        fns = {}
        for mode in (False, True):
            # the knob is part of the graph-cache key: each variant is its own entry
            with config.patch({"stax.cpp.column_reductions": mode}):
                cf = tp.compile(f, strict_native=True)
                cf(x)
            fns["after" if mode else "before"] = cf
        fns["eager"] = ft
        ref = ft(xt.double())
        for k, g in fns.items():
            out = g(xt if k == "eager" else x)
            out = out if isinstance(out, torch.Tensor) else out._data
            assert (out.double() - ref).abs().max() < 1e-3, (name, k)
        times = {k: [] for k in fns}
        for _ in range(rounds):
            for k, g in fns.items():
                a = xt if k == "eager" else x
                t0 = time.perf_counter()
                g(a)
                times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}

        def ratio(a, b):
            return statistics.median(p / q for p, q in zip(times[a], times[b]))
        print(f"{name:11s} median ms: before {med['before']:8.2f}  after {med['after']:7.2f}  "
              f"eager {med['eager']:7.2f} | before/eager {ratio('before', 'eager'):5.2f}  "
              f"after/eager {ratio('after', 'eager'):5.2f}  after/before {ratio('after', 'before'):5.3f}")


if __name__ == "__main__":
    main()
