"""Grouped (ragged) matrix products: ``ragged_dot`` and its weight-gradient op (seed 001 §6).

``ragged_dot(lhs[m, k], rhs[g, k, n], group_sizes[g]) -> [m, n]`` is ``jax.lax.ragged_dot``: the
rows of ``lhs`` are grouped contiguously, group ``i`` has ``group_sizes[i]`` rows and is multiplied
by ``rhs[i]``.  This is how a mixture of experts runs its experts on the rows it sorted by expert
(tensorplay/nn/moe.py): one call instead of a padded ``[E, C, D]`` batch.

Guarantees:

* ``out[r] = lhs[r] @ rhs[i]`` for every row ``r`` of group ``i``, computed by one ATen ``mm`` per
  non-empty group (so the values are exactly those of that loop); empty groups are skipped.
* ``sum(group_sizes) < m``: the rows after the last group are **zero** in the output (JAX's rule)
  and receive zero gradient.  This is what capacity-limited dispatch relies on: dropped records sit
  after the last group and contribute nothing.  ``sum(group_sizes) > m`` raises ``ValueError``
  naming the sum, ``m`` and the sizes.
* ``lhs`` and ``rhs`` share one dtype (any float -- float16, bfloat16, float32, float64 -- or an
  integer dtype); ``group_sizes`` is a 1-D integer tensor of length ``g`` with non-negative
  entries.  Wrong ranks, a contraction mismatch, a wrong length, negative sizes or a float
  ``group_sizes`` raise an error naming ``tp.ragged_dot`` and the shapes or values.
* The output is a fresh contiguous ``[m, n]`` tensor; the meta function gives it without reading
  ``group_sizes`` (the output shape never depends on the data).
* Derivatives (``group_sizes`` is integer, not differentiable), each again one of the two ops here,
  so they are differentiable to any order:

  - ``d lhs = ragged_dot(g, rhsᵀ, group_sizes)`` (``rhsᵀ`` the ``[g, n, k]`` transpose);
  - ``d rhs = _ragged_dot_rhs_backward(lhs, g, group_sizes)`` whose group ``i`` is
    ``lhs[rows_i]ᵀ @ g[rows_i]`` (``[g, k, n]``; zero for an empty group);
  - ``_ragged_dot_rhs_backward(x, y, gs)`` with output gradient ``H[g, k, n]`` has
    ``d x = ragged_dot(y, Hᵀ, gs)``, ``d y = ragged_dot(x, H, gs)``.

Both ops carry the ``linalg`` tag: in compiled graphs they are extern (ATen) kernels
(tensorplay/compiler/backends/stax/op_lowerings/extern_rules.py), whose neighbours still fuse.
"""
from __future__ import annotations

import torch

from .registry import OPS, register

__all__ = []


def _dt(t):
    return str(t.dtype).replace("torch.", "")


def _check(lhs, rhs, group_sizes, what="rhs"):
    """Shape and dtype checks that need no data; returns (m, k, g, n) of the product."""
    if lhs.dim() != 2:
        raise ValueError(f"lhs must be 2-D [m, k], got {lhs.dim()}-D {list(lhs.shape)}")
    want = 3 if what == "rhs" else 2
    if rhs.dim() != want:
        form = "[g, k, n]" if what == "rhs" else "[m, n]"
        raise ValueError(f"{what} must be {want}-D {form}, got {rhs.dim()}-D {list(rhs.shape)}")
    if group_sizes.dim() != 1:
        raise ValueError(f"group_sizes must be 1-D [g], got {group_sizes.dim()}-D {list(group_sizes.shape)}")
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise TypeError(f"group_sizes must be an integer tensor, got {_dt(group_sizes)}")
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"lhs and {what} must have the same dtype, got {_dt(lhs)} and {_dt(rhs)}")
    m, k = lhs.shape
    if what == "rhs":
        g, k2, n = rhs.shape
        if k2 != k:
            raise ValueError(f"contraction sizes differ: lhs is [m={m}, k={k}] but rhs is [g={g}, k={k2}, n={n}]")
        if group_sizes.shape[0] != g:
            raise ValueError(f"group_sizes has {group_sizes.shape[0]} entries but rhs has g={g} groups")
    else:
        if rhs.shape[0] != m:
            raise ValueError(f"lhs has {m} rows but grad has {rhs.shape[0]}")
        g, n = group_sizes.shape[0], rhs.shape[1]
    return m, k, g, n


