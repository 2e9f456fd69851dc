"""The rest of ``tp.nn.functional`` (re-exported there): activations selu, celu, threshold,
hardshrink, softshrink, glu, rrelu; the distances pairwise_distance; the margin, embedding and
likelihood losses (margin_ranking, hinge_embedding, soft_margin, multi_margin, multilabel_margin,
multilabel_soft_margin, cosine_embedding, triplet_margin, triplet_margin_with_distance,
poisson_nll, gaussian_nll) and ctc_loss; interpolate (every mode of PyTorch: nearest, nearest-exact,
linear, bilinear, bicubic, trilinear, area; antialias) and instance_norm (with running statistics).
Signatures and defaults are PyTorch's.

Guarantees:

* the activations are one op each (ATen kernel: bit-identical to PyTorch), except rrelu in training
  mode, which draws its slopes with ``uniform_`` from the global generator and applies them with
  ``where``: the same distribution as PyTorch, and the gradient is the drawn slope where x <= 0;
* the losses are compositions of table ops in the order ATen composes them (so their gradients are
  the table's formulas and they trace into compiled graphs); values agree with PyTorch to rounding,
  usually bit for bit; ctc_loss is the extern table op ``_ctc_loss`` (ATen's forward and backward);
* ``reduction`` is ``'none' | 'mean' | 'sum'`` (legacy ``size_average``/``reduce`` translated);
  bad arguments raise the exception class PyTorch raises, with a message naming ``tp.<function>``;
* interpolate is one resampling op of the table (ATen's kernel, bit-identical; mode 'area' is
  adaptive average pooling, as in PyTorch); instance_norm is batch_norm over the (1, N*C, ...) view,
  as ATen computes it, and updates the running statistics in place with the mean over the batch of
  the per-sample updates (PyTorch's rule, written in tp ops so that a compiled module updates them
  too; equal to PyTorch's to rounding).
"""
from __future__ import annotations

import math

import torch

from ..autograd.grad_mode import no_grad
from ._fhelpers import _check_reduction, _check_tensor, _legacy_reduction, _op

__all__ = [
    "selu", "selu_", "celu", "celu_", "threshold", "threshold_", "hardshrink", "softshrink", "glu", "rrelu", "rrelu_",
    "pairwise_distance", "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "multi_margin_loss",
    "multilabel_margin_loss", "multilabel_soft_margin_loss", "cosine_embedding_loss", "triplet_margin_loss",
    "triplet_margin_with_distance_loss", "poisson_nll_loss", "gaussian_nll_loss", "ctc_loss",
    "interpolate", "upsample_nearest", "upsample_bilinear", "adaptive_avg_pool3d", "instance_norm",
]


# =================================================================================================
# activations
# =================================================================================================
def _maybe_inplace(name, input, inplace, *args):
    return _op(name + "_")(input, *args) if inplace else _op(name)(input, *args)


def selu(input, inplace=False):
    return _maybe_inplace("selu", input, inplace)


def selu_(input):
    return selu(input, True)


def celu(input, alpha=1.0, inplace=False):
    return _maybe_inplace("celu", input, inplace, alpha)


def celu_(input, alpha=1.0):
    return celu(input, alpha, True)


def threshold(input, threshold, value, inplace=False):
    return _maybe_inplace("threshold", input, inplace, threshold, value)


def threshold_(input, threshold, value):
    return _maybe_inplace("threshold", input, True, threshold, value)


def hardshrink(input, lambd=0.5):
    return _op("hardshrink")(input, lambd)


def softshrink(input, lambd=0.5):
    return _op("softshrink")(input, lambd)


def glu(input, dim=-1):
    _check_tensor(input, "glu")
    return _op("glu")(input, dim)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """x where x > 0, else a * x with a ~ U(lower, upper) per element (training) or a = (lower + upper) / 2."""
    _check_tensor(input, "rrelu")
    if lower > upper:
        raise ValueError(f"tp.rrelu: lower bound ({lower}) must not exceed the upper bound ({upper})")
    if not training:
        return _maybe_inplace("leaky_relu", input, inplace, (lower + upper) / 2)
    from .. import empty_like
    slope = empty_like(input).uniform_(lower, upper)
    out = _op("where")(input > 0, input, input * slope)
    return input.copy_(out) if inplace else out


