"""Lowering rules: one per op of the table (chapter §6.2; experiment 3 adds one here).

``register_lowering(name)`` binds a rule to an op-table entry.  A rule receives the op's canonical
arguments — graph values as :class:`TensorBox`, everything else as Python values — and returns a
TensorBox (or a tuple of them).  Most rules are made by two helpers:

* ``pointwise(compute)`` — ``compute`` takes the *values* of the tensor arguments (already
  broadcast to the output shape and converted to the compute dtype, the dtype PyTorch's type
  promotion gives) followed by the op's other arguments, and uses only the ``ops`` interface;
  ``cdt()`` inside it is the compute dtype (for constants)::

      register_lowering("relu")(pointwise(lambda x: ops.maximum(x, ops.constant(0, cdt()))))

* ``reduction(type)`` — sum/prod/amax/... over ``dim`` with ``keepdim``; ``make_reduction`` (one
  result, optionally of a transformed input: nansum, norm, count_nonzero) and
  ``make_multi_reduction`` (the results of one argmax/argmin/welford accumulator: max_dim's values
  and indices, var_mean's m2 and mean).  median/mode/kthvalue are extern kernels (sort-like).

Views of unrealized values remap indices (permute, transpose, expand, slicing with step, select,
unsqueeze/squeeze: affine maps, Prop. 6.2); views of buffers become ReinterpretViews with strides
computed by the op's own kernel on a meta tensor; reshape of an unrealized value materialises it
first (a reshape of a contiguous buffer is free).  Copying shape ops (pad, cat, stack, roll,
repeat, tile, tril/triu) and integer-tensor indexing (gather, index_select, embedding, ``x[idx]``,
...) are index maps too: masked loads and checked indirect loads (bounds.py).
Random ops (rand, randn, randint, bernoulli, dropout, the in-place fills) are Pointwise values of a
counter-based Philox stream: fused into their consumers like any other value.
Pooling (max, average, adaptive) and nearest upsampling are index maps over the window: small
windows unrolled into pointwise kernels that make eager's comparisons and additions in eager's
order (bitwise results), their backward ops eager's scatter loops read as gathers.
matmul/mm/bmm/addmm/linear/conv, the sort-like ops and scans are extern kernels, and so are the
few pooling/upsampling forms whose masked lane-wise gathers measured slower than ATen; anything
without a rule is a fallback kernel.
"""
from __future__ import annotations

import itertools
import math

import sympy
import torch

from . import choices
from .bounds import _fraction
from .ir import Pointwise, Reduction, TensorBox, Unsupported, ReinterpretView, Buffer, contiguous_strides
from .lowering import view_of_buffer
from .ops_handler import ops

__all__ = ["LOWERINGS", "register_lowering", "pointwise", "reduction", "cdt", "V"]

LOWERINGS: dict = {}


class V:
    """The lowering in progress (set by the backend around GraphLowering.run)."""
    graph = None


class _CDT:
    dtype = None
    op = None


def cdt():
    """The compute dtype of the pointwise op being generated (for ``ops.constant``)."""
    return _CDT.dtype


def current_op():
    """The op-table name of the pointwise op being generated (error messages of kernels)."""
    return _CDT.op


def register_lowering(*names):
    def deco(fn):
        for n in names:
            LOWERINGS[n] = fn
        return fn
    return deco


def _node():
    return V.graph.current_node


def _out_val():
    v = _node().meta.get("val")
    if v is None:
        raise Unsupported("node has no meta value")
    return v


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


def _meta_of(a):
    if isinstance(a, TensorBox):
        return torch.empty((), dtype=a.dtype, device="meta") if not a.get_size() else \
            torch.empty(a.get_size(), dtype=a.dtype, device="meta")
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
                    vals.append(ld if ld is None else ops.constant(ld, cd))
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
    return out.device if out.device.type != "meta" else torch.device("cpu")


def _c(v):
    return ops.constant(v, cdt())


# ---- arithmetic ------------------------------------------------------------------------------------
register_lowering("add")(pointwise(lambda a, b, alpha: ops.add(a, b) if alpha == 1 else ops.add(a, ops.mul(b, _c(alpha)))))
register_lowering("sub")(pointwise(lambda a, b, alpha: ops.sub(a, b) if alpha == 1 else ops.sub(a, ops.mul(b, _c(alpha)))))
register_lowering("mul")(pointwise(lambda a, b: ops.mul(a, b)))
register_lowering("neg")(pointwise(lambda a: ops.neg(a)))
register_lowering("abs")(pointwise(lambda a: ops.abs(a)))
register_lowering("reciprocal")(pointwise(lambda a: ops.reciprocal(a)))
register_lowering("square")(pointwise(lambda a: ops.mul(a, a)))
register_lowering("positive", "clone", "contiguous", "alias")(pointwise(lambda a: a))


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


for _name in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
              "tanh", "sigmoid", "erf", "erfc"):
    register_lowering(_name)(pointwise((lambda n: lambda a: getattr(ops, n)(a))(_name)))
for _name in ("floor", "ceil", "trunc"):
    register_lowering(_name)(pointwise((lambda n: lambda a: a if not cdt().is_floating_point else getattr(ops, n)(a))(_name)))


@register_lowering("round")
def _round(a, decimals=0):
    if decimals != 0:
        raise Unsupported("round with decimals")
    return pointwise(lambda x, _d: ops.round(x) if cdt().is_floating_point else x)(a, decimals)


register_lowering("maximum")(pointwise(lambda a, b: ops.maximum(a, b)))
register_lowering("minimum")(pointwise(lambda a, b: ops.minimum(a, b)))
register_lowering("relu")(pointwise(lambda a: ops.maximum(a, _c(0))))
register_lowering("sign")(pointwise(lambda a: ops.sign(a)))


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


@register_lowering("clamp_min")
def _clamp_min(a, mn):
    if isinstance(mn, TensorBox):
        return pointwise(lambda x, y: ops.maximum(x, y))(a, mn)
    return pointwise(lambda x, lo: ops.maximum(x, _c(lo)))(a, mn)


@register_lowering("clamp_max")
def _clamp_max(a, mx):
    if isinstance(mx, TensorBox):
        return pointwise(lambda x, y: ops.minimum(x, y))(a, mx)
    return pointwise(lambda x, hi: ops.minimum(x, _c(hi)))(a, mx)


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
for _name in ("asin", "acos", "atan", "sinh", "cosh"):
    register_lowering(_name)(pointwise((lambda n: lambda a: getattr(ops, n)(a))(_name)))
for _name in ("atan2", "hypot", "bitwise_left_shift", "bitwise_right_shift"):
    register_lowering(_name)(pointwise((lambda n: lambda a, b: getattr(ops, n)(a, b))(_name)))
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


# ---- factories: Pointwise nodes of the index, so that their consumers fuse them ---------------------
def _factory(value):
    """A factory's output as ``value(index)`` over the output shape of the op's meta."""
    out = _out_val()
    return TensorBox(Pointwise(out.dtype, _device((), out), tuple(out.shape), value))


@register_lowering("_zeros", "_ones", "_empty")
def _zeros_ones(size, dtype=None, device=None):
    v = 1 if _node().opdef.name == "_ones" else 0   # _empty: any value will do; zeros are cheapest
    dt = _out_val().dtype
    return _factory(lambda i: ops.constant(v, dt))


@register_lowering("_full")
def _full(size, fill_value, dtype=None, device=None):
    dt = _out_val().dtype
    return _factory(lambda i: ops.constant(fill_value, dt))


@register_lowering("_arange")
def _arange(start, end, step=1, dtype=None, device=None):
    """ATen: start + step * i in the accumulation type (double for floats, int64 for integers,
    where start and step are first truncated to integers)."""
    dt = _out_val().dtype
    acc = torch.float64 if dt.is_floating_point else torch.int64
    if not dt.is_floating_point:
        start, step = int(start), int(step)

    def value(i):
        v = ops.add(ops.constant(start, acc), ops.mul(ops.constant(step, acc), ops.index_expr(i[0], acc)))
        return v if acc == dt else ops.to_dtype(v, dt)
    return _factory(value)


@register_lowering("_linspace")
def _linspace(start, end, steps, dtype=None, device=None):
    """ATen: step = (end - start) / (steps - 1); the first half counts up from start, the second
    half down from end.  Floats compute in their own dtype, integers in double (truncated)."""
    dt = _out_val().dtype
    if steps <= 1:
        return _factory(lambda i: ops.constant(start, dt))
    if dt.is_floating_point:
        cd = dt
        s0, s1 = torch.tensor(start, dtype=dt), torch.tensor(end, dtype=dt)
        step = ((s1 - s0) / (steps - 1)).item()
        start, end = s0.item(), s1.item()
    else:
        cd = torch.float64
        start, end = float(int(start)), float(int(end))
        step = (end - start) / (steps - 1)
    half = steps // 2

    def value(i):
        up = ops.add(ops.constant(start, cd), ops.mul(ops.constant(step, cd), ops.index_expr(i[0], cd)))
        down = ops.sub(ops.constant(end, cd), ops.mul(ops.constant(step, cd), ops.index_expr(steps - 1 - i[0], cd)))
        v = ops.where(ops.lt(ops.index_expr(i[0], torch.int64), ops.constant(half, torch.int64)), up, down)
        return v if cd == dt else ops.to_dtype(v, dt)
    return _factory(value)


@register_lowering("_eye")
def _eye(n, m=None, dtype=None, device=None):
    dt = _out_val().dtype

    def value(i):
        d = ops.eq(ops.index_expr(i[0], torch.int64), ops.index_expr(i[1], torch.int64))
        return d if dt == torch.bool else ops.to_dtype(d, dt)
    return _factory(value)


# ---- random ops: counter-based streams (docs/stax.md "Random numbers") -------------------------------
# Element i of random op k of a graph is Philox4x32-10 of (the seed the call drew, k, i), computed
# inside the consuming kernel: ``x + tp.rand_like(x)`` or dropout is one kernel that writes no
# random tensor.  Being a function of its index like every other value, a random value may be
# inlined into several readers and recomputed: every reader sees the same numbers (dropout's
# output and its saved mask).  The numbers are not eager's (ATen's generator is sequential);
# TP_STAX_FALLBACK_RANDOM=1 calls eager's kernels instead (choices.eager_random).
def _random_stream(shape):
    """A new stream of the graph for a random op of this shape: ``draw(index) -> (seed, offset,
    stream)``, the arguments of ``ops.rand``/``randn``/``randint64`` for element ``index``
    (``offset``: its row-major index as an int64 value)."""
    seed_name, stream = V.graph.random_stream()
    strides = contiguous_strides(shape)

    def draw(i):
        offset = ops.index_expr(sum((s * x for s, x in zip(strides, i)), sympy.Integer(0)), torch.int64)
        return ops.load(seed_name, sympy.Integer(0)), offset, stream
    return draw


def _random_value(fn):
    """The op's output as a Pointwise ``fn(seed, offset, stream)`` of a new stream."""
    if choices.eager_random():
        return V.graph.extern("eager's generator (TP_STAX_FALLBACK_RANDOM=1)")
    out = _out_val()
    draw = _random_stream(tuple(out.shape))
    return TensorBox(Pointwise(out.dtype, _device((), out), tuple(out.shape), lambda i: fn(*draw(i))))


def _floating_random(kind):
    def rule(size, dtype=None, device=None):
        dt = _out_val().dtype
        return _random_value(lambda seed, off, k: getattr(ops, kind)(seed, off, k, dt))
    return rule


register_lowering("_rand")(_floating_random("rand"))
register_lowering("_randn")(_floating_random("randn"))


