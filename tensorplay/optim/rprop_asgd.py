"""Rprop and ASGD.

* ``Rprop`` (Riedmiller & Braun 1993): per coordinate a step size s, multiplied by ``etaplus`` when
  the gradient kept its sign since the last step and by ``etaminus`` when it flipped (then that
  coordinate's gradient counts as 0 for this step), clamped to ``step_sizes``;
  θ ← θ − sign(g)·s (state ``prev`` gradient, ``step_size``).
* ``ASGD`` (Polyak & Juditsky 1992): θ ← θ(1 − λη) − ηg with η_t = lr / (1 + λ·lr·t)^α, and the
  running average ``ax`` of the iterates, which starts averaging after ``t0`` steps (μ_t = 1/max(1, t − t0))
  (state ``eta``, ``mu``, ``ax``).

Defaults, state names and the floating-point operations are PyTorch's single-tensor ones, so
parameters equal ``torch.optim.Rprop/ASGD``'s bit for bit on the same gradients.
"""
from __future__ import annotations

import torch

from .._tensor import _wrap
from ._elementwise import ElementwiseOptimizer, check_range, zeros_state

__all__ = ["Rprop", "ASGD"]


class Rprop(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *, capturable: bool = False,
                 foreach=None, maximize: bool = False, differentiable: bool = False):
        check_range("Rprop", lr=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"tp.optim.Rprop: invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes), foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, capturable=capturable))

    def _init_state(self, group, d, state):
        state["prev"] = zeros_state(d)
        state["step_size"] = _wrap(torch.full_like(d, group["lr"]))

    def _update(self, group, param, grad, state, step):
        (etaminus, etaplus), (lo, hi) = group["etas"], group["step_sizes"]
        prev, step_size = state["prev"]._data, state["step_size"]._data
        sign = grad.mul(prev).sign()
        sign[sign.gt(0)] = etaplus
        sign[sign.lt(0)] = etaminus
        sign[sign.eq(0)] = 1
        step_size.mul_(sign).clamp_(lo, hi)
        grad = grad.clone(memory_format=torch.preserve_format)
        grad[sign.eq(etaminus)] = 0
        param.addcmul_(grad.sign(), step_size, value=-1)
        prev.copy_(grad)


class ASGD(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: float = 0, foreach=None, maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False):
        check_range("ASGD", lr=lr, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize, differentiable=differentiable,
                                      capturable=capturable))

    def _init_state(self, group, d, state):
        state["eta"] = _wrap(torch.as_tensor(group["lr"], dtype=torch.float32).clone())
        state["mu"] = _wrap(torch.ones((), dtype=torch.float32))
        state["ax"] = zeros_state(d)

    def _update(self, group, param, grad, state, step):
        lr, lambd, wd = group["lr"], group["lambd"], group["weight_decay"]
        eta_t, mu_t, ax = state["eta"]._data, state["mu"]._data, state["ax"]._data
        if wd != 0:
            grad = grad.add(param, alpha=wd)
        eta = eta_t.item()
        param.mul_(1 - lambd * eta)
        param.add_(grad, alpha=-eta)
        if mu_t.item() != 1:
            ax.add_(param.sub(ax).mul_(mu_t))
        else:
            ax.copy_(param)
        eta_t.copy_(torch.as_tensor(lr / ((1 + lambd * lr * step) ** group["alpha"])))
        mu_t.copy_(torch.as_tensor(1 / max(1, step - group["t0"])))
