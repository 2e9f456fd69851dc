"""tp.linalg against torch.linalg: forward (bit for bit where one op), meta, gradients vs
torch.autograd, gradcheck in float64 (through gauge-invariant functions for the decompositions),
batched and non-contiguous inputs, the older top-level names, bad input, a compiled use."""
import math

import pytest
import torch

import tensorplay as tp
from harness import check_op, to_tp
from tensorplay.testing import assert_close

g = torch.Generator().manual_seed(0)


def rn(*s, dtype=torch.float64):
    return torch.randn(*s, generator=g, dtype=dtype)


def spd(*s):
    a = rn(*s)
    return a @ a.mT + s[-1] * torch.eye(s[-1], dtype=a.dtype)


def well(*s):
    return rn(*s) + 3 * torch.eye(s[-1], dtype=torch.float64)


def _chk(f, tf, *xs, exact=True, **kw):
    kw.setdefault("gradcheck", True)
    if not exact:
        kw.setdefault("rtol", 1e-9)
        kw.setdefault("atol", 1e-10)
    return check_op(f, tf, *xs, exact=exact, **kw)


@pytest.mark.parametrize("ord", [2, 1, 3.5, math.inf, -math.inf, 0])
def test_vector_norm(ord):
    x = rn(3, 4)
    _chk(lambda a: tp.linalg.vector_norm(a, ord), lambda a: torch.linalg.vector_norm(a, ord), x,
         gradcheck=ord != 0)
    _chk(lambda a: tp.linalg.vector_norm(a, ord, dim=1, keepdim=True),
         lambda a: torch.linalg.vector_norm(a, ord, dim=1, keepdim=True), x.t(), gradcheck=False)
    check_op(lambda a: tp.linalg.vector_norm(a, ord, dim=(0, 1)), lambda a: torch.linalg.vector_norm(a, ord, dim=(0, 1)),
             torch.randn(2, 3, 4), grad=True, gradcheck=False)


@pytest.mark.parametrize("ord", ["fro", "nuc", math.inf, -math.inf, 1, -1, 2, -2])
def test_matrix_norm(ord):
    a = rn(2, 4, 3)
    _chk(lambda x: tp.linalg.matrix_norm(x, ord), lambda x: torch.linalg.matrix_norm(x, ord), a, exact=False)
    _chk(lambda x: tp.linalg.matrix_norm(x, ord, dim=(0, 2), keepdim=True),
         lambda x: torch.linalg.matrix_norm(x, ord, dim=(0, 2), keepdim=True), a, exact=False, gradcheck=False)
    _chk(lambda x: tp.linalg.norm(x, ord), lambda x: torch.linalg.norm(x, ord), a[0], exact=False, gradcheck=False)


def test_norm_dispatch():
    a = rn(3, 4)
    for kw in (dict(), dict(dim=1), dict(ord=3, dim=0), dict(dim=(0, 1), ord="nuc"), dict(ord=math.inf)):
        _chk(lambda x: tp.linalg.norm(x, **kw), lambda x: torch.linalg.norm(x, **kw), a, exact=False, gradcheck=False)
    with pytest.raises(RuntimeError, match="tp.linalg.norm"):
        tp.linalg.norm(tp.randn(2, 2, 2), ord=2)


def test_inv_det_slogdet_logdet():
    a = well(2, 3, 3)
    _chk(tp.linalg.inv, torch.linalg.inv, a)
    _chk(tp.linalg.det, torch.linalg.det, a)
    _chk(lambda x: tp.linalg.slogdet(x)[1], lambda x: torch.linalg.slogdet(x)[1], a)
    _chk(lambda x: tp.linalg.inv_ex(x)[0], lambda x: torch.linalg.inv_ex(x)[0], a)
    _chk(tp.inverse, torch.inverse, a[0].t())                       # transposed input
    _chk(tp.det, torch.det, a)
    _chk(tp.logdet, torch.logdet, spd(3, 3))
    _chk(lambda x: x.slogdet()[1], lambda x: x.slogdet()[1], a)
    s = tp.linalg.slogdet(to_tp(a))
    assert_close(s.sign, torch.linalg.slogdet(a).sign)
    assert tp.linalg.inv_ex(to_tp(torch.zeros(2, 2, dtype=torch.float64) + 1.0)).info.item() > 0


