"""Linear algebra: matmul, mm, bmm, addmm, baddbmm, linear, einsum, outer (chapter §9.8).

These are extern kernels for the compiler (ATen / BLAS); their pointwise consumers fuse.
"""
from __future__ import annotations

import torch

from ._helpers import sum_to
from .registry import register

__all__ = []

L = ("linalg",)


def _matmul_bwd(ctx, g):
    a, b = ctx.self, ctx.other
    ga = gb = None
    if a.dim() == 1 and b.dim() == 1:
        return (g * b if ctx.needs_input_grad[0] else None, g * a if ctx.needs_input_grad[1] else None)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g2 = g
    if a.dim() == 1:
        g2 = g2.unsqueeze(-2)
    if b.dim() == 1:
        g2 = g2.unsqueeze(-1)
    if ctx.needs_input_grad[0]:
        ga = sum_to(g2.matmul(b2.mT), a2.shape)
        if a.dim() == 1:
            ga = ga.squeeze(0)
    if ctx.needs_input_grad[1]:
        gb = sum_to(a2.mT.matmul(g2), b2.shape)
        if b.dim() == 1:
            gb = gb.squeeze(-1)
    return ga, gb


register("matmul(Tensor self, Tensor other) -> Tensor", backward=_matmul_bwd, save=("self", "other"), tags=L,
         dunders=("__matmul__",), rdunders=("__rmatmul__",))
