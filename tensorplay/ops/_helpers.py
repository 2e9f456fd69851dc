"""Small building blocks shared by derivative formulas (all written in tp ops, so they trace)."""
from __future__ import annotations

import numbers

import torch


def is_tensor(x) -> bool:
    from .._tensor import Tensor
    return isinstance(x, Tensor)


def sum_to(g, shape):
    """Reduce a broadcast gradient ``g`` back to ``shape`` (the adjoint of broadcasting)."""
    shape = tuple(shape)
    # (the rank first: comparing sizes of different ranks would record shape guards such as s0 != 7)
    if g.dim() == len(shape) and tuple(g.shape) == shape:
        return g
    lead = g.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    r = g.sum(dims, keepdim=True) if dims else g
    return r.reshape(shape) if tuple(r.shape) != shape else r


def unbroadcast(g, x):
    """Gradient for input ``x`` of a broadcasting op, or None if ``x`` is a Python number."""
    if g is None or not is_tensor(x) and not hasattr(x, "shape"):
        return None
    if isinstance(x, numbers.Number):
        return None
    return sum_to(g, x.shape)


def sgn(x):
    """``sign(x)`` for a real tensor; ``x / |x|`` (0 at 0) for a complex one: the derivative factor
    of ``|x|`` in PyTorch's convention for both (``torch.sgn``)."""
    if not x.is_complex():
        return x.sign()
    from .registry import OPS
    a = x.abs()
    zero = a == 0
    return OPS["where"].fn(zero, 0.0, x / OPS["where"].fn(zero, 1.0, a))


def scalar_dtype_tensor(v, like: torch.Tensor) -> torch.Tensor:
    """A Python number as a 0-d torch tensor that promotes like a Python scalar would."""
    if isinstance(v, bool):
        dt = torch.bool
    elif isinstance(v, int):
        dt = like.dtype if not like.dtype.is_floating_point and like.dtype != torch.bool else (
            like.dtype if like.dtype.is_floating_point else torch.int64)
        if like.dtype.is_floating_point:
            dt = like.dtype
    elif isinstance(v, float):
        dt = like.dtype if like.dtype.is_floating_point else torch.get_default_dtype()
    else:
        dt = like.dtype if like.dtype.is_complex else torch.complex64
    return torch.tensor(v, dtype=dt, device=like.device)


def normalize_dims(dim, ndim):
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return [d % max(ndim, 1) for d in dim]
