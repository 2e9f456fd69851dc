"""``tp.nn.functional`` (import as ``F``): the stateless neural-network API, signatures as in
``torch.nn.functional``.

Every function here is a thin adapter onto ops of the op table (:mod:`tensorplay.ops`): it
normalizes PyTorch's conveniences (``stride=None`` meaning ``kernel_size``, ``padding='same'``,
``padding_idx=None``, the legacy ``size_average``/``reduce`` arguments, ``scale_factor`` versus
``size``...) and then calls one op, or — for functions PyTorch itself defines as compositions
(``bilinear``, ``mish``, ``normalize``, dropout inside attention, feature dropout...) — a few ops.
Ops are looked up in the table *at call time*, so the import order of op modules does not matter.

Guarantees:

* results equal PyTorch's: bit for bit where the function is one op (the op's kernel is ATen's),
  to rounding where it is a composition;
* gradients flow through the op table's derivative formulas (so double backward works where the
  ops support it);
* bad arguments raise the same exception class as PyTorch with a message naming the function
  (``tp.dropout: ...``) or, from inside an op, the op and the shapes (``tp.conv2d(input: ...)``).
* randomness (``dropout*``, attention dropout) uses the global generator (``tp.manual_seed``), and the
  mask drawn in the forward pass is reused by the backward pass and by forward-mode AD.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from .._tensor import Tensor
from ..ops.registry import OPS
from ._fhelpers import _check_reduction, _check_tensor, _legacy_reduction, _op

__all__ = [
    # activations
    "relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "elu", "elu_", "gelu", "silu", "mish", "softsign",
    "softplus", "hardtanh", "hardtanh_", "sigmoid", "tanh", "tanhshrink", "logsigmoid", "hardsigmoid", "hardswish",
    "prelu", "softmax", "softmin", "log_softmax",
    # linear / conv / pooling / resampling
    "unfold", "fold",
    "linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "upsample",
    # normalization, dropout, embedding, shape helpers
    "layer_norm", "rms_norm", "batch_norm", "group_norm", "normalize", "cosine_similarity",
    "dropout", "dropout1d", "dropout2d", "dropout3d", "embedding", "one_hot", "pad",
    "pixel_shuffle", "pixel_unshuffle",
    # losses
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits",
    # attention
    "scaled_dot_product_attention",
]


def _inplace(name, input, *args, **kwargs):
    """``name_`` if the table has it, else compute out of place and copy back."""
    if name + "_" in OPS:
        return OPS[name + "_"].fn(input, *args, **kwargs)
    return input.copy_(_op(name)(input, *args, **kwargs))


# =================================================================================================
# activations
# =================================================================================================
def relu(input, inplace=False):
    return _inplace("relu", input) if inplace else _op("relu")(input)


def relu_(input):
    return _inplace("relu", input)


def relu6(input, inplace=False):
    return _inplace("relu6", input) if inplace else _op("relu6")(input)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _inplace("leaky_relu", input, negative_slope) if inplace else _op("leaky_relu")(input, negative_slope)


def leaky_relu_(input, negative_slope=0.01):
    return _inplace("leaky_relu", input, negative_slope)


def elu(input, alpha=1.0, inplace=False):
    return _inplace("elu", input, alpha) if inplace else _op("elu")(input, alpha)


def elu_(input, alpha=1.0):
    return _inplace("elu", input, alpha)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tp.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _op("gelu")(input, approximate=approximate)


def silu(input, inplace=False):
    return _inplace("silu", input) if inplace else _op("silu")(input)


def mish(input, inplace=False):
    """x * tanh(softplus(x)) (composite)."""
    out = input * _op("tanh")(_op("softplus")(input))
    return input.copy_(out) if inplace else out


def softsign(input):
    """x / (1 + |x|) (composite)."""
    return input / (input.abs() + 1)


def softplus(input, beta=1.0, threshold=20.0):
    return _op("softplus")(input, beta, threshold)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError(f"tp.hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _inplace("hardtanh", input, min_val, max_val) if inplace else _op("hardtanh")(input, min_val, max_val)


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    return hardtanh(input, min_val, max_val, inplace=True)


def sigmoid(input):
    return _op("sigmoid")(input)


def tanh(input):
    return _op("tanh")(input)


def tanhshrink(input):
    """x - tanh(x) (composite)."""
    return input - _op("tanh")(input)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x) (composite, stable)."""
    return -_op("softplus")(-input)


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6 (composite)."""
    out = _op("relu6")(input + 3) / 6
    return input.copy_(out) if inplace else out


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6 (composite)."""
    out = input * _op("relu6")(input + 3) / 6
    return input.copy_(out) if inplace else out


