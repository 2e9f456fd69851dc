"""Cold and warm compile time of the GPT training step, each reading a fresh process (issue: the GPU
backend; benchmarks/compile_time.py does the same for ex 1.1 on the CPU).

One reading is a NEW Python process (this script with ``--child tp`` or ``--child torch``) that imports
torch and tensorplay, builds the GPT of benchmarks/training.py (``examples/gpt.py``; for torch its
mirror ``TorchGPT``) on the device with its AdamW optimizer, compiles the region of training.py --
the model's forward and the cross-entropy loss (tp: ``tp.compile(WithLoss(model, loss),
options={"aot.partitioner": "min_cut"})``, ``strict_native=False``; torch: ``torch.compile`` of
``lambda x, y: model(x, y)``) -- and runs two training steps (``zero_grad(); loss = f(x, y);
loss.backward(); opt.step()``), then prints one JSON line:

* ``first``: seconds from the compile call to the end of the first step, the device's work
  included (capture, passes, code generation, the Triton / g++ / Inductor compiles, loading, the
  first forward, the backward graph's compile at the first ``backward()``, the optimizer step):
  the time to the first result;
* ``second``: the second step (steady state); ``compile`` = first - second estimates the compiler's
  share;
* ``import_torch``, ``import_tp``, ``build`` (model and optimizer on the device); the parent adds
  ``wall``, the whole process (Python start-up, imports, CUDA context, everything).

Per repeat, in this order (new folders for every repeat):

* **tp cold**: ``TP_CACHE_DIR`` and ``TRITON_CACHE_DIR`` empty, so Stax's graph cache, its compiler
  probes (CPU) and Triton's binary cache (GPU) are all cold;
* **tp warm**: a new process on the folders tp cold filled -- the graph cache gives the wrappers
  without lowering or code generation, Triton finds its binaries.  Target: first <= 2 s;
* **torch cold**: ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` empty (Inductor's FX-graph and
  AOT-autograd caches and Triton's, all cold);
* **torch warm** (``--torch-warm``): a new process on the folders torch cold filled.

Sizes: those of training.py (``GPT_SIZES``; on ``--device cuda`` GPT-2 small: 12 layers, d_model 768,
12 heads, T 1024, batch 8, vocab 50304; float32 unless ``--dtype bf16``), the same size flags.
``--quick`` is a smoke test (on the CPU: 1 layer, d_model 32, T 32 -- well under a minute with
``--no-torch-compile``).  ``--no-torch-compile`` / ``--torch-warm`` drop or add cases; ``--timeout``
bounds each child (600 s).  On the GPU the run is the cold compiles: torch.compile's of GPT-2 small
is typically under a minute or two; tp.compile's is dominated by Stax's fusion loop, super-linear in
the number of layers (training.py's docstring: ~24 s at 4 layers, ~4 min at 8, ~15 min estimated at
12 on a 2-core VM), so at the default 12 layers tp cold may hit ``--timeout``; ``--n-layer 4`` keeps
the whole run to a few minutes.  ``--keep-tp-cache DIR`` leaves the first repeat's tp cache filled, so
that ``TP_CACHE_DIR=DIR python benchmarks/training.py --device cuda`` (same sizes and dtype) starts warm.

    python benchmarks/compile_cold.py [--device cpu|cuda] [--repeats 1] [--quick] [--no-torch-compile]
                                      [--torch-warm] [--dtype fp32|bf16] [--tf32] [--json PATH]
                                      [--keep-tp-cache DIR] [--timeout S]
                                      [--n-layer N] [--n-embd D] [--n-head H] [--block-size T]
                                      [--batch B] [--vocab V]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZE_FLAGS = ("n_layer", "n_embd", "n_head", "block_size", "batch", "vocab")


def add_args(p):
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=1, help="fresh folders and processes per repeat")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--no-torch-compile", action="store_true", help="no torch.compile cases")
    p.add_argument("--torch-warm", action="store_true", help="also torch.compile on its filled caches")
    p.add_argument("--dtype", default="fp32", choices=["bf16", "fp32"])
    p.add_argument("--tf32", action="store_true", help="torch.set_float32_matmul_precision('high') (cuda)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per child process")
    p.add_argument("--json", default=None, help="write the readings here")
    p.add_argument("--keep-tp-cache", default=None, metavar="DIR",
                   help="the first repeat's tp cases use DIR (empty or absent; Triton's cache in DIR/triton) and "
                        "leave it filled: TP_CACHE_DIR=DIR training.py --device cuda then finds the step compiled")
    p.add_argument("--child", choices=["tp", "torch"], default=None, help=argparse.SUPPRESS)
    add_size_flags(p)


def add_size_flags(p):
    """The GPT size flags of this script and training.py (None: training.py's ``GPT_SIZES`` of the
    device).  Here, not in training.py, so that a child parses them before it imports torch."""
    g = p.add_argument_group("GPT sizes (default: training.py's GPT_SIZES per --device and --quick)")
    g.add_argument("--n-layer", type=int, default=None)
    g.add_argument("--n-embd", type=int, default=None, help="d_model")
    g.add_argument("--n-head", type=int, default=None)
    g.add_argument("--block-size", type=int, default=None, help="T, the tokens of each sequence")
    g.add_argument("--batch", type=int, default=None)
    g.add_argument("--vocab", type=int, default=None)


# ---------------------------------------------------------------------------------------------
# the child: one compile and two steps, timed
# ---------------------------------------------------------------------------------------------
def child(a) -> dict:
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    import tensorplay as tp
    t2 = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import training as T
    from tensorplay.utils.benchmark import synchronize
    if a.tf32:
        torch.set_float32_matmul_precision("high")
    cfg, B = T.gpt_sizes_of(a)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    tb = time.perf_counter()
    if a.child == "tp":
        tp.manual_seed(0)
        model = T.place(T.GPT(cfg), a)
        opt = tp.optim.AdamW(model.parameters(), lr=1e-3)
        batch = tuple(tp.from_torch(T.place_tensor(t, a)) for t in (idx, tgt))

        def make():
            return tp.compile(T.WithLoss(model, lambda m, x, y: m(x, y)[1]), options={"aot.partitioner": "min_cut"})
    else:
        torch.manual_seed(0)
        model = T.place(T.TorchGPT(cfg), a)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = tuple(T.place_tensor(t, a) for t in (idx, tgt))

        def make():
            return torch.compile(lambda x, y: model(x, y))
    synchronize(a.device)
    tc0 = time.perf_counter()
    step = T.train_step(opt, make(), batch)
    loss = step()
    synchronize(a.device)
    tc1 = time.perf_counter()
    step()
    synchronize(a.device)
    tc2 = time.perf_counter()
    out = {"import_torch": t1 - t0, "import_tp": t2 - t1, "build": tc0 - tb, "first": tc1 - tc0,
           "second": tc2 - tc1, "compile": (tc1 - tc0) - (tc2 - tc1), "loss": float(loss.item()),
           "gpt": T.describe_gpt(cfg, B, a.dtype)}
    if a.child == "tp":
        from tensorplay.compiler.backends.stax import codecache
        out["stats"] = dict(codecache.stats)
    return out


# ---------------------------------------------------------------------------------------------
# the parent: fresh processes on fresh (or filled) cache folders
# ---------------------------------------------------------------------------------------------
def passthrough(a) -> list:
    """The flags a child needs to build the same model (device, dtype, sizes)."""
    out = ["--device", a.device, "--dtype", a.dtype] + (["--quick"] if a.quick else []) + (["--tf32"] if a.tf32 else [])
    for k in SIZE_FLAGS:
        v = getattr(a, k)
        if v is not None:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def run_child(kind, dirs: dict, a) -> dict:
    """One fresh process of ``kind`` (tp / torch) with ``dirs`` (env var -> folder) as its caches."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1", **{k: str(v) for k, v in dirs.items()})
    for k in ("TP_CXX", "TP_CXXFLAGS", "TP_CPU_ISA", "TRITON_INTERPRET"):
        env.pop(k, None)
    log = dirs.get("TP_COMPILE_LOG")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind] + passthrough(a)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {a.timeout} s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.strip().splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}:\n{p.stderr[-3000:]}"}
    r = json.loads(lines[-1])
    r["wall"] = wall
    if log:
        runs = Path(log).read_text().splitlines() if Path(log).exists() else []
        r["compiler_runs"] = len(runs)
    return r