@register_lowering("_randint")
def _randint(low, high, size, dtype=None, device=None):
    return _random_value(_random_fill(_out_val().dtype, low, high))


def _keep(seed, off, k, p):
    """True with probability 1 - p (ATen's bernoulli_(1 - p) of dropout's mask): u < 1 - p for a
    float32 uniform u = m * 2^-24 (m an integer below 2^24).  m < x holds exactly when m <
    ceil(x), so the test is u < ceil((1 - p) * 2^24) * 2^-24, a float32 constant: no conversion to
    double, the same decisions as comparing with 1 - p in double."""
    u = ops.rand(seed, off, k, torch.float32)
    return ops.lt(u, ops.constant(math.ceil((1.0 - p) * 2.0 ** 24) * 2.0 ** -24, torch.float32))


@register_lowering("bernoulli")
def _bernoulli(x, p=None, generator=None):
    """``bernoulli(x, p)`` with a float p: 1 with probability p in x's dtype.  Tensor probabilities
    stay eager's kernel: it checks them in [0, 1] and raises (a kernel here could not)."""
    if generator is not None:
        raise Unsupported("an explicit generator (eager's kernel draws from it)")
    if p is None:
        raise Unsupported("tensor probabilities (eager checks them in [0, 1])")
    return _random_value(_bernoulli_fill(_out_val().dtype, p))


@register_lowering("native_dropout")
def _native_dropout(x, p, train):
    """``(x * mask * scale, mask)`` with mask true with probability 1 - p and scale = 1/(1 - p)
    (0 for p = 1), in eager's order of operations: a dropped inf or NaN gives NaN, as in eager.
    ``train=False`` is the identity with an all-true mask.  The output and the mask are two
    Pointwise values of the same stream: either may be inlined into its readers."""
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"p={p} outside [0, 1] (eager's kernel raises)")
    dt = x.dtype
    shape = tuple(x.get_size())
    if train is False:
        load = x.make_loader()
        return (TensorBox(Pointwise(dt, x.device, shape, lambda i: load(i))),
                TensorBox(Pointwise(torch.bool, x.device, shape, lambda i: ops.constant(True, torch.bool))))
    if choices.eager_random():
        return V.graph.extern("eager's generator (TP_STAX_FALLBACK_RANDOM=1)")
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    draw = _random_stream(shape)
    load = x.make_loader()

    def keep(i):
        return _keep(*draw(i), p)

    def output(i):
        return ops.mul(ops.mul(load(i), ops.to_dtype(keep(i), dt)), ops.constant(scale, dt))
    return (TensorBox(Pointwise(dt, x.device, shape, output)), TensorBox(Pointwise(torch.bool, x.device, shape, keep)))


# In-place fills: functionalisation applies them to a private clone (passes/functionalize.py), so
# the new value is simply a fresh random value of the clone's shape and dtype.  Each maker checks
# the arguments (what eager would raise on stays eager's kernel) and returns the compute function.
def _fill(make):
    def rule(x, *args):
        *params, generator = args
        if generator is not None:
            raise Unsupported("an explicit generator (eager's kernel draws from it)")
        return _random_value(make(x.dtype, *params))
    return rule


def _uniform_fill(dt, lo, hi):
    if not dt.is_floating_point:
        raise Unsupported("uniform_ of an integer tensor")
    return lambda seed, off, k: ops.add(ops.mul(ops.rand(seed, off, k, dt), ops.constant(hi - lo, dt)),
                                        ops.constant(lo, dt))


def _normal_fill(dt, mean, std):
    if not dt.is_floating_point or std < 0:
        raise Unsupported("normal_ of an integer tensor or with std < 0 (eager raises)")
    return lambda seed, off, k: ops.add(ops.mul(ops.randn(seed, off, k, dt), ops.constant(std, dt)),
                                        ops.constant(mean, dt))


def _exponential_fill(dt, lambd):
    """-log(1 - u) / lambd, u in [0, 1): finite, >= 0."""
    if not dt.is_floating_point or not lambd > 0:
        raise Unsupported("exponential_ of an integer tensor or with lambd <= 0 (eager raises)")
    return lambda seed, off, k: ops.truediv(ops.neg(ops.log1p(ops.neg(ops.rand(seed, off, k, dt)))),
                                            ops.constant(lambd, dt))


def _bernoulli_fill(dt, p):
    if isinstance(p, TensorBox) or not 0 <= p <= 1:
        raise Unsupported("bernoulli_ with tensor probabilities or p outside [0, 1] (eager's kernel)")
    return lambda seed, off, k: ops.to_dtype(ops.logical_not(_keep(seed, off, k, p)), dt)


def _random_fill(dt, lo, hi):
    """Integers on [lo, hi) in dtype dt (randint; random_(from, to) and random_(to))."""
    if lo is not None and hi is None:
        lo, hi = 0, lo
    if lo is None or not lo < hi:
        raise Unsupported(f"no range or an empty range [{lo}, {hi}) (eager's kernel)")

    def value(seed, off, k):
        v = ops.randint64(seed, off, k, lo, hi)
        return v if dt == torch.int64 else ops.to_dtype(v, dt)
    return value


for _name, _make in (("uniform_", _uniform_fill), ("normal_", _normal_fill), ("exponential_", _exponential_fill),
                     ("bernoulli_", _bernoulli_fill), ("random_", _random_fill)):
    register_lowering(_name)(_fill(_make))


# sampling by sorting and searching: library kernels (their consumers still fuse); a seed drawn
# inside a traced program is the generator's call too
for _name in ("_randperm", "multinomial", "_random_seed"):
    register_lowering(_name)(lambda *args: V.graph.extern("library kernel (ATen's generator)"))


# ---- comparisons, logic, where, casts ---------------------------------------------------------------
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register_lowering(_name)(pointwise((lambda n: lambda a, b: getattr(ops, n)(a, b))(_name), compute_dtype="promote"))
for _name in ("logical_and", "logical_or", "logical_xor"):
    register_lowering(_name)(pointwise((lambda n: lambda a, b: getattr(ops, n)(a, b))(_name), compute_dtype=torch.bool))
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    register_lowering(_name)(pointwise((lambda n: lambda a, b: getattr(ops, n)(a, b))(_name)))
register_lowering("logical_not")(pointwise(lambda a: ops.logical_not(a), compute_dtype=torch.bool))
register_lowering("isnan")(pointwise(lambda a: ops.isnan(a), compute_dtype="promote"))
register_lowering("isinf")(pointwise(lambda a: ops.isinf(a), compute_dtype="promote"))
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
    from .ir import InputBuffer
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


# ---- views --------------------------------------------------------------------------------------------
def _view_rule(reindex_builder=None):
    """Views: buffers get a ReinterpretView via the meta trick; unrealized values get an index map
    from ``reindex_builder(in_size, out_size, *args) -> fn(out_index) -> in_index`` (or are
    materialised first when no affine map is known)."""
    def rule(x, *rest):
        node = _node()
        op = node.opdef
        out = node.meta.get("val")
        if isinstance(x.data, (Buffer, ReinterpretView)) or reindex_builder is None:
            def vf(m):
                return op.eager(m, *rest)
            if isinstance(out, (tuple, list)):
                return _multi_view(x, vf)
            try:
                return view_of_buffer(V.graph, x, vf)
            except Unsupported:
                if op.name not in ("reshape", "flatten", "unflatten"):
                    raise
                # reshape of a layout that cannot be viewed: copy to a contiguous buffer (what
                # eager's reshape does), then view that
                ld = x.make_loader()
                copy = TensorBox(Pointwise(x.dtype, x.device, x.get_size(), ld))
                return view_of_buffer(V.graph, copy, vf)
        reindex = reindex_builder(x.get_size(), tuple(out.shape), *rest)
        loader = x.make_loader()
        return TensorBox(Pointwise(x.dtype, x.device, tuple(out.shape), lambda idx: loader(reindex(idx))))
    return rule


def _multi_view(x, vf):
    data = V.graph.realize(x)
    layout = data.layout
    base = data.data if isinstance(data, ReinterpretView) else data
    meta = torch.empty_strided((layout.storage_extent() or 1,), (1,), dtype=layout.dtype, device="meta")
    m = meta.as_strided(layout.size, layout.stride, layout.offset)
    from .ir import FixedLayout
    return tuple(TensorBox(ReinterpretView(base, FixedLayout(layout.dtype, layout.device, tuple(o.shape),
                                                             tuple(o.stride()), o.storage_offset())))
                 for o in vf(m))


def _perm_reindex(in_size, out_size, dims):
    n = len(in_size)
    dims = [d % n for d in dims]

    def f(idx):
        old = [None] * n
        for i, d in enumerate(dims):
            old[d] = idx[i]
        return old
    return f


def _transpose_reindex(in_size, out_size, d0, d1):
    n = len(in_size)
    dims = list(range(n))
    if n:
        d0, d1 = d0 % n, d1 % n
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return _perm_reindex(in_size, out_size, dims)


def _t_reindex(in_size, out_size):
    return _transpose_reindex(in_size, out_size, 0, 1) if len(in_size) == 2 else (lambda idx: list(idx))


def _unsqueeze_reindex(in_size, out_size, dim):
    d = dim % len(out_size)
    return lambda idx: list(idx[:d]) + list(idx[d + 1:])


def _squeeze_reindex(in_size, out_size, dim=None):
    removed = _removed_dims(in_size, out_size, dim)

    def f(idx):   # a removed size-1 dim gets index 0, the others take the output's indices in order
        it = iter(idx)
        return [sympy.Integer(0) if d in removed else next(it) for d in range(len(in_size))]
    return f


def _removed_dims(in_size, out_size, dim):
    n = len(in_size)
    if dim is None:
        return {d for d in range(n) if in_size[d] == 1}
    dims = [dim] if isinstance(dim, int) else list(dim)
    return {d % n for d in dims if in_size[d % n] == 1} if n else set()


def _expand_reindex(in_size, out_size, *rest):
    k, n = len(in_size), len(out_size)
    return lambda idx: [sympy.Integer(0) if in_size[j] == 1 and out_size[n - k + j] != 1 else idx[n - k + j]
                        for j in range(k)]


def _getitem_plan(in_size, indices):
    """Basic indexing (ints, slices, None, Ellipsis) per input dim: ("int", k) or ("slice", start,
    step, out_pos), the dims of the result that None adds taking no input dim."""
    if not isinstance(indices, tuple):
        indices = (indices,)
    n_real = sum(1 for i in indices if i is not None and i is not Ellipsis)
    if any(i is Ellipsis for i in indices):
        pos = indices.index(Ellipsis)
        fill = (slice(None),) * (len(in_size) - n_real)
        indices = indices[:pos] + fill + indices[pos + 1:]
    else:
        indices = indices + (slice(None),) * (len(in_size) - n_real)
    plan = []   # per input dim: ("int", k) or ("slice", start, step, out_pos)
    out_pos = 0
    d = 0
    for it in indices:
        if it is None:
            out_pos += 1
            continue
        if isinstance(it, int):
            plan.append(("int", it % in_size[d] if in_size[d] else 0))
        else:
            start, stop, step = it.indices(in_size[d])
            plan.append(("slice", start, step, out_pos))
            out_pos += 1
        d += 1
    return plan


def _getitem_reindex(in_size, out_size, indices):
    plan = _getitem_plan(in_size, indices)

    def f(idx):
        old = []
        for p in plan:
            if p[0] == "int":
                old.append(sympy.Integer(p[1]))
            else:
                old.append(p[1] + p[2] * idx[p[3]])
        return old
    return f


