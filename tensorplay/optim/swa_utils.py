"""Stochastic weight averaging (Izmailov et al. 2018) and exponential moving averages of weights.

* ``AveragedModel(model)`` keeps a deep copy of ``model`` whose parameters (and, with
  ``use_buffers``, buffers) ``update_parameters(model)`` averages: the first call copies, later calls
  apply ``avg_fn(avg, current, n_averaged)`` per tensor or ``multi_avg_fn(avgs, currents, n)`` on the
  lists (default: the running mean avg + (current − avg)/(n + 1), as a lerp on GPUs, as PyTorch
  chooses); ``n_averaged`` is a buffer, so it is in ``state_dict``.  Without ``use_buffers`` the
  buffers are copied from ``model``.
* ``get_swa_avg_fn``/``get_swa_multi_avg_fn`` (running mean), ``get_ema_avg_fn``/``get_ema_multi_avg_fn``
  (exponential moving average with ``decay``).
* ``update_bn(loader, model)``: recompute every batch norm's running statistics by one pass over
  ``loader`` with cumulative averaging (``momentum=None``), then restore the momenta and mode.
* ``SWALR(optimizer, swa_lr, anneal_epochs, anneal_strategy)``: anneal each group's rate from its
  current value to ``swa_lr`` over ``anneal_epochs`` epochs (cosine or linear), then hold it.

The arithmetic is PyTorch's (the same lerps on CPU, the same rate recurrence), so averaged weights
and rates equal ``torch.optim.swa_utils``'s.
"""
from __future__ import annotations

import copy
import itertools
import math

import torch

from .._tensor import _wrap
from ..autograd.grad_mode import no_grad
from ..nn.modules.module import Module
from ..nn.modules.normalization import _BatchNorm
from .lr_scheduler import LRScheduler, _per_group

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn", "get_ema_avg_fn",
           "get_swa_avg_fn"]


def _check_decay(decay):
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"swa_utils: invalid decay value {decay}; it must be in [0, 1]")


def get_ema_multi_avg_fn(decay=0.999):
    _check_decay(decay)

    def ema_update(ema_params, current_params, _):
        with no_grad():
            for e, c in zip(ema_params, current_params):
                if e.is_floating_point() or e.is_complex():
                    e._data.lerp_(c._data, 1 - decay)
                else:
                    e._data.copy_(e._data * decay + c._data * (1 - decay))
    return ema_update


def get_swa_multi_avg_fn():
    def swa_update(averaged_params, current_params, num_averaged):
        n = int(num_averaged.item()) if hasattr(num_averaged, "item") else num_averaged
        with no_grad():
            for a, c in zip(averaged_params, current_params):
                if a.is_floating_point() or a.is_complex():
                    a._data.lerp_(c._data, 1 / (n + 1))
                else:
                    a._data.add_(c._data - a._data, alpha=1.0 / (n + 1))
    return swa_update


def get_ema_avg_fn(decay=0.999):
    _check_decay(decay)

    def ema_update(ema_param, current_param, num_averaged):
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param
    return ema_update


def get_swa_avg_fn():
    def swa_update(averaged_param, current_param, num_averaged):
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)
    return swa_update


class AveragedModel(Module):
    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers: bool = False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise ValueError("AveragedModel: give only one of avg_fn and multi_avg_fn")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", _wrap(torch.tensor(0, dtype=torch.long, device=device)))
        self.avg_fn, self.multi_avg_fn, self.use_buffers = avg_fn, multi_avg_fn, use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _tensors(self, model):
        if self.use_buffers:
            return list(itertools.chain(model.parameters(), model.buffers()))
        return list(model.parameters())

    def update_parameters(self, model) -> None:
        ours = self._tensors(self.module)
        theirs = [p.detach().to(a.device) for a, p in zip(ours, self._tensors(model))]
        n = self.n_averaged
        with no_grad():
            if int(n.item()) == 0:
                for a, p in zip(ours, theirs):
                    a._data.copy_(p._data)
            elif self.multi_avg_fn is not None:
                self.multi_avg_fn(ours, theirs, n)
            elif self.avg_fn is None and all(a.device.type == "cuda" for a in ours):
                get_swa_multi_avg_fn()(ours, theirs, n)      # PyTorch's choice where foreach kernels exist
            else:
                avg_fn = self.avg_fn or get_swa_avg_fn()
                for a, p in zip(ours, theirs):
                    a._data.copy_(avg_fn(a.detach(), p, n)._data)
            if not self.use_buffers:
                for b, mb in zip(self.module.buffers(), model.buffers()):
                    b._data.copy_(mb._data.to(b.device))
            n._data += 1


def update_bn(loader, model, device=None) -> None:
    momenta = {}
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.reset_running_stats()
            momenta[m] = m.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for m in momenta:
        m.momentum = None
    with no_grad():
        for inp in loader:
            if isinstance(inp, (list, tuple)):
                inp = inp[0]
            if device is not None:
                inp = inp.to(device)
            model(inp)
    for m, mom in momenta.items():
        m.momentum = mom
    model.train(was_training)


class SWALR(LRScheduler):
    def __init__(self, optimizer, swa_lr, anneal_epochs: int = 10, anneal_strategy: str = "cos",
                 last_epoch: int = -1):
        for lr, g in zip(_per_group("swa_lr", optimizer, swa_lr), optimizer.param_groups):
            g["swa_lr"] = lr
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"SWALR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"SWALR: anneal_epochs must be an integer >= 0, got {anneal_epochs}")
        self._anneal_strategy, self.anneal_epochs = anneal_strategy, anneal_epochs
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t):
        return (1 - math.cos(math.pi * t)) / 2 if self._anneal_strategy == "cos" else t

    def get_lr(self):
        # the rate the annealing started from is recovered from the current one (so other changes
        # to group["lr"] compose), then moved to the next point of the schedule
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_alpha = self._anneal(max(0, min(1, (step - 1) / max(1, self.anneal_epochs))))
        starts = [g["swa_lr"] if prev_alpha == 1 else (g["lr"] - prev_alpha * g["swa_lr"]) / (1 - prev_alpha)
                  for g in self.optimizer.param_groups]
        alpha = self._anneal(max(0, min(1, step / max(1, self.anneal_epochs))))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(self.optimizer.param_groups, starts)]
