"""Reductions and scans: sum, mean, nansum, nanmean, prod, amax/amin, aminmax, max/min, median,
nanmedian, mode, argmax/argmin, var/std (and var_mean/std_mean), logsumexp, any/all, norm,
count_nonzero, cumsum/cumprod, cummax/cummin (chapter §6.7, §8.3).

Conventions (those of PyTorch, which is the reference):

* ``dim`` accepts an int, a list/tuple of ints, or None (and, where PyTorch's default is ``[]``,
  the empty list) meaning *every* dimension; ``keepdim=True`` keeps each reduced dimension with
  size 1.  Negative dims count from the end; an out-of-range dim raises an ``IndexError`` whose
  message starts with ``tp.<op>(...)``.
* ``dtype=`` (sum, mean, prod, cumsum, cumprod, norm) casts the input before the computation.
  ``sum``/``prod``/``cumsum`` of bool or integer tensors produce int64; ``mean`` of an integer tensor
  is an error (as in PyTorch).
* Reductions over an empty dim: ``sum`` gives 0, ``prod`` 1, ``mean`` NaN; ``amax``/``max`` raise.

Derivative formulas (all written in tp ops, so they are differentiable again and traceable):

* the gradient of a reduction is the output gradient broadcast back over the reduced dims
  (:func:`_restore` re-inserts the dims removed by ``keepdim=False``), times a local factor;
* ``prod`` is exact with zeros in the input: with ``P`` the product of the non-zero entries of a
  slice, ``Z`` the product of its zero entries and ``c`` their count, ``d prod / d x_i`` is
  ``P / x_i * Z`` for a non-zero ``x_i`` (0 as soon as the slice holds a zero), ``P`` for the only
  zero, ``P * (other zero)`` when there are exactly two zeros, and 0 otherwise.  Every branch is a
  polynomial identity in ``x``, so second derivatives are right as well;
* ``amax``/``amin``/``aminmax``/``max()``/``min()``/``median()`` split the gradient evenly among
  ties; ``max(dim)``/``min(dim)``/``median(dim)``/``mode`` route it to the returned index, and
  ``cummax``/``cummin`` accumulate it at the returned indices (``scatter_add``);
* ``var``/``std`` use ``2 (x - mean) / (N - correction)``; ``std`` has gradient 0 where it is 0;
* ``norm`` follows PyTorch's cases (p = 0, 1, 2, inf, p < 1, p < 2, p >= 2); the 2-norm of a zero
  vector has gradient 0, never NaN (denominators are made safe *before* dividing, so that
  double backward is NaN-free as well);
* ``cumsum`` backward is a reversed cumsum (the private op ``_reverse_cumsum``, whose own backward
  is ``cumsum``); ``cumprod`` backward is exact with zeros (entries after the first zero of a
  slice get 0, the first zero gets ``prod(before) * sum_k g_k prod(x between)``); under
  ``create_graph=True`` with zeros in the input it switches, like PyTorch, to an O(n^2) explicit
  polynomial whose own derivative is the true second derivative.

``max``/``min`` are three ops in the table (like ATen's overloads): ``max`` (whole tensor ->
Tensor), ``max_dim`` (-> named tuple ``(values, indices)``) and the pointwise ``maximum``; the
Python-level ``tp.max`` / ``Tensor.max`` dispatch among them (:data:`EXTRA_FUNCTIONS`).
"""
from __future__ import annotations

import collections
import math

import torch

from ._helpers import sgn
from .registry import OPS, register

__all__ = []

RD = ("reduction",)
RDH = ("reduction", "holomorphic")   # (registry.py: the complex convention)
RDS = ("reduction", "sort")    # median, mode: reductions computed by sorting or selection
ND = ("reduction", "nondifferentiable")


# ---------------------------------------------------------------------------------------------
# helpers for derivative formulas
# ---------------------------------------------------------------------------------------------
def _op(name):
    """The generated function of op ``name`` (looked up when a formula runs, so that ops from
    other families may be registered later)."""
    op = OPS.get(name)
    if op is None:
        raise NotImplementedError(f"tensorplay: this derivative formula needs tp.{name}, which is not in "
                                  f"the op table")
    return op.fn


