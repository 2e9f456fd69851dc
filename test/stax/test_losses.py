"""Stax lowerings of the losses (native kernels, strict_native) against eager, and their gradients
through AOT autograd.  Tolerance: the float64 reference and the error model's reduction term."""

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _targets(n, c, ignore=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, c, (n,), generator=g)
    if ignore and n > 2:
        t[1] = -100
    return tp.from_torch(t)


def _check(f, *args, rtol=2e-5):
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    out = cf(*args)
    ref = f(*[a.double() if a.is_floating_point() else a for a in args])
    assert out.shape == ref.shape
    assert torch.allclose(out._data.double(), ref._data, rtol=rtol, atol=1e-6, equal_nan=True), (out, ref)
    return out


X = lambda *s: tp.randn(*s)   # noqa: E731


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_and_nll(reduction, weighted):
    x, t = X(7, 5), _targets(7, 5)
    if weighted:
        w = tp.rand(5) + 0.5
        _check(lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction), x, t, w)
        _check(lambda x, t, w: F.nll_loss(x.log_softmax(-1), t, weight=w, reduction=reduction), x, t, w)
    else:
        _check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), x, t)
        _check(lambda x, t: F.nll_loss(x.log_softmax(-1), t, reduction=reduction), x, t)
    _check(lambda x, t: F.cross_entropy(x.t(), t[:5] * 0 + 1, weight=None, reduction=reduction), X(5, 5), t)


def test_cross_entropy_single_sample_and_all_ignored():
    _check(lambda x, t: F.cross_entropy(x, t), X(6), tp.tensor(3))
    t = tp.from_torch(torch.full((4,), -100))
    out = tp.compile(lambda x, t: F.cross_entropy(x, t), strict_native=True)(X(4, 3), t)
    assert torch.isnan(out._data)                        # 0 / 0, like eager


def test_target_out_of_range_raises_index_error():
    cf = tp.compile(lambda x, t: F.cross_entropy(x, t), strict_native=True)
    cf(X(4, 3), _targets(4, 3))
    with pytest.raises(IndexError, match="cross_entropy.*target 7 is out of bounds for 3 classes"):
        cf(X(4, 3), tp.tensor([0, 7, 1, 2]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_elementwise_losses(reduction):
    a, b = X(6, 4), X(6, 4)
    p, q = tp.rand(6, 4) * 0.98 + 0.01, tp.rand(6, 4)
    pw = tp.rand(4) + 0.5
    _check(lambda a, b: F.mse_loss(a, b, reduction=reduction), a, b)
    _check(lambda a, b: F.l1_loss(a, b, reduction=reduction), a, b.t().t())
    _check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), a, b)
    _check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.7), a, b)
    _check(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), p, q)
    _check(lambda a, b: F.binary_cross_entropy_with_logits(a, b, pos_weight=pw, reduction=reduction), a, q)
    _check(lambda a, b: F.kl_div(a, b, reduction=reduction), a.log_softmax(-1), q)


def test_kl_div_batchmean_log_target_and_zero_targets():
    a, q = X(5, 4).log_softmax(-1), tp.rand(5, 4)
    _check(lambda a, b: F.kl_div(a, b, reduction="sum", log_target=True), a, q.log())
    q._data[0, 0] = 0.0                                  # xlogy(0, 0) = 0
    _check(lambda a, b: F.kl_div(a, b, reduction="batchmean"), a, q)


def test_cross_entropy_gradient_through_aot_is_native():
    x, t, w = X(8, 6), _targets(8, 6), tp.rand(6) + 0.5

    def f(x, t):
        return F.cross_entropy(x * 2, t, weight=w)
    xs = x.clone().requires_grad_()
    cf = tp.compile(f, strict_native=True)     # forward and backward both native (nll_loss_backward)
    for _ in range(2):
        xs.grad = None
        cf(xs, t).backward()
    xe = x.double().requires_grad_()
    F.cross_entropy(xe * 2, t, weight=w.double()).backward()
    assert torch.allclose(xs.grad._data.double(), xe.grad._data, rtol=1e-5, atol=1e-7)
