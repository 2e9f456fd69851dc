"""Matrix factorisations and triangular solves: ``linalg_cholesky``, ``linalg_solve_triangular``.

Both are op-table entries (tag ``linalg``: Stax calls ATen's kernels for them) over batches of
matrices in the last two dims, with batch dims broadcast as in ``torch.linalg``.  Results are ATen's,
bit-identical to ``torch.linalg.cholesky`` / ``torch.linalg.solve_triangular``.  Derivatives are
written in tp ops (products and triangular solves), so they differentiate again:

* Cholesky ``A = L Lᵀ``: ``gA = L⁻ᵀ Φ(Lᵀ gL) L⁻¹`` with ``Φ(M) = ½ (tril(M) + tril(M, -1)ᵀ)``
  (the gradient of the lower triangle read as a symmetric matrix's);
* ``X = A⁻¹ B`` (``left``) or ``X = B A⁻¹``: ``gB`` solves the transposed system, and ``gA = -gB Xᵀ``
  (``-Xᵀ gB``) restricted to A's triangle (strict triangle for ``unitriangular``).

A matrix that is not positive definite makes ``linalg_cholesky`` raise naming the op.
"""
from __future__ import annotations

import torch

from ._helpers import unbroadcast
from .registry import OPS, register

__all__ = []

L = ("linalg",)


def _solve(a, b, upper, left=True, unitriangular=False):
    return OPS["linalg_solve_triangular"].fn(a, b, upper=upper, left=left, unitriangular=unitriangular)


def _cholesky_kernel(self, upper):
    return torch.linalg.cholesky(self, upper=upper)


def _cholesky_bwd(ctx, g):
    lo = ctx.result.mT if ctx.upper else ctx.result
    gl = g.mT if ctx.upper else g
    m = (lo.mT @ gl).tril()
    m = 0.5 * (m + m.tril(-1).mT)
    m = _solve(lo.mT, m, upper=True)
    return _solve(lo, m, upper=False, left=False)


register("linalg_cholesky(Tensor self, *, bool upper=False) -> Tensor", _cholesky_kernel, backward=_cholesky_bwd,
         save=("result",), tags=L, method=False,
         doc="Cholesky factor of a symmetric positive-definite matrix: lower L with A = L Lᵀ (upper: U = Lᵀ).")


def _solve_triangular_kernel(self, B, upper, left, unitriangular):
    return torch.linalg.solve_triangular(self, B, upper=upper, left=left, unitriangular=unitriangular)


def _solve_triangular_bwd(ctx, g):
    a, x = ctx.self, ctx.result
    up, left, unit = ctx.upper, ctx.left, ctx.unitriangular
    n = ctx.needs_input_grad
    gb = _solve(a.mT, g, upper=not up, left=left, unitriangular=unit)
    ga = None
    if n[0]:
        ga = -(gb @ x.mT) if left else -(x.mT @ gb)
        ga = ga.triu(1 if unit else 0) if up else ga.tril(-1 if unit else 0)
        ga = unbroadcast(ga, a)
    return ga, (unbroadcast(gb, ctx.B) if n[1] else None)


register("linalg_solve_triangular(Tensor self, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) -> "
         "Tensor", _solve_triangular_kernel, backward=_solve_triangular_bwd, save=("self", "B", "result"), tags=L,
         method=False, doc="X with A X = B (left) or X A = B, for triangular A (its other triangle is not read).")
