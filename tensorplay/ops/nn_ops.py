"""Neural-network ops: softmax, normalization, dropout, embedding, convolution, pooling,
resampling, losses and attention (chapter §1.2; used by ``tensorplay.nn``).

Every entry's eager kernel is ATen's, so forward results are bit-identical to PyTorch.  The
derivative formulas come in two kinds:

* **formulas in tp ops** — softmax/log_softmax (from the saved result), the normalizations
  (layer/RMS/batch/group norm recompute their statistics from the saved input with tp ops, so their
  gradients are themselves differentiable), dropout (the mask that the forward drew is an *output*
  of ``native_dropout``, so reverse and forward mode reuse it), the losses, attention (recomputed
  with matmul + softmax);
* **dedicated backward ops** in the table where no short tp formula exists (convolution, pooling,
  resampling, embedding, nll_loss).  Each backward op is linear in the incoming gradient and its own
  derivative is again a table op (the transpose: e.g. the derivative of
  ``convolution_backward_input`` w.r.t. the gradient is ``convolution``), so every op here supports
  double backward, except ``embedding`` with ``scale_grad_by_freq=True`` and
  ``max_pool2d_with_indices_backward`` w.r.t. its input (zero almost everywhere), which raise or
  return zero as documented on the entry.

Conventions: ``reduction`` is the string ``'none' | 'mean' | 'sum'``; the class dimension of a
loss input is 1 (0 for an unbatched input); convolution ``padding`` is either one int per spatial
dim (symmetric) or two per dim, ``[before_0, after_0, before_1, after_1, ...]``.
Bad input raises an exception whose message starts with ``tp.<op>(...)`` and shows the shapes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from ._helpers import sum_to
from .registry import OPS, register

__all__ = []

N = ("nn",)
LOSS = ("nn", "loss")
aten = torch.ops.aten

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction_enum(reduction):
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{reduction!r} is not a valid value for reduction (expected 'none', 'mean' or 'sum')") \
            from None


def _op(name):
    return OPS[name].fn


def _dims_except(ndim, keep):
    return [d for d in range(ndim) if d != keep]


def _sum_dims(t, dims, keepdim=False):
    """``t.sum(dims)`` where an empty ``dims`` means *no* reduction (not a full reduction)."""
    return t.sum(dims, keepdim=keepdim) if dims else t


def _bcast_channel(t, ndim, dim=1):
    """View a per-channel vector (C,) so it broadcasts along ``dim`` of an ``ndim``-d tensor."""
    shape = [1] * ndim
    shape[dim] = t.shape[0]
    return t.reshape(shape)


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


# =================================================================================================
# dropout
# =================================================================================================
def _dropout_scale(p, train):
    if train is False:
        return 1.0
    return 0.0 if p >= 1 else 1.0 / (1.0 - p)


def _native_dropout_kernel(input, p, train):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return torch.native_dropout(input, p, train)


def _native_dropout_bwd(ctx, g, g_mask=None):
    mask = ctx.result[1]
    s = _dropout_scale(ctx.p, ctx.train)
    r = g * mask
    return r * s if s != 1.0 else r


def _native_dropout_jvp(args, outs, tangents):
    t = tangents[0]
    if t is None:
        return (None, None)
    s = _dropout_scale(args[1], args[2])
    r = t * outs[1]
    return (r * s if s != 1.0 else r, None)


register("native_dropout(Tensor input, float p, bool? train) -> (Tensor output, Tensor mask)", _native_dropout_kernel,
         backward=_native_dropout_bwd, jvp=_native_dropout_jvp, save=("result",), tags=("nn", "random"),
         method=False,
         doc="Zero each element with probability p and scale the rest by 1/(1-p); also returns the bool keep-mask, "
             "which the derivative (reverse and forward mode) reuses.")


# =================================================================================================
# embedding
# =================================================================================================
def _embedding_kernel(weight, indices, padding_idx, scale_grad_by_freq, sparse):
    if indices.device.type != "meta" and indices.numel():
        if indices.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"indices must be int64 or int32, got {indices.dtype}")
        lo, hi = torch.aminmax(indices)
        lo, hi = int(lo), int(hi)
        nw = weight.shape[0]
        if lo < 0 or hi >= nw:
            bad = lo if lo < 0 else hi
            raise IndexError(f"index {bad} is out of range for a weight of {nw} rows (valid: 0..{nw - 1})")
    return torch.embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)


def _embedding_bwd(ctx, g):
    return (OPS["embedding_dense_backward"].fn(g, ctx.indices, ctx.weight.shape[0], ctx.padding_idx,
                                                ctx.scale_grad_by_freq), None)


register("embedding(Tensor weight, Tensor indices, int padding_idx=-1, bool scale_grad_by_freq=False, "
         "bool sparse=False) -> Tensor", _embedding_kernel, backward=_embedding_bwd, save=("indices",), tags=N,
         method=False,
         doc="Rows of `weight` selected by `indices`.  Row `padding_idx` receives no gradient; the gradient is "
             "always dense (sparse=True is accepted for compatibility).")


def _embedding_dense_backward_bwd(ctx, gg):
    if ctx.scale_grad_by_freq:
        raise NotImplementedError("tp.embedding_dense_backward: double backward with scale_grad_by_freq=True "
                                  "is not supported")
    if 0 <= ctx.padding_idx < ctx.num_weights:
        keep = gg.new_ones((ctx.num_weights, 1))
        keep[ctx.padding_idx] = 0.0
        gg = gg * keep
    return OPS["embedding"].fn(gg, ctx.indices), None


register("embedding_dense_backward(Tensor grad_output, Tensor indices, int num_weights, int padding_idx, "
         "bool scale_grad_by_freq) -> Tensor", "torch.ops.aten.embedding_dense_backward",
         backward=_embedding_dense_backward_bwd, save=("indices",), tags=N, method=False, function=False,
         doc="Gradient of embedding w.r.t. its weight: rows of grad_output summed into the rows they came from.")


# =================================================================================================
# convolution
# =================================================================================================
def _expand_param(v, nd, name):
    if isinstance(v, int):
        return [v] * nd
    v = list(v)
    if len(v) == 1:
        return v * nd
    if len(v) != nd:
        raise ValueError(f"{name} must have {nd} elements for a {nd}-d convolution, got {v}")
    return v


def _pad_pairs(padding, nd):
    """Normalize padding to [(before, after)] per spatial dim."""
    if isinstance(padding, int):
        return [(padding, padding)] * nd
    p = list(padding)
    if len(p) == 1:
        return [(p[0], p[0])] * nd
    if len(p) == nd:
        return [(q, q) for q in p]
    if len(p) == 2 * nd:
        return [(p[2 * i], p[2 * i + 1]) for i in range(nd)]
    raise ValueError(f"padding must have 1, {nd} or {2 * nd} elements for a {nd}-d convolution, got {p}")


def _torch_pad_arg(pairs):
    out = []
    for b, a in reversed(pairs):
        out += [b, a]
    return out


def _conv_params(weight_dim, stride, padding, dilation):
    nd = weight_dim - 2
    if nd < 1:
        raise RuntimeError(f"weight must have at least 3 dims (out, in/groups, *kernel), got {weight_dim}")
    return nd, _expand_param(stride, nd, "stride"), _pad_pairs(padding, nd), _expand_param(dilation, nd, "dilation")


def _convolution_kernel(input, weight, bias, stride, padding, dilation, groups):
    nd, stride, pairs, dilation = _conv_params(weight.dim(), stride, padding, dilation)
    if input.dim() != nd + 2:
        raise RuntimeError(f"expected a batched {nd + 2}-d input for a {nd}-d convolution, got shape "
                           f"{list(input.shape)}")
    if any(b != a for b, a in pairs):
        input = TF.pad(input, _torch_pad_arg(pairs))
        sym = [0] * nd
    else:
        sym = [b for b, _ in pairs]
    return aten.convolution(input, weight, bias, stride, sym, dilation, False, [0] * nd, groups)


def _dummy(like, size):
    return torch.empty((1,), dtype=like.dtype, device=like.device).expand(list(size))


def _conv_backward_input_kernel(grad_output, weight, input_size, stride, padding, dilation, groups):
    nd, stride, pairs, dilation = _conv_params(weight.dim(), stride, padding, dilation)
    size = list(input_size)
    asym = any(b != a for b, a in pairs)
    if asym:
        size = size[:2] + [s + b + a for s, (b, a) in zip(size[2:], pairs)]
    sym = [0] * nd if asym else [b for b, _ in pairs]
    gi = aten.convolution_backward(grad_output, _dummy(grad_output, size), weight, None, stride, sym, dilation,
                                   False, [0] * nd, groups, [True, False, False])[0]
    if asym:
        gi = gi[(slice(None), slice(None)) + tuple(slice(b, b + s) for (b, _), s in zip(pairs, input_size[2:]))]
        gi = gi.contiguous()
    return gi


def _conv_backward_weight_kernel(grad_output, input, weight_size, stride, padding, dilation, groups):
    nd, stride, pairs, dilation = _conv_params(len(weight_size), stride, padding, dilation)
    if any(b != a for b, a in pairs):
        input = TF.pad(input, _torch_pad_arg(pairs))
        sym = [0] * nd
    else:
        sym = [b for b, _ in pairs]
    return aten.convolution_backward(grad_output, input, _dummy(input, weight_size), None, stride, sym, dilation,
                                     False, [0] * nd, groups, [False, True, False])[1]


def _conv_backward_kernel(grad_output, input, weight, stride, padding, dilation, groups):
    """Both gradients in one ATen call: the library shares the work (reorders, im2col) between them,
    and needs no stand-in tensors (``_dummy``) for the operand a single gradient does not read.
    Measured on the CNN of benchmarks/training.py: 20 ms against 23 ms for the two calls."""
    nd, st, pairs, dil = _conv_params(weight.dim(), stride, padding, dilation)
    if any(b != a for b, a in pairs):   # asymmetric padding: the single-gradient kernels pad and crop
        args = (stride, padding, dilation, groups)
        return (_conv_backward_input_kernel(grad_output, weight, list(input.shape), *args),
                _conv_backward_weight_kernel(grad_output, input, list(weight.shape), *args))
    gi, gw, _ = aten.convolution_backward(grad_output, input, weight, None, st, [b for b, _ in pairs], dil,
                                          False, [0] * nd, groups, [True, True, False])
    return gi, gw


def _conv_args(ctx):
    return ctx.stride, ctx.padding, ctx.dilation, ctx.groups


def _conv_grads(g, x, w, args, need_x, need_w):
    """(grad input, grad weight) of a convolution, each None unless needed: one call when both are."""
    if need_x and need_w:
        return OPS["convolution_backward"].fn(g, x, w, *args)
    gx = OPS["convolution_backward_input"].fn(g, w, list(x.shape), *args) if need_x else None
    gw = OPS["convolution_backward_weight"].fn(g, x, list(w.shape), *args) if need_w else None
    return gx, gw


def _convolution_bwd(ctx, g):
    n = ctx.needs_input_grad
    gx, gw = _conv_grads(g, ctx.input, ctx.weight, _conv_args(ctx), n[0], n[1])
    gb = g.sum(_dims_except(g.dim(), 1)) if n[2] else None
    return gx, gw, gb


def _conv_backward_bwd(ctx, ggi, ggw=None):
    """convolution_backward is bilinear in (grad_output, (input, weight)): the sum of the two
    single-gradient formulas below, for whichever output gradients arrive."""
    go, x, w = ctx.grad_output, ctx.input, ctx.weight
    n = ctx.needs_input_grad
    a = _conv_args(ctx)
    parts = []
    if n[0] and ggi is not None:
        parts.append(OPS["convolution"].fn(ggi, w, None, *a))
    if n[0] and ggw is not None:
        parts.append(OPS["convolution"].fn(x, ggw, None, *a))
    dgo = (parts[0] + parts[1] if len(parts) == 2 else parts[0]) if parts else None
    dx = OPS["convolution_backward_input"].fn(go, ggw, list(x.shape), *a) if n[1] and ggw is not None else None
    dw = OPS["convolution_backward_weight"].fn(go, ggi, list(w.shape), *a) if n[2] and ggi is not None else None
    return dgo, dx, dw


def _conv_bwd_input_bwd(ctx, gg):
    # gi = Bᵀ(go, w) is bilinear: d/dgo = conv(gg, w); d/dw = weight-grad of conv(gg, ·) at go
    go, w = ctx.grad_output, ctx.weight
    n = ctx.needs_input_grad
    dgo = OPS["convolution"].fn(gg, w, None, *_conv_args(ctx)) if n[0] else None
    dw = OPS["convolution_backward_weight"].fn(go, gg, list(w.shape), *_conv_args(ctx)) if n[1] else None
    return dgo, dw


def _conv_bwd_weight_bwd(ctx, gg):
    go, x = ctx.grad_output, ctx.input
    n = ctx.needs_input_grad
    dgo = OPS["convolution"].fn(x, gg, None, *_conv_args(ctx)) if n[0] else None
    dx = OPS["convolution_backward_input"].fn(go, gg, list(x.shape), *_conv_args(ctx)) if n[1] else None
    return dgo, dx


_CONV_ARGS = "int[] stride=1, int[] padding=0, int[] dilation=1, int groups=1"


def _conv_decomp(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return OPS["convolution"].fn(input, weight, bias, stride, padding, dilation, groups)


register(f"convolution(Tensor input, Tensor weight, Tensor? bias=None, {_CONV_ARGS}) -> Tensor", _convolution_kernel,
         backward=_convolution_bwd, save=("input", "weight"), tags=N, method=False,
         doc="N-d cross-correlation (N = weight.dim() - 2) of a batched input; padding per dim, symmetric or "
             "as (before, after) pairs.")
register(f"convolution_backward_input(Tensor grad_output, Tensor weight, int[] input_size, {_CONV_ARGS}) -> Tensor",
         _conv_backward_input_kernel, backward=_conv_bwd_input_bwd, save=("grad_output", "weight"), tags=N,
         method=False, function=False, doc="Gradient of convolution w.r.t. its input (a transposed convolution).")
register(f"convolution_backward_weight(Tensor grad_output, Tensor input, int[] weight_size, {_CONV_ARGS}) -> Tensor",
         _conv_backward_weight_kernel, backward=_conv_bwd_weight_bwd, save=("grad_output", "input"), tags=N,
         method=False, function=False, doc="Gradient of convolution w.r.t. its weight.")
register(f"convolution_backward(Tensor grad_output, Tensor input, Tensor weight, {_CONV_ARGS}) -> "
         "(Tensor grad_input, Tensor grad_weight)",
         _conv_backward_kernel, backward=_conv_backward_bwd, save=("grad_output", "input", "weight"), tags=N,
         method=False, function=False, doc="Gradients of convolution w.r.t. its input and its weight, in one call.")


def resolve_conv_padding(padding, weight_shape, dilation, stride):
    """'valid' -> 0; 'same' -> (before, after) pairs giving output size = input size (stride 1);
    ints pass through."""
    nd = len(weight_shape) - 2
    if isinstance(padding, str):
        if padding == "valid":
            return [0] * nd
        if padding == "same":
            if any(s != 1 for s in _expand_param(stride, nd, "stride")):
                raise ValueError("padding='same' is not supported for strided convolutions")
            dil = _expand_param(dilation, nd, "dilation")
            pairs = []
            for k, d in zip(weight_shape[2:], dil):
                total = d * (k - 1)
                pairs += [total // 2, total - total // 2]
            return pairs
        raise ValueError(f"invalid padding string {padding!r} (expected 'same', 'valid' or ints)")
    return padding


def _make_convnd(nd):
    torch_fn = getattr(torch, f"conv{nd}d")
    name = f"conv{nd}d"

    def kernel(input, weight, bias, stride, padding, dilation, groups):
        if input.dim() not in (nd + 1, nd + 2):
            raise RuntimeError(f"expected a {nd + 1}-d (unbatched) or {nd + 2}-d (batched) input, got shape "
                               f"{list(input.shape)}")
        return torch_fn(input, weight, bias, stride, padding, dilation, groups)

    def bwd(ctx, g):
        x, w = ctx.input, ctx.weight
        n = ctx.needs_input_grad
        pad = resolve_conv_padding(ctx.padding, list(w.shape), ctx.dilation, ctx.stride)
        args = (ctx.stride, pad, ctx.dilation, ctx.groups)
        unbatched = x.dim() == nd + 1
        if unbatched:
            x, g = x.unsqueeze(0), g.unsqueeze(0)
        gx, gw = _conv_grads(g, x, w, args, n[0], n[1])
        gb = g.sum(_dims_except(g.dim(), 1)) if n[2] else None
        if unbatched and gx is not None:
            gx = gx.squeeze(0)
        return gx, gw, gb

    def decomp(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        pad = resolve_conv_padding(padding, list(weight.shape), dilation, stride)
        if input.dim() == nd + 1:
            return OPS["convolution"].fn(input.unsqueeze(0), weight, bias, stride, pad, dilation, groups).squeeze(0)
        return OPS["convolution"].fn(input, weight, bias, stride, pad, dilation, groups)

    register(f"{name}(Tensor input, Tensor weight, Tensor? bias=None, {_CONV_ARGS}) -> Tensor", kernel,
             backward=bwd, save=("input", "weight"), decomp=decomp, tags=N, method=False,
             doc=f"{nd}-d cross-correlation; padding may also be 'same' or 'valid'; unbatched input allowed.")


for _nd in (1, 2, 3):
    _make_convnd(_nd)


def _make_conv_transposend(nd):
    torch_fn = getattr(torch, f"conv_transpose{nd}d")
    name = f"conv_transpose{nd}d"

    def kernel(input, weight, bias, stride, padding, output_padding, groups, dilation):
        if input.dim() not in (nd + 1, nd + 2):
            raise RuntimeError(f"expected a {nd + 1}-d (unbatched) or {nd + 2}-d (batched) input, got shape "
                               f"{list(input.shape)}")
        return torch_fn(input, weight, bias, stride, padding, output_padding, groups, dilation)

    def bwd(ctx, g):
        # conv_transpose(x, w) is convolution_backward_input(x, w): its adjoints are the convolution
        # of g with w (w.r.t. x) and the weight gradient of conv(g, .) at x (w.r.t. w)
        x, w = ctx.input, ctx.weight
        n = ctx.needs_input_grad
        args = (ctx.stride, ctx.padding, ctx.dilation, ctx.groups)
        unbatched = x.dim() == nd + 1
        if unbatched:
            x, g = x.unsqueeze(0), g.unsqueeze(0)
        gx = OPS["convolution"].fn(g, w, None, *args) if n[0] else None
        gw = OPS["convolution_backward_weight"].fn(x, g, list(w.shape), *args) if n[1] else None
        gb = g.sum(_dims_except(g.dim(), 1)) if n[2] else None
        if unbatched and gx is not None:
            gx = gx.squeeze(0)
        return gx, gw, gb

    register(f"{name}(Tensor input, Tensor weight, Tensor? bias=None, int[] stride=1, int[] padding=0, "
             f"int[] output_padding=0, int groups=1, int[] dilation=1) -> Tensor", kernel,
             backward=bwd, save=("input", "weight"), tags=N, method=False,
             doc=f"{nd}-d transposed convolution (the adjoint of conv{nd}d w.r.t. its input); weight is "
                 f"(C_in, C_out / groups, *kernel).")


for _nd in (1, 2, 3):
    _make_conv_transposend(_nd)


# =================================================================================================
# pooling
# =================================================================================================
def _pair(v, name="kernel_size"):
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    if len(v) == 1:
        return v * 2
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v}")
    return v


def _pool_params(kernel_size, stride, padding, dilation=1):
    k = _pair(kernel_size)
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _pair(stride, "stride")
    return k, s, _pair(padding, "padding"), _pair(dilation, "dilation")


def _check_pool_input(x):
    if x.dim() not in (3, 4):
        raise RuntimeError(f"expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape {list(x.shape)}")


def _max_pool_kernel(self, kernel_size, stride, padding, dilation, ceil_mode):
    _check_pool_input(self)
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return aten.max_pool2d_with_indices(self, k, s, p, d, ceil_mode)


def _max_pool_bwd(ctx, g, g_idx=None):
    idx = ctx.result[1]
    return OPS["max_pool2d_with_indices_backward"].fn(g, list(ctx.self.shape), ctx.kernel_size, ctx.stride,
                                                       ctx.padding, ctx.dilation, ctx.ceil_mode, idx)


_POOL = "int[] kernel_size, int[] stride=[], int[] padding=0, int[] dilation=1, bool ceil_mode=False"
register(f"max_pool2d_with_indices(Tensor self, {_POOL}) -> (Tensor output, Tensor indices)", _max_pool_kernel,
         backward=_max_pool_bwd, save=("result",), tags=N, method=False,
         doc="2-d max pooling; also returns the flat (H*W) index of each maximum in its input plane.")


def _max_pool_backward_kernel(grad_output, input_size, kernel_size, stride, padding, dilation, ceil_mode, indices):
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return aten.max_pool2d_with_indices_backward(grad_output, _dummy(grad_output, input_size), k, s, p, d, ceil_mode,
                                                 indices)


def _gather_planes(t, indices):
    """out[..., i, j] = t[..., flat index indices[..., i, j]] over the last two dims."""
    flat = t.flatten(-2)
    return flat.gather(-1, indices.flatten(-2)).reshape(indices.shape)


def _max_pool_backward_bwd(ctx, gg):
    # linear in grad_output (a scatter through the indices): its transpose is a gather
    return (_gather_planes(gg, ctx.indices) if ctx.needs_input_grad[0] else None, None)


register("max_pool2d_with_indices_backward(Tensor grad_output, int[] input_size, int[] kernel_size, int[] stride, "
         "int[] padding, int[] dilation, bool ceil_mode, Tensor indices) -> Tensor", _max_pool_backward_kernel,
         backward=_max_pool_backward_bwd, save=("indices",), tags=N, method=False, function=False,
         doc="Scatter grad_output to the positions of the maxima (input_size: the pooled input's shape).")


def _max_pool2d_kernel(self, kernel_size, stride, padding, dilation, ceil_mode):
    _check_pool_input(self)
    k, s, p, d = _pool_params(kernel_size, stride, padding, dilation)
    return torch.max_pool2d(self, k, s, p, d, ceil_mode)


def _max_pool2d_bwd(ctx, g):
    x = ctx.self
    idx = OPS["max_pool2d_with_indices"].fn(x.detach(), ctx.kernel_size, ctx.stride, ctx.padding, ctx.dilation,
                                            ctx.ceil_mode)[1]
    return OPS["max_pool2d_with_indices_backward"].fn(g, list(x.shape), ctx.kernel_size, ctx.stride, ctx.padding,
                                                       ctx.dilation, ctx.ceil_mode, idx)


register(f"max_pool2d(Tensor self, {_POOL}) -> Tensor", _max_pool2d_kernel, backward=_max_pool2d_bwd,
         save=("self",), tags=N, method=False,
         decomp=lambda self, *a: OPS["max_pool2d_with_indices"].fn(self, *a)[0],
         doc="2-d max pooling (its gradient recomputes the argmax indices).")


_AVG = ("int[] kernel_size, int[] stride=[], int[] padding=0, bool ceil_mode=False, bool count_include_pad=True, "
        "int? divisor_override=None")


def _avg_pool_kernel(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _check_pool_input(self)
    k, s, p, _ = _pool_params(kernel_size, stride, padding)
    return aten.avg_pool2d(self, k, s, p, ceil_mode, count_include_pad, divisor_override)


def _avg_pool_bwd(ctx, g):
    return OPS["avg_pool2d_backward"].fn(g, list(ctx.self.shape), ctx.kernel_size, ctx.stride, ctx.padding,
                                         ctx.ceil_mode, ctx.count_include_pad, ctx.divisor_override)


register(f"avg_pool2d(Tensor self, {_AVG}) -> Tensor", _avg_pool_kernel, backward=_avg_pool_bwd, save=(), tags=N,
         method=False, doc="2-d average pooling.")


def _avg_pool_backward_kernel(grad_output, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override):
    k, s, p, _ = _pool_params(kernel_size, stride, padding)
    return aten.avg_pool2d_backward(grad_output, _dummy(grad_output, input_size), k, s, p, ceil_mode,
                                    count_include_pad, divisor_override)


register(f"avg_pool2d_backward(Tensor grad_output, int[] input_size, {_AVG}) -> Tensor", _avg_pool_backward_kernel,
         backward=lambda ctx, gg: OPS["avg_pool2d"].fn(gg, ctx.kernel_size, ctx.stride, ctx.padding, ctx.ceil_mode,
                                                       ctx.count_include_pad, ctx.divisor_override),
         save=(), tags=N, method=False, function=False, doc="Gradient of avg_pool2d (its transpose).")


def _adaptive_avg_kernel(self, output_size):
    _check_pool_input(self)
    return aten.adaptive_avg_pool2d(self, _pair(output_size, "output_size"))


register("adaptive_avg_pool2d(Tensor self, int[] output_size) -> Tensor", _adaptive_avg_kernel,
         backward=lambda ctx, g: OPS["adaptive_avg_pool2d_backward"].fn(g, list(ctx.self.shape)), save=(), tags=N,
         method=False, doc="2-d average pooling onto a fixed output size (bins of varying extent).")
register("adaptive_avg_pool2d_backward(Tensor grad_output, int[] input_size) -> Tensor",
         lambda grad_output, input_size: aten._adaptive_avg_pool2d_backward(grad_output,
                                                                           _dummy(grad_output, input_size)),
         backward=lambda ctx, gg: OPS["adaptive_avg_pool2d"].fn(gg, list(ctx.grad_output.shape[-2:])),
         save=(), tags=N, method=False, function=False, doc="Gradient of adaptive_avg_pool2d (its transpose).")


def _adaptive_max_kernel(self, output_size):
    _check_pool_input(self)
    return aten.adaptive_max_pool2d(self, _pair(output_size, "output_size"))


register("adaptive_max_pool2d(Tensor self, int[] output_size) -> (Tensor output, Tensor indices)",
         _adaptive_max_kernel,
         backward=lambda ctx, g, gi=None: OPS["adaptive_max_pool2d_backward"].fn(g, list(ctx.self.shape),
                                                                                 ctx.result[1]),
         save=("result",), tags=N, method=False,
         doc="2-d max pooling onto a fixed output size; also returns the flat (H*W) argmax indices.")
register("adaptive_max_pool2d_backward(Tensor grad_output, int[] input_size, Tensor indices) -> Tensor",
         lambda grad_output, input_size, indices: aten.adaptive_max_pool2d_backward(
             grad_output, _dummy(grad_output, input_size), indices),
         backward=lambda ctx, gg: (_gather_planes(gg, ctx.indices) if ctx.needs_input_grad[0] else None, None),
         save=("indices",), tags=N, method=False, function=False,
         doc="Scatter grad_output to the positions of the maxima.")


# =================================================================================================
# resampling (interpolate)
# =================================================================================================
def _register_upsample(name, extra_schema, extra_names):
    fwd = getattr(aten, name)
    bwd = getattr(aten, name + "_backward")

    def kernel(self, output_size, *extra):
        return fwd(self, list(output_size), *extra)

    def backward_kernel(grad_output, output_size, input_size, *extra):
        return bwd(grad_output, list(output_size), list(input_size), *extra)

    # nearest resampling copies elements (an index map, like repeat): a "shape" op, which the
    # min-cut partitioner may recompute in the backward instead of saving the larger result
    register(f"{name}(Tensor self, int[] output_size, {extra_schema}) -> Tensor", kernel,
             backward=lambda ctx, g: OPS[name + "_backward"].fn(g, ctx.output_size, list(ctx.self.shape),
                                                                *[getattr(ctx, a) for a in extra_names]),
             save=(), tags=N + (("shape",) if "nearest" in name else ()), method=False,
             doc=f"aten.{name}: resample the trailing spatial dims to output_size.")
    register(f"{name}_backward(Tensor grad_output, int[] output_size, int[] input_size, {extra_schema}) -> Tensor",
             backward_kernel,
             backward=lambda ctx, gg: OPS[name].fn(gg, ctx.output_size, *[getattr(ctx, a) for a in extra_names]),
             save=(), tags=N, method=False, function=False, doc=f"Gradient of {name} (its transpose).")


_register_upsample("upsample_nearest1d", "float? scales=None", ["scales"])
_register_upsample("upsample_nearest2d", "float? scales_h=None, float? scales_w=None", ["scales_h", "scales_w"])
_register_upsample("upsample_linear1d", "bool align_corners, float? scales=None", ["align_corners", "scales"])
_register_upsample("upsample_bilinear2d", "bool align_corners, float? scales_h=None, float? scales_w=None",
                   ["align_corners", "scales_h", "scales_w"])


# =================================================================================================
# losses
# =================================================================================================
def _bcast_pair(a, b):
    if a.shape != b.shape:
        a, b = torch.broadcast_tensors(a, b)
    return a, b


def _reduce_grad(g, reduction, numel):
    """The per-element factor of a reduced loss' gradient: g (none/sum) or g / numel (mean)."""
    return g / numel if reduction == "mean" else g


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _pointwise_loss_bwd(dfn):
    """Backward of loss = reduce(f(self - target)) given f' = dfn(diff)."""
    def bwd(ctx, g):
        x, t = ctx.self, ctx.target
        d = x - t
        gd = _reduce_grad(g, ctx.reduction, _numel(torch.broadcast_shapes(x.shape, t.shape))) * dfn(d)
        n = ctx.needs_input_grad
        return (sum_to(gd, x.shape) if n[0] else None, sum_to(-gd, t.shape) if n[1] else None)
    return bwd


