"""Activation modules: thin wrappers that call ``tp.nn.functional`` (or a tensor method) at
forward time.  They hold no parameters (except ``PReLU``); their ``repr`` matches PyTorch's.
"""
from __future__ import annotations

import torch

from .. import functional as F
from ..parameter import Parameter
from .module import Module

__all__ = ["ReLU", "ReLU6", "LeakyReLU", "ELU", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Softplus", "Softmax",
           "LogSoftmax", "Hardtanh", "PReLU", "Softsign", "Tanhshrink"]


def _inplace_str(inplace, lead=""):
    return f"{lead}inplace=True" if inplace else ""


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=True) if self.inplace else F.relu(input)

    def extra_repr(self):
        return _inplace_str(self.inplace)


class ReLU6(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu6(input, inplace=True) if self.inplace else F.relu6(input)

    def extra_repr(self):
        return _inplace_str(self.inplace)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        if self.inplace:
            return F.leaky_relu(input, self.negative_slope, inplace=True)
        return F.leaky_relu(input, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + _inplace_str(self.inplace, ", ")


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        if self.inplace:
            return F.elu(input, self.alpha, inplace=True)
        return F.elu(input, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}" + _inplace_str(self.inplace, ", ")


class GELU(Module):
    """GELU(x) = x Φ(x); ``approximate='tanh'`` uses the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"nn.GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=True) if self.inplace else F.silu(input)

    def extra_repr(self):
        return _inplace_str(self.inplace)


class Mish(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.mish(input, inplace=True) if self.inplace else F.mish(input)

    def extra_repr(self):
        return _inplace_str(self.inplace)


class Tanh(Module):
    def forward(self, input):
        return input.tanh()


class Sigmoid(Module):
    def forward(self, input):
        return input.sigmoid()


class Softsign(Module):
    def forward(self, input):
        return F.softsign(input)


class Tanhshrink(Module):
    def forward(self, input):
        return input - input.tanh()


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input):
        return input.clamp(self.min_val, self.max_val)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + _inplace_str(self.inplace, ", ")


class PReLU(Module):
    """``max(0, x) + a·min(0, x)`` with a learnable slope ``a`` (one, or one per channel)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(torch.full((num_parameters,), float(init), device=device, dtype=dtype))

    def reset_parameters(self):
        from .. import init as _init
        _init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


def _implicit_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim if self.dim is not None else _implicit_dim(input.dim())
        return F.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Module):
    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim if self.dim is not None else _implicit_dim(input.dim())
        return F.log_softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class _Inplace(Module):
    """An activation with only an ``inplace`` flag: ``fn(input, inplace=...)``."""
    _fn = None

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self):
        return _inplace_str(self.inplace)


class SELU(_Inplace):
    _fn = staticmethod(F.selu)


class Hardswish(_Inplace):
    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_Inplace):
    _fn = staticmethod(F.hardsigmoid)


class CELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + _inplace_str(self.inplace, ", ")


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + _inplace_str(self.inplace, ", ")


class Hardshrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.hardshrink(input, self.lambd)

    def extra_repr(self):
        return f"{self.lambd}"


class Softshrink(Hardshrink):
    def forward(self, input):
        return F.softshrink(input, self.lambd)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class RReLU(Module):
    """Randomized leaky ReLU: slopes drawn from U(lower, upper) in training, their mean in eval."""

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + _inplace_str(self.inplace, ", ")


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class Softmin(Softmax):
    def forward(self, input):
        dim = self.dim if self.dim is not None else _implicit_dim(input.dim())
        return F.softmin(input, dim)


class Softmax2d(Module):
    """Softmax over the channel dim of a (N, C, H, W) or (C, H, W) input."""

    def forward(self, input):
        if input.dim() not in (3, 4):
            raise ValueError(f"tp.Softmax2d: expected a 3-d or 4-d input, got {input.dim()}-d")
        return F.softmax(input, -3)


__all__ += ["SELU", "CELU", "Threshold", "Hardshrink", "Softshrink", "GLU", "RReLU", "LogSigmoid", "Softmin",
            "Hardswish", "Hardsigmoid", "Softmax2d"]

# PyTorch defines MultiheadAttention in this module; programs name it here (torch.nn.modules.activation.X)
from .transformer import MultiheadAttention  # noqa: E402,F401