def _select_reindex(in_size, out_size, dim, index):
    d = dim % len(in_size)
    k = index % in_size[d]
    return lambda idx: list(idx[:d]) + [sympy.Integer(k)] + list(idx[d:])


def _narrow_reindex(in_size, out_size, dim, start, length):
    d = dim % len(in_size)
    s = start % in_size[d] if start < 0 else start
    return lambda idx: list(idx[:d]) + [idx[d] + s] + list(idx[d + 1:])


register_lowering("permute")(_view_rule(_perm_reindex))
register_lowering("transpose", "swapaxes")(_view_rule(_transpose_reindex))
register_lowering("t")(_view_rule(_t_reindex))
register_lowering("unsqueeze")(_view_rule(_unsqueeze_reindex))
register_lowering("squeeze")(_view_rule(_squeeze_reindex))
register_lowering("expand", "broadcast_to")(_view_rule(_expand_reindex))
register_lowering("getitem")(_view_rule(_getitem_reindex))
register_lowering("select")(_view_rule(_select_reindex))
register_lowering("narrow")(_view_rule(_narrow_reindex))
for _name in ("view", "reshape", "flatten", "unflatten", "diagonal", "as_strided", "movedim", "split", "chunk",
              "unbind"):
    register_lowering(_name)(_view_rule(None))


@register_lowering("expand_as", "view_as", "reshape_as")
def _as(x, other):
    return _view_rule(None)(x, other.get_size() if isinstance(other, TensorBox) else other)


# ---- shape ops and indexing: masked loads, floor/Mod index maps, checked indirect loads ---------------
# pad (all modes), cat, stack, roll and the regions of reflect/replicate/circular padding read their
# input under ops.masked (a lane outside the mask never touches memory; bounds.py proves each load
# in range where its mask holds), and so does _getitem_backward (the gradient of basic indexing:
# zeros with the gradient on the view's lattice).  repeat/tile (and roll with dims=None) are
# Mod/floor index maps.
# index_select, gather, take_along_dim, embedding, index (integer tensors) and index_fill load their
# indices and check them in the kernel (ops.indirect_indexing): a bad index raises IndexError after
# the kernel, naming the op, the value and the size.  scatter, scatter_add, index_add, index_put
# and masked_select (and `index` with a bool mask: a data-dependent shape) stay fallback kernels.
def _ix(e):
    return ops.index_expr(e, torch.int64)


def _icmp(e, op, k):
    """The bool value ``e <op> k`` (e: an index expression, k: an int) — a mask bounds.py reads."""
    return getattr(ops, op)(_ix(e), ops.constant(int(k), torch.int64))


def _and(a, b):
    return b if a is None else (a if b is None else ops.logical_and(a, b))


def _cast(v, src, dst):
    return v if src == dst else ops.to_dtype(v, dst)


def _at(idx, d, e):
    j = list(idx)
    j[d] = e
    return j


def _region(cond, body):
    return body() if cond is None else ops.masked(cond, body, 0)


def _pieces(i, parts, total):
    """Select along one output index ``i`` in [0, total): ``parts`` = [(start, length, body)] in
    order, contiguous; each body runs under the mask of its own range, the value of the later
    parts being its ``other`` (a vector inside one range runs one body and no select)."""
    v = None
    for s, n, body in reversed(parts):
        cond = _and(_icmp(i, "ge", s) if s > 0 else None, _icmp(i, "lt", s + n) if s + n < total else None)
        v = _region(cond, body) if v is None else ops.masked(cond, body, v)
    return v


def _box(out, fn, device):
    return TensorBox(Pointwise(out.dtype, device, tuple(out.shape), fn))


@register_lowering("_diagonal_backward")
def _diagonal_backward(grad, size, offset, dim1, dim2):
    """The gradient of ``diagonal``: zeros of ``size`` with ``grad`` where ``i[dim2] - i[dim1] ==
    offset`` (a masked index map), reading the diagonal's element ``i[dim1]`` (``i[dim2]`` for a
    negative offset)."""
    out, gl, n = _out_val(), grad.make_loader(), len(size)
    d1, d2 = dim1 % n, dim2 % n
    if d1 == d2:
        raise Unsupported("_diagonal_backward with dim1 == dim2 (eager raises)")
    length = grad.get_size()[-1]

    def f(i):
        rest = [i[k] for k in range(n) if k not in (d1, d2)]
        k = i[d1] if offset >= 0 else i[d2]
        # k < length follows from the diagonal's equation; said as a conjunct, bounds.py can use it
        cond = _and(_icmp(i[d2] - i[d1], "eq", offset), _icmp(k, "lt", length))
        return ops.masked(cond, lambda: _conv(gl(rest + [k]), grad.dtype, out.dtype), 0)
    return _box(out, f, grad.device)


