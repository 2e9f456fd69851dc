"""Testing helpers: compare tp results with references (the error model of the chapter, §6.5 and §13.3).

``assert_close(actual, expected)`` accepts tp Tensors, torch tensors, numpy arrays and numbers;
NaNs compare equal to NaNs, infinities must match in sign, and the default tolerance comes from the
dtype (float64: rtol 1e-7; float32: rtol 1.3e-6; half types looser).  ``exact=True`` demands bit
equality — right for an eager op against the ATen kernel it calls.

``sum_tolerance(n, W, dtype, scale)`` is the tolerance of a W-way blocked sum of ``n`` terms of
root mean square ``scale`` against its exact value (Corollary 13.1, ``tensorplay/utils/error_model.py``):
use it where a test compares a sum with a float64 reference, instead of a hand-picked ``atol``.
"""
from __future__ import annotations

import numpy as np
import torch

from ._tensor import Tensor
from .utils.error_model import sum_tolerance

__all__ = ["assert_close", "to_torch", "record_ops", "sum_tolerance"]


def to_torch(x):
    if isinstance(x, Tensor):
        return x._data.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        if hasattr(x, "_fields"):  # named tuple (values, indices)
            return type(x)(*(to_torch(v) for v in x))
        return type(x)(to_torch(v) for v in x)
    return x


def assert_close(actual, expected, *, rtol=None, atol=None, exact=False, check_dtype=True, msg=""):
    a, e = to_torch(actual), to_torch(expected)
    if isinstance(a, (list, tuple)):
        assert isinstance(e, (list, tuple)) and len(a) == len(e), f"{msg}: structure mismatch {type(a)} vs {type(e)}"
        for i, (x, y) in enumerate(zip(a, e)):
            assert_close(x, y, rtol=rtol, atol=atol, exact=exact, check_dtype=check_dtype, msg=f"{msg}[{i}]")
        return
    if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
        if isinstance(a, torch.Tensor):
            a = a.item()
        if isinstance(e, torch.Tensor):
            e = e.item()
        if exact:
            assert a == e or (a != a and e != e), f"{msg}: {a!r} != {e!r}"
        else:
            torch.testing.assert_close(torch.tensor(a), torch.tensor(e), rtol=rtol, atol=atol, equal_nan=True,
                                       check_dtype=False, msg=lambda m: f"{msg}: {m}")
        return
    assert a.shape == e.shape, f"{msg}: shape {list(a.shape)} != {list(e.shape)}"
    if check_dtype:
        assert a.dtype == e.dtype, f"{msg}: dtype {a.dtype} != {e.dtype}"
    if exact:
        a2, e2 = a.cpu(), e.cpu().to(a.dtype)
        if a2.dtype.is_floating_point or a2.dtype.is_complex:
            same = (a2 == e2) | (torch.isnan(a2) & torch.isnan(e2))
        else:
            same = a2 == e2
        if not bool(same.all()):
            bad = (~same).nonzero()[0].tolist()
            raise AssertionError(f"{msg}: not bit-identical at {bad}: {a2[tuple(bad)].item()} vs {e2[tuple(bad)].item()}")
        return
    torch.testing.assert_close(a, e.to(a.dtype) if not check_dtype else e, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{msg}: {m}")


class record_ops:
    """Context manager collecting ``(op, args, outputs)`` of every eager op call."""

    def __enter__(self):
        from .ops import registry
        self.calls = []
        self._f = lambda op, args, outs: self.calls.append((op, args, outs))
        registry.observers.append(self._f)
        return self.calls

    def __exit__(self, *exc):
        from .ops import registry
        registry.observers.remove(self._f)
        return False
