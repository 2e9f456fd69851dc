"""Padding layers over ``F.pad``: ``ConstantPad{1,2,3}d`` (a fill value), ``ZeroPad{1,2,3}d``,
``ReflectionPad{1,2,3}d`` (mirror without repeating the edge), ``ReplicationPad{1,2,3}d`` (repeat the
edge) and ``CircularPad{1,2,3}d`` (wrap around).

``padding`` is an int (the same on every side of the last N dims) or a 2N-tuple ``(left, right, top,
bottom, front, back)`` from the last dim backwards, as in PyTorch; it is stored as a tuple.  Inputs
have N+1 (unbatched) or N+2 dims; others raise ``ValueError`` naming the layer.  Results and
gradients are those of ``F.pad`` (the op table's ``pad``): equal to PyTorch's bit for bit.
"""
from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = [f"{kind}Pad{n}d" for kind in ("Constant", "Zero", "Reflection", "Replication", "Circular")
           for n in (1, 2, 3)]


def _padding(padding, n, who):
    if isinstance(padding, int):
        return (padding,) * (2 * n)
    padding = tuple(padding)
    if len(padding) != 2 * n or not all(isinstance(p, int) for p in padding):
        raise ValueError(f"nn.{who}: padding must be an int or a tuple of {2 * n} ints, got {padding}")
    return padding


class _PadNd(Module):
    _n = 1
    _mode = "constant"

    def __init__(self, padding):
        super().__init__()
        self.padding = _padding(padding, self._n, type(self).__name__)

    def forward(self, input):
        if input.dim() not in (self._n + 1, self._n + 2):
            raise ValueError(f"nn.{type(self).__name__}: expected {self._n + 1}D or {self._n + 2}D input (got "
                             f"{input.dim()}D input)")
        return F.pad(input, self.padding, self._mode, getattr(self, "value", None))

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value: float):
        super().__init__(padding)
        self.value = value

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class _ZeroPadNd(_ConstantPadNd):
    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


def _make(base, kind, mode, n):
    cls = type(f"{kind}Pad{n}d", (base,), {"_n": n, "_mode": mode, "__module__": __name__,
                                           "__doc__": f"Pad the last {n} dims of the input ({mode} padding)."})
    return cls


_BASES = {"Constant": (_ConstantPadNd, "constant"), "Zero": (_ZeroPadNd, "constant"),
          "Reflection": (_PadNd, "reflect"), "Replication": (_PadNd, "replicate"), "Circular": (_PadNd, "circular")}
for _kind, (_base, _mode) in _BASES.items():
    for _n in (1, 2, 3):
        globals()[f"{_kind}Pad{_n}d"] = _make(_base, _kind, _mode, _n)
del _kind, _base, _mode, _n
