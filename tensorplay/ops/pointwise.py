"""Pointwise ops: arithmetic, math functions, activations, comparisons, logic (chapter §1.2, §6.2).

A *pointwise* op computes every output element from the elements at the same (broadcast) index
of its inputs.  This module registers the whole family in the op table; each entry gives the
schema, the ATen kernel (default ``torch.<name>``), the derivative formula written in tp ops with
the arguments it saves, and tags.  What the family guarantees:

* **Forward = ATen.**  Every result is bit-identical to the PyTorch function of the same name
  (``torch.nn.functional`` for activations), including dtype promotion, broadcasting and the IEEE
  special values ±0, ±inf and NaN.  Binary ops accept a Python number on either side
  (``2 - x`` is ``sub(2, x)``, ``2 ** x`` is ``pow(2, x)``), and where PyTorch has no number
  overload (``fmod(2, x)``, ``logical_and(x, 1)``) the number is promoted like a Python scalar.
* **Derivatives like PyTorch.**  Formulas are written in tp ops, so they differentiate again
  (higher order, forward mode) and trace.  At the kinks we follow PyTorch's conventions: ``relu``,
  ``clamp``, ``hardtanh`` pass or stop the gradient at the boundary exactly as PyTorch does;
  ``minimum``/``maximum`` split the gradient in halves at ties; ``pow`` gives zero (not NaN) for
  a zero base with a non-negative exponent; ``floor``, ``ceil``, ``round``, ``trunc``, ``sign`` and
  the rounding divisions have zero gradients.  The gradient of a broadcast operand is summed back
  to its shape (``unbroadcast``).
* **Non-differentiable ops** (comparisons, predicates ``isnan``..., logic and bitwise ops) return
  bool or integer tensors that never require grad; they are tagged ``nondifferentiable``.
* **Errors name the op.**  Kernel errors are re-raised by the dispatcher as
  ``tp.<op>(self: float32[3], ...): <ATen message>``; bitwise ops on floating tensors, which ATen
  reports only as a missing kernel, are rejected here with an explicit message.
* **In-place twins** (``add_``, ``clamp_``, ``relu_``...) share the formula of their out-of-place
  op, bump the version counter of ``self`` and refuse results that cannot be cast back to
  ``self``'s dtype (``int_tensor.sqrt_()``).
"""
from __future__ import annotations

import cmath
import math
import numbers

import torch
import torch.nn.functional as F

from .._tensor import Tensor
from ._helpers import sgn, unbroadcast
from .registry import OPS, _to_meta, register

__all__ = []

P = ("pointwise",)
H = ("pointwise", "holomorphic")   # formulas g * f'(z): the table conjugates them for complex inputs
CMP = ("pointwise", "comparison", "nondifferentiable")
LOGIC = ("pointwise", "nondifferentiable")


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


def _is_num(x) -> bool:
    return isinstance(x, numbers.Number)


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
    """The complex conjugate of a saved operand (a tensor or a Python number); real values as they
    are.  Complex derivatives follow PyTorch's convention (the conjugate Wirtinger derivative):
    the gradient of ``a * b`` for ``a`` is ``g * conj(b)``."""
    if isinstance(x, Tensor):
        return OPS["conj_physical"].fn(x) if x.is_complex() else x
    return x.conjugate() if isinstance(x, complex) else x


_div_t, _div_r = _binary(torch.div, "__rtruediv__"), _binary(torch.div)


def _div_kernel(self, other, rounding_mode):
    if rounding_mode is None:
        return _div_t(self, other)
    return _div_r(self, other, rounding_mode=rounding_mode)


def _div_bwd(ctx, g):
    if ctx.rounding_mode is not None:   # piecewise constant: zero gradient (as PyTorch)
        n = ctx.needs_input_grad
        return (_ub(_zeros_like(g), ctx.self, n[0]), _ub(_zeros_like(g), ctx.other, n[1]))
    other = ctx.other
    gs = unbroadcast(g / other, ctx.self) if ctx.needs_input_grad[0] else None
    go = unbroadcast(-g * ctx.self / (other * other), other) if ctx.needs_input_grad[1] else None
    return gs, go


