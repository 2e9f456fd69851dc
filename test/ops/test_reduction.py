"""Reductions and scans against PyTorch: forward (bit-identical), meta, gradients, gradcheck.

Covers dims given as int / negative int / tuple / None / [], keepdim, three memory layouts,
size-0 and size-1 dims, 0-d tensors, bool and integer dtypes (promotion), NaN/inf propagation,
ties (even split of the gradient), zeros in prod/cumprod, and error messages naming the op.
"""
import math

import pytest
import torch

import tensorplay as tp
from harness import check_op, layouts

INF, NAN = float("inf"), float("nan")
DIMS = [None, 0, -1, (0, 1), [-1, 0]]


def _fn(name, *args, **kw):
    return (lambda a: getattr(tp, name)(a, *args, **kw)), (lambda a: getattr(torch, name)(a, *args, **kw))


# ---------------------------------------------------------------------------------------------
# sum / mean / nansum / nanmean
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4)))
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_dims_layouts(x, dim, keepdim):
    for name in ("sum", "mean", "nansum", "nanmean"):
        if dim is None:
            if keepdim:
                continue
            tf, rf = _fn(name)
        else:
            tf, rf = _fn(name, dim, keepdim=keepdim)
        check_op(tf, rf, x, exact=name in ("sum", "nansum"))
        # methods as well
        if dim is not None:
            check_op(lambda a: getattr(a, name)(dim, keepdim), lambda a: getattr(a, name)(dim, keepdim), x,
                     exact=False, gradcheck=False)


def test_sum_mean_keepdim_none_and_dtype():
    x = torch.randn(2, 3, 4)
    check_op(lambda a: a.sum(None, True), lambda a: a.sum((0, 1, 2), keepdim=True), x)
    check_op(lambda a: tp.sum(a, dtype=tp.float64), lambda a: torch.sum(a, dtype=torch.float64), x)
    check_op(lambda a: a.mean(1, dtype=tp.float64), lambda a: a.mean(1, dtype=torch.float64), x)
    check_op(lambda a: a.sum([]), lambda a: a.sum([]), x)
    check_op(lambda a: a.mean([]), lambda a: a.mean([]), x, exact=False)


