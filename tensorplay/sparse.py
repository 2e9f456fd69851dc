"""``tp.sparse``: PyTorch's ``torch.sparse`` functions on COO tensors (tensorplay/ops/sparse.py).

``mm(sparse, dense)`` and ``addmm`` are the table's ``mm`` / ``addmm`` (ATen takes the sparse
operand; the dense operand's gradient is dense); ``sum`` reduces all dims to a dense scalar or the
given dims (a sparse result when sparse dims remain, dense otherwise, as PyTorch); ``softmax`` /
``log_softmax`` are taken over the stored values only (absent entries are -inf, i.e. weight 0), on
the dense form here: the result is dense with zeros at the absent entries.
"""
from __future__ import annotations

import torch

from . import ops as _ops
from ._tensor import Tensor, _wrap

__all__ = ["mm", "addmm", "sum", "softmax", "log_softmax"]


def mm(mat1, mat2):
    return _ops.mm(mat1, mat2)


def addmm(mat, mat1, mat2, *, beta=1.0, alpha=1.0):
    return _ops.addmm(mat, mat1, mat2, beta=beta, alpha=alpha)


def sum(input, dim=None, dtype=None):
    if not isinstance(input, Tensor) or not input.is_sparse:
        raise TypeError("tp.sparse.sum: expected a sparse COO tensor")
    if dim is None:
        return input.to_dense().sum(dtype=dtype)
    r = torch.sparse.sum(input._data.detach(), dim=dim, dtype=dtype)
    if input.requires_grad:
        raise NotImplementedError("tp.sparse.sum over some dims of a sparse tensor that requires grad: use "
                                  "input.to_dense().sum(dim)")
    return _wrap(r)


def _masked(fn, input, dim):
    if not isinstance(input, Tensor) or not input.is_sparse:
        raise TypeError(f"tp.sparse.{fn}: expected a sparse COO tensor")
    x = input.coalesce()
    mask = _wrap(torch.zeros(x.shape, dtype=torch.bool, device=x.device).index_put_(
        tuple(x._data.indices()), torch.tensor(True, device=x.device)))
    dense = x.to_dense().masked_fill(~mask, float("-inf"))
    out = getattr(_ops, fn)(dense, dim)
    return out.masked_fill(~mask, 0.0)


def softmax(input, dim, dtype=None):
    return _masked("softmax", input if dtype is None else input.to(dtype), dim)


def log_softmax(input, dim, dtype=None):
    return _masked("log_softmax", input if dtype is None else input.to(dtype), dim)
