"""More resampling ops for ``interpolate`` (chapter §1.2): nearest and trilinear in 3-d, bicubic in
2-d, 'nearest-exact' in 1/2/3-d, the antialiased bilinear / bicubic kernels, and
adaptive_avg_pool3d (mode 'area' of a 5-d input).

Each op is ATen's kernel (bit-identical to PyTorch) with a dedicated backward op that is again a
table op; every backward op is linear in the incoming gradient and its own derivative is the
forward op (the transpose), so double backward works, as for the resampling ops of pooling.py.
"""
from __future__ import annotations

from ..registry import OPS, register
from ._common import N, aten
from .conv import _dummy
from .pooling import _register_upsample

__all__ = []

_S3 = "float? scales_d=None, float? scales_h=None, float? scales_w=None"
_S2 = "float? scales_h=None, float? scales_w=None"
_N3 = ["scales_d", "scales_h", "scales_w"]
_N2 = ["scales_h", "scales_w"]

_register_upsample("upsample_nearest3d", _S3, _N3)
_register_upsample("upsample_trilinear3d", "bool align_corners, " + _S3, ["align_corners"] + _N3)
_register_upsample("upsample_bicubic2d", "bool align_corners, " + _S2, ["align_corners"] + _N2)
_register_upsample("_upsample_nearest_exact1d", "float? scales=None", ["scales"])
_register_upsample("_upsample_nearest_exact2d", _S2, _N2)
_register_upsample("_upsample_nearest_exact3d", _S3, _N3)
_register_upsample("_upsample_bilinear2d_aa", "bool align_corners, " + _S2, ["align_corners"] + _N2)
_register_upsample("_upsample_bicubic2d_aa", "bool align_corners, " + _S2, ["align_corners"] + _N2)


def _adaptive_avg3d_kernel(self, output_size):
    if self.dim() not in (4, 5):
        raise RuntimeError(f"expected a 4-d (C, D, H, W) or 5-d (N, C, D, H, W) input, got shape {list(self.shape)}")
    return aten.adaptive_avg_pool3d(self, list(output_size))


register("adaptive_avg_pool3d(Tensor self, int[] output_size) -> Tensor", _adaptive_avg3d_kernel,
         backward=lambda ctx, g: OPS["adaptive_avg_pool3d_backward"].fn(g, list(ctx.self.shape)), save=(), tags=N,
         method=False, doc="3-d average pooling onto a fixed output size (bins of varying extent).")
register("adaptive_avg_pool3d_backward(Tensor grad_output, int[] input_size) -> Tensor",
         lambda grad_output, input_size: aten._adaptive_avg_pool3d_backward(grad_output,
                                                                           _dummy(grad_output, input_size)),
         backward=lambda ctx, gg: OPS["adaptive_avg_pool3d"].fn(gg, list(ctx.grad_output.shape[-3:])),
         save=(), tags=N, method=False, function=False, doc="Gradient of adaptive_avg_pool3d (its transpose).")