def _mse_kernel(self, target, reduction):
    a, b = _bcast_pair(self, target)
    return aten.mse_loss(a, b, _reduction_enum(reduction))


def _l1_kernel(self, target, reduction):
    a, b = _bcast_pair(self, target)
    return aten.l1_loss(a, b, _reduction_enum(reduction))


register("mse_loss(Tensor self, Tensor target, str reduction='mean') -> Tensor", _mse_kernel,
         backward=_pointwise_loss_bwd(lambda d: 2 * d), save=("self", "target"), tags=LOSS, method=False,
         doc="(self - target)^2, reduced.")
register("l1_loss(Tensor self, Tensor target, str reduction='mean') -> Tensor", _l1_kernel,
         backward=_pointwise_loss_bwd(lambda d: d.sign()), save=("self", "target"), tags=LOSS, method=False,
         doc="|self - target|, reduced (gradient sign(self - target), 0 at ties).")


def _smooth_l1_kernel(self, target, reduction, beta):
    a, b = _bcast_pair(self, target)
    return aten.smooth_l1_loss(a, b, _reduction_enum(reduction), beta)


def _smooth_l1_bwd(ctx, g):
    beta = ctx.beta
    if beta == 0:
        return _pointwise_loss_bwd(lambda d: d.sign())(ctx, g)
    return _pointwise_loss_bwd(lambda d: (d / beta).clamp(-1.0, 1.0))(ctx, g)


