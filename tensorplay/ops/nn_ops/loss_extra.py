"""Connectionist temporal classification (chapter §1.2): the extern ops ``_ctc_loss`` (per-sample
negative log-likelihood and the forward variables alpha) and ``_ctc_loss_backward``.

Both kernels are ATen's, so values and gradients are PyTorch's bit for bit.  The derivative of
``_ctc_loss`` w.r.t. ``log_probs`` is the table op ``_ctc_loss_backward`` (it reads the saved
result: nll and alpha); the alpha output and the integer targets have no gradient.
``_ctc_loss_backward`` itself is not differentiable (no double backward, as in PyTorch's CPU
kernel).  The user-facing ``tp.nn.functional.ctc_loss`` reduces the nll.
"""
from __future__ import annotations

from ..registry import OPS, register
from ._common import LOSS, aten

__all__ = []


def _ctc_kernel(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    t, n = log_probs.shape[0], log_probs.shape[1]
    if len(input_lengths) != n or len(target_lengths) != n:
        raise RuntimeError(f"tp._ctc_loss: expected {n} input_lengths and target_lengths, got "
                           f"{len(input_lengths)} and {len(target_lengths)}")
    if any(v > t for v in input_lengths):
        raise RuntimeError(f"tp._ctc_loss: input_lengths {list(input_lengths)} exceed the input length {t}")
    if not 0 <= blank < log_probs.shape[2]:
        raise RuntimeError(f"tp._ctc_loss: blank {blank} is not a class index (C = {log_probs.shape[2]})")
    return aten._ctc_loss(log_probs, targets, list(input_lengths), list(target_lengths), blank, zero_infinity)


def _ctc_bwd(ctx, g, _g_alpha):
    nll, alpha = ctx.result
    return (OPS["_ctc_loss_backward"].fn(g, ctx.log_probs, ctx.targets, ctx.input_lengths, ctx.target_lengths, nll,
                                         alpha, ctx.blank, ctx.zero_infinity), None)


register("_ctc_loss(Tensor log_probs, Tensor targets, int[] input_lengths, int[] target_lengths, int blank=0, "
         "bool zero_infinity=False) -> (Tensor neg_log_likelihood, Tensor log_alpha)", _ctc_kernel,
         backward=_ctc_bwd, save=("log_probs", "targets", "result"), tags=LOSS, method=False,
         doc="Per-sample CTC negative log-likelihood of log_probs (T, N, C) against targets, and the "
             "forward variables (N, T, 2 S + 1).")
register("_ctc_loss_backward(Tensor grad, Tensor log_probs, Tensor targets, int[] input_lengths, "
         "int[] target_lengths, Tensor neg_log_likelihood, Tensor log_alpha, int blank, bool zero_infinity=False) "
         "-> Tensor", lambda grad, log_probs, targets, il, tl, nll, alpha, blank, zi: aten._ctc_loss_backward(
             grad, log_probs, targets, list(il), list(tl), nll, alpha, blank, zi),
         tags=LOSS + ("nondifferentiable",), method=False, function=False,
         doc="Gradient of _ctc_loss's nll w.r.t. log_probs (ATen's kernel).")