_mul_meta = _binary(torch.mul, "__rmul__")


def _rounding_div_meta(self, other, rounding_mode):
    """Meta of div: ATen's meta for the rounding modes does not follow the input layout the way
    the CPU/CUDA TensorIterator does; mul is the same broadcast/promotion with a structured meta."""
    a, b = _to_meta(self), _to_meta(other)
    if rounding_mode is None:
        return _div_kernel(a, b, None)
    return _mul_meta(a, b)


register("div(Tensor self, Tensor other, *, str? rounding_mode=None) -> Tensor", _div_kernel, meta=_rounding_div_meta,
         backward=_div_bwd, save=("self", "other"), tags=H, dunders=("__truediv__",), rdunders=("__rtruediv__",),
         inplace=True, inplace_dunders=("__itruediv__",))

register("neg(Tensor self) -> Tensor", backward=lambda ctx, g: -g, save=(), tags=P, dunders=("__neg__",),
         inplace=True)

register("exp(Tensor self) -> Tensor", backward=lambda ctx, g: g * ctx.result, save=("result",), tags=H,
         inplace=True)


# ---- helpers for formulas (resolved at backward time, when every op is registered) -------------
def _zeros_like(g):
    return g.new_zeros(g.shape)


def _zero_grad(ctx, g):
    """Formula of piecewise-constant ops (floor, sign, ...): the derivative is zero wherever defined."""
    return _zeros_like(g)


def _where(cond, a, b):
    return OPS["where"].fn(cond, a, b)


def _ub(g, x, needed):
    """``unbroadcast`` if the input needs a gradient, else None."""
    return unbroadcast(g, x) if needed else None


_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


# ---- arithmetic: rounding divisions, remainders, powers -----------------------------------------
def _floor_divide_kernel(self, other):
    if isinstance(self, torch.Tensor):
        return torch.floor_divide(self, other)
    if isinstance(other, torch.Tensor):
        return other.__rfloordiv__(self)
    raise TypeError("at least one operand must be a Tensor")


def _floor_divide_meta(self, other):
    return _rounding_div_meta(self, other, "floor")


register("floor_divide(Tensor self, Tensor other) -> Tensor", _floor_divide_kernel, meta=_floor_divide_meta,
         backward=lambda ctx, g: (_ub(_zeros_like(g), ctx.self, ctx.needs_input_grad[0]),
                                  _ub(_zeros_like(g), ctx.other, ctx.needs_input_grad[1])),
         save=(), tags=P, dunders=("__floordiv__",), rdunders=("__rfloordiv__",), inplace=True,
         inplace_dunders=("__ifloordiv__",),
         doc="Division rounded toward -inf (Python's //). Zero gradient, like div(rounding_mode='floor').")


def _remainder_like_bwd(mode):
    def bwd(ctx, g):
        gs = _ub(g, ctx.self, ctx.needs_input_grad[0])
        go = None
        if ctx.needs_input_grad[1]:
            q = OPS["div"].fn(ctx.self, ctx.other, rounding_mode=mode)
            go = unbroadcast(-g * q, ctx.other)
        return gs, go
    return bwd


register("remainder(Tensor self, Tensor other) -> Tensor", "torch.remainder",
         backward=_remainder_like_bwd("floor"), save=("self", "other"), tags=P, dunders=("__mod__",),
         rdunders=("__rmod__",), inplace=True, inplace_dunders=("__imod__",),
         doc="Python's %: self - floor(self / other) * other; the result has the sign of other.")
register("fmod(Tensor self, Tensor other) -> Tensor", _binary(torch.fmod),
         backward=_remainder_like_bwd("trunc"), save=("self", "other"), tags=P, inplace=True,
         doc="C's fmod: self - trunc(self / other) * other; the result has the sign of self.")


def _log_of_number(b):
    if isinstance(b, complex):
        return complex(-math.inf, 0) if b == 0 else cmath.log(b)
    if b > 0:
        return math.log(b)
    return -math.inf if b == 0 else math.nan


