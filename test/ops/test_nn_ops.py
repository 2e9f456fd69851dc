"""NN ops and ``tp.nn.functional`` against PyTorch: softmax family, normalizations (with running
statistics), dropout (statistics, shared mask), embedding, convolution, pooling, interpolation,
losses, attention; forward bit-identical where the op is one ATen kernel, gradients vs
torch.autograd, gradcheck / gradgradcheck in float64, and errors naming the op."""
import pytest
import torch
import torch.nn.functional as TF

import tensorplay as tp
import tensorplay.nn.functional as F
from harness import check_op, layouts, to_tp

D = torch.float64


def r(*s, dtype=torch.float32):
    return torch.randn(s, dtype=dtype)


def gg(fn, *inputs):
    """gradgradcheck of fn on float64 copies of the floating inputs (others passed through)."""
    args = tuple(to_tp(x.double(), True) if isinstance(x, torch.Tensor) and x.is_floating_point() else
                 (to_tp(x) if isinstance(x, torch.Tensor) else x) for x in inputs)
    assert tp.autograd.gradgradcheck(fn, args)


# ---- softmax / log_softmax -----------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((3, 5)))
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_log_softmax(x, dim):
    check_op(lambda a: F.softmax(a, dim), lambda a: TF.softmax(a, dim), x)
    check_op(lambda a: F.log_softmax(a, dim), lambda a: TF.log_softmax(a, dim), x)
    check_op(lambda a: tp.softmax(a, dim, dtype=tp.float64), lambda a: torch.softmax(a, dim, dtype=D), x)
    check_op(lambda a: F.softmin(a, dim), lambda a: TF.softmin(a, dim), x, exact=False)


def test_softmax_edge_cases():
    check_op(lambda a: F.softmax(a, 0), lambda a: TF.softmax(a, 0), r())  # 0-d
    check_op(lambda a: F.log_softmax(a, 1), lambda a: TF.log_softmax(a, 1), r(0, 3))
    x = torch.tensor([[0.0, float("-inf"), 1.0], [float("inf"), 0.0, 1.0]])
    check_op(lambda a: F.softmax(a, 1), lambda a: TF.softmax(a, 1), x, grad=False)
    gg(lambda a: F.log_softmax(a, 1), r(2, 3))
    with pytest.raises(IndexError, match=r"tp\.softmax"):
        F.softmax(tp.randn(2, 3), 2)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        F.softmax(tp.randn(2, 3))


# ---- normalizations -------------------------------------------------------------------------------
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    x = r(2, 3, 4)
    w, b = (r(3, 4), r(3, 4)) if affine else (None, None)
    check_op(lambda a, *wb: F.layer_norm(a, (3, 4), *wb), lambda a, *wb: TF.layer_norm(a, (3, 4), *wb),
             x, *([w, b] if affine else []), gradcheck=False)
    check_op(lambda a, *wb: F.layer_norm(a, 3, *wb, eps=1e-3), lambda a, *wb: TF.layer_norm(a, (3,), *wb, eps=1e-3),
             x.transpose(1, 2), *([r(3), r(3)] if affine else []), gradcheck=False)
    small = [r(2, 3, dtype=D)] + ([r(3, dtype=D), r(3, dtype=D)] if affine else [])
    check_op(lambda a, *wb: F.layer_norm(a, [3], *wb), lambda a, *wb: TF.layer_norm(a, [3], *wb), *small,
             gradcheck=True)
    gg(lambda a, *wb: F.layer_norm(a, [3], *wb), *small)


def test_rms_norm():
    x, w = r(2, 3, 4), r(4)
    check_op(lambda a, b: F.rms_norm(a, [4], b), lambda a, b: TF.rms_norm(a, [4], b), x, w, gradcheck=False)
    check_op(lambda a: F.rms_norm(a, (3, 4), eps=1e-2), lambda a: TF.rms_norm(a, (3, 4), eps=1e-2), x)
    small = [r(2, 3, dtype=D), r(3, dtype=D)]
    check_op(lambda a, b: F.rms_norm(a, [3], b), lambda a, b: TF.rms_norm(a, [3], b), *small, gradcheck=True)
    gg(lambda a, b: F.rms_norm(a, [3], b), *small)


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5), (2, 3, 2, 2)])
def test_batch_norm_training_and_running_stats(shape):
    x, w, b = r(*shape), r(shape[1]), r(shape[1])
    rm_t, rv_t = torch.randn(shape[1]), torch.rand(shape[1]) + 0.5
    rm, rv = to_tp(rm_t), to_tp(rv_t)
    check_op(lambda a, c, d: F.batch_norm(a, None, None, c, d, training=True),
             lambda a, c, d: TF.batch_norm(a, None, None, c, d, training=True), x, w, b, gradcheck=False)
    # running statistics updated in place, like torch
    out = F.batch_norm(to_tp(x), rm, rv, to_tp(w), to_tp(b), training=True, momentum=0.3)
    ref = TF.batch_norm(x, rm_t, rv_t, w, b, training=True, momentum=0.3)
    torch.testing.assert_close(out.torch(), ref, rtol=0, atol=0)
    torch.testing.assert_close(rm.torch(), rm_t, rtol=0, atol=0)
    torch.testing.assert_close(rv.torch(), rv_t, rtol=0, atol=0)
    # eval uses the running statistics (gradients too)
    check_op(lambda a, c, d: F.batch_norm(a, rm, rv, c, d, training=False),
             lambda a, c, d: TF.batch_norm(a, rm_t, rv_t, c, d, training=False), x, w, b, gradcheck=False)


