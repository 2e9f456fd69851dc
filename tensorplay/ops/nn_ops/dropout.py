"""Dropout (chapter §1.2): ``native_dropout`` returns the output and the mask it drew, so reverse and
forward mode reuse the mask (an output of the op, not a second draw)."""
from __future__ import annotations

import torch

from ..registry import register


# =================================================================================================
# dropout
# =================================================================================================
def _dropout_scale(p, train):
    if train is False:
        return 1.0
    return 0.0 if p >= 1 else 1.0 / (1.0 - p)


def _native_dropout_kernel(input, p, train):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return torch.native_dropout(input, p, train)


def _native_dropout_bwd(ctx, g, g_mask=None):
    mask = ctx.result[1]
    s = _dropout_scale(ctx.p, ctx.train)
    r = g * mask
    return r * s if s != 1.0 else r


def _native_dropout_jvp(args, outs, tangents):
    t = tangents[0]
    if t is None:
        return (None, None)
    s = _dropout_scale(args[1], args[2])
    r = t * outs[1]
    return (r * s if s != 1.0 else r, None)


register("native_dropout(Tensor input, float p, bool? train) -> (Tensor output, Tensor mask)", _native_dropout_kernel,
         backward=_native_dropout_bwd, jvp=_native_dropout_jvp, save=("result",), tags=("nn", "random"),
         method=False,
         doc="Zero each element with probability p and scale the rest by 1/(1-p); also returns the bool keep-mask, "
             "which the derivative (reverse and forward mode) reuses.")