def _huber_kernel(self, target, reduction, delta):
    a, b = _bcast_pair(self, target)
    return aten.huber_loss(a, b, _reduction_enum(reduction), delta)


register("smooth_l1_loss(Tensor self, Tensor target, str reduction='mean', float beta=1.0) -> Tensor",
         _smooth_l1_kernel, backward=_smooth_l1_bwd, save=("self", "target"), tags=LOSS, method=False,
         doc="0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = self - target), reduced.")
register("huber_loss(Tensor self, Tensor target, str reduction='mean', float delta=1.0) -> Tensor",
         _huber_kernel, backward=lambda ctx, g: _pointwise_loss_bwd(lambda d: d.clamp(-ctx.delta, ctx.delta))(ctx, g),
         save=("self", "target"), tags=LOSS, method=False,
         doc="0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta) (d = self - target), reduced.")


# ---- nll_loss ------------------------------------------------------------------------------------
def _class_dim(ndim):
    return 1 if ndim >= 2 else 0


def _nll_kernel(self, target, weight, reduction, ignore_index):
    return TF.nll_loss(self, target, weight, reduction=reduction, ignore_index=ignore_index)


def _nll_backward_kernel(grad_output, target, weight, input_size, reduction, ignore_index):
    cd = _class_dim(len(input_size))
    valid = target != ignore_index
    t = torch.where(valid, target, torch.zeros((), dtype=target.dtype, device=target.device))
    dtype = grad_output.dtype
    wt = weight.to(dtype)[t] if weight is not None else torch.ones(t.shape, dtype=dtype, device=t.device)
    wt = wt * valid
    if reduction == "mean":
        coef = -(wt / wt.sum()) * grad_output
    else:
        _reduction_enum(reduction)
        coef = -wt * grad_output
    gi = torch.zeros(list(input_size), dtype=dtype, device=target.device)
    return gi.scatter_(cd, t.unsqueeze(cd), coef.unsqueeze(cd).to(device=target.device, dtype=dtype))


