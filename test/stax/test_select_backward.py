"""The gradient of ``select`` compiled by Stax (select_backward: zeros with the gradient at one
index, a masked load under ``eq(index, i)``).

Regression: ``KernelGen``'s per-vector mask test (``CppHandler._range_tests``) decided "no lane
holds" for ``index == i`` from the first and last lane only, which is right for ``<``/``<=``
(monotone) but not for ``==``: an index strictly inside a vector (``(a*2.0)[1]`` of 4 elements,
lanes 0..3) skipped the load and gave a zero gradient on every call after the capture.

Every test runs the compiled function at least twice (the first call is the eager capture) and
compares with torch autograd on the same float32 inputs: the gradient is ``2*g`` placed at the
selected positions (sums of at most two upstream values there), so the compiled result must be
equal up to float32 rounding of those sums.
"""
import pytest
import torch

import tensorplay as tp
from tensorplay.autograd.engine import backward as tp_backward
from tensorplay.testing import assert_close

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _grads(cf, f_torch, shape, calls=3, seed=0):
    """Run ``cf`` (compiled, returns a tuple of views of ``a * 2``) ``calls`` times on fresh random
    inputs with random upstream gradients; compare ``a.grad`` with torch autograd each time."""
    gen = torch.Generator().manual_seed(seed)
    for call in range(calls):
        a0 = torch.randn(*shape, generator=gen)
        a = tp.from_torch(a0.clone()).requires_grad_()
        outs = cf(a)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gs = [torch.randn(o.shape, generator=gen) for o in outs]
        tp_backward(list(outs), [tp.from_torch(g) for g in gs])
        at = a0.clone().requires_grad_()
        want = torch.autograd.grad(f_torch(at), at, gs)[0]
        assert_close(a.grad, want, rtol=1e-6, atol=1e-6, msg=f"call {call}")


@pytest.mark.parametrize("n,i", [(4, 1), (4, 2), (4, 0), (4, 3), (19, 9), (19, 17), (37, 20)])
def test_select_backward_single_index(n, i):
    # the reproducer: (a*2.0)[1] on 4 elements gave a.grad = [0, 0, 0, 0] on the second call
    cf = tp.compile(lambda a: (a * 2.0)[i], strict_native=True)
    _grads(cf, lambda a: ((a * 2.0)[i],), (n,))


@pytest.mark.parametrize("n", [4, 5, 19, 37])
def test_select_backward_every_index_1d(n):
    """Every index 0..n-1 and every negative index -n..-1 of a 1-D tensor (sizes under, at and
    over one vector, with tails), in one compiled region: its backward is one masked load per
    select."""
    idx = list(range(-n, n))
    cf = tp.compile(lambda a: tuple((a * 2.0)[i] for i in idx), strict_native=True)
    _grads(cf, lambda a: tuple((a * 2.0)[i] for i in idx), (n,))


@pytest.mark.parametrize("shape", [(3, 5), (6, 19)])
def test_select_backward_rows_and_cols_2d(shape):
    """Rows ``a[i]`` and columns ``a[:, j]`` of a 2-D tensor, every index and its negative twin."""
    r, c = shape

    def f(a):
        rows = tuple((a * 2.0)[i] for i in range(-r, r))
        cols = tuple((a * 2.0)[:, j] for j in range(-c, c))
        return rows + cols
    _grads(tp.compile(f, strict_native=True), f, shape)


@pytest.mark.parametrize("shape,dim,i", [((3, 5), 1, 2), ((6, 19), 1, -3), ((6, 19), 0, 4), ((2, 3, 18), 2, 7)])
def test_select_backward_single_row_or_col(shape, dim, i):
    cf = tp.compile(lambda a: (a * 2.0).select(dim, i), strict_native=True)
    _grads(cf, lambda a: ((a * 2.0).select(dim, i),), shape)
