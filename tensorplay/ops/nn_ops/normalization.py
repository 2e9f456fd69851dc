"""softmax / log_softmax and the normalisations: layer, RMS, batch and group norm (chapter §1.2).

Eager kernels are ATen's.  softmax and log_softmax differentiate from their saved result; the
normalisations recompute their statistics from the saved input with tp ops, so their gradients are
themselves differentiable.
"""
from __future__ import annotations

import torch

from ..registry import register
from ._common import N, _bcast_channel, _dims_except, _sum_dims


# =================================================================================================
# softmax / log_softmax
# =================================================================================================
def _softmax_bwd(ctx, g):
    y = ctx.result
    return y * (g - (g * y).sum(ctx.dim, keepdim=True))


def _log_softmax_bwd(ctx, g):
    y = ctx.result
    return g - y.exp() * g.sum(ctx.dim, keepdim=True)


register("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
         lambda self, dim, dtype: torch.softmax(self, dim, dtype=dtype), backward=_softmax_bwd, save=("result",),
         tags=N, doc="exp(x) / sum(exp(x)) along `dim` (computed in `dtype` if given).")
register("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor",
         lambda self, dim, dtype: torch.log_softmax(self, dim, dtype=dtype), backward=_log_softmax_bwd,
         save=("result",), tags=N, doc="x - logsumexp(x) along `dim` (computed in `dtype` if given).")


# =================================================================================================
# normalization
# =================================================================================================
_LOWP = (torch.float16, torch.bfloat16)


def _upcast(*ts):
    """Half-precision tensors as float32 (None passes through): normalization statistics and their
    gradients are computed in float32, as ATen does; the returned gradients are cast back to the
    input dtypes by the autograd engine."""
    return tuple(t.float() if t is not None and t.dtype in _LOWP else t for t in ts)


def _standardize(x, dims, eps):
    """(x - mean) * rstd over ``dims`` (biased variance), and rstd; all in tp ops."""
    mu = x.mean(dims, keepdim=True)
    xc = x - mu
    rstd = ((xc * xc).mean(dims, keepdim=True) + eps).rsqrt()
    return xc * rstd, rstd


def _standardized_grad(gxhat, xhat, rstd, dims):
    """Gradient w.r.t. x of xhat = (x - mean) * rstd, given the gradient w.r.t. xhat."""
    return rstd * (gxhat - gxhat.mean(dims, keepdim=True) - xhat * (gxhat * xhat).mean(dims, keepdim=True))


def _layer_norm_bwd(ctx, g):
    x, w, g = _upcast(ctx.input, ctx.weight, g)
    k = len(ctx.normalized_shape)
    dims = list(range(x.dim() - k, x.dim()))
    lead = list(range(x.dim() - k))
    n = ctx.needs_input_grad
    xhat, rstd = _standardize(x, dims, ctx.eps)
    gx = _standardized_grad(g * w if w is not None else g, xhat, rstd, dims) if n[0] else None
    gw = _sum_dims(g * xhat, lead) if n[1] else None
    gb = _sum_dims(g, lead) if n[2] else None
    return gx, gw, gb


register("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
         "float eps=1e-05) -> Tensor",
         lambda input, normalized_shape, weight, bias, eps: torch.layer_norm(input, normalized_shape, weight, bias,
                                                                            eps),
         backward=_layer_norm_bwd, save=("input", "weight"), tags=N, method=False,
         doc="Normalize over the trailing `normalized_shape` dims, then scale by weight and shift by bias.")


def _rms_eps(eps, dtype):
    return torch.finfo(dtype).eps if eps is None else eps


def _rms_norm_bwd(ctx, g):
    x, w, g = _upcast(ctx.input, ctx.weight, g)
    k = len(ctx.normalized_shape)
    dims = list(range(x.dim() - k, x.dim()))
    lead = list(range(x.dim() - k))
    n = ctx.needs_input_grad
    r = ((x * x).mean(dims, keepdim=True) + _rms_eps(ctx.eps, ctx.input.dtype)).rsqrt()
    xhat = x * r
    gx = None
    if n[0]:
        gxh = g * w if w is not None else g
        gx = r * (gxh - xhat * (gxh * xhat).mean(dims, keepdim=True))
    gw = _sum_dims(g * xhat, lead) if n[1] else None
    return gx, gw


