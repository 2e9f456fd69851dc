"""Lowering rules: one per op of the table (chapter §6.2; experiment 3 adds one here).

``register_lowering(name)`` binds a rule to an op-table entry.  A rule receives the op's canonical
arguments — graph values as :class:`TensorBox`, everything else as Python values — and returns a
TensorBox (or a tuple of them).  Most rules are made by two helpers:

* ``pointwise(compute)`` — ``compute`` takes the *values* of the tensor arguments (already
  broadcast to the output shape and converted to the compute dtype, the dtype PyTorch's type
  promotion gives) followed by the op's other arguments, and uses only the ``ops`` interface;
  ``cdt()`` inside it is the compute dtype (for constants)::

      register_lowering("relu")(pointwise(lambda x: ops.maximum(x, ops.constant(0, cdt()))))

* ``reduction(type)`` — sum/prod/amax/... over ``dim`` with ``keepdim``.

Views of unrealized values remap indices (permute, transpose, expand, slicing with step, select,
unsqueeze/squeeze: affine maps, Prop. 6.2); views of buffers become ReinterpretViews with strides
computed by the op's own kernel on a meta tensor; reshape of an unrealized value materialises it
first (a reshape of a contiguous buffer is free).  matmul/mm/bmm/addmm/linear/conv are extern
kernels; anything without a rule is a fallback kernel.
"""
from __future__ import annotations

import math

import sympy
import torch

from .ir import Pointwise, Reduction, TensorBox, Unsupported, ReinterpretView, Buffer
from .lowering import view_of_buffer
from .ops_handler import ops

__all__ = ["LOWERINGS", "register_lowering", "pointwise", "reduction", "cdt", "V"]

LOWERINGS: dict = {}


class V:
    """The lowering in progress (set by the backend around GraphLowering.run)."""
    graph = None


class _CDT:
    dtype = None


def cdt():
    """The compute dtype of the pointwise op being generated (for ``ops.constant``)."""
    return _CDT.dtype


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
            prev = _CDT.dtype
            _CDT.dtype = cd
            try:
                r = compute(*vals, *params)
            finally:
                _CDT.dtype = prev
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
        raise Unsupported("integer trunc division")
    raise Unsupported("floor division (integer division by zero must raise, as in eager)")


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


@register_lowering("pow")
def _pow(a, b):
    if not isinstance(b, (int, float)) or not _out_val().dtype.is_floating_point:
        if isinstance(b, TensorBox) and _out_val().dtype.is_floating_point:
            return pointwise(lambda x, y: ops.pow(x, y))(a, b)
        raise Unsupported("pow with this exponent/dtype")
    if b == 2:
        return pointwise(lambda x, _e: ops.mul(x, x))(a, b)
    if b == 1:
        return pointwise(lambda x, _e: x)(a, b)
    if b == 0.5:
        return pointwise(lambda x, _e: ops.sqrt(x))(a, b)
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


def _getitem_reindex(in_size, out_size, indices):
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


# ---- reductions -----------------------------------------------------------------------------------------
def _norm_dims(dim, n):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(n))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % n for d in dim}) if n else []


def make_reduction(x: TensorBox, dims, keepdim, rtype, out_dtype, acc_dtype=None, transform=None):
    in_size = x.get_size()
    n = len(in_size)
    dims = _norm_dims(dims, n)
    kept = [d for d in range(n) if d not in dims]
    out_ranges = [1 if d in dims else in_size[d] for d in range(n)] if keepdim else [in_size[d] for d in kept]
    rranges = [in_size[d] for d in dims]
    loader = x.make_loader()
    src = x.dtype
    acc = acc_dtype or out_dtype

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
            v = transform(v)
        return v if src == acc or rtype in ("argmax", "argmin") else ops.to_dtype(v, acc)
    red = Reduction(out_dtype, x.device, out_ranges, rranges, rtype, inner_fn, src)
    if math.prod(rranges) == 0 and rtype in ("max", "min", "argmax", "argmin"):
        raise Unsupported("max/min over an empty dimension (an error in eager)")
    return TensorBox(red)


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
    raise Unsupported("argmax/argmin reductions are not generated natively yet")


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


def _var_parts(x, dim, correction, keepdim_out, dtype):
    """Two-pass variance: mean, then the sum of squared deviations (exact within the error
    model; the second pass reads the row from cache when fused)."""
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
    mean_out = mean_k if keepdim_out else _div_by(_realize(make_reduction(x, dims, False, "sum", dtype)), n, dtype)
    return var, mean_out


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
    e = TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    s = _realize(make_reduction(e, dim, True, "sum", out.dtype))
    sl = broadcast_loader(s, x.get_size())
    el = e.make_loader()
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.truediv(el(i), sl(i))))


@register_lowering("log_softmax")
def _log_softmax(x, dim, dtype=None):
    out = _out_val()
    if not out.dtype.is_floating_point:
        raise Unsupported("log_softmax of integers")
    if math.prod(x.get_size()) == 0:
        return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.constant(0.0, out.dtype)))
    src, shifted = _softmax_parts(x, dim, out.dtype)
    e = TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    s = _realize(make_reduction(e, dim, True, "sum", out.dtype))
    sl = broadcast_loader(s, x.get_size())
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.sub(shifted(i), ops.log(sl(i)))))


@register_lowering("layer_norm")
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("layer_norm dtype")
    n = len(x.get_size())
    k = len(normalized_shape)
    dims = list(range(n - k, n))
    var, mean = _var_parts(x, dims, 0, True, x.dtype)
    vl, mlo = broadcast_loader(var, x.get_size()), broadcast_loader(mean, x.get_size())
    xl = x.make_loader()
    wl = broadcast_loader(weight, x.get_size()) if isinstance(weight, TensorBox) else None
    bl = broadcast_loader(bias, x.get_size()) if isinstance(bias, TensorBox) else None

    def f(i):
        y = ops.mul(ops.sub(xl(i), mlo(i)), ops.rsqrt(ops.add(vl(i), ops.constant(float(eps), x.dtype))))
        if wl is not None:
            y = ops.mul(y, wl(i))
        if bl is not None:
            y = ops.add(y, bl(i))
        return y
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), f))


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


# ---- extern kernels -------------------------------------------------------------------------------------
def _extern(*args):
    return V.graph.extern("library kernel (ATen)")


for _name in ("matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "conv1d", "conv2d", "convolution", "einsum",
              "outer", "dot", "sort", "argsort", "topk", "cumsum", "cumprod", "_scatter_view", "cat", "stack"):
    register_lowering(_name)(_extern)
