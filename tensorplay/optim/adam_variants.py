"""Adamax, NAdam and RAdam: variants of Adam's moment estimates.

For a parameter θ with gradient g (negated under ``maximize``) at step t, with m ← β₁m + (1−β₁)g:

* ``Adamax`` (Kingma & Ba 2015, §7):  u ← max(β₂u, |g| + ε);  θ ← θ − lr/(1−β₁ᵗ) · m/u
  (state ``exp_avg`` m, ``exp_inf`` u; L2 ``weight_decay`` adds λθ to g);
* ``NAdam`` (Dozat 2016):  μₜ = β₁(1 − ½·0.96^(t·ψ)) with ``momentum_decay`` ψ, Πₜ = Π μ₁..μₜ
  (state ``mu_product``), v ← β₂v + (1−β₂)g², d = √(v/(1−β₂ᵗ)) + ε;
  θ ← θ − lr(1−μₜ)/(1−Πₜ) · g/d − lr·μₜ₊₁/(1−Πₜμₜ₊₁) · m/d;
* ``RAdam`` (Liu et al. 2020):  ρ∞ = 2/(1−β₂) − 1, ρₜ = ρ∞ − 2tβ₂ᵗ/(1−β₂ᵗ);  when ρₜ > 5 the
  adaptive step m̂·lr·√(1−β₂ᵗ)/(√v + ε)·r with the rectification r = √((ρₜ−4)(ρₜ−2)ρ∞ / ((ρ∞−4)(ρ∞−2)ρₜ)),
  else the plain momentum step m̂·lr (m̂ = m/(1−β₁ᵗ)).

NAdam and RAdam take ``decoupled_weight_decay`` (θ ← θ(1 − lr·λ) first, as AdamW) or L2 decay.
Defaults, state names and the order of the floating-point operations are PyTorch's single-tensor
ones, so parameters agree with ``torch.optim`` bit for bit on the same gradients.
"""
from __future__ import annotations

import torch

from .._tensor import _wrap
from .adam import update_moments
from ._elementwise import ElementwiseOptimizer, check_range, zeros_state

__all__ = ["Adamax", "NAdam", "RAdam"]


def _check_betas(who, betas):
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"tp.optim.{who}: invalid beta parameter at index {i}: {b}")
    return tuple(betas)


def _moments(state, d):
    state["exp_avg"] = zeros_state(d)
    state["exp_avg_sq"] = zeros_state(d)


def _decay(group, param, grad, decoupled):
    """Weight decay λ: decoupled (θ scaled by 1 − lr·λ) or L2 (λθ added to the gradient)."""
    wd = group["weight_decay"]
    if wd != 0:
        if decoupled:
            param.mul_(1 - group["lr"] * wd)
        else:
            grad = grad.add(param, alpha=wd)
    return grad


class Adamax(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 foreach=None, *, maximize: bool = False, differentiable: bool = False, capturable: bool = False):
        check_range("Adamax", lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=_check_betas("Adamax", betas), eps=eps, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize, differentiable=differentiable,
                                      capturable=capturable))

    def _init_state(self, group, d, state):
        state["exp_avg"] = zeros_state(d)
        state["exp_inf"] = zeros_state(d)

    def _update(self, group, param, grad, state, step):
        beta1, beta2 = group["betas"]
        grad = _decay(group, param, grad, False)
        exp_avg, exp_inf = state["exp_avg"]._data, state["exp_inf"]._data
        exp_avg.lerp_(grad, 1 - beta1)
        torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(group["eps"]), out=exp_inf)
        param.addcdiv_(exp_avg, exp_inf, value=-(group["lr"] / (1 - beta1 ** step)))


class NAdam(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *, foreach=None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False):
        check_range("NAdam", lr=lr, eps=eps, weight_decay=weight_decay, momentum_decay=momentum_decay)
        super().__init__(params, dict(lr=lr, betas=_check_betas("NAdam", betas), eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable))

    def _init_state(self, group, d, state):
        state["mu_product"] = _wrap(torch.tensor(1.0, dtype=torch.float32))
        _moments(state, d)

    def _update(self, group, param, grad, state, step):
        (beta1, beta2), lr, psi = group["betas"], group["lr"], group["momentum_decay"]
        bias_correction2 = 1 - beta2 ** step
        grad = _decay(group, param, grad, group["decoupled_weight_decay"])
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * psi)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * psi)))
        mu_product = state["mu_product"]._data
        mu_product.mul_(mu)
        exp_avg, exp_avg_sq = state["exp_avg"]._data, state["exp_avg_sq"]._data
        update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
        denom = exp_avg_sq.div(bias_correction2).sqrt().add_(group["eps"])
        prod = mu_product.item()
        param.addcdiv_(grad, denom, value=-lr * (1.0 - mu) / (1.0 - prod))
        param.addcdiv_(exp_avg, denom, value=(-lr * mu_next) / (1.0 - prod * mu_next))


class RAdam(ElementwiseOptimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 decoupled_weight_decay: bool = False, *, foreach=None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False):
        check_range("RAdam", lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=_check_betas("RAdam", betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable))

    def _init_state(self, group, d, state):
        _moments(state, d)

    def _update(self, group, param, grad, state, step):
        (beta1, beta2), lr = group["betas"], group["lr"]
        grad = _decay(group, param, grad, group["decoupled_weight_decay"])
        exp_avg, exp_avg_sq = state["exp_avg"]._data, state["exp_avg_sq"]._data
        update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        corrected = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = (bias_correction2 ** 0.5) / exp_avg_sq.sqrt().add_(group["eps"])
            param.add_(corrected * lr * adaptive * rect, alpha=-1.0)
        else:
            param.add_(corrected * lr, alpha=-1.0)
