"""Pointwise lowering rules (chapter §6.2): an elementwise op is a Pointwise value of the index.

``pointwise(compute)`` makes a rule from a compute function over ``ops`` values: the tensor
arguments are loaded at the output index (broadcast: a size-1 dim reads index 0), converted to the
compute dtype (the output's, PyTorch's promotion of the inputs for comparisons, or a given dtype),
passed to ``compute`` with the op's other arguments, and the result is converted to the output
dtype.  Nothing is written to memory: the value is fused into its readers unless materialisation
(choices.should_realize) decides otherwise.  Results follow eager's semantics on every dtype the
backend supports, ±0, ±inf and NaN included; integer division by zero raises in the kernel, as in
eager.

A pointwise op of the table that takes only tensors and is named like an ``ops`` function (exp,
maximum, eq, logical_and, ...) is that function (the last section); the other rules here are
written out.
"""
from __future__ import annotations

import math

import sympy
import torch

from .....ops.nn_ops.activation_extra import _SELU_ALPHA, _SELU_SCALE
from .....ops.registry import OPS
from ..ir import Pointwise, TensorBox, Unsupported
from ..ops_handler import BINARY, COMPARE, UNARY, ops
from .registry import LOWERINGS, V, _CDT, _node, _out_val, cdt, current_op, register_lowering


def broadcast_loader(box: TensorBox, shape):
    size = box.get_size()
    loader = box.make_loader()
    k, n = len(size), len(shape)
    if tuple(size) == tuple(shape):
        return loader

    def load(index):
        idx = [sympy.Integer(0) if size[j] == 1 else index[n - k + j] for j in range(k)]
        return loader(idx)
    return load


def broadcast_size(*sizes) -> tuple:
    """The broadcast of ``sizes`` (torch's rule, right-aligned; a dim of size 1 stretches) over
    size expressions: the other sizes of a dim must be proved equal (the capture's ShapeEnv
    replaced broadcast-related symbols by one), else Unsupported."""
    from ..sizevars import statically_known_equals
    n = max((len(z) for z in sizes), default=0)
    out = []
    for j in range(n):
        dims = [sympy.sympify(z[len(z) - n + j]) for z in sizes if len(z) - n + j >= 0]
        big = [d for d in dims if d != 1]
        if any(not statically_known_equals(d, big[0]) for d in big[1:]):
            raise Unsupported(f"broadcast of sizes {[tuple(z) for z in sizes]}: dim {j} not proved equal")
        out.append(big[0] if big else sympy.Integer(1))
    return tuple(int(d) if d.is_Integer else d for d in out)


def size_constant(n, dtype):
    """The number ``n`` (an int or a size expression: a row length, an element count) as an
    ``ops`` value of ``dtype``: a literal when static, else computed in the kernel from its size
    arguments (an int64 index expression converted, as ``float(n)`` rounds)."""
    e = sympy.sympify(n)
    if e.is_Number:
        return ops.constant(float(e) if dtype.is_floating_point else int(e), dtype)
    return ops.to_dtype(ops.index_expr(e, torch.int64), dtype)


def nonneg_size(e):
    """``max(e, 0)`` for a size expression: ``e`` itself when it is proved non-negative for every
    size (a symbolic one), else Unsupported."""
    from ..sizevars import statically_known_leq
    e = sympy.sympify(e)
    if e.is_Integer:
        return max(int(e), 0)
    if statically_known_leq(0, e):
        return e
    raise Unsupported(f"cannot prove the size {e} non-negative")


def _meta_of(a):
    if isinstance(a, TensorBox):
        return torch.empty([1] * len(a.get_size()), dtype=a.dtype, device="meta")   # (promotion reads dtype, rank)
    return a