def _rdims(dim, ndim):
    """Reduced dims as a sorted list of non-negative ints (None or [] -> all dims)."""
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    dim = list(dim)
    if not dim:
        return list(range(ndim))
    if ndim == 0:
        return []
    return sorted(d % ndim for d in dim)


def _restore(g, ndim, dim, keepdim):
    """Re-insert the reduced dims of a reduction output (size 1), so that it broadcasts against
    the input."""
    if keepdim or ndim == 0:
        return g
    for d in _rdims(dim, ndim):
        g = g.unsqueeze(d)
    return g


def _expand_back(g, in_shape, dim, keepdim):
    """Broadcast the gradient of a reduction over ``dim`` back to ``in_shape``."""
    return _restore(g, len(in_shape), dim, keepdim).expand(in_shape)


def _numel_over(shape, dim):
    n = 1
    for d in _rdims(dim, len(shape)):
        n *= shape[d]
    return n


def _const(like, v, dtype=None):
    """A 0-d constant with ``like``'s dtype and device (no gradient)."""
    return like.new_full((), v, dtype=dtype or like.dtype)


def _where(c, a, b):
    return _op("where")(c, a, b)


def _eq(a, b):
    return _op("eq")(a, b)


def _ne(a, b):
    return _op("ne")(a, b)


def _safe_div(num, den):
    """``num / den`` where ``den != 0`` and 0 where ``den == 0``, NaN-free in double backward."""
    z = _eq(den, 0)
    return _where(z, _const(num, 0), num / _where(z, _const(den, 1), den))


def _isnan(x):
    return _ne(x, x)


# ---------------------------------------------------------------------------------------------
# sum, mean
# ---------------------------------------------------------------------------------------------
def _all_dims_kernel(torch_fn):
    def k(self, dim, keepdim, dtype):
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            if keepdim:
                return torch_fn(self, dim=list(range(self.dim())), keepdim=True, dtype=dtype)
            return torch_fn(self, dtype=dtype)
        return torch_fn(self, dim, keepdim=keepdim, dtype=dtype)
    return k


register("sum(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
         _all_dims_kernel(torch.sum),
         backward=lambda ctx, g: _expand_back(g, ctx.self.shape, ctx.dim, ctx.keepdim), save=(), tags=RD)


def _mean_bwd(ctx, g):
    shape = ctx.self.shape
    return _expand_back(g, shape, ctx.dim, ctx.keepdim) / max(_numel_over(shape, ctx.dim), 1)


register("mean(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
         _all_dims_kernel(torch.mean), backward=_mean_bwd, save=(), tags=RD)

register("nansum(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
         _all_dims_kernel(torch.nansum),
         backward=lambda ctx, g: _where(_isnan(ctx.self), _const(g, 0),
                                        _expand_back(g, ctx.self.shape, ctx.dim, ctx.keepdim)),
         save=("self",), tags=RD)


def _nanmean_bwd(ctx, g):
    x = ctx.self
    keep = _eq(x, x)  # not NaN
    cnt = keep.sum(_rdims(ctx.dim, x.dim()), keepdim=True)
    g = _restore(g, x.dim(), ctx.dim, ctx.keepdim)
    return _where(keep, g / cnt, _const(g, 0))


register("nanmean(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
         _all_dims_kernel(torch.nanmean), backward=_nanmean_bwd, save=("self",), tags=RD)


# ---------------------------------------------------------------------------------------------
# prod
# ---------------------------------------------------------------------------------------------
def _prod_kernel(self, dim, keepdim, dtype):
    if dim is None:
        r = torch.prod(self, dtype=dtype)
        return r.reshape([1] * self.dim()) if keepdim else r
    return torch.prod(self, dim, keepdim=keepdim, dtype=dtype)


