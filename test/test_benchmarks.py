"""Every script in benchmarks/ imports and parses its arguments (``--help``) against this tree:
a module a benchmark imports from may move (a refactor), and the benchmark must move with it.
The training and cold-compile benchmarks also run at quick sizes on the CPU (their smoke tests)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_imports_and_parses_arguments(script):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--help"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout


# ---- smoke runs at quick sizes on the CPU (the --device cuda paths need a GPU: see each script) ----
def _run(args, timeout=240):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _training():
    """benchmarks/training.py as a module (sys.path as it was after the import)."""
    import importlib.util
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("bench_training", os.path.join(ROOT, "benchmarks", "training.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


def test_training_gpt_sizes():
    """The CPU's GPT case keeps the example's default config (batch 16, quick: 1 layer, d 32, batch 4);
    cuda's is GPT-2 small; each size flag overrides one size."""
    training = _training()
    GPTConfig = training.GPTConfig
    cfg, B = training.gpt_sizes("cpu")
    assert (cfg, B) == (GPTConfig(), 16)
    cfg, B = training.gpt_sizes("cpu", quick=True)
    assert (cfg, B) == (GPTConfig(n_layer=1, n_embd=32, n_head=2), 4)
    cfg, B = training.gpt_sizes("cuda")
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, B, cfg.vocab_size) == (12, 768, 12, 1024, 8, 50304)
    cfg, B = training.gpt_sizes("cuda", n_layer=2, batch=1, vocab=None)
    assert (cfg.n_layer, B, cfg.vocab_size, cfg.n_embd) == (2, 1, 50304, 768)


def test_training_quick_cpu_with_inference(tmp_path):
    out = tmp_path / "training.json"
    r = _run(["benchmarks/training.py", "--quick", "--cases", "gpt", "--no-torch-compile", "--repeats", "3",
              "--warmup", "1", "--inference", "--json", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Paired per-round ratios" in r.stdout and "loss at the initial weights" in r.stdout
    doc = json.loads(out.read_text())
    t = doc["training"]["gpt"]
    assert t["compiled"] == "tp compiled"            # strict_native=True holds for the quick GPT on the CPU
    assert set(t["readings_ms"]) == {"tp eager", "tp compiled", "torch eager"}
    assert "tp eager / tp compiled" in t["paired"]
    inf = doc["inference"]
    assert set(inf["readings_ms"]) == {"tp eager", "tp.compile", "tp.compile [reduce-overhead]", "torch eager"}
    assert "tp eager / tp.compile [reduce-overhead]" in inf["paired"]


def test_training_quick_cpu_bf16_and_size_flags():
    r = _run(["benchmarks/training.py", "--quick", "--cases", "gpt", "--no-torch-compile", "--repeats", "2",
              "--warmup", "1", "--dtype", "bf16", "--n-layer", "2", "--batch", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "GPT 2 layers, d_model 32, 2 heads, T 32, batch 2, vocab 64, bf16 on cpu" in r.stdout
    assert "(fallback)" in r.stdout       # no bfloat16 kernels on the CPU: the compiled step falls back


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize("script", ["training.py", "compile_cold.py"])
def test_device_cuda_without_cuda_is_a_usage_error(script):
    r = _run([f"benchmarks/{script}", "--device", "cuda", "--quick"], timeout=120)
    assert r.returncode == 2 and "torch.cuda.is_available() is False" in r.stderr


def test_compile_cold_quick_cpu(tmp_path):
    out, keep = tmp_path / "cold.json", tmp_path / "kept"
    args = ["benchmarks/compile_cold.py", "--quick", "--no-torch-compile", "--n-layer", "1", "--n-embd", "16",
            "--n-head", "2", "--block-size", "8", "--batch", "2", "--vocab", "32", "--keep-tp-cache", str(keep)]
    r = _run(args + ["--json", str(out)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert any(keep.iterdir())                      # the tp cache of repeat 1 is left filled ...
    again = _run(args, timeout=120)                 # ... and is not a cold cache any more
    assert again.returncode == 2 and "not empty" in again.stderr
    assert "target tp warm first step <= 2 s" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["gpt"] == "GPT 1 layers, d_model 16, 2 heads, T 8, batch 2, vocab 32, fp32"
    cold, warm = doc["readings"]["tp cold"][0], doc["readings"]["tp warm"][0]
    for rd in (cold, warm):
        assert rd["gpt"] == doc["gpt"] and rd["first"] > 0 and rd["second"] > 0 and rd["wall"] > rd["first"]
    assert cold["stats"]["graph_hits"] == 0 and cold["compiler_runs"] > 0
    assert warm["stats"]["graph_hits"] > 0 and warm["compiler_runs"] == 0    # warm: no g++, wrappers from the cache
    assert abs(cold["loss"] - warm["loss"]) < 1e-6