def _sizes(group_sizes, m):
    """The group sizes as Python ints, checked against the ``m`` rows (one host read)."""
    sizes = [int(s) for s in group_sizes.tolist()]
    neg = [s for s in sizes if s < 0]
    if neg:
        raise ValueError(f"group_sizes must be non-negative, got {sizes}")
    if sum(sizes) > m:
        raise ValueError(f"sum(group_sizes) = {sum(sizes)} exceeds the {m} rows of lhs (group_sizes {sizes})")
    return sizes


def _real(*ts):
    """Tensors with data: not meta tensors, nor the fake tensors of symbolic capture."""
    return all(t.device.type != "meta" and getattr(t, "fake_mode", None) is None for t in ts)


def _ragged_dot_meta(lhs, rhs, group_sizes):
    m, _, _, n = _check(lhs, rhs, group_sizes)
    return torch.empty((m, n), dtype=lhs.dtype, device="meta")


def _ragged_dot_kernel(lhs, rhs, group_sizes):
    m, _, _, n = _check(lhs, rhs, group_sizes)
    if not _real(lhs, rhs, group_sizes):           # meta or fake tensors (capture): shape only
        return lhs.new_empty((m, n))
    out = lhs.new_zeros((m, n))
    start = 0
    for i, s in enumerate(_sizes(group_sizes, m)):
        if s:
            out[start:start + s] = torch.mm(lhs[start:start + s], rhs[i])
        start += s
    return out


def _rhs_backward_meta(lhs, grad, group_sizes):
    _, k, g, n = _check(lhs, grad, group_sizes, what="grad")
    return torch.empty((g, k, n), dtype=lhs.dtype, device="meta")


def _rhs_backward_kernel(lhs, grad, group_sizes):
    m, k, g, n = _check(lhs, grad, group_sizes, what="grad")
    if not _real(lhs, grad, group_sizes):
        return lhs.new_empty((g, k, n))
    out = lhs.new_zeros((g, k, n))
    start = 0
    for i, s in enumerate(_sizes(group_sizes, m)):
        if s:
            out[i] = torch.mm(lhs[start:start + s].t(), grad[start:start + s])
        start += s
    return out


def _ragged(a, b, gs):
    return OPS["ragged_dot"].fn(a, b, gs)


def _ragged_dot_bwd(ctx, g):
    n = ctx.needs_input_grad
    return (_ragged(g, ctx.rhs.transpose(1, 2), ctx.group_sizes) if n[0] else None,
            OPS["_ragged_dot_rhs_backward"].fn(ctx.lhs, g, ctx.group_sizes) if n[1] else None,
            None)


def _rhs_backward_bwd(ctx, h):
    n = ctx.needs_input_grad
    return (_ragged(ctx.grad, h.transpose(1, 2), ctx.group_sizes) if n[0] else None,
            _ragged(ctx.lhs, h, ctx.group_sizes) if n[1] else None,
            None)


def _flops(ins, out):
    """2·m·k·n: every row of lhs against one [k, n] matrix (rows after the last group counted too)."""
    if len(ins) >= 2 and hasattr(ins[0], "shape") and hasattr(ins[1], "shape"):
        m, k = ins[0].shape
        return 2 * m * k * ins[1].shape[-1]
    return None


register("ragged_dot(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor", _ragged_dot_kernel,
         backward=_ragged_dot_bwd, save=("lhs", "rhs", "group_sizes"), meta=_ragged_dot_meta, tags=("linalg",),
         flops=_flops, method=False,
         doc="Grouped matrix product (jax.lax.ragged_dot): rows of lhs in contiguous groups, group i times "
             "rhs[i]; rows after sum(group_sizes) are zero.")
register("_ragged_dot_rhs_backward(Tensor lhs, Tensor grad, Tensor group_sizes) -> Tensor", _rhs_backward_kernel,
         backward=_rhs_backward_bwd, save=("lhs", "grad", "group_sizes"), meta=_rhs_backward_meta, tags=("linalg",),
         flops=_flops, method=False, function=False,
         doc="Gradient of ragged_dot for rhs: group i is lhs[rows_i]^T @ grad[rows_i].")