def test_batch_norm_gradcheck_and_errors():
    x, w, b = r(3, 2, 2, dtype=D), r(2, dtype=D), r(2, dtype=D)
    check_op(lambda a, c, d: F.batch_norm(a, None, None, c, d, True), lambda a, c, d: TF.batch_norm(a, None, None,
             c, d, True), x, w, b, gradcheck=True)
    gg(lambda a, c, d: F.batch_norm(a, None, None, c, d, True), x, w, b)
    rm, rv = torch.zeros(2, dtype=D), torch.ones(2, dtype=D) * 2
    check_op(lambda a, c: F.batch_norm(a, to_tp(rm), to_tp(rv), c, None, False),
             lambda a, c: TF.batch_norm(a, rm, rv, c, None, False), x, w, gradcheck=True)
    with pytest.raises(ValueError, match=r"tp\.batch_norm.*more than 1 value per channel"):
        F.batch_norm(tp.randn(1, 3), None, None, training=True)
    with pytest.raises(RuntimeError, match=r"tp\.batch_norm\(input: float32\[4, 3\], weight: float32\[5\]"):
        F.batch_norm(tp.randn(4, 3), None, None, tp.randn(5), training=True)


def test_batch_norm_running_stats_version_and_no_grad():
    rm, rv = tp.zeros(3), tp.ones(3)
    v0 = rm._version
    x = tp.randn(4, 3, requires_grad=True)
    y = F.batch_norm(x, rm, rv, training=True)
    assert rm._version > v0 and not rm.requires_grad
    y.sum().backward()  # running stats were updated after the forward: the gradient must not need them
    assert x.grad is not None


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(groups):
    x, w, b = r(2, 4, 3, 2), r(4), r(4)
    check_op(lambda a, c, d: F.group_norm(a, groups, c, d), lambda a, c, d: TF.group_norm(a, groups, c, d),
             x, w, b, gradcheck=False)
    check_op(lambda a: F.group_norm(a, groups), lambda a: TF.group_norm(a, groups), x.transpose(2, 3))
    small = [r(2, 4, 2, dtype=D), r(4, dtype=D), r(4, dtype=D)]
    if groups == 2:
        check_op(lambda a, c, d: F.group_norm(a, 2, c, d), lambda a, c, d: TF.group_norm(a, 2, c, d), *small,
                 gradcheck=True)
        gg(lambda a, c, d: F.group_norm(a, 2, c, d), *small)
    with pytest.raises(RuntimeError, match=r"tp\.group_norm.*divisible"):
        F.group_norm(tp.randn(2, 4, 3), 3)


# ---- dropout --------------------------------------------------------------------------------------
def test_dropout_statistics_and_shared_mask():
    tp.manual_seed(0)
    x = tp.ones(200, 500, requires_grad=True)
    y = F.dropout(x, 0.3, training=True)
    keep = (y.torch() != 0)
    frac = keep.float().mean().item()
    assert abs(frac - 0.7) < 0.01
    assert abs(y.torch().mean().item() - 1.0) < 0.02  # mean preserved by the 1/(1-p) scaling
    torch.testing.assert_close(y.torch()[keep], torch.full_like(y.torch()[keep], 1 / 0.7))
    g = tp.randn(200, 500)
    y.backward(g)
    torch.testing.assert_close(x.grad.torch(), g.torch() * keep / 0.7)  # same mask in backward


def test_dropout_matches_native_dropout_with_seed():
    x = r(50, 40)
    tp.manual_seed(123)
    out, mask = tp.native_dropout(to_tp(x), 0.4, True)
    torch.manual_seed(123)
    ro, rmask = torch.native_dropout(x, 0.4, True)
    torch.testing.assert_close(out.torch(), ro, rtol=0, atol=0)
    assert torch.equal(mask.torch(), rmask)


def test_dropout_forward_ad_uses_same_mask():
    from tensorplay.autograd import forward_ad as fwAD
    tp.manual_seed(1)
    x, t = tp.randn(30, 30, dtype=tp.float64), tp.randn(30, 30, dtype=tp.float64)
    with fwAD.dual_level():
        y = F.dropout(fwAD.make_dual(x, t), 0.5)
        prim, tan = fwAD.unpack_dual(y)
    mask = prim.torch() != 0
    torch.testing.assert_close(tan.torch(), t.torch() * mask * 2.0)


def test_dropout_modes_and_validation():
    x = tp.randn(4, 5, requires_grad=True)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    z = F.dropout(x, 1.0)
    assert bool((z.torch() == 0).all())
    z.sum().backward()
    assert bool((x.grad.torch() == 0).all())
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"tp\.dropout.*between 0 and 1"):
            F.dropout(x, p)
    with pytest.raises(ValueError, match=r"tp\.native_dropout"):
        tp.native_dropout(x, 2.0, True)
    tp.manual_seed(0)
    y = F.dropout2d(tp.ones(8, 50, 3, 3), 0.5)
    per_channel = y.torch().reshape(8, 50, 9)
    assert bool((per_channel == per_channel[..., :1]).all())  # whole channels dropped
    assert 0.3 < (per_channel[..., 0] == 0).float().mean().item() < 0.7
    assert F.dropout1d(tp.ones(3, 4), 0.5).shape == (3, 4)


