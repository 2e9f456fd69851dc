"""Convolutions (chapter §1.2): ``convolution`` and the conv1d/2d/3d and conv_transpose1d/2d/3d entry
points, with dedicated backward ops (input, weight, both) whose derivatives are again table ops (the
transposes), so convolutions support double backward.  ``padding`` is one int per spatial dim
(symmetric) or two per dim, ``[before_0, after_0, before_1, after_1, ...]``."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from ..registry import OPS, register
from ._common import CONV, _dims_except, aten


def _conv_flops(ins, out):
    """FLOPs of a convolution for the cost model: 2·(output elements)·(the second input's size
    without its first dim) -- for ``convolution`` that is the weight's C_in/groups · kernel volume.
    None without metas (the model then counts by tags)."""
    if len(ins) >= 2 and hasattr(ins[1], "shape"):
        return 2 * (math.prod(out.shape) if hasattr(out, "shape") else 0) * math.prod(ins[1].shape[1:])
    return None


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
         backward=_convolution_bwd, save=("input", "weight"), tags=CONV, flops=_conv_flops, method=False,
         doc="N-d cross-correlation (N = weight.dim() - 2) of a batched input; padding per dim, symmetric or "
             "as (before, after) pairs.")
register(f"convolution_backward_input(Tensor grad_output, Tensor weight, int[] input_size, {_CONV_ARGS}) -> Tensor",
         _conv_backward_input_kernel, backward=_conv_bwd_input_bwd, save=("grad_output", "weight"), tags=CONV,
         flops=_conv_flops, method=False, function=False,
         doc="Gradient of convolution w.r.t. its input (a transposed convolution).")
register(f"convolution_backward_weight(Tensor grad_output, Tensor input, int[] weight_size, {_CONV_ARGS}) -> Tensor",
         _conv_backward_weight_kernel, backward=_conv_bwd_weight_bwd, save=("grad_output", "input"), tags=CONV,
         flops=_conv_flops, method=False, function=False, doc="Gradient of convolution w.r.t. its weight.")
register(f"convolution_backward(Tensor grad_output, Tensor input, Tensor weight, {_CONV_ARGS}) -> "
         "(Tensor grad_input, Tensor grad_weight)",
         _conv_backward_kernel, backward=_conv_backward_bwd, save=("grad_output", "input", "weight"), tags=CONV,
         flops=_conv_flops, method=False, function=False,
         doc="Gradients of convolution w.r.t. its input and its weight, in one call.")


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
             backward=bwd, save=("input", "weight"), decomp=decomp, tags=CONV, flops=_conv_flops, method=False,
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
             backward=bwd, save=("input", "weight"), tags=CONV, flops=_conv_flops, method=False,
             doc=f"{nd}-d transposed convolution (the adjoint of conv{nd}d w.r.t. its input); weight is "
                 f"(C_in, C_out / groups, *kernel).")


for _nd in (1, 2, 3):
    _make_conv_transposend(_nd)
