"""Adadelta, Adagrad and RMSprop: step sizes scaled per coordinate by running gradient statistics.

For a parameter θ with gradient g (negated under ``maximize``; plus λθ with ``weight_decay`` λ):

* ``Adadelta`` (Zeiler 2012):  v ← ρv + (1−ρ)g²;  Δ = √(u+ε)/√(v+ε) · g;  u ← ρu + (1−ρ)Δ²;  θ ← θ − lr·Δ
  (state ``square_avg`` v, ``acc_delta`` u);
* ``Adagrad`` (Duchi et al. 2011):  s ← s + g²;  θ ← θ − lr/(1 + (t−1)·lr_decay) · g/(√s + ε)
  (state ``sum``, starting at ``initial_accumulator_value``);
* ``RMSprop`` (Hinton 2012):  v ← αv + (1−α)g²;  with ``centered``: ḡ ← αḡ + (1−α)g and the
  denominator is √(v − ḡ²) + ε, else √v + ε;  with ``momentum`` μ: b ← μb + g/denominator and
  θ ← θ − lr·b, else θ ← θ − lr·g/denominator (state ``square_avg``, ``grad_avg``, ``momentum_buffer``).

Defaults, state names and the order of the floating-point operations are PyTorch's single-tensor
ones, so parameters after any number of steps equal ``torch.optim``'s bit for bit on the same grads.
"""
from __future__ import annotations

import torch

from .._tensor import _wrap
from ._elementwise import ElementwiseOptimizer, check_range, zeros_state

__all__ = ["Adadelta", "Adagrad", "RMSprop"]


class Adadelta(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach=None, *, capturable: bool = False, maximize: bool = False, differentiable: bool = False):
        check_range("Adadelta", lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"tp.optim.Adadelta: invalid rho value: {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      capturable=capturable, foreach=foreach, differentiable=differentiable))

    def _init_state(self, group, d, state):
        state["square_avg"] = zeros_state(d)
        state["acc_delta"] = zeros_state(d)

    def _update(self, group, param, grad, state, step):
        rho, eps, wd = group["rho"], group["eps"], group["weight_decay"]
        if wd != 0:
            grad = grad.add(param, alpha=wd)
        square_avg, acc_delta = state["square_avg"]._data, state["acc_delta"]._data
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.add_(delta, alpha=-group["lr"])


class Adagrad(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None):
        check_range("Adagrad", lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                    initial_accumulator_value=initial_accumulator_value, eps=eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable, fused=fused))
        for group in self.param_groups:      # PyTorch creates Adagrad's state up front
            for p in group["params"]:
                state = self.state[p]
                state["step"] = _wrap(torch.tensor(0.0, dtype=torch.float32))
                self._init_state(group, p._data, state)

    def _init_state(self, group, d, state):
        state["sum"] = _wrap(torch.full_like(d, self.defaults["initial_accumulator_value"],
                                             memory_format=torch.preserve_format))

    def _update(self, group, param, grad, state, step):
        wd = group["weight_decay"]
        if wd != 0:
            grad = grad.add(param, alpha=wd)
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        s = state["sum"]._data
        s.addcmul_(grad, grad, value=1)
        param.addcdiv_(grad, s.sqrt().add_(group["eps"]), value=-clr)


class RMSprop(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False, capturable: bool = False, foreach=None,
                 maximize: bool = False, differentiable: bool = False):
        check_range("RMSprop", lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                                      weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _init_state(self, group, d, state):
        state["square_avg"] = zeros_state(d)
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_state(d)
        if group["centered"]:
            state["grad_avg"] = zeros_state(d)

    def _update(self, group, param, grad, state, step):
        alpha, wd, mom = group["alpha"], group["weight_decay"], group["momentum"]
        if wd != 0:
            grad = grad.add(param, alpha=wd)
        square_avg = state["square_avg"]._data
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            if "grad_avg" not in state:          # centered turned on after the first step
                state["grad_avg"] = zeros_state(param)
            grad_avg = state["grad_avg"]._data
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg.add_(group["eps"])
        if mom > 0:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = zeros_state(param)
            buf = state["momentum_buffer"]._data
            buf.mul_(mom).addcdiv_(grad, avg)
            param.add_(buf, alpha=-group["lr"])
        else:
            param.addcdiv_(grad, avg, value=-group["lr"])
