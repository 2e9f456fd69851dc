"""``tp.fft``: PyTorch's ``torch.fft`` API (signatures and defaults as in PyTorch) over the three
transform ops of the table (tensorplay/ops/fft.py).

Each function resizes its input to the requested signal sizes (``n`` / ``s``: zero padding or
truncation along each transformed dim, as table ops, so gradients flow) and makes one transform
call: c2c for complex input, r2c (two-sided) for real input of the complex transforms, r2c
one-sided for ``rfft*`` and ``ihfft``, c2r for ``irfft*`` and ``hfft`` (``hfft`` of x is the c2r
of conj(x)).  ``norm`` is ``"backward"`` (default: the inverse scales by 1/n), ``"ortho"``
(1/sqrt(n) both ways) or ``"forward"`` (the forward transform scales by 1/n).  Integer inputs are
promoted to the default float dtype.  Results equal PyTorch's bit for bit; derivatives follow
PyTorch's complex convention.  ``fftfreq``, ``rfftfreq`` are factories; ``fftshift``,
``ifftshift`` are rolls.  Bad arguments raise an exception naming ``tp.fft.<function>``.
"""
from __future__ import annotations

import numbers

import torch

from .ops.registry import OPS

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn",
           "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]


def _op(name):
    return OPS[name].fn


def _norm(norm, forward, fn):
    """The scaling enum of a transform: 0 none, 1 1/sqrt(n), 2 1/n."""
    if norm is None or norm == "backward":
        return 0 if forward else 2
    if norm == "ortho":
        return 1
    if norm == "forward":
        return 2 if forward else 0
    raise ValueError(f"tp.fft.{fn}: invalid normalization mode {norm!r} (backward, ortho or forward)")


def _float(x):
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    return x


def _resize(x, dims, sizes, fn):
    for d, n in zip(dims, sizes):
        if n is None or n == -1:
            continue
        if n < 1:
            raise ValueError(f"tp.fft.{fn}: invalid number of data points ({n}) specified")
        cur = x.shape[d]
        if n < cur:
            x = x.narrow(d, 0, n)
        elif n > cur:
            x = _op("pad")(x, [0, 0] * (x.dim() - 1 - d) + [0, n - cur], "constant", None)
    return x


def _dims(x, s, dim, fn, default_all=True):
    if dim is not None:
        dims = [dim] if isinstance(dim, numbers.Integral) else list(dim)
    elif s is not None:
        dims = list(range(x.dim() - len(s), x.dim()))
    else:
        dims = list(range(x.dim())) if default_all else [x.dim() - 1]
    if any(not -x.dim() <= d < x.dim() for d in dims):
        raise IndexError(f"tp.fft.{fn}: dim {dim} out of range for a {x.dim()}-d input")
    dims = [d % x.dim() for d in dims]
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"tp.fft.{fn}: dims must be unique, got {dim}")
    sizes = [None] * len(dims) if s is None else list(s)
    if len(sizes) != len(dims):
        raise RuntimeError(f"tp.fft.{fn}: s and dim must have the same length, got {s} and {dim}")
    return dims, sizes


def _c2c_any(x, dims, sizes, norm, forward, fn):
    x = _resize(_float(x), dims, sizes, fn)
    if not x.is_complex() and fn in ("fftn", "ifftn"):    # the n-d transforms promote a real input (as PyTorch)
        x = _op("complex")(x, x.new_zeros(list(x.shape)))
    if x.is_complex():
        return _op("_fft_c2c")(x, dims, _norm(norm, forward, fn), forward)
    out = _op("_fft_r2c")(x, dims, _norm(norm, forward, fn), False)
    return out if forward else _op("conj_physical")(out)      # the inverse of a real signal: conj of the forward


def _r2c(x, dims, sizes, norm, forward, fn):
    x = _float(x)
    if x.is_complex():
        raise RuntimeError(f"tp.fft.{fn}: expects a real input tensor, got {x.dtype}")
    x = _resize(x, dims, sizes, fn)
    out = _op("_fft_r2c")(x, dims, _norm(norm, forward, fn), True)
    return out if forward else _op("conj_physical")(out)


