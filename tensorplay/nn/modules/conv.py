"""Convolution layers: ``Conv1d``, ``Conv2d``, ``Conv3d``, ``ConvTranspose1d``, ``ConvTranspose2d``.

``ConvNd(C_in, C_out, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
padding_mode='zeros')`` holds ``weight`` of shape ``(C_out, C_in / groups, *kernel_size)`` (transposed
convolutions: ``(C_in, C_out / groups, *kernel_size)``) and ``bias`` of shape ``(C_out,)``, initialised
like PyTorch's (kaiming-uniform with ``a=√5``; bias U(-1/√fan_in, 1/√fan_in)).  ``padding`` may be an
int, a tuple, ``'valid'`` (no padding) or ``'same'`` (output size = input size, stride 1 only).
``padding_mode`` other than ``'zeros'`` (``'reflect'``, ``'replicate'``, ``'circular'``) pads the
input explicitly with ``F.pad`` first.
"""
from __future__ import annotations

import math

import torch

from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d"]


def _ntuple(v, n, name):
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
        return tuple(v)
    return (v,) * n


class _ConvNd(Module):
    _n = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", output_padding=0, device=None, dtype=None):
        super().__init__()
        n = self._n
        name = type(self).__name__
        if groups <= 0:
            raise ValueError(f"{name}: groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError(f"{name}: in_channels ({in_channels}) must be divisible by groups ({groups})")
        if out_channels % groups != 0:
            raise ValueError(f"{name}: out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"{name}: padding_mode must be one of 'zeros', 'reflect', 'replicate', 'circular', "
                             f"got {padding_mode!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, n, "kernel_size")
        self.stride = _ntuple(stride, n, "stride")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: invalid padding string {padding!r}, should be one of 'valid', 'same'")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _ntuple(padding, n, "padding")
        self.dilation = _ntuple(dilation, n, "dilation")
        self.output_padding = _ntuple(output_padding, n, "output_padding")
        self.transposed = self._transposed
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad wants (last dim left, last dim right, previous dim left, ...)
        if isinstance(self.padding, str):
            pads = []
            if self.padding == "same":
                for d, k in zip(reversed(self.dilation), reversed(self.kernel_size)):
                    total = d * (k - 1)
                    left = total // 2
                    pads += [left, total - left]
            else:
                pads = [0, 0] * n
        else:
            pads = []
            for p in reversed(self.padding):
                pads += [p, p]
        self._reversed_padding_repeated_twice = pads
        if self._transposed:
            wshape = (in_channels, out_channels // groups) + self.kernel_size
        else:
            wshape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(torch.empty(wshape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(torch.empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self):
        n = self._n
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * n:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * n:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s

    def _conv_forward(self, input, weight, bias):
        conv = getattr(F, f"conv{self._n}d")
        if self.padding_mode != "zeros":
            mode = self.padding_mode
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=mode)
            return conv(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)


class Conv1d(_ConvNd):
    """1-D convolution over ``(N, C_in, L)`` (or unbatched ``(C_in, L)``) inputs."""
    _n = 1


class Conv2d(_ConvNd):
    """2-D convolution over ``(N, C_in, H, W)`` (or unbatched ``(C_in, H, W)``) inputs."""
    _n = 2


class Conv3d(_ConvNd):
    """3-D convolution over ``(N, C_in, D, H, W)`` inputs."""
    _n = 3


class _ConvTransposeNd(_ConvNd):
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        if isinstance(padding, str):
            raise ValueError(f"{type(self).__name__}: string padding is not supported")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding, device, dtype)

    def forward(self, input):
        conv = getattr(F, f"conv_transpose{self._n}d")
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups,
                    self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    _n = 1


class ConvTranspose2d(_ConvTransposeNd):
    _n = 2