def test_sum_int_bool_promotion_and_mean_int_error():
    b = torch.rand(3, 5) > 0.5
    check_op(lambda a: a.sum(), lambda a: a.sum(), b)
    check_op(lambda a: a.sum(1), lambda a: a.sum(1), b)
    i8 = torch.randint(-100, 100, (4, 5), dtype=torch.int8)
    out = check_op(lambda a: a.sum(0), lambda a: a.sum(0), i8)
    assert out.dtype == tp.int64
    check_op(lambda a: a.sum(), lambda a: a.sum(), torch.randint(-5, 5, (3, 4), dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"tp\.mean\(self: int64\[3\]"):
        tp.mean(tp.arange(3))


def test_sum_mean_empty_and_scalar():
    e = torch.randn(0, 3)
    check_op(lambda a: a.sum(0), lambda a: a.sum(0), e)
    check_op(lambda a: a.sum(), lambda a: a.sum(), e)
    check_op(lambda a: a.mean(0), lambda a: a.mean(0), e)
    check_op(lambda a: a.sum(1, keepdim=True), lambda a: a.sum(1, keepdim=True), e)
    s = torch.tensor(2.5)
    for name in ("sum", "mean", "prod", "amax", "logsumexp", "var", "std", "norm"):
        args = (0,) if name == "logsumexp" else ()
        kw = {"correction": 0} if name in ("var", "std") else {}
        check_op(lambda a: getattr(tp, name)(a, *args, **kw), lambda a: getattr(torch, name)(a, *args, **kw), s,
                 exact=False)
    check_op(lambda a: a.sum(0, keepdim=True), lambda a: a.sum(0, keepdim=True), s)
    check_op(lambda a: a.sum(-1), lambda a: a.sum(-1), s)
    one = torch.randn(1, 4)
    check_op(lambda a: a.sum(0), lambda a: a.sum(0), one)
    check_op(lambda a: a.mean(0, keepdim=True), lambda a: a.mean(0, keepdim=True), one)


def test_nan_inf_propagation():
    x = torch.tensor([[1.0, NAN, 2.0], [INF, 1.0, -INF], [INF, INF, 3.0]])
    for name in ("sum", "mean", "prod", "amax", "amin", "nansum", "nanmean"):
        tf, rf = _fn(name, 1)
        check_op(tf, rf, x, grad=False)
    check_op(lambda a: tp.logsumexp(a, 1), lambda a: torch.logsumexp(a, 1), x, grad=False)
    check_op(lambda a: a.max(), lambda a: a.max(), x, grad=False)
    check_op(lambda a: a.max(1), lambda a: a.max(1), x, grad=False)
    check_op(lambda a: a.var(1), lambda a: a.var(1), x, grad=False)
    # gradients of nansum/nanmean skip the NaN entries; amax's gradient at a NaN max is NaN like torch
    y = torch.tensor([[1.0, NAN, 2.0], [0.5, 1.0, -3.0]])
    check_op(lambda a: tp.nansum(a, 1), lambda a: torch.nansum(a, 1), y, gradcheck=False)
    check_op(lambda a: tp.nanmean(a, 1), lambda a: torch.nanmean(a, 1), y, gradcheck=False)
    check_op(lambda a: tp.amax(a, 1), lambda a: torch.amax(a, 1), y, gradcheck=False)
    check_op(lambda a: a.max(), lambda a: a.max(), y, gradcheck=False)
    check_op(lambda a: a.max(1), lambda a: a.max(1), y, gradcheck=False)


def test_out_of_range_dims_name_the_op():
    x = tp.randn(3, 4)
    cases = [("sum", lambda: x.sum(2)), ("mean", lambda: x.mean(-3)), ("prod", lambda: x.prod(5)),
             ("amax", lambda: x.amax((0, 2))), ("max_dim", lambda: x.max(3)), ("argmax", lambda: x.argmax(2)),
             ("var", lambda: x.var(4)), ("std", lambda: x.std(4)), ("logsumexp", lambda: tp.logsumexp(x, 2)),
             ("any", lambda: x.any(3)), ("all", lambda: (x > 0).all(2)), ("norm", lambda: x.norm(dim=3)),
             ("cumsum", lambda: x.cumsum(2)), ("cumprod", lambda: x.cumprod(-3)),
             ("count_nonzero", lambda: tp.count_nonzero(x, 2))]
    for name, f in cases:
        with pytest.raises(IndexError, match=rf"tp\.{name}\("):
            f()


# ---------------------------------------------------------------------------------------------
# prod
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4)))
def test_prod_layouts(x):
    check_op(lambda a: a.prod(), lambda a: a.prod(), x)
    check_op(lambda a: a.prod(1), lambda a: a.prod(1), x)
    check_op(lambda a: a.prod(-2, keepdim=True), lambda a: a.prod(-2, keepdim=True), x)
    check_op(lambda a: tp.prod(a, 0, dtype=tp.float64), lambda a: torch.prod(a, 0, dtype=torch.float64), x)


@pytest.mark.parametrize("zeros", [[], [(1, 2)], [(1, 2), (0, 2)], [(1, 2), (1, 0)], [(2, 0), (2, 1), (2, 3)],
                                   [(0, 0), (1, 1), (2, 2), (0, 3)]])
def test_prod_zeros_gradient(zeros):
    x = torch.randn(3, 4, dtype=torch.float64)
    for ij in zeros:
        x[ij] = 0.0
    for dim in (None, 0, 1):
        for keepdim in (False, True):
            if dim is None:
                if keepdim:
                    continue
                check_op(lambda a: a.prod(), lambda a: a.prod(), x, gradcheck=True)
            else:
                check_op(lambda a: a.prod(dim, keepdim), lambda a: a.prod(dim, keepdim), x, gradcheck=True)


def test_prod_zeros_double_backward():
    x = torch.tensor([[0.0, 2.0, 3.0, 0.0], [1.5, 0.0, -2.0, 0.5]], dtype=torch.float64)
    for f in (lambda a: a.prod(1), lambda a: a.prod()):
        assert tp.autograd.gradgradcheck(f, (tp.from_torch(x.clone()).requires_grad_(),))
    one_zero = torch.tensor([0.0, 2.0, 3.0], dtype=torch.float64)
    assert tp.autograd.gradgradcheck(lambda a: a.prod(), (tp.from_torch(one_zero).requires_grad_(),))