def _prod_grad(x, g, dim):
    """d prod(x, dim) / dx times ``g`` (``g`` already broadcastable, dims kept); exact with zeros."""
    dims = _rdims(dim, x.dim())
    zero = _eq(x, 0)
    one = _const(x, 1)
    x_nz = _where(zero, one, x)                  # non-zero entries, zeros replaced by 1
    x_z = _where(zero, x, one)                   # zero entries (value 0, derivative kept)
    P = x_nz.prod(dims[0], keepdim=True) if len(dims) == 1 else x_nz.reshape(-1).prod().reshape([1] * x.dim())
    Z = x_z.prod(dims[0], keepdim=True) if len(dims) == 1 else x_z.reshape(-1).prod().reshape([1] * x.dim())
    cnt = zero.sum(dims, keepdim=True)
    S0 = _where(zero, x, _const(x, 0)).sum(dims, keepdim=True)   # sum of zero entries: 0, slope 1
    d_nz = P / x_nz * Z
    d_z = _where(_eq(cnt, 1), P, _where(_eq(cnt, 2), P * (S0 - x), _const(x, 0)))
    return g * _where(zero, d_z, d_nz)


def _prod_bwd(ctx, g):
    x = ctx.self
    if x.dim() == 0:
        return g.to(x.dtype) if g.dtype != x.dtype else g
    g = _restore(g, x.dim(), ctx.dim, ctx.keepdim)
    if x.dtype != g.dtype:
        x = x.to(g.dtype)
    return _prod_grad(x, g, ctx.dim)


register("prod(Tensor self, int? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", _prod_kernel,
         backward=_prod_bwd, save=("self",), tags=RDH)


# ---------------------------------------------------------------------------------------------
# amax / amin, max / min, argmax / argmin
# ---------------------------------------------------------------------------------------------
def _amaxmin_bwd(ctx, g):
    x, r = ctx.self, ctx.result
    dims = _rdims(ctx.dim, x.dim())
    g = _restore(g, x.dim(), ctx.dim, ctx.keepdim)
    r = _restore(r, x.dim(), ctx.dim, ctx.keepdim)
    mask = _eq(r, x)
    cnt = mask.sum(dims, keepdim=True) if x.dim() else mask.sum()
    return (g / cnt) * mask


for _n in ("amax", "amin"):
    register(f"{_n}(Tensor self, int[] dim=[], bool keepdim=False) -> Tensor",
             (lambda f: lambda self, dim, keepdim: f(self, dim, keepdim))(getattr(torch, _n)),
             backward=_amaxmin_bwd, save=("self", "result"), tags=RD)


def _evenly_bwd(ctx, g):
    """max()/min() over everything: split g evenly among the entries equal to the result (NaN
    entries when the result is NaN)."""
    x, r = ctx.self, ctx.result
    mask = _op("logical_or")(_eq(x, r), _op("logical_and")(_isnan(x), _isnan(r)))
    return mask * (g / mask.sum())


register("max(Tensor self) -> Tensor", lambda self: torch.max(self), backward=_evenly_bwd,
         save=("self", "result"), tags=RD, function=False, method=False)
register("min(Tensor self) -> Tensor", lambda self: torch.min(self), backward=_evenly_bwd,
         save=("self", "result"), tags=RD, function=False, method=False)


def _select_bwd(x_shape, g, idx, dim, keepdim):
    """Gradient of a value-selecting reduction (max/min/kthvalue/median along ``dim``): ``g`` goes
    to the selected index, zeros elsewhere."""
    n = len(x_shape)
    if n == 0:
        return g
    if not keepdim:
        g = g.unsqueeze(dim)
        idx = idx.unsqueeze(dim)
    return g.new_zeros(x_shape).scatter(dim, idx, g)


def _max_dim_bwd(ctx, gv, gi):
    return _select_bwd(ctx.self.shape, gv, ctx.result[1], ctx.dim, ctx.keepdim)


