"""Compile time of ex 1.1, cold and warm, in fresh processes (the chapter, §11.2; docs/cache.md).

Ex 1.1 is ``(relu(x + w) * 2).sum(-1)`` on two 8192 x 2048 float32 tensors (benchmarks/table13.py).
Each reading is a NEW Python process that imports torch and tensorplay, compiles ex 1.1 with
``tp.compile(strict_native=True)`` and calls it once.  Per repeat, interleaved, for the Python
wrapper and the C++ wrapper (``options={"stax.cpp_wrapper": True}``):

* **cold**: an empty ``TP_CACHE_DIR`` (so the compiler probes run too);
* **warm**: a new process on the cache the cold run just filled.  It must run no compiler: every
  compiler run (build or probe) appends a line ``<pid> <seconds> <command>`` to
  ``$TP_COMPILE_LOG`` (codecache.run_build_tool); the count is reported and must be 0.

Reported per case, median [95% CI] over the repeats (Prop. 13.2), in seconds: the first call (from
``tp.compile`` to the result: capture, passes, Stax's Python work, compiling and loading), its
parts (``lower`` = capture + front-end passes; ``stax`` = lowering, scheduling, code generation;
``load`` = writing/importing the wrapper module, which waits for g++ and dlopen), the compiler's
own time (sum over its runs; runs in the compile pool overlap), the number of compiler runs, and the
imports (torch, tensorplay, sympy, which Stax imports at the first compile).  Targets: cold first
call <= 2 s, warm <= 0.5 s.

    python benchmarks/compile_time.py [--repeats 5] [--small]

Two more measurements (docs/PERFORMANCE.md, "Compile time"):

* ``--sweep``: Stax's Python pipeline on synthetic graphs of 100 to 10,000 nodes (chains,
  diamonds and residual stacks of pointwise ops and row reductions), lowering, scheduling
  (``Scheduler.fuse``) and code generation timed apart (no compiler runs), with the growth exponent
  of each fitted by least squares on log-log (target for the scheduler: about n log n, i.e. an
  exponent near 1);
* ``--resnet``: ResNet-18 (``RESNET_CHILD`` below: one definition, run on tp.nn or torch.nn)
  forward + backward, cold compile (the first two training steps: capture, AOT, partition, Stax,
  g++ and loading of both graphs) in a fresh process with an
  empty ``TP_CACHE_DIR``, against ``torch.compile`` of torchvision-shaped ResNet-18 in torch.nn in a
  fresh process with ``torch._dynamo.reset()`` and an empty inductor cache
  (``TORCHINDUCTOR_CACHE_DIR``); ``--profile`` adds tp's cProfile top entries.

    python benchmarks/compile_time.py --sweep [--sizes 100,300,1000,3000,10000]
    python benchmarks/compile_time.py --resnet [--batch 2 --res 64] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import tensorplay as tp
t2 = time.perf_counter()
from tensorplay.compiler.backends import stax
from tensorplay.compiler.backends.stax import codecache
R, C, cpp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "cpp"
parts = {"stax": 0.0, "load": 0.0}

def timed(key, fn):
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            parts[key] += time.perf_counter() - t
    return w

stax.compile_graph = timed("stax", stax.compile_graph)
codecache.load_py = timed("load", codecache.load_py)
g = torch.Generator().manual_seed(0)
x = tp.from_torch(torch.randn(R, C, generator=g))
w = tp.from_torch(torch.randn(R, C, generator=g))

def ex11(x, w):
    return (tp.relu(x + w) * 2).sum(-1)

sympy_before = "sympy" in sys.modules
t3 = time.perf_counter()
cf = tp.compile(ex11, strict_native=True, options={"stax.cpp_wrapper": cpp})
lowered = cf.lower(x, w)
t4 = time.perf_counter()
art = lowered.compile()
out = art(x, w)
t5 = time.perf_counter()
ref = (torch.relu(x._data + w._data) * 2).sum(-1)
assert torch.allclose(out._data, ref, rtol=1e-4, atol=1e-3)
assert ("stax_entry0" in art.as_text()) == cpp
t6 = time.perf_counter()
import sympy  # noqa: F401  (already imported by Stax: measures nothing unless it was not)
print(json.dumps({"import_torch": t1 - t0, "import_tp": t2 - t1, "first_call": t5 - t3,
                  "lower": t4 - t3, "stax": parts["stax"], "load": parts["load"],
                  "sympy_preloaded": sympy_before, "stats": codecache.stats}))
"""

SYMPY_CHILD = "import time, torch; t = time.perf_counter(); import sympy; print(time.perf_counter() - t)"


