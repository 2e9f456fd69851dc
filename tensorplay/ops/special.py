"""Special functions and the samplers of tensorplay.distributions, as op-table entries.

What this module registers and guarantees:

* **Pointwise special functions** (tag ``pointwise``): ``lgamma``, ``digamma``, ``polygamma``,
  ``mvlgamma``, ``erfinv``, ``acosh``/``asinh``/``atanh``, ``sinc``, ``xlogy``, ``logaddexp``,
  ``logaddexp2``, ``copysign``, ``nextafter``, ``heaviside``, ``i0`` and the ``special_*`` family
  (``gammainc``, ``gammaincc``, ``entr``, ``ndtr``, ``ndtri``, ``log_ndtr``, ``erfcx``,
  ``xlog1py``, ``zeta``, the Bessel functions ``i0e``/``i1``/``i1e``/``bessel_j0``/... and
  ``airy_ai``).  The kernel is ATen's function of the same name, so every result (dtype promotion
  of integer inputs included) is bit-identical to PyTorch's.  Derivatives are written in tp ops
  (they differentiate again) with PyTorch's values at the special points (``xlogy``'s zero
  gradient where ``x == 0``, ``sinc``'s 0 at the origin, ``i1``'s 1/2 at 0).  As in PyTorch,
  ``nextafter``, ``heaviside``, the ``bessel_*``/``*modified_bessel_*``/``airy_ai`` functions and
  the samplers' gradient kernels have no derivative, and ``gammainc``/``gammaincc``/``zeta`` are
  differentiable in their second argument only.
* **Samplers** (tag ``random``; ATen's global generator, so ``tp.manual_seed`` makes them
  repeatable and the draws equal PyTorch's after ``torch.manual_seed`` with the same seed):
  ``_standard_gamma`` with its reparameterisation gradient ``_standard_gamma_grad``,
  ``_sample_dirichlet`` with ``_dirichlet_grad``, ``poisson`` and ``binomial``.
* ``tp.special`` (tensorplay/special.py) exposes these under PyTorch's ``torch.special`` names.

Inside a compiled graph, Stax fuses those it has a rule for (op_lowerings/special_rules.py: xlogy,
xlog1py, logaddexp(2), sinc, entr, ndtr, heaviside); the others run as fallbacks (ATen calls) and
the values around them still fuse.
"""
from __future__ import annotations

import math

import torch

from .._tensor import Tensor
from ._helpers import unbroadcast
from .registry import OPS, _to_meta, register

__all__ = []

P = ("pointwise",)
H = ("pointwise", "holomorphic")   # (registry.py: the complex convention)
ND = ("pointwise", "nondifferentiable")
_SQRT_2PI = math.sqrt(2.0 * math.pi)
_SQRT_PI = math.sqrt(math.pi)
_LN2 = math.log(2.0)


def _where(cond, a, b):
    return OPS["where"].fn(cond, a, b)


def _ub(g, x, needed):
    return unbroadcast(g, x) if needed else None


def _fn(name):
    return OPS[name].fn


# ---- gamma family ---------------------------------------------------------------------------------
register("lgamma(Tensor self) -> Tensor", backward=lambda ctx, g: g * _fn("digamma")(ctx.self), save=("self",),
         tags=P, inplace=True, doc="log|Gamma(x)|.")
register("digamma(Tensor self) -> Tensor", backward=lambda ctx, g: g * _fn("polygamma")(1, ctx.self),
         save=("self",), tags=P, inplace=True, doc="d/dx lgamma(x) (psi); -inf at 0, NaN at negative integers.")
register("polygamma(int n, Tensor self) -> Tensor", "torch.polygamma",
         backward=lambda ctx, g: g * _fn("polygamma")(ctx.n + 1, ctx.self), save=("self",), tags=P,
         method=False, doc="The n-th derivative of digamma (n >= 0).")


def _polygamma_method(self, n):
    """``x.polygamma(n)`` is ``polygamma(n, x)`` (PyTorch's method order)."""
    return OPS["polygamma"].fn(n, self)


Tensor.polygamma = _polygamma_method


def _mvlgamma_bwd(ctx, g):
    x, d = ctx.self, 0
    for j in range(ctx.p):
        t = _fn("digamma")(x - j / 2)
        d = t if j == 0 else d + t
    return g * d


register("mvlgamma(Tensor self, int p) -> Tensor", backward=_mvlgamma_bwd, save=("self",), tags=P,
         doc="Multivariate log-gamma of dimension p >= 1 (defined for elements above (p - 1) / 2).")

