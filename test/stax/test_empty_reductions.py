"""Reductions over empty dims compiled under strict_native, against PyTorch on the same data.

PyTorch defines them: a sum is 0, a prod 1, any False, all True, mean/var/std NaN, logsumexp
-inf (the log of an empty sum), softmax/log_softmax of an empty input are empty; only the
extremum reductions (amax, amin, argmax, max(dim), aminmax) raise.  Regression: Stax lowered
logsumexp through its max over the reduced dims and refused the program under strict_native
("max over an empty dimension (an error in eager)") although eager returns -inf.

Every compiled function is called twice (the first call is the eager capture) on fresh random
inputs; float results must equal torch's bit for bit (they are constants: 0, 1, NaN, -inf, or
empty), integer and bool results exactly.
"""
import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F

pytestmark = [pytest.mark.usefixtures("stax_cache"),   # conftest.py
              pytest.mark.filterwarnings("ignore:.*degrees of freedom")]

INF = float("inf")

# name -> f(x, lib) with lib = tp or torch's functional namespace pair; one function serves both
CASES = {
    "logsumexp": lambda x, d, L: x.logsumexp(dim=d),
    "logsumexp_keepdim": lambda x, d, L: x.logsumexp(dim=d, keepdim=True),
    "logsumexp_then_add": lambda x, d, L: x.logsumexp(dim=d) * 2 + 1,
    "softmax": lambda x, d, L: L.softmax(x, d if isinstance(d, int) else d[0]),
    "log_softmax": lambda x, d, L: L.log_softmax(x, d if isinstance(d, int) else d[0]),
    "sum": lambda x, d, L: x.sum(d),
    "sum_keepdim": lambda x, d, L: x.sum(d, keepdim=True),
    "mean": lambda x, d, L: x.mean(d),
    "prod": lambda x, d, L: x.prod(d if isinstance(d, int) else d[0]),
    "var": lambda x, d, L: x.var(d),
    "var_correction0": lambda x, d, L: x.var(d, correction=0),
    "std": lambda x, d, L: x.std(d),
    "var_mean": lambda x, d, L: tuple(L.var_mean(x, d)),
    "any": lambda x, d, L: (x > 0).any(d if isinstance(d, int) else d[0]),
    "all": lambda x, d, L: (x > 0).all(d if isinstance(d, int) else d[0]),
    "nansum": lambda x, d, L: x.nansum(d),
    "nanmean": lambda x, d, L: x.nanmean(d),
    "norm2": lambda x, d, L: x.norm(dim=d),
    "norm1": lambda x, d, L: x.norm(p=1, dim=d),
    "count_nonzero": lambda x, d, L: x.count_nonzero(d),
    "int_sum": lambda x, d, L: (x * 10).long().sum(d),
    "int_prod": lambda x, d, L: (x * 10).long().prod(d if isinstance(d, int) else d[0]),
    "exp_sum_log": lambda x, d, L: x.exp().sum(d).log(),
}


class _TorchLib:
    softmax = staticmethod(torch.softmax)
    log_softmax = staticmethod(torch.log_softmax)
    var_mean = staticmethod(torch.var_mean)


class _TpLib:
    softmax = staticmethod(F.softmax)
    log_softmax = staticmethod(F.log_softmax)
    var_mean = staticmethod(tp.var_mean)


def _check(c, want):
    if isinstance(want, tuple):
        assert isinstance(c, tuple) and len(c) == len(want)
        for a, b in zip(c, want):
            _check(a, b)
        return
    c = c._data
    assert c.shape == want.shape and c.dtype == want.dtype, (c.shape, want.shape, c.dtype, want.dtype)
    if c.is_floating_point():
        assert torch.equal(torch.isnan(c), torch.isnan(want)), (c, want)
        assert torch.equal(c.nan_to_num(0.0, INF, -INF), want.nan_to_num(0.0, INF, -INF)), (c, want)
    else:
        assert torch.equal(c, want), (c, want)


def _all_cases(x, dim, L):
    out = []
    for name in sorted(CASES):
        r = CASES[name](x, dim, L)
        out += list(r) if isinstance(r, tuple) else [r]
    return tuple(out)


@pytest.mark.parametrize("shape,dim", [((0, 3), 0), ((3, 0), 1), ((3, 0), -1), ((2, 0, 4), (1,)),
                                       ((2, 0, 4), (0, 1)), ((0,), 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reductions_over_empty_dims_match_torch(shape, dim, dtype):
    """Every case of CASES in one compiled region (one capture, one strict_native check)."""
    gen = torch.Generator().manual_seed(0)
    cf = tp.compile(lambda x: _all_cases(x, dim, _TpLib), strict_native=True)
    for _ in range(2):
        x0 = torch.randn(shape, generator=gen, dtype=dtype)
        out = cf(tp.from_torch(x0))
        _check(out, _all_cases(x0, dim, _TorchLib))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_reduction_over_an_empty_dim_is_native(name):
    """Each case alone (a refusal names its op), float32, the middle dim of a 3-d input."""
    cf = tp.compile(lambda x: CASES[name](x, 1, _TpLib), strict_native=True)
    for seed in range(2):
        x0 = torch.randn((2, 0, 5), generator=torch.Generator().manual_seed(seed))
        _check(cf(tp.from_torch(x0)), CASES[name](x0, 1, _TorchLib))


def test_logsumexp_over_empty_dim_is_minus_inf():
    # the reproducer
    f = tp.compile(lambda x: x.logsumexp(dim=0), strict_native=True)
    for _ in range(2):
        out = f(tp.randn(0, 3))
    assert torch.equal(out._data, torch.full((3,), -INF))


@pytest.mark.parametrize("name,fn", [("amax", lambda x: x.amax(0)), ("amin", lambda x: x.amin(0)),
                                     ("argmax", lambda x: x.argmax(0)), ("max", lambda x: x.max(0)),
                                     ("aminmax", lambda x: tp.aminmax(x, dim=0))])
def test_extremum_over_empty_dim_stays_a_clear_error(name, fn):
    """PyTorch raises for these; the compiled call raises eager's error naming the op."""
    with pytest.raises(RuntimeError, match=rf"{name}.*(non-zero size|empty)"):
        tp.compile(fn, strict_native=True)(tp.randn(0, 3))
    with pytest.raises(IndexError):
        fn(torch.randn(0, 3))