def test_prod_int_bool_empty():
    check_op(lambda a: a.prod(1), lambda a: a.prod(1), torch.randint(-3, 4, (3, 4)))
    check_op(lambda a: a.prod(), lambda a: a.prod(), torch.rand(5) > 0.3)
    check_op(lambda a: a.prod(0), lambda a: a.prod(0), torch.randn(0, 2))
    check_op(lambda a: a.prod(), lambda a: a.prod(), torch.randn(2, 0))
    assert tuple(tp.randn(2, 3).prod(None, True).shape) == (1, 1)


# ---------------------------------------------------------------------------------------------
# amax / amin / max / min / argmax / argmin
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4)))
@pytest.mark.parametrize("name", ["amax", "amin"])
def test_amax_amin(x, name):
    for dim in ([], 0, -1, (0, 1)):
        for keepdim in (False, True):
            tf, rf = _fn(name, dim, keepdim)
            check_op(tf, rf, x)
    tf, rf = _fn(name)
    check_op(tf, rf, x)


def test_amax_ties_split_evenly():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [5.0, -1.0, 5.0, 5.0]], dtype=torch.float64)
    for name in ("amax", "amin"):
        for dim in (1, 0, (0, 1)):
            tf, rf = _fn(name, dim)
            check_op(tf, rf, x, gradcheck=False)
        a = tp.from_torch(x.clone()).requires_grad_()
        getattr(tp, name)(a, 1).sum().backward()
        ref = x.clone().requires_grad_()
        getattr(torch, name)(ref, 1).sum().backward()
        assert torch.equal(a.grad.torch(), ref.grad)
    # whole-tensor max/min: even split too
    check_op(lambda a: a.max(), lambda a: a.max(), x, gradcheck=False)
    check_op(lambda a: a.min(), lambda a: a.min(), x, gradcheck=False)
    a = tp.from_torch(x.clone()).requires_grad_()
    a.max().backward()
    assert a.grad.torch().sum().item() == pytest.approx(1.0)
    assert a.grad.torch()[2, 0].item() == pytest.approx(1 / 3)


def test_amax_empty_error_and_int():
    with pytest.raises(IndexError, match=r"tp\.amax\("):
        tp.randn(0, 3).amax(0)
    with pytest.raises(RuntimeError, match=r"tp\.max\("):
        tp.randn(0, 3).max()
    check_op(lambda a: a.amax(1), lambda a: a.amax(1), torch.randn(0, 3))  # the reduced dim is not empty
    check_op(lambda a: a.amax(1), lambda a: a.amax(1), torch.randint(-9, 9, (3, 4)))
    check_op(lambda a: a.amin(), lambda a: a.amin(), torch.rand(3, 4) > 0.5)


@pytest.mark.parametrize("x", layouts((3, 5)))
def test_max_min_overloads(x):
    for name in ("max", "min"):
        check_op(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), x)
        for dim in (0, 1, -1):
            for keepdim in (False, True):
                out = check_op(lambda a: getattr(tp, name)(a, dim, keepdim), lambda a: getattr(torch, name)(a, dim, keepdim), x)
                assert out.values is out[0] and out.indices is out[1]
                assert type(out).__name__ == name
        check_op(lambda a: getattr(a, name)(dim=1, keepdim=True), lambda a: getattr(a, name)(dim=1, keepdim=True), x)
    y = torch.randn(5)
    check_op(lambda a, b: a.max(b), lambda a, b: a.max(b), x, y)
    check_op(lambda a, b: tp.min(a, b), lambda a, b: torch.min(a, b), x, y)
    check_op(lambda a, b: tp.max(a, other=b), lambda a, b: torch.maximum(a, b), x, y)


def test_max_dim_ties_and_scalar():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])   # ties: the gradient goes to the returned index
    check_op(lambda a: a.max(1), lambda a: a.max(1), x, gradcheck=False)
    check_op(lambda a: a.min(0), lambda a: a.min(0), x, gradcheck=False)
    s = torch.tensor(1.5)
    check_op(lambda a: a.max(0), lambda a: a.max(0), s)
    check_op(lambda a: a.max(), lambda a: a.max(), s)
    check_op(lambda a: a.max(0), lambda a: a.max(0), torch.randint(0, 3, (4, 3)))
    with pytest.raises(TypeError, match=r"tp\.max"):
        tp.randn(3).max(keepdim=True)


