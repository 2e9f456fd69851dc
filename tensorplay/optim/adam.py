"""Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019).

For each parameter θ with gradient g (negated when ``maximize``), at step t::

    θ ← θ (1 − lr·λ)                      AdamW only: decoupled weight decay
    g ← g + λθ                            Adam only: L2 weight decay (λ = weight_decay)
    m ← β₁ m + (1 − β₁) g                 first moment   (``exp_avg``)
    v ← β₂ v + (1 − β₂) g²                second moment  (``exp_avg_sq``)
    v̂ ← max(v̂, v)                         amsgrad only   (``max_exp_avg_sq``)
    θ ← θ − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)     (v̂ in place of v with amsgrad)

State per parameter: ``step`` (float32 0-d tensor), ``exp_avg``, ``exp_avg_sq`` [, ``max_exp_avg_sq``],
as in PyTorch.  The operations and their order are PyTorch's, so results agree with
``torch.optim.Adam/AdamW`` to the last bit or so.  ``foreach`` (default: on when a group's parameters
are all on a GPU, as in PyTorch) takes each operation once over lists of tensors (``torch._foreach_*``).
"""
from __future__ import annotations

import math

import torch

from .._tensor import _wrap
from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer, _state_step

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, *, maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None, decoupled_weight_decay: bool | None = None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if decoupled_weight_decay is None:
            decoupled_weight_decay = self._decoupled
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable,
                        fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _init_state(self, p, state, amsgrad):
        d = p._data
        state["step"] = _wrap(torch.tensor(0.0, dtype=torch.float32))
        state["exp_avg"] = _wrap(torch.zeros_like(d, memory_format=torch.preserve_format))
        state["exp_avg_sq"] = _wrap(torch.zeros_like(d, memory_format=torch.preserve_format))
        if amsgrad:
            state["max_exp_avg_sq"] = _wrap(torch.zeros_like(d, memory_format=torch.preserve_format))

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for group in self.param_groups:
                lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
                wd, amsgrad, maximize = group["weight_decay"], group["amsgrad"], group["maximize"]
                decoupled = group.get("decoupled_weight_decay", self._decoupled)
                if _use_foreach(group):
                    self._foreach_step(group, decoupled)
                    continue
                for p in group["params"]:
                    if p._grad is None:
                        continue
                    param, grad = p._data, p._grad._data
                    state, step = self._param_state(p, amsgrad)
                    if maximize:
                        grad = -grad
                    if wd != 0:
                        if decoupled:
                            param.mul_(1 - lr * wd)
                        else:
                            grad = grad.add(param, alpha=wd)
                    exp_avg, exp_avg_sq = state["exp_avg"]._data, state["exp_avg_sq"]._data
                    update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
                    bias_correction1 = 1 - beta1 ** step
                    bias_correction2 = 1 - beta2 ** step
                    step_size = lr / bias_correction1
                    bias_correction2_sqrt = math.sqrt(bias_correction2)
                    if amsgrad:
                        mx = state["max_exp_avg_sq"]._data
                        torch.maximum(mx, exp_avg_sq, out=mx)
                        denom = (mx.sqrt() / bias_correction2_sqrt).add_(eps)
                    else:
                        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                    param.addcdiv_(exp_avg, denom, value=-step_size)
        return loss

    def _param_state(self, p, amsgrad):
        """(state, step) of a parameter with a gradient about to be stepped: its state created on the
        first step (and ``max_exp_avg_sq`` when amsgrad is turned on later), ``step`` incremented."""
        if p._grad._data.is_sparse:
            raise RuntimeError("Adam does not support sparse gradients")
        state = self.state[p]
        if len(state) == 0:
            self._init_state(p, state, amsgrad)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = _wrap(torch.zeros_like(p._data))
        return state, _state_step(state, p._data.device)

    def _foreach_step(self, group, decoupled):
        """The step of a group as torch's multi-tensor Adam takes it (``foreach``): each operation once
        over the lists of parameters of one device and dtype (one launch per chunk of tensors on a GPU,
        not one per tensor), in the single-tensor loop's order of operations."""
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        wd, amsgrad, maximize = group["weight_decay"], group["amsgrad"], group["maximize"]
        lists = {}
        for p in group["params"]:
            if p._grad is None:
                continue
            state, step = self._param_state(p, amsgrad)
            ls = lists.setdefault((p._data.device, p._data.dtype), ([], [], [], [], [], []))
            for lst, v in zip(ls, (p._data, p._grad._data, state["exp_avg"]._data, state["exp_avg_sq"]._data,
                                   state["max_exp_avg_sq"]._data if amsgrad else None, step)):
                lst.append(v)
        for params, grads, m, v, vmax, steps in lists.values():
            if maximize:
                grads = torch._foreach_neg(grads)
            if wd != 0:
                if decoupled:
                    torch._foreach_mul_(params, 1 - lr * wd)
                else:
                    grads = torch._foreach_add(grads, params, alpha=wd)
            torch._foreach_lerp_(m, grads, 1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
            step_size = [-(lr / (1 - beta1 ** t)) for t in steps]
            bc2_sqrt = [math.sqrt(1 - beta2 ** t) for t in steps]
            if amsgrad:
                torch._foreach_maximum_(vmax, v)
                denom = torch._foreach_sqrt(vmax)
            else:
                denom = torch._foreach_sqrt(v)
            torch._foreach_div_(denom, bc2_sqrt)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, m, denom, step_size)


def update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2):
    """Adam's moment estimates, in place: m ← β₁m + (1−β₁)g (as a lerp), v ← β₂v + (1−β₂)g²."""
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)


def _use_foreach(group) -> bool:
    """``foreach=True``, or ``None`` (PyTorch's default) with every parameter of the group on a GPU."""
    f = group.get("foreach")
    if f is not None:
        return bool(f)
    return all(p._data.is_cuda for p in group["params"]) and bool(group["params"])


class AdamW(Adam):
    """Adam with decoupled weight decay (default ``weight_decay=1e-2``)."""
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