register("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor",
         lambda input, normalized_shape, weight, eps: torch.rms_norm(input, normalized_shape, weight, eps),
         backward=_rms_norm_bwd, save=("input", "weight"), tags=N, method=False,
         doc="x / sqrt(mean(x^2) + eps) over the trailing dims, times weight (eps: finfo(dtype).eps if None).")


def _batch_norm_kernel(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out = torch.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                           torch.backends.cudnn.enabled)
    if training and input.device.type != "meta":
        # ATen updates the running statistics below the dispatcher, which does not bump their version
        # counters; bump them so saved-tensor checks and compiled-graph guards see the mutation
        for t in (running_mean, running_var):
            if t is not None:
                torch.autograd.graph.increment_version(t)
    return out


def _batch_norm_bwd(ctx, g):
    x, w, g = _upcast(ctx.input, ctx.weight, g)
    nd = x.dim()
    dims = _dims_except(nd, 1)
    n = ctx.needs_input_grad
    gx = gw = gb = None
    if ctx.training or ctx.running_mean is None:
        xhat, rstd = _standardize(x, dims, ctx.eps)
        if n[0]:
            gxh = g * _bcast_channel(w, nd) if w is not None else g
            gx = _standardized_grad(gxh, xhat, rstd, dims)
    else:  # eval: an affine map with the running statistics
        rm, rv = _upcast(ctx.running_mean, ctx.running_var)
        rstd = _bcast_channel((rv + ctx.eps).rsqrt(), nd)
        xhat = (x - _bcast_channel(rm, nd)) * rstd
        if n[0]:
            gx = g * (rstd * _bcast_channel(w, nd) if w is not None else rstd)
    if n[1]:
        gw = (g * xhat).sum(dims)
    if n[2]:
        gb = g.sum(dims)
    return gx, gw, gb, None, None


register("batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, "
         "bool training, float momentum, float eps) -> Tensor", _batch_norm_kernel,
         backward=_batch_norm_bwd, save=("input", "weight", "running_mean", "running_var"), tags=N, method=False,
         doc="Normalize each channel (dim 1) with batch statistics (training; the running statistics are then "
             "updated in place: r = (1 - momentum) r + momentum * batch, unbiased variance) or with the "
             "running statistics (eval).")


def _group_norm_bwd(ctx, g):
    x, w, g = _upcast(ctx.input, ctx.weight, g)
    nd = x.dim()
    nb, c, groups = x.shape[0], x.shape[1], ctx.num_groups
    n = ctx.needs_input_grad
    xr = x.reshape(nb, groups, -1)
    xhat_r, rstd = _standardize(xr, [2], ctx.eps)
    xhat = xhat_r.reshape(x.shape)
    gx = gw = gb = None
    if n[0]:
        gxh = g * _bcast_channel(w, nd) if w is not None else g
        gx = _standardized_grad(gxh.reshape(nb, groups, -1), xhat_r, rstd, [2]).reshape(x.shape)
    dims = _dims_except(nd, 1)
    if n[1]:
        gw = (g * xhat).sum(dims)
    if n[2]:
        gb = g.sum(dims)
    return gx, gw, gb


def _group_norm_kernel(input, num_groups, weight, bias, eps):
    if input.dim() < 2:
        raise RuntimeError(f"expected an input of at least 2 dims (N, C, ...), got shape {list(input.shape)}")
    if num_groups <= 0 or input.shape[1] % num_groups:
        raise RuntimeError(f"the number of channels {input.shape[1]} must be divisible by num_groups={num_groups}")
    return torch.group_norm(input, num_groups, weight, bias, eps, torch.backends.cudnn.enabled)


register("group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
         _group_norm_kernel, backward=_group_norm_bwd, save=("input", "weight"), tags=N, method=False,
         doc="Normalize each group of C/num_groups channels of every sample, then per-channel affine.")