@pytest.mark.parametrize("left", [True, False])
def test_solve(left):
    a = well(2, 3, 3)
    b = rn(2, 3, 2) if left else rn(2, 2, 3)
    _chk(lambda x, y: tp.linalg.solve(x, y, left=left), lambda x, y: torch.linalg.solve(x, y, left=left), a, b)
    _chk(lambda x, y: tp.linalg.solve(x, y, left=left), lambda x, y: torch.linalg.solve(x, y, left=left),
         a[0], b)                                                   # broadcast batch of B
    if left:
        _chk(tp.linalg.solve, torch.linalg.solve, a, rn(2, 3))      # a batch of vectors
        _chk(tp.linalg.solve, torch.linalg.solve, a[0], rn(3))


@pytest.mark.parametrize("upper,left,unit", [(True, True, False), (False, False, False), (False, True, True)])
def test_solve_triangular(upper, left, unit):
    a = well(3, 3)
    b = rn(3, 2) if left else rn(2, 3)
    f = lambda x, y: tp.linalg.solve_triangular(x, y, upper=upper, left=left, unitriangular=unit)  # noqa: E731
    tf = lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left, unitriangular=unit)  # noqa: E731
    _chk(f, tf, a, b)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    a = spd(2, 3, 3)
    _chk(lambda x: tp.linalg.cholesky(x, upper=upper), lambda x: torch.linalg.cholesky(x, upper=upper), a,
         gradcheck=False)
    sym = lambda f: (lambda x: f((x + x.mT) / 2 + 4 * torch.eye(3, dtype=torch.float64)))  # noqa: E731
    tsym = lambda x: tp.linalg.cholesky((x + x.mT) / 2 + to_tp(4 * torch.eye(3, dtype=torch.float64)), upper=upper)  # noqa: E731
    check_op(tsym, sym(lambda x: torch.linalg.cholesky(x, upper=upper)), rn(3, 3), gradcheck=True)
    _chk(lambda x: tp.cholesky(x, upper), lambda x: torch.cholesky(x, upper), a, gradcheck=False)
    _chk(lambda x: tp.linalg.cholesky_ex(x)[0], lambda x: torch.linalg.cholesky_ex(x)[0], a, gradcheck=False)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (2, 5, 2)])
def test_qr(shape):
    a = rn(*shape)
    _chk(lambda x: tp.linalg.qr(x), lambda x: torch.linalg.qr(x), a)
    _chk(lambda x: tp.linalg.qr(x, "complete")[1], lambda x: torch.linalg.qr(x, "complete")[1], a,
         grad=shape[-2] == shape[-1])
    _chk(lambda x: tp.qr(x)[0], lambda x: torch.qr(x)[0], a)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
def test_svd(shape):
    a = rn(*shape)
    _chk(tp.linalg.svdvals, torch.linalg.svdvals, a)
    # gauge-invariant functions of the singular vectors
    _chk(lambda x: (lambda u, s, vh: (u * s.unsqueeze(-2)) @ vh)(*tp.linalg.svd(x, False)),
         lambda x: (lambda u, s, vh: (u * s.unsqueeze(-2)) @ vh)(*torch.linalg.svd(x, False)), a, exact=False)
    _chk(lambda x: (lambda u, s, vh: (u @ u.mT, vh.mT @ vh, s))(*tp.linalg.svd(x, False)),
         lambda x: (lambda u, s, vh: (u @ u.mT, vh.mT @ vh, s))(*torch.linalg.svd(x, False)), a, exact=False)
    _chk(lambda x: tp.linalg.svd(x)[1], lambda x: torch.linalg.svd(x)[1], a)
    u, s, v = tp.svd(to_tp(a))
    tu, ts, tv = torch.svd(a)
    assert_close(u, tu)
    assert_close(v, tv)
    assert tuple(tp.svd(to_tp(a), some=False)[0].shape) == tuple(torch.svd(a, some=False)[0].shape)