def _nll_bwd(ctx, g):
    return (OPS["nll_loss_backward"].fn(g, ctx.target, ctx.weight, list(ctx.self.shape), ctx.reduction,
                                        ctx.ignore_index), None, None)


register("nll_loss(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean', int ignore_index=-100) "
         "-> Tensor", _nll_kernel, backward=_nll_bwd, save=("target", "weight"), tags=LOSS, method=False,
         doc="-weight[t] * self[t] over samples (class dim 1), ignoring target == ignore_index; 'mean' divides by "
             "the total weight of the counted samples.")
register("nll_loss_backward(Tensor grad_output, Tensor target, Tensor? weight, int[] input_size, str reduction, "
         "int ignore_index) -> Tensor", _nll_backward_kernel,
         backward=lambda ctx, gg: (OPS["nll_loss"].fn(gg, ctx.target, ctx.weight, ctx.reduction, ctx.ignore_index),
                                   None, None),
         save=("target", "weight"), tags=LOSS, method=False, function=False,
         doc="Gradient of nll_loss w.r.t. its input (nll_loss is linear, so its derivative w.r.t. grad_output "
             "is nll_loss again).")


# ---- cross_entropy -------------------------------------------------------------------------------
def _ce_kernel(self, target, weight, reduction, ignore_index, label_smoothing):
    return TF.cross_entropy(self, target, weight, reduction=reduction, ignore_index=ignore_index,
                            label_smoothing=label_smoothing)


