"""Regressions of the ``tp.compile`` front end (api.py, specialize/, capture/, aot/).

Each test judges a compiled call after the capture run (the first call returns eager values) and
compares it with a torch / float64 reference on random inputs.
"""
import warnings

import pytest
import torch

import tensorplay as tp
from stax.conftest import stax_cache  # noqa: F401  (the fixture, for the Stax-compiled tests here)

pytestmark = pytest.mark.usefixtures("stax_cache")


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype))


def assert_equal(got, want):
    g = got._data if isinstance(got, tp.Tensor) else got
    w = want._data if isinstance(want, tp.Tensor) else want
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    torch.testing.assert_close(g, w, rtol=0, atol=0)


# ---- bug 2: metadata changed under the first-level entry (x.data = ...) -----------------------------
@pytest.mark.parametrize("backend", ["stax", "eager"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.float16])
def test_first_level_sees_dtype_change(backend, dtype):
    f = tp.compile(lambda x: x * 2, backend=backend)
    x = rnd(4)
    for _ in range(3):
        assert_equal(f(x), x._data * 2)
    new = torch.randint(-50, 50, (4,)).to(dtype) if not dtype.is_floating_point else \
        torch.randn(4, dtype=torch.float64).to(dtype)
    x.data = tp.from_torch(new)
    for _ in range(3):                       # capture run, then compiled calls
        assert_equal(f(x), new * 2)
    assert f.counters["captures"] == 2


@pytest.mark.parametrize("change", ["transpose", "strided", "offset", "shape_same_numel"])
def test_first_level_sees_layout_change(change):
    f = tp.compile(lambda x: x * 2 + 1)
    base = torch.randn(5, 8, dtype=torch.float64).float()
    x = tp.from_torch(base[:4, :4].contiguous())
    for _ in range(2):
        assert_equal(f(x), x._data * 2 + 1)
    new = {"transpose": base[:4, :4].t(), "strided": base[1:5, 4:8], "offset": base.flatten()[3:19].view(4, 4),
           "shape_same_numel": base.flatten()[:16].reshape(2, 8)}[change]
    x.data = tp.from_torch(new)
    for _ in range(3):
        assert_equal(f(x), new * 2 + 1)


def test_first_level_sees_free_tensor_data_change():
    w = rnd(4, seed=1)

    def f(x):
        return x * w

    cf = tp.compile(f)
    x = rnd(4, seed=2)
    for _ in range(2):
        assert_equal(cf(x), x._data * w._data)
    w.data = tp.from_torch(torch.randn(4, dtype=torch.float64))
    for _ in range(3):
        assert_equal(cf(x), x._data.double() * w._data)


def test_first_level_sees_requires_grad_change():
    f = tp.compile(lambda x: (x * x).sum())
    xt = torch.randn(6)
    x = tp.from_torch(xt.clone())
    for _ in range(2):
        assert not f(x).requires_grad
    x.requires_grad_(True)
    for _ in range(2):                       # capture run, then the compiled training region
        x.grad = None
        y = f(x)
        assert y.requires_grad
        y.backward()
        torch.testing.assert_close(x.grad._data, 2 * xt)

    g = tp.compile(lambda x, w: (x * w).sum())
    w = tp.from_torch(torch.randn(6))
    for _ in range(2):
        g(x, w)
    w.requires_grad_(True)
    for _ in range(2):
        w.grad = None
        g(x, w).backward()
        torch.testing.assert_close(w.grad._data, xt)