# ---- embedding -------------------------------------------------------------------------------------
def test_embedding():
    w = r(10, 3)
    idx = torch.tensor([[1, 2, 4], [4, 3, 9]])
    check_op(lambda a: F.embedding(to_tp(idx), a), lambda a: TF.embedding(idx, a), w)
    # padding_idx rows get no gradient (by definition, not the numerical derivative): no gradcheck
    check_op(lambda a: F.embedding(to_tp(idx), a, padding_idx=4), lambda a: TF.embedding(idx, a, padding_idx=4), w,
             gradcheck=False)
    check_op(lambda a: F.embedding(to_tp(idx), a, padding_idx=-1), lambda a: TF.embedding(idx, a, padding_idx=-1), w,
             gradcheck=False)
    check_op(lambda a: F.embedding(to_tp(idx), a, scale_grad_by_freq=True),
             lambda a: TF.embedding(idx, a, scale_grad_by_freq=True), w, gradcheck=False)
    check_op(lambda a: F.embedding(to_tp(idx[:, :0]), a), lambda a: TF.embedding(idx[:, :0], a), w)
    small_idx = to_tp(torch.tensor([0, 2, 2, 1]))
    gg(lambda a: F.embedding(small_idx, a, padding_idx=2) * 1.5, r(3, 2))


def test_embedding_max_norm_and_errors():
    w_t = r(6, 4) * 3
    idx = torch.tensor([0, 2, 5])
    w = to_tp(w_t)
    out = F.embedding(to_tp(idx), w, max_norm=1.0)
    ref = TF.embedding(idx, w_t, max_norm=1.0)
    torch.testing.assert_close(out.torch(), ref)
    torch.testing.assert_close(w.torch(), w_t)  # renormalized in place, like torch
    with pytest.raises(IndexError, match=r"tp\.embedding.*index 6 is out of range"):
        F.embedding(tp.tensor([1, 6]), tp.randn(6, 2))
    with pytest.raises(IndexError, match=r"tp\.embedding.*index -1"):
        F.embedding(tp.tensor([-1]), tp.randn(6, 2))
    with pytest.raises(TypeError, match=r"tp\.embedding"):
        F.embedding(tp.tensor([1.0]), tp.randn(6, 2))


# ---- convolution ----------------------------------------------------------------------------------
CONV2D = [dict(), dict(stride=2), dict(padding=1), dict(padding=(2, 0), stride=(1, 2)), dict(dilation=2, padding=2),
          dict(groups=2), dict(groups=2, stride=2, padding=1, dilation=(1, 2)), dict(padding="same"),
          dict(padding="same", dilation=2), dict(padding="valid")]


@pytest.mark.parametrize("kw", CONV2D, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_conv2d(kw):
    x, w, b = r(2, 4, 7, 6), r(6, 4 // kw.get("groups", 1), 3, 2), r(6)
    check_op(lambda a, c, d: F.conv2d(a, c, d, **kw), lambda a, c, d: TF.conv2d(a, c, d, **kw), x, w, b)
    check_op(lambda a, c: F.conv2d(a, c, **kw), lambda a, c: TF.conv2d(a, c, **kw), x.transpose(2, 3), w)


def test_conv_gradcheck_double_backward_unbatched():
    x, w, b = r(1, 2, 4, 3, dtype=D), r(2, 1, 2, 2, dtype=D), r(2, dtype=D)
    kw = dict(stride=(2, 1), padding=1, groups=2)
    check_op(lambda a, c, d: F.conv2d(a, c, d, **kw), lambda a, c, d: TF.conv2d(a, c, d, **kw), x, w, b,
             gradcheck=True)
    gg(lambda a, c, d: F.conv2d(a, c, d, **kw), x, w, b)
    gg(lambda a, c: F.conv2d(a, c, padding="same"), r(1, 1, 3, 3, dtype=D), r(1, 1, 2, 2, dtype=D))  # asymmetric
    check_op(lambda a, c: F.conv2d(a, c, padding="same"), lambda a, c: TF.conv2d(a, c, padding="same"),
             r(3, 5, 4), r(2, 3, 2, 2))  # unbatched + asymmetric 'same'
    x1, w1 = r(2, 3, 9), r(4, 3, 3)
    for kw1 in (dict(), dict(stride=2, padding=1), dict(padding="same", dilation=3), dict(dilation=2)):
        check_op(lambda a, c: F.conv1d(a, c, **kw1), lambda a, c: TF.conv1d(a, c, **kw1), x1, w1)
    gg(lambda a, c: F.conv1d(a, c, stride=2), r(1, 1, 5, dtype=D), r(1, 1, 2, dtype=D))
    check_op(lambda a, c: F.conv3d(a, c, padding=1), lambda a, c: TF.conv3d(a, c, padding=1), r(1, 2, 3, 3, 3),
             r(2, 2, 2, 2, 2))


def test_conv_transpose():
    x, w, b = r(2, 4, 5, 4), r(4, 3, 3, 2), r(3)
    for kw in (dict(), dict(stride=2, padding=1, output_padding=1), dict(dilation=2)):
        check_op(lambda a, c, d: F.conv_transpose2d(a, c, d, **kw),
                 lambda a, c, d: TF.conv_transpose2d(a, c, d, **kw), x, w, b)
    check_op(lambda a, c: F.conv_transpose2d(a, c, groups=2), lambda a, c: TF.conv_transpose2d(a, c, groups=2),
             x, r(4, 1, 2, 2))
    check_op(lambda a, c: F.conv_transpose1d(a, c, stride=2), lambda a, c: TF.conv_transpose1d(a, c, stride=2),
             r(2, 3, 4), r(3, 2, 3))
    gg(lambda a, c: F.conv_transpose1d(a, c, stride=2), r(1, 1, 3, dtype=D), r(1, 1, 2, dtype=D))


def test_conv_errors():
    with pytest.raises(RuntimeError, match=r"tp\.conv2d\(input: float32\[2, 3, 5, 5\], weight: float32\[4, 2, 3, 3\]"):
        F.conv2d(tp.randn(2, 3, 5, 5), tp.randn(4, 2, 3, 3))
    with pytest.raises(RuntimeError, match=r"tp\.conv2d.*4-d \(batched\) input, got shape \[5, 5\]"):
        F.conv2d(tp.randn(5, 5), tp.randn(4, 2, 3, 3))
    with pytest.raises(RuntimeError, match=r"tp\.conv2d.*strided"):
        F.conv2d(tp.randn(1, 1, 5, 5), tp.randn(1, 1, 3, 3), stride=2, padding="same")
    with pytest.raises(RuntimeError, match=r"tp\.convolution"):
        tp.convolution(tp.randn(1, 1, 5), tp.randn(1, 1, 3, 3))


def test_convolution_op_asymmetric_padding():
    x, w = r(1, 2, 5, 4), r(3, 2, 2, 3)
    ref = TF.conv2d(TF.pad(x, [2, 0, 1, 0]), w)  # H: (1, 0), W: (2, 0)
    check_op(lambda a, c: tp.convolution(a, c, None, 1, [1, 0, 2, 0]),
             lambda a, c: TF.conv2d(TF.pad(a, [2, 0, 1, 0]), c), x, w)
    assert ref.shape == (1, 3, 5, 4)


# ---- pooling -----------------------------------------------------------------------------------------
POOL = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=(2, 3), stride=(1, 2)),
        dict(kernel_size=2, dilation=2), dict(kernel_size=3, stride=2, ceil_mode=True)]