def _nonneg_exponent(e):
    """``e >= 0`` (where 0^e is constant); a complex exponent: real and >= 0 (PyTorch's rule)."""
    if isinstance(e, Tensor) and e.is_complex():
        return (OPS["imag"].fn(e) == 0) & (OPS["real"].fn(e) >= 0)
    if isinstance(e, complex):
        return e.imag == 0 and e.real >= 0
    return e >= 0


def _pow_bwd(ctx, g):
    base, e = ctx.self, ctx.exponent
    gb = ge = None
    if ctx.needs_input_grad[0]:
        if _is_num(e):
            gb = _zeros_like(g) if e == 0 else g * (e * base.pow(e - 1))
        else:
            # d/dx x^0 = 0 everywhere (also at x = 0, where e * x^(e-1) would be 0 * inf)
            gb = _where(e == 0, 0.0, g * (e * base.pow(e - 1)))
        gb = unbroadcast(gb, base)
    if ctx.needs_input_grad[1]:
        r = ctx.result
        if _is_num(base):
            lb = _log_of_number(base)
            ge = g * (r * lb)
            if base == 0:   # 0^e is constant (0 or 1) for e >= 0: zero, not 0 * -inf
                ge = _where(_nonneg_exponent(e), 0.0, ge)
        else:
            # a negative base has no real logarithm: NaN, as in PyTorch
            ge = _where((base == 0) & _nonneg_exponent(e), 0.0, g * (r * base.log()))
        ge = unbroadcast(ge, e)
    return gb, ge


register("pow(Tensor self, Tensor exponent) -> Tensor", "torch.pow", backward=_pow_bwd,
         save=("self", "exponent", "result"), tags=H, dunders=("__pow__",), rdunders=("__rpow__",),
         inplace=True, inplace_dunders=("__ipow__",),
         doc="self ** exponent; both operands may be tensors or Python numbers, both are differentiable.")

register("float_power(Tensor self, Tensor exponent) -> Tensor", _binary(torch.float_power),
         backward=_pow_bwd, save=("self", "exponent", "result"), tags=H,
         doc="pow computed in float64 (complex128).")

register("reciprocal(Tensor self) -> Tensor", backward=lambda ctx, g: -g * (ctx.result * ctx.result),
         save=("result",), tags=H, inplace=True)

register("rsub(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
         lambda self, other, alpha: torch.rsub(self, other, alpha=alpha),
         backward=lambda ctx, g: (_ub(-g * ctx.alpha if ctx.alpha != 1 else -g, ctx.self, ctx.needs_input_grad[0]),
                                  _ub(g, ctx.other, ctx.needs_input_grad[1])),
         save=(), tags=P, doc="other - alpha * self.")

register("abs(Tensor self) -> Tensor", backward=lambda ctx, g: g * sgn(ctx.self), save=("self",), tags=P,
         dunders=("__abs__",), inplace=True)
register("positive(Tensor self) -> Tensor", backward=lambda ctx, g: g, save=(), tags=P, dunders=("__pos__",))
register("sign(Tensor self) -> Tensor", backward=_zero_grad, save=(), tags=P, inplace=True)
register("square(Tensor self) -> Tensor", backward=lambda ctx, g: g * (2 * ctx.self), save=("self",), tags=H,
         inplace=True)


def _lerp_bwd(ctx, g):
    w = ctx.weight
    n = ctx.needs_input_grad
    return (_ub(g * (1 - w), ctx.self, n[0]),
            _ub(g * w, ctx.end, n[1]),
            _ub(g * (ctx.end - ctx.self), w, n[2]) if n[2] else None)


register("lerp(Tensor self, Tensor end, Tensor weight) -> Tensor", "torch.lerp", backward=_lerp_bwd,
         save=("self", "end", "weight"), tags=H, inplace=True,
         doc="self + weight * (end - self); weight is a tensor or a Python number.")