def test_eigh():
    a = spd(2, 4, 4)
    f = lambda mod: (lambda x: (lambda l_, v: (l_, v @ v.mT * l_.sum(-1, keepdim=True).unsqueeze(-1),  # noqa: E731
                                               (v[..., :1] @ v[..., :1].mT)))(*mod.eigh(x)))
    sym = lambda h: (lambda x: h((x + x.mT) / 2))  # noqa: E731
    check_op(sym(f(tp.linalg)), sym(f(torch.linalg)), a, exact=False, rtol=1e-9, atol=1e-10, gradcheck=False)
    check_op(sym(f(tp.linalg)), sym(f(torch.linalg)), spd(3, 3), exact=False, rtol=1e-9, atol=1e-10,
             gradcheck=True)
    check_op(sym(tp.linalg.eigvalsh), sym(torch.linalg.eigvalsh), spd(3, 3), gradcheck=True)
    _chk(lambda x: tp.linalg.eigh(x, "U")[0], lambda x: torch.linalg.eigh(x, "U")[0], a, gradcheck=False)
    with pytest.raises(RuntimeError, match="tp.linalg.eigh"):
        tp.linalg.eigh(to_tp(a), "X")


def test_lstsq_pinv_rank():
    # LAPACK's least squares and SVD are not bit-reproducible across machines/threads: compare to tolerance
    a, b = rn(5, 3), rn(5, 2)
    _chk(lambda x, y: tp.linalg.lstsq(x, y).solution, lambda x, y: torch.linalg.lstsq(x, y).solution, a, b, exact=False)
    _chk(lambda x, y: tp.linalg.lstsq(x, y)[0], lambda x, y: torch.linalg.lstsq(x, y)[0], rn(2, 4, 3), rn(2, 4, 1), exact=False)
    _chk(tp.linalg.pinv, torch.linalg.pinv, a, exact=False)
    _chk(tp.linalg.pinv, torch.linalg.pinv, a.t(), exact=False)               # wide
    _chk(tp.pinverse, torch.pinverse, rn(2, 3, 4), exact=False)
    low = rn(5, 2) @ rn(2, 4)
    assert tp.linalg.matrix_rank(to_tp(low)).item() == torch.linalg.matrix_rank(low).item() == 2
    assert_close(tp.linalg.matrix_rank(to_tp(spd(2, 3, 3)), hermitian=True),
                 torch.linalg.matrix_rank(spd(2, 3, 3), hermitian=True))
    with pytest.raises(NotImplementedError, match="tp.linalg_lstsq"):
        x = to_tp(a.t(), requires_grad=True)
        tp.linalg.lstsq(x, to_tp(rn(3, 2)))[0].sum().backward()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, -1, -3])
def test_matrix_power(n):
    a = well(2, 3, 3) / 3
    _chk(lambda x: tp.linalg.matrix_power(x, n), lambda x: torch.linalg.matrix_power(x, n), a, exact=False,
         grad=n != 0)     # n = 0: the identity, a constant
    _chk(lambda x: x.matrix_power(n), lambda x: x.matrix_power(n), a[0], exact=False, gradcheck=False, grad=n != 0)


def test_multi_dot():
    ms = [rn(2, 5), rn(5, 3), rn(3, 6), rn(6, 2)]
    _chk(lambda *t: tp.linalg.multi_dot(t), lambda *t: torch.linalg.multi_dot(t), *ms, exact=False)
    _chk(lambda *t: tp.linalg.multi_dot(t), lambda *t: torch.linalg.multi_dot(t), rn(5), ms[1], ms[2], rn(6),
         exact=False)
    _chk(lambda *t: tp.linalg.multi_dot(t), lambda *t: torch.linalg.multi_dot(t), ms[0], ms[1], exact=False)
    with pytest.raises(RuntimeError, match="tp.linalg.multi_dot"):
        tp.linalg.multi_dot([to_tp(ms[0]), to_tp(ms[0])])


def test_float32_batched_noncontiguous():
    a = (torch.randn(3, 4, 4) + 4 * torch.eye(4)).transpose(-1, -2)
    check_op(tp.linalg.inv, torch.linalg.inv, a, gradcheck=False, grad_rtol=1e-4, grad_atol=1e-5)
    check_op(tp.linalg.det, torch.linalg.det, a, gradcheck=False, grad_rtol=1e-4, grad_atol=1e-5)
    check_op(tp.linalg.svdvals, torch.linalg.svdvals, a, gradcheck=False, grad_rtol=1e-4, grad_atol=1e-5)
    check_op(tp.linalg.inv, torch.linalg.inv, torch.randn(0, 3, 3), grad=False)