@pytest.mark.parametrize("x", layouts((4, 3)))
def test_argmax_argmin(x):
    for name in ("argmax", "argmin"):
        for dim in (None, 0, -1):
            for keepdim in (False, True):
                tf, rf = _fn(name, dim, keepdim)
                check_op(tf, rf, x)
    out = tp.from_torch(x).requires_grad_().argmax(1)
    assert out.dtype == tp.int64 and not out.requires_grad
    check_op(lambda a: a.argmax(), lambda a: a.argmax(), torch.tensor([1.0, 3.0, 3.0, NAN, 0.0]))
    check_op(lambda a: a.argmin(0), lambda a: a.argmin(0), torch.randint(-3, 3, (5, 2)))


# ---------------------------------------------------------------------------------------------
# var / std / var_mean / std_mean
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((4, 5)))
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std(x, name):
    check_op(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), x)
    for dim in (0, -1, (0, 1)):
        for keepdim in (False, True):
            check_op(lambda a: getattr(tp, name)(a, dim, keepdim=keepdim),
                     lambda a: getattr(torch, name)(a, dim, keepdim=keepdim), x)
    for c in (0, 2, 0.5):
        check_op(lambda a: getattr(a, name)(1, correction=c), lambda a: getattr(a, name)(1, correction=c), x)
    check_op(lambda a: getattr(a, name)(0, False), lambda a: getattr(a, name)(0, False), x)   # unbiased positional
    check_op(lambda a: getattr(a, name)(False), lambda a: getattr(a, name)(False), x)         # legacy var(x, unbiased)
    check_op(lambda a: getattr(a, name)(dim=1, unbiased=True, keepdim=True),
             lambda a: getattr(a, name)(dim=1, unbiased=True, keepdim=True), x)
    check_op(lambda a: getattr(tp, name)(a, None, keepdim=True, correction=0),
             lambda a: getattr(torch, name)(a, None, keepdim=True, correction=0), x)


@pytest.mark.filterwarnings("ignore::UserWarning")  # var(): degrees of freedom <= 0
def test_var_std_edge_cases():
    # single element with correction 1: NaN forward, NaN gradient like torch
    one = torch.randn(3, 1, dtype=torch.float64)
    check_op(lambda a: a.var(1), lambda a: a.var(1), one, gradcheck=False)
    # constant rows: std = 0 -> gradient 0, not NaN
    const = torch.full((2, 4), 3.0, dtype=torch.float64)
    check_op(lambda a: a.std(1), lambda a: a.std(1), const, gradcheck=False)
    a = tp.from_torch(const.clone()).requires_grad_()
    a.std(1).sum().backward()
    assert torch.equal(a.grad.torch(), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"tp\.var"):
        tp.randn(3).var(unbiased=True, correction=0)
    with pytest.raises(RuntimeError, match=r"tp\.var\("):
        tp.arange(4).var()
    check_op(lambda a: a.var(0), lambda a: a.var(0), torch.randn(0, 3), grad=False)


@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
def test_var_mean(name):
    x = torch.randn(3, 4)
    check_op(lambda a: getattr(tp, name)(a), lambda a: getattr(torch, name)(a), x, exact=False)
    for dim, keepdim in ((1, False), (0, True), ((0, 1), False)):
        out = check_op(lambda a: getattr(tp, name)(a, dim, keepdim=keepdim),
                       lambda a: getattr(torch, name)(a, dim, keepdim=keepdim), x, exact=False)
        assert isinstance(out, tuple) and len(out) == 2
    check_op(lambda a: getattr(tp, name)(a, 1, correction=0), lambda a: getattr(torch, name)(a, 1, correction=0), x,
             exact=False)
    # only one of the two outputs used
    check_op(lambda a: getattr(tp, name)(a, 1)[0], lambda a: getattr(torch, name)(a, 1)[0], x, exact=False)
    check_op(lambda a: getattr(tp, name)(a, 1)[1], lambda a: getattr(torch, name)(a, 1)[1], x, exact=False)