def pointwise(compute, *, compute_dtype=None, tensors=None):
    """Make a lowering rule from a compute function over ``ops`` values (see module doc).
    ``compute_dtype``: "result" (default: the output dtype), "promote" (type promotion of the
    tensor inputs, e.g. for comparisons), or a torch dtype."""
    def rule(*args):
        node = _node()
        op = node.opdef
        out = _out_val()
        shape = tuple(out.shape)
        tpos = op.schema.tensor_pos if tensors is None else tensors
        if compute_dtype is None or compute_dtype == "result":
            cd = out.dtype
        elif compute_dtype == "promote":
            ins = [_meta_of(args[i]) for i in tpos if args[i] is not None]
            cd = ins[0] if len(ins) == 1 and isinstance(ins[0], torch.Tensor) else None
            cd = torch.result_type(*ins) if len(ins) == 2 else (ins[0].dtype if isinstance(ins[0], torch.Tensor)
                                                                   else out.dtype)
        else:
            cd = compute_dtype
        loaders = []
        for i in tpos:
            a = args[i]
            if isinstance(a, TensorBox):
                loaders.append((broadcast_loader(a, shape), a.dtype))
            else:
                loaders.append((a, None))
        params = [a for j, a in enumerate(args) if j not in tpos]

        def inner_fn(index):
            vals = []
            for ld, dt in loaders:
                if dt is None:
                    # (a size expression: a symbolic count, e.g. mean's backward divides by it)
                    vals.append(ld if ld is None else size_constant(ld, cd) if isinstance(ld, sympy.Expr)
                                else ops.constant(ld, cd))
                else:
                    v = ld(index)
                    vals.append(v if dt == cd else ops.to_dtype(v, cd))
            prev = _CDT.dtype, _CDT.op
            _CDT.dtype, _CDT.op = cd, op.name
            try:
                r = compute(*vals, *params)
            finally:
                _CDT.dtype, _CDT.op = prev
            return r if cd == out.dtype else ops.to_dtype(r, out.dtype)
        return TensorBox(Pointwise(out.dtype, _device(args, out), shape, inner_fn))
    rule.compute = compute
    return rule


def _device(args, out):
    for a in args:
        if isinstance(a, TensorBox):
            return a.device
    return out.device if out.device.type != "meta" else V.graph.device


def _c(v):
    return ops.constant(v, cdt())


def _conv(v, src, dst):
    """``v`` (of dtype ``src``) converted to ``dst`` (None: left as it is)."""
    return v if dst is None or src == dst else ops.to_dtype(v, dst)


def _realize(box):
    """``box`` with its value written to a buffer (a reduction's input read twice, a statistic)."""
    V.graph.realize(box)
    return box


# ---- arithmetic ------------------------------------------------------------------------------------
register_lowering("add")(pointwise(lambda a, b, alpha: ops.add(a, b) if alpha == 1 else ops.add(a, ops.mul(b, _c(alpha)))))
register_lowering("sub")(pointwise(lambda a, b, alpha: ops.sub(a, b) if alpha == 1 else ops.sub(a, ops.mul(b, _c(alpha)))))
register_lowering("square")(pointwise(lambda a: ops.mul(a, a)))
register_lowering("positive", "clone", "contiguous", "alias", "detach")(pointwise(lambda a: a))


@register_lowering("div")
def _div(a, b, rounding_mode):
    out = _out_val()
    if rounding_mode is None:
        return pointwise(lambda x, y, _r: ops.truediv(x, y))(a, b, rounding_mode)
    if rounding_mode == "trunc":
        if out.dtype.is_floating_point:
            return pointwise(lambda x, y, _r: ops.trunc(ops.truediv(x, y)))(a, b, rounding_mode)
        # integers: C division; a zero divisor makes the kernel raise ZeroDivisionError (as eager)
        return pointwise(lambda x, y, _r: ops.truncdiv(x, y, op=current_op()))(a, b, rounding_mode)
    return pointwise(lambda x, y, _r: ops.floordiv(x, y, op=current_op()))(a, b, rounding_mode)