def _addcmul_bwd(ctx, g):
    n, v = ctx.needs_input_grad, ctx.value
    return (_ub(g, ctx.self, n[0]),
            _ub(g * (ctx.tensor2 * v), ctx.tensor1, n[1]) if n[1] else None,
            _ub(g * (ctx.tensor1 * v), ctx.tensor2, n[2]) if n[2] else None)


def _addcdiv_bwd(ctx, g):
    n, v = ctx.needs_input_grad, ctx.value
    t1, t2 = ctx.tensor1, ctx.tensor2
    return (_ub(g, ctx.self, n[0]),
            _ub(g * (v / t2), t1, n[1]) if n[1] else None,
            _ub(-g * (v * t1 / (t2 * t2)), t2, n[2]) if n[2] else None)


register("addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", "torch.addcmul",
         backward=_addcmul_bwd, save=("tensor1", "tensor2"), tags=H, inplace=True,
         doc="self + value * tensor1 * tensor2.")
register("addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", "torch.addcdiv",
         backward=_addcdiv_bwd, save=("tensor1", "tensor2"), tags=H, inplace=True,
         doc="self + value * tensor1 / tensor2 (floating point only).")


# ---- clamp, minimum/maximum, where ------------------------------------------------------------
def _clamp_bwd(ctx, g):
    x, lo, hi = ctx.self, ctx.min, ctx.max
    n = ctx.needs_input_grad
    gx = glo = ghi = None
    if n[0]:
        if lo is None:
            inside = x <= hi
        elif hi is None:
            inside = x >= lo
        else:
            inside = (x >= lo) & (x <= hi)
        gx = unbroadcast(_where(inside, g, 0.0), x)
    if n[1]:   # min is a tensor requiring grad: it is the result where x < min (unless min > max)
        sel = x < lo
        if hi is not None:
            sel = sel & (lo < hi)
        glo = unbroadcast(_where(sel, g, 0.0), lo)
    if n[2]:   # max is the result where x > max, and everywhere if max < min
        sel = x > hi
        if lo is not None:
            sel = sel | (hi < lo)
        ghi = unbroadcast(_where(sel, g, 0.0), hi)
    return gx, glo, ghi


def _clamp_bounds(self, min, max):
    """ATen takes both bounds as numbers or both as tensors: make a lone number a 0-d tensor."""
    if isinstance(min, torch.Tensor) != isinstance(max, torch.Tensor) and min is not None and max is not None:
        if not isinstance(min, torch.Tensor):
            min = torch.scalar_tensor(min, dtype=_scalar_dtype(min, self), device=self.device)
        else:
            max = torch.scalar_tensor(max, dtype=_scalar_dtype(max, self), device=self.device)
    return min, max


def _clamp_kernel(self, min, max):
    return torch.clamp(self, *_clamp_bounds(self, min, max))


def _clamp_inplace(self, min, max):
    return self.clamp_(*_clamp_bounds(self, min, max))


register("clamp(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", _clamp_kernel, backward=_clamp_bwd,
         save=("self", "min", "max"), tags=P, inplace=True, inplace_eager=_clamp_inplace,
         doc="min(max(self, min), max); min and max are tensors, numbers or None (not both None). The "
             "gradient flows to self where min <= self <= max.")
register("clip(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", _clamp_kernel, backward=_clamp_bwd,
         save=("self", "min", "max"), tags=P, inplace=True, inplace_eager=_clamp_inplace,
         doc="Alias of clamp.")


def _clamp_min_bwd(ctx, g):
    x, lo = ctx.self, ctx.min
    return (_ub(_where(x >= lo, g, 0.0), x, ctx.needs_input_grad[0]),
            _ub(_where(x < lo, g, 0.0), lo, ctx.needs_input_grad[1]) if ctx.needs_input_grad[1] else None)


def _clamp_max_bwd(ctx, g):
    x, hi = ctx.self, ctx.max
    return (_ub(_where(x <= hi, g, 0.0), x, ctx.needs_input_grad[0]),
            _ub(_where(x > hi, g, 0.0), hi, ctx.needs_input_grad[1]) if ctx.needs_input_grad[1] else None)


