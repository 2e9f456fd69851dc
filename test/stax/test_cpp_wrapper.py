"""The C++ wrapper (option ``stax.cpp_wrapper``, cpp/wrapper.py).

Each graph is compiled twice, with the Python wrapper and with the C++ wrapper (staged API: the
artifacts run directly, never the capture), and the results must be equal bit for bit; both are
also checked against torch.  The C++ wrapper must make one foreign call per segment of kernels
(one per call for a graph without extern kernels), recompile on guard misses like the Python
wrapper, and a new process with a warm cache must not run the compiler.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler.backends.stax import codecache
from tensorplay.compiler.backends.stax.cpp import build
from tensorplay.compiler.backends.stax.cpp import call as cpp_call


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py

CPP = {"stax.cpp_wrapper": True}


def _bits(t):
    """A tensor's bits as an integer tensor (so that NaN == NaN and -0 != +0)."""
    view = {torch.float32: torch.int32, torch.float64: torch.int64}.get(t.dtype)
    return t.contiguous().view(view) if view is not None else t


def _outs(o):
    return [x._data for x in (o if isinstance(o, tuple) else (o,))]


def both(f, *args, strict=True, n_calls=1):
    """Compile ``f`` with both wrappers; check bit equality and torch; returns the C++ artifact."""
    arts = {}
    for name, opts in (("py", {}), ("cpp", CPP)):
        cf = tp.compile(f, strict_native=strict, options=opts)
        arts[name] = cf.lower(*args).compile()
    assert "stax_entry0" in arts["cpp"].as_text() or "graph_lib" not in arts["cpp"].as_text()
    ref = _outs(f(*[tp.from_torch(a._data.clone()) for a in args]))
    for _ in range(n_calls):
        py, cpp = _outs(arts["py"](*args)), _outs(arts["cpp"](*args))
        assert len(py) == len(cpp) == len(ref)
        for p, c, r in zip(py, cpp, ref):
            assert c.shape == p.shape == r.shape and c.dtype == p.dtype == r.dtype
            assert c.stride() == p.stride()
            assert torch.equal(_bits(c), _bits(p)), (c, p)
            if c.dtype.is_floating_point:
                torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5, equal_nan=True)
            else:
                assert torch.equal(c, r)
    return arts["cpp"]


def count_foreign_calls(artifact, *args):
    """Run the compiled artifact once and count its calls through the C++ entries."""
    mod = artifact.artifact.module
    orig, n = mod._call, [0]

    def counting(*a):
        n[0] += 1
        return orig(*a)
    mod._call = counting
    try:
        artifact(*args)
    finally:
        mod._call = orig
    return n[0]


def T(*shape, dtype=torch.float32):
    if dtype == torch.bool:
        return tp.from_torch(torch.rand(*shape) > 0.5)
    if not dtype.is_floating_point:
        return tp.from_torch(torch.randint(-50, 50, shape, dtype=dtype))
    return tp.from_torch(torch.randn(*shape, dtype=dtype))


def test_single_kernel_one_foreign_call():
    x = T(13, 7)
    art = both(lambda x: x * 2 + 1, x, n_calls=2)
    src = art.as_text()
    assert src.count("stax_entry") == 2 and "static void kernel0(" in src
    assert count_foreign_calls(art, x) == 1


def test_transposed_input_and_special_values():
    x = torch.randn(9, 5)
    x[0, :] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    both(lambda x, y: (x * y).exp() - y, tp.from_torch(x.t()), T(5, 9))


def test_multi_kernel_with_reused_buffers():
    def f(x):   # row and column reductions in turn: several kernels, a dead (1, 33) buffer reused
        a = x.sum(1, keepdim=True) + x
        b = a / a.sum(0, keepdim=True)
        c = b.exp() / b.exp().sum(1, keepdim=True)
        return c / c.sum(0, keepdim=True)
    x = T(6, 33)
    art = both(f, x, n_calls=2)
    src = art.as_text()
    assert src.count("static void kernel") >= 3, src
    assert "# reuse" in src, src
    assert count_foreign_calls(art, x) == 1