def _gammainc_bwd(sign):
    def bwd(ctx, g):
        a, x = ctx.self, ctx.other
        if ctx.needs_input_grad[0]:
            raise NotImplementedError("the derivative of the regularized incomplete gamma function with respect to "
                                      "its first argument (a) is not implemented (as in PyTorch)")
        d = (_fn("xlogy")(a - 1, x) - x - _fn("lgamma")(a)).exp()
        return None, unbroadcast(g * d if sign > 0 else -(g * d), x)
    return bwd


register("special_gammainc(Tensor self, Tensor other) -> Tensor", "torch.special.gammainc",
         backward=_gammainc_bwd(1), save=("self", "other"), tags=P, method=False, function=False,
         doc="Regularized lower incomplete gamma P(a, x); differentiable in x.")
register("special_gammaincc(Tensor self, Tensor other) -> Tensor", "torch.special.gammaincc",
         backward=_gammainc_bwd(-1), save=("self", "other"), tags=P, method=False, function=False,
         doc="Regularized upper incomplete gamma Q(a, x) = 1 - P(a, x); differentiable in x.")

# ---- error function family --------------------------------------------------------------------------
register("erfinv(Tensor self) -> Tensor",
         backward=lambda ctx, g: g * (0.5 * _SQRT_PI) * (ctx.result * ctx.result).exp(), save=("result",), tags=P,
         inplace=True, doc="Inverse of erf on (-1, 1); ±inf at ±1.")
register("special_ndtr(Tensor self) -> Tensor", "torch.special.ndtr",
         backward=lambda ctx, g: g * ((-0.5) * ctx.self * ctx.self).exp() * (1.0 / _SQRT_2PI), save=("self",),
         tags=P, method=False, function=False, doc="Standard normal CDF.")
register("special_ndtri(Tensor self) -> Tensor", "torch.special.ndtri",
         backward=lambda ctx, g: g * _SQRT_2PI * (0.5 * ctx.result * ctx.result).exp(), save=("result",),
         tags=P, method=False, function=False, doc="Inverse of the standard normal CDF on (0, 1).")
register("special_log_ndtr(Tensor self) -> Tensor", "torch.special.log_ndtr",
         backward=lambda ctx, g: g * (1.0 / _SQRT_2PI) * (-(ctx.result + 0.5 * ctx.self * ctx.self)).exp(),
         save=("self", "result"), tags=P, method=False, function=False,
         doc="log of the standard normal CDF, accurate far in the left tail.")
register("special_erfcx(Tensor self) -> Tensor", "torch.special.erfcx",
         backward=lambda ctx, g: g * (2 * ctx.self * ctx.result - 2 / _SQRT_PI), save=("self", "result"), tags=P,
         method=False, function=False, doc="Scaled complementary error function exp(x^2) erfc(x).")

# ---- inverse hyperbolic functions, sinc ----------------------------------------------------------------
def _acosh_bwd(ctx, g):
    x = ctx.self
    if x.is_complex():    # PyTorch's branch: 1 / (sqrt(z - 1) sqrt(z + 1)), not 1 / sqrt(z^2 - 1)
        return g * ((x - 1).rsqrt() * (x + 1).rsqrt())
    return g * (x * x - 1).rsqrt()


register("acosh(Tensor self) -> Tensor", backward=_acosh_bwd, save=("self",), tags=H, inplace=True)
register("asinh(Tensor self) -> Tensor", backward=lambda ctx, g: g * (ctx.self * ctx.self + 1).rsqrt(),
         save=("self",), tags=H, inplace=True)
register("atanh(Tensor self) -> Tensor", backward=lambda ctx, g: g / (1 - ctx.self * ctx.self), save=("self",),
         tags=H, inplace=True)


def _sinc_bwd(ctx, g):
    x = ctx.self
    px = math.pi * x
    d = (px * px.cos() - px.sin()) / (px * x)
    return g * _where(x == 0, 0.0, d)


register("sinc(Tensor self) -> Tensor", backward=_sinc_bwd, save=("self",), tags=H, inplace=True,
         doc="sin(pi x) / (pi x), 1 at 0.")

# ---- entropy and the x log y family ---------------------------------------------------------------------
register("special_entr(Tensor self) -> Tensor", "torch.special.entr",
         backward=lambda ctx, g: g * -(1 + ctx.self.log()), save=("self",), tags=P, method=False, function=False,
         doc="-x log x for x > 0, 0 at 0, -inf for x < 0.")


