"""More activations (chapter §1.2): selu, celu, threshold, hardshrink, softshrink (pointwise) and glu
(a gate over one dim).

Guarantees: the eager kernel is ATen's (``torch.nn.functional``), so forward results are
bit-identical to PyTorch; derivatives are tp formulas that follow PyTorch's conventions at the kinks
(threshold passes the gradient only where ``x > threshold``; the shrinks stop it on the closed
band ``[-lambd, lambd]``); every pointwise entry is tagged ``pointwise`` and carries a decomposition
into tp ops (``where``, ``exp``, ``expm1``, arithmetic) for the compiler.  Bad arguments raise an
exception naming the op (``tp.glu(...)``, ``tp.hardshrink: ...``).
"""
from __future__ import annotations

import torch.nn.functional as TF

from ..registry import OPS, register

__all__ = []

P = ("pointwise",)
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _where(c, a, b):
    return OPS["where"].fn(c, a, b)


# ---- selu / celu ---------------------------------------------------------------------------------
def _selu_decomp(self):
    return _SELU_SCALE * _where(self > 0, self, _SELU_ALPHA * self.expm1())


register("selu(Tensor self) -> Tensor", lambda self: TF.selu(self),
         backward=lambda ctx, g: _where(ctx.self > 0, g * _SELU_SCALE, g * (_SELU_SCALE * _SELU_ALPHA) * ctx.self.exp()),
         save=("self",), tags=P, decomp=_selu_decomp, inplace=True, inplace_eager=lambda self: TF.selu_(self),
         doc="scale * (x if x > 0 else alpha * (exp(x) - 1)), alpha = 1.6733, scale = 1.0507.")


def _celu_kernel(self, alpha):
    if alpha == 0:
        raise ValueError("tp.celu: alpha must not be 0 (the negative branch divides by alpha)")
    return TF.celu(self, alpha)


def _celu_decomp(self, alpha=1.0):
    return _where(self > 0, self, alpha * (self / alpha).expm1())


register("celu(Tensor self, Scalar alpha=1.0) -> Tensor", _celu_kernel,
         backward=lambda ctx, g: _where(ctx.self > 0, g, g * (ctx.self / ctx.alpha).exp()),
         save=("self",), tags=P, decomp=_celu_decomp, inplace=True,
         inplace_eager=lambda self, alpha: self.copy_(_celu_kernel(self, alpha)),
         doc="max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).")


# ---- threshold / shrinks -------------------------------------------------------------------------
register("threshold(Tensor self, Scalar threshold, Scalar value) -> Tensor",
         lambda self, threshold, value: TF.threshold(self, threshold, value),
         backward=lambda ctx, g: _where(ctx.self > ctx.threshold, g, 0.0), save=("self",), tags=P,
         decomp=lambda self, threshold, value: _where(self > threshold, self, value), inplace=True,
         inplace_eager=lambda self, threshold, value: TF.threshold_(self, threshold, value),
         doc="x where x > threshold, else value.")


def _check_lambd(name, lambd):
    if lambd < 0:
        raise ValueError(f"tp.{name}: lambd must be non-negative, got {lambd}")


def _hardshrink_kernel(self, lambd):
    _check_lambd("hardshrink", lambd)
    return TF.hardshrink(self, lambd)


def _softshrink_kernel(self, lambd):
    _check_lambd("softshrink", lambd)
    return TF.softshrink(self, lambd)


def _band(x, lambd):
    return (x >= -lambd) & (x <= lambd)


register("hardshrink(Tensor self, Scalar lambd=0.5) -> Tensor", _hardshrink_kernel,
         backward=lambda ctx, g: _where(_band(ctx.self, ctx.lambd), 0.0, g), save=("self",), tags=P,
         decomp=lambda self, lambd=0.5: _where(_band(self, lambd), 0.0, self),
         doc="x where |x| > lambd, else 0.")
register("softshrink(Tensor self, Scalar lambd=0.5) -> Tensor", _softshrink_kernel,
         backward=lambda ctx, g: _where(_band(ctx.self, ctx.lambd), 0.0, g), save=("self",), tags=P,
         decomp=lambda self, lambd=0.5: _where(self > lambd, self - lambd, _where(self < -lambd, self + lambd, 0.0)),
         doc="x - lambd where x > lambd, x + lambd where x < -lambd, else 0.")


# ---- glu -----------------------------------------------------------------------------------------
def _glu_kernel(self, dim):
    if self.dim() == 0:
        raise RuntimeError("tp.glu: glu does not support 0-d (scalar) tensors")
    d = dim % self.dim() if -self.dim() <= dim < self.dim() else dim
    if not 0 <= d < self.dim():
        raise IndexError(f"tp.glu: dim {dim} out of range for a {self.dim()}-d input")
    if self.shape[d] % 2:
        raise RuntimeError(f"tp.glu: halving dimension {dim} of size {self.shape[d]} must be even "
                           f"(input shape {list(self.shape)})")
    return TF.glu(self, dim)


def _glu_decomp(self, dim=-1):
    a, b = self.chunk(2, dim)
    return a * b.sigmoid()


def _glu_bwd(ctx, g):
    a, b = ctx.self.chunk(2, ctx.dim)
    s = b.sigmoid()
    return OPS["cat"].fn([g * s, g * a * s * (1 - s)], ctx.dim)


register("glu(Tensor self, int dim=-1) -> Tensor", _glu_kernel, backward=_glu_bwd, save=("self",), tags=("nn",),
         decomp=_glu_decomp, method=False,
         doc="a * sigmoid(b) where a, b are the two halves of self along dim.")