def test_multiple_outputs_and_dtypes():
    def f(x, y, i, b):
        return x + 1, (x * y).sum(0), (i * 3 - 1), (x > y) & b, x.amax(-1)
    both(f, T(4, 10), T(4, 10), T(4, 10, dtype=torch.int64), T(4, 10, dtype=torch.bool))


def test_float64_and_int32():
    both(lambda x, i: (x * 0.5 + 1, i * i), T(3, 17, dtype=torch.float64), T(3, 17, dtype=torch.int32))


def test_views_as_outputs():
    def f(x):
        y = x * 2 + 1
        return y.t(), y[1:], y.reshape(-1), y
    both(f, T(5, 6), n_calls=2)


def test_extern_kernel_splits_the_entry():
    def f(x, w):
        return ((x * 2) @ w).relu() + 1
    x, w = T(8, 16), T(16, 4)
    art = both(f, x, w, strict=False, n_calls=2)
    src = art.as_text()
    assert "extern kernel" in src or "FALLBACK" in src, src
    n = src.count('extern "C" void stax_entry')
    assert n == 2, src
    assert count_foreign_calls(art, x, w) == n


def test_size_zero_and_one():
    both(lambda a, b, c, d, e: (a * 2 + 1, b.sum(-1) + 1, c.sum(-1), (d - e).abs().sum()),
         T(0), T(0, 5), T(3, 0), T(1, 1), T(1))


def test_input_mutation_written_back():
    def f(x, y):
        x.mul_(2)
        return x + y
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    res = {}
    for name, opts in (("py", {}), ("cpp", CPP)):
        art = tp.compile(f, strict_native=True, options=opts).lower(
            tp.from_torch(x.clone()), tp.from_torch(y)).compile()   # lower runs f once: a throwaway x
        xa = tp.from_torch(x.clone())
        res[name] = (art(xa, tp.from_torch(y))._data, xa._data)
    for a, b, r in zip(res["py"], res["cpp"], (x * 2 + y, x * 2)):
        assert torch.equal(_bits(a), _bits(b))
        torch.testing.assert_close(b, r, rtol=0, atol=0)