# ---------------------------------------------------------------------------------------------
# logsumexp
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4)))
def test_logsumexp(x):
    for dim in (0, -1, (0, 1), [1, 0]):
        for keepdim in (False, True):
            check_op(lambda a: tp.logsumexp(a, dim, keepdim), lambda a: torch.logsumexp(a, dim, keepdim), x)
            check_op(lambda a: a.logsumexp(dim, keepdim=keepdim), lambda a: a.logsumexp(dim, keepdim=keepdim), x)


def test_logsumexp_special():
    big = torch.tensor([[1000.0, 1000.0], [-INF, -INF], [-INF, 0.0]])
    check_op(lambda a: tp.logsumexp(a, 1), lambda a: torch.logsumexp(a, 1), big, gradcheck=False)
    check_op(lambda a: tp.logsumexp(a, 1), lambda a: torch.logsumexp(a, 1), torch.randint(-3, 3, (2, 3)))
    check_op(lambda a: tp.logsumexp(a, 0), lambda a: torch.logsumexp(a, 0), torch.randn(0, 3))


# ---------------------------------------------------------------------------------------------
# any / all / count_nonzero
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4), dtype=torch.bool) + layouts((3, 4), dtype=torch.int64, low=-1, high=2)
                         + [torch.tensor([[0.0, NAN], [0.0, 0.0], [1.0, -0.0]])])
def test_any_all_count_nonzero(x):
    for name in ("any", "all"):
        for dim in (None, 0, -1, (0, 1)):
            for keepdim in (False, True):
                if dim is None and keepdim:
                    continue
                tf, rf = _fn(name, dim, keepdim=keepdim)
                out = check_op(tf, rf, x)
                assert out.dtype == tp.bool
        check_op(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), x)
    for dim in (None, 0, (0, 1)):
        check_op(lambda a: tp.count_nonzero(a, dim), lambda a: torch.count_nonzero(a, dim), x)


def test_any_all_empty_and_no_grad():
    check_op(lambda a: a.any(), lambda a: a.any(), torch.randn(0, 3))
    check_op(lambda a: a.all(1), lambda a: a.all(1), torch.randn(2, 0))
    y = tp.randn(3, requires_grad=True)
    assert not y.any().requires_grad and not y.all(0).requires_grad


# ---------------------------------------------------------------------------------------------
# norm
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", ["fro", 2, 1, 0, INF, -INF, 3, 1.5, 0.5, -1])
def test_norm_p(p):
    x = torch.randn(3, 4)
    for dim, keepdim in ((None, False), (1, False), (0, True), ((0, 1), False), (None, True)):
        if p == "fro" and dim is not None and not isinstance(dim, tuple):
            continue
        check_op(lambda a: tp.norm(a, p, dim, keepdim), lambda a: torch.norm(a, p, dim, keepdim), x, exact=False)
    check_op(lambda a: a.norm(p=p), lambda a: a.norm(p=p), x.t(), exact=False)


def test_norm_zero_vector_and_ties():
    z = torch.zeros(2, 3, dtype=torch.float64)
    z[1] = torch.tensor([1.0, -2.0, 0.0])
    for p in (2, "fro", 3, 1.5):
        check_op(lambda a: a.norm(p, 1), lambda a: a.norm(p, 1), z, gradcheck=False)
        a = tp.from_torch(z.clone()).requires_grad_()
        a.norm(p, 1).sum().backward()
        assert not torch.isnan(a.grad.torch()).any()
    zz = tp.zeros(4, requires_grad=True)
    zz.norm().backward()
    assert torch.equal(zz.grad.torch(), torch.zeros(4))
    # double backward through the 2-norm of a zero vector is NaN-free too
    zz = tp.zeros(3, dtype=tp.float64, requires_grad=True)
    (g,) = tp.autograd.grad(zz.norm(), zz, create_graph=True)
    (gg,) = tp.autograd.grad(g.sum(), zz, allow_unused=True, materialize_grads=True)
    assert not torch.isnan(gg.torch()).any()
    ties = torch.tensor([[3.0, -3.0, 1.0], [2.0, 0.5, -2.0]], dtype=torch.float64)
    check_op(lambda a: a.norm(INF, 1), lambda a: a.norm(INF, 1), ties, gradcheck=False)
    check_op(lambda a: tp.norm(a, 2, 1, dtype=tp.float64), lambda a: torch.norm(a, 2, 1, dtype=torch.float64),
             torch.randn(2, 3), exact=False)