@register_lowering("_getitem_backward")
def _getitem_backward(grad, size, indices):
    """The gradient of a basic-indexing view: zeros of the input's ``size`` with ``grad`` at the
    positions the view selected -- an index map with a mask, like pad: position i is on the view's
    lattice when i == k for an int and ``start <= i``, ``(i - start) % step == 0``,
    ``(i - start) / step < len`` for a slice; there it reads ``grad[(i - start) / step, ...]``."""
    if any(not (it is None or it is Ellipsis or isinstance(it, (int, slice)))
           for it in (indices if isinstance(indices, tuple) else (indices,))):
        raise Unsupported("_getitem_backward of advanced indexing")
    out, gsize, gl = _out_val(), grad.get_size(), grad.make_loader()
    plan = _getitem_plan(list(size), indices)

    def f(i):
        gidx = [sympy.Integer(0)] * len(gsize)
        cond = None
        for d, p in enumerate(plan):
            if p[0] == "int":
                cond = _and(cond, _icmp(i[d], "eq", p[1]))
                continue
            _, start, step, pos = p
            rel = i[d] - start
            cond = _and(_and(cond, _icmp(rel, "ge", 0)), _icmp(rel, "lt", step * gsize[pos]))
            if step != 1:   # Mod and floor of i + lift - start >= 0 (lift: a multiple of step >= start)
                lift = step * (-(-start // step))
                cond = _and(cond, _icmp(sympy.Mod(i[d] + lift - start, step), "eq", 0))
                rel = sympy.floor((i[d] + lift - start) / step) - lift // step
            gidx[pos] = rel
        return _region(cond, lambda: _conv(gl(gidx), grad.dtype, out.dtype))
    return _box(out, f, grad.device)


@register_lowering("pad")
def _pad(x, pad, mode="constant", value=None):
    out = _out_val()
    size = x.get_size()
    nd = len(size)
    pad = list(pad)
    if len(pad) % 2 or len(pad) // 2 > nd:
        raise Unsupported("pad: bad pad length (eager raises)")
    ld = x.make_loader()
    dims = [(nd - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]
    if mode == "constant":
        fill = 0 if value is None else value

        def f(idx):
            cond = None
            for d, lo, hi in dims:
                if lo > 0:
                    cond = _and(cond, _icmp(idx[d], "ge", lo))
                if hi > 0:
                    cond = _and(cond, _icmp(idx[d], "lt", lo + size[d]))
            src = list(idx)
            for d, lo, _ in dims:
                src[d] = idx[d] - lo
            return ld(src) if cond is None else ops.masked(cond, lambda: ld(src), fill)
        return _box(out, f, x.device)
    if mode not in ("reflect", "replicate", "circular"):
        raise Unsupported(f"pad mode {mode!r}")
    for d, lo, hi in dims:
        n = size[d]
        limit = {"reflect": n - 1, "replicate": None if n else -1, "circular": n}[mode]
        if lo < 0 or hi < 0 or (limit is not None and max(lo, hi) > limit):
            raise Unsupported(f"{mode} pad of {lo}, {hi} for a dim of size {n} (eager's rule)")

    def pad_dim(inner, d, lo, hi):
        n = size[d]

        def f(idx):
            i = idx[d]
            src = {"reflect": (lo - i, 2 * (n - 1) + lo - i), "replicate": (sympy.Integer(0), sympy.Integer(n - 1)),
                   "circular": (i - lo + n, i - lo - n)}[mode]
            parts = [(0, lo, lambda: inner(_at(idx, d, src[0]))), (lo, n, lambda: inner(_at(idx, d, i - lo))),
                     (lo + n, hi, lambda: inner(_at(idx, d, src[1])))]
            return _pieces(i, [p for p in parts if p[1] > 0], lo + n + hi)
        return f
    for d, lo, hi in dims:
        ld = pad_dim(ld, d, lo, hi)
    return _box(out, ld, x.device)


@register_lowering("cat", "stack")
def _cat(tensors, dim=0):
    """One kernel writes the output; input k is read under the mask of its own range of ``dim``."""
    out = _out_val()
    shape = tuple(out.shape)
    if not all(isinstance(t, TensorBox) for t in tensors) or not shape:
        raise Unsupported("cat of non-tensors / 0-d output")
    stack = _node().opdef.name == "stack"
    d = dim % len(shape)
    parts, off = [], 0
    for t in tensors:
        ts = t.get_size()
        if not stack and len(ts) == 1 and ts[0] == 0 and len(shape) != 1:
            continue                      # legacy: empty 1-d inputs are skipped
        n = 1 if stack else ts[d]
        if n:
            parts.append((off, n, t.make_loader(), t.dtype))
        off += n
    if off != shape[d]:
        raise Unsupported("cat: the inputs do not add up to the output (eager raises)")

    def f(idx):
        i = idx[d]
        if not parts:
            return ops.constant(0, out.dtype)

        def body(s, ld, dt):
            j = idx[:d] + idx[d + 1:] if stack else _at(idx, d, i - s)
            return lambda: _cast(ld(j), dt, out.dtype)
        return _pieces(i, [(s, n, body(s, ld, dt)) for s, n, ld, dt in parts], shape[d])
    return _box(out, f, tensors[0].device)


@register_lowering("tril", "triu")
def _tril(x, diagonal=0):
    out = _out_val()
    if len(x.get_size()) < 2:
        raise Unsupported("tril/triu of a tensor with fewer than 2 dims (eager raises)")
    ld = x.make_loader()
    keep = "le" if _node().opdef.name == "tril" else "ge"
    return _box(out, lambda idx: ops.where(_icmp(idx[-1] - idx[-2], keep, diagonal), ld(idx),
                                           ops.constant(0, out.dtype)), x.device)


def _int_list(v):
    return [v] if isinstance(v, int) else list(v)


@register_lowering("roll")
def _roll(x, shifts, dims=None):
    out = _out_val()
    size = x.get_size()
    ld = x.make_loader()
    shifts = _int_list(shifts)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        if len(shifts) != 1:
            raise Unsupported("roll without dims takes one shift (eager raises)")
        numel = math.prod(size)
        if numel == 0 or len(size) == 0:
            return _box(out, ld, x.device)
        s = shifts[0] % numel
        cs = [math.prod(size[k + 1:]) for k in range(len(size))]

        def flat(idx):   # out.flat[f] = x.flat[(f - s) mod numel]
            g = sympy.Mod(sum(i * c for i, c in zip(idx, cs)) + (numel - s), numel)
            return ld([sympy.Mod(sympy.floor(g / c), n) if n > 1 else sympy.Integer(0) for c, n in zip(cs, size)])
        return _box(out, flat, x.device)
    dims = _int_list(dims)
    if len(dims) != len(shifts) or not size:
        raise Unsupported("roll: shifts and dims differ in length (eager raises)")
    for dd, sh in zip(dims, shifts):
        d = dd % len(size)
        n = size[d]
        s = sh % n if n else 0
        if s == 0:
            continue

        def rolled(inner, d, n, s):
            def f(idx):
                i = idx[d]
                return _pieces(i, [(0, s, lambda: inner(_at(idx, d, i - s + n))),
                                   (s, n - s, lambda: inner(_at(idx, d, i - s)))], n)
            return f
        ld = rolled(ld, d, n, s)
    return _box(out, ld, x.device)


def _tiled(x, reps, out):
    size = x.get_size()
    lead = len(reps) - len(size)
    if lead < 0:
        raise Unsupported("repeat with fewer repeats than dims (eager raises)")
    ld = x.make_loader()

    def f(idx):
        src = []
        for k, n in enumerate(size):
            i = idx[lead + k]
            src.append(sympy.Integer(0) if n == 1 else (i if reps[lead + k] == 1 else sympy.Mod(i, n)))
        return ld(src)
    return _box(out, f, x.device)


@register_lowering("repeat")
def _repeat(x, repeats):
    return _tiled(x, list(repeats), _out_val())


@register_lowering("tile")
def _tile(x, dims):
    dims = list(dims)
    nd = len(x.get_size())
    return _tiled(x, [1] * (nd - len(dims)) + dims, _out_val())


# -- indirect loads ---------------------------------------------------------------------------------
def _checked(value, size, op, dim, wrap=False, message=None):
    """A loaded index as an index expression, checked in the kernel against [0, size)."""
    from .bounds import IndirectIndex
    msg = message or (f"IndexError: tp.{op}: index {{value}} is out of bounds for dimension {dim} "
                      f"with size {size}")
    return IndirectIndex(ops.indirect_indexing(value, size, wrap, msg), size)


def _index_tensor(t, op):
    if not isinstance(t, TensorBox) or t.dtype not in (torch.int32, torch.int64):
        raise Unsupported(f"{op}: the index must be an int32/int64 tensor")
    return t


def _dim_index(x, dim, index, op):
    """index_select/index_fill: (x's size, dim, the index's loader taking a position k)."""
    size = x.get_size()
    _index_tensor(index, op)
    if not size or len(index.get_size()) > 1:
        raise Unsupported(f"{op} of a 0-d tensor or with a multi-dim index")
    il, one = index.make_loader(), len(index.get_size()) == 1
    return size, dim % len(size), lambda k: il([k] if one else [])


@register_lowering("index_select")
def _index_select(x, dim, index):
    size, d, il = _dim_index(x, dim, index, "index_select")
    xl = x.make_loader()
    return _box(_out_val(), lambda idx: xl(_at(idx, d, _checked(il(idx[d]), size[d], "index_select", d))), x.device)


@register_lowering("gather")
def _gather(x, dim, index, sparse_grad=False):
    out = _out_val()
    size, isize = x.get_size(), _index_tensor(index, "gather").get_size()
    if not size or len(size) != len(isize):
        raise Unsupported("gather with 0-d or different-rank operands")
    d = dim % len(size)
    if any(isize[k] > size[k] for k in range(len(size)) if k != d):
        raise Unsupported("gather: index larger than the input outside dim (eager raises)")
    xl, il = x.make_loader(), index.make_loader()
    return _box(out, lambda idx: xl(_at(idx, d, _checked(il(idx), size[d], "gather", d))), x.device)


@register_lowering("take_along_dim")
def _take_along_dim(x, indices, dim=None):
    out = _out_val()
    shape = tuple(out.shape)
    size = x.get_size()
    _index_tensor(indices, "take_along_dim")
    xl = x.make_loader()
    if dim is None:   # x.flatten()[indices.flatten()]
        isize = indices.get_size()
        il = indices.make_loader()
        numel = math.prod(size)

        def unflat(f, shp):
            cs = [math.prod(shp[k + 1:]) for k in range(len(shp))]
            return [sympy.Integer(0) if n == 1 else sympy.Mod(sympy.floor(f / c), n) for c, n in zip(cs, shp)]

        def g(idx):
            k = _checked(il(unflat(idx[0], isize)), numel, "take_along_dim", 0)
            return xl(unflat(k, size))
        return _box(out, g, x.device)
    if len(size) != len(shape) or not size:
        raise Unsupported("take_along_dim with different ranks")
    d = dim % len(size)
    il = broadcast_loader(indices, shape)

    def f(idx):
        src = [sympy.Integer(0) if size[k] == 1 else idx[k] for k in range(len(size))]
        src[d] = _checked(il(idx), size[d], "take_along_dim", d)
        return xl(src)
    return _box(out, f, x.device)


@register_lowering("embedding")
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    out = _out_val()
    if len(weight.get_size()) != 2:
        raise Unsupported("embedding with a weight that is not 2-d")
    rows = weight.get_size()[0]
    wl, il = weight.make_loader(), _index_tensor(indices, "embedding").make_loader()
    msg = (f"IndexError: tp.embedding: index {{value}} is out of range for a weight of {rows} rows "
           f"(valid: 0..{rows - 1})")
    return _box(out, lambda idx: wl([_checked(il(idx[:-1]), rows, "embedding", 0, message=msg), idx[-1]]),
                weight.device)


@register_lowering("index")
def _index(x, indices):
    """Advanced indexing with integer tensors (and ints, slices, None, Ellipsis): the tensor
    indices broadcast together; their dims replace the indexed dims in place when the advanced
    indices are adjacent, else they come first (torch/numpy rule).  Negative indices wrap."""
    out = _out_val()
    size = x.get_size()
    nd = len(size)
    items = list(indices) if isinstance(indices, tuple) else [indices]
    for it in items:
        if isinstance(it, TensorBox):
            if it.dtype == torch.bool:
                # the output's length is the mask's count (a data gate of capture, like unique's):
                # ATen's kernel; the ops around it fuse into Stax kernels
                return V.graph.extern("library kernel (ATen): a bool mask's output shape depends on data")
            if it.dtype not in (torch.int32, torch.int64):
                raise Unsupported("index with a float index (eager raises)")
        elif not (it is None or it is Ellipsis or isinstance(it, slice) or
                  (isinstance(it, int) and not isinstance(it, bool))):
            raise Unsupported(f"index item {type(it).__name__}")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if Ellipsis in items:
        p = items.index(Ellipsis)
        items[p:p + 1] = [slice(None)] * (nd - used)
    else:
        items += [slice(None)] * (nd - used)
    tens = [it for it in items if isinstance(it, TensorBox)]
    if not tens or len(items) - items.count(None) != nd:
        raise Unsupported("index without tensor indices / too many indices")
    bshape = tuple(torch.broadcast_shapes(*[t.get_size() for t in tens]))
    plan, d = [], 0          # ("basic", in dim or None, start, step, length) / ("adv", in dim, item)
    for it in items:
        if it is None:
            plan.append(("basic", None, 0, 0, 1))
        elif isinstance(it, slice):
            start, stop, step = it.indices(size[d])
            plan.append(("basic", d, start, step, len(range(start, stop, step))))
            d += 1
        else:
            if isinstance(it, int) and not -size[d] <= it < size[d]:
                raise Unsupported("index: an int index out of range (eager raises)")
            plan.append(("adv", d, it))
            d += 1
    adv = [k for k, p in enumerate(plan) if p[0] == "adv"]
    adjacent = adv == list(range(adv[0], adv[-1] + 1))
    first = adv[0] if adjacent else 0
    basic = [p for p in plan if p[0] == "basic"]
    nb = sum(1 for p in plan[:first] if p[0] == "basic") if adjacent else 0
    oshape = [p[4] for p in basic[:nb]] + list(bshape) + [p[4] for p in basic[nb:]]
    if tuple(oshape) != tuple(out.shape):
        raise Unsupported(f"index: shape rule mismatch {oshape} vs {list(out.shape)}")
    xl = x.make_loader()
    loaders = {id(t): broadcast_loader(t, bshape) for t in tens}

    def f(idx):
        bidx = list(idx[nb:nb + len(bshape)])
        rest = list(idx[:nb]) + list(idx[nb + len(bshape):])
        src, r = [None] * nd, iter(rest)
        for p in plan:
            if p[0] == "basic":
                i = next(r)
                if p[1] is not None:
                    src[p[1]] = p[2] + p[3] * i
            elif isinstance(p[2], int):
                src[p[1]] = sympy.Integer(p[2] % size[p[1]])
            else:
                src[p[1]] = _checked(loaders[id(p[2])](bidx), size[p[1]], "index", p[1], wrap=True)
        return xl(src)
    return _box(out, f, x.device)


@register_lowering("index_fill")
def _index_fill(x, dim, index, value):
    """out = where(hit[i_dim], value, x): ``hit`` (one bool per position of ``dim``) is an ``any``
    reduction over the index entries, each checked (negative entries wrap, like eager)."""
    out = _out_val()
    size, d, il = _dim_index(x, dim, index, "index_fill")
    n, k = size[d], math.prod(index.get_size())

    def member(i, r):
        j = _checked(il(r[0]), n, "index_fill", d, wrap=True)
        return ops.eq(_ix(j), _ix(i[0]))
    hit = _realize(TensorBox(Reduction(torch.bool, x.device, (n,), (k,), "any", member, torch.bool)))
    hl, xl = hit.make_loader(), x.make_loader()
    vl = value.make_loader() if isinstance(value, TensorBox) else None
    vdt = value.dtype if vl is not None else None

    def f(idx):
        v = _cast(vl([]), vdt, out.dtype) if vl is not None else ops.constant(value, out.dtype)
        return ops.where(hl([idx[d]]), v, xl(idx))
    return _box(out, f, x.device)


@register_lowering("one_hot")
def _one_hot(x, num_classes=-1):
    out = _out_val()
    if num_classes < 0 or x.dtype != torch.int64:
        raise Unsupported("one_hot with num_classes=-1 (a data-dependent shape) or a non-int64 input")
    xl = x.make_loader()
    msg = f"RuntimeError: tp.one_hot: class value {{value}} is out of range for num_classes={num_classes}"

    def f(idx):
        v = xl(idx[:-1])
        ops.indirect_indexing(v, num_classes, False, msg)      # the check only
        return ops.to_dtype(ops.eq(v, _ix(idx[-1])), torch.int64)
    return _box(out, f, x.device)


# ---- reductions -----------------------------------------------------------------------------------------
def _norm_dims(dim, n):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % n for d in dim}) if n else []


def _conv(v, src, dst):
    return v if dst is None or src == dst else ops.to_dtype(v, dst)


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
    if not out.is_floating_point:
        raise Unsupported("norm of integers")
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


@register_lowering("any", "all")
def _any(x, dim=None, keepdim=False):
    return make_reduction(x, dim, keepdim, _node().opdef.name, torch.bool, acc_dtype=torch.bool)


def _div_by(box, n, dtype):
    loader = box.make_loader()
    return TensorBox(Pointwise(dtype, box.device, box.get_size(),
                               lambda i: ops.truediv(loader(i), ops.constant(float(n), dtype))))


def _realize(box):
    V.graph.realize(box)
    return box


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
    denom = max(n - correction, 0)
    m2l, ml = w["m2"].make_loader(), w["mean"].make_loader()
    size = w["m2"].get_size()

    def out(v):
        return v if acc == dtype else ops.to_dtype(v, dtype)
    var = TensorBox(Pointwise(dtype, x.device, size, lambda i: out(ops.truediv(m2l(i), ops.constant(float(denom), acc)))))
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
    denom = max(n - correction, 0)
    var = TensorBox(Pointwise(dtype, x.device, ss.get_size(),
                              (lambda L: lambda i: ops.truediv(L(i), ops.constant(float(denom), dtype)))(ss.make_loader())))
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


@register_lowering("bitwise_not")
def _bitwise_not(a):
    if a.dtype == torch.bool:
        return pointwise(lambda x: ops.logical_not(x))(a)
    return pointwise(lambda x: ops.bitwise_not(x))(a)


@register_lowering("flip")
def _flip(a, dims):
    """flip is a copy in eager but an index map here: out[.., i, ..] = a[.., n-1-i, ..]."""
    size = a.get_size()
    nd = len(size)
    ds = {d % nd for d in ([dims] if isinstance(dims, int) else dims)} if nd else set()
    loader = a.make_loader()
    return TensorBox(Pointwise(a.dtype, a.device, size,
                               lambda idx: loader([(size[d] - 1 - idx[d]) if d in ds else idx[d] for d in range(nd)])))


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


@register_lowering("logsumexp")
def _logsumexp(x, dim, keepdim=False):
    out = _out_val()
    if not x.dtype.is_floating_point:
        raise Unsupported("logsumexp of integers")
    size = x.get_size()
    if any(size[d] == 0 for d in _norm_dims(dim, len(size))):
        # log of an empty sum: -inf, as in eager (its max over the empty dim is never taken)
        return TensorBox(Pointwise(out.dtype, x.device, tuple(out.shape),
                                   lambda i: ops.constant(float("-inf"), out.dtype)))
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
    return TensorBox(Pointwise(out.dtype, x.device, tuple(out.shape), fin))


# ---- nn ops -----------------------------------------------------------------------------------------------
def _softmax_parts(x, dim, dtype):
    xl0 = x.make_loader()
    src = x
    if dtype != x.dtype:
        src = TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.to_dtype(xl0(i), dtype)))
    m = _realize(make_reduction(src, dim, True, "max", dtype))
    ml = broadcast_loader(m, x.get_size())
    xl = src.make_loader()

    def shifted(i):
        return ops.sub(xl(i), ml(i))
    return src, shifted


