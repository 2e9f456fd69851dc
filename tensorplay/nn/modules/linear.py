"""Affine layers: ``Identity``, ``Linear`` (``y = x Wᵀ + b``), ``Bilinear``, ``Flatten``/``Unflatten``.

``Linear(in, out)`` holds ``weight`` of shape ``(out, in)`` and ``bias`` of shape ``(out,)``, both
initialised like PyTorch's: ``weight ~ kaiming_uniform(a=√5)`` (i.e. U(-1/√in, 1/√in)) and
``bias ~ U(-1/√in, 1/√in)``.  Inputs may have any number of leading dimensions.
"""
from __future__ import annotations

import math

import torch

from .. import functional as F
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["Identity", "Linear", "NonDynamicallyQuantizableLinear", "Bilinear", "LazyLinear", "Flatten",
           "Unflatten"]


def _empty(*shape, device=None, dtype=None):
    return torch.empty(shape, device=device, dtype=dtype)


class Identity(Module):
    """Returns its input unchanged (arguments are accepted and ignored)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(_empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(_empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class NonDynamicallyQuantizableLinear(Linear):
    """``MultiheadAttention.out_proj``'s class in PyTorch (a plain ``Linear``; the name marks it for
    PyTorch's quantisation tools).  Kept so that programs naming it (e.g. in ``safe_globals``) and
    module reprs match PyTorch's."""


class LazyLinear(Linear):
    """Not supported (no lazy shape inference); kept as a clear error for ported code."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("nn.LazyLinear is not supported in TensorPlay; give in_features explicitly")


class Bilinear(Module):
    """``y = x1ᵀ A x2 + b`` with ``weight`` of shape ``(out, in1, in2)``."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = Parameter(_empty(out_features, in1_features, in2_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(_empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class Flatten(Module):
    """Flatten dims ``start_dim..end_dim`` into one (default: all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        shape = list(input.shape)
        n = len(shape)
        if n == 0:
            return input.reshape(1)
        s, e = self.start_dim % n, self.end_dim % n
        if s > e:
            raise RuntimeError(f"nn.Flatten: start_dim ({self.start_dim}) cannot come after end_dim "
                               f"({self.end_dim}) for an input of shape {shape}")
        size = 1
        for d in shape[s:e + 1]:
            size *= d
        return input.reshape(shape[:s] + [size] + shape[e + 1:])

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim = dim
        self.unflattened_size = tuple(unflattened_size)

    def forward(self, input):
        shape = list(input.shape)
        d = self.dim % len(shape)
        return input.reshape(shape[:d] + list(self.unflattened_size) + shape[d + 1:])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
