"""View, shape-op and indexing lowering rules (chapter §6.2, Prop. 6.2): index maps.

A view of an unrealized value remaps its index (permute, transpose, expand, slicing, select,
unsqueeze/squeeze: affine maps); a view of a buffer becomes a ReinterpretView whose size, stride
and offset come from the op's own kernel run on a meta tensor laid out like the buffer
(:func:`view_of_buffer`), so every view op of the table gets eager's strides.  A view that may copy
(tag ``may_copy``: reshape, flatten) of a layout that cannot be viewed copies to a contiguous
buffer first, as eager does.  Copying shape ops (pad, cat, stack, roll, repeat, tile, tril/triu,
flip) read their input under masks or floor/Mod index maps; integer-tensor indexing (gather,
index_select, take_along_dim, embedding, ``x[idx]``, index_fill, one_hot) loads indices and checks
them in the kernel: a bad index raises IndexError naming the op, the value and the size
(bounds.py proves every other load in range).
"""
from __future__ import annotations

import math

import sympy
import torch

from .....ops.registry import OPS
from ..ir import Buffer, FixedLayout, Pointwise, Reduction, ReinterpretView, TensorBox, Unsupported
from ..ops_handler import ops
from ..sizevars import statically_known_equals, statically_known_leq, statically_known_lt
from .pointwise_rules import _conv, _realize, broadcast_loader, broadcast_size
from .registry import LOWERINGS, V, _node, _out_val, register_lowering


# ---- views --------------------------------------------------------------------------------------------
def view_of_buffer(graph, box: TensorBox, view_fn, *args) -> TensorBox:
    """A view of a realized value: apply ``view_fn(t, *args)`` to a meta (or, for symbolic sizes,
    fake) tensor ``t`` laid out like the buffer and read back (size, stride, offset)
    (GraphLowering.run_on_fakes).  Raises Unsupported if the result is not a view."""
    data = graph.realize(box)
    layout = data.layout
    base = data.data if isinstance(data, ReinterpretView) else data
    size, stride, offset, is_view = graph.run_on_fakes(view_fn, layout, *args)
    if not is_view:
        raise Unsupported("view op copies for this layout")
    return TensorBox(ReinterpretView(base, FixedLayout(layout.dtype, layout.device, size, stride, offset)))


def _view_rule(reindex_builder=None):
    """Views: buffers get a ReinterpretView via the meta trick; unrealized values get an index map
    from ``reindex_builder(in_size, out_size, *args) -> fn(out_index) -> in_index`` (or are
    materialised first when no affine map is known)."""
    def rule(x, *rest):
        node = _node()
        op = node.opdef
        out = node.meta.get("val")
        if isinstance(x.data, (Buffer, ReinterpretView)) or reindex_builder is None:
            def vf(m, *r):
                return op.eager(m, *r)
            if isinstance(out, (tuple, list)):
                return _multi_view(x, vf, *rest)
            try:
                return view_of_buffer(V.graph, x, vf, *rest)
            except Unsupported:
                if "may_copy" not in op.tags:
                    raise
                # reshape of a layout that cannot be viewed: copy to a contiguous buffer (what
                # eager's reshape does), then view that
                ld = x.make_loader()
                copy = TensorBox(Pointwise(x.dtype, x.device, x.get_size(), ld))
                return view_of_buffer(V.graph, copy, vf, *rest)
        reindex = reindex_builder(x.get_size(), tuple(out.shape), *rest)
        loader = x.make_loader()
        return TensorBox(Pointwise(x.dtype, x.device, tuple(out.shape), lambda idx: loader(reindex(idx))))
    return rule


def _multi_view(x, vf, *args):
    data = V.graph.realize(x)
    layout = data.layout
    base = data.data if isinstance(data, ReinterpretView) else data
    return tuple(TensorBox(ReinterpretView(base, FixedLayout(layout.dtype, layout.device, size, stride, offset)))
                 for size, stride, offset, _ in V.graph.run_on_fakes(vf, layout, *args))


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
# every other view of the table (view, reshape, flatten, diagonal, as_strided, split, ...; contiguous
# is the identity, pointwise_rules): the meta trick on a buffer, which it realizes first
for _op in OPS.values():
    if _op.is_view and _op.name not in LOWERINGS:
        register_lowering(_op.name)(_view_rule(None))


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
    k = sympy.sympify(k)
    return getattr(ops, op)(_ix(e), ops.constant(int(k), torch.int64) if k.is_Integer else _ix(k))


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
        cond = _and(_icmp(i, "ge", s) if not statically_known_equals(s, 0) else None,
                    _icmp(i, "lt", s + n) if not statically_known_equals(s + n, total) else None)
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


def _shift_mod(sh: int, n):
    """``sh mod n`` for a roll: an int for an int ``n``; for a symbolic ``n`` the shift itself (or
    ``n + sh`` for a negative one) when ``|sh| < n`` is proved, else None (the caller indexes
    with a modulo)."""
    n = sympy.sympify(n)
    if n.is_Integer:
        return sh % int(n) if n else 0
    if sh == 0:
        return 0
    if not statically_known_lt(abs(sh), n):
        return None
    return sh if sh > 0 else n + sh


