"""TPX autograd semantics against torch.autograd and finite differences."""
import pytest
import torch

import tensorplay as tp
from tensorplay.testing import assert_close


def pair(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=dtype)
    return tp.from_torch(t.clone()).requires_grad_(), t.clone().requires_grad_()


def test_accumulation_and_shared_subexpressions():
    x, xt = pair(3, 4)
    for _ in range(2):
        y = x * x + x.exp() * 3
        y.sum().backward()
        yt = xt * xt + xt.exp() * 3
        yt.sum().backward()
    assert_close(x.grad, xt.grad)


def test_retain_graph_and_second_backward_error():
    x, xt = pair(5)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_close(x.grad, 4 * xt.detach())
    z = (x * x).sum()
    z.backward()
    with pytest.raises(RuntimeError, match="second time"):
        z.backward()


def test_inplace_after_save_is_detected():
    x, _ = pair(4)
    a = x * 2
    b = a * a        # saves a
    a.add_(1)        # bumps a's version
    with pytest.raises(RuntimeError, match=r"tp\.mul backward: .*modified by an in-place operation.*version 0.*version 1"):
        b.sum().backward()


def test_inplace_on_leaf_requiring_grad_raises_and_no_grad_allows():
    x, _ = pair(3)
    with pytest.raises(RuntimeError, match=r"tp\.add_: a leaf Tensor that requires grad"):
        x.add_(1)
    with tp.no_grad():
        x.add_(1)
    assert x._version == 1


def test_inplace_rebase_matches_torch():
    x, xt = pair(3, 4)
    w, wt = pair(4, seed=1)
    y = x * 1
    y.mul_(w).add_(x).exp_()
    y.sum().backward()
    yt = xt * 1
    yt.mul_(wt).add_(xt).exp_()
    yt.sum().backward()
    assert_close(x.grad, xt.grad)
    assert_close(w.grad, wt.grad)


def test_inplace_on_views_copyslices_matches_torch():
    x, xt = pair(3, 4)
    w, wt = pair(4, seed=1)
    y = x * 1
    y[0].mul_(w)
    y.t()[1].mul_(2)
    y[:, ::2] = w[:2] * 3  # setitem through a strided view
    (y * y).sum().backward()
    yt = xt * 1
    yt[0].mul_(wt)
    yt.t()[1].mul_(2)
    yt[:, ::2] = wt[:2] * 3
    (yt * yt).sum().backward()
    assert_close(x.grad, xt.grad)
    assert_close(w.grad, wt.grad)


def test_hooks_leaf_nonleaf_and_removal():
    x, xt = pair(3)
    seen = []
    h = x.register_hook(lambda g: seen.append(g) or g * 2)
    y = x * 3
    y.register_hook(lambda g: g + 1)
    y.sum().backward()
    # dy = 1 -> hook -> 2; dx = 3 * 2 = 6 -> leaf hook doubles -> 12
    assert_close(x.grad, torch.full((3,), 12.0, dtype=torch.float64))
    assert len(seen) == 1
    h.remove()
    x.grad = None
    (x * 3).sum().backward()
    assert_close(x.grad, torch.full((3,), 3.0, dtype=torch.float64))


def test_retain_grad():
    x, xt = pair(3)
    y = x * 2
    y.retain_grad()
    z = (y * y).sum()
    z.backward()
    assert_close(y.grad, 2 * y.detach()._data)
    assert y.retains_grad


def test_grad_function_and_allow_unused():
    x, xt = pair(3)
    u, _ = pair(3, seed=2)
    y = (x * x * x).sum()
    (g,) = tp.autograd.grad(y, x)
    assert_close(g, 3 * xt.detach() ** 2)
    assert x.grad is None
    with pytest.raises(RuntimeError, match="not used"):
        tp.autograd.grad((x * 2).sum(), [x, u])
    g1, g2 = tp.autograd.grad((x * 2).sum(), [x, u], allow_unused=True)
    assert g2 is None
    g1, g2 = tp.autograd.grad((x * 2).sum(), [x, u], materialize_grads=True)
    assert_close(g2, torch.zeros(3, dtype=torch.float64))


