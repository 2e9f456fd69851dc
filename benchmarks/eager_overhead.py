"""Per-op overhead of tp eager against the raw torch call on tiny tensors (issue: core, target ≤ 3 µs).

Each reading averages ``--number`` calls; tp and torch readings are interleaved (§13.1) and we
report medians with the distribution-free 95 % CI (Prop. 13.2) and the overhead = tp - torch.

    python benchmarks/eager_overhead.py [--number 20000] [--repeats 15]
"""
from __future__ import annotations

import argparse

import torch

import tensorplay as tp
from tensorplay.utils.benchmark import compare, format_table, machine_description


def cases():
    a, b = torch.randn(8), torch.randn(8)
    m = torch.randn(4, 4)
    x, y, mm = tp.from_torch(a), tp.from_torch(b), tp.from_torch(m)
    return {
        "add (x + y)": (lambda: x + y, lambda: a + b),
        "mul scalar (x * 2)": (lambda: x * 2, lambda: a * 2),
        "exp": (lambda: x.exp(), lambda: a.exp()),
        "sum()": (lambda: x.sum(), lambda: a.sum()),
        "sum(dim)": (lambda: mm.sum(1), lambda: m.sum(1)),
        "view": (lambda: mm.view(16), lambda: m.view(16)),
        "transpose": (lambda: mm.t(), lambda: m.t()),
        "getitem x[1:]": (lambda: mm[1:], lambda: m[1:]),
        "matmul": (lambda: mm @ mm, lambda: m @ m),
        "add_ (in place)": (lambda: x.add_(1.0), lambda: a.add_(1.0)),
    }


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    rows = []
    for name, (ftp, ft) in cases().items():
        r = compare({"tp": ftp, "torch": ft}, repeats=args.repeats, number=args.number, warmup=200)
        tpm, tm = r["tp"].median * 1e6, r["torch"].median * 1e6
        lo, hi, _ = r["tp"].ci
        rows.append((name, f"{tm:.2f}", f"{tpm:.2f} [{lo*1e6:.2f}, {hi*1e6:.2f}]", f"{tpm - tm:.2f}"))
    print(f"machine: {machine_description()}")
    print(f"{args.repeats} interleaved readings x {args.number} calls; median µs per call [95% CI]\n")
    print(format_table(rows, ["op", "torch eager", "tp eager", "overhead"]))
    return rows


if __name__ == "__main__":
    main()