def cases(a) -> list:
    out = ["tp cold", "tp warm"]
    if not a.no_torch_compile:
        out += ["torch cold"] + (["torch warm"] if a.torch_warm else [])
    return out


def one_repeat(a, tmp: Path, i: int) -> dict:
    """Every case once, on new folders under ``tmp`` (warm cases: the folders of the cold one)."""
    tpd = {"TP_CACHE_DIR": tmp / f"tp_cache_{i}", "TRITON_CACHE_DIR": tmp / f"tp_triton_{i}"}
    if a.keep_tp_cache and i == 0:      # (tp's own layout: Triton's binaries in <TP_CACHE_DIR>/triton)
        keep = Path(a.keep_tp_cache).resolve()
        tpd = {"TP_CACHE_DIR": keep, "TRITON_CACHE_DIR": keep / "triton"}
    thd = {"TORCHINDUCTOR_CACHE_DIR": tmp / f"inductor_{i}", "TRITON_CACHE_DIR": tmp / f"torch_triton_{i}"}
    out = {}
    for case in cases(a):
        kind, temp = case.split()
        dirs = dict(tpd if kind == "tp" else thd)
        if kind == "tp":
            dirs["TP_COMPILE_LOG"] = tmp / f"compiles_{i}_{temp}.log"
        out[case] = r = run_child(kind, dirs, a)
        print(f"  repeat {i + 1}, {case}: " + (f"FAILED: {r['error']}" if "error" in r else
                                               f"first step {r['first']:.2f} s, process {r['wall']:.1f} s"),
              flush=True)
    return out