def prelu(input, weight):
    """max(0, x) + weight * min(0, x), weight per channel (dim 1) or a single value (composite)."""
    _check_tensor(input, "prelu")
    w = weight
    if weight.numel() != 1:
        if input.dim() < 1 or (input.dim() >= 2 and input.shape[1] != weight.numel()) or (
                input.dim() == 1 and input.shape[0] != weight.numel()):
            raise RuntimeError(f"tp.prelu: weight has {weight.numel()} elements but the channel dim of the input "
                               f"{list(input.shape)} has a different size")
        if input.dim() >= 2:
            w = weight.reshape([1, -1] + [1] * (input.dim() - 2))
    else:
        w = weight.reshape([])
    return _op("where")(input > 0, input, w * input)


def _softmax_dim(name, ndim):
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  f"as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("softmax", input.dim())
    return _op("softmax")(input, dim, dtype)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("softmin", input.dim())
    return _op("softmax")(-input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("log_softmax", input.dim())
    return _op("log_softmax")(input, dim, dtype)


# =================================================================================================
# linear, convolution
# =================================================================================================
def linear(input, weight, bias=None):
    return _op("linear")(input, weight, bias)


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o] (composite einsum)."""
    if weight.dim() != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]:
        raise RuntimeError(f"tp.bilinear: shapes input1 {list(input1.shape)}, input2 {list(input2.shape)}, weight "
                           f"{list(weight.shape)} do not match (need weight (out, in1, in2))")
    y = _op("einsum")("...i,oij,...j->...o", [input1, weight, input2])
    return y if bias is None else y + bias


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _op("conv1d")(input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _op("conv2d")(input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _op("conv3d")(input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _op("conv_transpose1d")(input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _op("conv_transpose2d")(input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _op("conv_transpose3d")(input, weight, bias, stride, padding, output_padding, groups, dilation)


# =================================================================================================
# pooling
# =================================================================================================
def _stride(stride, kernel_size):
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        return kernel_size
    return stride


def _one(v, name, fn):
    if isinstance(v, (list, tuple)):
        if len(v) != 1:
            raise ValueError(f"tp.{fn}: {name} must be an int or a 1-tuple, got {v}")
        return v[0]
    return v


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    stride = _stride(stride, kernel_size)
    if return_indices:
        return tuple(_op("max_pool2d_with_indices")(input, kernel_size, stride, padding, dilation, ceil_mode))
    return _op("max_pool2d_with_indices")(input, kernel_size, stride, padding, dilation, ceil_mode)[0]


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Pools (N, C, L) / (C, L) as a 2-d pooling over a (1, L) plane."""
    if input.dim() not in (2, 3):
        raise RuntimeError(f"tp.max_pool1d: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape "
                           f"{list(input.shape)}")
    k = _one(kernel_size, "kernel_size", "max_pool1d")
    s = _one(_stride(stride, kernel_size), "stride", "max_pool1d")
    p, d = _one(padding, "padding", "max_pool1d"), _one(dilation, "dilation", "max_pool1d")
    out, idx = _op("max_pool2d_with_indices")(input.unsqueeze(-2), [1, k], [1, s], [0, p], [1, d], ceil_mode)
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _op("avg_pool2d")(input, kernel_size, _stride(stride, kernel_size), padding, ceil_mode, count_include_pad,
                             divisor_override)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    if input.dim() not in (2, 3):
        raise RuntimeError(f"tp.avg_pool1d: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape "
                           f"{list(input.shape)}")
    k = _one(kernel_size, "kernel_size", "avg_pool1d")
    s = _one(_stride(stride, kernel_size), "stride", "avg_pool1d")
    p = _one(padding, "padding", "avg_pool1d")
    return _op("avg_pool2d")(input.unsqueeze(-2), [1, k], [1, s], [0, p], ceil_mode, count_include_pad,
                             None).squeeze(-2)