def _ce_bwd(ctx, g):
    x, target, w = ctx.self, ctx.target, ctx.weight
    cd = _class_dim(x.dim())
    nclass = x.shape[cd]
    eps = ctx.label_smoothing
    red = ctx.reduction
    n = ctx.needs_input_grad
    lsm = OPS["log_softmax"].fn(x, cd)
    gs = g.unsqueeze(cd) if red == "none" else g   # per-sample gradient, broadcast along the class dim
    wb = _bcast_channel(w, x.dim(), cd) if w is not None else None
    gt = None
    if target.is_floating_point():  # class probabilities
        if red == "mean":
            gs = gs / (_numel(x.shape) // max(nclass, 1))
        tt = target * (1 - eps) + eps / nclass if eps > 0 else target
        g_lsm = -(tt * wb if wb is not None else tt) * gs
        if n[1]:
            gt = -(lsm * wb if wb is not None else lsm) * gs
            if eps > 0:
                gt = gt * (1 - eps)
    else:
        g_lsm = OPS["nll_loss_backward"].fn(g, target, w, list(x.shape), red, ctx.ignore_index)
        if eps > 0:
            g_lsm = g_lsm * (1 - eps)
            # smooth term: -(eps / C) * sum_c w_c lsm_c per counted sample, reduced like nll_loss
            # counted_i = 1 for target_i != ignore_index (nll_loss of -1 with no weight), 'mean' divides
            # by the total weight of the counted samples (nll_loss of -1 with the weight, summed)
            minus_one = x.new_full(list(x.shape), -1.0)
            counted = OPS["nll_loss"].fn(minus_one, target, None, "none", ctx.ignore_index)
            coef = counted.unsqueeze(cd) * gs
            if red == "mean":
                coef = coef / OPS["nll_loss"].fn(minus_one, target, w, "sum", ctx.ignore_index)
            g_lsm = g_lsm - (eps / nclass) * (coef * wb if wb is not None else coef)
    gx = g_lsm - lsm.exp() * g_lsm.sum(cd, keepdim=True) if n[0] else None
    return gx, gt, None


register("cross_entropy(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean', "
         "int ignore_index=-100, float label_smoothing=0.0) -> Tensor", _ce_kernel, backward=_ce_bwd,
         save=("self", "target", "weight"), tags=LOSS, method=False,
         decomp=lambda self, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0:
         _ce_decomp(self, target, weight, reduction, ignore_index, label_smoothing),
         doc="log_softmax over the class dim (1) followed by nll_loss (class-index target) or by "
             "-sum(weight * target * log_softmax) (class-probability target); label_smoothing mixes the "
             "target with the uniform distribution.")


def _ce_decomp(x, target, weight, reduction, ignore_index, label_smoothing):
    cd = _class_dim(x.dim())
    nclass = x.shape[cd]
    lsm = OPS["log_softmax"].fn(x, cd)
    wb = _bcast_channel(weight, x.dim(), cd) if weight is not None else None
    if target.is_floating_point():
        tt = target * (1 - label_smoothing) + label_smoothing / nclass if label_smoothing > 0 else target
        per = -((lsm * tt * wb) if wb is not None else lsm * tt).sum(cd)
        if reduction == "none":
            return per
        return per.sum() / (_numel(x.shape) // nclass) if reduction == "mean" else per.sum()
    nll = OPS["nll_loss"].fn(lsm, target, weight, reduction, ignore_index)
    if label_smoothing <= 0:
        return nll
    minus_one = x.new_full(list(x.shape), -1.0)
    smooth = -(lsm * wb if wb is not None else lsm).sum(cd) * OPS["nll_loss"].fn(minus_one, target, None, "none",
                                                                               ignore_index)
    if reduction == "mean":
        smooth = smooth.sum() / OPS["nll_loss"].fn(minus_one, target, weight, "sum", ignore_index)
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / nclass)


# ---- binary cross entropy ------------------------------------------------------------------------
def _bce_kernel(self, target, weight, reduction):
    return TF.binary_cross_entropy(self, target, weight, reduction=reduction)


def _bce_bwd(ctx, g):
    x, t, w = ctx.self, ctx.target, ctx.weight
    n = ctx.needs_input_grad
    gs = _reduce_grad(g, ctx.reduction, _numel(x.shape))
    if w is not None:
        gs = gs * w
    gx = gt = None
    if n[0]:
        gx = sum_to(gs * (x - t) / ((1 - x) * x).clamp_min(1e-12), x.shape)
    if n[1]:
        gt = sum_to(gs * ((1 - x).log().clamp_min(-100.0) - x.log().clamp_min(-100.0)), t.shape)
    return gx, gt, None


register("binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean') -> Tensor",
         _bce_kernel, backward=_bce_bwd, save=("self", "target", "weight"), tags=LOSS, method=False,
         doc="-weight * (t log x + (1 - t) log(1 - x)) with the logs clamped at -100, reduced.")


def _bce_logits_kernel(self, target, weight, pos_weight, reduction):
    return TF.binary_cross_entropy_with_logits(self, target, weight, reduction=reduction, pos_weight=pos_weight)


def _bce_logits_bwd(ctx, g):
    x, t, w, pw = ctx.self, ctx.target, ctx.weight, ctx.pos_weight
    n = ctx.needs_input_grad
    shape = torch.broadcast_shapes(x.shape, t.shape)
    gs = _reduce_grad(g, ctx.reduction, _numel(shape))
    if w is not None:
        gs = gs * w
    gx = gt = None
    if n[0]:
        s = x.sigmoid()
        d = s * (pw * t + 1 - t) - pw * t if pw is not None else s - t
        gx = sum_to(gs * d, x.shape)
    if n[1]:
        # d/dt = -[(pw - 1) log sigmoid(x) + x];  log sigmoid(x) = -softplus(-x)
        d = x if pw is None else x - (pw - 1) * (-x).softplus()
        gt = sum_to(-gs * d, t.shape)
    return gx, gt, None, None


register("binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None, Tensor? pos_weight=None, "
         "str reduction='mean') -> Tensor", _bce_logits_kernel, backward=_bce_logits_bwd,
         save=("self", "target", "weight", "pos_weight"), tags=LOSS, method=False,
         doc="binary_cross_entropy(sigmoid(self), target) computed stably; pos_weight weighs the positive term.")


def _kl_div_kernel(self, target, reduction, log_target):
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")
    return TF.kl_div(self, target, reduction=reduction, log_target=log_target)


def _kl_div_bwd(ctx, g):
    x, t = ctx.self, ctx.target
    red = ctx.reduction
    shape = torch.broadcast_shapes(x.shape, t.shape)
    if red == "batchmean":
        gs = g / (x.shape[0] if x.dim() else 1)
    else:
        gs = _reduce_grad(g, red, _numel(shape))
    n = ctx.needs_input_grad
    gx = gt = None
    if ctx.log_target:
        et = t.exp()
        if n[0]:
            gx = sum_to(-gs * et, x.shape)
        if n[1]:
            gt = sum_to(gs * et * (t + 1 - x), t.shape)
    else:
        if n[0]:
            gx = sum_to(-gs * t, x.shape)
        if n[1]:
            pos = t > 0
            safe = OPS["where"].fn(pos, t, 1.0)
            gt = sum_to(OPS["where"].fn(pos, gs * (safe.log() + 1 - x), 0.0), t.shape)
    return gx, gt


register("kl_div(Tensor self, Tensor target, str reduction='mean', bool log_target=False) -> Tensor",
         _kl_div_kernel, backward=_kl_div_bwd, save=("self", "target"), tags=LOSS, method=False,
         doc="target * (log target - self) pointwise (self holds log-probabilities), reduced; 'batchmean' "
             "divides the sum by the batch size.")


# =================================================================================================
# scaled dot-product attention
# =================================================================================================
def _sdpa_kernel(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError("query, key and value must have at least 2 dims (..., L, E)")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"incompatible shapes: query {list(query.shape)}, key {list(key.shape)}, "
                           f"value {list(value.shape)} (need query[-1] == key[-1] and key[-2] == value[-2])")
    out = TF.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)
    # fused GPU kernels return a (B, L, H, E)-strided result; the op's layout contract is contiguous
    return out.contiguous()