def _mod_index(i, sh, n):
    """``(i - sh) mod n`` over a symbolic ``n`` (printed as a floored modulo, cpp/ops.cexpr)."""
    return sympy.Mod(i - sh, n)


@register_lowering("roll")
def _roll(x, shifts, dims=None):
    out = _out_val()
    size = x.get_size()
    ld = x.make_loader()
    shifts = _int_list(shifts)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        if len(shifts) != 1:
            raise Unsupported("roll without dims takes one shift (eager raises)")
        numel = sympy.sympify(math.prod(size))
        if numel == 0 or len(size) == 0:
            return _box(out, ld, x.device)
        s = _shift_mod(shifts[0], numel)
        cs = [math.prod(size[k + 1:]) for k in range(len(size))]

        def flat(idx):   # out.flat[f] = x.flat[(f - s) mod numel]
            f = sum(i * c for i, c in zip(idx, cs))
            g = sympy.Mod(f + (numel - s), numel) if s is not None else _mod_index(f, shifts[0], numel)
            return ld([sympy.Integer(0) if n == 1 else sympy.Mod(sympy.floor(g / c), n) for c, n in zip(cs, size)])
        return _box(out, flat, x.device)
    dims = _int_list(dims)
    if len(dims) != len(shifts) or not size:
        raise Unsupported("roll: shifts and dims differ in length (eager raises)")
    for dd, sh in zip(dims, shifts):
        d = dd % len(size)
        n = size[d]
        s = _shift_mod(sh, n) if n != 0 else 0
        if s == 0:
            continue
        if s is None:      # a shift not proved smaller than a symbolic size: a modulo per index
            ld = (lambda inner, d, n, sh: lambda idx: inner(_at(idx, d, _mod_index(idx[d], sh, n))))(ld, d, n, sh)
            continue

        def rolled(inner, d, n, s):
            def f(idx):
                i = idx[d]
                return _pieces(i, [(0, s, lambda: inner(_at(idx, d, i - s + n))),
                                   (s, n - s, lambda: inner(_at(idx, d, i - s)))], n)
            return f
        ld = rolled(ld, d, n, s)
    return _box(out, ld, x.device)


# pixel_shuffle / pixel_unshuffle: permutations of the elements, floor/Mod index maps
# (out[..., c, h*r + i, w*r + j] = in[..., c*r*r + i*r + j, h, w])
@register_lowering("pixel_shuffle")
def _pixel_shuffle(x, upscale_factor):
    r = int(upscale_factor)
    ld = x.make_loader()

    def f(idx):
        *lead, c, h, w = idx
        return ld(list(lead) + [c * r * r + sympy.Mod(h, r) * r + sympy.Mod(w, r),
                                sympy.floor(h / r), sympy.floor(w / r)])
    return _box(_out_val(), f, x.device)


@register_lowering("pixel_unshuffle")
def _pixel_unshuffle(x, downscale_factor):
    r = int(downscale_factor)
    ld = x.make_loader()

    def f(idx):
        *lead, c, h, w = idx
        k = sympy.Mod(c, r * r)
        return ld(list(lead) + [sympy.floor(c / (r * r)), h * r + sympy.floor(k / r), w * r + sympy.Mod(k, r)])
    return _box(_out_val(), f, x.device)


@register_lowering("glu")
def _glu(x, dim=-1):
    """a * sigmoid(b), a and b the halves of ``x`` along ``dim``: two loads of ``x``, no copy."""
    out = _out_val()
    size = x.get_size()
    d = dim % len(size)
    half = out.shape[d]
    ld = x.make_loader()

    def f(idx):
        a, b = ld(list(idx)), ld(_at(idx, d, idx[d] + half))
        a, b = _conv(a, x.dtype, out.dtype), _conv(b, x.dtype, out.dtype)
        return ops.mul(a, ops.sigmoid(b))
    return _box(out, f, x.device)


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
    from ..bounds import IndirectIndex
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
    if not all(statically_known_leq(isize[k], size[k]) for k in range(len(size)) if k != d):
        raise Unsupported("gather: index larger than the input outside dim (eager raises), or not proved "
                          "at most the input's size for every size")
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
        src[d] = _checked(il(idx), size[d], "take_along_dim", d, wrap=True)
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
    bshape = broadcast_size(*[t.get_size() for t in tens])
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


@register_lowering("flip")
def _flip(a, dims):
    """flip is a copy in eager but an index map here: out[.., i, ..] = a[.., n-1-i, ..]."""
    size = a.get_size()
    nd = len(size)
    ds = {d % nd for d in ([dims] if isinstance(dims, int) else dims)} if nd else set()
    loader = a.make_loader()
    return TensorBox(Pointwise(a.dtype, a.device, size,
                               lambda idx: loader([(size[d] - 1 - idx[d]) if d in ds else idx[d] for d in range(nd)])))
