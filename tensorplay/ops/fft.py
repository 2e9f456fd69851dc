"""Discrete Fourier transforms and the complex-number ops they need (chapter §1.2; used by
``tp.fft``).

The three transform ops are ATen's (pocketfft on CPU), so results are PyTorch's bit for bit:

* ``_fft_c2c(self, dim, normalization, forward)``: complex -> complex over ``dim``;
* ``_fft_r2c(self, dim, normalization, onesided)``: real -> complex (``onesided``: the last dim keeps
  ``n // 2 + 1`` frequencies);
* ``_fft_c2r(self, dim, normalization, last_dim_size)``: a Hermitian half spectrum -> real.

``normalization`` is 0 (no scaling), 1 (1/sqrt(n)) or 2 (1/n).  Derivatives follow PyTorch's
convention for complex gradients (the conjugate Wirtinger derivative): the adjoint of a scaled DFT
is the opposite-direction DFT with the same scale, so ``_fft_c2c``'s derivative is ``_fft_c2c``
with ``forward`` flipped; ``_fft_r2c``'s is the real part of the inverse c2c of the spectrum
zero-padded to full length; ``_fft_c2r``'s is the one-sided r2c of the gradient with the
frequencies that stand for two conjugate bins doubled.  All are again table ops (any order).

Complex helpers, which the formulas and the tests use: ``real``, ``imag``, ``conj_physical``,
``view_as_real``, ``view_as_complex``, ``complex`` (values as PyTorch's; the results are copies,
not views of their input).  Their derivatives: real -> g, imag -> g * i (as complex), conj ->
conj(g), view_as_real <-> view_as_complex, complex -> (real(g), imag(g)).
"""
from __future__ import annotations

import torch

from .factories import arange
from .registry import OPS, register

__all__ = []

aten = torch.ops.aten
C = ()


def _op(name):
    return OPS[name].fn


def _to_complex(g):
    return _op("complex")(g, g.new_zeros(list(g.shape))) if not g.is_complex() else g


# ---- complex helpers -----------------------------------------------------------------------------
def _need_complex(name, self):
    if not self.is_complex():
        raise RuntimeError(f"tp.{name}: expected a complex tensor, got {self.dtype}")


def _real_kernel(self):
    return torch.real(self).clone()


def _imag_kernel(self):
    _need_complex("imag", self)
    return torch.imag(self).clone()


register("real(Tensor self) -> Tensor", _real_kernel,
         backward=lambda ctx, g: _to_complex(g) if ctx.self.is_complex() else g, save=("self",),
         tags=("pointwise",), doc="The real part (a copy; the input itself for a real tensor's values).")
register("imag(Tensor self) -> Tensor", _imag_kernel,
         backward=lambda ctx, g: _op("complex")(g.new_zeros(list(g.shape)), g), save=(), tags=("pointwise",),
         doc="The imaginary part of a complex tensor (a copy).")
register("conj_physical(Tensor self) -> Tensor", "torch.conj_physical",
         backward=lambda ctx, g: _op("conj_physical")(g), save=(), tags=("pointwise",),
         doc="The complex conjugate, materialised (the input's values for a real tensor).")


def _complex_kernel(real, imag):
    return torch.complex(real, imag)


register("complex(Tensor real, Tensor imag) -> Tensor", _complex_kernel,
         backward=lambda ctx, g: (_op("real")(g), _op("imag")(g)), save=(), tags=("pointwise",), method=False,
         doc="real + i imag (float32 -> complex64, float64 -> complex128).")


def _view_as_real_kernel(self):
    _need_complex("view_as_real", self)
    return torch.view_as_real(self).clone()


def _view_as_complex_kernel(self):
    if self.dim() == 0 or self.shape[-1] != 2:
        raise RuntimeError(f"tp.view_as_complex: the last dim must have size 2, got shape {list(self.shape)}")
    return torch.view_as_complex(self.contiguous()).clone()


register("view_as_real(Tensor self) -> Tensor", _view_as_real_kernel,
         backward=lambda ctx, g: _op("view_as_complex")(g), save=(), tags=("shape",), method=False,
         doc="A complex tensor as a real one with a trailing dim of 2 (real, imag); a copy.")
register("view_as_complex(Tensor self) -> Tensor", _view_as_complex_kernel,
         backward=lambda ctx, g: _op("view_as_real")(g), save=(), tags=("shape",), method=False,
         doc="A real tensor with a trailing dim of 2 as a complex one; a copy.")


# ---- transforms ----------------------------------------------------------------------------------
def _c2c_kernel(self, dim, normalization, forward):
    _need_complex("_fft_c2c", self)
    return aten._fft_c2c(self, list(dim), normalization, forward)


def _r2c_kernel(self, dim, normalization, onesided):
    if self.is_complex():
        raise RuntimeError(f"tp._fft_r2c: expected a real tensor, got {self.dtype}")
    return aten._fft_r2c(self, list(dim), normalization, onesided)


def _c2r_kernel(self, dim, normalization, last_dim_size):
    _need_complex("_fft_c2r", self)
    return aten._fft_c2r(self, list(dim), normalization, last_dim_size)


def _r2c_bwd(ctx, g):
    dim = list(ctx.dim)
    if ctx.onesided:
        last = dim[-1] % g.dim()
        full = ctx.self.shape[last]
        missing = full - g.shape[last]
        if missing > 0:
            pad = [0, 0] * (g.dim() - 1 - last) + [0, missing]
            g = _op("pad")(g, pad, "constant", None)
    return _op("real")(_op("_fft_c2c")(g, dim, ctx.normalization, False))


def _c2r_bwd(ctx, g):
    dim = list(ctx.dim)
    gi = _op("_fft_r2c")(g, dim, ctx.normalization, True)
    last = dim[-1] % g.dim()
    double = g.shape[last] - gi.shape[last]
    if double > 0:
        k = gi.shape[last]
        idx = arange(k, device=gi.device)
        scale = ((idx >= 1) & (idx <= double)).to(g.dtype) + 1.0
        shape = [1] * gi.dim()
        shape[last] = k
        gi = gi * scale.reshape(shape)
    return gi


register("_fft_c2c(Tensor self, int[] dim, int normalization, bool forward) -> Tensor", _c2c_kernel,
         backward=lambda ctx, g: _op("_fft_c2c")(g, list(ctx.dim), ctx.normalization, not ctx.forward), save=(),
         tags=C, method=False, doc="Complex-to-complex DFT over dim (forward: exp(-2 pi i jk / n)), scaled.")
register("_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor", _r2c_kernel,
         backward=_r2c_bwd, save=("self",), tags=C, method=False,
         doc="Real-to-complex forward DFT over dim; onesided keeps the n // 2 + 1 non-redundant frequencies.")
register("_fft_c2r(Tensor self, int[] dim, int normalization, int last_dim_size) -> Tensor", _c2r_kernel,
         backward=_c2r_bwd, save=(), tags=C, method=False,
         doc="Inverse DFT of a Hermitian half spectrum to a real signal whose last dim has last_dim_size points.")