@pytest.mark.parametrize("kw", POOL, ids=str)
def test_max_pool2d(kw):
    x = r(2, 3, 7, 8)
    check_op(lambda a: F.max_pool2d(a, **kw), lambda a: TF.max_pool2d(a, **kw), x)
    check_op(lambda a: F.max_pool2d(a, return_indices=True, **kw),
             lambda a: TF.max_pool2d(a, return_indices=True, **kw), x.transpose(2, 3))
    check_op(lambda a: tp.max_pool2d(a, **kw), lambda a: torch.max_pool2d(a, **kw), x[0])  # unbatched, op form
    kw2 = {k: v for k, v in kw.items() if k != "dilation"}
    check_op(lambda a: F.avg_pool2d(a, **kw2), lambda a: TF.avg_pool2d(a, **kw2), x)


def test_pool_variants_and_double_backward():
    x = r(2, 3, 6, 5)
    check_op(lambda a: F.avg_pool2d(a, 3, 2, 1, count_include_pad=False), lambda a: TF.avg_pool2d(a, 3, 2, 1,
             count_include_pad=False), x)
    check_op(lambda a: F.avg_pool2d(a, 2, divisor_override=3), lambda a: TF.avg_pool2d(a, 2, divisor_override=3), x)
    for size in (1, (3, 2), (None, 4), 5):
        check_op(lambda a: F.adaptive_avg_pool2d(a, size), lambda a: TF.adaptive_avg_pool2d(a, size), x)
    check_op(lambda a: F.adaptive_max_pool2d(a, (3, 2), return_indices=True),
             lambda a: TF.adaptive_max_pool2d(a, (3, 2), return_indices=True), x)
    x1 = r(2, 3, 9)
    check_op(lambda a: F.max_pool1d(a, 3, 2, 1), lambda a: TF.max_pool1d(a, 3, 2, 1), x1)
    check_op(lambda a: F.avg_pool1d(a, 3, 2, 1), lambda a: TF.avg_pool1d(a, 3, 2, 1), x1)
    check_op(lambda a: F.adaptive_avg_pool1d(a, 4), lambda a: TF.adaptive_avg_pool1d(a, 4), x1)
    check_op(lambda a: F.adaptive_max_pool1d(a, 4), lambda a: TF.adaptive_max_pool1d(a, 4), x1)
    s = r(1, 1, 4, 4, dtype=D)
    check_op(lambda a: F.max_pool2d(a, 2, 1), lambda a: TF.max_pool2d(a, 2, 1), s, gradcheck=True)
    gg(lambda a: F.max_pool2d(a, 2, 1) ** 2, s)
    gg(lambda a: tp.max_pool2d(a, [2, 2], [1, 1]) ** 2, s)
    gg(lambda a: F.avg_pool2d(a, 2, 1, 1) ** 2, s)
    gg(lambda a: F.adaptive_avg_pool2d(a, 3) ** 2, s)
    gg(lambda a: F.adaptive_max_pool2d(a, 3) ** 2, s)
    with pytest.raises(RuntimeError, match=r"tp\.max_pool2d_with_indices\(self: float32\[5\]"):
        F.max_pool2d(tp.randn(5), 2)
    with pytest.raises(RuntimeError, match=r"tp\.avg_pool2d"):
        F.avg_pool2d(tp.randn(1, 1, 2, 2), 3)


# ---- interpolate ----------------------------------------------------------------------------------
INTERP = [dict(size=(5, 7)), dict(scale_factor=2), dict(scale_factor=(1.5, 0.5)), dict(size=3),
          dict(scale_factor=2.5, recompute_scale_factor=True)]