def _pair2(v, name, fn):
    v = (v, v) if isinstance(v, int) else tuple(v)
    if len(v) != 2:
        raise ValueError(f"tp.{fn}: {name} must be an int or a pair of ints, got {v}")
    return list(v)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks of a batched image (im2col): ``(N, C, H, W) -> (N, C*kh*kw, L)``."""
    return _op("im2col")(input, _pair2(kernel_size, "kernel_size", "unfold"), _pair2(dilation, "dilation", "unfold"),
                         _pair2(padding, "padding", "unfold"), _pair2(stride, "stride", "unfold"))


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks back into an image (col2im), the adjoint of :func:`unfold`."""
    return _op("col2im")(input, _pair2(output_size, "output_size", "fold"), _pair2(kernel_size, "kernel_size", "fold"),
                         _pair2(dilation, "dilation", "fold"), _pair2(padding, "padding", "fold"),
                         _pair2(stride, "stride", "fold"))


def _adaptive_size(input, output_size, nd):
    if isinstance(output_size, (list, tuple)):
        if len(output_size) != nd:
            raise ValueError(f"output_size must have {nd} elements, got {output_size}")
        return [input.shape[input.dim() - nd + i] if s is None else s for i, s in enumerate(output_size)]
    return [output_size] * nd


def adaptive_avg_pool2d(input, output_size):
    return _op("adaptive_avg_pool2d")(input, _adaptive_size(input, output_size, 2))


def adaptive_avg_pool1d(input, output_size):
    if input.dim() not in (2, 3):
        raise RuntimeError(f"tp.adaptive_avg_pool1d: expected a 2-d or 3-d input, got shape {list(input.shape)}")
    size = _adaptive_size(input, output_size, 1)[0]
    return _op("adaptive_avg_pool2d")(input.unsqueeze(-2), [1, size]).squeeze(-2)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    out, idx = _op("adaptive_max_pool2d")(input, _adaptive_size(input, output_size, 2))
    return (out, idx) if return_indices else out


def adaptive_max_pool1d(input, output_size, return_indices=False):
    if input.dim() not in (2, 3):
        raise RuntimeError(f"tp.adaptive_max_pool1d: expected a 2-d or 3-d input, got shape {list(input.shape)}")
    size = _adaptive_size(input, output_size, 1)[0]
    out, idx = _op("adaptive_max_pool2d")(input.unsqueeze(-2), [1, size])
    out = out.squeeze(-2)
    return (out, idx.squeeze(-2)) if return_indices else out