for _n in ("max", "min"):
    register(f"{_n}_dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
             (lambda f: lambda self, dim, keepdim: tuple(f(self, dim, keepdim)))(getattr(torch, _n)),
             backward=_max_dim_bwd, save=("result",), tags=RD, function=False, method=False)
    OPS[f"{_n}_dim"].returns_named = collections.namedtuple(_n, ["values", "indices"])  # like torch.return_types

register("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", tags=ND)
register("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", tags=ND)


def _make_maxmin(kind):
    full, along, pointwise = kind, kind + "_dim", {"max": "maximum", "min": "minimum"}[kind]

    def f(input, dim=None, keepdim=False, *, other=None):
        from .._tensor import Tensor
        if other is None and isinstance(dim, (Tensor, torch.Tensor)):
            other, dim = dim, None
        if other is not None:
            if keepdim:
                raise TypeError(f"tp.{kind}(input, other): keepdim is only valid with an int dim")
            op = OPS.get(pointwise)
            if op is None:
                raise NotImplementedError(f"tp.{kind}(input, other) needs tp.{pointwise}, which is not registered")
            return op.fn(input, other)
        if dim is None:
            if keepdim:
                raise TypeError(f"tp.{kind}(input): keepdim=True needs a dim")
            return OPS[full].fn(input)
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"tp.{kind}: dim must be an int, got {type(dim).__name__}")
        return OPS[along].fn(input, dim, keepdim)
    f.__name__ = f.__qualname__ = kind
    f.__module__ = "tensorplay"
    f.__doc__ = (f"{kind}(input) -> Tensor; {kind}(input, dim, keepdim=False) -> (values, indices); "
                 f"{kind}(input, other) -> {pointwise}(input, other).")
    return f


_max, _min = _make_maxmin("max"), _make_maxmin("min")


# median / nanmedian (lower median; like max: whole tensor -> Tensor, along a dim -> (values, indices)),
# mode, aminmax
for _n in ("median", "nanmedian"):
    register(f"{_n}(Tensor self) -> Tensor", (lambda f: lambda self: f(self))(getattr(torch, _n)),
             backward=_evenly_bwd, save=("self", "result"), tags=RDS, function=False, method=False)
    register(f"{_n}_dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
             (lambda f: lambda self, dim, keepdim: tuple(f(self, dim, keepdim)))(getattr(torch, _n)),
             backward=_max_dim_bwd, save=("result",), tags=RDS, function=False, method=False)
    OPS[f"{_n}_dim"].returns_named = collections.namedtuple(_n, ["values", "indices"])


def _make_median(kind):
    def f(input, dim=None, keepdim=False):
        if dim is None:
            if keepdim:
                raise TypeError(f"tp.{kind}(input): keepdim=True needs a dim")
            return OPS[kind].fn(input)
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"tp.{kind}: dim must be an int, got {type(dim).__name__}")
        return OPS[kind + "_dim"].fn(input, dim, keepdim)
    f.__name__ = f.__qualname__ = kind
    f.__module__ = "tensorplay"
    f.__doc__ = f"{kind}(input) -> Tensor (lower median); {kind}(input, dim, keepdim=False) -> (values, indices)."
    return f


register("mode(Tensor self, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)",
         lambda self, dim, keepdim: tuple(torch.mode(self, dim, keepdim)),
         backward=_max_dim_bwd, save=("result",), tags=RDS)
OPS["mode"].returns_named = collections.namedtuple("mode", ["values", "indices"])


def _aminmax_kernel(self, dim, keepdim):
    return tuple(torch.aminmax(self, dim=dim, keepdim=keepdim))


def _aminmax_bwd(ctx, gmin, gmax):
    x = ctx.self
    rmin, rmax = ctx.result
    out = None
    for g, r in ((gmin, rmin), (gmax, rmax)):
        g = _restore(g, x.dim(), ctx.dim, ctx.keepdim)
        r = _restore(r, x.dim(), ctx.dim, ctx.keepdim)
        mask = _eq(r, x)
        cnt = mask.sum(_rdims(ctx.dim, x.dim()), keepdim=True)
        term = (g / cnt) * mask
        out = term if out is None else out + term
    return out


