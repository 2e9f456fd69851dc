"""Views, shape ops, gather/scatter and indexing against PyTorch (forward, meta, grads, gradcheck),
view semantics (shared storage, versions, in-place on views), and error messages."""
import pytest
import torch

import tensorplay as tp
from harness import check_op, layouts

F = torch.nn.functional


def T(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def I(high, *shape, low=0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g)


# ---- view ops ------------------------------------------------------------------------------------
VIEW_CASES = [
    ("flatten", lambda a: a.flatten()),
    ("flatten_sd", lambda a: tp.flatten(a, 1) if isinstance(a, tp.Tensor) else torch.flatten(a, 1)),
    ("flatten_neg", lambda a: a.flatten(-2, -1)),
    ("unflatten", lambda a: a.unflatten(-1, (2, -1))),
    ("broadcast_to", lambda a: (tp if isinstance(a, tp.Tensor) else torch).broadcast_to(a, (2, 3, 4))),
    ("narrow", lambda a: a.narrow(1, 1, 2)),
    ("narrow_neg", lambda a: a.narrow(-1, -3, 2)),
    ("select", lambda a: a.select(1, -1)),
    ("split_int", lambda a: a.split(3, 1)),
    ("split_list", lambda a: a.split([1, 0, 3], -1)),
    ("chunk", lambda a: a.chunk(2, 0)),
    ("unbind", lambda a: a.unbind(1)),
    ("unbind_neg", lambda a: a.unbind(-1)),
    ("diagonal", lambda a: a.diagonal()),
    ("diagonal_off", lambda a: a.diagonal(1, 1, 0)),
    ("diagonal_neg", lambda a: a.diagonal(-1, -1, -2)),
    ("movedim", lambda a: a.movedim(0, 1)),
    ("swapaxes", lambda a: a.swapaxes(0, 1)),
    ("swapdims", lambda a: a.swapdims(-1, 0)),
    ("mT", lambda a: a.mT),
    ("T", lambda a: a.T),
    ("t", lambda a: a.t()),
    ("squeeze_unsq", lambda a: a.unsqueeze(1).unsqueeze(-1).squeeze()),
    ("expand_as", lambda a: a[:, :1].expand_as(a)),
    ("view_as", lambda a: a.contiguous().view_as(a.reshape(4, 3))),
    ("reshape_as", lambda a: a.reshape_as(a.reshape(2, 6))),
    ("getitem", lambda a: a[1:, ::2]),
    ("getitem_none_ell", lambda a: a[None, ..., -1]),
]


@pytest.mark.parametrize("name,f", VIEW_CASES, ids=[c[0] for c in VIEW_CASES])
def test_view_ops_layouts(name, f):
    for x in layouts((3, 4)):
        check_op(f, f, x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_view_ops_int_bool(dtype):
    x = layouts((3, 4), dtype)[1]
    for name, f in VIEW_CASES:
        check_op(f, f, x)


def test_view_ops_size0_size1():
    for x in (T(0, 4), T(1, 4), T(3, 1)):
        for f in (lambda a: a.flatten(), lambda a: a.split(1, 1), lambda a: a.unbind(0), lambda a: a.chunk(3, 1),
                  lambda a: a.diagonal(), lambda a: a.narrow(1, 0, 1), lambda a: a.movedim(1, 0),
                  lambda a: a.unflatten(1, (a.shape[1], 1))):
            check_op(f, f, x)
    check_op(lambda a: a.flatten(), lambda a: a.flatten(), T())            # 0-d -> [1]
    check_op(lambda a: a.flatten() * 2, lambda a: a.flatten() * 2, T(5))     # 1-d flatten aliases
    check_op(lambda a: a.unbind(0), lambda a: a.unbind(0), T(0, 3))


def test_as_strided():
    x = T(12)
    for size, stride, off in [((3, 4), (4, 1), 0), ((4, 3), (1, 4), None), ((3, 2), (1, 1), 1),   # overlapping
                              ((2, 2), (0, 3), 2), ((0, 3), (3, 1), 0)]:
        f = (lambda s, st, o: lambda a: a.as_strided(s, st, o) * 1)(size, stride, off)
        check_op(f, f, x)
    # a view input: storage_offset is absolute in the storage (PyTorch semantics)
    f = lambda a: (a * 1)[2:].as_strided((2, 3), (3, 1), 3)
    check_op(f, f, x)
    # transposed input and an expanded (self-overlapping) input
    f2 = lambda a: a.t().as_strided((2, 2), (1, 3)) * 1
    check_op(f2, f2, T(3, 4))
    f3 = lambda a: a.expand(2, 3).as_strided((3,), (1,)) * 1
    check_op(f3, f3, T(3))
    x = tp.from_torch(T(6, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: a.as_strided((3, 2), (1, 1), 1), (x,))


# ---- view semantics --------------------------------------------------------------------------------
@pytest.mark.parametrize("f", [lambda a: a[1], lambda a: a[:, 1:3], lambda a: a[None, ..., ::2], lambda a: a.narrow(1, 0, 2),
                               lambda a: a.select(0, 2), lambda a: a.flatten(), lambda a: a.unflatten(1, (2, 2)),
                               lambda a: a.diagonal(), lambda a: a.split(2, 1)[1], lambda a: a.chunk(2)[0],
                               lambda a: a.unbind(1)[2], lambda a: a.movedim(0, 1), lambda a: a.swapaxes(0, 1),
                               lambda a: a.as_strided((2,), (5,), 1), lambda a: a.broadcast_to((2, 3, 4))[1],
                               lambda a: a.contiguous(), lambda a: a.T, lambda a: a.reshape(12), lambda a: a.view(2, 6)])
def test_view_shares_storage(f):
    """Writing through a view changes the base (same storage) and bumps the shared version."""
    x = tp.randn(3, 4)
    ref = x._data.clone()
    v = f(x)
    assert v._base is x
    assert v._data.untyped_storage().data_ptr() == x._data.untyped_storage().data_ptr()
    v0 = x._version
    v.mul_(0).add_(7.0)
    f(ref).mul_(0).add_(7.0)
    assert x._version > v0 and v._version == x._version
    tp.testing.assert_close(x, ref, exact=True)


def test_copying_ops_do_not_alias():
    x = tp.randn(3, 4)
    for y in (x.flip(0), tp.cat([x, x]), x.repeat(1, 1), x[[0, 1]], x[x > 0], x.tril(), x.t().contiguous(),
              x.t().reshape(12)):
        assert y._base is None
        assert y.data_ptr() != x.data_ptr()


def _inplace_on_views(lib, x, w):
    y = x * 1
    y[0].add_(w)
    y.t()[1].mul_(2)
    y[:, 2:].diagonal().mul_(w[:2])
    y.narrow(0, 1, 2).select(1, 0).sub_(w[1:3])
    (y.unbind(0)[2] if lib is tp else y.select(0, 2)).mul_(x[0])   # torch forbids in-place on unbind/split
    (y.split(2, 1)[1] if lib is tp else y.narrow(1, 2, 2))[..., ::2].add_(3)
    y.as_strided((2,), (5,), 1).mul_(w[:2])
    return (y * y).sum(), y


def test_inplace_on_views_autograd():
    xt, wt = T(3, 4, dtype=torch.float64).requires_grad_(), T(4, seed=2, dtype=torch.float64).requires_grad_()
    lt, yt = _inplace_on_views(torch, xt, wt)
    lt.backward()
    x, w = tp.from_torch(xt.detach().clone()).requires_grad_(), tp.from_torch(wt.detach().clone()).requires_grad_()
    lp, yp = _inplace_on_views(tp, x, w)
    tp.testing.assert_close(yp, yt.detach())
    lp.backward()
    tp.testing.assert_close(x.grad, xt.grad)
    tp.testing.assert_close(w.grad, wt.grad)


def test_inplace_on_view_of_leaf_rejected():
    x = tp.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="view of a leaf"):
        x[0].mul_(2)


def test_setitem_bumps_version_and_base():
    x = tp.zeros(3, 4)
    v = x[1]
    v0 = x._version
    v[2] = 5.0
    assert x._version > v0 and x[1, 2].item() == 5.0
    x[x > 4] = 1.0
    assert x.sum().item() == 1.0


# ---- cat / stack -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(dim):
    a, b, c = layouts((3, 4))
    d = T(3, 4)[:, :0] if dim != 0 else T(0, 4)
    check_op(lambda *t: tp.cat(list(t), dim), lambda *t: torch.cat(list(t), dim), a, b, c)
    check_op(lambda *t: tp.cat(list(t), dim=dim), lambda *t: torch.cat(list(t), dim=dim), a, d, c)
    check_op(lambda *t: tp.stack(list(t), dim), lambda *t: torch.stack(list(t), dim), a, b, c)
    ai, bi = layouts((3, 4), torch.int64)[:2]
    check_op(lambda *t: tp.cat(list(t), dim), lambda *t: torch.cat(list(t), dim), ai, bi)
    check_op(lambda *t: tp.stack(list(t), dim), lambda *t: torch.stack(list(t), dim), ai, bi)


def test_cat_mixed_and_legacy_empty():
    check_op(lambda a, b: tp.cat([a, b], 0), lambda a, b: torch.cat([a, b], 0), T(2, 3), T(3, 3, dtype=torch.float64))
    check_op(lambda a, b: tp.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), T(2, 3), T(0))
    x = tp.randn(2, 3, requires_grad=True)
    tp.cat([x, tp.ones(1, 3)]).sum().backward()           # one input needs no grad
    assert x.grad is not None and bool((x.grad._data == 1).all())


def test_cat_stack_errors():
    with pytest.raises(RuntimeError, match=r"tp\.cat.*non-empty"):
        tp.cat([])
    with pytest.raises(RuntimeError, match=r"tp\.stack.*non-empty"):
        tp.stack([])
    with pytest.raises(RuntimeError, match=r"tp\.cat\(tensors: \[float32\[2, 3\], float32\[2, 4\]\]"):
        tp.cat([tp.randn(2, 3), tp.randn(2, 4)])
    with pytest.raises(RuntimeError, match=r"tp\.stack\(tensors: \[float32\[2, 3\], float32\[3, 2\]\]"):
        tp.stack([tp.randn(2, 3), tp.randn(3, 2)])
    with pytest.raises(IndexError, match=r"tp\.cat"):
        tp.cat([tp.randn(2, 3)], 2)
    with pytest.raises(TypeError, match=r"tp\.cat"):
        tp.cat(tp.randn(2, 3))


# ---- repeat / tile / flip / roll / tril / triu -----------------------------------------------------
SHAPE_CASES = [
    ("repeat", lambda a: a.repeat(2, 1)),
    ("repeat_more", lambda a: a.repeat((2, 1, 3))),
    ("repeat_zero", lambda a: a.repeat(0, 2)),
    ("tile", lambda a: a.tile((2,))),
    ("tile_more", lambda a: a.tile(2, 1, 2)),
    ("flip", lambda a: a.flip(0)),
    ("flip2", lambda a: a.flip([0, -1])),
    ("roll", lambda a: a.roll(1)),
    ("roll_dims", lambda a: a.roll((1, -2), (0, 1))),
    ("roll_neg", lambda a: a.roll(-1, -1)),
    ("tril", lambda a: a.tril()),
    ("tril_k", lambda a: a.tril(-1)),
    ("triu", lambda a: a.triu(1)),
    ("tril_", lambda a: (a * 1).tril_(1)),
    ("triu_", lambda a: (a * 1).triu_(-1)),
]


@pytest.mark.parametrize("name,f", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_shape_ops(name, f):
    for x in layouts((3, 4)):
        check_op(f, f, x)
    check_op(f, f, layouts((3, 4), torch.int32)[1])
    if "_" not in name:
        check_op(f, f, layouts((2, 3), torch.bool)[0])
    if not name.startswith(("tri", "roll_dims", "flip2")):
        check_op(f, f, T(0, 3))


def test_flip_roll_tile_1d_0d():
    check_op(lambda a: a.flip(0), lambda a: a.flip(0), T(5))
    check_op(lambda a: a.roll(7), lambda a: a.roll(7), T(5))
    check_op(lambda a: a.tile(3), lambda a: a.tile(3), T())
    check_op(lambda a: a.repeat(2), lambda a: a.repeat(2), T())
    check_op(lambda a: a.tril(), lambda a: a.tril(), T(2, 3, 3))


# ---- pad -------------------------------------------------------------------------------------------
PAD_CASES = [
    ((1, 2), "constant", None), ((1, 2, 0, 1), "constant", 1.5), ((-1, 2), "constant", None),
    ((2, 1), "reflect", None), ((1, 2, 2, 0), "reflect", None), ((2, 3), "replicate", None),
    ((1, 0, 3, 1), "replicate", None), ((1, 2), "circular", None), ((2, 1, 1, 2), "circular", None),
]


@pytest.mark.parametrize("pad,mode,value", PAD_CASES)
def test_pad(pad, mode, value):
    f_tp = lambda a: tp.pad(a, pad, mode, value)
    f_t = lambda a: F.pad(a, pad, mode=mode, value=value)
    for x in layouts((2, 3, 4)):
        check_op(f_tp, f_t, x, gradcheck=False)
    check_op(f_tp, f_t, T(1, 3, 3))  # gradcheck in float64
    if mode == "constant":
        check_op(f_tp, f_t, layouts((3, 4), torch.int64)[1])


def test_pad_double_backward_and_errors():
    x = tp.from_torch(T(1, 2, 3, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: tp.pad(a, (2, 1), "reflect") ** 2, (x,))
    with pytest.raises(ValueError, match=r"tp\.pad.*unknown padding mode"):
        tp.pad(tp.randn(2, 3), (1, 1), "mirror")
    with pytest.raises(ValueError, match=r"tp\.pad.*even length"):
        tp.pad(tp.randn(2, 3), (1, 1, 1))
    with pytest.raises(RuntimeError, match=r"tp\.pad"):
        tp.pad(tp.randn(1, 2, 3), (3, 3), "reflect")


# ---- gather / scatter / index_select / index_add / index_fill ----------------------------------------
def test_gather_scatter():
    for x in layouts((3, 4)):
        idx = I(3, 2, 4)
        idx1 = I(4, 3, 2, seed=3)
        check_op(lambda a, i: a.gather(0, i), lambda a, i: a.gather(0, i), x, idx)
        check_op(lambda a, i: tp.gather(a, -1, i), lambda a, i: torch.gather(a, -1, i), x, idx1)
        src = T(2, 4, seed=4)
        uniq = torch.stack([torch.randperm(3, generator=torch.Generator().manual_seed(k))[:2] for k in range(4)], 1)
        check_op(lambda a, i, s: a.scatter(0, i, s), lambda a, i, s: a.scatter(0, i, s), x, uniq, src)
        check_op(lambda a, i: a.scatter(0, i, 2.5), lambda a, i: a.scatter(0, i, 2.5), x, uniq)
        check_op(lambda a, i, s: a.scatter_add(0, i, s), lambda a, i, s: a.scatter_add(0, i, s), x, idx, src)
        check_op(lambda a, i, s: (a * 1).scatter_add_(0, i, s), lambda a, i, s: (a * 1).scatter_add_(0, i, s), x, idx, src)
        check_op(lambda a, i, s: (a * 1).scatter_(0, i, s), lambda a, i, s: (a * 1).scatter_(0, i, s), x, uniq, src)
    # src larger than the index: only the leading block contributes (torch's autograd rejects this case)
    check_op(lambda a, i, s: a.scatter_add(1, i, s), lambda a, i, s: a.scatter_add(1, i, s), T(3, 4), I(4, 2, 3),
             T(3, 5, seed=5), grad=False)
    s = tp.randn(3, 5, requires_grad=True)
    tp.zeros(3, 4).scatter_add(1, tp.from_torch(I(4, 2, 3)), s).sum().backward()
    assert s.grad[:2, :3].tolist() == [[1.0] * 3] * 2 and s.grad.sum().item() == 6
    check_op(lambda a, i: a.gather(1, i), lambda a, i: a.gather(1, i), layouts((3, 4), torch.int64)[1], I(4, 3, 2))
    check_op(lambda a, i: a.gather(0, i), lambda a, i: a.gather(0, i), T(3, 4), I(3, 0, 4))
    x = tp.from_torch(T(3, 4, dtype=torch.float64)).requires_grad_()
    i = tp.from_torch(I(3, 2, 4))
    assert tp.autograd.gradgradcheck(lambda a: a.gather(0, i) ** 2, (x,))


def test_index_select_add_fill():
    for x in layouts((4, 3)):
        idx = torch.tensor([3, 0, 3, 1])  # duplicates
        check_op(lambda a, i: a.index_select(0, i), lambda a, i: a.index_select(0, i), x, idx)
        check_op(lambda a, i: tp.index_select(a, -1, i), lambda a, i: torch.index_select(a, -1, i), x, idx[1:] % 3)
        src = T(4, 3, seed=6)
        check_op(lambda a, i, s: a.index_add(0, i, s), lambda a, i, s: a.index_add(0, i, s), x, idx, src)
        check_op(lambda a, i, s: a.index_add(0, i, s, alpha=-2), lambda a, i, s: a.index_add(0, i, s, alpha=-2),
                 x, idx, src)
        check_op(lambda a, i, s: (a * 1).index_add_(1, i, s, alpha=3), lambda a, i, s: (a * 1).index_add_(1, i, s, alpha=3),
                 x, torch.tensor([2, 0]), T(4, 2, seed=7))
        check_op(lambda a, i: a.index_fill(1, i, -1.0), lambda a, i: a.index_fill(1, i, -1.0), x, torch.tensor([0, 2, 0]))
        v = T(seed=8)
        check_op(lambda a, i, v: a.index_fill(0, i, v), lambda a, i, v: a.index_fill(0, i, v), x, torch.tensor([1, 1]), v)
        check_op(lambda a, i, v: (a * 1).index_fill_(0, i, v), lambda a, i, v: (a * 1).index_fill_(0, i, v), x,
                 torch.tensor([3]), v)
        check_op(lambda a, i: a.index_fill(0, i, 2.0), lambda a, i: a.index_fill(0, i, 2.0), x, torch.tensor([-1]),
                 grad=False)  # negative index: torch's own backward rejects it
    check_op(lambda a, i: a.index_select(0, i), lambda a, i: a.index_select(0, i), layouts((4, 3), torch.bool)[0],
             torch.tensor([0, 0, 2]))
    check_op(lambda a, i: a.index_select(1, i), lambda a, i: a.index_select(1, i), T(4, 3), torch.tensor([], dtype=torch.long))
    x = tp.from_torch(T(4, 3, dtype=torch.float64)).requires_grad_()
    s = tp.from_torch(T(4, 3, seed=9, dtype=torch.float64)).requires_grad_()
    i = tp.tensor([3, 0, 3, 1])
    assert tp.autograd.gradgradcheck(lambda a, b: a.index_select(0, i) * a.index_add(0, i, b), (x, s))


def test_take_along_dim():
    x = T(3, 4)
    check_op(lambda a, i: tp.take_along_dim(a, i, 1), lambda a, i: torch.take_along_dim(a, i, 1), x, I(4, 3, 5))
    check_op(lambda a, i: a.take_along_dim(i, 0), lambda a, i: a.take_along_dim(i, 0), x, I(3, 2, 1))  # broadcast
    check_op(lambda a, i: tp.take_along_dim(a, i), lambda a, i: torch.take_along_dim(a, i), x, I(12, 5))


def test_masked_fill_select():
    for x in layouts((3, 4)):
        m = torch.rand(3, 4, generator=torch.Generator().manual_seed(3)) > 0.5
        check_op(lambda a, m: a.masked_fill(m, -2.0), lambda a, m: a.masked_fill(m, -2.0), x, m)
        check_op(lambda a, m: a.masked_fill(m, float("inf")), lambda a, m: a.masked_fill(m, float("inf")), x, m[0])
        v = T(seed=5)
        check_op(lambda a, m, v: a.masked_fill(m, v), lambda a, m, v: a.masked_fill(m, v), x, m, v)
        check_op(lambda a, m, v: (a * 1).masked_fill_(m[:, :1], v), lambda a, m, v: (a * 1).masked_fill_(m[:, :1], v),
                 x, m, v)
        check_op(lambda a, m: a.masked_select(m), lambda a, m: a.masked_select(m), x, m)
        check_op(lambda a, m: tp.masked_select(a, m[1]), lambda a, m: torch.masked_select(a, m[1]), x, m)
    # self broadcast up to the mask
    check_op(lambda a, m: tp.masked_fill(a, m, 0.5), lambda a, m: torch.masked_fill(a, m, 0.5), T(4), T(3, 4) > 0)
    check_op(lambda a, m: a.masked_select(m), lambda a, m: a.masked_select(m), T(4), T(3, 4) > 0)
    check_op(lambda a, m: a.masked_fill(m, 7), lambda a, m: a.masked_fill(m, 7), layouts((3, 4), torch.int64)[1],
             T(3, 4) > 0)
    with pytest.raises(RuntimeError, match=r"tp\.masked_fill"):
        tp.randn(3).masked_fill(tp.ones(3), 0.0)
    with pytest.raises(RuntimeError, match=r"tp\.masked_fill"):
        tp.randn(3).masked_fill(tp.ones(4, dtype=tp.bool), 0.0)
    x = tp.from_torch(T(3, 4, dtype=torch.float64)).requires_grad_()
    m = tp.from_torch(T(3, 4) > 0)
    assert tp.autograd.gradgradcheck(lambda a: a.masked_select(m) ** 2, (x,))


def test_one_hot():
    i = I(5, 3, 2)
    for n in (-1, 5, 7):
        check_op(lambda a: tp.one_hot(a, n), lambda a: F.one_hot(a, n), i)
    check_op(lambda a: tp.one_hot(a, 3), lambda a: F.one_hot(a, 3), I(3, 0))
    assert tp.one_hot(tp.tensor([1, 0]), 2).dtype == tp.int64
    assert "nondifferentiable" in tp.ops.OPS["one_hot"].tags
    with pytest.raises(RuntimeError, match=r"tp\.one_hot.*out of range for num_classes=3"):
        tp.one_hot(tp.tensor([0, 3]), 3)
    with pytest.raises(RuntimeError, match=r"tp\.one_hot.*non-negative"):
        tp.one_hot(tp.tensor([0, -1]))
    with pytest.raises(RuntimeError, match=r"tp\.one_hot.*int64"):
        tp.one_hot(tp.tensor([0.0, 1.0]))


def test_gather_scatter_errors():
    x = tp.randn(3, 4)
    with pytest.raises(IndexError, match=r"tp\.gather.*index 3 is out of bounds for dimension 0 with size 3"):
        x.gather(0, tp.tensor([[0, 3]]))
    with pytest.raises(IndexError, match=r"tp\.gather.*index -1 is out of bounds"):
        x.gather(1, tp.tensor([[-1]]))
    with pytest.raises(IndexError, match=r"tp\.scatter_add.*index 7"):
        x.scatter_add(1, tp.tensor([[7]]), tp.ones(1, 1))
    with pytest.raises(IndexError, match=r"tp\.scatter_.*index 5"):
        x.scatter_(0, tp.tensor([[5]]), 1.0)
    with pytest.raises(IndexError, match=r"tp\.index_select.*index 4 is out of bounds for dimension 1 with size 4"):
        x.index_select(1, tp.tensor([0, 4]))
    with pytest.raises(IndexError, match=r"tp\.index_select.*integer dtype"):
        x.index_select(1, tp.tensor([0.0]))
    with pytest.raises(IndexError, match=r"tp\.index_add.*index 9"):
        x.index_add(0, tp.tensor([9]), tp.ones(1, 4))
    with pytest.raises(IndexError, match=r"tp\.gather.*dimension out of range"):
        x.gather(2, tp.tensor([[0]]))
    with pytest.raises(RuntimeError, match=r"tp\.gather"):
        x.gather(0, tp.tensor([0, 1]))  # index rank differs


# ---- advanced indexing: get --------------------------------------------------------------------
IDX = torch.tensor([2, 0, 2, -1])  # duplicates and a negative index
GET_CASES = [
    ("int", lambda a: a[1]),
    ("neg_int", lambda a: a[-1, -2]),
    ("slice_step", lambda a: a[::2, 1::2]),
    ("none", lambda a: a[:, None, 1]),
    ("ellipsis", lambda a: a[..., 1:]),
    ("tensor", lambda a: a[IDX if isinstance(a, torch.Tensor) else tp.from_torch(IDX)]),
    ("tensor_col", lambda a: a[:, IDX % 4 if isinstance(a, torch.Tensor) else tp.from_torch(IDX % 4)]),
    ("list", lambda a: a[[0, 2, 0]]),
    ("list_neg", lambda a: a[:, [-1, 1]]),
    ("two_lists", lambda a: a[[0, 1, 2], [3, 3, 0]]),
    ("broadcast_idx", lambda a: a[[[0], [2]], [1, 3]]),
    ("mixed_slice", lambda a: a[[1, 2], 1:]),
    ("mixed_int", lambda a: a[1, [0, 0, 3]]),
    ("mixed_none_ell", lambda a: a[None, ..., [2, 1]]),
    ("mask", lambda a: a[a > 0]),
    ("mask_row", lambda a: a[(a > 0)[:, 0]]),
    ("mask_col_slice", lambda a: a[1:, (a > 0)[0]]),
    ("mask_list", lambda a: a[[True, False, True]]),
    ("mask_0d", lambda a: a[a.sum() > 0] * 1),
    ("py_bool", lambda a: a[True, 1]),
]


@pytest.mark.parametrize("name,f", GET_CASES, ids=[c[0] for c in GET_CASES])
def test_getitem(name, f):
    for x in layouts((3, 4)):
        check_op(f, f, x)
    check_op(f, f, layouts((3, 4), torch.int64)[1])


def test_getitem_3d_and_empty():
    x = T(2, 3, 4)
    i = torch.tensor([[0, 1], [1, 1]])
    check_op(lambda a: a[0, :, [0, 1]], lambda a: a[0, :, [0, 1]], x)           # torch's int-then-advanced rule
    check_op(lambda a: a[[0, 1], :, [2, 3]], lambda a: a[[0, 1], :, [2, 3]], x)  # separated: advanced dims first
    check_op(lambda a, i: a[:, i, 1:3], lambda a, i: a[:, i, 1:3], x, i)
    check_op(lambda a: a[a[..., 0] > 0], lambda a: a[a[..., 0] > 0], x)         # 2-d mask over leading dims
    check_op(lambda a: a[:, []], lambda a: a[:, []], x)
    check_op(lambda a: a[a > 100], lambda a: a[a > 100], x)                      # empty selection
    check_op(lambda a: a[[0, 0]], lambda a: a[[0, 0]], T(2, 0))


def test_index_duplicates_accumulate_and_double_backward():
    x = tp.randn(3, requires_grad=True)
    x[tp.tensor([0, 0, 2, 0])].sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]
    xd = tp.from_torch(T(3, 4, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: a[[0, 2, 0], 1:] ** 2, (xd,))
    assert tp.autograd.gradgradcheck(lambda a: a[a > 0] ** 2, (xd,))


def test_index_meta():
    op = tp.ops.OPS["index"]
    m = op.run_meta(torch.empty(3, 4, device="meta"), (torch.empty(5, dtype=torch.long, device="meta"), slice(1, None)))
    assert m.shape == (5, 3) and m.device.type == "meta"
    with pytest.raises(RuntimeError, match="data-dependent"):
        op.run_meta(torch.empty(3, 4, device="meta"), torch.empty(3, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(RuntimeError, match="data-dependent"):
        tp.ops.OPS["masked_select"].run_meta(torch.empty(3, device="meta"), torch.empty(3, dtype=torch.bool, device="meta"))


# ---- advanced indexing: set --------------------------------------------------------------------
def _set(idx, val_shape=None, val=None):
    def f(a, *v):
        y = a * 1
        value = v[0] if v else val
        y[idx(y) if callable(idx) else idx] = value
        return y
    return f


def _tidx(t):
    return lambda y: t if isinstance(y, torch.Tensor) else tp.from_torch(t)


SET_CASES = [
    ("int_scalar", 1, None, 3.0),
    ("slice_vec", (slice(None), slice(1, None, 2)), (2,), None),
    ("ellipsis_col", (Ellipsis, 0), (3,), None),
    ("mask_scalar", lambda y: y > 0, None, 0.0),
    ("mask_vec", lambda y: (y > 0)[:, 0], (4,), None),
    ("list_rows", [0, 2], (4,), None),
    ("list_rows_full", [0, 2], (2, 4), None),
    ("dup_rows", [0, 2, 0], (3, 4), None),
    ("tensor_slice", (_tidx(torch.tensor([2, 0])), slice(1, None)), (1, 3), None),
    ("two_idx", ([0, 1, 2], [3, 3, 0]), (3,), None),
    ("tensor_int", (_tidx(torch.tensor([1, -1])), 2), (), None),
    ("lead1_value", 0, (1, 4), None),
]


def _resolve(idx):
    if callable(idx):
        return idx
    if isinstance(idx, tuple) and any(callable(i) for i in idx):
        return lambda y: tuple(i(y) if callable(i) else i for i in idx)
    return idx


@pytest.mark.parametrize("name,idx,vshape,val", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_setitem(name, idx, vshape, val):
    f = _set(_resolve(idx), val=val)
    vals = () if vshape is None else (T(*vshape, seed=11),)
    for x in layouts((3, 4)):
        # duplicate destinations without accumulate: the last write wins, so finite differences of the
        # overwritten value are 0 while autograd (like torch) gives each value its destination's grad
        check_op(f, f, x, *vals, gradcheck=False if name == "dup_rows" else None)
    xi = layouts((3, 4), torch.int64)[1]
    check_op(f, f, xi, *(v.long() for v in vals))


def test_setitem_list_value_dtype_and_leaf():
    x = tp.zeros(3, 4)
    x[[0, 2], 1] = [5, 6]
    assert x[:, 1].tolist() == [5.0, 0.0, 6.0]
    x[1] = tp.ones(4, dtype=tp.float64)
    assert x.dtype == tp.float32 and x[1].sum().item() == 4
    w = tp.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        w[w > 0] = 0.0
    with tp.no_grad():
        w[w > 0] = 0.0
    assert (w._data <= 0).all()


def test_index_put():
    x, v = T(3, 4), T(2, seed=3)
    idx = (torch.tensor([0, 2]), torch.tensor([1, 1]))
    for acc in (False, True):
        check_op(lambda a, b, i, j: a.index_put((i, j), b, accumulate=acc),
                 lambda a, b, i, j: a.index_put((i, j), b, accumulate=acc), x, v, *idx)
        check_op(lambda a, b, i, j: (a * 1).index_put_((i, j), b, acc),
                 lambda a, b, i, j: (a * 1).index_put_((i, j), b, acc), x, v, *idx)
    dup = (torch.tensor([0, 0]), torch.tensor([1, 1]))
    check_op(lambda a, b, i, j: a.index_put((i, j), b, accumulate=True),
             lambda a, b, i, j: a.index_put((i, j), b, accumulate=True), x, v, *dup)


# ---- indexing errors -----------------------------------------------------------------------------
def test_indexing_errors():
    x = tp.randn(3, 4)
    with pytest.raises(IndexError, match=r"tp\.getitem.*index 3 is out of bounds for dimension 0 with size 3"):
        x[3]
    with pytest.raises(IndexError, match=r"tp\.getitem.*index -5 is out of bounds for dimension 1 with size 4"):
        x[0, -5]
    with pytest.raises(IndexError, match=r"tp\.index.*index 3 is out of bounds for dimension 0 with size 3"):
        x[tp.tensor([0, 3])]
    with pytest.raises(IndexError, match=r"tp\.index.*index -4 is out of bounds for dimension 0 with size 3"):
        x[[-4, 0]]
    with pytest.raises(IndexError, match=r"tp\.index.*index 4 is out of bounds for dimension 1 with size 4"):
        x[tp.tensor([0]), 4]
    with pytest.raises(IndexError, match=r"tp\.index.*index 9 is out of bounds for dimension 1"):
        x[1:, [0, 9]]
    with pytest.raises(IndexError, match=r"tp\.index.*boolean mask of shape \[2\] does not match the indexed shape \[3\]"):
        x[tp.tensor([True, False])]
    with pytest.raises(IndexError, match=r"tp\.index.*boolean mask of shape \[4, 3\]"):
        x[tp.ones(4, 3, dtype=tp.bool)]
    with pytest.raises(IndexError, match=r"tp\.index.*too many indices for tensor of dimension 2"):
        x[[0], 0, 0]
    with pytest.raises(IndexError, match=r"tp\.index.*integer dtype"):
        x[tp.tensor([0.0])]
    with pytest.raises(IndexError, match=r"tp\.index.*single ellipsis"):
        x[..., [0], ...]
    with pytest.raises(IndexError, match=r"tp\.setitem_.*index 5 is out of bounds for dimension 0 with size 3"):
        x[tp.tensor([5])] = 1.0
    with pytest.raises(IndexError, match=r"tp\.setitem_.*boolean mask"):
        x[tp.ones(3, 3, dtype=tp.bool)] = 1.0
    with pytest.raises(RuntimeError, match=r"tp\.setitem_"):
        x[[0, 1]] = tp.ones(3)  # value not broadcastable
    with pytest.raises(ValueError, match=r"tp\.getitem"):
        x[::-1]
    with pytest.raises(IndexError, match=r"tp\.index_put.*index 3"):
        x.index_put((tp.tensor([3]),), tp.tensor(1.0))
    assert x.shape == (3, 4)  # nothing crashed, tensor intact


def test_view_op_errors():
    x = tp.randn(3, 4)
    with pytest.raises(IndexError, match=r"tp\.select"):
        x.select(0, 3)
    with pytest.raises(RuntimeError, match=r"tp\.narrow"):
        x.narrow(1, 2, 5)
    with pytest.raises(RuntimeError, match=r"tp\.unflatten"):
        x.unflatten(1, (3, 2))
    with pytest.raises(RuntimeError, match=r"tp\.split"):
        x.split([1, 1], 0)
    with pytest.raises(RuntimeError, match=r"tp\.broadcast_to"):
        tp.broadcast_to(x, (4, 3))
    with pytest.raises(IndexError, match=r"tp\.flatten"):
        x.flatten(0, 2)
    with pytest.raises(RuntimeError, match=r"tp\.as_strided"):
        x.as_strided((100,), (1,))
    with pytest.raises(RuntimeError, match=r"tp\.repeat"):
        x.repeat(2)
    with pytest.raises(IndexError, match=r"tp\.movedim"):
        x.movedim(0, 5)


def test_forward_ad():
    g = torch.Generator().manual_seed(0)
    x = tp.from_torch(torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    w = tp.from_torch(torch.randn(4, generator=g, dtype=torch.float64)).requires_grad_()

    def setitem(a, b):
        y = a * 1
        y[[0, 2]] = b
        return y
    for f, inp in [(lambda a: a[[0, 2, 0], 1:], (x,)), (lambda a: a.gather(0, tp.tensor([[0, 2, 1, 0]])), (x,)),
                   (lambda a: tp.pad(a[None], (2, 1), "reflect"), (x,)), (lambda a: a.split([1, 3], 1), (x,)),
                   (lambda a, b: tp.cat([a, b[None]]), (x, w)), (lambda a: a.as_strided((3, 2), (1, 1), 1), (x,)),
                   (setitem, (x, w))]:
        assert tp.autograd.gradcheck(f, inp, check_forward_ad=True)


def test_double_backward():
    g = torch.Generator().manual_seed(1)
    x = tp.from_torch(torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    w = tp.from_torch(torch.randn(4, generator=g, dtype=torch.float64)).requires_grad_()

    def setitem(a, b):
        y = a * 1
        y[[0, 2]] = b * b
        y[y > 0.5] = 0.0
        return y * y

    def inplace_view(a, b):
        y = a * a
        y[1].mul_(b)
        y.t()[2].add_(b[:3])
        return y
    for f, inp in [(setitem, (x, w)), (inplace_view, (x, w)),
                   (lambda a, b: tp.cat([a * a, b[None]], 0).split([2, 2], 0)[1] ** 2, (x, w)),
                   (lambda a, b: tp.stack([a[0], b]).unbind(1)[2] ** 2, (x, w)),
                   (lambda a: a.repeat(2, 1).tile(1, 2) ** 2, (x,)), (lambda a: tp.pad(a, (1, -1)) ** 2, (x,)),
                   (lambda a, b: a.scatter(1, tp.tensor([[3], [1], [0]]), b[:3, None] * b[:3, None]) ** 2, (x, w)),
                   (lambda a, b: a.masked_fill(a > 0, 1.0).diagonal(1) * b[:3] ** 2, (x, w))]:
        assert tp.autograd.gradgradcheck(f, inp)


def test_take_along_dim_negative_indices_count_from_the_end():
    x = torch.randn(3, 4)
    idx = torch.tensor([[-1, 0, 1, 2], [-3, 2, -2, 0]])
    check_op(lambda a, i: tp.take_along_dim(a, i, 0), lambda a, i: torch.take_along_dim(a, i, 0), x, idx)
    with pytest.raises(IndexError, match="tp.take_along_dim"):
        tp.take_along_dim(tp.from_torch(x), tp.from_torch(torch.tensor([[-4, 0, 0, 0]])), 0)
