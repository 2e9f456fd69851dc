"""The figures of experiment 1 (chapter §13.1-13.2, fig. 1.1 and fig. 13.1), drawn from numbers.

matplotlib is optional (``pip install tensorplay[plot]``): it is imported when a figure is drawn,
on the file backend (Agg).  Without it every function here returns None and says so once on
stderr; the numbers the figures show are printed and written to JSON by their callers anyway.

* ``roofline_plot``: the measured roof ``min(P, I·B)`` (log-log, FLOP/s against FLOP/byte), the
  ridge P/B marked, and each case a labelled point at (its intensity, its achieved FLOP/s);
* ``speedup_plot``: fig. 13.1, measured S against the model byte ratio ρ, with the line S = ρ.
  By Prop. 13.3 ``S = ρ · β_c/β_e``: a point on the line has β_c = β_e, a point above it a
  compiled kernel nearer its bandwidth roof than eager's kernels (it gains bandwidth efficiency),
  a point below one farther from it (it loses);
* ``size_sweep_plot``: speed-up ratios against the number of elements N (log2 axis), with the
  cache sizes drawn as vertical lines at the N whose inputs fill them (experiment 1 (4)).
"""
from __future__ import annotations

import sys

__all__ = ["pyplot", "save_plot", "roofline_plot", "speedup_plot", "size_sweep_plot"]

_WARNED = []


def pyplot():
    """``matplotlib.pyplot`` on the file backend, or None (and a note on stderr, once) when
    matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not _WARNED:
            print("matplotlib is not installed (pip install tensorplay[plot]): no figures, numbers only",
                  file=sys.stderr)
            _WARNED.append(True)
        return None
    return plt


def save_plot(fig, path) -> str:
    """Lay out ``fig``, write it to ``path`` (the format from its suffix), close it; returns path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    print(f"plot written to {path}")
    return str(path)


def _finish(fig, ax, path, xlabel, ylabel, title, legend_size) -> str:
    """Labels, the legend to the right of the axes, a light grid; then ``save_plot``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", alpha=0.2)
    return save_plot(fig, path)


def roofline_plot(path, B, P, points, title="") -> str | None:
    """The roof of read bandwidth ``B`` (bytes/s) and peak ``P`` (FLOP/s), and ``points``: dicts with
    ``name``, ``intensity`` (FLOP/byte) and ``achieved_flops`` (FLOP/s), each drawn and labelled.
    Returns ``path``, or None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 5))
    xs = [p["intensity"] for p in points]
    ridge = P / B
    lo, hi = min(xs + [ridge]) / 8, max(xs + [ridge]) * 8
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    ax.loglog(grid, [min(P, x * B) / 1e9 for x in grid], "k-", lw=2,
              label=f"roof: B = {B / 1e9:.1f} GB/s, P = {P / 1e9:.0f} GFLOP/s")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge, P / 1e9 * 1.15, f" ridge P/B = {ridge:.1f} FLOP/byte", fontsize=8, color="grey")
    markers = "os^vD<>ph*X"
    for i, p in enumerate(points):
        y = p["achieved_flops"] / 1e9
        ax.loglog([p["intensity"]], [y], markers[i % len(markers)], ms=7, label=f"{i + 1}: {p['name']}")
        ax.annotate(str(i + 1), (p["intensity"], y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_ylim(top=P / 1e9 * 3)
    return _finish(fig, ax, path, "arithmetic intensity I = FLOPs / model bytes (FLOP/byte)",
                   "GFLOP/s (achieved: FLOPs / median time)", title or "measured roofline", 7)


def speedup_plot(path, rows, title="") -> str | None:
    """Fig. 13.1: ``rows`` are dicts with ``name``, ``rho`` (model bytes eager / compiled) and ``S``
    (t_eager / t_compiled); the line S = rho.  Cases of equal rho are shifted apart a little so
    that they do not hide each other.  Returns ``path``, or None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    rows = [r for r in rows if r.get("S") and r.get("rho")]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    rhos = [r["rho"] for r in rows]
    ss = [r["S"] for r in rows]
    lo, hi = min(rhos + ss + [1.0]) / 1.5, max(rhos + ss) * 1.5
    ax.loglog([lo, hi], [lo, hi], "k-", lw=1, label="S = ρ (β_c = β_e)")
    ax.fill_between([lo, hi], [lo, hi], [hi, hi], color="tab:green", alpha=0.06)
    ax.fill_between([lo, hi], [lo, lo], [lo, hi], color="tab:red", alpha=0.06)
    ax.text(lo * 1.1, hi / 1.3, "above: β_c/β_e > 1\n(gains bandwidth efficiency)", fontsize=8, va="top")
    ax.text(hi / 1.1, lo * 1.1, "below: β_c/β_e < 1\n(loses bandwidth efficiency)", fontsize=8, ha="right")
    seen: dict = {}
    markers = "os^vD<>ph*X"
    for i, r in enumerate(rows):
        k = round(r["rho"], 2)
        shift = 1.0 + 0.04 * seen.get(k, 0)
        seen[k] = seen.get(k, 0) + 1
        ax.loglog([r["rho"] * shift], [r["S"]], markers[i % len(markers)], ms=7,
                  label=f"{i + 1}: {r['name']} (S {r['S']:.2f}, ρ {r['rho']:.2f})")
        ax.annotate(str(i + 1), (r["rho"] * shift, r["S"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    for axis in (ax.xaxis, ax.yaxis):           # ratios on a base-2 grid, printed as plain numbers
        axis.set_major_locator(LogLocator(base=2))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    return _finish(fig, ax, path, "model byte ratio ρ = eager bytes / compiled bytes",
                   "measured speed-up S = t_eager / t_compiled",
                   title or "speed-up decomposition S = ρ · β_c/β_e", 6.5)


def size_sweep_plot(path, sizes, curves, caches, bytes_per_element, title="", rho=None) -> str | None:
    """Ratios against N (both axes logarithmic): ``sizes`` the element counts, ``curves`` {label:
    [ratio per size, None where not measured]}, ``caches`` {"L1": bytes, ...} drawn at N = bytes /
    ``bytes_per_element`` (the inputs' bytes per element of N: where the inputs alone fill that
    cache); ``rho``: the case's model byte ratio, drawn as a horizontal line (what S approaches
    once bytes dominate and both variants stream alike).  Returns ``path``, or None without
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    markers = "os^vD"
    for i, (label, ys) in enumerate(curves.items()):
        pts = [(n, y) for n, y in zip(sizes, ys) if y is not None]
        if pts:
            ax.loglog([n for n, _ in pts], [y for _, y in pts], markers[i % len(markers)] + "-", base=2, label=label)
    ax.axhline(1, color="black", lw=0.5)
    if rho:
        ax.axhline(rho, color="tab:blue", ls=":", lw=1, label=f"ρ = {rho:.2f} (model byte ratio)")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    top = ax.get_ylim()[1]
    for level, nbytes in sorted(caches.items()):
        n = nbytes / bytes_per_element
        ax.axvline(n, color="grey", ls="--", lw=1)
        ax.text(n, top, f" {level} {nbytes / 2 ** 20:.3g} MiB" if nbytes >= 2 ** 20 else f" {level} {nbytes >> 10} KiB",
                rotation=90, va="top", ha="right", fontsize=8, color="grey")
    return _finish(fig, ax, path, "N (elements per input)", "speed-up (ratio of median times)",
                   title or "speed-up against size", 7.5)