def summarize(rs: list, key: str, scale=1.0, fmt="{:.2f}") -> str:
    vals = [r[key] * scale for r in rs if key in r]
    if not vals:
        return "-"
    if len(vals) == 1:
        return fmt.format(vals[0])
    from tensorplay.utils.benchmark import Stats
    s = Stats(key, vals)
    lo, hi, _ = s.ci
    return f"{fmt.format(s.median)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def main(argv=None):
    p = argparse.ArgumentParser(description="cold / warm compile time of the GPT training step, fresh processes")
    add_args(p)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return None
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False")
    if a.keep_tp_cache and Path(a.keep_tp_cache).exists() and any(Path(a.keep_tp_cache).iterdir()):
        p.error(f"--keep-tp-cache {a.keep_tp_cache}: not empty (tp cold needs an empty cache)")
    import training as T
    from tensorplay.utils.benchmark import format_table, machine_description
    cfg, B = T.gpt_sizes_of(a)
    gpt = T.describe_gpt(cfg, B, a.dtype)
    print(f"machine: {machine_description(a.device)}")
    print(f"{gpt} on {a.device}; compile + first training step (forward + loss compiled, backward, AdamW step), "
          f"each case a fresh process; {a.repeats} repeat(s)" + (", median [95% CI]" if a.repeats > 1 else ""),
          flush=True)
    res = {c: [] for c in cases(a)}
    with tempfile.TemporaryDirectory(prefix="tp_compile_cold_") as tmp:
        for i in range(a.repeats):
            for case, r in one_repeat(a, Path(tmp), i).items():
                res[case].append(r)
    rows = []
    for case, rs in res.items():
        ok = [r for r in rs if "error" not in r]
        st = ok[0].get("stats", {}) if ok else {}
        note = (f"graph hits {st.get('graph_hits', 0)}, builds {st.get('builds', 0)}, compiler runs "
                f"{ok[0].get('compiler_runs', '-')}") if case.startswith("tp") and ok else ""
        if len(ok) < len(rs):
            note += f" ({len(rs) - len(ok)} failed)"
        rows.append((case, summarize(ok, "first"), summarize(ok, "second", 1e3, "{:.1f}"), summarize(ok, "compile"),
                     summarize(ok, "wall", fmt="{:.1f}"), summarize(ok, "import_torch"), summarize(ok, "import_tp"),
                     summarize(ok, "build"), summarize(ok, "loss", fmt="{:.4f}"), note))
    print()
    print(format_table(rows, ["case", "first step, s", "second step, ms", "compile ~ first - second, s",
                              "process, s", "import torch, s", "import tp, s", "build, s", "first loss", "tp cache"]))

    def med(case):
        vals = sorted(r["first"] for r in res.get(case, []) if "error" not in r)
        return vals[len(vals) // 2] if vals else None
    w, c, tc = med("tp warm"), med("tp cold"), med("torch cold")
    print("\nfirst step = compile + the first training step, until the device is done; 'tp cache': Stax's "
          "codecache.stats of the process (compiler runs: g++ on the CPU)")
    if w is not None:
        print(f"target tp warm first step <= 2 s: {w:.2f} s -> {'met' if w <= 2.0 else 'NOT met'}")
    if c is not None and tc is not None:
        print(f"cold first step, t(torch.compile) / t(tp.compile) = {tc / c:.2f} (> 1: tp compiles faster)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine_description(a.device), "gpt": gpt, "args": vars(a), "readings": res}, f,
                      indent=1, default=str)
        print(f"wrote {a.json}")
    if a.keep_tp_cache:
        print(f"tp cache of repeat 1 kept in {a.keep_tp_cache} (TP_CACHE_DIR={a.keep_tp_cache} for a warm training.py)")
    failed = sum("error" in r for rs in res.values() for r in rs)
    if failed:
        print(f"{failed} child process(es) failed", file=sys.stderr)
        sys.exit(1)
    return res


if __name__ == "__main__":
    main()