@pytest.mark.parametrize("kw", INTERP, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear-ac"])
def test_interpolate_2d(kw, mode):
    extra = dict(mode="bilinear", align_corners=True) if mode == "bilinear-ac" else dict(mode=mode)
    x = r(2, 3, 4, 6)
    check_op(lambda a: F.interpolate(a, **kw, **extra), lambda a: TF.interpolate(a, **kw, **extra), x)


def test_interpolate_1d_gradcheck_and_errors():
    x = r(2, 3, 5)
    for mode in ("nearest", "linear"):
        check_op(lambda a: F.interpolate(a, scale_factor=1.7, mode=mode),
                 lambda a: TF.interpolate(a, scale_factor=1.7, mode=mode), x)
    s = r(1, 1, 2, 3, dtype=D)
    check_op(lambda a: F.interpolate(a, size=(3, 4), mode="bilinear"),
             lambda a: TF.interpolate(a, size=(3, 4), mode="bilinear"), s, gradcheck=True)
    gg(lambda a: F.interpolate(a, scale_factor=2) ** 2, s)
    gg(lambda a: F.interpolate(a, size=(3, 4), mode="bilinear", align_corners=True) ** 2, s)
    with pytest.raises(ValueError, match=r"tp\.interpolate.*exactly one"):
        F.interpolate(tp.randn(1, 1, 4), size=3, scale_factor=2)
    with pytest.raises(NotImplementedError, match=r"tp\.interpolate.*'bicubic'"):
        F.interpolate(tp.randn(1, 1, 4), size=3, mode="bicubic")
    with pytest.raises(ValueError, match="align_corners"):
        F.interpolate(tp.randn(1, 1, 4, 4), size=3, align_corners=True)


# ---- losses -----------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_pointwise_losses(reduction):
    x, t = r(3, 4), r(3, 4)
    for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"):
        check_op(lambda a, b: getattr(F, name)(a, b, reduction=reduction),
                 lambda a, b: getattr(TF, name)(a, b, reduction=reduction), x, t, gradcheck=(reduction == "mean"))
    check_op(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5),
             lambda a, b: TF.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), x, t)
    lp = TF.log_softmax(r(3, 4), 1)
    check_op(lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=True),
             lambda a, b: TF.kl_div(a, b, reduction=reduction, log_target=True), lp, lp.flip(0))
    p = torch.rand(3, 4) + 0.1
    check_op(lambda a, b: F.kl_div(a, b, reduction="batchmean"), lambda a, b: TF.kl_div(a, b, reduction="batchmean"),
             lp, p)