def rrelu_(input, lower=1.0 / 8, upper=1.0 / 3, training=False):
    return rrelu(input, lower, upper, training, True)


# =================================================================================================
# distances
# =================================================================================================
def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p over the last dim (of the broadcast shape)."""
    _check_tensor(x1, "pairwise_distance", "x1")
    _check_tensor(x2, "pairwise_distance", "x2")
    d = max(x1.dim(), x2.dim(), 1) - 1
    diff = x1 - x2 + eps
    if diff.dim() == 0:
        diff = diff.reshape([1])
    return diff.norm(p, [d], keepdim=keepdim)


# =================================================================================================
# losses
# =================================================================================================
def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


def _reduction(size_average, reduce, reduction, fn):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, fn)
    return reduction


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """max(0, -target * (input1 - input2) + margin), reduced."""
    reduction = _reduction(size_average, reduce, reduction, "margin_ranking_loss")
    if not input1.dim() == input2.dim() == target.dim():
        raise RuntimeError(f"tp.margin_ranking_loss: all input tensors should have the same number of dims, got "
                           f"{list(input1.shape)}, {list(input2.shape)}, {list(target.shape)}")
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0), reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    """x where target == 1, max(0, margin - x) where target == -1, reduced."""
    reduction = _reduction(size_average, reduce, reduction, "hinge_embedding_loss")
    where = _op("where")
    margin_part = where(target != 1, (margin - input).clamp(min=0), 0.0)
    self_part = where(target != -1, input, 0.0)
    return _reduce(margin_part + self_part, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """log(1 + exp(-target * input)), reduced."""
    reduction = _reduction(size_average, reduce, reduction, "soft_margin_loss")
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"tp.soft_margin_loss: target size {list(target.shape)} must be the same as input size "
                         f"{list(input.shape)}")
    return _reduce((-input * target).exp().log1p(), reduction)


def _margin_input(input, target, fn):
    """(2-d input, 1-d target, unbatched?) after the shape checks of the multi-class margin losses."""
    _check_tensor(input, fn)
    if input.dim() not in (1, 2) or (input.dim() == 2 and input.shape[1] == 0):
        raise RuntimeError(f"tp.{fn}: expected a non-empty 1-d or 2-d input (N, C), got {list(input.shape)}")
    if input.dim() == 1:
        return input.unsqueeze(0), target.reshape([1, -1]) if fn == "multilabel_margin_loss" else target.reshape([1]), \
            True
    return input, target, False


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    """sum over classes i != y of weight[y] * max(0, margin - x[y] + x[i])^p / C, per sample."""
    reduction = _reduction(size_average, reduce, reduction, "multi_margin_loss")
    if p not in (1, 2):
        raise ValueError(f"tp.multi_margin_loss: only p == 1 and p == 2 are supported, got {p}")
    x, t, unbatched = _margin_input(input, target, "multi_margin_loss")
    n, c = x.shape
    if t.dim() != 1 or t.shape[0] != n:
        raise RuntimeError(f"tp.multi_margin_loss: inconsistent target size {list(target.shape)} for input "
                           f"{list(input.shape)}")
    if n and (bool((t < 0).any()) or bool((t >= c).any())):
        raise IndexError(f"tp.multi_margin_loss: target out of range [0, {c}) for input {list(input.shape)}")
    ti = t.unsqueeze(1)
    z = (margin - x.gather(1, ti) + x).clamp(min=0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight[t].unsqueeze(1)
    own = _op("one_hot")(t, c) != 0
    loss = _op("where")(own, 0.0, z).sum(1) / c
    if unbatched:
        loss = loss.reshape([])
    return _reduce(loss, reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """sum over target classes j and non-target classes k of max(0, 1 - (x[j] - x[k])) / C, per sample;
    the targets of a sample are its leading entries up to the first -1."""
    reduction = _reduction(size_average, reduce, reduction, "multilabel_margin_loss")
    x, t, unbatched = _margin_input(input, target, "multilabel_margin_loss")
    n, c = x.shape
    if tuple(t.shape) != (n, c):
        raise RuntimeError(f"tp.multilabel_margin_loss: target size {list(target.shape)} must equal input size "
                           f"{list(input.shape)}")
    if n and (bool((t < -1).any()) or bool((t >= c).any())):
        raise IndexError(f"tp.multilabel_margin_loss: target out of range [-1, {c}) for input {list(input.shape)}")
    valid = (t != -1).long().cumprod(1) != 0                             # (N, J): entries before the first -1
    safe = _op("where")(valid, t, 0)
    hit = (_op("one_hot")(safe, c) != 0) & valid.unsqueeze(2)              # (N, J, C)
    is_target = hit.any(1)                                                # (N, C)
    xt = x.gather(1, safe)                                                # (N, J)
    z = (1 - xt.unsqueeze(2) + x.unsqueeze(1)).clamp(min=0)               # (N, J, K)
    keep = valid.unsqueeze(2) & (~is_target).unsqueeze(1)
    loss = _op("where")(keep, z, 0.0).sum([1, 2]) / c
    if unbatched:
        loss = loss.reshape([])
    return _reduce(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log sigmoid(x) + (1 - t) log sigmoid(-x)) (times weight), averaged over classes, reduced."""
    reduction = _reduction(size_average, reduce, reduction, "multilabel_soft_margin_loss")
    logsig = _op("softplus")
    loss = -(target * -logsig(-input) + (1 - target) * -logsig(input))
    if weight is not None:
        loss = loss * weight
    cd = input.dim() - 1
    loss = loss.sum(cd) / input.shape[cd]
    return _reduce(loss, reduction)


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1, reduced."""
    reduction = _reduction(size_average, reduce, reduction, "cosine_embedding_loss")
    if target.dim() > 1 or input1.dim() != input2.dim() or input1.dim() != target.dim() + 1:
        raise RuntimeError(f"tp.cosine_embedding_loss: expected 1-d/2-d inputs of equal rank and a 0-d/1-d target, "
                           f"got {list(input1.shape)}, {list(input2.shape)}, target {list(target.shape)}")
    d = input1.dim() - 1
    eps = 1e-12
    prod = (input1 * input2).sum(d)
    m1 = (input1 * input1).sum(d) + eps
    m2 = (input2 * input2).sum(d) + eps
    cos = prod / (m1 * m2).sqrt()
    where = _op("where")
    loss = where(target == 1, 1 - cos, 0.0) + where(target == -1, (cos - margin).clamp(min=0), 0.0)
    return _reduce(loss, reduction)


def _triplet_dims(anchor, positive, negative, fn):
    if not anchor.dim() == positive.dim() == negative.dim():
        raise RuntimeError(f"tp.{fn}: the anchor, positive and negative tensors must have the same number of dims, "
                           f"got {anchor.dim()}-d, {positive.dim()}-d and {negative.dim()}-d")


def _triplet(dist, anchor, positive, negative, margin, swap, reduction):
    d_pos = dist(anchor, positive)
    d_neg = dist(anchor, negative)
    if swap:
        d_neg = _op("minimum")(d_neg, dist(positive, negative))
    return _reduce((margin + d_pos - d_neg).clamp(min=0), reduction)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    """max(0, margin + d(a, p) - d(a, n)) with d the pairwise p-norm distance, reduced."""
    reduction = _reduction(size_average, reduce, reduction, "triplet_margin_loss")
    _triplet_dims(anchor, positive, negative, "triplet_margin_loss")
    if margin <= 0:
        raise ValueError(f"tp.triplet_margin_loss: margin must be greater than 0, got {margin}")
    return _triplet(lambda a, b: pairwise_distance(a, b, p, eps), anchor, positive, negative, margin, swap, reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False,
                                      reduction="mean"):
    """triplet_margin_loss with any distance function (default pairwise_distance)."""
    _check_reduction(reduction, "triplet_margin_with_distance_loss")
    if margin <= 0:
        raise ValueError(f"tp.triplet_margin_with_distance_loss: margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative, "triplet_margin_with_distance_loss")
    return _triplet(distance_function or pairwise_distance, anchor, positive, negative, margin, swap, reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    """exp(x) - t x (log_input) or x - t log(x + eps); full adds Stirling's term where t > 1; reduced."""
    reduction = _reduction(size_average, reduce, reduction, "poisson_nll_loss")
    loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
    if full:
        stirling = target * target.log() - target + 0.5 * (2 * math.pi * target).log()
        loss = loss + _op("where")(target <= 1, 0.0, stirling)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """0.5 (log var + (x - t)^2 / var) (+ 0.5 log 2 pi), var clamped at eps (the clamp passes the
    gradient through, as PyTorch's in-place clamp under no_grad does); reduced."""
    if isinstance(var, (int, float)):
        if var < 0:
            raise ValueError("tp.gaussian_nll_loss: var has negative entry/entries")
        var = input.new_full(list(input.shape), float(var))
    elif bool((var < 0).any()):
        raise ValueError("tp.gaussian_nll_loss: var has negative entry/entries")
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = var.unsqueeze(-1)
        elif not (input.dim() == var.dim() and sum(v for i, v in zip(input.shape, var.shape) if i != v) == 1):
            raise ValueError(f"tp.gaussian_nll_loss: var is of incorrect size {list(var.shape)} for input "
                             f"{list(input.shape)}")
    _check_reduction(reduction, "gaussian_nll_loss")
    var = var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (var.log() + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def _lengths(x, fn, name):
    if isinstance(x, torch.Tensor) or hasattr(x, "tolist"):
        x = x.tolist()
    x = [int(v) for v in (x if isinstance(x, (list, tuple)) else [x])]
    if any(v < 0 for v in x):
        raise RuntimeError(f"tp.{fn}: {name} must be non-negative, got {x}")
    return x


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """Connectionist temporal classification loss of log_probs (T, N, C) or (T, C) against targets
    (N, S) padded or concatenated (sum(target_lengths),); 'mean' divides each sample's loss by its
    target length (at least 1) and averages."""
    _check_tensor(log_probs, "ctc_loss", "log_probs")
    _check_reduction(reduction, "ctc_loss")
    il = _lengths(input_lengths, "ctc_loss", "input_lengths")
    tl = _lengths(target_lengths, "ctc_loss", "target_lengths")
    unbatched = log_probs.dim() == 2
    lp = log_probs.unsqueeze(1) if unbatched else log_probs
    nll = _op("_ctc_loss")(lp, targets, il, tl, blank, zero_infinity)[0]
    if zero_infinity:
        nll = _op("where")(nll == math.inf, 0.0, nll)
    if unbatched:
        nll = nll.reshape([])
    if reduction == "mean":
        from .. import tensor
        lens = tensor(tl, dtype=nll.dtype).clamp(min=1)
        return (nll / (lens.reshape([]) if unbatched else lens)).mean()
    return _reduce(nll, reduction)


# =================================================================================================
# resampling
# =================================================================================================
_INTERP = {("nearest", 1): "upsample_nearest1d", ("nearest", 2): "upsample_nearest2d",
           ("nearest", 3): "upsample_nearest3d", ("nearest-exact", 1): "_upsample_nearest_exact1d",
           ("nearest-exact", 2): "_upsample_nearest_exact2d", ("nearest-exact", 3): "_upsample_nearest_exact3d",
           ("linear", 1): "upsample_linear1d", ("bilinear", 2): "upsample_bilinear2d",
           ("bicubic", 2): "upsample_bicubic2d", ("trilinear", 3): "upsample_trilinear3d"}
_ALIGNED = ("linear", "bilinear", "bicubic", "trilinear")
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")


def _interp_size(input, size, scale_factor, recompute_scale_factor, nd):
    """(output size, scales passed to the kernel or None)."""
    if (size is None) == (scale_factor is None):
        raise ValueError("tp.interpolate: exactly one of size or scale_factor must be given")
    if size is not None:
        out = list(size) if isinstance(size, (list, tuple)) else [size] * nd
        if len(out) != nd:
            raise ValueError(f"tp.interpolate: size {size} must have {nd} elements for input shape "
                             f"{list(input.shape)}")
        if recompute_scale_factor:
            raise ValueError("tp.interpolate: recompute_scale_factor is not meaningful with an explicit size")
        return [int(o) for o in out], None
    sf = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * nd
    if len(sf) != nd:
        raise ValueError(f"tp.interpolate: scale_factor {scale_factor} must have {nd} elements for input "
                         f"shape {list(input.shape)}")
    out = [int(math.floor(float(s * f))) for s, f in zip(input.shape[2:], sf)]
    return out, (None if recompute_scale_factor else [float(f) for f in sf])


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resample the spatial dims (all but N, C) to ``size`` or by ``scale_factor``."""
    _check_tensor(input, "interpolate")
    nd = input.dim() - 2
    if mode not in _MODES:
        raise NotImplementedError(f"tp.interpolate: mode {mode!r} is not supported (one of {', '.join(_MODES)})")
    if nd < 1 or nd > 3:
        raise NotImplementedError(f"tp.interpolate: only 3-d, 4-d and 5-d inputs are supported, got shape "
                                  f"{list(input.shape)} (mode {mode!r})")
    if mode not in _ALIGNED and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if antialias and not (mode in ("bilinear", "bicubic") and nd == 2):
        raise ValueError("tp.interpolate: antialias is restricted to the bilinear and bicubic modes and needs a "
                         "4-d input")
    if mode != "area" and (mode, nd) not in _INTERP:
        need = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}[mode]
        raise NotImplementedError(f"tp.interpolate: mode {mode!r} needs a {need}-d input, got shape "
                                  f"{list(input.shape)}")
    out, scales = _interp_size(input, size, scale_factor, recompute_scale_factor, nd)
    if any(o <= 0 for o in out):
        raise ValueError(f"tp.interpolate: output size {out} must be positive (input {list(input.shape)})")
    if mode == "area":
        return _adaptive_avg(input, out)
    name = _INTERP[(mode, nd)]
    if antialias:
        name = f"_{name}_aa"
    scale_args = scales if scales is not None else [None] * nd
    if mode in _ALIGNED:
        return _op(name)(input, out, bool(align_corners), *scale_args)
    return _op(name)(input, out, *scale_args)


def _adaptive_avg(input, out):
    if len(out) == 1:
        return _op("adaptive_avg_pool2d")(input.unsqueeze(-2), [1, out[0]]).squeeze(-2)
    return _op("adaptive_avg_pool2d" if len(out) == 2 else "adaptive_avg_pool3d")(input, out)


def adaptive_avg_pool3d(input, output_size):
    sizes = list(output_size) if isinstance(output_size, (list, tuple)) else [output_size] * 3
    if len(sizes) != 3:
        raise ValueError(f"tp.adaptive_avg_pool3d: output_size must have 3 elements, got {output_size}")
    sizes = [input.shape[input.dim() - 3 + i] if s is None else s for i, s in enumerate(sizes)]
    return _op("adaptive_avg_pool3d")(input, sizes)


def upsample_nearest(input, size=None, scale_factor=None):
    import warnings
    warnings.warn("nn.functional.upsample_nearest is deprecated. Use nn.functional.interpolate instead.",
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    import warnings
    warnings.warn("nn.functional.upsample_bilinear is deprecated. Use nn.functional.interpolate instead.",
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# =================================================================================================
# instance norm
# =================================================================================================
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Normalize each (sample, channel) plane over its spatial dims; with running statistics, eval
    mode (``use_input_stats=False``) uses them, and training updates them in place."""
    _check_tensor(input, "instance_norm")
    if input.dim() < 2:
        raise ValueError(f"tp.instance_norm: expected an input of at least 2 dims (N, C, ...), got "
                         f"{list(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    spatial = list(input.shape[2:])
    if use_input_stats and math.prod(spatial) == 1:
        raise ValueError(f"tp.instance_norm: expected more than 1 spatial element when training, got input size "
                         f"{list(input.shape)}")
    if not use_input_stats and (running_mean is None or running_var is None):
        raise ValueError("tp.instance_norm: running_mean and running_var are required when use_input_stats=False")

    def rep(t):
        return None if t is None else t.repeat([n])
    x = input.reshape([1, n * c] + spatial)
    if use_input_stats:   # batch statistics; the running ones are updated below, in tp ops (compiled too)
        out = _op("batch_norm")(x, rep(weight), rep(bias), None, None, True, float(momentum), float(eps))
    else:
        out = _op("batch_norm")(x, rep(weight), rep(bias), rep(running_mean), rep(running_var), False,
                                float(momentum), float(eps))
    if use_input_stats and running_mean is not None:
        with no_grad():
            dims = list(range(2, input.dim()))
            v, m = _op("var_mean")(input, dims, True)
            running_mean.copy_((1 - momentum) * running_mean + momentum * m.mean(0))
            running_var.copy_((1 - momentum) * running_var + momentum * v.mean(0))
    return out.reshape(list(input.shape))