def _xlogy_bwd(log_name, shift):
    def bwd(ctx, g):
        x, y = ctx.self, ctx.other
        n = ctx.needs_input_grad
        gx = gy = None
        if n[0]:
            gx = unbroadcast(_where((x == 0) & (y <= -shift), 0.0, _fn(log_name)(g, y)), x)
        if n[1]:
            gy = unbroadcast(g * x / (y + shift) if shift else g * x / y, y)
        return gx, gy
    return bwd


register("xlogy(Tensor self, Tensor other) -> Tensor", "torch.xlogy", backward=_xlogy_bwd("xlogy", 0),
         save=("self", "other"), tags=P, inplace=True, doc="x * log(y), 0 where x == 0 (unless y is NaN).")
register("special_xlog1py(Tensor self, Tensor other) -> Tensor", "torch.special.xlog1py",
         backward=_xlogy_bwd("special_xlog1py", 1), save=("self", "other"), tags=P, method=False, function=False,
         doc="x * log1p(y), 0 where x == 0 (unless y is NaN).")


def _logaddexp_bwd(base_exp):
    def bwd(ctx, g):
        a, b = ctx.self, ctx.other
        n = ctx.needs_input_grad
        return (_ub(g / (1 + base_exp(b - a)), a, n[0]) if n[0] else None,
                _ub(g / (1 + base_exp(a - b)), b, n[1]) if n[1] else None)
    return bwd


register("logaddexp(Tensor self, Tensor other) -> Tensor", backward=_logaddexp_bwd(lambda d: d.exp()),
         save=("self", "other"), tags=H, doc="log(exp(x) + exp(y)) without overflow.")
register("logaddexp2(Tensor self, Tensor other) -> Tensor", backward=_logaddexp_bwd(lambda d: d.exp2()),
         save=("self", "other"), tags=P, doc="log2(2^x + 2^y) without overflow.")


def _copysign_bwd(ctx, g):
    x = ctx.self
    n = ctx.needs_input_grad
    gx = _ub(_where(x == 0, 0.0, g * (ctx.result / x)), x, n[0]) if n[0] else None
    gy = _ub(g.new_zeros(g.shape), ctx.other, n[1]) if n[1] else None
    return gx, gy


def _copysign_meta(self, other):
    """ATen's meta of copysign does not follow the input layout the way the CPU kernel does; mul is
    the same broadcast with a structured meta, then copysign's float result dtype."""
    a, b = _to_meta(self), _to_meta(other)
    out = torch.mul(a, b)
    dt = torch.copysign(torch.empty(0, dtype=a.dtype, device="meta"),
                        torch.empty(0, dtype=out.dtype, device="meta")).dtype
    return out.to(dt)


register("copysign(Tensor self, Tensor other) -> Tensor", meta=_copysign_meta, backward=_copysign_bwd,
         save=("self", "other", "result"),
         tags=P, inplace=True, doc="|x| with the sign (bit) of y; the gradient flows to x only.")
register("nextafter(Tensor self, Tensor other) -> Tensor", tags=ND, inplace=True,
         doc="The next floating-point value after x toward y.")
register("heaviside(Tensor self, Tensor values) -> Tensor", tags=ND, inplace=True,
         doc="0 for x < 0, values where x == 0, 1 for x > 0.")

# ---- modified Bessel functions -----------------------------------------------------------------------
register("i0(Tensor self) -> Tensor", backward=lambda ctx, g: g * _fn("special_i1")(ctx.self), save=("self",),
         tags=P, inplace=True, doc="Modified Bessel function of the first kind, order 0.")
register("special_i0e(Tensor self) -> Tensor", "torch.special.i0e",
         backward=lambda ctx, g: g * (_fn("special_i1e")(ctx.self) - ctx.self.sign() * ctx.result),
         save=("self", "result"), tags=P, method=False, function=False, doc="exp(-|x|) i0(x).")
register("special_i1(Tensor self) -> Tensor", "torch.special.i1",
         backward=lambda ctx, g: g * _where(ctx.self == 0, 0.5, _fn("i0")(ctx.self) - ctx.result / ctx.self),
         save=("self", "result"), tags=P, method=False, function=False,
         doc="Modified Bessel function of the first kind, order 1.")
