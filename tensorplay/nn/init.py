"""Weight initialisation (``tp.nn.init``): fill a tensor in place, without recording autograd.

Each function writes into the tensor's storage under ``no_grad`` and returns the tensor.  The random
draws come from the global generator (``tp.manual_seed``) in the same order and with the same
bounds as PyTorch's initialisers, so a layer built after ``tp.manual_seed(s)`` starts from the same
weights as its PyTorch twin built after ``torch.manual_seed(s)``.

Fan computation (``_calculate_fan_in_and_fan_out``): for a weight of shape
``(out, in, *kernel)``, ``fan_in = in * prod(kernel)`` and ``fan_out = out * prod(kernel)``.

* ``xavier_uniform_``: U(-a, a), ``a = gain * sqrt(6 / (fan_in + fan_out))`` (Glorot & Bengio 2010);
* ``kaiming_uniform_``: U(-b, b), ``b = gain * sqrt(3 / fan)`` with ``gain = calculate_gain(nonlinearity, a)``
  (He et al. 2015), ``fan`` = ``fan_in`` (mode ``'fan_in'``) or ``fan_out``;
* ``trunc_normal_``: N(mean, std) restricted to [a, b], drawn by rejection as PyTorch does;
* ``sparse_``: N(0, std), then ``ceil(sparsity * rows)`` entries of each column set to zero.

The random initialisers take ``generator=`` (a ``tp.Generator`` or ``torch.Generator``) and then draw
from it as PyTorch's do; ``sparse_`` picks its zeros from the global generator even then, as
PyTorch's does.
"""
from __future__ import annotations

import math
import warnings

import torch

from .._tensor import Tensor
from ..autograd.grad_mode import no_grad

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
           "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
           "sparse_", "_calculate_fan_in_and_fan_out"]


def _storage(t) -> torch.Tensor:
    if isinstance(t, Tensor):
        return t._data
    if isinstance(t, torch.Tensor):
        return t
    raise TypeError(f"nn.init: expected a Tensor, got {type(t).__name__}")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for a nonlinearity: the factor that keeps activation variance stable."""
    linear_fns = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d")
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions "
                         f"(got shape {list(shape)})")
    receptive = 1
    for s in shape[2:]:
        receptive *= s
    return shape[1] * receptive, shape[0] * receptive


def _fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    with no_grad():
        _storage(tensor).uniform_(a, b, generator=generator)
    return tensor


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    with no_grad():
        _storage(tensor).normal_(mean, std, generator=generator)
    return tensor


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator=None):
    """N(mean, std²) conditioned on [a, b], by rejection as PyTorch draws it (same calls, same
    order, so the same numbers under the same seed): when the interval holds more than 30% of the
    mass, N(mean, std) draws redrawn where they fall outside [a, b]; otherwise U(a, b) candidates
    accepted with probability pdf(x) / pdf(mode) (log u < log pdf ratio), the rejected ones redrawn."""
    d = _storage(tensor)
    if d.is_meta:
        return tensor

    def phi(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    with no_grad():
        if phi((b - mean) / std) - phi((a - mean) / std) > 0.3:
            lo, hi = d.new_tensor(a, device="cpu").item(), d.new_tensor(b, device="cpu").item()
            result = d.normal_(mean, std, generator=generator)
            while True:
                mask = (result < lo) | (result > hi)
                if not mask.any():
                    break
                result = torch.where(mask, torch.empty_like(result).normal_(mean, std, generator=generator), result)
            if d is not result:
                d.copy_(result)
            return tensor
        log_peak = -0.5 * ((max(a, min(mean, b)) - mean) / std) ** 2
        cand, accept = torch.empty_like(d), torch.empty_like(d)

        def pending_of(x):   # still to draw: log u > log(pdf(x) / pdf(mode))
            x.sub_(mean).div_(std).pow_(2).mul_(-0.5).sub_(log_peak)
            return accept.uniform_(generator=generator).log_().gt(x)

        d.uniform_(a, b, generator=generator)
        cand.copy_(d)
        pending = pending_of(cand)
        if pending.any():
            result = d
            while True:
                cand.uniform_(a, b, generator=generator)
                result = torch.where(pending, cand, result)
                pending = torch.where(pending, pending_of(cand), pending)
                if not pending.any():
                    break
            d.copy_(result)
    return tensor


def constant_(tensor, val: float):
    with no_grad():
        _storage(tensor).fill_(val)
    return tensor


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    with no_grad():
        _storage(tensor).zero_()
    return tensor


def eye_(tensor):
    d = _storage(tensor)
    if d.dim() != 2:
        raise ValueError(f"nn.init.eye_: only 2-D tensors are supported, got shape {list(d.shape)}")
    with no_grad():
        d.copy_(torch.eye(d.shape[0], d.shape[1], dtype=d.dtype, device=d.device))
    return tensor


def dirac_(tensor, groups: int = 1):
    """Identity kernel for convolutions: each output channel passes one input channel through."""
    d = _storage(tensor)
    if d.dim() not in (3, 4, 5):
        raise ValueError(f"nn.init.dirac_: only 3-, 4- or 5-D tensors are supported, got {list(d.shape)}")
    out_per_group = d.shape[0] // groups
    n = min(out_per_group, d.shape[1])
    with no_grad():
        d.zero_()
        for g in range(groups):
            for i in range(n):
                idx = (g * out_per_group + i, i) + tuple(s // 2 for s in d.shape[2:])
                d[idx] = 1
    return tensor


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None):
    if 0 in tuple(tensor.shape):
        return tensor
    fan = _fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator=None):
    if 0 in tuple(tensor.shape):
        return tensor
    fan = _fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain: float = 1.0, generator=None):
    """A (semi-)orthogonal matrix from the QR decomposition of a Gaussian matrix (Saxe et al. 2013)."""
    d = _storage(tensor)
    if d.dim() < 2:
        raise ValueError("nn.init.orthogonal_: only tensors with 2 or more dimensions are supported")
    if d.numel() == 0:
        return tensor
    rows = d.shape[0]
    cols = d.numel() // rows
    flat = torch.empty(rows, cols, dtype=d.dtype, device=d.device).normal_(0, 1, generator=generator)
    if rows < cols:
        flat = flat.t()
    q, r = torch.linalg.qr(flat)
    q = q * torch.diag(r, 0).sign()
    if rows < cols:
        q = q.t()
    with no_grad():
        d.view_as(q).copy_(q) if d.is_contiguous() else d.copy_(q.reshape(d.shape))
        d.mul_(gain)
    return tensor


def sparse_(tensor, sparsity: float, std: float = 0.01, generator=None):
    """A sparse 2-D matrix (Martens 2010): N(0, std) values, then in each column the rows of a
    random permutation's first ``ceil(sparsity * rows)`` entries set to zero."""
    d = _storage(tensor)
    if d.dim() != 2:
        raise ValueError("nn.init.sparse_: only tensors with 2 dimensions are supported")
    rows, cols = d.shape
    num_zeros = math.ceil(sparsity * rows)
    with no_grad():
        d.normal_(0, std, generator=generator)
        for col in range(cols):
            d[torch.randperm(rows)[:num_zeros], col] = 0
    return tensor
