"""``PixelShuffle`` and ``PixelUnshuffle``: rearrange (*, C·r², H, W) <-> (*, C, H·r, W·r) with the
op table's ``pixel_shuffle`` / ``pixel_unshuffle`` (bit-identical to PyTorch, gradients included)."""
from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle"]


class _Rearrange(Module):
    """A layer calling ``F.<_op>(input, factor)``, the factor kept under PyTorch's attribute name."""
    _op = _factor = ""

    def __init__(self, factor: int):
        super().__init__()
        setattr(self, self._factor, factor)

    def forward(self, input):
        return getattr(F, self._op)(input, getattr(self, self._factor))

    def extra_repr(self) -> str:
        return f"{self._factor}={getattr(self, self._factor)}"


class PixelShuffle(_Rearrange):
    _op, _factor = "pixel_shuffle", "upscale_factor"

    def __init__(self, upscale_factor: int):
        super().__init__(upscale_factor)


class PixelUnshuffle(_Rearrange):
    _op, _factor = "pixel_unshuffle", "downscale_factor"

    def __init__(self, downscale_factor: int):
        super().__init__(downscale_factor)
