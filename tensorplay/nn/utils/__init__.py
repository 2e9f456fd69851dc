"""Training utilities on parameter collections: gradient clipping and flattening; ``rnn`` (the
submodule ``nn.utils.rnn``) packs and pads variable-length sequences for the recurrent layers.

``clip_grad_norm_(params, max_norm)`` rescales all gradients together so that their global norm
(the norm of the concatenation of every ``.grad``) is at most ``max_norm``, and returns that norm
before clipping; the scale factor is ``min(1, max_norm / (norm + 1e-6))``, as in PyTorch.
"""
from __future__ import annotations

import math

import torch

from ..._tensor import Tensor, _wrap
from ...autograd.grad_mode import no_grad
from . import rnn

__all__ = ["rnn", "clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]


def _params(parameters):
    if isinstance(parameters, Tensor):
        return [parameters]
    return list(parameters)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> Tensor:
    grads = [p._grad._data for p in _params(parameters) if p._grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return _wrap(torch.tensor(0.0))
    with no_grad():
        if norm_type == math.inf:
            norms = [g.detach().abs().max() for g in grads]
            total = norms[0] if len(norms) == 1 else torch.stack(norms).max()
        else:
            total = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.detach(), norm_type) for g in grads]), norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                               f"non-finite; set error_if_nonfinite=False to clip anyway")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.device, g.dtype))
    return _wrap(total)


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    with no_grad():
        for p in _params(parameters):
            if p._grad is not None:
                p._grad._data.clamp_(-clip_value, clip_value)


def parameters_to_vector(parameters) -> Tensor:
    from ... import ops
    return ops.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec, parameters) -> None:
    d = vec._data if isinstance(vec, Tensor) else vec
    i = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p._data = d[i:i + n].view_as(p._data).clone()
            i += n
