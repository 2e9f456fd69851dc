"""Per-call overhead of a compiled 2-op function on 8 elements (issue: front end; seed §13.4).

Variants, interleaved in one run (§13.1): tp eager; tp.compile via the first-level entry (same
tensor objects each call, §2.4); tp.compile with fresh tensors each call (key + guards); torch
eager; torch.compile (same tensors).  Target: first-level entry ≤ 5 µs.

    python benchmarks/call_overhead.py [--number 20000] [--repeats 15] [--backend eager]
"""
from __future__ import annotations

import argparse

import torch

import tensorplay as tp
from tensorplay.utils.benchmark import compare, format_table, machine_description


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--backend", default="stax")
    p.add_argument("--no-torch-compile", action="store_true")
    a = p.parse_args(argv)

    def f(x):
        return x * 2 + 1

    xt = torch.randn(8)
    x = tp.from_torch(xt.clone())
    fresh = [tp.from_torch(torch.randn(8)) for _ in range(64)]
    cf = tp.compile(f, backend=a.backend)
    cf(x)
    cf(fresh[0])
    it = [0]

    def fresh_call():
        it[0] = (it[0] + 1) & 63
        return cf(fresh[it[0]])

    fns = {"tp eager": lambda: f(x), "tp.compile first-level": lambda: cf(x),
           "tp.compile fresh tensors": fresh_call, "torch eager": lambda: f(xt)}
    if not a.no_torch_compile:
        try:
            tc = torch.compile(f)
            tc(xt)
            fns["torch.compile"] = lambda: tc(xt)
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile unavailable: {e}")
    r = compare(fns, repeats=a.repeats, number=a.number, warmup=100)
    rows = []
    for k, s in r.items():
        lo, hi, _ = s.ci
        rows.append((k, f"{s.median * 1e6:.2f}", f"[{lo * 1e6:.2f}, {hi * 1e6:.2f}]", f"{s.min * 1e6:.2f}"))
    print(f"machine: {machine_description()}")
    print(f"f(x) = x * 2 + 1 on 8 float32; {a.repeats} interleaved readings x {a.number} calls; µs per call\n")
    print(format_table(rows, ["variant", "median", "95% CI", "min"]))
    print(f"\ncounters: {cf.counters}")
    return r


if __name__ == "__main__":
    main()
