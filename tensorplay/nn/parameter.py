"""``Parameter``: a tensor that a :class:`~tensorplay.nn.Module` owns as a learnable weight.

A ``Parameter`` is a ``tp.Tensor`` (a subclass) with two differences:

* assigning it as an attribute of a module registers it (``module.weight = Parameter(...)``), so it
  shows up in ``parameters()``, ``state_dict()`` and therefore in optimizers and checkpoints;
* it requires grad by default.

``Parameter(t)`` does not copy: it shares ``t``'s storage (and version counter) and is a fresh
graph leaf.  Results of ops on a parameter are plain tensors.  ``copy.deepcopy`` and pickling keep
the class and the ``requires_grad`` flag.
"""
from __future__ import annotations

import torch

from .._tensor import Tensor

__all__ = ["Parameter", "Buffer", "is_parameter"]


class Parameter(Tensor):
    """``Parameter(data=None, requires_grad=True)``: a module weight (see module docstring)."""

    def __init__(self, data=None, requires_grad: bool = True):
        if data is None:
            d = torch.empty(0)
        elif isinstance(data, Tensor):
            d = data._data
        elif isinstance(data, torch.Tensor):
            d = data.detach()
        else:
            raise TypeError(f"nn.Parameter: expected a Tensor as data, got {type(data).__name__}")
        self._data = d
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        return (_rebuild_parameter, (self._data.detach(), self.requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad=requires_grad)


class Buffer(Tensor):
    """Marks a tensor to be registered as a buffer when assigned to a module attribute
    (``self.running_mean = nn.Buffer(tp.zeros(3))``), like ``torch.nn.Buffer``.  The module stores
    a plain tensor sharing the storage; ``persistent=False`` keeps it out of ``state_dict``."""

    def __init__(self, data=None, *, persistent: bool = True):
        if data is None:
            d = torch.empty(0)
        elif isinstance(data, Tensor):
            d = data._data
        elif isinstance(data, torch.Tensor):
            d = data.detach()
        else:
            raise TypeError(f"nn.Buffer: expected a Tensor as data, got {type(data).__name__}")
        self._data = d
        self.persistent = persistent


def is_parameter(x) -> bool:
    return isinstance(x, Parameter)
