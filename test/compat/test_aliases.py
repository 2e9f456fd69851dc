"""PyTorch's aliases and small compositions (tensorplay/ops/aliases.py) against torch: values,
gradients where differentiable, PyTorch's edge rules (beta == 0, -0.0, complex), errors."""
import math

import pytest
import torch

import tensorplay as tp
from tensorplay.testing import assert_close


def _pair(*shape, seed=0, dtype=torch.float64, grad=True):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    p = tp.from_torch(t.clone())
    if grad and t.is_floating_point():
        t.requires_grad_()
        p.requires_grad_()
    return t, p


CASES = {
    "ravel": (lambda m, a: m.ravel(a.t()), [(3, 4)]),
    "mv": (lambda m, a, b: m.mv(a, b), [(3, 4), (4,)]),
    "addmv": (lambda m, c, a, b: m.addmv(c, a, b, beta=0.5, alpha=2.0), [(3,), (3, 4), (4,)]),
    "addr": (lambda m, c, a, b: m.addr(c, a, b, beta=-1.0, alpha=0.5), [(3, 4), (3,), (4,)]),
    "inner": (lambda m, a, b: m.inner(a, b), [(2, 3, 5), (4, 5)]),
    "vdot": (lambda m, a, b: m.vdot(a, b), [(6,), (6,)]),
    "true_divide": (lambda m, a, b: m.true_divide(a, b), [(3, 4), (4,)]),
    "deg2rad": (lambda m, a: m.deg2rad(a), [(5,)]),
    "rad2deg": (lambda m, a: m.rad2deg(a), [(5,)]),
    "dist": (lambda m, a, b: m.dist(a, b, 3), [(3, 4), (3, 4)]),
    "msort": (lambda m, a: m.msort(a), [(5, 3)]),
    "logcumsumexp": (lambda m, a: m.logcumsumexp(a * 30, 1), [(3, 6)]),
    "broadcast_tensors": (lambda m, a, b: sum(t.sum() for t in m.broadcast_tensors(a, b)), [(3, 1), (1, 4)]),
    "split_with_sizes": (lambda m, a: m.split_with_sizes(a, [1, 3], 1)[1], [(2, 4)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_torch(name):
    f, shapes = CASES[name]
    pairs = [_pair(*s, seed=i) for i, s in enumerate(shapes)]
    out_t = f(torch, *[t for t, _ in pairs])
    out_p = f(tp, *[p for _, p in pairs])
    assert_close(out_p, out_t.detach(), rtol=1e-10, atol=1e-10)
    g = torch.randn(out_t.shape, dtype=out_t.dtype, generator=torch.Generator().manual_seed(9))
    out_t.backward(g)
    out_p.backward(tp.from_torch(g))
    for t, p in pairs:
        assert_close(p.grad, t.grad, rtol=1e-8, atol=1e-10)


def test_logcumsumexp_extremes_and_gradcheck():
    x = torch.tensor([[-1000.0, 0.0, 1000.0, float("-inf"), 3.0]], dtype=torch.float64)
    assert_close(tp.logcumsumexp(tp.from_torch(x), 1), torch.logcumsumexp(x, 1), exact=True)
    p = tp.from_torch(torch.randn(2, 5, dtype=torch.float64) * 5).requires_grad_()
    assert tp.autograd.gradcheck(lambda a: tp.logcumsumexp(a, 1), (p,))
    assert tp.autograd.gradcheck(lambda a: tp.logcumsumexp(a, 0), (p,))


def test_beta_zero_ignores_nan_in_input():
    c = torch.full((3,), float("nan"), dtype=torch.float64)
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    got = tp.addmv(tp.from_torch(c), tp.from_torch(a), tp.from_torch(b), beta=0)
    assert_close(got, torch.addmv(c, a, b, beta=0), exact=True)
    c2 = torch.full((3, 4), float("inf"), dtype=torch.float64)
    v1, v2 = torch.randn(3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    assert_close(tp.addr(tp.from_torch(c2), tp.from_torch(v1), tp.from_torch(v2), beta=0),
                 torch.addr(c2, v1, v2, beta=0), exact=True)
    cb = torch.full((3, 1), float("nan"), dtype=torch.float64)      # broadcast input, ignored too
    assert_close(tp.addr(tp.from_torch(cb), tp.from_torch(v1), tp.from_torch(v2), beta=0),
                 torch.addr(cb, v1, v2, beta=0), exact=True)


def test_predicates_signbit_gcd_lcm_isin():
    x = torch.tensor([-0.0, 0.0, -1.5, 2.0, float("-inf"), float("nan")])
    assert torch.equal(tp.signbit(tp.from_torch(x)).torch(), torch.signbit(x))
    a, b = torch.tensor([12, -18, 0, 7]), torch.tensor([8, 12, 5, 0])
    assert torch.equal(tp.gcd(tp.from_torch(a), tp.from_torch(b)).torch(), torch.gcd(a, b))
    assert torch.equal(tp.lcm(tp.from_torch(a), tp.from_torch(b)).torch(), torch.lcm(a, b))
    e, s = torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 3, 9])
    assert torch.equal(tp.isin(tp.from_torch(e), tp.from_torch(s)).torch(), torch.isin(e, s))
    assert torch.equal(tp.isin(tp.from_torch(e), tp.from_torch(s), invert=True).torch(), torch.isin(e, s, invert=True))
    t, p = _pair(3, 4)
    assert tp.equal(p, p.detach().clone()) and not tp.equal(p, p[:2]) and not tp.equal(p, p + 1)
    assert tp.allclose(p, p + 1e-12) and not tp.allclose(p, p + 1)
    n = tp.tensor([float("nan")])
    assert not tp.allclose(n, n) and tp.allclose(n, n, equal_nan=True)
    assert tp.broadcast_shapes((3, 1), (1, 4), (4,)) == torch.Size([3, 4])


def test_complex_conj_sgn_h_and_vdot():
    z = torch.randn(3, 2, dtype=torch.complex128)
    pz = tp.from_torch(z.clone())
    assert_close(tp.conj(pz), z.conj().resolve_conj(), exact=True)
    assert_close(pz.H, z.H.resolve_conj(), exact=True)
    assert_close(pz.mH, z.mH.resolve_conj(), exact=True)
    assert_close(tp.sgn(pz), torch.sgn(z), rtol=1e-12, atol=1e-12)
    assert_close(tp.sgn(tp.zeros(2, dtype=tp.complex64 if hasattr(tp, "complex64") else torch.complex64)),
                 torch.zeros(2, dtype=torch.complex64), exact=True)
    a, b = torch.randn(4, dtype=torch.complex128), torch.randn(4, dtype=torch.complex128)
    assert_close(tp.vdot(tp.from_torch(a), tp.from_torch(b)), torch.vdot(a, b), rtol=1e-12, atol=1e-12)
    r = tp.randn(3)
    assert tp.conj(r) is r and not pz.is_conj()
    assert_close(tp.sgn(tp.tensor([-2.0, 0.0, 3.0])), torch.tensor([-1.0, 0.0, 1.0]), exact=True)


def test_sum_to_size_and_errors():
    t, p = _pair(2, 3, 4)
    assert_close(p.sum_to_size(1, 3, 1), t.sum_to_size(1, 3, 1).detach(), rtol=1e-12, atol=1e-12)
    assert_close(p.sum_to_size((3, 4)), t.sum_to_size((3, 4)).detach(), rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="tp.sum_to_size: size \\[5\\] is not expandable"):
        p.sum_to_size(5)
    with pytest.raises(RuntimeError, match="tp.mv: expected a 2-D matrix and a 1-D vector"):
        tp.mv(p, p)
    with pytest.raises(RuntimeError, match="tp.vdot: expected two 1-D tensors"):
        tp.vdot(p, p)
    with pytest.raises(RuntimeError, match="tp.inner: the last dims must agree"):
        tp.inner(tp.randn(2, 3), tp.randn(4))
    with pytest.raises(RuntimeError, match="tp.addr: expected 1-D vectors"):
        tp.addr(tp.randn(2, 2), tp.randn(2, 1), tp.randn(2))
    assert math.isclose(tp.inner(tp.tensor(2.0), tp.tensor(3.0)).item(), 6.0)


def test_compiled_compositions_equal_eager():
    a, b, c = tp.randn(5, 4), tp.randn(4), tp.randn(5)
    f = lambda a, b, c: tp.addmv(c, a, b, beta=0.5).relu() + tp.logcumsumexp(a, 1).sum(1) + a.ravel()[:5]  # noqa: E731
    cf = tp.compile(f)
    cf(a, b, c)
    assert_close(cf(a, b, c), f(a, b, c), rtol=1e-5, atol=1e-5)
