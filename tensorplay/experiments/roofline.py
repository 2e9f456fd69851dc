"""Experiment 1 of the chapter, roofline and attribution (§13.1-13.4), in one command:

    python -m tensorplay.experiments.roofline [--quick] [--out DIR] [--repeats N] [--no-torch-compile]
                                              [--cases ex1.1,exp] [--sweep-case ex1.1] [--sweep 10:26:1]
                                              [--skip-sweep] [--skip-error-model] [--steady]

What it measures and the model each part checks (guide: docs/experiment1.md):

1. **Machine** (``utils.machine``): B, the main-memory read bandwidth (64 MiB row sums with the
   last-level cache evicted; B = bytes / the smallest round median, Prop. 13.1; one round at the
   start and more after the cases, since a shared host drifts), P (the fastest n x n float32
   product), the ridge P/B and the cache sizes.
2. **Cases of tables 13.1/13.2** (``experiments.cases``): per case tp eager, tp compiled
   (``tp.compile(strict_native=True)``: Stax kernels, no fallback), torch eager and torch.compile,
   timed interleaved in shuffled rounds (``utils.benchmark.compare``); each case on the roofline
   (intensity = FLOPs / compiled model bytes, achieved FLOP/s = FLOPs / median): ``roofline.png``.
3. **Speed-up decomposition** (Prop. 13.3): ``S = t_e/t_c = rho · beta_c/beta_e`` per case, one
   compiled region each; rho = eager model bytes / compiled model bytes; ``speedup_vs_rho.png``
   (fig. 13.1: points above S = rho gain bandwidth efficiency, points below lose it).  And the
   compile amortisation (Prop. 13.4): ``N* = C / (t_e - t_c)`` with C the first compiled call
   (capture, passes, code generation, the C++ compiler unless ``TP_CACHE_DIR`` has the kernels).
4. **Size sweep** (experiment 1 (4)): one case at N = 2^a ... 2^b elements per input, S and the
   ratios to torch against N, with L1/L2/L3 drawn where the inputs fill them: ``size_sweep.png``.
5. **Rounding-error model** (Theorem 13.1, Corollary 13.1, ``utils.error_model``): the rows of
   ex 1.1, compiled and eager, against a float64 sum of the same float32 terms; the measured
   standard deviation of the row errors next to the prediction for W ways.

All numbers go to ``DIR/experiment1.json`` (times in ms, bandwidths in GB/s, FLOP rates in
GFLOP/s; null where a value does not exist, e.g. N* of a compiled call that is not faster).
matplotlib is optional: without it no PNG is written and everything else is.  ``--quick``: a
quarter of each dimension (inputs of 4 MiB, inside a 32 MiB LLC: they run above the memory
roof), fewer readings, a sweep to 2^22; the whole run takes about 1.5 minutes on 2 cores.
``--steady``: freed memory stays mapped (``utils.benchmark.keep_freed_memory``), so no variant pays
page faults for its fresh outputs -- without it eager's fresh 64 MiB intermediates can dominate
its time and S far exceeds rho.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

import tensorplay as tp
from tensorplay.compiler.cost import break_even_calls, compiled_cost_analysis
from tensorplay.experiments.cases import SIZES, cases, select
from tensorplay.utils import machine as mach
from tensorplay.utils import plots
from tensorplay.utils.benchmark import (compare, format_table, json_safe, keep_freed_memory, machine_description,
                                        paired_ratio, speedup_decomposition, torch_variants)
from tensorplay.utils.error_model import sum_error_std, sum_tolerance

__all__ = ["measure_case", "measure_cases", "roofline_rows", "decomposition_rows", "size_sweep", "sweep_rows",
           "plot_sweep", "error_model_check", "main"]

VARIANTS = ("tp eager", "tp compiled", "torch eager", "torch.compile")


def _inputs(shapes, g):
    """Fresh random float32 inputs in torch and zero-copy tp views of them: every variant reads the
    same memory (two copies of one 64 MiB tensor read up to 20 % apart on a VM)."""
    tins = [torch.randn(s, generator=g) for s in shapes]
    return tins, [tp.from_torch(t) for t in tins]


def _paired(r, k, base="tp compiled"):
    if k not in r or base not in r:
        return None
    return dict(zip(("median", "lo", "hi"), paired_ratio(r, k, base)))


def measure_case(name, fn, shapes, eager_elems, *, repeats=15, warmup=3, torch_compile=True, g=None, number=1,
                 eager=True) -> dict:
    """One case: compile it (``strict_native=True``; C = the first call's seconds), time the variants
    interleaved, and return its numbers: the variants' readings (ms), FLOPs, model bytes, S, rho,
    beta_e, beta_c (GB/s), the paired ratios to torch, C and N* (Prop. 13.4, tp eager against tp
    compiled).  ``number`` calls per reading (small sizes); ``eager=False`` leaves tp eager out."""
    tins, pins = _inputs(shapes, g if g is not None else torch.Generator().manual_seed(0))

    def f_tp(*xs):
        return fn(*xs, tp)

    def f_torch(*xs):
        return fn(*xs, torch)
    t0 = time.perf_counter()
    cf = tp.compile(f_tp, strict_native=True)
    cf(*pins)
    compile_s = time.perf_counter() - t0
    cost = compiled_cost_analysis(cf)
    variants = {"tp eager": lambda: f_tp(*pins)} if eager else {}
    variants["tp compiled"] = lambda: cf(*pins)
    variants.update(torch_variants(f_torch, *tins, torch_compile=torch_compile))
    r = compare(variants, repeats=repeats, warmup=warmup, number=number)
    tc = r["tp compiled"].median
    out = {"case": name, "shapes": [list(s) for s in shapes], "input_bytes": sum(t.numel() * 4 for t in tins),
           "calls_per_reading": number, "variants": {k: s.as_dict() for k, s in r.items()},
           "flops": cost["flops"], "bytes_compiled": cost["bytes_accessed"], "bytes_eager": 4.0 * eager_elems,
           "compile_s": compile_s, "beta_c_GBps": cost["bytes_accessed"] / tc / 1e9,
           "vs_torch_eager": _paired(r, "torch eager"), "vs_torch_compile": _paired(r, "torch.compile")}
    if eager:
        te = r["tp eager"].median
        d = speedup_decomposition(te, tc, out["bytes_eager"], out["bytes_compiled"])
        out.update(S=d["S"], rho=d["rho"], beta_e_GBps=d["beta_e"] / 1e9, S_paired=_paired(r, "tp eager"),
                   break_even_calls=break_even_calls(compile_s, te, tc))
    return out


def measure_cases(table, machine, *, repeats=15, warmup=3, torch_compile=True, eager=True, rounds_readings=7) -> list:
    """``measure_case`` for every case of ``table``, one more B round after each (``machine``:
    ``utils.machine.MachineParameters``; B stays the best round), then each case's place under the
    final roof (``utils.machine.roofline_point``) and beta_c / B."""
    g = torch.Generator().manual_seed(0)
    results = []
    for name, (fn, shapes, elems) in table.items():
        results.append(measure_case(name, fn, shapes, elems, repeats=repeats, warmup=warmup,
                                    torch_compile=torch_compile, g=g, eager=eager))
        machine.add_round(rounds_readings)
        print(f"  done {name}", file=sys.stderr)
    for res in results:
        tc = res["variants"]["tp compiled"]["median"] * 1e-3
        res["roofline"] = mach.roofline_point(res["flops"], res["bytes_compiled"], tc, machine.B, machine.P)
        res["beta_c_over_B"] = res["beta_c_GBps"] * 1e9 / machine.B
    return results


def _ms(v) -> str:
    return f"{v['median']:.3g} [{v['ci'][0]:.3g}, {v['ci'][1]:.3g}]"


def _ci(d) -> str:
    return "-" if d is None else f"{d['median']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"


def roofline_rows(results) -> tuple:
    """(rows, headers) of the roofline table: FLOPs, compiled model bytes, intensity, bound, the
    roof's rate and time, the measured median, the achieved rate and roof time / measured time."""
    rows = []
    for res in results:
        p = res["roofline"]
        rows.append((res["case"], f"{res['flops'] / 1e6:.1f}", f"{res['bytes_compiled'] / 2 ** 20:.1f}",
                     f"{p['intensity']:.3f}", p["bound"], f"{p['attainable_flops'] / 1e9:.1f}",
                     f"{p['roof_s'] * 1e3:.3g}", _ms(res["variants"]["tp compiled"]),
                     f"{p['achieved_flops'] / 1e9:.2f}", f"{p['roof_fraction']:.2f}"))
    return rows, ["case", "MFLOP", "MiB (compiled)", "I FLOP/byte", "bound", "roof GFLOP/s", "roof ms",
                  "tp compiled ms", "achieved GFLOP/s", "roof ms / measured"]


def decomposition_rows(results) -> tuple:
    """(rows, headers) of the speed-up decomposition (Prop. 13.3) and the amortisation (Prop. 13.4)."""
    rows = []
    for res in results:
        n_star = res["break_even_calls"]
        rows.append((res["case"], _ms(res["variants"]["tp eager"]), _ms(res["variants"]["tp compiled"]),
                     f"{res['S']:.2f}", _ci(res["S_paired"]), f"{res['rho']:.2f}", f"{res['beta_e_GBps']:.1f}",
                     f"{res['beta_c_GBps']:.1f}", f"{res['S'] / res['rho']:.2f}", f"{res['beta_c_over_B']:.0%}",
                     _ci(res["vs_torch_eager"]), _ci(res["vs_torch_compile"]), f"{res['compile_s']:.2f}",
                     "inf" if math.isinf(n_star) else f"{n_star:.0f}"))
    return rows, ["case", "tp eager ms", "tp compiled ms", "S", "S paired", "rho", "beta_e GB/s", "beta_c GB/s",
                  "beta_c/beta_e", "beta_c/B", "torch eager / tp", "torch.compile / tp", "C s", "N*"]


def _level(nbytes, caches) -> str:
    fits = [k for k, v in sorted(caches.items()) if nbytes <= v]
    return fits[0] if fits else "memory"


def size_sweep(case="ex1.1", exps=range(10, 27), cols=2048, repeats=15, torch_compile=True, caches=None) -> list:
    """Experiment 1 (4): ``case`` at N = 2^e elements per input for e in ``exps``, rows of ``cols``
    (one row of N below that); a reading averages 2^20 / N calls at small N.  Per size the
    ``measure_case`` numbers plus N, the shape and the cache level the inputs fit in."""
    caches = caches or mach.cache_sizes()
    g = torch.Generator().manual_seed(0)
    out = []
    for e in exps:
        n = 1 << e
        c = min(cols, n)
        name, (fn, shapes, elems) = next(iter(select(cases(n // c, c, n // c, c), case).items()))
        res = measure_case(name, fn, shapes, elems, repeats=repeats, warmup=3, torch_compile=torch_compile, g=g,
                           number=max(1, (1 << 20) // n))
        res.update(N=n, exp=e, fits_in=_level(res["input_bytes"], caches))
        out.append(res)
        print(f"  done 2^{e} ({name})", file=sys.stderr)
    return out


def sweep_rows(points) -> tuple:
    """(rows, headers) of the size sweep."""
    def us(v):
        scale, unit = (1e3, "µs") if v["median"] < 1 else (1, "ms")
        return f"{v['median'] * scale:.3g} {unit}"
    rows = []
    for p in points:
        v = p["variants"]
        rows.append((f"2^{p['exp']}", "x".join(map(str, p["shapes"][0])), f"{p['input_bytes'] / 2 ** 20:.3g} MiB",
                     p["fits_in"], p["calls_per_reading"], *(us(v[k]) for k in VARIANTS if k in v),
                     f"{p['S']:.2f}", f"{p['beta_c_GBps']:.1f}", _ci(p["vs_torch_eager"]), _ci(p["vs_torch_compile"])))
    names = [k for k in VARIANTS if k in points[0]["variants"]] if points else []
    return rows, ["N", "shape", "inputs", "fits in", "calls/reading", *names, "S", "beta_c GB/s",
                  "torch eager / tp", "torch.compile / tp"]


def plot_sweep(path, points, caches, title=None):
    """``utils.plots.size_sweep_plot`` of ``size_sweep``'s points: S and the paired ratios to torch
    eager and torch.compile (those measured) against N, the caches where the inputs fill them."""
    curves = {"S = t(tp eager) / t(tp compiled)": [q["S"] for q in points]}
    for label, key in (("torch eager", "vs_torch_eager"), ("torch.compile", "vs_torch_compile")):
        if points[0][key] is not None:
            curves[f"t({label}) / t(tp compiled)"] = [q[key]["median"] for q in points]
    return plots.size_sweep_plot(path, [q["N"] for q in points], curves, caches,
                                 points[0]["input_bytes"] / points[0]["N"],
                                 title=title or f"{points[0]['case']}: speed-up against N", rho=points[-1]["rho"])


def error_model_check(R=8192, C=2048, ways=(1, 16, 32), seed=0) -> dict:
    """Theorem 13.1 on the rows of ex 1.1: terms a = 2·relu(x + w) in float32 (the same in every
    variant: IEEE rounding of x + w, an exact doubling), each row summed by tp compiled (Stax) and
    eagerly (ATen), against the float64 sum of the same terms.  Returns the measured standard
    deviation and maximum of the row errors, the predicted standard deviation of Corollary 13.1
    for each of ``ways`` (the terms' mean and deviation taken from the data), and the largest
    |compiled - eager| next to ``sum_tolerance(..., paired=True)`` for W = 16."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(R, C, generator=g), torch.randn(R, C, generator=g)
    cf = tp.compile(lambda a, b: (tp.relu(a + b) * 2).sum(-1), strict_native=True)
    comp = cf(tp.from_torch(x), tp.from_torch(w))._data.double()
    terms = torch.relu(x + w) * 2
    eager = terms.sum(-1).double()
    exact = terms.double().sum(-1)
    mean, std = float(terms.double().mean()), float(terms.double().std())
    rms = math.sqrt(mean * mean + std * std)
    ec, ee = comp - exact, eager - exact
    return {"rows": R, "terms_per_row": C, "term_mean": mean, "term_std": std,
            "compiled_error_std": float(ec.std()), "compiled_error_max": float(ec.abs().max()),
            "eager_error_std": float(ee.std()), "eager_error_max": float(ee.abs().max()),
            "predicted_std": {str(W): sum_error_std(C, W, mean, std) for W in ways},
            "max_compiled_minus_eager": float((comp - eager).abs().max()),
            "tolerance_paired_W16": sum_tolerance(C, 16, "float32", rms, mean=mean, paired=True)}


def _sweep_exps(text, quick):
    if not text:
        return range(10, 23, 2) if quick else range(10, 27)
    a, b, *step = (int(v) for v in text.split(":"))
    return range(a, b + 1, step[0] if step else 1)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m tensorplay.experiments.roofline",
                                description="Experiment 1: roofline and attribution (figures + JSON)")
    p.add_argument("--quick", action="store_true", help="1/4 of each dimension, fewer readings, sweep 2^10..2^22")
    p.add_argument("--out", default="experiment1", help="folder for the PNGs and experiment1.json")
    p.add_argument("--repeats", type=int, default=None, help="readings per variant (default 15; --quick 5)")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out (slow to compile)")
    p.add_argument("--cases", default="", help="cases of tables 13.1/13.2 by the start of their names")
    p.add_argument("--sweep-case", default="ex1.1")
    p.add_argument("--sweep", default="",
                   help="exponents a:b[:step] of the size sweep (default 10:26, --quick 10:22:2)")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-error-model", action="store_true")
    p.add_argument("--steady", action="store_true",
                   help="freed memory stays mapped (glibc mallopt): fresh outputs cost no page faults")
    a = p.parse_args(argv)
    steady = keep_freed_memory() if a.steady else False
    repeats = a.repeats or (5 if a.quick else 15)
    readings = 5 if a.quick else 7
    tc = not a.no_torch_compile
    os.makedirs(a.out, exist_ok=True)
    print(f"machine: {machine_description()}")
    print("allocation: " + ("steady state (freed memory stays mapped)" if steady else
                            "fresh outputs (glibc's default: large buffers are mmap-ed and page-faulted)"))
    m = mach.measure_machine(rounds=1 if a.quick else 3, readings=readings, n=1024 if a.quick else 2048)
    print("caches: " + ", ".join(f"{k} {v / 2 ** 10:.0f} KiB" for k, v in sorted(m.caches.items())))
    print(f"{repeats} interleaved readings per variant in shuffled rounds; times: median [95% CI]\n")
    s = 4 if a.quick else 1
    table = select(cases(*(n // s for n in SIZES["cpu"])), a.cases)
    results = measure_cases(table, m, repeats=repeats, warmup=2 if a.quick else 3, torch_compile=tc,
                            rounds_readings=readings)
    print(f"\n{m.summary(readings)}\n")
    print(format_table(*roofline_rows(results)))
    print("\nspeed-up decomposition S = rho * beta_c/beta_e (Prop. 13.3) and break-even N* = C / (t_e - t_c) "
          "(Prop. 13.4; C: first call, s):\n")
    print(format_table(*decomposition_rows(results)))
    doc = {"machine": m.as_dict(), "date": time.strftime("%Y-%m-%d %H:%M %Z"), "quick": a.quick, "steady": steady,
           "repeats": repeats, "torch_compile": tc,
           "units": {"times": "ms", "bandwidths": "GB/s", "B": "bytes/s", "P": "FLOP/s"}, "cases": results, "figures": {}}
    figs = doc["figures"]
    figs["roofline"] = plots.roofline_plot(os.path.join(a.out, "roofline.png"), m.B, m.P,
                                           [dict(name=r["case"], **r["roofline"]) for r in results],
                                           title=f"measured roofline ({m.caches.get('L3', 0) >> 20} MiB LLC)")
    figs["speedup_vs_rho"] = plots.speedup_plot(os.path.join(a.out, "speedup_vs_rho.png"),
                                               [dict(name=r["case"], S=r["S"], rho=r["rho"]) for r in results])
    if not a.skip_sweep:
        sweep = size_sweep(a.sweep_case, _sweep_exps(a.sweep, a.quick), repeats=repeats, torch_compile=tc,
                           caches=m.caches)
        doc["size_sweep"] = sweep
        print(f"\nsize sweep of {sweep[0]['case']}:\n")
        print(format_table(*sweep_rows(sweep)))
        figs["size_sweep"] = plot_sweep(os.path.join(a.out, "size_sweep.png"), sweep, m.caches)
    if not a.skip_error_model:
        em = error_model_check(*((2048, 2048) if a.quick else (8192, 2048)))
        doc["error_model"] = em
        print(f"\nrounding error of ex 1.1's rows ({em['rows']} x {em['terms_per_row']} terms) against float64: "
              f"compiled std {em['compiled_error_std']:.3g} (max {em['compiled_error_max']:.3g}), eager std "
              f"{em['eager_error_std']:.3g}; predicted std (Cor. 13.1) "
              + ", ".join(f"W={k}: {v:.3g}" for k, v in em["predicted_std"].items())
              + f"; max |compiled - eager| {em['max_compiled_minus_eager']:.3g} (tolerance, W=16, k=6: "
              f"{em['tolerance_paired_W16']:.3g})")
    path = os.path.join(a.out, "experiment1.json")
    with open(path, "w") as f:
        json.dump(json_safe(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"\nwrote {path}")
    return doc


if __name__ == "__main__":
    main()