@register_lowering("softmax")
def _softmax(x, dim, dtype=None):
    out = _out_val()
    if not out.dtype.is_floating_point:
        raise Unsupported("softmax of integers")
    if math.prod(x.get_size()) == 0:   # empty input: empty output, nothing to reduce
        return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.constant(0.0, out.dtype)))
    src, shifted = _softmax_parts(x, dim, out.dtype)
    # e is read twice (the sum and the division): over the trailing dim, realized, it becomes a
    # per-row scratch value of the one fused kernel, so exp runs once per element (as in the five-op
    # softmax); over another dim it would be a separate pass through memory, and a row too long for
    # the scratch (choices.SCRATCH_MAX_BYTES) would be refused -- recompute it instead
    e = TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    nd = max(len(x.get_size()), 1)      # a 0-d input behaves as one element along dim -1
    row = x.get_size()[dim % nd] if x.get_size() else 1
    if dim % nd == nd - 1 and row * 8 <= choices.SCRATCH_MAX_BYTES:
        _realize(e)
    s = make_reduction(e, dim, True, "sum", out.dtype)
    # one reciprocal per row, then a multiply per element — what eager's softmax kernel does
    # (a division per element costs several multiplies; the extra rounding is within the error model)
    sl0 = _realize(s).make_loader()
    r = _realize(TensorBox(Pointwise(out.dtype, x.device, s.get_size(), lambda i: ops.reciprocal(sl0(i)))))
    rl = broadcast_loader(r, x.get_size())
    el = e.make_loader()
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.mul(el(i), rl(i))))


@register_lowering("log_softmax")
def _log_softmax(x, dim, dtype=None):
    return _log_softmax_of(x, dim, _out_val().dtype)


def _log_softmax_of(x, dim, dtype):
    if not dtype.is_floating_point:
        raise Unsupported("log_softmax of integers")
    if math.prod(x.get_size()) == 0:
        return TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.constant(0.0, dtype)))
    src, shifted = _softmax_parts(x, dim, dtype)
    e = TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    s = _realize(make_reduction(e, dim, True, "sum", dtype))
    sl = broadcast_loader(s, x.get_size())
    return TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.sub(shifted(i), ops.log(sl(i)))))


def _normalized(x, mean, var, eps, weight, bias, dt):
    """The compute function ``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]`` of layer_norm,
    batch_norm and group_norm: every argument a loader over the output index (weight/bias None
    when absent), eps a constant of dtype ``dt``."""
    def f(i):
        y = ops.mul(ops.sub(x(i), mean(i)), ops.rsqrt(ops.add(var(i), ops.constant(float(eps), dt))))
        if weight is not None:
            y = ops.mul(y, weight(i))
        return ops.add(y, bias(i)) if bias is not None else y
    return f


def _channel_loader(t, dt):
    """A per-channel (C,) tensor as a loader over an (N, C, ...) index, converted to ``dt``; None
    for an absent (non-tensor) argument."""
    if not isinstance(t, TensorBox):
        return None
    ld = t.make_loader()
    return lambda i: _conv(ld([i[1]]), t.dtype, dt)


@register_lowering("layer_norm")
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("layer_norm dtype")
    n = len(x.get_size())
    k = len(normalized_shape)
    dims = list(range(n - k, n))
    var, mean = LAYER_NORM_STATS(x, dims, 0, True, x.dtype)
    vl, mlo = broadcast_loader(var, x.get_size()), broadcast_loader(mean, x.get_size())
    wl = broadcast_loader(weight, x.get_size()) if isinstance(weight, TensorBox) else None
    bl = broadcast_loader(bias, x.get_size()) if isinstance(bias, TensorBox) else None
    f = _normalized(x.make_loader(), mlo, vl, eps, wl, bl, x.dtype)
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), f))


@register_lowering("batch_norm")
def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Eval mode: an affine map per channel (dim 1) with the running statistics, one pointwise
    kernel that fuses with its neighbours (conv -> batch_norm -> relu: the conv is an extern kernel,
    the rest one Stax kernel).  Without running statistics: the batch statistics (biased variance,
    Welford over every dim but 1).  Training mode with running statistics also updates them in
    place, as eager does: ``r = momentum * batch + (1 - momentum) * r`` with the unbiased batch
    variance, written back into the graph inputs they are (the wrapper's copy after the kernels,
    like every mutated input: ``copy_``); running statistics that are not graph inputs, or that the
    graph reads again, keep the fallback kernel (eager)."""
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("batch_norm dtype")
    size = x.get_size()
    if len(size) < 2:
        raise Unsupported("batch_norm of fewer than 2 dims (eager raises)")
    tracked = [isinstance(t, TensorBox) for t in (running_mean, running_var)]
    if any(tracked) and not all(tracked):
        raise Unsupported("batch_norm with only one of running_mean / running_var")
    dt = out.dtype
    if all(tracked) and not training:
        ml, vl = _channel_loader(running_mean, dt), _channel_loader(running_var, dt)
    else:
        rdims = [0] + list(range(2, len(size)))
        var, mean = _var_parts(x, rdims, 0, True, dt)
        ml, vl = broadcast_loader(mean, size), broadcast_loader(var, size)
        if all(tracked):
            _update_running_stats(running_mean, running_var, mean, var, math.prod(size[d] for d in rdims), momentum)
    xl = x.make_loader()
    f = _normalized(lambda i: _conv(xl(i), x.dtype, dt), ml, vl, eps, _channel_loader(weight, dt),
                    _channel_loader(bias, dt), dt)
    return TensorBox(Pointwise(dt, x.device, size, f))


def _update_running_stats(running_mean, running_var, mean, var, n, momentum):
    """batch_norm's in-place update of its running statistics, as write-backs of graph inputs:
    ``momentum * batch + (1 - momentum) * running`` per channel, the variance unbiased (n/(n-1))."""
    from .ir import InputBuffer
    node = _node()
    for arg, box in zip(node.args[3:5], (running_mean, running_var)):
        if not isinstance(box.data, InputBuffer) or len(getattr(arg, "users", ())) != 1 or \
                box.dtype not in (torch.float32, torch.float64) or len(box.get_size()) != 1:
            raise Unsupported("batch_norm in training mode: the running statistics must be graph inputs "
                              "that nothing else in the graph reads (their in-place update)")
    c = running_mean.get_size()[0]
    for box, stat, factor in ((running_mean, mean, 1.0), (running_var, var, n / (n - 1) if n > 1 else math.nan)):
        dt, rl, sl = box.dtype, box.make_loader(), stat.make_loader()
        zeros = [sympy.Integer(0)] * (len(stat.get_size()) - 2)

        def new(i, dt=dt, rl=rl, sl=sl, factor=factor, zeros=zeros):
            b = _conv(sl([sympy.Integer(0), i[0]] + zeros), stat.dtype, dt)
            if factor != 1.0:
                b = ops.mul(b, ops.constant(factor, dt))
            return ops.add(ops.mul(ops.constant(momentum, dt), b),
                           ops.mul(ops.constant(1.0 - momentum, dt), rl(i)))
        V.graph.mutations.append((box.data, V.graph.realize(TensorBox(Pointwise(dt, box.device, [c], new)))))


@register_lowering("group_norm")
def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Statistics of each (sample, group) over its C/G channels and the spatial dims: a Welford
    reduction of the index map (N, G, C/G, *spatial) -> x[n, g*C/G + c, ...] (no copy), then a
    pointwise kernel reading the group's statistics at ``floor(channel / (C/G))``."""
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("group_norm dtype")
    size = list(x.get_size())
    if len(size) < 2 or num_groups <= 0 or size[1] % num_groups:
        raise Unsupported("group_norm: channels not divisible by num_groups (eager raises)")
    n, c, rest = size[0], size[1], size[2:]
    cpg, dt, xl = c // num_groups, out.dtype, x.make_loader()
    grouped = TensorBox(Pointwise(x.dtype, x.device, [n, num_groups, cpg] + rest,
                                  lambda i: xl([i[0], i[1] * cpg + i[2]] + list(i[3:]))))
    var, mean = _var_parts(grouped, list(range(2, 3 + len(rest))), 0, True, dt)
    vl, ml = var.make_loader(), mean.make_loader()
    zeros = [sympy.Integer(0)] * (1 + len(rest))

    def group_of(i):
        return [i[0], sympy.floor(i[1] / cpg)] + zeros
    f = _normalized(lambda i: _conv(xl(i), x.dtype, dt), lambda i: ml(group_of(i)), lambda i: vl(group_of(i)),
                    eps, _channel_loader(weight, dt), _channel_loader(bias, dt), dt)
    return TensorBox(Pointwise(dt, x.device, size, f))


@register_lowering("avg_pool2d")
def _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """A sum reduction over the window of the index map (..., OH, OW, KH, KW) -> x[..., oh*sH - pH + kh,
    ow*sW - pW + kw] (positions outside x read nothing: masked loads), divided by eager's divisor,
    computed from the output position: ``divisor_override``, else the window clipped to the padded
    input (``count_include_pad``) or to the input itself."""
    from ....ops.nn_ops import _pool_params
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("avg_pool2d dtype")
    (kh, kw), (sh, sw), (ph, pw), _ = _pool_params(kernel_size, stride, padding)
    size = x.get_size()
    if len(size) not in (3, 4) or not divisor_override and divisor_override is not None:
        raise Unsupported("avg_pool2d input rank / zero divisor (eager raises)")
    lead, (h_in, w_in), (oh_n, ow_n) = list(size[:-2]), size[-2:], tuple(out.shape[-2:])
    nl, dt = len(lead), out.dtype
    axes = (lambda o, k: o * sh - ph + k, lambda o, k: o * sw - pw + k)
    _reread(x, oh_n * ow_n * kh * kw / max(1, h_in * w_in))
    window, _ = _window_map(x, lead, axes, 0.0, dt)
    sl = _window_sum(window, lead, (oh_n, ow_n), (kh, kw), dt, x.device)

    div = _avg_divisor((kh, kw), (sh, sw), (ph, pw), (h_in, w_in), count_include_pad, divisor_override, dt)
    return TensorBox(Pointwise(dt, x.device, list(out.shape), lambda i: ops.truediv(sl(i), div(i[nl], i[nl + 1]))))