def _expand_kv(t, hq):
    """Repeat each of the H_kv heads of ``t`` (dim -3) hq / H_kv times (grouped-query attention)."""
    hk = t.shape[-3]
    if hk == hq:
        return t
    rep = hq // hk
    shape = list(t.shape)
    return t.unsqueeze(-3).expand(shape[:-2] + [rep] + shape[-2:]).reshape(shape[:-3] + [hq] + shape[-2:])


def _sum_kv(g, hk):
    hq = g.shape[-3]
    if hk == hq:
        return g
    shape = list(g.shape)
    return g.reshape(shape[:-3] + [hk, hq // hk] + shape[-2:]).sum(-3)


def attention_bias(attn_mask, is_causal, L, S, like):
    """The additive score bias (tp tensor or None): causal -inf above the diagonal, a bool mask's False
    entries -inf, a float mask added as is.  Built from tp ops (factories, tril, where)."""
    bias = None
    if is_causal:
        keep = OPS["_ones"].fn([L, S], dtype=torch.bool, device=like.device).tril()
        bias = OPS["where"].fn(keep, 0.0, float("-inf")).to(like.dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            m = OPS["where"].fn(attn_mask, 0.0, float("-inf")).to(like.dtype)
        else:
            m = attn_mask
        bias = m if bias is None else bias + m
    return bias


def sdpa_scores(q, k, attn_mask, is_causal, scale):
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = q.matmul(k.transpose(-2, -1)) * sc
    bias = attention_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q)
    return (s if bias is None else s + bias), sc


def _sdpa_bwd(ctx, g):
    q, k, v, mask = ctx.query, ctx.key, ctx.value, ctx.attn_mask
    hq = q.shape[-3] if q.dim() >= 3 else None
    gqa = ctx.enable_gqa and hq is not None and k.shape[-3] != hq
    ke, ve = (_expand_kv(k, hq), _expand_kv(v, hq)) if gqa else (k, v)
    s, sc = sdpa_scores(q, ke, mask, ctx.is_causal, ctx.scale)
    p = OPS["softmax"].fn(s, -1)
    n = ctx.needs_input_grad
    gq = gk = gv = gm = None
    if n[2]:
        gv = p.transpose(-2, -1).matmul(g)
        gv = sum_to(_sum_kv(gv, v.shape[-3]) if gqa else gv, v.shape)
    if n[0] or n[1] or n[3]:
        gp = g.matmul(ve.transpose(-2, -1))
        gs = p * (gp - (gp * p).sum(-1, keepdim=True))
        if n[0]:
            gq = sum_to(gs.matmul(ke) * sc, q.shape)
        if n[1]:
            gk = gs.transpose(-2, -1).matmul(q) * sc
            gk = sum_to(_sum_kv(gk, k.shape[-3]) if gqa else gk, k.shape)
        if n[3] and mask is not None and mask.is_floating_point():
            gm = sum_to(gs, mask.shape)
    return gq, gk, gv, gm


def sdpa_composite(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Attention from tp ops: softmax(q kᵀ * scale + bias) (dropped out) @ v."""
    hq = query.shape[-3] if query.dim() >= 3 else None
    if enable_gqa and hq is not None and key.shape[-3] != hq:
        key, value = _expand_kv(key, hq), _expand_kv(value, hq)
    s, _ = sdpa_scores(query, key, attn_mask, is_causal, scale)
    p = OPS["softmax"].fn(s, -1)
    if dropout_p > 0:
        p = OPS["native_dropout"].fn(p, dropout_p, True)[0]
    return p.matmul(value)


register("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
         "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> Tensor", _sdpa_kernel,
         backward=_sdpa_bwd, save=("query", "key", "value", "attn_mask"), tags=N, method=False, function=False,
         decomp=lambda q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False:
         sdpa_composite(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa),
         doc="softmax(q kᵀ * scale + mask) @ v (scale = 1/sqrt(E) by default; a bool mask keeps True entries; "
             "is_causal masks j > i).  Dropout lives in nn.functional (composite).")
