"""Pooling and resampling (chapter §1.2): max / average / adaptive pooling in 2-D, nearest and
(bi)linear upsampling.  Their gradients are backward ops of the table, linear in the incoming
gradient, whose own derivatives are table ops again (max pooling's backward scatters through the
indices; its derivative gathers)."""
from __future__ import annotations

import torch

from ..registry import OPS, register
from ._common import N, aten
from .conv import _dummy


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