def test_mse_broadcast_warns_and_double_backward():
    with pytest.warns(UserWarning, match="target size"):
        check_op(lambda a, b: F.mse_loss(a, b), lambda a, b: TF.mse_loss(a, b), r(3, 4), r(4))
    gg(lambda a, b: F.mse_loss(a, b), r(2, 3), r(2, 3))
    with pytest.raises(ValueError, match=r"not a valid value for reduction"):
        F.mse_loss(tp.randn(3), tp.randn(3), reduction="avg")
    with pytest.raises(ValueError, match=r"tp\.mse_loss"):
        tp.mse_loss(tp.randn(3), tp.randn(3), "avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    x = TF.log_softmax(r(5, 4), 1)
    t = torch.tensor([0, 3, -100, 1, 3])
    w = torch.rand(4) + 0.5
    check_op(lambda a: F.nll_loss(a, to_tp(t), reduction=reduction), lambda a: TF.nll_loss(a, t, reduction=reduction),
             x, gradcheck=False)
    check_op(lambda a: F.nll_loss(a, to_tp(t), to_tp(w), reduction=reduction),
             lambda a: TF.nll_loss(a, t, w, reduction=reduction), x, gradcheck=False)
    x4, t4 = r(2, 3, 2, 2), torch.randint(0, 3, (2, 2, 2))
    check_op(lambda a: F.nll_loss(a, to_tp(t4), reduction=reduction), lambda a: TF.nll_loss(a, t4, reduction=reduction),
             x4)
    gg(lambda a: F.nll_loss(a, to_tp(t[:3]), to_tp(w.double()), reduction=reduction) * 2, r(3, 4))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_indices(reduction, ls, weighted):
    x = r(6, 5)
    t = torch.tensor([0, 4, 2, -100, 1, 4])
    w = torch.rand(5) + 0.5 if weighted else None
    kw = dict(reduction=reduction, label_smoothing=ls, ignore_index=-100)
    check_op(lambda a: F.cross_entropy(a, to_tp(t), to_tp(w), **kw), lambda a: TF.cross_entropy(a, t, w, **kw), x,
             gradcheck=False)
    xs = r(3, 4, dtype=D)
    ts = torch.tensor([1, 3, 1])
    ws = torch.rand(4, dtype=D) + 0.5 if weighted else None
    check_op(lambda a: F.cross_entropy(a, to_tp(ts), to_tp(ws), ignore_index=3, reduction=reduction,
                                       label_smoothing=ls),
             lambda a: TF.cross_entropy(a, ts, ws, ignore_index=3, reduction=reduction, label_smoothing=ls), xs,
             gradcheck=True)
    gg(lambda a: F.cross_entropy(a, to_tp(ts), to_tp(ws), reduction=reduction, label_smoothing=ls), xs)


def test_cross_entropy_probabilities_and_shapes():
    x = r(4, 3)
    p = torch.softmax(r(4, 3), 1)
    w = torch.rand(3) + 0.5
    for kw in (dict(), dict(label_smoothing=0.1), dict(reduction="sum"), dict(reduction="none", weight=w)):
        tkw = {k: (to_tp(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        check_op(lambda a, b: F.cross_entropy(a, b, **tkw), lambda a, b: TF.cross_entropy(a, b, **kw), x, p)
    check_op(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.3), lambda a, b: TF.cross_entropy(a, b,
             label_smoothing=0.3), r(2, 3, dtype=D), torch.softmax(r(2, 3, dtype=D), 1), gradcheck=True)
    # K-dimensional input (N, C, d1, d2) and unbatched (C,)
    x4, t4 = r(2, 3, 2, 2), torch.randint(0, 3, (2, 2, 2))
    check_op(lambda a: F.cross_entropy(a, to_tp(t4), label_smoothing=0.1),
             lambda a: TF.cross_entropy(a, t4, label_smoothing=0.1), x4)
    check_op(lambda a: F.cross_entropy(a, tp.tensor(2)), lambda a: TF.cross_entropy(a, torch.tensor(2)), r(5))
    # the decomposition agrees with the kernel
    from tensorplay.ops.registry import OPS
    xt, tt = to_tp(x), to_tp(torch.tensor([0, 2, 1, 2]))
    for kw in (dict(), dict(weight=to_tp(w), label_smoothing=0.2)):
        a, lse = OPS["cross_entropy"].decomp(xt, tt, kw.get("weight"), "mean", -100, kw.get("label_smoothing", 0.0))
        b = F.cross_entropy(xt, tt, **kw)
        torch.testing.assert_close(a.torch(), b.torch())
        torch.testing.assert_close(lse.torch(), torch.logsumexp(x, 1, keepdim=True))
    # the backward reads the forward's row statistics: no second logsumexp
    from tensorplay.testing import record_ops
    xg = to_tp(x, True)
    loss = F.cross_entropy(xg, tt)
    with record_ops() as calls:
        loss.backward()
    assert "logsumexp" not in {op.name for op, _, _ in calls}
    xr = x.clone().requires_grad_()
    TF.cross_entropy(xr, torch.tensor([0, 2, 1, 2])).backward()
    torch.testing.assert_close(xg.grad.torch(), xr.grad)


def test_loss_errors():
    with pytest.raises(IndexError,
                       match=r"tp\.cross_entropy\(self: float32\[2, 3\], target: int64\[2\]\).*out of bounds"):
        F.cross_entropy(tp.randn(2, 3), tp.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"tp\.cross_entropy.*label_smoothing"):
        F.cross_entropy(tp.randn(2, 3), tp.tensor([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"tp\.binary_cross_entropy"):
        F.binary_cross_entropy(tp.rand(3), tp.rand(2))
    with pytest.raises(ValueError, match=r"tp\.nll_loss\(self: float32\[2, 3\], target: int64\[3\]\)"):
        F.nll_loss(tp.randn(2, 3), tp.tensor([0, 1, 2]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    x = torch.rand(3, 4) * 0.9 + 0.05
    t = torch.rand(3, 4)
    w = torch.rand(4) + 0.5
    check_op(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), x, t, gradcheck=False)
    check_op(lambda a, b: F.binary_cross_entropy(a, b, to_tp(w), reduction=reduction),
             lambda a, b: TF.binary_cross_entropy(a, b, w, reduction=reduction), x, t, gradcheck=False)
    xs, ts = (torch.rand(2, 3, dtype=D) * 0.8 + 0.1), torch.rand(2, 3, dtype=D)
    check_op(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), xs, ts, gradcheck=True)
    # with logits, pos_weight
    z = r(3, 4)
    pw = torch.rand(4) + 0.5
    check_op(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy_with_logits(a, b, reduction=reduction), z, t, gradcheck=False)
    check_op(lambda a, b: F.binary_cross_entropy_with_logits(a, b, to_tp(w), reduction=reduction,
                                                             pos_weight=to_tp(pw)),
             lambda a, b: TF.binary_cross_entropy_with_logits(a, b, w, reduction=reduction, pos_weight=pw), z, t,
             gradcheck=False)
    zs = r(2, 3, dtype=D)
    pws = to_tp(torch.rand(3, dtype=D) + 0.5)
    check_op(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pws),
             lambda a, b: TF.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pws.torch()),
             zs, ts, gradcheck=True)
    gg(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction, pos_weight=pws), zs, ts)


def test_legacy_reduction_args():
    x, t = r(3), r(3)
    with pytest.warns(UserWarning, match="reduction='sum'"):
        check_op(lambda a, b: F.mse_loss(a, b, size_average=False), lambda a, b: TF.mse_loss(a, b, reduction="sum"),
                 x, t)


# ---- attention ----------------------------------------------------------------------------------------
def _sdpa_case(kind):
    q, k, v = r(2, 2, 4, 3), r(2, 2, 5, 3), r(2, 2, 5, 2)
    if kind == "plain":
        return (q, k, v), {}
    if kind == "causal":
        return (q, k, v), dict(is_causal=True)
    if kind == "scale":
        return (q, k, v), dict(scale=0.3)
    if kind == "bool":
        m = torch.rand(4, 5) > 0.3
        m[:, 0] = True
        return (q, k, v), dict(attn_mask=m)
    if kind == "float":
        return (q, k, v, r(2, 1, 4, 5)), {}
    if kind == "gqa":
        return (r(1, 4, 3, 2), r(1, 2, 5, 2), r(1, 2, 5, 2)), dict(enable_gqa=True)
    if kind == "3d":
        return (r(2, 4, 3), r(2, 5, 3), r(2, 5, 3)), {}


@pytest.mark.parametrize("kind", ["plain", "causal", "scale", "bool", "float", "gqa", "3d"])
def test_sdpa(kind):
    ins, kw = _sdpa_case(kind)
    tkw = {k: (to_tp(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if kind == "float":
        check_op(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                 lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m), *ins, exact=False,
                 gradcheck=False)
    else:
        check_op(lambda *a: F.scaled_dot_product_attention(*a, **tkw),
                 lambda *a: TF.scaled_dot_product_attention(*a, **kw), *ins, exact=False, gradcheck=False)


def test_sdpa_gradcheck_double_backward_and_dropout():
    q, k, v = r(1, 2, 3, dtype=D), r(1, 3, 3, dtype=D), r(1, 3, 2, dtype=D)
    check_op(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True),
             lambda *a: TF.scaled_dot_product_attention(*a, is_causal=True), q, k, v, gradcheck=True, exact=False)
    m = to_tp(torch.tensor([[True, False, True], [True, True, False]]))
    gg(lambda *a: F.scaled_dot_product_attention(*a, attn_mask=m), q, k, v)
    # composite path with dropout: statistics and gradient through the same mask
    tp.manual_seed(0)
    qq = tp.randn(1, 1, 64, 4, requires_grad=True)
    kk, vv = tp.randn(1, 1, 64, 4), tp.ones(1, 1, 64, 4)
    out = F.scaled_dot_product_attention(qq, kk, vv, dropout_p=0.25)
    assert abs(out.torch().mean().item() - 1.0) < 0.15  # rows of softmax sum to 1 in expectation
    out.sum().backward()
    assert qq.grad is not None and bool(torch.isfinite(qq.grad.torch()).all())
    with pytest.raises(RuntimeError, match=r"tp\.scaled_dot_product_attention"):
        F.scaled_dot_product_attention(tp.randn(1, 2, 3), tp.randn(1, 4, 5), tp.randn(1, 4, 5))
    with pytest.raises(RuntimeError, match=r"tp\.scaled_dot_product_attention.*is_causal"):
        F.scaled_dot_product_attention(tp.randn(1, 2, 3), tp.randn(1, 2, 3), tp.randn(1, 2, 3),
                                       attn_mask=tp.ones(2, 2, dtype=tp.bool), is_causal=True)


# ---- activations and helpers of F ----------------------------------------------------------------
def test_functional_activations():
    x = r(3, 4)
    for name, kw in [("relu", {}), ("relu6", {}), ("leaky_relu", dict(negative_slope=0.2)), ("elu", dict(alpha=0.5)),
                     ("gelu", {}), ("gelu", dict(approximate="tanh")), ("silu", {}), ("softplus", dict(beta=2.0)),
                     ("hardtanh", dict(min_val=-0.5, max_val=0.5)), ("sigmoid", {}), ("tanh", {})]:
        check_op(lambda a: getattr(F, name)(a, **kw), lambda a: getattr(TF, name)(a, **kw), x)
    for name in ("mish", "softsign", "tanhshrink", "logsigmoid", "hardsigmoid", "hardswish"):
        check_op(lambda a: getattr(F, name)(a), lambda a: getattr(TF, name)(a), x, exact=False)
    w = torch.rand(4) * 0.5
    check_op(lambda a, b: F.prelu(a, b), lambda a, b: TF.prelu(a, b), r(2, 4, 3), w)
    check_op(lambda a, b, c, d: F.bilinear(a, b, c, d), lambda a, b, c, d: TF.bilinear(a, b, c, d),
             r(3, 2), r(3, 4), r(5, 2, 4), r(5), exact=False)
    check_op(lambda a: F.normalize(a, dim=1), lambda a: TF.normalize(a, dim=1), x, exact=False)
    check_op(lambda a, b: F.cosine_similarity(a, b), lambda a, b: TF.cosine_similarity(a, b), x, r(3, 4), exact=False)
    y = tp.randn(5)
    F.relu(y, inplace=True)
    assert bool((y.torch() >= 0).all())
    check_op(lambda a: F.pad(a, (1, 2)), lambda a: TF.pad(a, (1, 2)), x)
    check_op(lambda a: F.one_hot(a, 5), lambda a: TF.one_hot(a, 5), torch.tensor([0, 3, 4]))


def test_tags_and_meta_registration():
    from tensorplay.ops.registry import OPS
    for name in ("softmax", "conv2d", "batch_norm", "native_dropout", "scaled_dot_product_attention", "embedding"):
        assert "nn" in OPS[name].tags
    for name in ("cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits"):
        assert {"nn", "loss"} <= OPS[name].tags
    assert "random" in OPS["native_dropout"].tags
    assert OPS["scaled_dot_product_attention"].decomp is not None and OPS["conv2d"].decomp is not None


# ---- forward-mode AD, and meta functions of the backward ops ------------------------------------------
_IDX = torch.tensor([0, 2])
FWD_CASES = {
    "softmax": (lambda a: F.log_softmax(a, 1), [(2, 3)]),
    "layer_norm": (lambda a, w: F.layer_norm(a, [3], w), [(2, 3), (3,)]),
    "batch_norm": (lambda a: F.batch_norm(a, None, None, training=True), [(3, 2)]),
    "conv2d_same": (lambda a, w: F.conv2d(a, w, padding="same"), [(1, 1, 3, 3), (1, 1, 2, 2)]),
    "conv_transpose": (lambda a, w: F.conv_transpose2d(a, w, stride=2), [(1, 1, 2, 2), (1, 1, 2, 2)]),
    "max_pool": (lambda a: F.max_pool2d(a, 2, 1), [(1, 1, 3, 3)]),
    "avg_pool": (lambda a: F.avg_pool2d(a, 2, 1, 1), [(1, 1, 3, 3)]),
    "interpolate": (lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), [(1, 1, 2, 2)]),
    "cross_entropy": (lambda a: F.cross_entropy(a, to_tp(_IDX), label_smoothing=0.1), [(2, 3)]),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(1, 2, 2)] * 3),
    "embedding": (lambda w: F.embedding(to_tp(_IDX), w), [(3, 2)]),
}