def test_nonscalar_backward_needs_gradient():
    x, xt = pair(3)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    v = tp.from_torch(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    (x * 2).backward(v)
    assert_close(x.grad, 2 * v._data)


def test_double_backward_matches_torch():
    x, xt = pair(4)
    y = (x.exp() * x).sum()
    (g,) = tp.autograd.grad(y, x, create_graph=True)
    (gg,) = tp.autograd.grad((g * g).sum(), x)
    yt = (xt.exp() * xt).sum()
    (gt,) = torch.autograd.grad(yt, xt, create_graph=True)
    (ggt,) = torch.autograd.grad((gt * gt).sum(), xt)
    assert_close(gg, ggt)
    assert tp.autograd.gradgradcheck(lambda a: (a.exp() * a / (a * a + 1)).sum(0), (pair(2, 3)[0],))


def test_backward_inputs_argument():
    x, xt = pair(3)
    w, wt = pair(3, seed=1)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None
    assert_close(w.grad, xt.detach())


def test_grad_modes():
    x, _ = pair(3)
    with tp.no_grad():
        assert not (x * 2).requires_grad
        with tp.enable_grad():
            assert (x * 2).requires_grad
    with tp.inference_mode():
        assert not (x * 2).requires_grad
    with tp.set_grad_enabled(False):
        assert not tp.is_grad_enabled()
    assert tp.is_grad_enabled()

    @tp.no_grad()
    def f(a):
        return a * 2
    assert not f(x).requires_grad


def test_requires_grad_rules():
    with pytest.raises(RuntimeError, match="floating point"):
        tp.tensor([1, 2, 3]).requires_grad_()
    x, _ = pair(3)
    idx = (x * 2).detach()
    assert not idx.requires_grad and idx._version == (x * 2).detach()._version
    d = x.detach()
    assert d._data.data_ptr() == x._data.data_ptr()


class Cube(tp.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * x * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.k, None


class AddOneInplace(tp.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x._data.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    @tp.autograd.once_differentiable
    def backward(ctx, g):
        return g


def test_custom_function():
    x, xt = pair(3)
    y = Cube.apply(x, 2.0)
    assert y.grad_fn.name() == "CubeBackward"
    y.sum().backward()
    assert_close(x.grad, 6 * xt.detach() ** 2)
    # needs_input_grad and saved-tensor version check
    x2, _ = pair(3)
    a = x2 * 1
    y2 = Cube.apply(a, 1.0)
    a.add_(1)
    with pytest.raises(RuntimeError, match="modified by an in-place"):
        y2.sum().backward()
    # mark_dirty on a non-leaf
    b = x2 * 1
    out = AddOneInplace.apply(b)
    assert out is b
    out.sum().backward()
    assert_close(x2.grad, torch.ones(3, dtype=torch.float64))


def test_forward_mode_jvp_against_finite_differences():
    x, xt = pair(3, 2)
    v, _ = pair(3, 2, seed=5)
    f = lambda a: (a.exp() * a).sum(1) / (a * a + 1).sum(1)  # noqa: E731
    out, tan = tp.func.jvp(f, (x.detach(),), (v.detach(),))
    eps = 1e-6
    fd = (f(x.detach() + v.detach() * eps) - f(x.detach() - v.detach() * eps)) / (2 * eps)
    assert_close(tan, fd, rtol=1e-6, atol=1e-8)
    assert tp.autograd.gradcheck(f, (x,), check_forward_ad=True)


def test_vjp_matches_torch():
    x, xt = pair(3, 4)
    c = torch.randn(3, dtype=torch.float64)
    out, fn = tp.func.vjp(lambda a: (a * a).sum(1), x)
    (g,) = fn(tp.from_torch(c))
    (gt,) = torch.autograd.grad((xt * xt).sum(1), xt, c)
    assert_close(g, gt)


def test_dual_level_cleanup():
    from tensorplay.autograd import forward_ad as fwad
    x, _ = pair(3)
    with fwad.dual_level():
        d = fwad.make_dual(x.detach(), tp.ones(3, dtype=tp.float64))
        y = d * d
        assert fwad.unpack_dual(y).tangent is not None
    assert fwad.unpack_dual(y).tangent is None
    with pytest.raises(RuntimeError, match="dual_level"):
        fwad.make_dual(x.detach(), x.detach())


def test_long_chain_no_recursion_limit():
    x, _ = pair(2)
    y = x
    for _ in range(5000):
        y = y * 1.0001
    y.sum().backward()
    assert_close(x.grad, torch.full((2,), 1.0001 ** 5000, dtype=torch.float64), rtol=1e-9, atol=0)