# rounding to an integral value: the identity on integers
register_lowering("floor", "ceil", "trunc")(pointwise(lambda a: a if not cdt().is_floating_point
                                                     else getattr(ops, current_op())(a)))


@register_lowering("round")
def _round(a, decimals=0):
    if decimals != 0:
        raise Unsupported("round with decimals")
    return pointwise(lambda x, _d: ops.round(x) if cdt().is_floating_point else x)(a, decimals)


register_lowering("relu")(pointwise(lambda a: ops.maximum(a, _c(0))))


# pow(tensor, number) on floats: the exponents ATen special-cases (pow_tensor_scalar_optimized),
# computed the same way; anything else is tp::pow (std::pow per lane, integers by squaring with
# torch's rules for negative exponents: 1, +-1 or 0)
_POW_SPECIAL = {2: lambda x: ops.mul(x, x), 3: lambda x: ops.mul(ops.mul(x, x), x), 1: lambda x: x,
                0.5: lambda x: ops.sqrt(x), -0.5: lambda x: ops.rsqrt(x), -1: lambda x: ops.reciprocal(x),
                -2: lambda x: ops.reciprocal(ops.mul(x, x))}


@register_lowering("pow")
def _pow(a, b):
    if isinstance(a, TensorBox) and isinstance(b, (int, float)) and not isinstance(b, bool) \
            and _out_val().dtype.is_floating_point and b in _POW_SPECIAL:
        return pointwise(lambda x, _e: _POW_SPECIAL[b](x))(a, b)
    return pointwise(lambda x, e: ops.pow(x, e))(a, b)


def _clamp_compute(x, lo, hi):
    # lo/hi are values (tensors or constants, broadcast) or None; torch: min(max(x, lo), hi)
    if lo is not None:
        x = ops.maximum(x, lo)
    if hi is not None:
        x = ops.minimum(x, hi)
    return x


register_lowering("clamp", "clip")(pointwise(_clamp_compute))


# clamp_min/clamp_max: a Python-number bound is a tensor argument of the schema, so ``pointwise``
# already gives it as a constant of the compute dtype (like a tensor bound's loaded value)
register_lowering("clamp_min")(pointwise(lambda x, lo: ops.maximum(x, lo)))
register_lowering("clamp_max")(pointwise(lambda x, hi: ops.minimum(x, hi)))


@register_lowering("hardtanh")
def _hardtanh(a, lo=-1.0, hi=1.0):
    return pointwise(lambda x, l, h: ops.minimum(ops.maximum(x, _c(l)), _c(h)))(a, lo, hi)


@register_lowering("leaky_relu")
def _leaky(a, slope=0.01):
    return pointwise(lambda x, s: ops.where(ops.gt(x, _c(0)), x, ops.mul(x, _c(s))))(a, slope)


register_lowering("silu")(pointwise(lambda x: ops.mul(x, ops.sigmoid(x))))


@register_lowering("gelu")
def _gelu(a, approximate="none"):
    if approximate == "tanh":
        def f(x, _ap):
            inner = ops.mul(_c(math.sqrt(2 / math.pi)), ops.add(x, ops.mul(_c(0.044715), ops.mul(x, ops.mul(x, x)))))
            return ops.mul(ops.mul(_c(0.5), x), ops.add(_c(1.0), ops.tanh(inner)))
    else:
        def f(x, _ap):
            return ops.mul(ops.mul(x, _c(0.5)), ops.add(_c(1.0), ops.erf(ops.mul(x, _c(1 / math.sqrt(2))))))
    return pointwise(f)(a, approximate)


@register_lowering("softplus")
def _softplus(a, beta=1.0, threshold=20.0):
    def f(x, b, t):
        bx = ops.mul(x, _c(b))
        return ops.where(ops.gt(bx, _c(t)), x, ops.truediv(ops.log1p(ops.exp(bx)), _c(b)))
    return pointwise(f)(a, beta, threshold)