@pytest.mark.parametrize("name", sorted(FWD_CASES))
def test_forward_ad_and_backward_op_meta(name):
    from harness import check_meta
    from tensorplay.testing import record_ops
    fn, shapes = FWD_CASES[name]
    xs = tuple(to_tp(r(*s, dtype=D), True) for s in shapes)
    assert tp.autograd.gradcheck(fn, xs, check_forward_ad=True)
    # every op run by the first and second backward (dedicated backward ops included) has a
    # meta function reproducing shape, dtype and strides
    with record_ops() as calls:
        y = fn(*xs)
        go = tp.randn(*y.shape, dtype=y.dtype).requires_grad_()
        gs = tp.autograd.grad([y], list(xs), [go], create_graph=True, allow_unused=True)
        s = sum((g * g).sum() for g in gs if g is not None)
        tp.autograd.grad([s], list(xs) + [go], allow_unused=True)
    check_meta(calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(scale=0.4)])
def test_sdpa_backward_reads_the_forward_statistics(dtype, kw):
    """4-D attention without a mask keeps the forward's logsumexp rows: the backward is one fused
    kernel (no recomputed forward, no scores), and its gradients equal torch's."""
    from tensorplay.ops.registry import OPS
    from tensorplay.testing import record_ops
    q, k, v = r(2, 3, 5, 4, dtype=dtype), r(2, 3, 7, 4, dtype=dtype), r(2, 3, 7, 4, dtype=dtype)
    out, lse = OPS["scaled_dot_product_attention"].fn(to_tp(q), to_tp(k), to_tp(v), None, kw.get("is_causal", False),
                                                      kw.get("scale"), False)
    s = (q.double() @ k.double().transpose(-1, -2)) * kw.get("scale", 0.5)
    if kw.get("is_causal"):
        s = s.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(lse.torch().double(), torch.logsumexp(s, -1), atol=tol, rtol=tol)
    tq, tk, tv = (to_tp(t, True) for t in (q, k, v))
    g = r(2, 3, 5, 4, dtype=dtype)
    with record_ops() as calls:
        F.scaled_dot_product_attention(tq, tk, tv, **kw).backward(to_tp(g))
    ops = {op.name for op, _, _ in calls}
    assert "_sdpa_backward" in ops and "softmax" not in ops and "_sdpa_fused_backward" not in ops
    rq, rk, rv = (t.clone().requires_grad_() for t in (q, k, v))
    TF.scaled_dot_product_attention(rq, rk, rv, **kw).backward(g)
    for a, b in zip((tq, tk, tv), (rq, rk, rv)):
        torch.testing.assert_close(a.grad.torch(), b.grad, atol=tol, rtol=tol)
    if dtype == torch.float64:
        assert tp.autograd.gradcheck(lambda *a: F.scaled_dot_product_attention(*a, **kw),
                                     tuple(to_tp(t, True) for t in (q, k, v)))