def _c2r(x, dims, sizes, norm, forward, fn):
    x = _float(x)
    last = sizes[-1] if sizes[-1] not in (None, -1) else 2 * (x.shape[dims[-1]] - 1)
    if last < 1:
        raise RuntimeError(f"tp.fft.{fn}: invalid number of data points ({last}) specified")
    x = _resize(x, dims, sizes[:-1] + [last // 2 + 1], fn)
    if not x.is_complex():
        x = _op("complex")(x, x.new_zeros(list(x.shape)))
    return _op("_fft_c2r")(x, dims, _norm(norm, forward, fn), last)


def fft(input, n=None, dim=-1, norm=None):
    d, s = _dims(input, None if n is None else [n], dim, "fft")
    return _c2c_any(input, d, s, norm, True, "fft")


def ifft(input, n=None, dim=-1, norm=None):
    d, s = _dims(input, None if n is None else [n], dim, "ifft")
    return _c2c_any(input, d, s, norm, False, "ifft")


def rfft(input, n=None, dim=-1, norm=None):
    d, s = _dims(input, None if n is None else [n], dim, "rfft")
    return _r2c(input, d, s, norm, True, "rfft")


def irfft(input, n=None, dim=-1, norm=None):
    d, s = _dims(input, None if n is None else [n], dim, "irfft")
    return _c2r(input, d, s, norm, False, "irfft")


def hfft(input, n=None, dim=-1, norm=None):
    """The real spectrum of a signal with Hermitian symmetry given by its one-sided half."""
    d, s = _dims(input, None if n is None else [n], dim, "hfft")
    x = _float(input)
    return _c2r(_op("conj_physical")(x) if x.is_complex() else x, d, s, norm, True, "hfft")


def ihfft(input, n=None, dim=-1, norm=None):
    d, s = _dims(input, None if n is None else [n], dim, "ihfft")
    return _r2c(input, d, s, norm, False, "ihfft")


def fftn(input, s=None, dim=None, norm=None):
    d, sz = _dims(input, s, dim, "fftn")
    return _c2c_any(input, d, sz, norm, True, "fftn")


def ifftn(input, s=None, dim=None, norm=None):
    d, sz = _dims(input, s, dim, "ifftn")
    return _c2c_any(input, d, sz, norm, False, "ifftn")


def rfftn(input, s=None, dim=None, norm=None):
    d, sz = _dims(input, s, dim, "rfftn")
    return _r2c(input, d, sz, norm, True, "rfftn")


def irfftn(input, s=None, dim=None, norm=None):
    d, sz = _dims(input, s, dim, "irfftn")
    return _c2r(input, d, sz, norm, False, "irfftn")


def fft2(input, s=None, dim=(-2, -1), norm=None):
    return fftn(input, s, dim, norm)


def ifft2(input, s=None, dim=(-2, -1), norm=None):
    return ifftn(input, s, dim, norm)


def rfft2(input, s=None, dim=(-2, -1), norm=None):
    return rfftn(input, s, dim, norm)


def irfft2(input, s=None, dim=(-2, -1), norm=None):
    return irfftn(input, s, dim, norm)


def fftfreq(n, d=1.0, *, dtype=None, device=None, requires_grad=False):
    from ._tensor import _wrap
    t = _wrap(torch.fft.fftfreq(n, d, dtype=dtype, device=device))
    return t.requires_grad_() if requires_grad else t


def rfftfreq(n, d=1.0, *, dtype=None, device=None, requires_grad=False):
    from ._tensor import _wrap
    t = _wrap(torch.fft.rfftfreq(n, d, dtype=dtype, device=device))
    return t.requires_grad_() if requires_grad else t


def _shift(x, dim, inverse):
    dims = list(range(x.dim())) if dim is None else ([dim] if isinstance(dim, numbers.Integral) else list(dim))
    shifts = [((x.shape[d] + 1) // 2 if inverse else x.shape[d] // 2) for d in dims]
    return x.roll(shifts, dims) if dims else x


def fftshift(input, dim=None):
    """Move the zero frequency to the centre (a roll by n // 2 along each dim)."""
    return _shift(input, dim, False)


def ifftshift(input, dim=None):
    """The inverse of fftshift (a roll by -(n // 2), i.e. (n + 1) // 2)."""
    return _shift(input, dim, True)
