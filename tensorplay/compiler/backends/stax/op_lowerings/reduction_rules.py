"""Reduction lowering rules (chapter §6.3–6.5): Reduction values over the reduced dims.

``make_reduction`` / ``make_multi_reduction`` build one accumulator (sum, prod, max, min, any, all,
argmax, argmin, welford) over ``dim`` with ``keepdim``; ``reduction(type)`` is the rule of the plain
ones.  Means, norms, var/std (Welford's update in a float64 state for float32 rows, as eager on
CPU), nansum/nanmean, count_nonzero and logsumexp are compositions of them with pointwise values.
A max/min/argmax/argmin over an empty dim is eager's error (the fallback raises it).
"""
from __future__ import annotations

import math

import sympy
import torch

from ..ir import Pointwise, Reduction, TensorBox, Unsupported
from ..ops_handler import ops
from .pointwise_rules import _conv, _realize, broadcast_loader, nonneg_size, size_constant
from .registry import _node, _out_val, backend_of, register_lowering


# ---- reductions -----------------------------------------------------------------------------------------
def _norm_dims(dim, n):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % n for d in dim}) if n else []


def _reduction_fn(x: TensorBox, dims, keepdim, acc, transform=None):
    """(output ranges, reduction ranges, inner_fn) of a reduction of ``x`` over ``dims``; the
    values are ``x`` converted to ``acc`` (None: left in their dtype), or ``transform(x)``, which
    must return a value of dtype ``acc``."""
    in_size = x.get_size()
    n = len(in_size)
    dims = _norm_dims(dims, n)
    kept = [d for d in range(n) if d not in dims]
    out_ranges = [1 if d in dims else in_size[d] for d in range(n)] if keepdim else [in_size[d] for d in kept]
    rranges = [in_size[d] for d in dims]
    loader = x.make_loader()

    def inner_fn(index, rindex):
        full = [None] * n
        for k, d in enumerate(dims):
            full[d] = rindex[k]
        if keepdim:
            for d in kept:
                full[d] = index[d]
        else:
            for k, d in enumerate(kept):
                full[d] = index[k]
        v = loader(full)
        if transform is not None:
            return transform(v)
        return _conv(v, x.dtype, acc)
    return out_ranges, rranges, inner_fn


def _check_nonempty(x, rranges, rtype):
    if math.prod(rranges) == 0:
        # eager raises (IndexError/RuntimeError) -- the guard of the compiled call reaches here
        # only with the same shapes, so the fallback raises eager's own error
        raise Unsupported(f"{rtype} over an empty dimension (an error in eager)")


def make_reduction(x: TensorBox, dims, keepdim, rtype, out_dtype, acc_dtype=None, transform=None):
    acc = None if rtype in ("argmax", "argmin") else (acc_dtype or out_dtype)
    out_ranges, rranges, inner_fn = _reduction_fn(x, dims, keepdim, acc, transform)
    if rtype in ("max", "min", "argmax", "argmin"):
        _check_nonempty(x, rranges, rtype)
    return TensorBox(Reduction(out_dtype, x.device, out_ranges, rranges, rtype, inner_fn, x.dtype))


def make_multi_reduction(x: TensorBox, dims, keepdim, rtype, dtypes, acc_dtype=None, transform=None):
    """The outputs of one argmax/argmin/welford accumulator (``dtypes``: output name -> dtype),
    realized: dict name -> TensorBox.  In one kernel they cost one pass and one accumulator."""
    out_ranges, rranges, inner_fn = _reduction_fn(x, dims, keepdim, acc_dtype, transform)
    if rtype in ("argmax", "argmin"):
        _check_nonempty(x, rranges, rtype)
    reds = Reduction.multi(dtypes, x.device, out_ranges, rranges, rtype, inner_fn, x.dtype)
    return {o: _realize(TensorBox(r)) for o, r in reds.items()}


def online_stats(x: TensorBox, dim, keepdim, dtype):
    """(source, {"max": m, "sum": d}) of the (m, d) monoid over ``dim`` (Prop. 9.1: one pass for
    the row's max and sum(exp(x - m))), x converted to ``dtype`` first -- softmax, log_softmax
    and logsumexp of rows a backend would otherwise pass through several times."""
    xl0 = x.make_loader()
    src = x if dtype == x.dtype else TensorBox(Pointwise(dtype, x.device, x.get_size(),
                                                         lambda i: ops.to_dtype(xl0(i), dtype)))
    return src, make_multi_reduction(src, dim, keepdim, "online_softmax", {"max": dtype, "sum": dtype}, acc_dtype=dtype)