def test_sdpa_empty_sequence_takes_no_statistics():
    q, k, v = r(1, 2, 0, 4), r(1, 2, 3, 4), r(1, 2, 3, 4)
    check_op(lambda *a: F.scaled_dot_product_attention(*a), lambda *a: TF.scaled_dot_product_attention(*a), q, k, v,
             exact=False, gradcheck=False)


def test_sdpa_layout_contract_drops_the_head_transposes():
    """Attention's output is (B, H, L, E) laid out as (B, L, H, E) -- so ``y.transpose(1, 2)`` is
    contiguous and merging the heads is a view -- and dq / dk / dv of q, k, v split from one
    projection come back in that layout too; the meta function predicts the same strides."""
    from tensorplay.ops.registry import OPS
    B, T, H, D = 2, 9, 3, 4
    x = to_tp(r(B, T, 3 * H * D), True)
    q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in x.split(H * D, 2))
    for kw in (dict(), dict(is_causal=True), dict(attn_mask=to_tp(r(T, T)))):
        y = F.scaled_dot_product_attention(q, k, v, **kw)
        assert y.stride() == (T * H * D, D, H * D, 1) and y.transpose(1, 2).is_contiguous()
        meta = OPS["scaled_dot_product_attention"].fn(*(tp.from_torch(torch.empty_strided(t.shape, t.stride(), device="meta"))
                                                        for t in (q, k, v)), None, False, None, False)[0]
        assert meta.stride() == y.stride()
        gq, gk, gv = OPS["_sdpa_backward"].fn(tp.randn(B, H, T, D), q.detach(), k.detach(), v.detach(), y.detach(),
                                              OPS["scaled_dot_product_attention"].fn(q, k, v, None, False, None,
                                                                                     False)[1], False, None)
        for g in (gq, gk, gv):
            assert g.stride() == (T * H * D, D, H * D, 1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y.transpose(1, 2).reshape(B, T, H * D).square().sum().backward()
    tx = x.detach().torch().requires_grad_()
    tq, tk, tv = (t.reshape(B, T, H, D).transpose(1, 2) for t in tx.split(H * D, 2))
    TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2).reshape(B, T, H * D).square().sum() \
        .backward()
    torch.testing.assert_close(x.grad.torch(), tx.grad, rtol=1e-5, atol=1e-6)
    # contiguous inputs: gradients contiguous
    qc, kc, vc = (to_tp(r(B, H, T, D)) for _ in range(3))
    out, lse = OPS["scaled_dot_product_attention"].fn(qc, kc, vc, None, False, None, False)
    assert all(g.is_contiguous() for g in OPS["_sdpa_backward"].fn(tp.randn(B, H, T, D), qc, kc, vc, out, lse, False,
                                                                      None))