def _avg_divisor(k, s, p, n, count_include_pad, divisor_override, dt):
    """avg_pool2d's divisor of output position (oh, ow), as eager computes it: ``divisor_override``,
    else the window's area clipped to the padded input (``count_include_pad``) or to the input."""
    def extent(o, d):
        start = _ix(o * s[d] - p[d])
        end = ops.minimum(ops.add(start, _ix(sympy.Integer(k[d]))),
                          _ix(sympy.Integer(n[d] + (p[d] if count_include_pad else 0))))
        return ops.sub(end, start if count_include_pad else ops.maximum(start, _ix(sympy.Integer(0))))

    def div(oh, ow):
        if divisor_override:
            return ops.constant(float(divisor_override), dt)
        return ops.to_dtype(ops.mul(extent(oh, 0), extent(ow, 1)), dt)
    return div


def _scatter_as_gather(g, lead, in_shape, dims, contrib, dt):
    """The transpose of a map from input positions to output positions that adds each output's
    value into its inputs (the backward of a pooling or upsampling), as a gather: input position h
    of spatial dim d is written by at most A outputs, ``dims[d] = (A, o(h, a), ok(h, o))`` lists
    them in ascending order (a = 0 .. A-1) with the condition that output o exists and covers h;
    the value is the sum of ``contrib(lead_index, *o)`` over them in eager's order (outputs
    row-major, from +0), with masked loads for the outputs that do not exist.  Exact: the same
    additions as the scatter loop, in the same order."""
    nl = len(lead)

    def f(i):
        acc = ops.constant(0.0, dt)
        for a in itertools.product(*(range(d[0]) for d in dims)):
            o = [d[1](i[nl + k], a[k]) for k, d in enumerate(dims)]
            cond = None
            for k, d in enumerate(dims):
                cond = _and(cond, d[2](i[nl + k], o[k]))
            acc = ops.add(acc, ops.masked(cond, lambda o=o: contrib(list(i[:nl]), *o), 0.0))
        return acc
    return TensorBox(Pointwise(dt, g.device, list(lead) + list(in_shape), f))


@register_lowering("avg_pool2d_backward")
def _avg_pool2d_backward(g, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    """grad_input[h, w] = the sum of grad_output[oh, ow] / divisor(oh, ow) over the windows that
    hold (h, w): at most ceil(k/s) per dim, oh = floor((h + p)/s) - a (``_scatter_as_gather``).
    Lowered for stride 1 (then oh = h + p - a, plain shifted loads); other strides are an extern
    kernel (ATen), measured faster."""
    from ....ops.nn_ops import _pool_params
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64) or g.dtype != out.dtype:
        raise Unsupported("avg_pool2d_backward dtype")
    (kh, kw), (sh, sw), (ph, pw), _ = _pool_params(kernel_size, stride, padding)
    gsize = g.get_size()
    if len(gsize) not in (3, 4) or (divisor_override is not None and not divisor_override):
        raise Unsupported("avg_pool2d_backward rank / zero divisor (eager raises)")
    lead, osz, isz, dt = list(gsize[:-2]), gsize[-2:], list(out.shape[-2:]), out.dtype
    if (sh, sw) != (1, 1):
        # with stride s > 1 the outputs over an input are floor((h + p)/s) - a and which of them
        # exist alternates from lane to lane: masked lane-wise gathers ran 1.8-3.7x slower than
        # ATen's scatter loop (32x64x56x56, k3 s2 p1: 46 vs 12 ms); stride 1 ran 2.2x faster
        return _extern()
    div = _avg_divisor((kh, kw), (sh, sw), (ph, pw), isz, count_include_pad, divisor_override, dt)
    _reread(g, math.prod(isz) * kh * kw / max(1, math.prod(osz)))
    gl = g.make_loader()

    def dim(k, s, p, n_out):
        a_max = -(-k // s)
        return (a_max, lambda h, a: sympy.floor((h + p) / s) - (a_max - 1 - a),
                lambda h, o: _and(_and(_icmp(o, "ge", 0), _icmp(o, "lt", n_out)), _icmp(h + p - o * s, "lt", k)))
    return _scatter_as_gather(g, lead, isz, (dim(kh, sh, ph, osz[0]), dim(kw, sw, pw, osz[1])),
                              lambda ld, oh, ow: ops.truediv(gl(ld + [oh, ow]), div(oh, ow)), dt)


def _reread(x, factor):
    """``x`` written to memory first when its reader evaluates each element ``factor`` times and
    recomputing it would cost more than reading it back (choices.realize_reread)."""
    if isinstance(x, TensorBox) and isinstance(x.data, Pointwise) and choices.realize_reread(x.data, factor):
        _realize(x)
    return x


def _window_map(x, lead, axes, fill, dt):
    """The index map (*lead, OH, OW, KH, KW) -> x[*lead, h(oh, kh), w(ow, kw)] of a pooling window,
    read as ``dt``: ``axes`` gives, per spatial dim, the input position ``position(o, k)``; a
    position outside x reads nothing (a masked load) and gives ``fill``.  Returns (the window's
    compute function, the validity mask of a window index)."""
    nl, xl, (h_in, w_in) = len(lead), x.make_loader(), x.get_size()[-2:]

    def hw(i):
        return [pos(i[nl + k], i[nl + 2 + k]) for k, pos in enumerate(axes)]

    def valid(i):
        cond = None
        for e, n in zip(hw(i), (h_in, w_in)):
            cond = _and(_and(cond, _icmp(e, "ge", 0)), _icmp(e, "lt", n))
        return cond

    def window(i):
        return ops.masked(valid(i), lambda: _conv(xl(list(i[:nl]) + hw(i)), x.dtype, dt), fill)
    return window, valid


#: pooling windows of at most this many elements are unrolled into one pointwise kernel (max and
#: average pooling; TorchInductor uses the same limit)
POOL_UNROLL_MAX = 25


def _first_inside(o, s, p, d):
    """The first input position ``o*s - p + k*d`` (k >= 0) of a pooling window that is >= 0, as
    an int64 value: ``h0 + d * ceil(max(-h0, 0) / d)``."""
    h0 = _ix(o * s - p)
    if d == 1:
        return ops.maximum(h0, _ix(sympy.Integer(0)))
    short = ops.maximum(ops.neg(h0), _ix(sympy.Integer(0)))
    steps = ops.floordiv(ops.add(short, _ix(sympy.Integer(d - 1))), _ix(sympy.Integer(d)))
    return ops.add(h0, ops.mul(steps, _ix(sympy.Integer(d))))


@register_lowering("max_pool2d_with_indices")
def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, out=None):
    """(values, flat H*W indices) with eager's choice: scanning the window in order, a position
    inside the input wins if its value is greater than the best so far or is NaN (the first of equal
    maxima, the *last* NaN, ±0 as eager; a window of -inf gives its first position inside x).

    A window of at most POOL_UNROLL_MAX elements is unrolled: a pointwise kernel over the outputs
    runs that scan on vectors of output columns (TorchInductor does the same for small windows).
    A larger window is two reduction phases over the window in one kernel (like softmax): m = its
    max (NaN-propagating), then the min over the positions inside x of ``flat`` where the value
    equals m (``-flat`` where both are NaN: the last NaN); the value is x read at that index."""
    from ....ops.nn_ops import _pool_params
    out = _out_val()[0] if out is None else out
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("max_pool2d dtype")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pool_params(kernel_size, stride, padding, dilation)
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape:
        raise Unsupported("max_pool2d input rank / empty output (eager's checks)")
    lead, w_in, oshape = list(size[:-2]), size[-1], list(out.shape)
    nl, dt = len(lead), out.dtype
    axes = (lambda o, k: o * sh - ph + k * dh, lambda o, k: o * sw - pw + k * dw)
    _reread(x, math.prod(oshape[-2:]) * kh * kw / max(1, size[-2] * w_in))
    window, valid = _window_map(x, lead, axes, float("-inf"), dt)

    def flat(i):
        return _ix(axes[0](i[nl], i[nl + 2]) * w_in + axes[1](i[nl + 1], i[nl + 3]))
    if kh * kw <= POOL_UNROLL_MAX:
        def scan(i, with_index):
            # a position outside x reads -inf: never taken, so the scan needs no validity mask
            best = ops.constant(float("-inf"), dt)
            at = ops.add(ops.mul(_first_inside(i[nl], sh, ph, dh), _ix(sympy.Integer(w_in))),
                         _first_inside(i[nl + 1], sw, pw, dw)) if with_index else None
            for a in range(kh):
                for b in range(kw):
                    j = list(i) + [sympy.Integer(a), sympy.Integer(b)]
                    v = window(j)
                    take = ops.logical_or(ops.isnan(v), ops.gt(v, best))
                    best = ops.where(take, v, best)
                    at = ops.where(take, flat(j), at) if with_index else None
            return at if with_index else best
        return (TensorBox(Pointwise(dt, x.device, oshape, lambda i: scan(i, False))),
                TensorBox(Pointwise(torch.int64, x.device, oshape, lambda i: scan(i, True))))
    wsize = lead + oshape[-2:] + [kh, kw]
    win = TensorBox(Pointwise(dt, x.device, wsize, window))
    ml = _realize(make_reduction(win, [nl + 2, nl + 3], False, "max", dt)).make_loader()

    def key(i):
        m, v = ml(list(i[:nl + 2])), window(i)
        nan_m = ops.isnan(m)
        hit = ops.logical_and(valid(i), ops.where(nan_m, ops.isnan(v), ops.eq(v, m)))
        return ops.where(hit, ops.where(nan_m, ops.neg(flat(i)), flat(i)), ops.constant(2 ** 62, torch.int64))
    keys = TensorBox(Pointwise(torch.int64, x.device, wsize, key))
    kl = _realize(make_reduction(keys, [nl + 2, nl + 3], False, "min", torch.int64)).make_loader()

    def index(i):
        r = kl(i)
        return ops.where(ops.isnan(ml(i)), ops.neg(r), r)
    idx = _realize(TensorBox(Pointwise(torch.int64, x.device, oshape, index)))
    il, xl, plane = idx.make_loader(), x.make_loader(), size[-2] * w_in

    def value(i):
        k = _checked(il(i), plane, "max_pool2d", nl)
        return xl(list(i[:nl]) + [sympy.floor(k / w_in), sympy.Mod(k, w_in)])
    return TensorBox(Pointwise(dt, x.device, oshape, value)), idx


@register_lowering("adaptive_max_pool2d")
def _adaptive_max_pool2d(x, output_size):
    """Bins of equal extent are max_pool2d with kernel = stride = input // output (eager's scan
    and indices are the same); bins of unequal extent are an extern kernel (ATen), as for
    adaptive_avg_pool2d."""
    out = _out_val()[0]
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape or any(n % m for n, m in zip(size[-2:], out.shape[-2:])):
        return _extern()
    k = [n // m for n, m in zip(size[-2:], out.shape[-2:])]
    return _max_pool2d_with_indices(x, k, k, 0, 1, False, out)


@register_lowering("max_pool2d")
def _max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, _out_val())[0]