# =================================================================================================
# resampling
# =================================================================================================
def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    warnings.warn("nn.functional.upsample is deprecated. Use nn.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


# =================================================================================================
# normalization
# =================================================================================================
def _shape_list(s):
    return [s] if isinstance(s, numbers.Integral) else list(s)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _op("layer_norm")(input, _shape_list(normalized_shape), weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return _op("rms_norm")(input, _shape_list(normalized_shape), weight, eps)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    _check_tensor(input, "batch_norm")
    if training:
        size = list(input.shape)
        if len(size) < 2:
            raise ValueError(f"tp.batch_norm: expected an input of at least 2 dims (N, C, ...), got {size}")
        n = size[0]
        for s in size[2:]:
            n *= s
        if n == 1:
            raise ValueError(f"tp.batch_norm: expected more than 1 value per channel when training, got input "
                             f"size {size}")
    elif running_mean is None or running_var is None:
        raise ValueError("tp.batch_norm: running_mean and running_var are required when training=False")
    return _op("batch_norm")(input, weight, bias, running_mean, running_var, training,
                             0.0 if momentum is None else momentum, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return _op("group_norm")(input, num_groups, weight, bias, eps)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """input / max(||input||_p along dim, eps) (composite)."""
    if out is not None:
        raise NotImplementedError("tp.normalize: out= is not supported")
    denom = input.norm(p, [dim], keepdim=True).clamp_min(eps)
    return input / denom


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) along dim (composite), of the inputs
    broadcast to one shape first (as torch: the norms are taken along the broadcast dim)."""
    shape = torch.broadcast_shapes(x1.shape, x2.shape)
    x1, x2 = x1.expand(shape), x2.expand(shape)
    n1 = x1.norm(2, [dim], keepdim=True).clamp_min(eps)
    n2 = x2.norm(2, [dim], keepdim=True).clamp_min(eps)
    return ((x1 / n1) * (x2 / n2)).sum(dim)


# =================================================================================================
# dropout
# =================================================================================================
def _check_p(p, fn):
    if not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"tp.{fn}: dropout probability has to be between 0 and 1, but got {p}")


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p (scaling the rest by 1/(1-p)) when training."""
    _check_p(p, "dropout")
    _check_tensor(input, "dropout")
    if not training or p == 0:
        return input
    if p == 1:
        out = input * 0.0
    else:
        out = _op("native_dropout")(input, float(p), True)[0]
    return input.copy_(out) if inplace else out


def _feature_dropout(input, p, training, inplace, nd, fn):
    _check_p(p, fn)
    _check_tensor(input, fn)
    if input.dim() not in (nd + 1, nd + 2):
        raise RuntimeError(f"tp.{fn}: expected a {nd + 1}-d (unbatched) or {nd + 2}-d (batched) input, got shape "
                           f"{list(input.shape)}")
    if not training or p == 0:
        return input
    lead = input.dim() - nd
    shape = list(input.shape[:lead]) + [1] * nd
    if p == 1:
        out = input * 0.0
    else:
        keep = _op("native_dropout")(input.new_ones(shape), float(p), True)[0]   # 0 or 1/(1-p) per channel
        out = input * keep
    return input.copy_(out) if inplace else out


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, L) / (C, L) inputs."""
    return _feature_dropout(input, p, training, inplace, 1, "dropout1d")


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, H, W) / (C, H, W) inputs.  A 2-d input is dropped element by
    element with PyTorch's deprecation warning (as PyTorch does: each (n, c) is its own channel)."""
    if isinstance(input, Tensor) and input.dim() == 2:
        warnings.warn("tp.dropout2d: received a 2-D input, which is deprecated (as in PyTorch); each element is "
                      "dropped as its own channel -- use dropout for that", UserWarning, stacklevel=2)
        out = _feature_dropout(input.unsqueeze(-1).unsqueeze(-1), p, training, False, 2, "dropout2d").reshape(input.shape)
        return input.copy_(out) if inplace else out
    return _feature_dropout(input, p, training, inplace, 2, "dropout2d")


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, D, H, W) / (C, D, H, W) inputs."""
    return _feature_dropout(input, p, training, inplace, 3, "dropout3d")


# =================================================================================================
# embedding, one_hot, pad
# =================================================================================================
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    _check_tensor(input, "embedding")
    _check_tensor(weight, "embedding", "weight")
    nw = weight.shape[0]
    if padding_idx is not None:
        if padding_idx >= nw or padding_idx < -nw:
            raise ValueError(f"tp.embedding: padding_idx {padding_idx} must be within num_embeddings ({nw})")
        if padding_idx < 0:
            padding_idx = nw + padding_idx
    else:
        padding_idx = -1
    if max_norm is not None:
        # rescale, in place and without gradient, the rows that are looked up and exceed max_norm
        with torch.no_grad():
            torch.embedding_renorm_(weight._data, input._data.contiguous(), max_norm, norm_type)
    return _op("embedding")(weight, input, padding_idx, scale_grad_by_freq, sparse)


def one_hot(tensor, num_classes=-1):
    return _op("one_hot")(tensor, num_classes)


def pad(input, pad, mode="constant", value=None):
    return _op("pad")(input, list(pad), mode, value)


def pixel_shuffle(input, upscale_factor):
    return _op("pixel_shuffle")(input, upscale_factor)


def pixel_unshuffle(input, downscale_factor):
    return _op("pixel_unshuffle")(input, downscale_factor)


# =================================================================================================
# losses
# =================================================================================================
def _warn_size(input, target, fn):
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). "
                      f"This will likely lead to incorrect results due to broadcasting. Please ensure they have "
                      f"the same size.", stacklevel=3)


def _weighted(loss_fn, input, target, reduction, weight, fn):
    if weight is None:
        return loss_fn(input, target, reduction)
    per = loss_fn(input, target, "none") * weight
    return per if reduction == "none" else (per.sum() if reduction == "sum" else per.mean())


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "mse_loss")
    _warn_size(input, target, "mse_loss")
    return _weighted(_op("mse_loss"), input, target, reduction, weight, "mse_loss")


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "l1_loss")
    _warn_size(input, target, "l1_loss")
    return _weighted(_op("l1_loss"), input, target, reduction, weight, "l1_loss")


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "smooth_l1_loss")
    if beta < 0:
        raise RuntimeError(f"tp.smooth_l1_loss: beta must be non-negative, got {beta}")
    _warn_size(input, target, "smooth_l1_loss")
    return _op("smooth_l1_loss")(input, target, reduction, float(beta))


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    _check_reduction(reduction, "huber_loss")
    if delta <= 0:
        raise RuntimeError(f"tp.huber_loss: delta must be positive, got {delta}")
    _warn_size(input, target, "huber_loss")
    return _weighted(lambda a, b, r: _op("huber_loss")(a, b, r, float(delta)), input, target, reduction, weight,
                     "huber_loss")


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "kl_div", ("batchmean",))
    return _op("kl_div")(input, target, reduction, log_target)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "nll_loss")
    return _op("nll_loss")(input, target, weight, reduction, ignore_index)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"tp.cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    return _op("cross_entropy")(input, target, weight, reduction, ignore_index, float(label_smoothing))[0]


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "binary_cross_entropy")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"tp.binary_cross_entropy: using a target size ({list(target.shape)}) that is different "
                         f"to the input size ({list(input.shape)}) is not supported")
    return _op("binary_cross_entropy")(input, target, weight, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "binary_cross_entropy_with_logits")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"tp.binary_cross_entropy_with_logits: target size ({list(target.shape)}) must be the same "
                         f"as input size ({list(input.shape)})")
    return _op("binary_cross_entropy_with_logits")(input, target, weight, pos_weight, reduction)


# =================================================================================================
# attention
# =================================================================================================
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q kᵀ * scale + mask) @ v, with dropout on the attention weights when dropout_p > 0.

    Without dropout this is one op (ATen's fused kernel forward and backward, the backward reading
    the forward's softmax statistics);
    with dropout it is composed of tp ops (matmul, softmax, native_dropout), so that the dropout
    mask is shared by forward and backward."""
    _check_p(dropout_p, "scaled_dot_product_attention")
    if attn_mask is not None and is_causal:
        raise RuntimeError("tp.scaled_dot_product_attention: attn_mask and is_causal=True cannot both be given")
    if dropout_p > 0:
        from ..ops.nn_ops import sdpa_composite
        return sdpa_composite(query, key, value, attn_mask, float(dropout_p), is_causal, scale, enable_gqa)
    return _op("scaled_dot_product_attention")(query, key, value, attn_mask, is_causal, scale, enable_gqa)[0]


from .functional_extra import *  # noqa: F401,F403,E402  (the rest of the API)
from .functional_extra import __all__ as _extra_all  # noqa: E402
__all__ += _extra_all