def reduction(rtype):
    def rule(x, dim=None, keepdim=False, dtype=None):
        out = _out_val()
        if rtype in ("sum", "prod") and out.dtype in (torch.int64,) and x.dtype == torch.bool:
            pass
        return make_reduction(x, dim, keepdim, rtype, out.dtype)
    return rule


register_lowering("sum")(reduction("sum"))
register_lowering("prod")(lambda x, dim=None, keepdim=False, dtype=None:
                          make_reduction(x, [dim] if isinstance(dim, int) else dim, keepdim, "prod", _out_val().dtype))
register_lowering("amax")(reduction("max"))
register_lowering("amin")(reduction("min"))


@register_lowering("max", "min")
def _max_all(x):
    return make_reduction(x, None, False, "max" if _node().opdef.name == "max" else "min", _out_val().dtype)


@register_lowering("argmax", "argmin")
def _argmax(x, dim=None, keepdim=False):
    """torch semantics: the first index of the extreme value, NaN the most extreme (first NaN
    wins); dim=None: index into the flattened input."""
    return make_reduction(x, dim, keepdim, _node().opdef.name, torch.int64)


@register_lowering("max_dim", "min_dim")
def _max_dim(x, dim, keepdim=False):
    """(values, indices): both outputs of one argmax/argmin accumulator (one kernel, one pass)."""
    rt = "argmax" if _node().opdef.name == "max_dim" else "argmin"
    r = make_multi_reduction(x, dim, keepdim, rt, {"value": x.dtype, "index": torch.int64})
    return r["value"], r["index"]


@register_lowering("aminmax")
def _aminmax(x, dim=None, keepdim=False):
    """(min, max): two reductions of one input, fused horizontally into one kernel."""
    return (_realize(make_reduction(x, dim, keepdim, "min", x.dtype)),
            _realize(make_reduction(x, dim, keepdim, "max", x.dtype)))


def _sum_of(x, dim, keepdim, dtype, transform):
    return make_reduction(x, dim, keepdim, "sum", dtype, transform=transform)


@register_lowering("nansum")
def _nansum(x, dim=None, keepdim=False, dtype=None):
    out = _out_val().dtype
    if not x.dtype.is_floating_point:
        return make_reduction(x, dim, keepdim, "sum", out)
    return _sum_of(x, dim, keepdim, out, lambda v: (lambda c: ops.where(ops.isnan(c), ops.constant(0, out), c))(
        _conv(v, x.dtype, out)))


@register_lowering("nanmean")
def _nanmean(x, dim=None, keepdim=False, dtype=None):
    """sum of the non-NaN elements / their count (two reductions of x: one kernel)."""
    out = _out_val().dtype
    if not out.is_floating_point:
        raise Unsupported("nanmean of integers (an error in eager)")
    s = _realize(_nansum(x, dim, keepdim, out))
    c = _realize(_sum_of(x, dim, keepdim, out, lambda v: ops.to_dtype(ops.logical_not(ops.isnan(v)), out)))
    sl, cl = s.make_loader(), c.make_loader()
    return TensorBox(Pointwise(out, x.device, s.get_size(), lambda i: ops.truediv(sl(i), cl(i))))


@register_lowering("count_nonzero")
def _count_nonzero(x, dim=None):
    if x.dtype == torch.bool:
        return _sum_of(x, dim, False, torch.int64, lambda v: ops.to_dtype(v, torch.int64))
    return _sum_of(x, dim, False, torch.int64,
                   lambda v: ops.to_dtype(ops.ne(v, ops.constant(0, x.dtype)), torch.int64))


@register_lowering("norm")
def _norm(x, p="fro", dim=None, keepdim=False, dtype=None):
    """Vector p-norms: p = 2/'fro'/None sqrt(sum x^2), 1 sum |x|, inf/-inf amax/amin |x|, 0 the
    count of non-zeros, other p (sum |x|^p)^(1/p).  Matrix norms ('nuc', ...) are not lowered."""
    out = _out_val().dtype
    if not out.is_floating_point or x.dtype.is_complex:
        raise Unsupported("norm of integers or complex values")
    if isinstance(p, str) and p != "fro":
        raise Unsupported(f"the {p!r} matrix norm")
    p = 2.0 if p is None or p == "fro" else float(p)
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        dim = None

    def absx(v):
        return ops.abs(_conv(v, x.dtype, out))
    if math.isinf(p):
        return make_reduction(x, dim, keepdim, "max" if p > 0 else "min", out, transform=absx)
    if p == 0:
        return _sum_of(x, dim, keepdim, out, lambda v: ops.to_dtype(ops.ne(absx(v), ops.constant(0, out)), out))
    if p == 1:
        return _sum_of(x, dim, keepdim, out, absx)
    if p == 2:
        s = _realize(_sum_of(x, dim, keepdim, out, lambda v: (lambda a: ops.mul(a, a))(_conv(v, x.dtype, out))))
        sl = s.make_loader()
        return TensorBox(Pointwise(out, x.device, s.get_size(), lambda i: ops.sqrt(sl(i))))
    s = _realize(_sum_of(x, dim, keepdim, out, lambda v: ops.pow(absx(v), ops.constant(p, out))))
    sl = s.make_loader()
    return TensorBox(Pointwise(out, x.device, s.get_size(), lambda i: ops.pow(sl(i), ops.constant(1.0 / p, out))))