def test_norm_gradgrad():
    x = tp.from_torch(torch.randn(3, 4, dtype=torch.float64)).requires_grad_()
    for p in (2, 1.5, 3, INF):
        assert tp.autograd.gradgradcheck(lambda a: a.norm(p, 1), (x,))


# ---------------------------------------------------------------------------------------------
# cumsum / cumprod
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 4)))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_cumprod(x, dim):
    check_op(lambda a: a.cumsum(dim), lambda a: a.cumsum(dim), x)
    check_op(lambda a: tp.cumprod(a, dim), lambda a: torch.cumprod(a, dim), x)
    check_op(lambda a: tp.cumsum(a, dim, dtype=tp.float64), lambda a: torch.cumsum(a, dim, dtype=torch.float64), x)


def test_cumsum_cumprod_dtypes_and_edges():
    check_op(lambda a: a.cumsum(0), lambda a: a.cumsum(0), torch.rand(5) > 0.5)
    check_op(lambda a: a.cumsum(1), lambda a: a.cumsum(1), torch.randint(-5, 5, (2, 3), dtype=torch.int32))
    check_op(lambda a: a.cumprod(1), lambda a: a.cumprod(1), torch.randint(-3, 3, (2, 3), dtype=torch.int16))
    for x in (torch.randn(0, 3), torch.randn(3, 1), torch.tensor(1.5)):
        check_op(lambda a: a.cumsum(0), lambda a: a.cumsum(0), x)
        check_op(lambda a: a.cumprod(-1), lambda a: a.cumprod(-1), x)
    check_op(lambda a: a.cumsum(0), lambda a: a.cumsum(0), torch.tensor([1.0, INF, -INF, 2.0]), grad=False)
    assert tp.autograd.gradgradcheck(lambda a: a.cumsum(1),
                                     (tp.from_torch(torch.randn(2, 3, dtype=torch.float64)).requires_grad_(),))


@pytest.mark.parametrize("zeros", [[], [(0, 2)], [(0, 0)], [(0, 4)], [(0, 1), (0, 3)], [(1, 0), (1, 1), (2, 4)]])
def test_cumprod_zeros_gradient(zeros):
    x = torch.randn(3, 5, dtype=torch.float64)
    for ij in zeros:
        x[ij] = 0.0
    check_op(lambda a: a.cumprod(1), lambda a: a.cumprod(1), x, gradcheck=True)
    check_op(lambda a: a.cumprod(0), lambda a: a.cumprod(0), x, gradcheck=True)


@pytest.mark.parametrize("zeros", [[], [(0, 0), (1, 2)], [(0, 1), (0, 3), (1, 1)]])
def test_cumprod_gradgrad(zeros):
    x = torch.randn(2, 4, dtype=torch.float64)
    for ij in zeros:
        x[ij] = 0.0
    x = tp.from_torch(x).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: a.cumprod(1), (x,))
    assert tp.autograd.gradgradcheck(lambda a: a.cumprod(0), (x,))


def test_reduction_tags():
    for name in ("sum", "mean", "prod", "amax", "amin", "max", "min", "max_dim", "min_dim", "argmax", "argmin",
                 "var", "std", "var_mean", "std_mean", "logsumexp", "any", "all", "norm", "count_nonzero"):
        assert "reduction" in tp.ops.OPS[name].tags, name
    for name in ("cumsum", "cumprod"):
        assert "scan" in tp.ops.OPS[name].tags
    for name in ("argmax", "argmin", "any", "all", "count_nonzero"):
        assert tp.ops.OPS[name].backward is None