def run_child(cache: Path, wrapper: str, R: int, C: int) -> dict:
    log = cache.parent / f"{cache.name}.compiles.log"
    env = dict(os.environ, TP_CACHE_DIR=str(cache), TP_COMPILE_LOG=str(log),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("TP_CXX", "TP_CXXFLAGS", "TP_CPU_ISA"):
        env.pop(k, None)
    if log.exists():
        log.unlink()
    return _child(CHILD, [str(R), str(C), wrapper], env, log, 600, wrapper)[0]


def _child(code, argv, env, log: Path, timeout, what):
    """Run ``code`` in a new Python process: (its last stdout line as JSON with the compiler runs
    of ``log`` added -- count, seconds, commands --, its stderr)."""
    p = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({what}):\n{p.stderr[-5000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    runs = log.read_text().splitlines() if log.exists() else []
    r["compiler_runs"] = len(runs)
    r["compiler_s"] = sum(float(ln.split(" ", 2)[1]) for ln in runs)
    r["compiler_cmds"] = [ln.split(" ", 2)[2] for ln in runs]
    return r, p.stderr


def summarize(readings: list, key: str):
    from tensorplay.utils.benchmark import Stats
    s = Stats(key, [r[key] for r in readings])
    lo, hi, _ = s.ci
    return f"{s.median:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--small", action="store_true", help="64 x 32 inputs instead of 8192 x 2048")
    p.add_argument("--verbose", action="store_true", help="print the compiler commands of the cold runs")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tensorplay.utils.benchmark import format_table, machine_description
    R, C = (64, 32) if a.small else (8192, 2048)
    res = {(w, m): [] for w in ("py", "cpp") for m in ("cold", "warm")}
    with tempfile.TemporaryDirectory(prefix="tp_compile_time_") as tmp:
        for i in range(a.repeats):
            for w in ("py", "cpp"):
                cache = Path(tmp) / f"cache_{w}_{i}"
                res[(w, "cold")].append(run_child(cache, w, R, C))
                res[(w, "warm")].append(run_child(cache, w, R, C))
        sympy_s = []
        for _ in range(a.repeats):
            q = subprocess.run([sys.executable, "-c", SYMPY_CHILD], capture_output=True, text=True)
            sympy_s.append({"sympy": float(q.stdout.strip())})
    print(f"machine: {machine_description()}")
    print(f"ex 1.1 (relu(x + w) * 2).sum(-1) on {R} x {C} float32; {a.repeats} fresh processes per case, "
          f"interleaved; seconds, median [95% CI]\n")
    rows = []
    names = {"py": "Python wrapper", "cpp": "C++ wrapper"}
    for (w, m), rs in res.items():
        rows.append((f"{names[w]}, {m}", summarize(rs, "first_call"), summarize(rs, "lower"),
                     summarize(rs, "stax"), summarize(rs, "load"), summarize(rs, "compiler_s"),
                     f"{min(r['compiler_runs'] for r in rs)}..{max(r['compiler_runs'] for r in rs)}",
                     summarize(rs, "import_torch"), summarize(rs, "import_tp")))
    print(format_table(rows, ["case", "first call", "lower", "stax", "load (g++, dlopen)", "compiler",
                              "compiler runs", "import torch", "import tp"]))
    print(f"\nimport sympy after torch (its own process): {summarize(sympy_s, 'sympy')} s "
          f"(part of 'stax' in the first compile of a process)")
    warm_runs = sum(r["compiler_runs"] for w in ("py", "cpp") for r in res[(w, "warm")])
    print(f"compiler runs in warm processes: {warm_runs} (must be 0)")
    if a.verbose:
        for w in ("py", "cpp"):
            print(f"\ncold compiler runs, {names[w]}:")
            for c in res[(w, "cold")][0]["compiler_cmds"]:
                print("  " + c)
    return res


# --------------------------------------------------------------------------------------------
# scheduler sweep: lowering, scheduling and codegen of synthetic graphs, timed apart
# --------------------------------------------------------------------------------------------

def _synthetic(kind: str, n: int):
    """A function whose captured graph has about ``n`` nodes: ``chain`` (pointwise ops, a row
    reduction every fourth step, a matmul every eighth), ``diamond`` (two branches that meet, a
    matmul every other step) or ``residual`` (``x + tanh(norm(x)) @ w``, the norm's mean and variance
    row reductions).  The matmuls are extern kernels, so the graph has many Stax kernels, as a
    real network has."""
    import torch

    import tensorplay as tp
    per = {"chain": 4, "diamond": 6, "residual": 12}[kind]
    steps = max(1, n // per)
    w = tp.from_torch(torch.randn(32, 32, generator=torch.Generator().manual_seed(1)) * 0.1)

    def chain(x):
        for i in range(steps):
            x = tp.relu(x * 1.01 + 0.1) - x.sum(-1, keepdim=True) * 0.01 if i % 4 == 3 else tp.tanh(x * 0.9 + 0.05)
            if i % 8 == 7:
                x = x @ w
        return x

    def diamond(x):
        for i in range(steps):
            x = tp.exp(x * -0.5) * tp.sin(x) + x * 0.5
            if i % 2:
                x = x @ w
        return x

    def residual(x):
        for _ in range(steps):
            m = x.mean(-1, keepdim=True)
            v = ((x - m) * (x - m)).mean(-1, keepdim=True)
            x = x + tp.tanh((x - m) * tp.rsqrt(v + 1e-5)) @ w * 0.1
        return x
    return {"chain": chain, "diamond": diamond, "residual": residual}[kind]


def _stax_phases(f, x) -> dict:
    """Seconds of Stax's lowering, scheduling and codegen (rendering every kernel's source and the
    wrapper) of the graph of ``f(x)``; no compiler runs."""
    import time

    import tensorplay as tp
    from tensorplay.compiler.backends import stax
    from tensorplay.compiler.backends.stax.device import backend_for
    from tensorplay.compiler.backends.stax.lowering import GraphLowering
    from tensorplay.compiler.backends.stax.op_lowerings import V
    from tensorplay.compiler.backends.stax.scheduler import Scheduler
    from tensorplay.compiler.backends.stax.sizevars import use
    t0 = time.perf_counter()
    low = tp.compile(f, strict_native=True).lower(x)
    gm, ex = low.graph_module, low.example_inputs
    t1 = time.perf_counter()
    graph = GraphLowering(gm, ex)
    prev, V.graph = V.graph, graph
    try:
        with use(graph.sizevars):
            graph.run()
            t2 = time.perf_counter()
            sched = Scheduler(graph).fuse()
            t3 = time.perf_counter()
            backend = backend_for(ex)
            backend.prepare_schedule(graph, sched)
            kernels = {}
            for g, plan in stax._plans(sched):
                name = f"kernel{len(kernels)}"
                src, params = backend.render(plan, name)
                kernels[id(g)] = (name, src, params)
            from tensorplay.compiler.backends.stax.codegen.wrapper import generate_wrapper
            generate_wrapper(graph, sched, kernels, backend)
            t4 = time.perf_counter()
    finally:
        V.graph = prev
    return {"nodes": len(gm.graph.nodes), "capture": t1 - t0, "lowering": t2 - t1, "scheduling": t3 - t2,
            "codegen": t4 - t3, "kernels": len(kernels)}


def _exponent(ns, ts) -> float:
    """Least-squares slope of log t over log n."""
    import math
    xs, ys = [math.log(n) for n in ns], [math.log(max(t, 1e-6)) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def sweep(sizes, kinds=("chain", "diamond", "residual")):
    import torch

    import tensorplay as tp
    from tensorplay.utils.benchmark import format_table, machine_description
    os.environ["TP_GRAPH_CACHE"] = "0"
    x = tp.from_torch(torch.randn(8, 32, generator=torch.Generator().manual_seed(0)))
    print(f"machine: {machine_description()}")
    print("Stax's Python pipeline on synthetic graphs (no compiler runs); seconds, one reading each\n")
    rows, fits = [], []
    _stax_phases(_synthetic("chain", 50), x)     # imports (sympy) and first-use caches, not timed
    for kind in kinds:
        rs = [_stax_phases(_synthetic(kind, n), x) for n in sizes]
        for r in rs:
            rows.append((kind, r["nodes"], r["kernels"], f"{r['capture']:.2f}", f"{r['lowering']:.2f}",
                         f"{r['scheduling']:.3f}", f"{r['codegen']:.2f}"))
        ns = [r["nodes"] for r in rs]
        fits.append((kind, *(f"{_exponent(ns, [r[k] for r in rs]):.2f}" for k in ("lowering", "scheduling", "codegen"))))
    print(format_table(rows, ["graph", "nodes", "kernels", "capture", "lowering", "scheduling (fuse)", "codegen"]))
    print("\ngrowth exponent k of t ~ n^k (least squares on log-log):")
    print(format_table(fits, ["graph", "lowering", "scheduling", "codegen"]))
    return rows, fits


# --------------------------------------------------------------------------------------------
# ResNet-18 forward + backward: tp.compile cold vs torch.compile cold, fresh processes
# --------------------------------------------------------------------------------------------

RESNET_CHILD = r"""
import json, os, sys, time
lib, batch, res, prof = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
import torch
torch.manual_seed(0)
if lib == "tp":
    import tensorplay as tp
    nn, F = tp.nn, tp.nn.functional
else:
    nn, F = torch.nn, torch.nn.functional


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        return self.fc(self.avg(self.layers(x)).flatten(1))


model = ResNet18()
xt = torch.randn(batch, 3, res, res)
yt = torch.randint(0, 1000, (batch,))
if lib == "tp":
    x, y = tp.from_torch(xt), tp.from_torch(yt)
    def step(x, y):
        return F.cross_entropy(model(x), y)
    t0 = time.perf_counter()
    cf = tp.compile(step)
    if prof:
        import cProfile, pstats, io
        pr = cProfile.Profile(); pr.enable()
    cf(x, y).backward()
    cf(x, y).backward()
    t1 = time.perf_counter()     # two steps: a step that writes inputs (batch norm's running stats) keeps
    # the capture run's eager outputs, so the forward graph compiles in step 1, the backward in step 2
    if prof:
        pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
        sys.stderr.write(s.getvalue())
else:
    import torch._dynamo
    torch._dynamo.reset()
    def step(x, y):
        return F.cross_entropy(model(x), y)
    t0 = time.perf_counter()
    cf = torch.compile(step)
    cf(xt, yt).backward()
    cf(xt, yt).backward()
    t1 = time.perf_counter()     # (two steps, as tp's)
    stats = {}
steps = [t1 - t0]
for _ in range(2):      # steady steps
    t2 = time.perf_counter()
    (cf(x, y) if lib == "tp" else cf(xt, yt)).backward()
    steps.append(time.perf_counter() - t2)
if lib == "tp":
    from tensorplay.compiler.backends.stax import codecache
    stats = dict(codecache.stats)
print(json.dumps({"steps": steps, "stats": stats}))
"""


def resnet(batch: int, res: int, profile: bool):
    from tensorplay.utils.benchmark import machine_description
    out = {}
    with tempfile.TemporaryDirectory(prefix="tp_resnet_ct_") as tmp:
        for lib in ("tp", "torch"):
            log = Path(tmp) / f"{lib}.compiles.log"
            env = dict(os.environ, TP_CACHE_DIR=str(Path(tmp) / "tp_cache"), TP_COMPILE_LOG=str(log),
                       TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"), TRITON_CACHE_DIR=str(Path(tmp) / "triton"),
                       TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
                       PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            r, err = _child(RESNET_CHILD, [lib, str(batch), str(res), "1" if profile else "0"], env, log, 3600, lib)
            out[lib] = r
            if profile and lib == "tp":
                print(err[-12000:])
    print(f"machine: {machine_description()}")
    print(f"ResNet-18 forward + backward (cross entropy), batch {batch}, {res} x {res}, fresh processes, empty caches")
    print("  cold = the first two training steps (tp compiles the forward graph in the first and the backward")
    print("  graph in the second: batch norm writes its running stats, so step 1 keeps the capture run's eager")
    print("  outputs); then two steady steps")
    for lib, name in (("tp", "tp.compile (Stax)"), ("torch", "torch.compile (inductor)")):
        r = out[lib]
        extra = (f"; {r['compiler_runs']} compiler runs, {r['compiler_s']:.1f} s of compiler time; "
                 f"kernels shared {r['stats'].get('kernels_shared', 0)}" if lib == "tp" else "")
        print(f"  {name}: cold {r['steps'][0]:.1f} s, steady steps {r['steps'][1]:.3f} s, {r['steps'][2]:.3f} s{extra}")
    return out


if __name__ == "__main__":
    if "--sweep" in sys.argv or "--resnet" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--sweep", action="store_true")
        ap.add_argument("--sizes", default="100,300,1000,3000,10000")
        ap.add_argument("--kinds", default="chain,diamond,residual")
        ap.add_argument("--resnet", action="store_true")
        ap.add_argument("--batch", type=int, default=2)
        ap.add_argument("--res", type=int, default=64)
        ap.add_argument("--profile", action="store_true")
        a = ap.parse_args()
        sys.path.insert(0, str(ROOT))
        if a.sweep:
            sweep([int(v) for v in a.sizes.split(",")], a.kinds.split(","))
        if a.resnet:
            resnet(a.batch, a.res, a.profile)
    else:
        main()