register("clamp_min(Tensor self, Tensor min) -> Tensor", "torch.clamp_min", backward=_clamp_min_bwd,
         save=("self", "min"), tags=P, inplace=True)
register("clamp_max(Tensor self, Tensor max) -> Tensor", "torch.clamp_max", backward=_clamp_max_bwd,
         save=("self", "max"), tags=P, inplace=True)


def _minmax_bwd(self_loses_where):
    def bwd(ctx, g):
        a, b = ctx.self, ctx.other
        shared = _where(a == b, g / 2, g)    # ties: half to each side
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = unbroadcast(_where(self_loses_where(a, b), 0.0, shared), a)
        if ctx.needs_input_grad[1]:
            gb = unbroadcast(_where(self_loses_where(b, a), 0.0, shared), b)
        return ga, gb
    return bwd


register("maximum(Tensor self, Tensor other) -> Tensor", backward=_minmax_bwd(lambda a, b: a < b),
         save=("self", "other"), tags=P, doc="Elementwise max (NaN propagates); ties split the gradient.")
register("minimum(Tensor self, Tensor other) -> Tensor", backward=_minmax_bwd(lambda a, b: a > b),
         save=("self", "other"), tags=P, doc="Elementwise min (NaN propagates); ties split the gradient.")
def _fminmax_bwd(self_wins):
    def bwd(ctx, g):
        a, b = ctx.self, ctx.other
        won = self_wins(a, b) | b.isnan()     # ties go entirely to self (PyTorch's convention)
        return (_ub(_where(won, g, 0.0), a, ctx.needs_input_grad[0]) if ctx.needs_input_grad[0] else None,
                _ub(_where(won, 0.0, g), b, ctx.needs_input_grad[1]) if ctx.needs_input_grad[1] else None)
    return bwd


register("fmax(Tensor self, Tensor other) -> Tensor", backward=_fminmax_bwd(lambda a, b: a >= b),
         save=("self", "other"), tags=P, doc="Elementwise max ignoring NaN; the gradient goes to the chosen side.")
register("fmin(Tensor self, Tensor other) -> Tensor", backward=_fminmax_bwd(lambda a, b: a <= b),
         save=("self", "other"), tags=P, doc="Elementwise min ignoring NaN; the gradient goes to the chosen side.")


def _where_bwd(ctx, g):
    c, n = ctx.condition, ctx.needs_input_grad
    return (None,
            _ub(_where(c, g, 0.0), ctx.self, n[1]) if n[1] else None,
            _ub(_where(c, 0.0, g), ctx.other, n[2]) if n[2] else None)


register("where(Tensor condition, Tensor self, Tensor other) -> Tensor", "torch.where", backward=_where_bwd,
         save=("condition",), tags=P, method=False,
         doc="self where condition else other; self/other may be Python numbers.")


def _where_method(self, condition, other):
    """``x.where(cond, y)`` is ``where(cond, x, y)`` (PyTorch's method order)."""
    return OPS["where"].fn(condition, self, other)


Tensor.where = _where_method


def _nan_to_num_kernel(self, nan, posinf, neginf):
    return torch.nan_to_num(self, nan=nan, posinf=posinf, neginf=neginf)


register("nan_to_num(Tensor self, float? nan=0.0, float? posinf=None, float? neginf=None) -> Tensor",
         _nan_to_num_kernel, backward=lambda ctx, g: g * ctx.self.isfinite(), save=("self",), tags=P,
         inplace=True, inplace_eager=lambda self, nan, posinf, neginf: self.nan_to_num_(nan=nan, posinf=posinf,
                                                                                        neginf=neginf))


# ---- math functions -----------------------------------------------------------------------------
def _unary(name, backward, save, inplace=True, eager=None, tags=P, **kw):
    register(f"{name}(Tensor self) -> Tensor", eager, backward=backward, save=save, tags=tags, inplace=inplace, **kw)


_SQRT_PI_2 = 2.0 / math.sqrt(math.pi)

