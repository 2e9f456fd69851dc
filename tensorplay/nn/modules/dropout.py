"""Dropout layers.  In training mode each element is zeroed with probability ``p`` and the
survivors are scaled by ``1 / (1 - p)`` (inverted dropout, so eval mode is the identity and the
expected activation is unchanged).  ``Dropout1d/2d/3d`` zero whole channels instead of elements.
"""
from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]


class _DropoutNd(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not (0 <= p <= 1):
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        return F.dropout(input, self.p, self.training, self.inplace)


class Dropout1d(_DropoutNd):
    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(_DropoutNd):
    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        return F.dropout3d(input, self.p, self.training, self.inplace)