register("special_i1e(Tensor self) -> Tensor", "torch.special.i1e",
         backward=lambda ctx, g: g * _where(ctx.self == 0, 0.5, _fn("special_i0e")(ctx.self)
                                            - ctx.result * (ctx.self.sign() + 1 / ctx.self)),
         save=("self", "result"), tags=P, method=False, function=False, doc="exp(-|x|) i1(x).")


# Bessel and Airy functions: no derivative in PyTorch (their results never require grad), none here
for _name in ("bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
              "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
              "spherical_bessel_j0", "airy_ai"):
    register(f"special_{_name}(Tensor self) -> Tensor", f"torch.special.{_name}", tags=ND, method=False,
             function=False, doc=f"torch.special.{_name}.")


def _zeta_bwd(ctx, g):
    if ctx.needs_input_grad[0]:
        raise NotImplementedError("the derivative of zeta with respect to its first argument (x) is not implemented "
                                  "(as in PyTorch)")
    x, q = ctx.self, ctx.other
    return None, unbroadcast(g * -x * _fn("special_zeta")(x + 1.0, q), q)


register("special_zeta(Tensor self, Tensor other) -> Tensor", "torch.special.zeta", backward=_zeta_bwd,
         save=("self", "other"), tags=P, method=False, function=False,
         doc="Hurwitz zeta function sum_k (k + q)^-x; differentiable in q.")


# ---- samplers of tensorplay.distributions ----------------------------------------------------------------
R = ("random", "nondeterministic")


def _standard_gamma_jvp(args, outs, tangents):
    t = tangents[0]
    return None if t is None else t * OPS["_standard_gamma_grad"].fn(args[0], outs[0])


register("_standard_gamma(Tensor self, Generator? generator=None) -> Tensor", "torch._standard_gamma",
         meta=lambda self, generator=None: _like_meta(self),
         backward=lambda ctx, g: (g * OPS["_standard_gamma_grad"].fn(ctx.self, ctx.result)),
         jvp=_standard_gamma_jvp, save=("self", "result"), tags=R, method=False,
         doc="Gamma(concentration, 1) draws; the gradient is the implicit reparameterisation d sample / d alpha.")
def _like_meta(*tensors):
    """Meta of the samplers and their gradient kernels ATen has no meta for: the broadcast of the
    inputs, in their dtype and the layout of a structured pointwise op."""
    out = _to_meta(tensors[0])
    for t in tensors[1:]:
        out = torch.mul(out, _to_meta(t))
    return out


register("_standard_gamma_grad(Tensor self, Tensor output) -> Tensor", "torch._standard_gamma_grad", tags=ND,
         meta=_like_meta,
         method=False, doc="d output / d alpha of a Gamma(alpha, 1) draw output, at fixed CDF value.")


def _dirichlet_bwd(ctx, g):
    x, alpha = ctx.result, ctx.self
    total = alpha.sum(-1, True).expand(alpha.shape)
    d = OPS["_dirichlet_grad"].fn(x, alpha, total)
    return d * (g - (x * g).sum(-1, True))


def _dirichlet_jvp(args, outs, tangents):
    t = tangents[0]
    if t is None:
        return None
    alpha, x = args[0], outs[0]
    d = OPS["_dirichlet_grad"].fn(x, alpha, alpha.sum(-1, True).expand(alpha.shape)) * t
    return d - x * d.sum(-1, True)


register("_sample_dirichlet(Tensor self, Generator? generator=None) -> Tensor", "torch._sample_dirichlet",
         meta=lambda self, generator=None: _like_meta(self), backward=_dirichlet_bwd, jvp=_dirichlet_jvp,
         save=("self", "result"), tags=R, method=False,
         doc="Dirichlet(concentration) draws along the last dim, with the implicit reparameterisation gradient.")
register("_dirichlet_grad(Tensor x, Tensor alpha, Tensor total) -> Tensor", "torch._dirichlet_grad", tags=ND,
         meta=_like_meta,
         method=False, doc="d x / d alpha of Beta(alpha, total - alpha) draws x (Dirichlet's pathwise gradient).")
register("poisson(Tensor self, Generator? generator=None) -> Tensor", "torch.poisson",
         meta=lambda self, generator=None: _like_meta(self), tags=R + ("nondifferentiable",), method=False,
         doc="Poisson(rate) draws (float, like rate).")
register("binomial(Tensor count, Tensor prob, Generator? generator=None) -> Tensor", "torch.binomial",
         meta=lambda count, prob, generator=None: _like_meta(count, prob),
         tags=R + ("nondifferentiable",), method=False, doc="Binomial(count, prob) draws (float).")
