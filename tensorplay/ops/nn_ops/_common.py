"""Helpers shared by the nn op families (chapter §1.2): tags, the ``reduction`` argument of losses,
broadcasting a per-channel vector, sums over a possibly empty list of dims."""
from __future__ import annotations

import torch

N = ("nn",)
LOSS = ("nn", "loss")
CONV = ("nn", "conv")
aten = torch.ops.aten

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction_enum(reduction):
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{reduction!r} is not a valid value for reduction (expected 'none', 'mean' or 'sum')") \
            from None


def _dims_except(ndim, keep):
    return [d for d in range(ndim) if d != keep]


def _sum_dims(t, dims, keepdim=False):
    """``t.sum(dims)`` where an empty ``dims`` means *no* reduction (not a full reduction)."""
    return t.sum(dims, keepdim=keepdim) if dims else t


def _bcast_channel(t, ndim, dim=1):
    """View a per-channel vector (C,) so it broadcasts along ``dim`` of an ``ndim``-d tensor."""
    shape = [1] * ndim
    shape[dim] = t.shape[0]
    return t.reshape(shape)
