"""Collective matmul: the input blocks flow around the ring while the weights stay (seed 001 §5).

Layout: the input ``A[B, D]`` is split along ``D`` and the weight ``W[D, F]`` along ``F`` over the
members of a mesh axis; member ``j`` holds ``a = A_j`` (``[B, D/n]``) and ``w = W[:, j]`` (all ``D``
rows of its ``F/n`` output columns) and must end with ``C_j = sum_r A_r W[r, j]``, its block of the
output's columns.  Instead of an all-gather of ``A`` followed by one product, the blocks travel
around the ring: at step ``s`` member ``idx`` holds the block that started at ``source = (idx + s) %
n`` (each member receives from ``idx + 1``: ``perm = [(1, 0), (2, 1), ..., (0, n - 1)]``), multiplies
it by the matching rows ``w[source * D/n : (source + 1) * D/n]`` and accumulates.  After ``n`` steps
``C_j`` is complete: no all-reduce at the end -- the information the sum needs arrived with the
inputs.

Overlap: the transfer of the next block is started (``torch.distributed`` asynchronous send and
receive) before the current block's product and waited for after it, so communication and
computation may overlap; whether they do is the machine's business (the profiler's critical path
shows the exposed communication).

Derivatives (the transpose, in the convention of collectives.py: each process holds its part of
the cotangent ``g = dC_j``): ``dw = all_gather(a)^T g`` (the whole ``A`` times the local cotangent)
and ``da = psum_scatter(g w^T)`` along ``D`` (every member's contribution to every input block,
summed where the block lives) -- built from the differentiable collectives, so they differentiate
again.

Guarantee: the result equals ``(all_gather(a, tiled) @ w)`` -- exactly for integer-valued inputs
(the seed's 4-device example), otherwise up to the order of the ``n`` partial sums.
"""
from __future__ import annotations

import torch

from ..ops.registry import OPS, register
from .collectives import _dist, _group, _op, _real, _resolve

__all__ = ["collective_matmul"]


def _collective_matmul_kernel(a, w, mid, axes):
    if a.dim() != 2 or w.dim() != 2:
        raise ValueError(f"collective_matmul: a and w must be matrices, got a {list(a.shape)} and w {list(w.shape)}")
    if not _real(a):
        return a.new_empty((a.shape[0], w.shape[1]))
    g = _group(mid, axes)
    n, idx, width = g.size, g.index, a.shape[1]
    if w.shape[0] != n * width:
        raise ValueError(f"collective_matmul: w has {w.shape[0]} rows, the input blocks cover {n} x {width} = "
                         f"{n * width} features along {tuple(axes)} (a {list(a.shape)} is one of {n} blocks)")
    dist = _dist()
    current, result = a.contiguous(), None
    for step in range(n):
        source = (idx + step) % n
        reqs = ()
        if step < n - 1:        # start the next block's transfer before this block's product
            nxt = torch.empty_like(current)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, current, g.ranks[(idx - 1) % n], g.pg),
                                           dist.P2POp(dist.irecv, nxt, g.ranks[(idx + 1) % n], g.pg)])
        update = current @ w[source * width:(source + 1) * width]
        result = update if result is None else result + update
        for r in reqs:
            r.wait()
        if step < n - 1:
            current = nxt
    return result


def _backward(ctx, grad):
    a_full = _op("dist_all_gather")(ctx.a, ctx.mesh, ctx.axes, 1, True)
    da = _op("dist_psum_scatter")(grad @ ctx.w.t(), ctx.mesh, ctx.axes, 1, True) if ctx.needs_input_grad[0] else None
    dw = a_full.t() @ grad if ctx.needs_input_grad[1] else None
    return da, dw


if "dist_collective_matmul" not in OPS:       # (a reload of this module must not register it twice)
    register("dist_collective_matmul(Tensor a, Tensor w, int mesh, str[] axes) -> Tensor",
             _collective_matmul_kernel, backward=_backward, save=("a", "w"), method=False, function=False,
             tags=("collective",),
             doc="collective matmul over mesh axes (tensorplay.distributed.collective_matmul)")


def collective_matmul(a, w, axis_name):
    """``C_j = sum_r A_r W[r, j]`` inside :func:`~tensorplay.distributed.shard_map`: ``a`` this
    member's block of the input's features (``[B, D/n]``), ``w`` all rows of its output columns
    (``[D, F/n]``); returns its ``[B, F/n]`` block of ``A @ W`` (module doc)."""
    _, mid, axes = _resolve(axis_name, "collective_matmul")
    return OPS["dist_collective_matmul"].fn(a, w, mid, axes)