@register_lowering("elu")
def _elu(a, alpha=1.0, scale=1.0, input_scale=1.0):
    def f(x, al, sc, isc):
        neg = ops.mul(_c(al), ops.expm1(ops.mul(x, _c(isc))))
        return ops.mul(_c(sc), ops.where(ops.gt(x, _c(0)), x, neg))
    return pointwise(f)(a, alpha, scale, input_scale)


@register_lowering("selu")
def _selu(a):
    return _elu(a, _SELU_ALPHA, _SELU_SCALE, 1.0)


@register_lowering("celu")
def _celu(a, alpha=1.0):
    if alpha == 0:
        raise Unsupported("celu with alpha 0 (eager raises)")
    return _elu(a, alpha, 1.0, 1.0 / alpha)      # ATen's celu is this elu


# threshold and the shrinks compare the way ATen's kernels do, so a NaN input stays NaN
@register_lowering("threshold")
def _threshold(a, threshold, value):
    return pointwise(lambda x, t, v: ops.where(ops.le(x, _c(t)), _c(v), x))(a, threshold, value)


@register_lowering("hardshrink")
def _hardshrink(a, lambd=0.5):
    def f(x, lam):
        band = ops.logical_and(ops.ge(x, _c(-lam)), ops.le(x, _c(lam)))
        return ops.where(band, _c(0), x)
    return pointwise(f)(a, lambd)


@register_lowering("softshrink")
def _softshrink(a, lambd=0.5):
    def f(x, lam):   # ATen: x - l if x > l, x + l if x < -l, else x * 0 (NaN and the sign of zero kept)
        inner = ops.where(ops.lt(x, _c(-lam)), ops.add(x, _c(lam)), ops.mul(x, _c(0)))
        return ops.where(ops.gt(x, _c(lam)), ops.sub(x, _c(lam)), inner)
    return pointwise(f)(a, lambd)


@register_lowering("lerp")
def _lerp(a, b, w):
    if isinstance(w, TensorBox):
        raise Unsupported("lerp with a tensor weight")
    return pointwise(lambda x, y, wt: ops.add(x, ops.mul(_c(wt), ops.sub(y, x))), tensors=(0, 1))(a, b, w)


@register_lowering("addcmul")
def _addcmul(s, t1, t2, value=1):
    return pointwise(lambda a, b, c, v: ops.add(a, ops.mul(_c(v), ops.mul(b, c))))(s, t1, t2, value)


@register_lowering("addcdiv")
def _addcdiv(s, t1, t2, value=1):
    return pointwise(lambda a, b, c, v: ops.add(a, ops.mul(_c(v), ops.truediv(b, c))))(s, t1, t2, value)


# ---- the rest of the pointwise table: rounding divisions, powers, inverse trig, predicates ------------
# Integer floor_divide/remainder/fmod (and div with a rounding mode) by zero: the kernel reports
# ZeroDivisionError naming the op (the ``op`` argument of the ops call), as eager raises it.
register_lowering("floor_divide")(pointwise(lambda a, b: ops.floordiv(a, b, op=current_op())))
register_lowering("remainder")(pointwise(lambda a, b: ops.remainder(a, b, op=current_op())))
register_lowering("fmod")(pointwise(lambda a, b: ops.fmod(a, b, op=current_op())))
register_lowering("float_power")(pointwise(lambda a, b: ops.pow(a, b)))   # computed in float64
register_lowering("rsub")(pointwise(lambda a, b, alpha: ops.sub(b, a) if alpha == 1 else ops.sub(b, ops.mul(a, _c(alpha)))))
register_lowering("frac")(pointwise(lambda a: ops.sub(a, ops.trunc(a))))


def _fmax_fmin(keep_a):
    """torch.fmax/fmin: the other operand where one is NaN; ties (+0 vs -0) give the first."""
    def f(a, b):
        if not cdt().is_floating_point:
            return ops.where(keep_a(a, b), a, b)
        return ops.where(ops.logical_or(ops.isnan(b), keep_a(a, b)), a, b)
    return f


