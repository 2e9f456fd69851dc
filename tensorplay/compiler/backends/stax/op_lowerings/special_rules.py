"""Lowering rules of the special functions (tensorplay/ops/special.py) that the ``ops`` interface can
write: each is a Pointwise value fused with its neighbours, with eager's values at the special
points (NaN, ±inf, 0).

* ``xlogy(x, y) = x log y`` and ``special_xlog1py(x, y) = x log1p(y)``: 0 where x == 0 unless y is
  NaN;
* ``logaddexp(a, b) = max + log1p(exp(-|a - b|))`` (``logaddexp2`` in base 2), ``a`` where a == b
  is infinite (the difference would be NaN);
* ``sinc(x) = sin(pi x) / (pi x)``, 1 at 0;
* ``special_entr(x) = -x log x`` (0 at 0, -inf below, NaN for NaN);
* ``special_ndtr(x) = erfc(-x / sqrt 2) / 2``;
* ``heaviside(x, v)``: v where x == 0, else (x > 0);
* the inverse hyperbolics in their cancellation-free forms: ``asinh(x) = sign(x) log1p(|x| + |x|
  (|x| / (1 + hypot(1, x))))``, ``acosh(x) = log1p((x - 1) + sqrt((x - 1)(x + 1)))``,
  ``atanh(x) = sign(x) log1p(2|x| / (1 - |x|)) / 2``; past 2^28 (where the squares would lose the
  argument or overflow) ``asinh`` and ``acosh`` are ``log|x| + log 2``.  NaN, ±inf, ±0 and the
  domain edges (acosh(1) = 0, atanh(±1) = ±inf, NaN outside the domain) are eager's.  Complex
  inputs fall back (the rules are real formulas).

They compute in the result's dtype, like eager, and agree with it to the backend's error model for
log, exp, sin and erfc (docs/stax.md).  The others (lgamma, digamma, polygamma, erfinv, Bessel
functions, copysign -- the ``ops`` interface cannot read a NaN's sign --, nextafter...) have no
rule: inside a compiled graph they are ATen calls (fallback kernels).
"""
from __future__ import annotations

import math

from ..ops_handler import ops
from .pointwise_rules import pointwise
from .registry import Unsupported, cdt, register_lowering


def _c(v):
    return ops.constant(v, cdt())


def _xlog(log):
    def f(x, y):
        zero_x = ops.logical_and(ops.eq(x, _c(0)), ops.logical_not(ops.isnan(y)))
        return ops.where(zero_x, _c(0), ops.mul(x, getattr(ops, log)(y)))
    return f


register_lowering("xlogy")(pointwise(_xlog("log")))
register_lowering("special_xlog1py")(pointwise(_xlog("log1p")))


def _logaddexp(exp, scale):
    def f(a, b):
        same_inf = ops.logical_and(ops.isinf(a), ops.eq(a, b))
        m = ops.maximum(a, b)
        t = ops.log1p(getattr(ops, exp)(ops.neg(ops.abs(ops.sub(a, b)))))
        return ops.where(same_inf, a, ops.add(m, t if scale == 1 else ops.mul(t, _c(scale))))
    return f


register_lowering("logaddexp")(pointwise(_logaddexp("exp", 1)))
register_lowering("logaddexp2")(pointwise(_logaddexp("exp2", 1 / math.log(2.0))))


@register_lowering("sinc")
def _sinc(x):
    def f(x):
        px = ops.mul(x, _c(math.pi))
        return ops.where(ops.eq(x, _c(0)), _c(1), ops.truediv(ops.sin(px), px))
    return pointwise(f)(x)


@register_lowering("special_entr")
def _entr(x):
    def f(x):
        pos = ops.neg(ops.mul(x, ops.log(x)))
        neg = ops.where(ops.eq(x, _c(0)), _c(0), _c(-math.inf))
        return ops.where(ops.isnan(x), x, ops.where(ops.gt(x, _c(0)), pos, neg))
    return pointwise(f)(x)


register_lowering("special_ndtr")(pointwise(lambda x: ops.mul(ops.erfc(ops.mul(x, _c(-math.sqrt(0.5)))), _c(0.5))))
register_lowering("heaviside")(pointwise(
    lambda x, v: ops.where(ops.eq(x, _c(0)), v, ops.to_dtype(ops.gt(x, _c(0)), cdt()))))


_BIG = 2.0 ** 28     # past it: asinh / acosh = log|x| + log 2 to within rounding


def _real_only(name, f):
    def rule(x):
        if x.dtype.is_complex:
            raise Unsupported(f"{name} of a complex tensor")
        return pointwise(f)(x)
    return rule


def _odd(x, r):
    """An odd function's value from ``r = f(|x|)``: -r below 0, x itself at ±0 (its sign kept), r
    otherwise (NaN stays NaN)."""
    return ops.where(ops.lt(x, _c(0)), ops.neg(r), ops.where(ops.eq(x, _c(0)), x, r))


def _asinh(x):
    a = ops.abs(x)
    small = ops.log1p(ops.add(a, ops.mul(a, ops.truediv(a, ops.add(_c(1), ops.hypot(_c(1), a))))))
    return _odd(x, ops.where(ops.gt(a, _c(_BIG)), ops.add(ops.log(a), _c(math.log(2.0))), small))


def _acosh(x):
    xm1 = ops.sub(x, _c(1))
    small = ops.log1p(ops.add(xm1, ops.sqrt(ops.mul(xm1, ops.add(x, _c(1))))))
    r = ops.where(ops.gt(x, _c(_BIG)), ops.add(ops.log(x), _c(math.log(2.0))), small)
    return ops.where(ops.lt(x, _c(1)), _c(math.nan), r)     # (below 1 the sum could cancel to a number)


def _atanh(x):
    a = ops.abs(x)
    return _odd(x, ops.mul(ops.log1p(ops.truediv(ops.mul(a, _c(2)), ops.sub(_c(1), a))), _c(0.5)))


register_lowering("asinh")(_real_only("asinh", _asinh))
register_lowering("acosh")(_real_only("acosh", _acosh))
register_lowering("atanh")(_real_only("atanh", _atanh))
