"""Pointwise ops: arithmetic, math functions, activations, comparisons, logic (chapter §1.2, §6.2).

Each entry: schema, ATen kernel (default ``torch.<name>``), derivative formula in tp ops with the
arguments it saves, tags.  Binary ops broadcast and promote dtypes like PyTorch; either operand
may be a Python number (``2 - x`` is ``sub(2, x)``); the gradient of a broadcast operand is summed
back to its shape (``unbroadcast``).
"""
from __future__ import annotations

import math

import torch

from ._helpers import unbroadcast
from .registry import register

__all__ = []

P = ("pointwise",)


def _binary(torch_fn, reflected: str | None = None):
    """Kernel for a binary op whose ``self`` may be a Python number."""
    rfn = getattr(torch.Tensor, reflected) if reflected else None

    def k(self, other, *rest, **kw):
        if isinstance(self, torch.Tensor):
            return torch_fn(self, other, *rest, **kw)
        if isinstance(other, torch.Tensor):
            if rfn is not None and not rest and not kw:
                return rfn(other, self)
            return torch_fn(torch.scalar_tensor(self, dtype=_scalar_dtype(self, other), device=other.device),
                            other, *rest, **kw)
        raise TypeError("at least one operand must be a Tensor")
    return k


def _scalar_dtype(v, other):
    if isinstance(v, bool):
        return torch.bool
    if isinstance(v, int):
        return other.dtype if other.dtype != torch.bool else torch.int64
    if isinstance(v, float):
        return other.dtype if other.dtype.is_floating_point or other.dtype.is_complex else torch.get_default_dtype()
    return torch.complex64


def _nonneg(g):
    return g


# ---- arithmetic -------------------------------------------------------------------------------
_add_a, _add_1 = _binary(torch.add), _binary(torch.add, "__radd__")
_sub_a, _sub_1 = _binary(torch.sub), _binary(torch.sub, "__rsub__")
register("add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
         lambda self, other, alpha: _add_1(self, other) if alpha == 1 else _add_a(self, other, alpha=alpha),
         backward=lambda ctx, g: (unbroadcast(g, ctx.self), unbroadcast(g * ctx.alpha if ctx.alpha != 1 else g, ctx.other)),
         save=(), tags=P, dunders=("__add__",), rdunders=("__radd__",), inplace=True, inplace_dunders=("__iadd__",))

register("sub(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
         lambda self, other, alpha: _sub_1(self, other) if alpha == 1 else _sub_a(self, other, alpha=alpha),
         backward=lambda ctx, g: (unbroadcast(g, ctx.self), unbroadcast(-g * ctx.alpha if ctx.alpha != 1 else -g, ctx.other)),
         save=(), tags=P, dunders=("__sub__",), rdunders=("__rsub__",), inplace=True, inplace_dunders=("__isub__",))

register("mul(Tensor self, Tensor other) -> Tensor", _binary(torch.mul, "__rmul__"),
         backward=lambda ctx, g: (unbroadcast(g * _conj(ctx.other), ctx.self) if ctx.needs_input_grad[0] else None,
                                  unbroadcast(g * _conj(ctx.self), ctx.other) if ctx.needs_input_grad[1] else None),
         save=("self", "other"), tags=P, dunders=("__mul__",), rdunders=("__rmul__",), inplace=True,
         inplace_dunders=("__imul__",))


def _conj(x):
    return x


_div_t, _div_r = _binary(torch.div, "__rtruediv__"), _binary(torch.div)


def _div_kernel(self, other, rounding_mode):
    if rounding_mode is None:
        return _div_t(self, other)
    return _div_r(self, other, rounding_mode=rounding_mode)


def _div_bwd(ctx, g):
    if ctx.rounding_mode is not None:
        return (None, None)
    other = ctx.other
    gs = unbroadcast(g / other, ctx.self) if ctx.needs_input_grad[0] else None
    go = unbroadcast(-g * ctx.self / (other * other), other) if ctx.needs_input_grad[1] else None
    return gs, go


register("div(Tensor self, Tensor other, *, str? rounding_mode=None) -> Tensor", _div_kernel,
         backward=_div_bwd, save=("self", "other"), tags=P, dunders=("__truediv__",), rdunders=("__rtruediv__",),
         inplace=True, inplace_dunders=("__itruediv__",))

register("neg(Tensor self) -> Tensor", backward=lambda ctx, g: -g, save=(), tags=P, dunders=("__neg__",),
         inplace=True)

register("exp(Tensor self) -> Tensor", backward=lambda ctx, g: g * ctx.result, save=("result",), tags=P,
         inplace=True)


# ---- in-place fills and copies ----------------------------------------------------------------
def _zeros_like(g):
    return g.new_zeros(g.shape)


register("copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)",
         lambda self, src, non_blocking: self.copy_(src, non_blocking=non_blocking),
         backward=lambda ctx, g: (_zeros_like(g) if ctx.needs_input_grad[0] else None,
                                  unbroadcast(g, ctx.src).to(ctx.src.dtype) if ctx.needs_input_grad[1] else None),
         save=(), tags=("inplace",), function=False)
register("zero_(Tensor(a!) self) -> Tensor(a!)", lambda self: self.zero_(),
         backward=lambda ctx, g: _zeros_like(g), save=(), tags=("inplace",), function=False)
register("fill_(Tensor(a!) self, Scalar value) -> Tensor(a!)",
         lambda self, value: self.fill_(value.item() if isinstance(value, torch.Tensor) else value),
         backward=lambda ctx, g: _zeros_like(g), save=(), tags=("inplace",), function=False)