register_lowering("fmax")(pointwise(_fmax_fmin(lambda a, b: ops.ge(a, b))))
register_lowering("fmin")(pointwise(_fmax_fmin(lambda a, b: ops.le(a, b))))


@register_lowering("logit")
def _logit(a, eps=None):
    def f(x, e):
        if e is not None:   # ATen: x clamped to [eps, 1 - eps], NaN kept
            lo, hi = _c(e), ops.sub(_c(1), _c(e))
            x = ops.where(ops.lt(x, lo), lo, ops.where(ops.gt(x, hi), hi, x))
        return ops.log(ops.truediv(x, ops.sub(_c(1), x)))
    return pointwise(f)(a, eps)


register_lowering("isposinf")(pointwise(lambda a: ops.logical_and(ops.isinf(a), ops.gt(a, _c(0))), compute_dtype="promote"))
register_lowering("isneginf")(pointwise(lambda a: ops.logical_and(ops.isinf(a), ops.lt(a, _c(0))), compute_dtype="promote"))


@register_lowering("isclose")
def _isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """ATen's isclose: a == b, or (equal_nan and both NaN), or |a - b| finite and
    <= atol + |rtol * b|; integers subtract in their dtype (wrapping), bools in the default dtype."""
    def f(x, y, rt, at, en):
        cd = cdt()
        close = ops.eq(x, y)
        if en and cd.is_floating_point:
            close = ops.logical_or(close, ops.logical_and(ops.isnan(x), ops.isnan(y)))
        if rt == 0 and at == 0:
            return close
        ed = cd if cd.is_floating_point else torch.get_default_dtype()
        if cd == torch.bool:
            x, y, cd = ops.to_dtype(x, ed), ops.to_dtype(y, ed), ed
        diff = ops.abs(ops.sub(x, y))
        diff = diff if cd == ed else ops.to_dtype(diff, ed)
        yf = y if cd == ed else ops.to_dtype(y, ed)
        allowed = ops.add(ops.constant(at, ed), ops.abs(ops.mul(ops.constant(rt, ed), yf)))
        finite = ops.logical_not(ops.logical_or(ops.isnan(diff), ops.isinf(diff)))
        return ops.logical_or(close, ops.logical_and(finite, ops.le(diff, allowed)))
    return pointwise(f, compute_dtype="promote")(a, b, rtol, atol, equal_nan)


# ---- comparisons, logic, where, casts ---------------------------------------------------------------
register_lowering("isfinite")(pointwise(lambda a: ops.logical_not(ops.logical_or(ops.isnan(a), ops.isinf(a))),
                                        compute_dtype="promote"))


@register_lowering("where")
def _where(cond, a, b):
    out = _out_val()
    shape = tuple(out.shape)
    cl = broadcast_loader(cond, shape) if isinstance(cond, TensorBox) else None
    if cl is None:
        raise Unsupported("where with a Python condition")
    la = broadcast_loader(a, shape) if isinstance(a, TensorBox) else a
    lb = broadcast_loader(b, shape) if isinstance(b, TensorBox) else b
    da = a.dtype if isinstance(a, TensorBox) else None
    db = b.dtype if isinstance(b, TensorBox) else None
    cdtype = cond.dtype

    def val(ld, dt, index):
        if dt is None:
            return ops.constant(ld, out.dtype)
        v = ld(index)
        return v if dt == out.dtype else ops.to_dtype(v, out.dtype)

    def inner_fn(index):
        c = cl(index)
        if cdtype != torch.bool:
            c = ops.to_dtype(c, torch.bool)
        return ops.where(c, val(la, da, index), val(lb, db, index))
    return TensorBox(Pointwise(out.dtype, cond.device, shape, inner_fn))


