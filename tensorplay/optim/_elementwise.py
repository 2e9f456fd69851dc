"""The shared loop of the element-wise optimisers (``Adadelta``, ``Adagrad``, ``RMSprop``, ``Adamax``,
``NAdam``, ``RAdam``): for every parameter of every group that has a gradient, create its state on the
first step, count the step, negate the gradient under ``maximize`` and hand the raw ATen tensors
to the subclass's ``_update``.

Guarantees: the step runs under ``no_grad`` and updates parameters in place; a sparse gradient is
refused with an error naming the optimiser; ``state["step"]`` is a float32 0-d tensor as in PyTorch.
"""
from __future__ import annotations

import torch

from .._tensor import _wrap
from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer, _state_step

__all__ = ["ElementwiseOptimizer", "zeros_state", "check_range"]


def zeros_state(d):
    """A zero tensor shaped, typed and laid out like the parameter data ``d``, wrapped."""
    return _wrap(torch.zeros_like(d, memory_format=torch.preserve_format))


def check_range(who, **values):
    """Raise ``ValueError`` naming the optimiser for the first negative hyper-parameter."""
    for name, v in values.items():
        if not 0.0 <= v:
            raise ValueError(f"tp.optim.{who}: invalid {name} value: {v}")


class ElementwiseOptimizer(Optimizer):
    def _init_state(self, group, d, state):
        """Create the per-parameter state tensors (other than ``step``) for parameter data ``d``."""
        raise NotImplementedError

    def _update(self, group, param, grad, state, step):
        """Update ``param`` (ATen tensor) in place from ``grad`` at step number ``step`` (a float)."""
        raise NotImplementedError

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p._grad is None:
                        continue
                    grad = p._grad._data
                    if grad.is_sparse:
                        raise RuntimeError(f"tp.optim.{type(self).__name__} does not support sparse gradients")
                    state = self.state[p]
                    if len(state) == 0:
                        state["step"] = _wrap(torch.tensor(0.0, dtype=torch.float32))
                        self._init_state(group, p._data, state)
                    step = _state_step(state, p._data.device)
                    if group["maximize"]:
                        grad = -grad
                    self._update(group, p._data, grad, state, step)
        return loss