def test_errors():
    with pytest.raises(RuntimeError, match="tp.linalg_inv"):
        tp.linalg.inv(tp.randn(2, 3))
    with pytest.raises(RuntimeError, match="tp.linalg_cholesky"):
        tp.linalg.cholesky(-tp.ones(2, 2) - tp.eye(2))
    with pytest.raises(RuntimeError, match="tp.linalg_solve"):
        tp.linalg.solve(tp.randn(3, 3), tp.randn(4, 2))
    with pytest.raises(RuntimeError, match="tp.linalg.matrix_norm"):
        tp.linalg.matrix_norm(tp.randn(3, 3), 3)
    with pytest.raises(RuntimeError, match="tp.linalg.matrix_power"):
        tp.linalg.matrix_power(tp.randn(2, 3), 2)
    with pytest.raises(RuntimeError, match="tp.linalg.qr"):
        tp.linalg.qr(tp.randn(2, 3), "full")
    with pytest.raises(NotImplementedError, match="tp.linalg_qr"):
        x = tp.randn(2, 4).requires_grad_()
        tp.linalg.qr(x)[0].sum().backward()


@pytest.mark.slow
def test_compiled():
    def f(a, b):
        x = tp.linalg.solve(a, b)
        return (tp.linalg.inv(a) @ x).sum() + tp.linalg.det(a) + tp.linalg.svdvals(a).sum() + \
            tp.linalg.vector_norm(x, 3)
    a, b = well(3, 3).float(), rn(3, 2).float()
    cf = tp.compile(f)
    cf(to_tp(a), to_tp(b))
    got = cf(to_tp(a), to_tp(b))
    x = torch.linalg.solve(a, b)
    ref = (torch.linalg.inv(a) @ x).sum() + torch.linalg.det(a) + torch.linalg.svdvals(a).sum() + \
        torch.linalg.vector_norm(x, 3)
    assert_close(got, ref, exact=False, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_training():
    def f(a, b):
        return (tp.linalg.solve(a, b) ** 2).sum() + tp.linalg.slogdet(a)[1] + tp.linalg.svdvals(a).sum()
    a0, b0 = well(3, 3).float(), rn(3, 2).float()
    cf = tp.compile(f)
    for _ in range(2):      # the first call is the capture run
        a, b = to_tp(a0, requires_grad=True), to_tp(b0, requires_grad=True)
        cf(a, b).backward()
    ta, tb = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    f_t = (torch.linalg.solve(ta, tb) ** 2).sum() + torch.linalg.slogdet(ta)[1] + torch.linalg.svdvals(ta).sum()
    f_t.backward()
    assert_close(a.grad, ta.grad, exact=False, rtol=1e-4, atol=1e-5)
    assert_close(b.grad, tb.grad, exact=False, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ord", [2, 1, 3.5, float("inf"), float("-inf"), 0])
def test_vector_norm_is_a_stax_reduction(ord):
    """tp.linalg.vector_norm lowers as norm's reductions (strict_native), forward and backward."""
    x = tp.randn(5, 7, requires_grad=True)
    for dim in (None, 1, (0, 1)):
        f = lambda a: tp.linalg.vector_norm(a, ord, dim=dim)  # noqa: E731
        cf = tp.compile(f, strict_native=True)
        cf(x.detach())
        assert (cf(x.detach()) - f(x.detach())).abs().max().item() <= 1e-5
    if ord not in (0, float("inf"), float("-inf")):
        cf = tp.compile(lambda a: tp.linalg.vector_norm(a, ord, dim=1).sum(), strict_native=True)
        for _ in range(2):
            x.grad = None
            cf(x).backward()
        got = x.grad.clone()
        x.grad = None
        tp.linalg.vector_norm(x, ord, dim=1).sum().backward()
        assert (got - x.grad).abs().max().item() <= 1e-5
