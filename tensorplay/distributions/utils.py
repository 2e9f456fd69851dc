"""Helpers shared by the distributions: parameter broadcasting, probability/logit conversions, lazily
computed parameters.

* ``broadcast_all(*values)`` turns Python numbers into tensors of the tensors' dtype (the default
  dtype when there is none) and expands everything to the common broadcast shape (views, no copy);
* ``logits_to_probs`` / ``probs_to_logits`` convert with PyTorch's conventions: ``is_binary`` uses the
  sigmoid and ``log(p) - log1p(-p)``, otherwise the softmax over the last dim and ``log(p)``, with
  probabilities clamped into ``[eps, 1 - eps]`` first so that 0 and 1 give finite logits;
* ``lazy_property`` computes a parameter (``probs`` from ``logits``...) on first use and caches it on
  the instance, so a distribution stores only what it was given.
"""
from __future__ import annotations

import numbers

import torch

import tensorplay as tp

__all__ = ["broadcast_all", "logits_to_probs", "probs_to_logits", "clamp_probs", "lazy_property", "sum_rightmost",
           "as_tensor"]


def as_tensor(v, like=None):
    if isinstance(v, tp.Tensor):
        return v
    dtype = like.dtype if like is not None else torch.get_default_dtype()
    return tp.tensor(v, dtype=dtype, device=like.device if like is not None else None)


def broadcast_all(*values):
    tensors = [v for v in values if isinstance(v, tp.Tensor)]
    for v in values:
        if not isinstance(v, (tp.Tensor, numbers.Number)):
            raise ValueError(f"Input arguments must all be instances of numbers.Number or tp.Tensor, got "
                             f"{type(v).__name__}")
    like = tensors[0] if tensors else None
    if like is not None and not like.is_floating_point():
        like = None
    out = [as_tensor(v, like) for v in values]
    shape = torch.broadcast_shapes(*(v.shape for v in out))
    return tuple(v if tuple(v.shape) == tuple(shape) else v.expand(shape) for v in out)


def clamp_probs(probs):
    eps = torch.finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def logits_to_probs(logits, is_binary=False):
    return logits.sigmoid() if is_binary else logits.softmax(-1)


def probs_to_logits(probs, is_binary=False):
    p = clamp_probs(probs)
    return p.log() - (-p).log1p() if is_binary else p.log()


def sum_rightmost(value, dim: int):
    """Sum out the ``dim`` rightmost dims of ``value``."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:value.dim() - dim]) + (-1,)).sum(-1)


class lazy_property:
    """A parameter computed from the others on first use and cached on the instance (as an instance
    attribute, which then shadows this descriptor)."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __get__(self, inst, owner=None):
        if inst is None:
            return self
        with tp.enable_grad():
            value = self.fn(inst)
        setattr(inst, self.fn.__name__, value)
        return value
