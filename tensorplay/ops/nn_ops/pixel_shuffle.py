"""Pixel shuffle (Shi et al. 2016, sub-pixel convolution) and its inverse.

``pixel_shuffle(x, r)``: (*, C·r², H, W) -> (*, C, H·r, W·r), output[..., c, h·r + i, w·r + j] =
input[..., c·r² + i·r + j, h, w]; ``pixel_unshuffle(x, r)`` is the inverse permutation.  Both are
pure permutations of the elements: the eager kernel is ATen's (bit-identical to PyTorch, any dtype;
for an empty input ``pixel_unshuffle`` returns the documented shape, where ATen's CPU kernel returns
the input's),
the decomposition is reshape -> permute -> reshape (what a compiler without the op lowers), and each
op's derivative is the other op applied to the incoming gradient (so derivatives of any order exist).
"""
from __future__ import annotations

import torch

from ..registry import OPS, register

S = ("shape",)


def _split(x, r, who):
    if x.dim() < 3:
        raise RuntimeError(f"{who} expects input to have at least 3 dimensions, but got input with {x.dim()} "
                           f"dimension(s)")
    if not isinstance(r, int) or r <= 0:
        raise RuntimeError(f"{who} expects a positive factor, but got {r}")
    n = x.dim() - 3
    return list(x.shape[:n]), n


def _shuffle_decomp(self, upscale_factor):
    r = upscale_factor
    batch, n = _split(self, r, "pixel_shuffle")
    c, h, w = self.shape[-3:]
    x = self.reshape(batch + [c // (r * r), r, r, h, w])
    x = x.permute(list(range(n)) + [n, n + 3, n + 1, n + 4, n + 2])
    return x.reshape(batch + [c // (r * r), h * r, w * r])


def _unshuffle_decomp(self, downscale_factor):
    r = downscale_factor
    batch, n = _split(self, r, "pixel_unshuffle")
    c, hh, ww = self.shape[-3:]
    x = self.reshape(batch + [c, hh // r, r, ww // r, r])
    x = x.permute(list(range(n)) + [n, n + 2, n + 4, n + 1, n + 3])
    return x.reshape(batch + [c * r * r, hh // r, ww // r])


def _shuffle_kernel(self, upscale_factor):
    _split(self, upscale_factor, "pixel_shuffle")
    return torch.pixel_shuffle(self, upscale_factor)


def _unshuffle_kernel(self, downscale_factor):
    _split(self, downscale_factor, "pixel_unshuffle")
    if self.numel() == 0:     # ATen's CPU kernel returns an empty input's shape unchanged; its meta is right
        return _unshuffle_decomp(self, downscale_factor).contiguous()
    return torch.pixel_unshuffle(self, downscale_factor)


register("pixel_shuffle(Tensor self, int upscale_factor) -> Tensor", _shuffle_kernel,
         backward=lambda ctx, g: OPS["pixel_unshuffle"].fn(g, ctx.upscale_factor), save=(),
         decomp=_shuffle_decomp, tags=S, method=False)
register("pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor", _unshuffle_kernel,
         backward=lambda ctx, g: OPS["pixel_shuffle"].fn(g, ctx.downscale_factor), save=(),
         decomp=_unshuffle_decomp, tags=S, method=False)
