"""Embedding (chapter §1.2): a row gather of the weight; its backward is the table op
``embedding_dense_backward`` (a scatter-add of the incoming rows)."""
from __future__ import annotations

import torch

from ..registry import OPS, register
from ._common import N


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
