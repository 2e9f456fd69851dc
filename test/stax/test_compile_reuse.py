"""Stax: identical kernels of one graph are defined, built and loaded once (reuse.py).

An unrolled recurrent loop and a stack of identical layers give kernels that differ only in buffer
names; each distinct kernel must cost one source in the wrapper and one g++ run (the profiler's
``g++ kernel...`` spans, one per compiler run), and the shared kernel, called with each step's
buffers, must give eager's values.  Kernels that differ in anything but names (a constant, a
shape) stay apart.  Each test compiles into an empty cache so that every distinct kernel is built.
"""
import re

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.compiler.backends.stax import codecache
from tensorplay.compiler.backends.stax.reuse import KernelTable, canonical_kernel
from tensorplay.profiler import ProfilerActivity, profile


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path / "cache"))
    codecache.clear_memo()      # forget the libraries this process loaded: every kernel is built
    yield
    codecache.clear_memo()


def _kernel_builds(prof):
    """The profiled g++ runs that built kernels (``g++ kernelN``; the C++ wrapper's translation
    unit: ``g++ stax_entry0``), not the call extension's."""
    return [s.name for s in prof.events() if s.cat == "compile" and re.fullmatch(r"g\+\+ (kernel|stax_entry)\d+", s.name)]


def _compile_and_profile(f, *args, **options):
    """(second call's result, kernel g++ runs, kernels shared) of ``tp.compile(f)``."""
    shared = codecache.stats["kernels_shared"]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cf = tp.compile(f, strict_native=True, options=options)
        cf(*args)
        out = cf(*args)
    return out, _kernel_builds(prof), codecache.stats["kernels_shared"] - shared


def _rnn(steps, W, b, scale=None):
    def f(x, h):
        for i in range(steps):
            h = tp.tanh(x + tp.matmul(h, W) + b) * (0.5 if scale is None else scale[i])
        return h
    return f


def _rnn_ref(steps, x, h, W, b, scale=None):
    for i in range(steps):
        h = torch.tanh(x + h @ W + b) * (0.5 if scale is None else scale[i])
    return h


def _data():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g) for s in ((8, 24), (8, 24), (24, 24), (24,))]


@pytest.mark.parametrize("cpp_wrapper", [False, True])
def test_unrolled_steps_build_one_kernel(empty_cache, cpp_wrapper):
    x, h, W, b = _data()
    f = _rnn(6, tp.from_torch(W), tp.from_torch(b))
    out, runs, shared = _compile_and_profile(f, tp.from_torch(x), tp.from_torch(h), **{"stax.cpp_wrapper": cpp_wrapper})
    torch.testing.assert_close(out._data, _rnn_ref(6, x, h, W, b), rtol=1e-5, atol=1e-6)
    assert shared == 5          # steps 2..6 reuse step 1's kernel (matmuls between them are extern)
    assert len(runs) == 1, runs  # one source, one g++ run (the Python wrapper: one library per kernel)
    art = tp.compile(f, strict_native=True, options={"stax.cpp_wrapper": cpp_wrapper}).lower(
        tp.from_torch(x), tp.from_torch(h)).compile()
    text = art.as_text()
    assert "kernel1" not in text
    if cpp_wrapper:              # one translation unit anyway: the kernel is in it once
        assert text.count("static void kernel") == 1
        assert text.count("    kernel0(static_cast") == 6      # the entries call it once per step
    else:                        # one definition, six calls
        assert text.count("async_compile.cpp(") == 1
        assert text.split("def call(args):")[1].count("    kernel0(") == 6


@pytest.mark.slow
def test_steps_that_differ_in_a_constant_stay_apart(empty_cache, monkeypatch):
    monkeypatch.setenv("TP_COMPILE_THREADS", "4")     # more workers than kernels: one g++ run each
    x, h, W, b = _data()
    scale = [0.5, 0.25, 0.5, 0.75]      # steps 1 and 3 are the same kernel, 2 and 4 are not
    f = _rnn(4, tp.from_torch(W), tp.from_torch(b), scale)
    out, runs, shared = _compile_and_profile(f, tp.from_torch(x), tp.from_torch(h))
    torch.testing.assert_close(out._data, _rnn_ref(4, x, h, W, b, scale), rtol=1e-5, atol=1e-6)
    assert shared == 1 and len(runs) == 3, runs


