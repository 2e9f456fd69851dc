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
    p = subprocess.run([sys.executable, "-c", CHILD, str(R), str(C), wrapper], env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({wrapper}):\n{p.stderr}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    runs = log.read_text().splitlines() if log.exists() else []
    r["compiler_runs"] = len(runs)
    r["compiler_s"] = sum(float(ln.split(" ", 2)[1]) for ln in runs)
    r["compiler_cmds"] = [ln.split(" ", 2)[2] for ln in runs]
    return r


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


if __name__ == "__main__":
    main()
