"""Reductions: sum, mean, prod, max/min, var/std, logsumexp, norms, scans (chapter §6.7, §8.3).

``dim`` accepts an int, a list of ints or None (all dims); ``keepdim`` keeps reduced dims as
size 1.  The gradient of a reduction is the output gradient broadcast back over the reduced dims
(``_expand_back``), multiplied by the local derivative.
"""
from __future__ import annotations

import torch

from ._helpers import normalize_dims
from .registry import register

__all__ = []

RD = ("reduction",)


def _expand_back(g, in_shape, dim, keepdim):
    """Broadcast the gradient of a reduction over ``dim`` back to ``in_shape``."""
    if not keepdim and len(in_shape) > 0:
        for d in sorted(normalize_dims(dim, len(in_shape))):
            g = g.unsqueeze(d)
    return g.expand(in_shape)


def _sum_kernel(self, dim, keepdim, dtype):
    if dim is None:
        if keepdim:
            return torch.sum(self, dim=list(range(self.dim())), keepdim=True, dtype=dtype)
        return torch.sum(self, dtype=dtype)
    return torch.sum(self, dim, keepdim=keepdim, dtype=dtype)


register("sum(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", _sum_kernel,
         backward=lambda ctx, g: _expand_back(g, ctx.self.shape, ctx.dim, ctx.keepdim), save=(), tags=RD)


def _numel_over(shape, dim):
    n = 1
    for d in normalize_dims(dim, len(shape)):
        if len(shape):
            n *= shape[d]
    return n


def _mean_kernel(self, dim, keepdim, dtype):
    if dim is None:
        if keepdim:
            return torch.mean(self, dim=list(range(self.dim())), keepdim=True, dtype=dtype)
        return torch.mean(self, dtype=dtype)
    return torch.mean(self, dim, keepdim=keepdim, dtype=dtype)


register("mean(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", _mean_kernel,
         backward=lambda ctx, g: _expand_back(g, ctx.self.shape, ctx.dim, ctx.keepdim) / _numel_over(ctx.self.shape, ctx.dim),
         save=(), tags=RD)