@pytest.mark.slow
def test_repeated_layers_share_kernels_forward_and_backward(empty_cache):
    torch.manual_seed(1)
    layers = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.GELU())
              for _ in range(4)]
    ours = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()) for _ in range(4)])
    ours.load_state_dict({k: tp.from_torch(v.detach().clone()) for k, v in
                          torch.nn.Sequential(*layers).state_dict().items()})
    xt = torch.randn(16, 32)
    ref = torch.nn.Sequential(*layers)(xt)
    ref.square().sum().backward()

    def loss(x):
        return ours(x).square().sum()
    shared = codecache.stats["kernels_shared"]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cf = tp.compile(loss, strict_native=True)
        cf(tp.from_torch(xt)).backward()
        for p in ours.parameters():
            p.grad = None
        cf(tp.from_torch(xt)).backward()
    runs = _kernel_builds(prof)
    assert codecache.stats["kernels_shared"] - shared >= 6       # 3 of 4 layers, forward and backward
    built = len(runs)
    for (name, p), (_, q) in zip(ours.named_parameters(), torch.nn.Sequential(*layers).named_parameters()):
        torch.testing.assert_close(p.grad._data, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert built <= 8, runs     # forward and backward: a handful of distinct kernels, not 4 of each


def test_canonical_kernel_renames_consistently():
    a = 'extern "C" void kernel0(const float* arg0, float* buf3) { float acc_buf3_0 = arg0[0]; buf3[0] = acc_buf3_0; }'
    b = 'extern "C" void kernel4(const float* buf7, float* buf9) { float acc_buf9_0 = buf7[0]; buf9[0] = acc_buf9_0; }'
    c = 'extern "C" void kernel4(const float* buf7, float* buf9) { float acc_buf9_0 = buf7[1]; buf9[0] = acc_buf9_0; }'
    assert canonical_kernel(a, ["kernel0", "arg0", "buf3"]) == canonical_kernel(b, ["kernel4", "buf7", "buf9"])
    assert canonical_kernel(a, ["kernel0", "arg0", "buf3"]) != canonical_kernel(c, ["kernel4", "buf7", "buf9"])
    # a longer name is not split: buf31 is not buf3 followed by 1
    assert "buf31" in canonical_kernel("buf31 + buf3", ["buf3"])
    t = KernelTable()
    assert t.add("kernel0", a, {"arg0": 0, "buf3": 0}) == ("kernel0", a)
    assert t.add("kernel4", b, {"buf7": 0, "buf9": 0}) == ("kernel0", a) and t.shared == 1
    assert t.add("kernel5", c, {"buf7": 0, "buf9": 0}) == ("kernel5", c) and t.shared == 1


def test_distinct_kernels_build_as_one_unit_per_worker(empty_cache, monkeypatch):
    """More kernels than pool workers: one translation unit (one g++ run) per worker."""
    monkeypatch.setenv("TP_COMPILE_THREADS", "2")
    x, h, W, b = _data()
    scale = [0.5, 0.25, 0.75, 1.5, 1.25]      # five distinct kernels
    f = _rnn(5, tp.from_torch(W), tp.from_torch(b), scale)
    out, runs, shared = _compile_and_profile(f, tp.from_torch(x), tp.from_torch(h))
    torch.testing.assert_close(out._data, _rnn_ref(5, x, h, W, b, scale), rtol=1e-5, atol=1e-6)
    assert shared == 0 and len(runs) == 2, runs


def _entry_kernel(name, k):
    from tensorplay.compiler.backends.stax.cpp.wrapper import kernel_entry
    body = "nope();" if k is None else f"for (int i = 0; i < 4; ++i) y[i] = x[i] * {k}.0f;"
    params = {"x": ("float", False), "y": ("float", True)}
    return (f'#include "stax_kernel.h"\nextern "C" void {name}(const float* __restrict__ x, float* __restrict__ y) '
            f'{{ {body} }}\n' + kernel_entry(name, params))


def test_a_failing_unit_is_rebuilt_kernel_by_kernel(empty_cache, monkeypatch):
    from tensorplay.compiler.backends.stax.cpp import async_compile as ac
    from tensorplay.compiler.backends.stax.cpp.build import CppCompileError
    monkeypatch.setenv("TP_COMPILE_THREADS", "1")
    a = ac.AsyncCompile()
    scope = {f"ku{i}": a.cpp(_entry_kernel(f"ku{i}", None if i == 1 else i + 2), f"ku{i}", entry=f"ku{i}_entry")
             for i in range(3)}
    with pytest.raises(CppCompileError, match="kernel 'ku1'") as ei:
        a.wait(scope)
    assert "nope" in str(ei.value)
    xt, yt = torch.randn(4), torch.zeros(4)
    for i in (0, 2):        # the good kernels, each built alone after the unit failed
        scope[f"ku{i}"](xt.data_ptr(), yt.data_ptr())
        assert torch.equal(yt, xt * (i + 2))


def test_a_held_kernel_called_before_wait_is_built(empty_cache, monkeypatch):
    from tensorplay.compiler.backends.stax.cpp import async_compile as ac
    monkeypatch.setenv("TP_COMPILE_THREADS", "1")
    a = ac.AsyncCompile()
    phs = [a.cpp(_entry_kernel(f"kh{i}", i + 1), f"kh{i}", entry=f"kh{i}_entry") for i in range(3)]
    xt, yt = torch.randn(4), torch.zeros(4)
    phs[2](xt.data_ptr(), yt.data_ptr())         # flushes the batch (one unit of three kernels)
    assert torch.equal(yt, xt * 3)
    assert all(p.done() for p in phs)