_unary("exp2", lambda ctx, g: g * ctx.result * _LN2, ("result",), tags=H)
_unary("expm1", lambda ctx, g: g * (ctx.result + 1), ("result",), tags=H)
_unary("log", lambda ctx, g: g / ctx.self, ("self",), tags=H)
_unary("log2", lambda ctx, g: g / (ctx.self * _LN2), ("self",), tags=H)
_unary("log10", lambda ctx, g: g / (ctx.self * _LN10), ("self",), tags=H)
_unary("log1p", lambda ctx, g: g / (ctx.self + 1), ("self",), tags=H)
_unary("sqrt", lambda ctx, g: g / (2 * ctx.result), ("result",), tags=H)
_unary("rsqrt", lambda ctx, g: -0.5 * g * ctx.result.pow(3), ("result",), tags=H)
_unary("sin", lambda ctx, g: g * ctx.self.cos(), ("self",), tags=H)
_unary("cos", lambda ctx, g: g * -ctx.self.sin(), ("self",), tags=H)
_unary("tan", lambda ctx, g: g * (1 + ctx.result.pow(2)), ("result",), tags=H)
_unary("asin", lambda ctx, g: g * (1 - ctx.self * ctx.self).rsqrt(), ("self",), tags=H)
_unary("acos", lambda ctx, g: g * -(1 - ctx.self * ctx.self).rsqrt(), ("self",), tags=H)
_unary("atan", lambda ctx, g: g / (ctx.self * ctx.self + 1), ("self",), tags=H)
_unary("sinh", lambda ctx, g: g * ctx.self.cosh(), ("self",), tags=H)
_unary("cosh", lambda ctx, g: g * ctx.self.sinh(), ("self",), tags=H)
_unary("tanh", lambda ctx, g: g * (1 - ctx.result * ctx.result), ("result",), tags=H)
_unary("sigmoid", lambda ctx, g: g * (1 - ctx.result) * ctx.result, ("result",), tags=H)
_unary("erf", lambda ctx, g: _SQRT_PI_2 * (-ctx.self.pow(2)).exp() * g, ("self",))
_unary("erfc", lambda ctx, g: -_SQRT_PI_2 * (-ctx.self.pow(2)).exp() * g, ("self",))
_unary("floor", _zero_grad, ())
_unary("ceil", _zero_grad, ())
_unary("trunc", _zero_grad, ())
_unary("frac", lambda ctx, g: g, ())
register("round(Tensor self, *, int decimals=0) -> Tensor",
         lambda self, decimals: torch.round(self) if decimals == 0 else torch.round(self, decimals=decimals),
         backward=_zero_grad, save=(), tags=P, inplace=True,
         inplace_eager=lambda self, decimals: self.round_() if decimals == 0 else self.round_(decimals=decimals),
         doc="Round half to even, to `decimals` decimal places (floating point for decimals != 0).")


def _atan2_bwd(ctx, g):
    y, x = ctx.self, ctx.other
    r2 = x * x + y * y
    return (_ub(g * x / r2, y, ctx.needs_input_grad[0]) if ctx.needs_input_grad[0] else None,
            _ub(g * -y / r2, x, ctx.needs_input_grad[1]) if ctx.needs_input_grad[1] else None)


register("atan2(Tensor self, Tensor other) -> Tensor", backward=_atan2_bwd, save=("self", "other"), tags=P,
         inplace=True, doc="Angle of the point (other, self), in (-pi, pi].")
register("hypot(Tensor self, Tensor other) -> Tensor",
         backward=lambda ctx, g: (_ub(g * ctx.self / ctx.result, ctx.self, ctx.needs_input_grad[0]),
                                  _ub(g * ctx.other / ctx.result, ctx.other, ctx.needs_input_grad[1])),
         save=("self", "other", "result"), tags=P, inplace=True)


# ---- activations ---------------------------------------------------------------------------------
_unary("relu", lambda ctx, g: _where(ctx.result <= 0, 0.0, g), ("result",))


