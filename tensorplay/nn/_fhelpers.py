"""Helpers of the functional API (``tp.nn.functional`` and its extension module): op lookup at
call time, argument type checks, and PyTorch's ``reduction`` argument (including the legacy
``size_average`` / ``reduce`` flags).  Shared so that the functional modules agree on messages."""
from __future__ import annotations

import warnings

from .._tensor import Tensor
from ..ops.registry import OPS


def _op(name):
    try:
        return OPS[name].fn
    except KeyError:
        raise NotImplementedError(f"tp.nn.functional: the op {name!r} is not in the op table") from None


def _check_tensor(x, fn, arg="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"tp.{fn}: argument '{arg}' must be a tp.Tensor, got {type(x).__name__}")


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = ("mean" if size_average else "sum") if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{ret}' instead.",
                  stacklevel=3)
    return ret


def _check_reduction(reduction, fn, extra=()):
    if reduction not in ("none", "mean", "sum") + tuple(extra):
        raise ValueError(f"tp.{fn}: {reduction!r} is not a valid value for reduction")
