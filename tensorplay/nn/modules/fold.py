"""``Unfold`` and ``Fold``: sliding local blocks of a batched image (im2col) and their sum back into an
image (col2im), with ``torch.nn.Unfold`` / ``torch.nn.Fold``'s signatures and defaults.  They have no
parameters or buffers (an empty ``state_dict``); each forward is one op of the table (``im2col`` /
``col2im``), so results equal PyTorch's bit for bit."""
from __future__ import annotations

from .. import functional as F
from .module import Module

__all__ = ["Unfold", "Fold"]


class Unfold(Module):
    """``(N, C, H, W) -> (N, C * prod(kernel_size), L)``: every ``kernel_size`` block as a column."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, input):
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
                f"stride={self.stride}")


class Fold(Module):
    """``(N, C * prod(kernel_size), L) -> (N, C, *output_size)``: columns summed back into an image."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size, self.kernel_size = output_size, kernel_size
        self.dilation, self.padding, self.stride = dilation, padding, stride

    def forward(self, input):
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")