def _window_sum(window, lead, oshape, k, dt, device):
    """The sum over a (k[0], k[1]) pooling window: unrolled in eager's order (rows, then columns,
    from +0) when it has at most POOL_UNROLL_MAX elements, else a sum reduction of the window map.
    Returns a loader over the output positions."""
    if k[0] * k[1] <= POOL_UNROLL_MAX:
        def sl(i):
            acc = ops.constant(0.0, dt)     # eager's sum starts at +0 (a window of -0 sums to +0)
            for a in range(k[0]):
                for b in range(k[1]):
                    acc = ops.add(acc, window(list(i) + [sympy.Integer(a), sympy.Integer(b)]))
            return acc
        return sl
    win = TensorBox(Pointwise(dt, device, list(lead) + list(oshape[-2:]) + list(k), window))
    nl = len(lead)
    return _realize(make_reduction(win, [nl + 2, nl + 3], False, "sum", dt)).make_loader()


@register_lowering("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(x, output_size):
    """Output position o of a dim of n inputs averages bin [floor(o*n/m), ceil((o+1)*n/m)) (m the
    output size).  Bins of equal extent k = n/m (m divides n; global average pooling is m = 1) are a
    window sum with kernel = stride = k, divided by the bin's height, then by its width (eager's
    order of rounding).  Bins of unequal extent are an extern kernel (ATen): their starts
    floor(o*n/m) need lane-wise gathers and masks, which ran 2-4x slower than ATen's loop
    (14x14 -> 5x5: 8.0 vs 1.9 ms; 100x100 -> 30x30: 10.6 vs 5.0 ms)."""
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("adaptive_avg_pool2d dtype")
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape:
        raise Unsupported("adaptive_avg_pool2d input rank / empty output (eager's checks)")
    lead, oshape, dt = list(size[:-2]), list(out.shape), out.dtype
    if any(n % m for n, m in zip(size[-2:], oshape[-2:])):
        return _extern()
    k = [n // m for n, m in zip(size[-2:], oshape[-2:])]
    axes = [lambda o, j, kd=kd: o * kd + j for kd in k]
    _reread(x, math.prod(oshape[-2:]) * math.prod(k) / max(1, math.prod(size[-2:])))
    window, _ = _window_map(x, lead, axes, 0.0, dt)
    sl = _window_sum(window, lead, oshape, k, dt, x.device)

    def f(i):
        r = sl(i)
        for kd in k:
            r = ops.truediv(r, ops.constant(float(kd), dt))
        return r
    return TensorBox(Pointwise(dt, x.device, oshape, f))


def _nearest_source(o_sym, n_in, n_out, scale):
    """The source index of nearest upsampling along one dim as an index expression of the output
    index, or None.  Eager computes ``min(floor(float32(o) * s), n_in - 1)`` with the float32 scale
    ``s = 1/scale`` (``n_in/n_out`` without one; then n_out = n_in and 2*n_in are exact); the
    table of that is compared with ``floor(o * p/q)`` for the candidate fractions p/q (n_in/n_out,
    and 1/scale as a fraction), so the kernel reads exactly eager's rows or the op is not lowered."""
    import numpy as np
    from fractions import Fraction
    o = np.arange(n_out, dtype=np.int64)
    if n_out == n_in and not scale:
        table = o
    elif n_out == 2 * n_in and not scale:
        table = o >> 1
    else:
        s = np.float32(1.0 / scale) if scale and scale > 0 else np.float32(n_in) / np.float32(n_out)
        table = np.minimum(np.floor(o.astype(np.float32) * s).astype(np.int64), n_in - 1)
    cands = [Fraction(n_in, n_out)] + ([Fraction(1 / scale).limit_denominator(1 << 16)] if scale else [])
    for f in cands:
        if np.array_equal(table, np.minimum((o * f.numerator) // f.denominator, n_in - 1)):
            e = sympy.floor(o_sym * f.numerator / f.denominator) if f.denominator != 1 else o_sym * f.numerator
            # the clamp is needed only where floor(o*p/q) passes n_in - 1 (then it is not affine)
            return e if (n_out - 1) * f.numerator // f.denominator <= n_in - 1 else None
    return None


@register_lowering("upsample_nearest1d", "upsample_nearest2d")
def _upsample_nearest(x, output_size, *scales):
    """out[..., o] = x[..., src(o)] per resampled dim: a view-like index map (no copy when fused),
    with eager's source rows (``_nearest_source``).  The last dim's rows repeat a lane pattern
    every q/gcd(p, q) columns; when that divides 16 the kernel reads a vector as one load and a
    lane permute (codegen ``_lane_pattern``).  Otherwise, and when eager's float32 rows are no
    ``floor(o*p/q)``, the op is an extern kernel (ATen's loop, faster than lane-wise gathers)."""
    out = _out_val()
    size = x.get_size()
    nd = len(output_size)
    if len(size) != nd + 2:
        raise Unsupported("upsample_nearest input rank")
    lead = len(size) - nd
    syms = [sympy.Symbol(f"_o{k}", integer=True, nonnegative=True) for k in range(nd)]
    src = [_nearest_source(syms[k], size[lead + k], out.shape[lead + k], scales[k] if k < len(scales) else None)
           for k in range(nd)]
    if any(e is None for e in src):
        return _extern()        # eager's float32 rows are no floor(o*p/q): ATen's kernel reads them
    if 16 % max((_fraction(a.args[0])[1] for a in src[-1].atoms(sympy.floor)), default=1):
        # the last dim's pattern repeats only every q/gcd(p, q) > 16 columns: lane-wise gathers ran
        # 1.5x slower than ATen's loop (56 -> 75: 4.2 vs 2.8 ms), so ATen's kernel runs it
        return _extern()
    _reread(x, math.prod(out.shape) / max(1, math.prod(size)))
    xl = x.make_loader()

    def f(i):
        sub = {syms[k]: i[lead + k] for k in range(nd)}
        return xl(list(i[:lead]) + [e.xreplace(sub) for e in src])
    return _box(out, f, x.device)


@register_lowering("upsample_nearest1d_backward", "upsample_nearest2d_backward")
def _upsample_nearest_backward(g, output_size, input_size, *scales):
    """grad_input[h] = the sum of grad_output[o] over the outputs o that read row h.  For an
    integer factor q (eager's rows floor(o/q), ``_nearest_source``) they are o = q*h + a, a < q:
    plain loads (``_scatter_as_gather``).  Other factors start the outputs of a row at
    floor((h*q + p - 1)/p), lane-wise gathers again (the forward's extern rule: 16x64x112x112 ->
    56x56 ran 2.4 ms as a loop against 7.4 for ATen with q = 2), and sizes whose rows are no
    floor(o*p/q) are an extern kernel (ATen) too."""
    out = _out_val()
    gsize = g.get_size()
    nd = len(output_size)
    if out.dtype not in (torch.float32, torch.float64) or len(gsize) != nd + 2 or nd not in (1, 2):
        raise Unsupported("upsample_nearest_backward dtype / rank")
    lead, isz = list(gsize[:2]), list(out.shape[2:])
    o_sym = sympy.Symbol("_o", integer=True, nonnegative=True)
    dims = []
    for k in range(nd):
        src = _nearest_source(o_sym, isz[k], gsize[2 + k], scales[k] if k < len(scales) else None)
        if src is None:
            return _extern()
        num, q = _fraction(src.args[0] if isinstance(src, sympy.floor) else src)
        if num != o_sym:     # rows floor(o*p/q) with p != 1: not an integer factor
            return _extern()
        n_out = gsize[2 + k]
        dims.append((q, lambda h, a, q=q: h * q + a,
                     lambda h, o, q=q, n_out=n_out: _and(_icmp(o, "lt", n_out), _icmp(o - (h + 1) * q, "lt", 0))))
    gl = g.make_loader()
    return _scatter_as_gather(g, lead, isz, dims, lambda ld, *o: _conv(gl(ld + list(o)), g.dtype, out.dtype),
                              out.dtype)


@register_lowering("adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(g, input_size):
    """Bins of equal extent k: each input is in one bin, grad_input[h, w] = grad_output[h // kh,
    w // kw] / kh / kw (eager's grad_delta); bins of unequal extent are an extern kernel (ATen)."""
    out = _out_val()
    gsize = g.get_size()
    isz = list(out.shape[-2:])
    if out.dtype not in (torch.float32, torch.float64) or len(gsize) not in (3, 4) or \
            any(n % m for n, m in zip(isz, gsize[-2:])) or 0 in gsize:
        return _extern()
    kh, kw = (n // m for n, m in zip(isz, gsize[-2:]))
    nl, dt, gl = len(gsize) - 2, out.dtype, g.make_loader()

    def f(i):
        v = _conv(gl(list(i[:nl]) + [sympy.floor(i[nl] / kh), sympy.floor(i[nl + 1] / kw)]), g.dtype, dt)
        return ops.truediv(ops.truediv(v, ops.constant(float(kh), dt)), ops.constant(float(kw), dt))
    return _box(out, f, g.device)


@register_lowering("rms_norm")
def _rms_norm(x, normalized_shape, weight=None, eps=None):
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("rms_norm dtype")
    n = len(x.get_size())
    dims = list(range(n - len(normalized_shape), n))
    xl = x.make_loader()
    sq = TensorBox(Pointwise(x.dtype, x.device, x.get_size(), lambda i: (lambda v: ops.mul(v, v))(xl(i))))
    ss = _realize(make_reduction(sq, dims, True, "sum", x.dtype))
    cnt = math.prod(x.get_size()[d] for d in dims)
    e = float(eps) if eps is not None else float(torch.finfo(x.dtype).eps)
    sl = broadcast_loader(ss, x.get_size())
    wl = broadcast_loader(weight, x.get_size()) if isinstance(weight, TensorBox) else None

    def f(i):
        r = ops.rsqrt(ops.add(ops.truediv(sl(i), ops.constant(float(cnt), x.dtype)), ops.constant(e, x.dtype)))
        y = ops.mul(xl(i), r)
        return ops.mul(y, wl(i)) if wl is not None else y
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), f))


# ---- losses ---------------------------------------------------------------------------------------------
# Elementwise losses are a Pointwise of (self, target) reduced like eager ('none' / 'sum' / 'mean' /
# kl_div's 'batchmean'); nll_loss reads self at each sample's target class (an indirect load, checked
# in the kernel); cross_entropy with class indices is log_softmax then nll_loss, one row pass each;
# nll_loss_backward is a Pointwise (the target class of the row gets -weight·g, the others 0) — no
# scatter needed.
def _loss_reduce(box, reduction, dtype):
    if reduction == "none":
        return box
    if reduction not in ("sum", "mean", "batchmean"):
        raise Unsupported(f"loss reduction {reduction!r}")
    s = make_reduction(box, None, False, "sum", dtype)
    if reduction == "sum":
        return s
    size = box.get_size()
    n = math.prod(size) if reduction == "mean" else (size[0] if size else 1)
    sl = _realize(s).make_loader()
    return TensorBox(Pointwise(dtype, box.device, (), lambda i: ops.truediv(sl([]), ops.constant(float(n), dtype))))


def _elementwise_loss(x, t, reduction, fn, weight=None):
    """fn(x, t, dtype, index) -> per-element loss, times ``weight`` if given; x, t and weight
    broadcast like eager."""
    dt = _out_val().dtype
    if not dt.is_floating_point:
        raise Unsupported("loss of integers")
    shape = tuple(torch.broadcast_shapes(tuple(x.get_size()), tuple(t.get_size())))
    xl, tl = broadcast_loader(x, shape), broadcast_loader(t, shape)
    wl = broadcast_loader(weight, shape) if weight is not None else None

    def f(i):
        v = fn(_conv(xl(i), x.dtype, dt), _conv(tl(i), t.dtype, dt), dt, i)
        return ops.mul(v, _conv(wl(i), weight.dtype, dt)) if wl is not None else v
    return _loss_reduce(TensorBox(Pointwise(dt, x.device, shape, f)), reduction, dt)


def _k(v, dt):
    return ops.constant(v, dt)


@register_lowering("mse_loss")
def _mse_loss(x, t, reduction="mean"):
    return _elementwise_loss(x, t, reduction, lambda a, b, dt, i: (lambda d: ops.mul(d, d))(ops.sub(a, b)))


@register_lowering("l1_loss")
def _l1_loss(x, t, reduction="mean"):
    return _elementwise_loss(x, t, reduction, lambda a, b, dt, i: ops.abs(ops.sub(a, b)))


@register_lowering("smooth_l1_loss")
def _smooth_l1_loss(x, t, reduction="mean", beta=1.0):
    def f(a, b, dt, i):
        d = ops.abs(ops.sub(a, b))
        if beta == 0:
            return d
        quad = ops.truediv(ops.mul(ops.mul(_k(0.5, dt), d), d), _k(beta, dt))
        return ops.where(ops.lt(d, _k(beta, dt)), quad, ops.sub(d, _k(0.5 * beta, dt)))
    return _elementwise_loss(x, t, reduction, f)


@register_lowering("huber_loss")
def _huber_loss(x, t, reduction="mean", delta=1.0):
    def f(a, b, dt, i):
        d = ops.abs(ops.sub(a, b))
        quad = ops.mul(ops.mul(_k(0.5, dt), d), d)
        lin = ops.mul(_k(delta, dt), ops.sub(d, ops.mul(_k(0.5, dt), _k(delta, dt))))
        return ops.where(ops.lt(d, _k(delta, dt)), quad, lin)
    return _elementwise_loss(x, t, reduction, f)


@register_lowering("binary_cross_entropy")
def _bce(x, t, weight=None, reduction="mean"):
    """-(t·max(log x, -100) + (1 - t)·max(log(1 - x), -100)), eager's clamped logs."""
    def f(a, b, dt, i):
        lo = _k(-100.0, dt)
        la = ops.maximum(ops.log(a), lo)
        lb = ops.maximum(ops.log(ops.sub(_k(1.0, dt), a)), lo)
        return ops.neg(ops.add(ops.mul(b, la), ops.mul(ops.sub(_k(1.0, dt), b), lb)))
    return _elementwise_loss(x, t, reduction, f, weight)


@register_lowering("binary_cross_entropy_with_logits")
def _bce_logits(x, t, weight=None, pos_weight=None, reduction="mean"):
    """(1 - t)·x + lw·(log(exp(-m) + exp(-x - m)) + m), m = max(-x, 0), lw = 1 + (pos_weight - 1)·t
    (the stable form eager uses)."""
    shape = tuple(torch.broadcast_shapes(tuple(x.get_size()), tuple(t.get_size())))
    pwl = broadcast_loader(pos_weight, shape) if pos_weight is not None else None

    def f(a, b, dt, i):
        m = ops.maximum(ops.neg(a), _k(0.0, dt))
        soft = ops.add(ops.log(ops.add(ops.exp(ops.neg(m)), ops.exp(ops.sub(ops.neg(a), m)))), m)
        if pwl is not None:
            pw = _conv(pwl(i), pos_weight.dtype, dt)
            soft = ops.mul(ops.add(_k(1.0, dt), ops.mul(ops.sub(pw, _k(1.0, dt)), b)), soft)
        return ops.add(ops.mul(ops.sub(_k(1.0, dt), b), a), soft)
    return _elementwise_loss(x, t, reduction, f, weight)


@register_lowering("kl_div")
def _kl_div(x, t, reduction="mean", log_target=False):
    """log_target: exp(t)·(t - x); else xlogy(t, t) - t·x (0 where t == 0)."""
    def f(a, b, dt, i):
        if log_target:
            return ops.mul(ops.exp(b), ops.sub(b, a))
        xlogy = ops.where(ops.eq(b, _k(0.0, dt)), _k(0.0, dt), ops.mul(b, ops.log(b)))
        return ops.sub(ops.where(ops.isnan(b), b, xlogy), ops.mul(b, a))
    return _elementwise_loss(x, t, reduction, f)


def _nll_sample(target, weight, ignore_index, C, dt, op, dim):
    """sample(rows) -> (counted, class, weight): the target class of a sample (ignored samples
    read class 0, checked in the kernel against [0, C)) and its weight (0 if ignored)."""
    tl = target.make_loader()
    wl = weight.make_loader() if weight is not None else None

    def sample(r):
        tv = tl(r)
        counted = ops.ne(tv, ops.constant(ignore_index, target.dtype))
        safe = ops.where(counted, tv, ops.constant(0, target.dtype))
        cls = _checked(safe, C, op, dim,
                       message=f"IndexError: tp.{op}: target {{value}} is out of bounds for {C} classes")
        w = _conv(wl([cls]), weight.dtype, dt) if wl is not None else ops.constant(1.0, dt)
        return counted, safe, cls, ops.where(counted, w, ops.constant(0.0, dt))
    return sample


def _nll_rows(size, op):
    if len(size) not in (1, 2):
        raise Unsupported(f"{op}: only (N, C) / (C,) inputs are native")
    two_d = len(size) == 2
    return two_d, (lambda i: i[:1] if two_d else [])


def _nll(x, target, weight, reduction, ignore_index, op):
    """nll_loss of x (N, C) or (C,): the per-sample losses reduced like eager ('mean' divides by
    the total weight of the counted samples — both sums are one kernel)."""
    size = x.get_size()
    two_d, rows = _nll_rows(size, op)
    if target.dtype not in (torch.int32, torch.int64) or reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"{op}: integer class targets and reduction none/sum/mean are native")
    dt, xl = x.dtype, x.make_loader()
    sample = _nll_sample(target, weight, ignore_index, size[-1], dt, op, 1 if two_d else 0)

    def loss(i):
        counted, _, cls, w = sample(rows(i))
        v = xl([i[0], cls] if two_d else [cls])
        return ops.where(counted, ops.neg(ops.mul(w, v)), ops.constant(0.0, dt))
    shape = (size[0],) if two_d else ()
    box = TensorBox(Pointwise(dt, x.device, shape, loss))
    if reduction != "mean":
        return _loss_reduce(box, reduction, dt)
    s = _realize(make_reduction(box, None, False, "sum", dt)).make_loader()
    wsum = _realize(make_reduction(TensorBox(Pointwise(dt, x.device, shape, lambda i: sample(rows(i))[3])),
                                   None, False, "sum", dt)).make_loader()
    return TensorBox(Pointwise(dt, x.device, (), lambda i: ops.truediv(s([]), wsum([]))))


@register_lowering("nll_loss")
def _nll_loss(x, target, weight=None, reduction="mean", ignore_index=-100):
    return _nll(x, target, weight, reduction, ignore_index, "nll_loss")


@register_lowering("cross_entropy")
def _cross_entropy(x, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    if label_smoothing != 0 or target.dtype.is_floating_point:
        raise Unsupported("cross_entropy with label smoothing or class probabilities")
    _nll_rows(x.get_size(), "cross_entropy")
    lsm = _realize(_log_softmax_of(x, len(x.get_size()) - 1, x.dtype))
    return _nll(lsm, target, weight, reduction, ignore_index, "cross_entropy")


@register_lowering("nll_loss_backward")
def _nll_loss_backward(grad_output, target, weight, input_size, reduction, ignore_index):
    """grad[i, c] = (c == target[i]) · -weight[target[i]] · g  (/ total weight for 'mean')."""
    dt = _out_val().dtype
    size = tuple(input_size)
    two_d, rows = _nll_rows(size, "nll_loss_backward")
    sample = _nll_sample(target, weight, ignore_index, size[-1], dt, "nll_loss_backward", 1 if two_d else 0)
    gl = grad_output.make_loader()
    denom = None
    if reduction == "mean":
        shape = (size[0],) if two_d else ()
        denom = _realize(make_reduction(TensorBox(Pointwise(dt, grad_output.device, shape,
                                                            lambda i: sample(rows(i))[3])),
                                        None, False, "sum", dt)).make_loader()
    elif reduction not in ("sum", "none"):
        raise Unsupported(f"nll_loss_backward reduction {reduction!r}")
    idt = target.dtype if target.dtype in (torch.int32, torch.int64) else torch.int64

    def f(i):
        r = rows(i)
        counted, safe, _, w = sample(r)
        g = _conv(gl(r if reduction == "none" else []), grad_output.dtype, dt)
        coef = ops.neg(ops.mul(w, g))
        if denom is not None:
            coef = ops.truediv(coef, denom([]))
        hit = ops.logical_and(counted, ops.eq(ops.index_expr(i[-1], idt), safe))
        return ops.where(hit, coef, ops.constant(0.0, dt))
    return TensorBox(Pointwise(dt, grad_output.device, size, f))


# ---- extern kernels -------------------------------------------------------------------------------------
def _extern(*args):
    return V.graph.extern("library kernel (ATen)")


def _batch_collapsible(layout) -> bool:
    """Can a batched matmul view this operand as (batch, m, n) without a copy?  Its batch dims must
    merge into one stride (size-1 dims ignored)."""
    dims = [(n, s) for n, s in zip(layout.size[:-2], layout.stride[:-2]) if n != 1]
    return all(s0 == s1 * n1 for (_, s0), (n1, s1) in zip(dims, dims[1:]))


def _bmm_operand(r):
    """A batched-matmul operand whose batch dims do not merge (a head view of a fused qkv
    projection: (B, H, T, D) with strides (T*3C, D, 3C, 1)) is copied densely by a Stax kernel
    (GraphLowering.batched_matrix_copy): ATen would copy it anyway, in a parallel region of its own."""
    lay = getattr(r, "layout", None)
    if lay is None or len(lay.size) < 3 or _batch_collapsible(lay):
        return r
    return V.graph.batched_matrix_copy(r)


@register_lowering("matmul", "bmm")
def _extern_bmm(*args):
    return V.graph.extern("library kernel (ATen)", prepare=_bmm_operand)


for _name in ("mm", "addmm", "baddbmm", "linear", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d", "convolution_backward_input", "convolution_backward_weight",
              "convolution_backward",
              "einsum", "outer", "dot",
              # sort-like and scans: library kernels (unique's and masked_select's output shapes are
              # data gates of capture)
              "sort", "argsort", "topk", "kthvalue", "median", "median_dim", "nanmedian", "nanmedian_dim", "mode",
              "unique", "unique_consecutive", "masked_select", "cumsum", "cumprod", "cummax", "cummin",
              "_reverse_cumsum",
              "_scatter_view", "scatter",
              # library kernels with no loop-level form here: fused attention, and the scatter-adds
              # of embedding/index backward (their consumers still fuse into the next kernel)
              "scaled_dot_product_attention", "embedding_dense_backward", "index_add", "index_put",
              "scatter_add", "max_pool2d_with_indices_backward", "adaptive_max_pool2d_backward", "_index_backward",
              "_masked_select_backward", "_storage_remap",
              # linear/bilinear resampling: ATen computes each dim's source rows and weights once and
              # runs a separable loop; a kernel here reading them per element, exact to eager's
              # rounding, ran 2.4x slower (its rows are lane-wise gathers; docs/stax.md)
              "upsample_linear1d", "upsample_bilinear2d", "upsample_linear1d_backward",
              "upsample_bilinear2d_backward"):
    register_lowering(_name)(_extern)
