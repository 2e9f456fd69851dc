"""Experiment 1 (4) of the chapter: speed-up against problem size, 2^10 .. 2^26 elements.

For each size N (a power of two) one case of ``benchmarks/table13.py`` is run on inputs of N
elements, rows of ``--cols`` elements (fewer when N is smaller: one row of N), and three variants
are timed interleaved in shuffled rounds (``utils.benchmark.compare``): tp compiled
(``strict_native=True``), torch eager, torch.compile.  Small sizes average ``number`` calls per
reading so that a reading lasts about a millisecond.

Printed per size: the input bytes and the cache level they fit in (L2 per core, the LLC, or
memory: the sizes come from sysfs), each variant's median time per call [95% CI], the effective
bandwidth of the compiled call (model bytes / time: above the main-memory bandwidth B while the
inputs stay in cache), and the paired ratios t(torch eager) / t(tp compiled) and
t(torch.compile) / t(tp compiled) (median [95% CI] of the per-round ratios; > 1: tp is faster).
What to read (chapter §13.4, Prop. 13.6): at small N every variant pays its fixed call overhead
(µs); the curves settle once the time per byte dominates, and move again when the inputs
outgrow L2 and the LLC.

    python benchmarks/size_sweep.py [--case ex1.1] [--min-exp 10] [--max-exp 26] [--step 1] [--cols 2048]
                                    [--repeats 15] [--no-torch-compile] [--steady] [--plot sweep.png]

``--plot`` draws the ratios against N with matplotlib when it is installed (it is not required).
``--steady`` keeps freed memory mapped, so that no variant pays page faults for its fresh outputs
(torch eager allocates one per op: at 2^26 elements those faults dominate its time).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorplay as tp  # noqa: E402
from table13 import _compiled_bytes, cases  # noqa: E402
from tensorplay.compiler.backends.stax.cpp.choices import _last_level_cache_bytes  # noqa: E402
from tensorplay.utils.benchmark import compare, format_table, machine_description, paired_ratio, torch_variants  # noqa: E402


def _l2_bytes(default=1 << 20) -> int:
    """Size of the level-2 cache of cpu0 (sysfs), or ``default``."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if d.startswith("index") and open(os.path.join(base, d, "level")).read().strip() == "2":
                t = open(os.path.join(base, d, "size")).read().strip()
                return int(t.rstrip("KMGkmg")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:].upper(), 1)
    except (OSError, ValueError):
        pass
    return default


def reexec_steady() -> None:
    """Re-execute this script with glibc told to keep freed memory mapped (as ``table13.py
    --steady``): a fresh output then reuses mapped pages, with no page faults.  glibc reads these
    variables at start-up only."""
    if os.environ.get("MALLOC_MMAP_MAX_") != "0":
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def pyplot():
    """``matplotlib.pyplot`` on the file backend, or None (and a note) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed; no plot", file=sys.stderr)
        return None
    return plt


def save_plot(fig, path) -> None:
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def _where(nbytes, l2, llc) -> str:
    return "L2" if nbytes <= l2 else ("LLC" if nbytes <= llc else "memory")


def _mib(n) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def _us(st) -> str:
    """``median [lo, hi]`` of a reading's Stats, in µs below a millisecond and in ms above."""
    lo, hi, _ = st.ci
    scale, unit = (1e6, "µs") if st.median < 1e-3 else (1e3, "ms")
    return f"{st.median * scale:.3g} {unit} [{lo * scale:.3g}, {hi * scale:.3g}]"


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
    l2, llc = _l2_bytes(), _last_level_cache_bytes()
    print(f"machine: {machine_description()}")
    print(f"L2 {_mib(l2)} per core, LLC {_mib(llc)}; {a.repeats} shuffled interleaved rounds after 3 warm-up "
          f"calls; time per call, median [95% CI]\n")
    rows, curve = [], []
    g = torch.Generator().manual_seed(0)
    for e in range(a.min_exp, a.max_exp + 1, a.step):
        n = 1 << e
        c = min(a.cols, n)
        r = n // c
        name, (fn, shapes, _) = next((k, v) for k, v in cases(r, c, r, c).items() if k.startswith(a.case))
        tins = [torch.randn(s, generator=g) for s in shapes]
        pins = [tp.from_torch(t) for t in tins]     # zero-copy: every variant reads the same memory
        cf = tp.compile(lambda *xs: fn(*xs, tp), strict_native=True)
        cf(*pins)
        variants = {"tp compiled": lambda: cf(*pins),
                    **torch_variants(lambda *xs: fn(*xs, torch), *tins, torch_compile=not a.no_torch_compile)}
        number = max(1, (1 << 20) // n)
        res = compare(variants, repeats=a.repeats, warmup=3, number=number)
        nbytes = sum(t.numel() * t.element_size() for t in tins)
        beta = _compiled_bytes(cf) / res["tp compiled"].median

        def paired(k):
            if k not in res:
                return "-", None
            m, lo, hi = paired_ratio(res, k, "tp compiled")
            return f"{m:.2f} [{lo:.2f}, {hi:.2f}]", m
        te, me = paired("torch eager")
        tc, mc = paired("torch.compile")
        rows.append((f"2^{e}", f"{r}x{c}", _mib(nbytes), _where(nbytes, l2, llc), number,
                     *(_us(res[k]) for k in variants), f"{beta / 1e9:.1f}", te, tc))
        curve.append((n, me, mc))
        print(f"  done 2^{e} ({name})", file=sys.stderr)
    headers = ["N", "shape", "inputs", "fits in", "calls/reading", *variants, "beta_c GB/s",
               "torch eager / tp", "torch.compile / tp"]
    print(f"case: {name}\n")
    print(format_table(rows, headers))
    print("\nratios: median [95% CI] of the per-round ratios t(X)/t(tp compiled); > 1: tp compiled is faster. "
          "beta_c = model bytes of the compiled call / its median time.")
    plt = pyplot() if a.plot else None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        ns = [c[0] for c in curve]
        ax.semilogx(ns, [c[1] for c in curve], "o-", base=2, label="t(torch eager) / t(tp compiled)")
        if not a.no_torch_compile:
            ax.semilogx(ns, [c[2] for c in curve], "s-", base=2, label="t(torch.compile) / t(tp compiled)")
        per = sum(t.numel() for t in tins) / n * 4       # input bytes per element of N
        for cap, lab in ((l2, "L2"), (llc, "LLC")):
            ax.axvline(cap / per, color="grey", ls="--")
            ax.text(cap / per, ax.get_ylim()[1], lab, ha="right", va="top")
        ax.axhline(1, color="black", lw=0.5)
        ax.set_xlabel("N (elements)")
        ax.set_ylabel("ratio")
        ax.set_title(name)
        ax.legend()
        save_plot(fig, a.plot)
    return rows


if __name__ == "__main__":
    main()