@register_lowering("linalg_vector_norm")
def _vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    """``tp.linalg.vector_norm``: the vector p-norm of ``norm`` with p = ord (a number)."""
    return _norm(x, float(ord), dim, keepdim, dtype)


@register_lowering("any", "all")
def _any(x, dim=None, keepdim=False):
    return make_reduction(x, dim, keepdim, _node().opdef.name, torch.bool, acc_dtype=torch.bool)


def _div_by(box, n, dtype):
    loader = box.make_loader()
    return TensorBox(Pointwise(dtype, box.device, box.get_size(),
                               lambda i: ops.truediv(loader(i), size_constant(n, dtype))))


@register_lowering("mean")
def _mean(x, dim=None, keepdim=False, dtype=None):
    out = _out_val()
    if not out.dtype.is_floating_point:
        raise Unsupported("mean of integers")
    src = x
    if x.dtype != out.dtype:
        ld = x.make_loader()
        src = TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.to_dtype(ld(i), out.dtype)))
    s = _realize(make_reduction(src, dim, keepdim, "sum", out.dtype))
    n = math.prod(x.get_size()[d] for d in _norm_dims(dim, len(x.get_size())))
    return _div_by(s, n, out.dtype)


#: Welford state dtype per input dtype: float32 rows are accumulated in float64, like eager on CPU
#: (the float32 state's error, ~kappa*u relative, would be far above eager's)
WELFORD_ACC = {torch.float32: torch.float64}


def _var_parts(x, dim, correction, keepdim_out, dtype, acc=None):
    """Variance and mean in one pass: a ``welford`` reduction (mean, m2 per row; per-lane Welford
    state, Chan combine across lanes and accumulators: cpp_prelude.h) and ``var = m2 / (n - c)``.
    The error grows with kappa = sqrt(1 + mean^2/var), not kappa^2 (docs/stax.md, Numerics)."""
    dims = _norm_dims(dim, len(x.get_size()))
    n = math.prod(x.get_size()[d] for d in dims)
    acc = acc or WELFORD_ACC.get(dtype, dtype)
    w = make_multi_reduction(x, dims, keepdim_out, "welford", {"mean": acc, "m2": acc}, acc_dtype=acc)
    denom = nonneg_size(n - correction)
    m2l, ml = w["m2"].make_loader(), w["mean"].make_loader()
    size = w["m2"].get_size()

    def out(v):
        return v if acc == dtype else ops.to_dtype(v, dtype)
    var = TensorBox(Pointwise(dtype, x.device, size, lambda i: out(ops.truediv(m2l(i), size_constant(denom, acc)))))
    if n == 0:   # eager: the mean of nothing is NaN
        mean = TensorBox(Pointwise(dtype, x.device, size, lambda i: ops.constant(math.nan, dtype)))
    else:
        mean = w["mean"] if acc == dtype else TensorBox(Pointwise(dtype, x.device, size, lambda i: out(ml(i))))
    return var, mean


def _var_parts_two_pass(x, dim, correction, keepdim_out, dtype):
    """Two-pass variance: mean, then the sum of squared deviations (the second pass reads the row
    from cache when fused).  layer_norm uses it: faster than Welford for rows in cache (no
    division per element; docs/stax.md)."""
    n_in = len(x.get_size())
    dims = _norm_dims(dim, n_in)
    n = math.prod(x.get_size()[d] for d in dims)
    s = _realize(make_reduction(x, dims, True, "sum", dtype))
    mean_k = _div_by(s, n, dtype)                   # keepdim shape, broadcastable against x
    ml = broadcast_loader(mean_k, x.get_size())
    xl = x.make_loader()
    dev = TensorBox(Pointwise(dtype, x.device, x.get_size(),
                              lambda i: (lambda d: ops.mul(d, d))(ops.sub(xl(i), ml(i)))))
    ss = _realize(make_reduction(dev, dims, keepdim_out, "sum", dtype))
    denom = nonneg_size(n - correction)
    var = TensorBox(Pointwise(dtype, x.device, ss.get_size(),
                              (lambda L: lambda i: ops.truediv(L(i), size_constant(denom, dtype)))(ss.make_loader())))
    return var, mean_k