register("aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)", _aminmax_kernel,
         backward=_aminmax_bwd, save=("self", "result"), tags=RD)
OPS["aminmax"].returns_named = collections.namedtuple("aminmax", ["min", "max"])


# ---------------------------------------------------------------------------------------------
# var / std / var_mean / std_mean
# ---------------------------------------------------------------------------------------------
def _correction(name, dim, unbiased, correction):
    if isinstance(dim, bool):  # legacy var(x, unbiased)
        if unbiased is not None:
            raise TypeError(f"tp.{name}: unbiased given twice")
        dim, unbiased = None, dim
    if correction is not None and unbiased is not None:
        raise ValueError(f"tp.{name}: give either correction= or unbiased=, not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return dim, correction


def _var_kernel(fn, name):
    def k(self, dim, unbiased, keepdim, correction):
        dim, c = _correction(name, dim, unbiased, correction)
        if dim is None:
            if keepdim:
                return fn(self, list(range(self.dim())), correction=c, keepdim=True)
            return fn(self, correction=c)
        return fn(self, dim, correction=c, keepdim=keepdim)
    return k


def _var_grad(g, x, dim, c, keepdim):
    if isinstance(dim, bool):
        dim = None
    g = _restore(g, x.dim(), dim, keepdim)
    dof = _numel_over(x.shape, dim) - c
    scale = 2.0 / dof if dof != 0 else math.inf
    return (scale * g) * (x - x.mean(_rdims(dim, x.dim()), keepdim=True))


def _var_args(ctx):
    return _correction(ctx._op.name, ctx.dim, ctx.unbiased, ctx.correction)


def _var_bwd(ctx, g):
    dim, c = _var_args(ctx)
    return _var_grad(g, ctx.self, dim, c, ctx.keepdim)


def _std_to_var_grad(g, std):
    return _safe_div(g, 2 * std)


def _std_bwd(ctx, g):
    dim, c = _var_args(ctx)
    return _var_grad(_std_to_var_grad(g, ctx.result), ctx.self, dim, c, ctx.keepdim)


def _moment_mean_bwd(ctx, gv, gm, std):
    dim, c = _var_args(ctx)
    x = ctx.self
    if std:
        gv = _std_to_var_grad(gv, ctx.result[0])
    return _var_grad(gv, x, dim, c, ctx.keepdim) + _expand_back(gm, x.shape, dim, ctx.keepdim) / max(
        _numel_over(x.shape, dim), 1)


_VAR = "(Tensor self, int[]? dim=None, bool? unbiased=None, bool keepdim=False, *, Scalar? correction=None)"
register(f"var{_VAR} -> Tensor", _var_kernel(torch.var, "var"), backward=_var_bwd, save=("self",), tags=RD)
register(f"std{_VAR} -> Tensor", _var_kernel(torch.std, "std"), backward=_std_bwd, save=("self", "result"),
         tags=RD)
register(f"var_mean{_VAR} -> (Tensor var, Tensor mean)", _var_kernel(torch.var_mean, "var_mean"),
         backward=lambda ctx, gv, gm: _moment_mean_bwd(ctx, gv, gm, False), save=("self",), tags=RD)
register(f"std_mean{_VAR} -> (Tensor std, Tensor mean)", _var_kernel(torch.std_mean, "std_mean"),
         backward=lambda ctx, gv, gm: _moment_mean_bwd(ctx, gv, gm, True), save=("self", "result"), tags=RD)


# ---------------------------------------------------------------------------------------------
# logsumexp, any / all, count_nonzero
# ---------------------------------------------------------------------------------------------
def _lse_kernel(self, dim, keepdim):
    if dim is None:
        dim = list(range(self.dim()))
    return torch.logsumexp(self, dim, keepdim)


def _lse_bwd(ctx, g):
    x = ctx.self
    g = _restore(g, x.dim(), ctx.dim, ctx.keepdim)
    r = _restore(ctx.result, x.dim(), ctx.dim, ctx.keepdim)
    return g * (x - r).exp()


register("logsumexp(Tensor self, int[]? dim, bool keepdim=False) -> Tensor", _lse_kernel, backward=_lse_bwd,
         save=("self", "result"), tags=RD)


def _anyall_kernel(f):
    def k(self, dim, keepdim):
        if isinstance(dim, (list, tuple)) and len(dim) == 0:
            dim = None
        return f(self, dim, keepdim=keepdim)
    return k


register("any(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", _anyall_kernel(torch.any), tags=ND)
register("all(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", _anyall_kernel(torch.all), tags=ND)
register("count_nonzero(Tensor self, int[]? dim=None) -> Tensor", tags=ND)


# ---------------------------------------------------------------------------------------------
# norm
# ---------------------------------------------------------------------------------------------
def _norm_kernel(self, p, dim, keepdim, dtype):
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        dim = None
    if dim is None and keepdim:
        dim = list(range(self.dim()))
    return torch.norm(self, p, dim, keepdim, dtype=dtype)


def _norm_p(p, name="norm"):
    if p is None or p == "fro":
        return 2.0
    if isinstance(p, str):
        raise NotImplementedError(f"tp.{name}: the gradient of the {p!r} norm is not implemented "
                                  f"(use tp.linalg for matrix norms)")
    return float(p)


def _norm_grad(x, g, r, p, dims):
    """Gradient of the vector p-norm ``r`` of ``x`` over ``dims`` (g and r have the dims kept)."""
    sign = sgn          # (x / |x| for a complex x)
    pw = _op("pow")
    if p == 0:
        return x.new_zeros(x.shape) * g
    if p == 1:
        return sign(x) * g
    if p == 2:
        return x * _safe_div(g, r)
    if math.isinf(p):
        xa = x.abs()
        mask = _op("logical_or")(_eq(xa, r), _isnan(xa))
        return sign(x) * ((g / mask.sum(dims, keepdim=True)) * mask)
    xa = x.abs()
    if p < 1:
        zero = _eq(x, 0)
        scaled = sign(x) * _where(zero, _const(x, 0), pw(_where(zero, _const(x, 1), xa), p - 1))
        return scaled * g * pw(r, 1 - p)
    scaled = sign(x) * pw(xa, p - 1) if p < 2 else x * pw(xa, p - 2)
    return scaled * _safe_div(g, pw(r, p - 1))


def _norm_bwd(ctx, g):
    x = ctx.self
    p = _norm_p(ctx.p)
    dim = ctx.dim
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        dim = None
    keepdim = ctx.keepdim
    g = _restore(g, x.dim(), dim, keepdim)
    r = _restore(ctx.result, x.dim(), dim, keepdim)
    if x.dtype != g.dtype and not x.is_complex():      # (a complex x has a real norm: keep x complex)
        x = x.to(g.dtype)
    return _norm_grad(x, g, r, p, _rdims(dim, x.dim()))


register("norm(Tensor self, Scalar? p='fro', int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) "
         "-> Tensor", _norm_kernel, backward=_norm_bwd, save=("self", "result"), tags=RD)


# ---------------------------------------------------------------------------------------------
# scans: cumsum, cumprod
# ---------------------------------------------------------------------------------------------
SC = ("scan",)
SCH = ("scan", "holomorphic")


def _rev_cumsum_kernel(self, dim):
    if self.dim() == 0:
        return self.clone()
    return self.flip(dim).cumsum(dim).flip(dim)


register("_reverse_cumsum(Tensor self, int dim) -> Tensor", _rev_cumsum_kernel,
         backward=lambda ctx, g: g.cumsum(ctx.dim), save=(), tags=SC, function=False, method=False,
         doc="out[i] = sum_{k >= i} self[k] along dim: the adjoint of cumsum.")


def _rev_cumsum(g, dim):
    return OPS["_reverse_cumsum"].fn(g, dim)


register("cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
         backward=lambda ctx, g: _rev_cumsum(g, ctx.dim), save=(), tags=SC)


def _grad_enabled():
    from ..autograd import grad_mode
    return grad_mode._state.enabled


def _cumprod_grad_quadratic(x, g, d):
    """d cumprod / dx as an explicit polynomial, for double backward through zeros:
    ``dL/dx_i = sum_{k >= i} g_k * prod_{j <= k, j != i} x_j``, evaluated for all ``i`` at once as
    the cumprod of ``x`` with ``x_i`` replaced by 1 (an extra dim of size n: O(n^2) memory, used
    only when ``create_graph=True`` and the input holds zeros, as PyTorch does)."""
    from .._tensor import _wrap
    n = x.shape[d]
    xt = x.transpose(d, -1)                                      # (..., n)
    gt = g.transpose(d, -1)
    dev = x.device
    eye = _wrap(torch.eye(n, dtype=torch.bool, device=dev))      # [i, j]: j == i
    upper = _wrap(torch.ones(n, n, dtype=torch.bool, device=dev).triu())   # [i, k]: k >= i
    X = _where(eye, _const(x, 1), xt.unsqueeze(-2))              # (..., n_i, n_j)
    C = X.cumprod(-1)
    gi = _where(upper, gt.unsqueeze(-2) * C, _const(x, 0)).sum(-1)
    return gi.transpose(d, -1)


def _cumprod_bwd(ctx, g):
    x, y = ctx.self, ctx.result
    if x.dim() == 0 or x.numel() <= 1:
        return g
    if x.dtype != g.dtype:
        x = x.to(g.dtype)
    d = ctx.dim % x.dim()
    if _grad_enabled() and bool(_eq(x, 0).any()):
        return _cumprod_grad_quadratic(x, g, d)
    land = _op("logical_and")
    zero = _eq(x, 0)
    cnt = zero.cumsum(d)                            # zeros seen so far (inclusive)
    before = _eq(cnt, 0)                           # strictly before the first zero
    first = land(zero, _eq(cnt, 1))                # the first zero
    after = land(_ne(cnt, 0), _op("logical_not")(first))   # strictly after the first zero
    one, nil = _const(x, 1), _const(x, 0)
    # before the first zero: sum_{k>=i} g_k y_k / x_i
    g_before = _where(before, _rev_cumsum(g * y, d) / _where(before, x, one), nil)
    # at the first zero z: prod_{j<z} x_j * sum_{k>=z} g_k prod_{z<j<=k} x_j
    E = _where(before, x, one).prod(d, keepdim=True)
    C = _where(after, x, one).cumprod(d)
    S = _where(_ne(cnt, 0), g * C, nil).sum(d, keepdim=True)
    g_first = _where(first, E * S, nil)
    return g_before + g_first


register("cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
         backward=_cumprod_bwd, save=("self", "result"), tags=SCH)


def _cummaxmin_bwd(ctx, gv, gi):
    x = ctx.self
    if x.dim() == 0:
        return gv
    return gv.new_zeros(x.shape).scatter_add(ctx.dim, ctx.result[1], gv)


for _n in ("cummax", "cummin"):
    register(f"{_n}(Tensor self, int dim) -> (Tensor values, Tensor indices)",
             (lambda f: lambda self, dim: tuple(f(self, dim)))(getattr(torch, _n)),
             backward=_cummaxmin_bwd, save=("self", "result"), tags=SC)
    OPS[_n].returns_named = collections.namedtuple(_n, ["values", "indices"])


# ---------------------------------------------------------------------------------------------
# Python-level entry points that dispatch among several table ops
# ---------------------------------------------------------------------------------------------
_median, _nanmedian = _make_median("median"), _make_median("nanmedian")
EXTRA_FUNCTIONS = {"max": _max, "min": _min, "median": _median, "nanmedian": _nanmedian}
EXTRA_METHODS = dict(EXTRA_FUNCTIONS)