def _gelu_bwd(ctx, g):
    x = ctx.self
    if ctx.approximate == "tanh":
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        t = (k * (x + c * x * x * x)).tanh()
        dy = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x)
        return g * dy
    cdf = 0.5 * (1 + (x * math.sqrt(0.5)).erf())
    pdf = (-0.5 * x * x).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return g * (cdf + x * pdf)


register("gelu(Tensor self, *, str approximate='none') -> Tensor",
         lambda self, approximate: F.gelu(self, approximate=approximate), backward=_gelu_bwd, save=("self",),
         tags=P, inplace=True,
         inplace_eager=lambda self, approximate: self.copy_(F.gelu(self, approximate=approximate)),
         doc="x * Phi(x) (approximate='none') or its tanh approximation (approximate='tanh').")


def _silu_bwd(ctx, g):
    x = ctx.self
    s = x.sigmoid()
    return g * (s * (1 + x * (1 - s)))


register("silu(Tensor self) -> Tensor", lambda self: F.silu(self), backward=_silu_bwd, save=("self",), tags=P,
         inplace=True, inplace_eager=lambda self: F.silu(self, inplace=True), doc="x * sigmoid(x).")


def _softplus_bwd(ctx, g):
    bx = ctx.self * ctx.beta
    return _where(bx > ctx.threshold, g, g * bx.sigmoid())


register("softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor",
         lambda self, beta, threshold: F.softplus(self, beta, threshold), backward=_softplus_bwd, save=("self",),
         tags=P, doc="log(1 + exp(beta * x)) / beta, linear (x) where beta * x > threshold.")

register("leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor",
         lambda self, negative_slope: F.leaky_relu(self, negative_slope),
         backward=lambda ctx, g: _where(ctx.self > 0, g, g * ctx.negative_slope), save=("self",), tags=P,
         inplace=True, inplace_eager=lambda self, negative_slope: F.leaky_relu_(self, negative_slope))

register("elu(Tensor self, Scalar alpha=1.0) -> Tensor", lambda self, alpha: F.elu(self, alpha),
         backward=lambda ctx, g: _where(ctx.self > 0, g, g * ctx.alpha * ctx.self.exp()), save=("self",), tags=P,
         inplace=True, inplace_eager=lambda self, alpha: F.elu_(self, alpha))


def _hardtanh_bwd(ctx, g):
    x = ctx.self
    return _where((x <= ctx.min_val) | (x >= ctx.max_val), 0.0, g)


register("hardtanh(Tensor self, Scalar min_val=-1.0, Scalar max_val=1.0) -> Tensor",
         lambda self, min_val, max_val: F.hardtanh(self, min_val, max_val), backward=_hardtanh_bwd, save=("self",),
         tags=P, inplace=True, inplace_eager=lambda self, min_val, max_val: F.hardtanh_(self, min_val, max_val),
         doc="clamp(x, min_val, max_val); zero gradient at and beyond the bounds (PyTorch's convention).")
register("relu6(Tensor self) -> Tensor", lambda self: F.relu6(self),
         backward=lambda ctx, g: _where((ctx.self <= 0) | (ctx.self >= 6), 0.0, g), save=("self",), tags=P,
         inplace=True, inplace_eager=lambda self: F.relu6(self, inplace=True))


def _logit_bwd(ctx, g):
    x, eps = ctx.self, ctx.eps
    d = g / (x * (1 - x))
    if eps is None:
        return _where((x < 0) | (x > 1), math.nan, d)
    return _where((x < eps) | (x > 1 - eps), 0.0, d)


register("logit(Tensor self, float? eps=None) -> Tensor", backward=_logit_bwd, save=("self",), tags=P,
         inplace=True, doc="log(x / (1 - x)), x first clamped to [eps, 1 - eps] when eps is given.")