def _welford_same_dtype(x, dim, correction, keepdim_out, dtype):
    return _var_parts(x, dim, correction, keepdim_out, dtype, acc=dtype)


#: row statistics of layer_norm: Welford in the input's dtype (one read of the row; eager's
#: layer_norm also accumulates float32 rows in float32) or _var_parts_two_pass (sum, then squared
#: deviations).  Measured equal or faster than two-pass for rows of 2048 (docs/stax.md, Numerics)
LAYER_NORM_STATS = _welford_same_dtype


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@register_lowering("var")
def _var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if not x.dtype.is_floating_point:
        raise Unsupported("var of integers")
    return _var_parts(x, dim, _correction(correction, unbiased), keepdim, x.dtype)[0]


@register_lowering("std")
def _std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if not x.dtype.is_floating_point:
        raise Unsupported("std of integers")
    v = _var_parts(x, dim, _correction(correction, unbiased), keepdim, x.dtype)[0]
    ld = v.make_loader()
    return TensorBox(Pointwise(x.dtype, x.device, v.get_size(), lambda i: ops.sqrt(ld(i))))


@register_lowering("var_mean", "std_mean")
def _var_mean(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if not x.dtype.is_floating_point:
        raise Unsupported("var_mean of integers")
    var, mean = _var_parts(x, dim, _correction(correction, unbiased), keepdim, x.dtype)
    if _node().opdef.name == "std_mean":
        ld = var.make_loader()
        var = TensorBox(Pointwise(x.dtype, x.device, var.get_size(), lambda i: ops.sqrt(ld(i))))
    return var, mean


@register_lowering("logsumexp")
def _logsumexp(x, dim, keepdim=False):
    return logsumexp_of(x, dim, keepdim)


def logsumexp_of(x, dim, keepdim):
    """log(sum(exp(x))) over ``dim`` in x's dtype (logsumexp, and cross_entropy's row statistics)."""
    if not x.dtype.is_floating_point:
        raise Unsupported("logsumexp of integers")
    size = x.get_size()
    if any(size[d] == 0 for d in _norm_dims(dim, len(size))):
        # log of an empty sum: -inf, as in eager (its max over the empty dim is never taken)
        red = set(_norm_dims(dim, len(size)))
        shape = tuple(1 if d in red else n for d, n in enumerate(size) if keepdim or d not in red)
        return TensorBox(Pointwise(x.dtype, x.device, shape, lambda i: ops.constant(float("-inf"), x.dtype)))
    dims = _norm_dims(dim, len(size))
    if len(dims) == 1 and dims[0] == len(size) - 1 and \
            backend_of(x).online_softmax(size[dims[0]]):
        # a long row: its (m, d) in one pass (Prop. 9.1); lse = m + log(d), an infinite m as is
        _, st = online_stats(x, dim, keepdim, x.dtype)
        ml1, dl1 = st["max"].make_loader(), st["sum"].make_loader()
        return TensorBox(Pointwise(x.dtype, x.device, st["max"].get_size(),
                                   lambda i: ops.where(ops.isinf(ml1(i)), ml1(i), ops.add(ml1(i), ops.log(dl1(i))))))
    m = _realize(make_reduction(x, dim, True, "max", x.dtype))
    ml = broadcast_loader(m, x.get_size())
    xl = x.make_loader()

    def shifted(i):
        mv = ml(i)
        safe = ops.where(ops.isinf(mv), ops.constant(0.0, x.dtype), mv)
        return ops.exp(ops.sub(xl(i), safe))
    e = TensorBox(Pointwise(x.dtype, x.device, x.get_size(), shifted))
    s = _realize(make_reduction(e, dim, keepdim, "sum", x.dtype))
    sl = s.make_loader()
    mk = m if keepdim else TensorBox(m.data)
    mlo = mk.make_loader()
    dims = _norm_dims(dim, len(x.get_size()))

    def fin(i):
        if keepdim:
            mi = i
        else:
            mi = list(i)
            for d in dims:
                mi.insert(d, sympy.Integer(0))
        mv = mlo(mi)
        safe = ops.where(ops.isinf(mv), ops.constant(0.0, x.dtype), mv)
        return ops.add(ops.log(sl(i)), safe)
    return TensorBox(Pointwise(x.dtype, x.device, s.get_size(), fin))
