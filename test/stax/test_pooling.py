"""Stax on CPU: pooling and nearest upsampling, forward and backward, against eager.

These lowerings are exact: they make eager's additions and comparisons in eager's order (the max
pooling scan, window sums from +0, the scatter loops of the backward ops read as gathers), so
values are compared bitwise -- NaN positions and payload-free NaN equality, the sign of zero and
the argmax indices included.  Shapes, strides, paddings, ceil_mode and dilation vary; where a case
is an extern kernel (ATen) on purpose (measured faster), strict_native still accepts it.
"""
import itertools

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.ops.registry import OPS

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py

aten = torch.ops.aten


def _data(t):
    return t._data if isinstance(t, tp.Tensor) else t


def _same(got, want):
    """Bitwise equal up to NaN payloads: same NaN positions, same values and signs of zero."""
    got, want = _data(got), _data(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    if not want.dtype.is_floating_point:
        assert torch.equal(got, want)
        return
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN positions differ"
    assert torch.equal(got[~nan], want[~nan]), f"max diff {(got[~nan] - want[~nan]).abs().max().item()}"
    assert torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan])), "signs of zero differ"


def _special(shape, dtype=torch.float32, seed=0):
    """Random values with two NaNs in one window, a block of -inf and a run of ±0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = float("nan")
    x[-1, -1, :3, :3] = float("-inf")
    x[0, 1, 2, 2], x[0, 1, 2, 3], x[0, 1, 3, 2] = 0.0, -0.0, -0.0
    x[0, 1, 4, :] = -0.0
    return x


def _kernel_count(cf):
    return cf._cache[0].artifact.source.count("async_compile.cpp(")


# ---- max pooling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,s,p,d,ceil", [(2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True),
                                          ((3, 2), (1, 2), (1, 0), 1, False), (3, 2, 1, 2, True), (2, 1, 1, 2, False),
                                          (6, 3, 2, 1, True), ((6, 5), 2, 0, 1, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_pool2d_values_and_indices_are_eagers(k, s, p, d, ceil, dtype):
    """Eager's scan: a position wins if greater than the best so far or NaN -- the first of equal
    maxima, the last NaN, ±0 as scanned, a window of -inf at its first position inside the input.
    Windows of up to 25 elements are unrolled, larger ones (k = 6) are two reduction phases."""
    x = _special((2, 3, 11, 9), dtype)
    px = tp.from_torch(x.clone())
    want = torch.nn.functional.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    cf = tp.compile(lambda a: F.max_pool2d(a, k, s, p, d, ceil, return_indices=True), strict_native=True)
    for _ in range(2):                       # capture, then the artifact
        got = cf(px)
        _same(got[0], want[0])
        _same(got[1], want[1])
    # the values alone, a 3-d input, with a producer and a consumer: one kernel for the small windows
    # (a large one may read each input so often that the producer is written once instead:
    # choices.realize_reread)
    cf = tp.compile(lambda a: F.max_pool2d(tp.relu(a[0] * 2), k, s, p, d, ceil) + 1, strict_native=True)
    _same(cf(px), torch.nn.functional.max_pool2d((x[0] * 2).relu(), k, s, p, d, ceil) + 1)
    kk = (k, k) if isinstance(k, int) else k
    assert _kernel_count(cf) == 1 or kk[0] * kk[1] > 9


@pytest.mark.parametrize("out", [1, (2, 3), (11, 9), (3, 4)])
def test_adaptive_max_pool2d(out):
    """Equal bins are max_pool2d with kernel = stride; unequal ones (3, 4 of 11 x 9) are an extern."""
    x = _special((2, 3, 11, 9))
    want = torch.nn.functional.adaptive_max_pool2d(x, out, return_indices=True)
    got = tp.compile(lambda a: F.adaptive_max_pool2d(a, out, return_indices=True),
                     strict_native=True)(tp.from_torch(x))
    _same(got[0], want[0])
    _same(got[1], want[1])


# ---- average pooling -----------------------------------------------------------------------------------
def test_avg_pool2d_sums_in_eagers_order_from_plus_zero():
    x = -torch.zeros(2, 3, 6, 6)
    x[1] = _special((2, 3, 6, 6))[0]
    for k, s, p in [(2, 2, 0), (3, 1, 1), (3, 2, 1)]:
        got = tp.compile(lambda a: F.avg_pool2d(a, k, s, p), strict_native=True)(tp.from_torch(x))
        _same(got, torch.nn.functional.avg_pool2d(x, k, s, p))


@pytest.mark.parametrize("hw,out", [((14, 14), 7), ((14, 14), 1), ((12, 9), (4, 3)), ((14, 14), 5), ((7, 9), (3, 2))])
def test_adaptive_avg_pool2d_exact(hw, out):
    """Equal bins: the window sum divided by the bin's height, then its width (eager's rounding);
    bins of unequal extent are an extern kernel."""
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    got = tp.compile(lambda a: F.adaptive_avg_pool2d(a, out), strict_native=True)(tp.from_torch(x))
    _same(got, torch.nn.functional.adaptive_avg_pool2d(x, out))


# ---- nearest upsampling --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(scale_factor=3), dict(scale_factor=1.5),
                                dict(size=(13, 17)), dict(size=(16, 16)), dict(scale_factor=0.5),
                                dict(scale_factor=(2.5, 1.3)), dict(size=(21, 20)), dict(size=(7, 111))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_upsample_nearest2d_reads_eagers_rows(kw, dtype):
    """Eager picks row min(floor(float32(o) * s), n - 1); the kernel reads floor(o*p/q) when that
    table equals eager's (else an extern: 9 -> 111 columns has no such form); its own rows are never
    a guess."""
    x = (torch.randn(2, 3, 7, 9).abs() * 100).to(dtype)
    want = torch.nn.functional.interpolate(x, mode="nearest", **kw)
    cf = tp.compile(lambda a: F.interpolate(a * 2, mode="nearest", **kw), strict_native=True)
    _same(cf(tp.from_torch(x)), torch.nn.functional.interpolate(x * 2, mode="nearest", **kw))
    assert want.shape == cf(tp.from_torch(x)).shape


def test_upsample_nearest_1d_and_the_lane_pattern_load():
    """2x upsampling of the last dim reads floor(o/2): a vector is one load and a lane permute
    (codegen _lane_pattern); every length from 1 to 40 covers full vectors and tails."""
    for n in [1, 3, 8, 15, 16, 17, 40]:
        for dtype in (torch.float32, torch.float64):
            x = (torch.randn(3, 2, n) * 50).to(dtype)
            cf = tp.compile(lambda a: F.interpolate(a, scale_factor=2, mode="nearest") + 1, strict_native=True)
            _same(cf(tp.from_torch(x)), torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest") + 1)
    cf = tp.compile(lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), strict_native=True)
    cf(tp.from_torch(torch.randn(2, 3, 40, 40)))
    assert "tp_pattern_load<float, 0, 0, 1, 1, 2, 2," in cf._cache[0].artifact.source


def test_repeat_and_tile_patterns_of_the_vector_variable():
    """The lane pattern load also serves repeat-interleaving (floor(o/q)) and tiling (Mod(o, q)), for
    4- and 8-byte elements (one or two permutes per vector)."""
    for n, dtype in [(4, torch.float32), (13, torch.float32), (5, torch.int32), (8, torch.int64), (13, torch.float64)]:
        x = (torch.randn(6, n) * 100).to(dtype)
        cf = tp.compile(lambda a: (a[:, :, None].expand(6, n, 4).reshape(6, 4 * n) * 2, a.repeat(1, 8) - 1),
                        strict_native=True)
        got = cf(tp.from_torch(x))
        _same(got[0], x.repeat_interleave(4, dim=1) * 2)
        _same(got[1], x.repeat(1, 8) - 1)


# ---- backward ops (the scatter loops of eager read as gathers) ------------------------------------------
@pytest.mark.parametrize("k,s,p,ceil,cip,div", [(3, 1, 1, False, True, None), (3, 1, 1, True, False, None),
                                                 (2, 1, 0, False, True, 3), (3, 2, 1, True, True, None),
                                                 (2, 2, 0, False, True, None)])
def test_avg_pool2d_backward_exact(k, s, p, ceil, cip, div):
    x = torch.randn(2, 3, 8, 7, dtype=torch.float64)
    g = torch.randn_like(torch.nn.functional.avg_pool2d(x, k, s, p, ceil, cip, div))
    want = aten.avg_pool2d_backward(g, x, [k, k], [s, s], [p, p], ceil, cip, div)
    cf = tp.compile(lambda a: OPS["avg_pool2d_backward"].fn(a, list(x.shape), [k, k], [s, s], [p, p], ceil, cip,
                                                            div), strict_native=True)
    _same(cf(tp.from_torch(g)), want)


@pytest.mark.parametrize("shape,kw", [((7, 9), dict(scale_factor=2)), ((7, 9), dict(scale_factor=(3, 2))),
                                      ((7, 9), dict(size=(13, 17))), ((8, 8), dict(scale_factor=0.5))])
def test_upsample_nearest2d_backward_exact(shape, kw):
    x = torch.randn(2, 3, *shape, dtype=torch.float64, requires_grad=True)
    o = torch.nn.functional.interpolate(x, mode="nearest", **kw)
    g = torch.randn_like(o)
    want, = torch.autograd.grad(o, x, g)
    sc = kw.get("scale_factor")
    scales = list(sc) if isinstance(sc, tuple) else [sc, sc]
    cf = tp.compile(lambda a: OPS["upsample_nearest2d_backward"].fn(a, list(o.shape[-2:]), list(x.shape), *scales),
                    strict_native=True)
    _same(cf(tp.from_torch(g)), want)


def test_adaptive_avg_pool2d_backward_exact():
    for hw, out in [((8, 8), (2, 2)), ((12, 9), (4, 3)), ((7, 7), (3, 3))]:
        g = torch.randn(2, 3, *out, dtype=torch.float64)
        want = aten._adaptive_avg_pool2d_backward(g, torch.empty(2, 3, *hw, dtype=torch.float64))
        cf = tp.compile(lambda a: OPS["adaptive_avg_pool2d_backward"].fn(a, [2, 3, *hw]), strict_native=True)
        _same(cf(tp.from_torch(g)), want)


def test_a_window_over_an_expensive_producer_reads_it_from_memory():
    """A pooling window evaluates each input about (k/s)^2 times and 2x upsampling 4 times:
    batch_norm's rsqrt and a window under an upsampling are written to memory once instead
    (choices.realize_reread) -- three kernels, not one that recomputes them 36 times."""
    x = torch.randn(2, 4, 8, 8)
    m, v = torch.randn(4), torch.rand(4) + 0.5
    f = lambda L, Fn, a, m, v: Fn.interpolate(Fn.avg_pool2d(L.relu(Fn.batch_norm(a, m, v, training=False)), 3, 1, 1),
                                              scale_factor=2, mode="nearest")   # noqa: E731
    cf = tp.compile(lambda a, m, v: f(tp, F, a, m, v), strict_native=True)
    got = cf(tp.from_torch(x), tp.from_torch(m), tp.from_torch(v))
    torch.testing.assert_close(_data(got), f(torch, torch.nn.functional, x, m, v), rtol=1e-6, atol=1e-6)
    assert _kernel_count(cf) == 3
    # a cheap producer (relu) is still recomputed inside the window kernel
    cf = tp.compile(lambda a: F.avg_pool2d(tp.relu(a), 3, 2, 1), strict_native=True)
    cf(tp.from_torch(x))
    assert _kernel_count(cf) == 1


def test_training_through_pooling_and_upsampling():
    """A small encoder-decoder through AOT autograd, both graphs native: gradients match eager."""
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    w = torch.randn(3, 12, 12, dtype=torch.float64)

    def f(L, Fn, x, w):
        h = Fn.max_pool2d(L.relu(x * w), 3, 2, 1)                   # 6 x 6
        h = Fn.avg_pool2d(h, 3, 1, 1) + Fn.adaptive_avg_pool2d(h, 3).mean()
        return (Fn.interpolate(h, scale_factor=2, mode="nearest") * w).sum()
    _train_against_eager(f, x, w, rtol=1e-12, atol=1e-12)


def _train_against_eager(f, x, w, rtol, atol):
    """Two compiled (strict native) steps of ``f(tp, F, x, w)`` with w trainable, against eager
    torch's ``f(torch, torch.nn.functional, x, w)``: loss and gradient within (rtol, atol)."""
    pw = tp.from_torch(w.clone()).requires_grad_()
    cf = tp.compile(lambda x, w: f(tp, F, x, w), strict_native=True)
    for _ in range(2):
        pw.grad = None
        loss = cf(tp.from_torch(x), pw)
        loss.backward()
    tw = w.clone().requires_grad_()
    want = f(torch, torch.nn.functional, x, tw)
    want.backward()
    torch.testing.assert_close(_data(loss).detach(), want.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(_data(pw.grad), tw.grad, rtol=rtol, atol=atol)
    return cf, pw


@pytest.mark.parametrize("mode,shape,kw", [("bilinear", (2, 3, 7, 9), dict(scale_factor=2, align_corners=False)),
                                           ("bilinear", (2, 3, 7, 9), dict(size=(10, 5), align_corners=True)),
                                           ("linear", (2, 3, 11), dict(scale_factor=1.5, align_corners=False))])
def test_linear_upsampling_is_a_library_kernel_in_training(mode, shape, kw):
    """Linear/bilinear resampling and its backward run as extern kernels (ATen: strict_native
    accepts them) and the pointwise ops around them fuse into Stax kernels: loss and gradients
    within 1e-13 of eager's (float64; the fused sum adds in another order)."""
    x = torch.randn(*shape, dtype=torch.float64)
    w = torch.randn(*shape, dtype=torch.float64)

    def f(L, Fn, x, w):
        return (Fn.interpolate(L.relu(x * w), mode=mode, **kw).exp() * 2).sum()
    cf, pw = _train_against_eager(f, x, w, rtol=1e-13, atol=0)
    low = cf.lower(tp.from_torch(x), pw)                  # (strict_native: no fallback kernel anywhere)
    bw_ops = [n.target_name for n in low.backward_graph.graph.nodes if n.op == "call_function"]
    assert any(o.startswith("upsample_") and o.endswith("_backward") for o in bw_ops)


def test_bounds_floor_terms_of_a_mask():
    """A mask conjunct on a floor term bounds the access that holds the same term (an adaptive
    bin: h = floor(9*o/7) + k, masked by h < 9)."""
    import sympy
    from tensorplay.compiler.backends.stax.bounds import check_access
    from tensorplay.compiler.backends.stax.ir import Unsupported
    o, k = sympy.symbols("o k", integer=True)
    ranges = {o: (0, 6), k: (0, 2)}
    h = sympy.floor(9 * o / 7) + k
    check_access("x", h, ranges, 9, cond=sympy.And(h >= 0, h < 9))
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", h, ranges, 9)                                   # floor(54/7) + 2 = 9 unmasked
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", h, ranges, 8, cond=sympy.And(h >= 0, h < 9))    # 8 is past the end
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", h + o, ranges, 9, cond=sympy.And(h >= 0, h < 9))  # not the masked term alone
    # a term's interval is taken over the ranges the mask leaves (a strided slice's gradient:
    # floor((i + 1)/3) - 1 is read only where i >= 2)
    i = sympy.Symbol("i", integer=True)
    check_access("g", sympy.floor((i + 1) / 3) - 1, {i: (0, 8)}, 3, cond=sympy.And(i - 2 >= 0, i - 2 < 9))
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("g", sympy.floor((i + 1) / 3) - 1, {i: (0, 8)}, 3)


@pytest.mark.slow
def test_pooling_cases_run_in_a_random_sweep():
    """64 max-pooling and 48 average-pooling configurations on random data with special values."""
    for (H, W), k, s, p, d, cm in itertools.product([(7, 9), (8, 8)], [2, 3], [1, 2], [0, 1], [1, 2], [False, True]):
        if p > k // 2:
            continue
        x = _special((2, 3, H, W), seed=H + k + s)
        want = torch.nn.functional.max_pool2d(x, k, s, p, d, cm, return_indices=True)
        got = tp.compile(lambda a: F.max_pool2d(a, k, s, p, d, cm, return_indices=True),
                         strict_native=True)(tp.from_torch(x))
        _same(got[0], want[0])
        _same(got[1], want[1])
        if d == 1:
            got = tp.compile(lambda a: F.avg_pool2d(a, k, s, p, cm), strict_native=True)(tp.from_torch(x))
            _same(got, torch.nn.functional.avg_pool2d(x, k, s, p, cm))