# ---- comparisons and predicates (bool results, no gradient) ---------------------------------------
for _name, _refl, _d in (("eq", "__eq__", "__eq__"), ("ne", "__ne__", "__ne__"), ("lt", "__gt__", "__lt__"),
                         ("le", "__ge__", "__le__"), ("gt", "__lt__", "__gt__"), ("ge", "__le__", "__ge__")):
    register(f"{_name}(Tensor self, Tensor other) -> Tensor", _binary(getattr(torch, _name), _refl), tags=CMP,
             dunders=(_d,), doc=f"Elementwise {_d.strip('_')} comparison; a bool tensor.")

for _name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf"):
    register(f"{_name}(Tensor self) -> Tensor", tags=CMP)
register("isclose(Tensor self, Tensor other, float rtol=1e-05, float atol=1e-08, bool equal_nan=False) -> Tensor",
         tags=CMP)


# ---- logic and bitwise ops --------------------------------------------------------------------------
def _as_tensor(v, like):
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v, device=like.device)


def _logical(fn):
    def k(self, other):
        if not isinstance(self, torch.Tensor) and not isinstance(other, torch.Tensor):
            raise TypeError("at least one operand must be a Tensor")
        like = self if isinstance(self, torch.Tensor) else other
        return fn(_as_tensor(self, like), _as_tensor(other, like))
    return k


for _name in ("logical_and", "logical_or", "logical_xor"):
    _f = getattr(torch, _name)
    _fi = getattr(torch.Tensor, _name + "_")
    register(f"{_name}(Tensor self, Tensor other) -> Tensor", _logical(_f), tags=LOGIC, inplace=True,
             inplace_eager=(lambda _fi: lambda self, other: _fi(self, _as_tensor(other, self)))(_fi),
             doc="Truth values (nonzero is True) combined elementwise; a bool tensor.")
register("logical_not(Tensor self) -> Tensor", tags=LOGIC, inplace=True)


def _check_integral(op, *vals):
    for v in vals:
        if isinstance(v, torch.Tensor):
            bad = v.dtype.is_floating_point or v.dtype.is_complex
            what = str(v.dtype).replace("torch.", "")
        else:
            bad = isinstance(v, (float, complex))
            what = type(v).__name__
        if bad:
            hint = "use logical_* ops for truth values, or convert with .long()/.bool()" if "shift" not in op else \
                "multiply by a power of two instead, or convert with .long()"
            raise TypeError(f"{op} is only defined for integer and bool operands, got {what} ({hint})")


def _bitwise(name, reflected):
    fn = _binary(getattr(torch, name), reflected)

    def k(self, other):
        _check_integral(name, self, other)
        return fn(self, other)

    ifn = getattr(torch.Tensor, name + "_")

    def ik(self, other):
        _check_integral(name + "_", self, other)
        return ifn(self, other)
    return k, ik


for _name, _d, _r, _i in (("bitwise_and", "__and__", "__rand__", "__iand__"),
                          ("bitwise_or", "__or__", "__ror__", "__ior__"),
                          ("bitwise_xor", "__xor__", "__rxor__", "__ixor__"),
                          ("bitwise_left_shift", "__lshift__", "__rlshift__", "__ilshift__"),
                          ("bitwise_right_shift", "__rshift__", "__rrshift__", "__irshift__")):
    _k, _ik = _bitwise(_name, _r)
    register(f"{_name}(Tensor self, Tensor other) -> Tensor", _k, tags=LOGIC, dunders=(_d,), rdunders=(_r,),
             inplace=True, inplace_eager=_ik, inplace_dunders=(_i,),
             doc="Bitwise op on integer or bool tensors (bool: the logical op).")


def _bitwise_not_kernel(self):
    _check_integral("bitwise_not", self)
    return torch.bitwise_not(self)


def _bitwise_not_inplace(self):
    _check_integral("bitwise_not_", self)
    return self.bitwise_not_()


register("bitwise_not(Tensor self) -> Tensor", _bitwise_not_kernel, tags=LOGIC, dunders=("__invert__",),
         inplace=True, inplace_eager=_bitwise_not_inplace, doc="~x: bit complement of integers, logical not of bools.")


# ---- in-place fills and copies ----------------------------------------------------------------
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
