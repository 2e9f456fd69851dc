"""Dynamic shapes against static compilation (the chapter, §10 and experiment 5), in one run.

(a) **Kernels.**  The fusion cases of table 13.1 (``tensorplay.experiments.cases``, the same
    functions and sizes) compiled twice, static (``tp.compile(strict_native=True)``) and
    ``dynamic=True``, both captured at the table's size and timed interleaved (chapter §13.1:
    shuffled rounds, medians with their 95% CI).  Reported per case: both medians, and the paired
    ratio t(static) / t(dynamic) -- the median [95% CI] of the per-round ratios (readings of one
    round are adjacent in time, so the host's drift cancels).  Target: >= 0.95 on every case
    (a shape-polymorphic kernel costs at most 5% against one specialised to the size).
(b) **The length sweep** (§13.4's example): ``--calls`` calls (default 1000) of a 2-layer MLP
    ``gelu(x @ w1 + b1) @ w2 + b2`` over x of shape (L, 64), L uniform in 1..512 (seeded: the same
    lengths for every variant).  Per variant: specializations (compiled graphs), calls that
    compiled, the total wall time of those calls (capture + code generation + C++ compilation:
    the compile time a user waits for), the time of the other calls, and the largest difference
    from eager on the last call.  Variants: static ``tp.compile``, ``tp.compile(dynamic=True)``
    and ``torch.compile(dynamic=True)`` (graphs counted by a backend that wraps Inductor's
    ``compile_fx``).  Each variant runs in a fresh process with an empty kernel cache (Stax's
    ``TP_CACHE_DIR`` and Inductor's cache dir), so no variant is served kernels another compiled.

Stax's kernels are shape-polymorphic (docs/stax.md "Shape-polymorphic kernels"): under
``dynamic=True`` (a) times a kernel taking its sizes as arguments against one specialised to the
size, and (b) counts one specialization for the whole sweep.

    python benchmarks/dynamic.py [--quick] [--calls N] [--static-calls M] [--repeats 15]
                                 [--no-torch-compile] [--skip-table] [--skip-sweep] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorplay as tp  # noqa: E402
import tensorplay.nn.functional as F  # noqa: E402
from tensorplay.utils.benchmark import compare, format_table, machine_description, paired_ratio  # noqa: E402

#: the fusion cases of table 13.1 (experiments.cases.cases() also holds the single ops of table 13.2)
TABLE_13_1 = ("ex1.1", "ex7.1", "softmax, five ops", "softmax, F.softmax", "ex7.2", "LayerNorm")
VARIANTS = ("static", "dynamic", "torch.compile")
TARGET = 0.95
WIDTH, HIDDEN, MAX_LEN = 64, 256, 512


# ---------------------------------------------------------------------------------------------------
# (a) table 13.1, static against dynamic=True
# ---------------------------------------------------------------------------------------------------
def table(quick, repeats, warmup, only=""):
    from tensorplay.experiments.cases import cases
    scale = 4 if quick else 1
    all_cases = cases(8192 // scale, 2048 // scale, 16384 // scale, 1000 // scale)
    picked = {k: v for k, v in all_cases.items() if k.startswith(TABLE_13_1)}
    if only:
        picked = {k: v for k, v in picked.items() if any(k.startswith(w.strip()) for w in only.split(","))}
    g = torch.Generator().manual_seed(0)
    out = []
    for name, (fn, shapes, _) in picked.items():
        pins = [tp.from_torch(torch.randn(s, generator=g)) for s in shapes]

        def f_tp(*xs, _fn=fn):
            return _fn(*xs, tp)
        compiled, compile_s = {}, {}
        for v, dyn in (("static", False), ("dynamic", True)):
            t0 = time.perf_counter()
            compiled[v] = tp.compile(f_tp, strict_native=True, dynamic=dyn)
            compiled[v](*pins)                          # the capture run
            compiled[v](*pins)                          # the first call of the artifact
            compile_s[v] = time.perf_counter() - t0
        diff = max(float((a - b).abs().max()) for a, b in zip(_flat(compiled["static"](*pins)),
                                                               _flat(compiled["dynamic"](*pins))))
        r = compare({v: (lambda c=c: c(*pins)) for v, c in compiled.items()}, repeats=repeats, warmup=warmup)
        m, lo, hi = paired_ratio(r, "static", "dynamic")
        out.append(dict(case=name, shapes=[list(s) for s in shapes], static_ms=r["static"].median * 1e3,
                        static_ci_ms=[x * 1e3 for x in r["static"].ci[:2]], dynamic_ms=r["dynamic"].median * 1e3,
                        dynamic_ci_ms=[x * 1e3 for x in r["dynamic"].ci[:2]], ratio=m, ratio_ci=[lo, hi],
                        meets_target=m >= TARGET, compile_s=compile_s, max_abs_diff=diff,
                        dynamic_specializations=compiled["dynamic"].counters["captures"],
                        _cells=(r["static"].ms(), r["dynamic"].ms())))
        del compiled
    return out


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def print_table(rows):
    # (no compile-time column: the second compilation of a case may reuse the first's kernels in this
    # process; compile time is the sweep's business, measured in fresh processes)
    headers = ["case", "static ms", "dynamic=True ms", "t(static)/t(dynamic) paired [95% CI]",
               f">= {TARGET}", "dynamic specializations", "max |static - dynamic|"]
    cells = [(r["case"], *r["_cells"], f"{r['ratio']:.3f} [{r['ratio_ci'][0]:.3f}, {r['ratio_ci'][1]:.3f}]",
              "yes" if r["meets_target"] else "NO", r["dynamic_specializations"], f"{r['max_abs_diff']:.2g}")
             for r in rows]
    print(format_table(cells, headers))


# ---------------------------------------------------------------------------------------------------
# (b) the length sweep: one variant per fresh process
# ---------------------------------------------------------------------------------------------------
def lengths(calls, seed):
    rng = random.Random(seed)
    return [rng.randint(1, MAX_LEN) for _ in range(calls)]


def mlp(x, w1, b1, w2, b2, L=tp):
    gelu = F.gelu if L is tp else torch.nn.functional.gelu
    return gelu(x @ w1 + b1) @ w2 + b2


def sweep_worker(variant, calls, seed):
    """Run the sweep of one variant in this process; returns its record."""
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(WIDTH, HIDDEN, generator=g) * 0.1, torch.randn(HIDDEN, generator=g) * 0.1,
          torch.randn(HIDDEN, WIDTH, generator=g) * 0.1, torch.randn(WIDTH, generator=g) * 0.1]
    if variant == "torch.compile":
        from torch._inductor.compile_fx import compile_fx
        graphs = []

        def counting(gm, example_inputs):
            graphs.append(gm)
            return compile_fx(gm, example_inputs)
        torch._dynamo.reset()
        torch._dynamo.config.cache_size_limit = 1 << 20
        fc = torch.compile(lambda x: mlp(x, *ws, L=torch), dynamic=True, backend=counting)

        def count():
            return len(graphs)

        def run(x):
            return fc(x)

        def ref(x):
            return mlp(x, *ws, L=torch)
        wrap = lambda t: t  # noqa: E731
    else:
        pws = [tp.from_torch(w) for w in ws]
        cf = tp.compile(lambda x: mlp(x, *pws), strict_native=True, dynamic=variant == "dynamic",
                        recompile_limit=1 << 20)

        def count():
            return cf.counters["captures"]

        def run(x):
            return cf(x)

        def ref(x):
            return mlp(x, *pws)
        wrap = tp.from_torch
    compile_s = run_s = 0.0
    compiling = 0
    ls = lengths(calls, seed)
    for n in ls:
        x = wrap(torch.randn(n, WIDTH, generator=g))
        before = count()
        t0 = time.perf_counter()
        y = run(x)
        dt = time.perf_counter() - t0
        if count() > before:
            compile_s += dt
            compiling += 1
        else:
            run_s += dt
    y2 = run(x)
    diff = float((_torch(y2) - _torch(ref(x))).abs().max())
    return dict(variant=variant, calls=calls, distinct_lengths=len(set(ls)), specializations=count(),
                compiling_calls=compiling, compile_s=compile_s, other_calls_s=run_s, max_abs_diff_last=diff)


def _torch(t):
    return t.torch() if hasattr(t, "torch") else t


def sweep(calls, seed, variants, timeout, static_calls=None):
    """Each variant in a fresh process with empty kernel caches.  ``static_calls``: the static
    variant runs only the first that many calls (it compiles once per distinct length, ~5 s each on
    the 2-core VM); its record then projects the compile time of all ``calls`` as the distinct
    lengths among them times its mean compile time (``projected_compile_s``, marked as such)."""
    out = []
    for v in variants:
        n_calls = calls if v != "static" or not static_calls else min(calls, static_calls)
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, TP_CACHE_DIR=os.path.join(tmp, "stax"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--sweep-worker", v, "--calls", str(n_calls),
                                "--seed", str(seed)], env=env, capture_output=True, text=True, timeout=timeout)
            if p.returncode:
                raise RuntimeError(f"sweep variant {v!r} failed:\n{p.stderr[-3000:]}")
            rec = json.loads(p.stdout.strip().splitlines()[-1])
            rec["process_s"] = time.perf_counter() - t0
            if n_calls < calls and rec["compiling_calls"]:
                full = len(set(lengths(calls, seed)))
                rec["projected"] = dict(calls=calls, specializations=full,
                                        compile_s=full * rec["compile_s"] / rec["compiling_calls"])
            out.append(rec)
            print(f"  {v}: {rec['specializations']} specializations, compile {rec['compile_s']:.1f} s", flush=True)
    return out


def print_sweep(rows):
    headers = ["variant", "calls", "distinct L", "specializations", "calls that compiled", "compile s (total)",
               "other calls s", "process s", "max |y - eager| (last call)"]
    print(format_table([(r["variant"], r["calls"], r["distinct_lengths"], r["specializations"], r["compiling_calls"],
                         f"{r['compile_s']:.1f}", f"{r['other_calls_s']:.2f}", f"{r['process_s']:.1f}",
                         f"{r['max_abs_diff_last']:.2g}") for r in rows], headers))
    for r in rows:
        if "projected" in r:
            pj = r["projected"]
            print(f"  {r['variant']} projected to {pj['calls']} calls: {pj['specializations']} specializations (the "
                  f"distinct lengths), ~{pj['compile_s']:.0f} s of compilation (its mean compile time; not measured)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 1/16 of the table's sizes, 5 repeats, a 20-call sweep (unless --calls)")
    p.add_argument("--calls", type=int, default=None, help="calls of the length sweep (default 1000; 20 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sweep's lengths")
    p.add_argument("--repeats", type=int, default=None, help="interleaved readings per case (default 15; 5 with --quick)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cases", default="", help="comma-separated prefixes of table 13.1 case names")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out of the sweep")
    p.add_argument("--skip-table", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--static-calls", type=int, default=None,
                   help="run the static variant for only this many of the calls and project the rest")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per sweep variant")
    p.add_argument("--json", default="", help="also write the results as JSON to this file ('-': stdout)")
    p.add_argument("--sweep-worker", choices=VARIANTS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    calls = a.calls if a.calls is not None else (20 if a.quick else 1000)
    if a.sweep_worker:
        print(json.dumps(sweep_worker(a.sweep_worker, calls, a.seed)))
        return 0
    from tensorplay.compiler.backends.stax import stax_backend
    repeats = a.repeats if a.repeats is not None else (5 if a.quick else 15)
    res = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), machine=machine_description(),
               command=" ".join([os.path.basename(sys.executable), "benchmarks/dynamic.py", *(argv or sys.argv[1:])]),
               stax_dynamic_shapes=bool(getattr(stax_backend, "dynamic_shapes", False)))
    print(f"machine: {res['machine']}\ndate: {res['date']}\nStax kernels symbolic (dynamic_shapes): "
          f"{res['stax_dynamic_shapes']}\n")
    if not a.skip_table:
        print(f"(a) table 13.1, static against dynamic=True: {repeats} interleaved readings after {a.warmup} "
              f"warm-up calls; ms, median [95% CI]")
        res["table"] = table(a.quick, repeats, a.warmup, a.cases)
        print_table(res["table"])
        print()
    if not a.skip_sweep:
        vs = [v for v in VARIANTS if v != "torch.compile" or not a.no_torch_compile]
        print(f"(b) length sweep: {calls} calls of a 2-layer MLP over (L, {WIDTH}), L uniform in 1..{MAX_LEN} "
              f"(seed {a.seed}); each variant in a fresh process with empty kernel caches")
        res["sweep"] = sweep(calls, a.seed, vs, a.timeout, a.static_calls)
        print_sweep(res["sweep"])
    if a.json:
        for r in res.get("table", []):
            r.pop("_cells", None)
        text = json.dumps(res, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
