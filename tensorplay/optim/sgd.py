"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay.

For each parameter θ with gradient g (negated when ``maximize``), per step::

    g ← g + λθ                                   (weight_decay λ)
    b ← g                    on the first step   (momentum μ ≠ 0)
    b ← μ b + (1 − τ) g      afterwards          (dampening τ)
    g ← g + μ b   if nesterov   else   g ← b
    θ ← θ − lr · g

The arithmetic is PyTorch's, in the same order, so results match ``torch.optim.SGD`` bit for bit.
State: ``momentum_buffer`` per parameter (only when μ ≠ 0).
"""
from __future__ import annotations

import torch

from .._tensor import _wrap
from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer, required

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False, foreach=None,
                 differentiable: bool = False, fused=None):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable,
                        fused=fused)
        super().__init__(params, defaults)

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for group in self.param_groups:
                lr, mom, damp = group["lr"], group["momentum"], group["dampening"]
                wd, nesterov, maximize = group["weight_decay"], group["nesterov"], group["maximize"]
                for p in group["params"]:
                    if p._grad is None:
                        continue
                    param = p._data
                    grad = p._grad._data
                    if maximize:
                        grad = -grad
                    if wd != 0:
                        grad = grad.add(param, alpha=wd)
                    if mom != 0:
                        state = self.state[p]
                        buf = state.get("momentum_buffer")
                        if buf is None:
                            buf = _wrap(torch.clone(grad).detach())
                            state["momentum_buffer"] = buf
                        else:
                            buf._data.mul_(mom).add_(grad, alpha=1 - damp)
                        grad = grad.add(buf._data, alpha=mom) if nesterov else buf._data
                    param.add_(grad, alpha=-lr)
        return loss