@register_lowering("_to_copy")
def _to_copy(a, dtype=None, device=None, non_blocking=False):
    out = _out_val()
    if device is not None and torch.device(device) != a.device:
        raise Unsupported("device transfer")
    loader = a.make_loader()
    src = a.dtype
    return TensorBox(Pointwise(out.dtype, a.device, tuple(out.shape),
                               lambda idx: loader(idx) if src == out.dtype else ops.to_dtype(loader(idx), out.dtype)))


@register_lowering("copy_")
def _copy_(dst, src, non_blocking=False):
    """A write-back of a mutated graph input (functionalisation leaves only these): the value
    is computed by a kernel like any other and copied into the input by the wrapper."""
    from ..ir import InputBuffer
    if not isinstance(dst.data, InputBuffer):
        raise Unsupported("copy_ into something other than a graph input")
    shape = dst.get_size()
    if isinstance(src, TensorBox):
        ld, sdt = broadcast_loader(src, shape), src.dtype
        val = TensorBox(Pointwise(dst.dtype, dst.device, shape,
                                  lambda i: ld(i) if sdt == dst.dtype else ops.to_dtype(ld(i), dst.dtype)))
    else:
        val = TensorBox(Pointwise(dst.dtype, dst.device, shape, lambda i: ops.constant(src, dst.dtype)))
    V.graph.mutations.append((dst.data, V.graph.realize(val)))
    return dst


@register_lowering("masked_fill")
def _masked_fill(a, mask, value):
    if isinstance(value, TensorBox):
        raise Unsupported("masked_fill with a tensor value")
    out = _out_val()
    shape = tuple(out.shape)
    la, lm = broadcast_loader(a, shape), broadcast_loader(mask, shape)
    return TensorBox(Pointwise(out.dtype, a.device, shape,
                               lambda i: ops.where(lm(i), ops.constant(value, out.dtype), la(i))))


@register_lowering("bitwise_not")
def _bitwise_not(a):
    if a.dtype == torch.bool:
        return pointwise(lambda x: ops.logical_not(x))(a)
    return pointwise(lambda x: ops.bitwise_not(x))(a)


register_lowering("relu6")(pointwise(lambda a: ops.minimum(ops.maximum(a, _c(0)), _c(6))))


@register_lowering("nan_to_num")
def _nan_to_num(a, nan=0.0, posinf=None, neginf=None):
    if not a.dtype.is_floating_point:
        return pointwise(lambda x, *_: x)(a, nan, posinf, neginf)
    fi = torch.finfo(a.dtype)
    pi = fi.max if posinf is None else posinf
    ni = fi.min if neginf is None else neginf

    def f(x, n, p, m):
        y = ops.where(ops.isnan(x), _c(n), x)
        y = ops.where(ops.logical_and(ops.isinf(y), ops.gt(y, _c(0))), _c(p), y)
        return ops.where(ops.logical_and(ops.isinf(y), ops.lt(y, _c(0))), _c(m), y)
    return pointwise(f)(a, nan, pi, ni)


# ---- the ops the ``ops`` interface computes as they are ----------------------------------------------
# A pointwise op of the table that takes only tensors and has the name of an ``ops`` function
# (ops_handler: UNARY, BINARY, COMPARE) of the same arity is that function, unless a rule above says
# otherwise (square, floor/ceil/trunc, remainder, fmod, bitwise_not, pow).  Comparisons (tag
# ``comparison``: eq ... ge, isnan, isinf) compute in the promoted dtype of their inputs; the others
# in the result's dtype, which is bool for the logical ops.
def _interface_rule(op):
    name = op.name
    return pointwise(lambda *a: getattr(ops, name)(*a), compute_dtype="promote" if "comparison" in op.tags else None)


for _op in OPS.values():
    _arity = 1 if _op.name in UNARY else 2 if _op.name in BINARY + COMPARE else None
    if (_arity is not None and "pointwise" in _op.tags and _op.name not in LOWERINGS
            and len(_op.schema.args) == len(_op.schema.tensor_pos) == _arity):
        register_lowering(_op.name)(_interface_rule(_op))