# ---------------------------------------------------------------------------------------------
# median / nanmedian / mode / aminmax / cummax / cummin
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((4, 5)))
def test_median_mode_aminmax(x):
    for name in ("median", "nanmedian"):
        check_op(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), x)
        for dim in (0, -1):
            for keepdim in (False, True):
                out = check_op(lambda a: getattr(tp, name)(a, dim, keepdim), lambda a: getattr(torch, name)(a, dim, keepdim), x)
                assert type(out).__name__ == name
    for dim in (0, 1):
        check_op(lambda a: a.mode(dim), lambda a: a.mode(dim), x.round(), gradcheck=False)  # ties: grad to the index
    for dim, keepdim in ((None, False), (None, True), (1, False), (0, True)):
        out = check_op(lambda a: tp.aminmax(a, dim=dim, keepdim=keepdim), lambda a: torch.aminmax(a, dim=dim, keepdim=keepdim), x)
        assert out.min is out[0] and out.max is out[1]


def test_median_nan_and_ties():
    y = torch.tensor([[1.0, NAN, 2.0, 0.5], [3.0, 3.0, 1.0, 3.0]])
    check_op(lambda a: a.median(1), lambda a: a.median(1), y, gradcheck=False)
    check_op(lambda a: a.nanmedian(1), lambda a: a.nanmedian(1), y, gradcheck=False)
    check_op(lambda a: a.median(), lambda a: a.median(), y, gradcheck=False)
    check_op(lambda a: a.nanmedian(), lambda a: a.nanmedian(), y, gradcheck=False)
    check_op(lambda a: a.median(), lambda a: a.median(), torch.tensor([2.0, 1.0, 2.0, 5.0]), gradcheck=False)
    check_op(lambda a: tp.aminmax(a), lambda a: torch.aminmax(a), torch.tensor([[2.0, 1.0], [2.0, 1.0]]), gradcheck=False)


@pytest.mark.parametrize("x", layouts((3, 5)))
def test_cummax_cummin(x):
    for name in ("cummax", "cummin"):
        for dim in (0, 1, -1):
            out = check_op(lambda a: getattr(a, name)(dim), lambda a: getattr(a, name)(dim), x)
            assert type(out).__name__ == name
    check_op(lambda a: a.cummax(0), lambda a: a.cummax(0), torch.tensor([1.0, 3.0, 2.0, 3.0, NAN, 0.0]),
             gradcheck=False)
    check_op(lambda a: a.cummin(0), lambda a: a.cummin(0), torch.tensor(2.0))
    check_op(lambda a: a.cummin(1), lambda a: a.cummin(1), torch.randint(-3, 3, (2, 4)))


# ---------------------------------------------------------------------------------------------
# forward mode (tangents derived from the reverse formulas) and the scan helper's meta
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, f", [
    ("sum", lambda m, a: m.sum(a, 1)), ("mean", lambda m, a: m.mean(a, (0, 1))), ("prod", lambda m, a: m.prod(a, 1)),
    ("amax", lambda m, a: m.amax(a, 0)), ("max_dim", lambda m, a: m.max(a, 1)[0]), ("max", lambda m, a: m.max(a)),
    ("var", lambda m, a: m.var(a, 1)), ("std", lambda m, a: m.std(a, 0)), ("logsumexp", lambda m, a: m.logsumexp(a, 1)),
    ("norm", lambda m, a: m.norm(a, 2, 1)), ("norm3", lambda m, a: m.norm(a, 3)), ("cumsum", lambda m, a: m.cumsum(a, 1)),
    ("cumprod", lambda m, a: m.cumprod(a, 0)), ("cummax", lambda m, a: m.cummax(a, 1)[0]),
])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.func.jvp's internals
def test_forward_mode(name, f):
    x = torch.randn(3, 4, dtype=torch.float64)
    v = torch.randn(3, 4, dtype=torch.float64)
    _, ref = torch.func.jvp(lambda a: f(torch, a), (x,), (v,))
    _, got = tp.func.jvp(lambda a: f(tp, a), (tp.from_torch(x),), (tp.from_torch(v),))
    torch.testing.assert_close(got.torch(), ref)


def test_reverse_cumsum_helper():
    op = tp.ops.OPS["_reverse_cumsum"]
    x = torch.randn(3, 4)
    for d in (0, 1, -1):
        check_op(lambda a: op.fn(a, d), lambda a: a.flip(d).cumsum(d).flip(d), x)
        m = op.run_meta(x.t(), d)
        assert m.shape == x.t().shape and m.device.type == "meta"
    check_op(lambda a: op.fn(a, 0), lambda a: a.clone(), torch.tensor(2.0))