def test_kernel_errors_are_raised():
    """A kernel's run-time error (integer division by zero, index out of range) is raised by the
    C++ wrapper like by the Python wrapper."""
    i, j = T(6, dtype=torch.int64), tp.from_torch(torch.tensor([3, -2, 5, 7, 1, 4]))
    art = both(lambda a, b: (a // b, a * 2), i, j)
    with pytest.raises(ZeroDivisionError, match="floor_divide|ZeroDivisionError"):
        art(i, tp.from_torch(torch.tensor([3, 0, 5, 7, 1, 4])))
    x, idx = T(5, 3), tp.from_torch(torch.tensor([4, 0, 2]))
    art = both(lambda x, k: tp.index_select(x, 0, k) + 1, x, idx)
    with pytest.raises(IndexError, match="out of bounds"):
        art(x, tp.from_torch(torch.tensor([4, 5, 2])))


def test_guard_misses_recompile():
    cf = tp.compile(lambda x: x * 3 - 1, strict_native=True, options=CPP, dynamic=False)   # static guards
    for x in (torch.randn(4, 5), torch.randn(6, 5), torch.randn(5, 4).t(), torch.randn(4, 5)):
        for _ in range(2):
            out = cf(tp.from_torch(x))
            torch.testing.assert_close(out._data, x * 3 - 1, rtol=0, atol=0)
    assert cf.counters["captures"] == 3
    assert all("stax_entry0" in e.artifact.source for e in cf._cache)
    with pytest.raises(tp.compiler.api.GuardError):
        cf.lower(tp.from_torch(torch.randn(4, 5))).compile()(tp.from_torch(torch.randn(2, 5)))


def test_ctypes_fallback_matches(monkeypatch):
    """Without the call extension, ctypes calls the same entry (and gives the same bits)."""
    monkeypatch.setattr(cpp_call, "_ext_state", {"call": None})
    art = both(lambda x: (x - 1) * x, T(7, 3))   # a graph no other test loads (modules are memoised)
    assert art.artifact.module._call is cpp_call._ctypes_call


def _ex11(x, w):
    return (tp.relu(x + w) * 2).sum(-1)


_CHILD = textwrap.dedent("""
    import json, sys, torch
    import tensorplay as tp
    from tensorplay.compiler.backends.stax import codecache
    x, w = tp.from_torch(torch.randn(64, 32)), tp.from_torch(torch.randn(64, 32))
    def _ex11(x, w):
        return (tp.relu(x + w) * 2).sum(-1)
    cf = tp.compile(_ex11, strict_native=True, options={"stax.cpp_wrapper": True})
    cf(x, w)
    out = cf(x, w)
    ok = torch.allclose(out._data, (torch.relu(x._data + w._data) * 2).sum(-1), rtol=1e-5, atol=1e-5)
    print(json.dumps({"ok": ok, "stats": codecache.stats, "sympy": "sympy" in sys.modules}))
""")


def test_warm_cache_new_process_runs_no_compiler(tmp_path):
    """Warm the cache here (same graph as the child), then a new process must run no compiler:
    every compiler run, build or probe, would append a line to $TP_COMPILE_LOG."""
    import json
    x, w = T(64, 32), T(64, 32)
    both(_ex11, x, w)
    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "compiles.log"
    env = dict(os.environ, PYTHONPATH=str(root), TP_COMPILE_LOG=str(log))
    warm = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    r = json.loads(warm.stdout.strip().splitlines()[-1])
    assert not log.exists() or log.read_text() == "", log.read_text()
    assert r["ok"] and r["stats"]["compiler_runs"] == 0 and r["stats"]["builds"] == 0
    assert r["stats"]["build_hits"] >= 2   # the graph's library and the call extension
    assert r["stats"]["graph_hits"] == 1 and not r["sympy"]   # no lowering, no sympy import
    assert not log.exists() or log.read_text() == "", log.read_text()


def test_graph_cache_key_and_knobs(monkeypatch, config_patch):
    from tensorplay.compiler.backends.stax import choices
    cap = tp.compile(lambda x: x * 2 + 1).lower(T(4, 5))
    gm, ex = cap.graph_module, cap.example_inputs
    k = codecache.graph_key(gm, ex)
    assert k == codecache.graph_key(gm, [tp.from_torch(torch.randn(4, 5))])      # values: no
    assert k != codecache.graph_key(gm, [tp.from_torch(torch.randn(5, 4).t())])  # strides: yes
    assert k != codecache.graph_key(gm, ex, cpp_wrapper=True)
    codecache.save_graph(k, {"source": "# test"})
    assert codecache.load_graph(k)["source"] == "# test"
    config_patch("stax.max_inline_ops", choices.MAX_INLINE_OPS + 1)   # a patched knob: a miss
    assert codecache.load_graph(k) is None
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    assert codecache.graph_key(gm, ex) is None


def test_compile_log_records_compiler_runs(tmp_path, monkeypatch):
    log = tmp_path / "log"
    monkeypatch.setenv("TP_COMPILE_LOG", str(log))
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path / "c"))
    codecache.clear_memo()
    before = codecache.stats["compiler_runs"]
    build.load_cpp('extern "C" void tp_log_probe(float* x) { x[0] += 1.0f; }', "scalar")
    lines = log.read_text().splitlines()
    assert codecache.stats["compiler_runs"] - before == len(lines) >= 1
    assert any("-shared" in ln for ln in lines)
