"""Views, shape ops and indexing (chapter §1.1, §6.4: views are affine index maps).

Three kinds of ops live here.

**Views** (tag ``view``): ``view``, ``reshape``, ``permute``, ``transpose``, ``expand``,
``broadcast_to``, ``unsqueeze``, ``squeeze``, ``flatten``, ``unflatten``, ``t``, ``narrow``,
``select``, ``split``, ``chunk``, ``unbind``, ``as_strided``, ``diagonal``, ``movedim``,
``swapaxes`` and basic indexing ``getitem``.  A view's output shares storage — and so the version
counter — with its input: writing through the view changes the base and bumps ``x._version``.
The dispatcher records ``_base`` and the chain of view ops from it (replayed base -> view), so an
in-place op on a view rewrites the base's history (``CopySlices``) and every other view of that
base re-derives its history from the base's (PyTorch's semantics; see
:mod:`tensorplay.autograd.graph`).  ``reshape``,
``flatten`` and ``contiguous`` copy when the layout demands it and alias otherwise (never return
their input object itself, so aliasing is always visible to autograd).

**Copying shape ops** (tag ``shape``): ``cat``, ``stack``, ``repeat``, ``tile``, ``flip``, ``roll``,
``tril``/``triu``, ``pad`` (constant / reflect / replicate / circular, ``F.pad`` semantics).

**Gather/scatter and indexing** (tag ``indexing``): ``gather``, ``scatter``, ``scatter_add``,
``index_select``, ``index_add``, ``index_fill``, ``index_put``, ``masked_fill``, ``masked_select``,
``take_along_dim``, ``one_hot`` and advanced indexing ``index``.  ``x[...]`` with only ints,
slices, None and Ellipsis is the view op ``getitem``; anything with tensors, lists or bool masks
is the copying op ``index``.  ``x[...] = v`` is the in-place op ``setitem_`` (basic and advanced
indices, broadcast values).

Guarantees:

* every differentiable op has a derivative formula in tp ops (so double backward works); the
  adjoint pairs are gather <-> scatter_add, index_select <-> index_add, index <-> _index_backward
  (an accumulating ``index_put``: duplicate indices sum their gradients), pad <-> crop / index_add;
* integer indices are range-checked before the kernel runs: an out-of-range index raises
  ``IndexError`` naming the op, the offending index, the dimension and its size (on every device —
  never a device-side assert); bool masks of the wrong shape and non-integer index tensors raise
  ``IndexError`` too; negative indices count from the end where PyTorch allows them
  (``index``/``setitem_``/``getitem``), and are rejected where it does not (gather/scatter family);
* ops whose output shape depends on data (``masked_select``; ``index`` with a bool mask; ``one_hot``
  with ``num_classes=-1``) give a meta function that works on real data and raises a clear error
  on meta tensors (``masked_select`` is tagged ``dynamic_shape``).
"""
from __future__ import annotations

import math

import torch

from .._tensor import Tensor, _wrap
from ._helpers import sum_to
from .registry import OPS, DataDependentShapeError, _to_meta, register

__all__ = ["swapdims", "moveaxis"]

V = ("view",)
MC = ("view", "may_copy")     # a view where the layout allows one, else a copy
S = ("shape",)
IX = ("indexing",)


def _inv_perm(dims):
    n = len(dims)
    inv = [0] * n
    for i, d in enumerate(dims):
        inv[d % n] = i
    return inv


def _alias(r, self):
    """Never hand the input object back from a view op: aliasing must be a real view."""
    return self.view(self.shape) if r is self else r


def _reduce_to(g, shape):
    """Sum a gradient down to ``shape``; like ``sum_to`` but also accepts a target with extra
    leading 1-dims (a value of shape [1, 5] assigned into a region of shape [5])."""
    shape = tuple(shape)
    if g.dim() < len(shape):
        g = g.reshape([1] * (len(shape) - g.dim()) + list(g.shape))
    return sum_to(g, shape)


def _norm_dim(d, n):
    return d % n if n > 0 else 0


register("view(Tensor self, int[] size) -> Tensor", lambda self, size: self.view(size),
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V, varargs="size", function=False)
register("reshape(Tensor self, int[] shape) -> Tensor", lambda self, shape: _alias(self.reshape(shape), self),
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=MC, varargs="shape")
register("permute(Tensor self, int[] dims) -> Tensor", lambda self, dims: self.permute(dims),
         backward=lambda ctx, g: g.permute(_inv_perm(ctx.dims)), save=(), tags=V, varargs="dims")
register("transpose(Tensor self, int dim0, int dim1) -> Tensor",
         backward=lambda ctx, g: g.transpose(ctx.dim0, ctx.dim1), save=(), tags=V)
register("swapaxes(Tensor self, int axis0, int axis1) -> Tensor",
         backward=lambda ctx, g: g.transpose(ctx.axis0, ctx.axis1), save=(), tags=V)
register("expand(Tensor self, int[] size) -> Tensor", lambda self, size: self.expand(size),
         backward=lambda ctx, g: sum_to(g, ctx.self.shape), save=(), tags=V, varargs="size", function=False)
register("broadcast_to(Tensor self, int[] size) -> Tensor",
         backward=lambda ctx, g: sum_to(g, ctx.self.shape), save=(), tags=V)
register("unsqueeze(Tensor self, int dim) -> Tensor", backward=lambda ctx, g: g.squeeze(ctx.dim), save=(), tags=V)


def _squeeze_kernel(self, dim):
    return self.squeeze() if dim is None else self.squeeze(dim)


register("squeeze(Tensor self, int[]? dim=None) -> Tensor", _squeeze_kernel,
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V)
register("flatten(Tensor self, int start_dim=0, int end_dim=-1) -> Tensor",
         lambda self, start_dim, end_dim: _alias(torch.flatten(self, start_dim, end_dim), self),
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=MC)
register("unflatten(Tensor self, int dim, int[] sizes) -> Tensor",
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V)
register("t(Tensor self) -> Tensor", backward=lambda ctx, g: g.t(), save=(), tags=V)
register("movedim(Tensor self, int[] source, int[] destination) -> Tensor",
         backward=lambda ctx, g: g.movedim(ctx.destination, ctx.source), save=(), tags=V)
register("contiguous(Tensor self) -> Tensor",
         lambda self: self.contiguous() if not self.is_contiguous() else self.view(self.shape),
         backward=lambda ctx, g: g, save=(), tags=MC + ("shape",), function=False)
register("detach(Tensor self) -> Tensor", lambda self: self.detach(), tags=("nondifferentiable",),
         method=False, function=False,
         doc="The tensor cut from the autograd graph, sharing storage (Tensor.detach inside a captured program).")
register("clone(Tensor self) -> Tensor", lambda self: self.clone(),
         backward=lambda ctx, g: g, save=(), tags=("pointwise",))
register("_to_copy(Tensor self, *, ScalarType? dtype=None, Device? device=None, bool non_blocking=False) -> Tensor",
         lambda self, dtype, device, non_blocking: self.to(dtype=dtype, device=device, non_blocking=non_blocking, copy=True),
         backward=lambda ctx, g: g.to(dtype=ctx.self.dtype, device=ctx.self.device), save=(), tags=("pointwise",),
         method=False)


# ---- narrow / select / split / chunk / unbind / diagonal -----------------------------------------
def _region_grad(g, shape, dim, item):
    """Gradient of taking ``item`` (an int or a slice) along ``dim``: g placed into zeros."""
    n = len(shape)
    d = _norm_dim(dim, n)
    return OPS["_getitem_backward"].fn(g, list(shape), (slice(None),) * d + (item,))


def _narrow_bwd(ctx, g):
    shape = ctx.self.shape
    d = _norm_dim(ctx.dim, len(shape))
    start = ctx.start + shape[d] if ctx.start < 0 else ctx.start
    return _region_grad(g, shape, d, slice(start, start + ctx.length))


register("narrow(Tensor self, int dim, int start, int length) -> Tensor", backward=_narrow_bwd, save=(), tags=V)
register("select(Tensor self, int dim, int index) -> Tensor",
         backward=lambda ctx, g: _region_grad(g, ctx.self.shape, ctx.dim, ctx.index), save=(), tags=V)


def _cat_grads(ctx, *grads):
    return OPS["cat"].fn(list(grads), ctx.dim)


register("split(Tensor self, int[] split_size_or_sections, int dim=0) -> Tensor[]", backward=_cat_grads, save=(),
         tags=V)
register("chunk(Tensor self, int chunks, int dim=0) -> Tensor[]", backward=_cat_grads, save=(), tags=V)
register("unbind(Tensor self, int dim=0) -> Tensor[]",
         backward=lambda ctx, *grads: OPS["stack"].fn(list(grads), _norm_dim(ctx.dim, ctx.self.dim())),
         save=(), tags=V)


def _diagonal_backward_kernel(grad, size, offset, dim1, dim2):
    z = grad.new_zeros(size)
    z.diagonal(offset, dim1, dim2).copy_(grad)
    return z


register("diagonal(Tensor self, int offset=0, int dim1=0, int dim2=1) -> Tensor",
         backward=lambda ctx, g: OPS["_diagonal_backward"].fn(g, list(ctx.self.shape), ctx.offset, ctx.dim1, ctx.dim2),
         save=(), tags=V)
register("_diagonal_backward(Tensor grad, int[] size, int offset, int dim1, int dim2) -> Tensor",
         _diagonal_backward_kernel, backward=lambda ctx, g: g.diagonal(ctx.offset, ctx.dim1, ctx.dim2), save=(),
         tags=S, method=False, function=False)


# ---- as_strided ---------------------------------------------------------------------------------
def _positions(size, stride, offset, n, device):
    """Storage position of every element of the geometry (size, stride, offset)."""
    return torch.arange(n, device=device).as_strided(size, stride, offset)


def _extent(size, stride, offset):
    if any(s == 0 for s in size):
        return 0
    return offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1


def _storage_remap_kernel(src, src_size, src_stride, src_offset, dst_size, dst_stride, dst_offset, divide_after):
    """Linear map between two strided geometries over one storage: scatter-add ``src`` into a
    zero storage at its positions, gather at the destination positions.  Storage cells referenced
    several times by the destination (``divide_after``) or the source (not ``divide_after``) are
    divided by their reference count, so that the map and its adjoint form the as_strided pair."""
    if src.device.type == "meta":
        return torch.empty(dst_size, dtype=src.dtype, device="meta")
    n = max(_extent(src_size, src_stride, src_offset), _extent(dst_size, dst_stride, dst_offset))
    dev = src.device
    ps = _positions(src_size, src_stride, src_offset, n, dev).reshape(-1)
    pd = _positions(dst_size, dst_stride, dst_offset, n, dev).reshape(-1)
    cnt_pos = pd if divide_after else ps
    counts = torch.bincount(cnt_pos, minlength=n) if cnt_pos.numel() else torch.zeros(n, dtype=torch.long, device=dev)
    overlap = bool((counts > 1).any()) if n else False
    vals = src.reshape(-1)
    if overlap and not divide_after:
        vals = vals / counts[ps].clamp(min=1).to(vals.dtype)
    buf = src.new_zeros(n)
    buf.index_put_((ps,), vals, accumulate=True)
    out = buf[pd]
    if overlap and divide_after:
        out = out / counts[pd].clamp(min=1).to(out.dtype)
    return out.reshape(dst_size)


def _storage_remap_bwd(ctx, g):
    return OPS["_storage_remap"].fn(g, ctx.dst_size, ctx.dst_stride, ctx.dst_offset, ctx.src_size, ctx.src_stride,
                                    ctx.src_offset, not ctx.divide_after)


register("_storage_remap(Tensor src, int[] src_size, int[] src_stride, int src_offset, int[] dst_size, "
         "int[] dst_stride, int dst_offset, bool divide_after) -> Tensor", _storage_remap_kernel,
         backward=_storage_remap_bwd, save=(), tags=S, method=False, function=False,
         meta=lambda src, *a: torch.empty(a[3], dtype=src.dtype, device="meta"))


def _geometry(ctx, name):
    """Strides and storage offset of a saved input.  Layout metadata does not change when the data
    is modified in place, so it is read without the saved-tensor version check."""
    if ctx._released:
        return getattr(ctx, name)  # raises the 'backward twice' error
    t = ctx._values[ctx._op._argidx[name]]
    return list(t.shape), list(t.stride()), t.storage_offset()


def _as_strided_bwd(ctx, g):
    in_size, in_stride, in_off = _geometry(ctx, "self")
    off = in_off if ctx.storage_offset is None else ctx.storage_offset
    return OPS["_storage_remap"].fn(g, list(ctx.size), list(ctx.stride), off, in_size, in_stride, in_off, True)


register("as_strided(Tensor self, int[] size, int[] stride, int? storage_offset=None) -> Tensor",
         backward=_as_strided_bwd, save=("self",), tags=V)


# ---- concatenation, repetition, flips, triangles -----------------------------------------------
def _nonempty(tensors):
    if len(tensors) == 0:
        raise RuntimeError("expected a non-empty list of Tensors")


def _cat_kernel(tensors, dim):
    _nonempty(tensors)
    return torch.cat(tensors, dim)


def _cat_bwd(ctx, g):
    metas = ctx.tensors
    d = _norm_dim(ctx.dim, g.dim())
    out, start = [], 0
    for m in metas:
        if m is None:
            out.append(None)
            continue
        shape = m.shape
        if len(shape) == 1 and shape[0] == 0 and g.dim() != 1:  # legacy: empty 1-d inputs are skipped
            out.append(g.new_zeros((0,)))
            continue
        n = shape[d]
        out.append(g.narrow(d, start, n))
        start += n
    return (out,)


register("cat(Tensor[] tensors, int dim=0) -> Tensor", _cat_kernel, backward=_cat_bwd, save=(), tags=S,
         method=False)


def _stack_kernel(tensors, dim):
    _nonempty(tensors)
    return torch.stack(tensors, dim)


register("stack(Tensor[] tensors, int dim=0) -> Tensor", _stack_kernel,
         backward=lambda ctx, g: (list(g.unbind(_norm_dim(ctx.dim, g.dim()))),), save=(), tags=S, method=False)


def _repeat_grad(g, in_shape, reps):
    """Adjoint of tiling ``in_shape`` by ``reps`` (len(reps) >= len(in_shape)): view each output dim
    as (repeat, size) and sum over the repeats."""
    reps = list(reps)
    if not reps:
        return g
    shp = [1] * (len(reps) - len(in_shape)) + list(in_shape)
    inter = []
    for r, s in zip(reps, shp):
        inter += [r, s]
    return g.reshape(inter).sum(list(range(0, 2 * len(reps), 2))).reshape(in_shape)


register("repeat(Tensor self, int[] repeats) -> Tensor", lambda self, repeats: self.repeat(repeats),
         backward=lambda ctx, g: _repeat_grad(g, ctx.self.shape, ctx.repeats), save=(), tags=S, varargs="repeats",
         function=False)


def _tile_bwd(ctx, g):
    dims, n = list(ctx.dims), ctx.self.dim()
    return _repeat_grad(g, ctx.self.shape, [1] * (n - len(dims)) + dims)


register("tile(Tensor self, int[] dims) -> Tensor", backward=_tile_bwd, save=(), tags=S, varargs="dims")
register("flip(Tensor self, int[] dims) -> Tensor", lambda self, dims: torch.flip(self, dims),
         backward=lambda ctx, g: g.flip(ctx.dims), save=(), tags=S, varargs="dims")


def _neg_shifts(s):
    return -s if isinstance(s, int) else [-v for v in s]


register("roll(Tensor self, int[] shifts, int[]? dims=None) -> Tensor",
         backward=lambda ctx, g: g.roll(_neg_shifts(ctx.shifts), ctx.dims), save=(), tags=S)
register("tril(Tensor self, int diagonal=0) -> Tensor", backward=lambda ctx, g: g.tril(ctx.diagonal), save=(),
         tags=S, inplace=True)
register("triu(Tensor self, int diagonal=0) -> Tensor", backward=lambda ctx, g: g.triu(ctx.diagonal), save=(),
         tags=S, inplace=True)


# ---- pad ------------------------------------------------------------------------------------------
_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_kernel(self, pad, mode, value):
    if mode not in _PAD_MODES:
        raise ValueError(f"unknown padding mode {mode!r}; expected one of {', '.join(_PAD_MODES)}")
    if len(pad) % 2 or len(pad) // 2 > self.dim():
        raise ValueError(f"pad must have an even length of at most 2 * {self.dim()} (the input's dimensions), "
                         f"got {len(pad)}")
    if mode != "constant" and value is not None and value != 0:
        raise ValueError(f"padding mode {mode!r} does not take a fill value (got value={value})")
    return torch.nn.functional.pad(self, list(pad), mode=mode, value=value)


def _pad_source_index(n, left, right, mode, device):
    """For one padded dim: the input position each output position reads (tp ops: a compiled
    backward builds it in its graph, on the graph's device)."""
    j = OPS["_arange"].fn(-left, n + right, 1, dtype=torch.int64, device=device)
    if mode == "reflect":
        j = j.abs()
        j = OPS["where"].fn(j >= n, 2 * (n - 1) - j, j)
    elif mode == "replicate":
        j = j.clamp(0, n - 1)
    else:  # circular
        j = j.remainder(n)
    return j


def _pad_bwd(ctx, g):
    p = list(ctx.pad)
    if ctx.mode == "constant":
        return OPS["pad"].fn(g, [-v for v in p])
    shape = list(ctx.self.shape)
    for k in range(len(p) // 2):
        d = len(shape) - 1 - k
        idx = _pad_source_index(shape[d], p[2 * k], p[2 * k + 1], ctx.mode, g.device)
        cur = list(g.shape)
        cur[d] = shape[d]
        g = g.new_zeros(cur).index_add(d, idx, g)
    return g


register("pad(Tensor self, int[] pad, str mode=\"constant\", float? value=None) -> Tensor", _pad_kernel,
         backward=_pad_bwd, save=(), tags=S, method=False)


# ---- index validation -----------------------------------------------------------------------------
def _check_range(index, size, dim, allow_negative):
    """Raise IndexError if an integer index tensor has entries outside the valid range."""
    if not isinstance(index, torch.Tensor) or index.device.type == "meta" or index.numel() == 0:
        return
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise IndexError(f"index tensors must have an integer dtype, got {str(index.dtype).replace('torch.', '')}")
    lo = -size if allow_negative else 0
    mn, mx = int(index.min()), int(index.max())
    bad = mx if mx >= size else (mn if mn < lo else None)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _dim_size(self, dim):
    n = self.dim()
    if n == 0:
        return 1, 0
    if not -n <= dim < n:
        raise IndexError(f"dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    d = dim % n
    return self.shape[d], d


def _check_dim_index(self, dim, index, allow_negative=False):
    size, d = _dim_size(self, dim)
    _check_range(index, size, d, allow_negative)


def _as_index_tensor(i):
    if isinstance(i, torch.Tensor):
        return i
    if isinstance(i, (list, tuple)):
        try:
            t = torch.as_tensor(i)
        except (TypeError, ValueError, RuntimeError):
            return None
        return t.long() if t.numel() == 0 and t.dtype.is_floating_point else t
    return None


def _is_mask(t):
    return t.dtype in (torch.bool, torch.uint8)


def _check_index(shape, indices):
    """Validate a Python indexing expression against ``shape`` (ints, slices, None, Ellipsis,
    integer tensors / lists, bool masks): clear IndexErrors instead of crashes."""
    idx = indices if isinstance(indices, tuple) else (indices,)
    ndim = len(shape)
    items, used, n_ell = [], 0, 0
    for i in idx:
        if i is Ellipsis:
            n_ell += 1
            items.append((i, None, 0))
            continue
        if i is None or isinstance(i, bool):
            items.append((i, None, 0))
            continue
        if isinstance(i, (torch.Tensor, list, tuple)):
            t = _as_index_tensor(i)
            if t is None:
                items.append((i, None, 1))
                used += 1
                continue
            k = t.dim() if _is_mask(t) else 1
            items.append((i, t, k))
            used += k
            continue
        items.append((i, None, 1))
        used += 1
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim} (got {used} indexed dimensions)")
    d = 0
    for i, t, k in items:
        if i is Ellipsis:
            d += ndim - used
            continue
        if t is not None:
            if _is_mask(t):
                if t.dim() > 0 and tuple(t.shape) != tuple(shape[d:d + k]):
                    raise IndexError(f"boolean mask of shape {list(t.shape)} does not match the indexed shape "
                                     f"{list(shape[d:d + k])} at dimension {d}")
            else:
                _check_range(t, shape[d], d, True)
        elif isinstance(i, int) and not isinstance(i, bool) and k == 1:
            if not -shape[d] <= i < shape[d]:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {shape[d]}")
        d += k


# ---- basic indexing (views) -----------------------------------------------------------------------
def _is_basic(idx) -> bool:
    if not isinstance(idx, tuple):
        idx = (idx,)
    for i in idx:
        if i is None or i is Ellipsis or isinstance(i, slice):
            continue
        if isinstance(i, int) and not isinstance(i, bool):
            continue
        return False
    return True


def _getitem_bwd(ctx, g):
    return OPS["_getitem_backward"].fn(g, list(ctx.self.shape), ctx.indices)


def _getitem_kernel(self, indices):
    if type(self) is torch.Tensor:        # a real or meta tensor (a fake one is a subclass)
        return self[indices]
    idx = indices if isinstance(indices, tuple) else (indices,)
    if any(isinstance(v, torch.SymInt) for i in idx for v in ((i.start, i.stop, i.step) if isinstance(i, slice)
                                                               else (i,))):
        return _getitem_symbolic(self, idx)
    return self[indices]


def _getitem_symbolic(self, idx):
    """Basic indexing with symbolic bounds (the dynamic=True shadow run, capture/symbolic.py): dim
    by dim through ``aten.slice``/``aten.select``, which take SymInts as they are — Python's slice
    unpacking would turn each into its sample value (a guard that specialises the size)."""
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    out, d = self, 0
    for i in idx:
        if i is Ellipsis:
            d += self.dim() - n_real
        elif i is None:
            out = out.unsqueeze(d)
            d += 1
        elif isinstance(i, slice):
            out = torch.ops.aten.slice.Tensor(out, d, i.start, i.stop, 1 if i.step is None else i.step)
            d += 1
        else:
            out = torch.ops.aten.select.int(out, d, i)
    return out


register("getitem(Tensor self, Index indices) -> Tensor", _getitem_kernel, backward=_getitem_bwd, save=(),
         tags=("view", "indexing"), method=False, function=False)


def _getitem_backward_kernel(grad, size, indices):
    z = grad.new_zeros(size)
    z[indices] = grad
    return z


register("_getitem_backward(Tensor grad, int[] size, Index indices) -> Tensor", _getitem_backward_kernel,
         backward=lambda ctx, g: (g[ctx.indices],), save=(), tags=("indexing",), method=False, function=False)


# ---- advanced indexing (copies) -------------------------------------------------------------------
def _index_kernel(self, indices):
    if self.device.type == "meta":
        return _index_meta(self, indices)
    _check_index(self.shape, indices)
    return self[indices]


def _index_meta(self, indices):
    """Output shape of advanced indexing.  Integer index tensors are data-independent; a bool
    mask's element count is read from real data and is unknowable on meta tensors."""
    m = _to_meta(self)

    def conv(i):
        if isinstance(i, Tensor):
            i = i._data
        if isinstance(i, list):
            t = _as_index_tensor(i)
            i = t if t is not None else i
        if isinstance(i, torch.Tensor):
            if _is_mask(i):
                if i.device.type == "meta":
                    raise DataDependentShapeError("tp.index: the output shape depends on the values of a boolean "
                                                  "mask (data-dependent shape); it has no meta function on meta tensors")
                if i.dim() == 0:
                    return [bool(i)]
                n = int(i.count_nonzero())
                return [torch.empty(n, dtype=torch.long, device="meta")] * i.dim()
            return [torch.empty_strided(i.shape, i.stride(), dtype=i.dtype, device="meta")]
        return [i]
    idx = indices if isinstance(indices, tuple) else (indices,)
    out = []
    for i in idx:
        out += conv(i)
    return m[tuple(out)]


def _index_bwd(ctx, g):
    return OPS["_index_backward"].fn(g, list(ctx.self.shape), ctx.indices)


register("index(Tensor self, Index indices) -> Tensor", _index_kernel, backward=_index_bwd, save=(), tags=IX,
         meta=_index_meta, method=False, function=False)


def _index_backward_kernel(grad, size, indices):
    """Scatter-add ``grad`` into zeros of ``size`` at ``self[indices]``'s positions.  Indexing a
    storage-position map (arange) with the same expression gives, for every output element, the
    flat position it came from — for any mix of ints, slices, None, Ellipsis, tensors and masks —
    and an accumulating index_put sums duplicates."""
    n = math.prod(size)
    pos = torch.arange(n, device=grad.device).view(size)[indices]
    z = grad.new_zeros(n)
    z.index_put_((pos.reshape(-1),), grad.reshape(-1), accumulate=True)
    return z.view(size)


register("_index_backward(Tensor grad, int[] size, Index indices) -> Tensor", _index_backward_kernel,
         backward=lambda ctx, g: (OPS["index"].fn(g, ctx.indices),), save=(), tags=IX, method=False,
         function=False, meta=lambda grad, size, indices: torch.empty(size, dtype=grad.dtype, device="meta"))


def _setitem_kernel(self, indices, value):
    if not _is_basic(indices):
        _check_index(self.shape, indices)
    self[indices] = value
    return self


def _index_of(g, indices):
    return OPS["getitem"].fn(g, indices) if _is_basic(indices) else OPS["index"].fn(g, indices)


def _setitem_bwd(ctx, g):
    gs = None
    if ctx.needs_input_grad[0]:
        gs = g.clone()
        gs[ctx.indices] = 0
    gv = None
    if ctx.needs_input_grad[1]:
        gv = _reduce_to(_index_of(g, ctx.indices), ctx.value.shape)
    return gs, gv


def _setitem_jvp(args, outs, tangents):
    """Forward mode: the tangent of ``self`` with the written region replaced by the value's."""
    self, indices, value = args
    ts, tv = tangents
    t = ts.clone() if ts is not None else self.new_zeros(self.shape)
    t[indices] = tv if tv is not None else 0
    return (t,)


register("setitem_(Tensor(a!) self, Index indices, Tensor value) -> Tensor(a!)", _setitem_kernel,
         backward=_setitem_bwd, save=(), tags=("inplace", "indexing"), method=False, function=False,
         jvp=_setitem_jvp, meta=lambda self, indices, value: _to_meta(self))


def _put_indices(indices):
    if isinstance(indices, tuple):
        return indices
    if isinstance(indices, list) and indices and all(isinstance(i, (torch.Tensor, Tensor)) for i in indices):
        return tuple(indices)
    return (indices,)


def _as_value(values, like):
    if isinstance(values, torch.Tensor):
        return values
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _index_put_kernel(self, indices, values, accumulate):
    idx = _put_indices(indices)
    _check_index(self.shape, idx)
    return self.index_put(idx, _as_value(values, self), accumulate)


def _index_put__kernel(self, indices, values, accumulate):
    idx = _put_indices(indices)
    _check_index(self.shape, idx)
    return self.index_put_(idx, _as_value(values, self), accumulate)


def _index_put_bwd(ctx, g):
    idx = _put_indices(ctx.indices)
    gs = gv = None
    if ctx.needs_input_grad[0]:
        gs = g if ctx.accumulate else OPS["index_put"].fn(g, idx, 0)
    if ctx.needs_input_grad[1]:
        gv = _reduce_to(OPS["index"].fn(g, idx), ctx.values.shape)
    return gs, gv


register("index_put(Tensor self, Index indices, Tensor values, bool accumulate=False) -> Tensor",
         _index_put_kernel, backward=_index_put_bwd, save=(), tags=IX, inplace=True,
         inplace_eager=_index_put__kernel, meta=lambda self, indices, values, accumulate:
         torch.empty(self.shape, dtype=self.dtype, device="meta"))


# ---- gather / scatter / index_select / index_add / index_fill ---------------------------------------
def _embed(g, shape):
    """``g`` (the gradient at an index tensor's shape) placed into zeros of ``shape`` (a src that is
    larger than the index in some dims contributes only its leading block)."""
    if tuple(g.shape) == tuple(shape):
        return g
    return OPS["_getitem_backward"].fn(g, list(shape), tuple(slice(0, n) for n in g.shape))


def _gather_kernel(self, dim, index, sparse_grad):
    _check_dim_index(self, dim, index)
    return torch.gather(self, dim, index, sparse_grad=sparse_grad)


register("gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", _gather_kernel,
         backward=lambda ctx, g: (g.new_zeros(ctx.self.shape).scatter_add(ctx.dim, ctx.index, g), None),
         save=("index",), tags=IX)


def _scatter_src(src, value, reduce):
    if (src is None) == (value is None):
        raise TypeError("pass exactly one of src (a tensor or number) and value (a number)")
    if reduce is not None and reduce not in ("add", "multiply"):
        raise ValueError(f"reduce must be 'add' or 'multiply', got {reduce!r}")
    return src if value is None else value


def _scatter_kernel(self, dim, index, src, value, reduce):
    _check_dim_index(self, dim, index)
    src = _scatter_src(src, value, reduce)
    if reduce is None:
        return torch.scatter(self, dim, index, src)
    return torch.scatter(self, dim, index, src, reduce=reduce)


def _scatter__kernel(self, dim, index, src, value, reduce):
    _check_dim_index(self, dim, index)
    src = _scatter_src(src, value, reduce)
    return self.scatter_(dim, index, src) if reduce is None else self.scatter_(dim, index, src, reduce=reduce)


def _scatter_bwd(ctx, g):
    if ctx.reduce is not None:
        raise NotImplementedError(f"tp.scatter: the derivative with reduce={ctx.reduce!r} is not implemented "
                                  "(as in PyTorch); use scatter_reduce")
    gs = g.scatter(ctx.dim, ctx.index, 0) if ctx.needs_input_grad[0] else None
    gsrc = None
    if ctx.needs_input_grad[2] and ctx.src is not None:
        gsrc = _embed(g.gather(ctx.dim, ctx.index), ctx.src.shape)
    return gs, None, gsrc


register("scatter(Tensor self, int dim, Tensor index, Tensor? src=None, *, Scalar? value=None, str? reduce=None) "
         "-> Tensor", _scatter_kernel, backward=_scatter_bwd,
         save=("index",), tags=IX, inplace=True, inplace_eager=_scatter__kernel)


def _scatter_add_kernel(self, dim, index, src):
    _check_dim_index(self, dim, index)
    return torch.scatter_add(self, dim, index, src)


def _scatter_add__kernel(self, dim, index, src):
    _check_dim_index(self, dim, index)
    return self.scatter_add_(dim, index, src)


def _scatter_add_bwd(ctx, g):
    gsrc = _embed(g.gather(ctx.dim, ctx.index), ctx.src.shape) if ctx.needs_input_grad[2] else None
    return (g if ctx.needs_input_grad[0] else None), None, gsrc


register("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", _scatter_add_kernel,
         backward=_scatter_add_bwd, save=("index",), tags=IX, inplace=True, inplace_eager=_scatter_add__kernel)


def _index_select_kernel(self, dim, index):
    _check_dim_index(self, dim, index)
    return torch.index_select(self, dim, index)


def _index_select_bwd(ctx, g):
    shape = ctx.self.shape
    if len(shape) == 0:
        return g.reshape(()), None
    return g.new_zeros(shape).index_add(ctx.dim, ctx.index.reshape(-1), g), None


register("index_select(Tensor self, int dim, Tensor index) -> Tensor", _index_select_kernel,
         backward=_index_select_bwd, save=("index",), tags=IX)


def _index_add_kernel(self, dim, index, source, alpha):
    _check_dim_index(self, dim, index)
    return torch.index_add(self, dim, index, source, alpha=alpha)


def _index_add__kernel(self, dim, index, source, alpha):
    _check_dim_index(self, dim, index)
    return self.index_add_(dim, index, source, alpha=alpha)


def _index_add_bwd(ctx, g):
    gs = g if ctx.needs_input_grad[0] else None
    gsrc = None
    if ctx.needs_input_grad[2]:
        shape = ctx.source.shape
        gsrc = g.reshape(-1) if g.dim() == 0 else g.index_select(ctx.dim, ctx.index)
        gsrc = gsrc.reshape(shape)
        if ctx.alpha != 1:
            gsrc = gsrc * ctx.alpha
    return gs, None, gsrc


register("index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor",
         _index_add_kernel, backward=_index_add_bwd, save=("index",), tags=IX, inplace=True,
         inplace_eager=_index_add__kernel)


def _index_fill_kernel(self, dim, index, value):
    _check_dim_index(self, dim, index, allow_negative=True)
    return torch.index_fill(self, dim, index, value)


def _index_fill__kernel(self, dim, index, value):
    _check_dim_index(self, dim, index, allow_negative=True)
    return self.index_fill_(dim, index, value)


def _index_fill_bwd(ctx, g):
    gs = g.index_fill(ctx.dim, ctx.index, 0)
    gv = (g - gs).sum() if ctx.needs_input_grad[2] else None
    return (gs if ctx.needs_input_grad[0] else None), None, gv


register("index_fill(Tensor self, int dim, Tensor index, Tensor value) -> Tensor", _index_fill_kernel,
         backward=_index_fill_bwd, save=("index",), tags=IX, inplace=True, inplace_eager=_index_fill__kernel)


def _take_along_dim_kernel(self, indices, dim):
    if dim is None:
        _check_range(indices, self.numel(), 0, False)     # (torch too rejects negative flat indices)
    else:
        _check_dim_index(self, dim, indices, allow_negative=True)   # counted from the end, as in torch
    return torch.take_along_dim(self, indices, dim)


def _take_along_dim_bwd(ctx, g):
    x, idx = ctx.self, ctx.indices
    if ctx.dim is None:
        flat = g.new_zeros((x.numel(),)).scatter_add(0, idx.reshape(-1), g.reshape(-1))
        return flat.reshape(x.shape), None
    d = ctx.dim % x.dim()
    idx = idx.remainder(max(x.shape[d], 1))              # scatter_add needs the non-negative form
    xs, ixs = list(x.shape), list(idx.shape)
    a, b = xs.copy(), ixs.copy()
    a[d] = b[d] = 1
    common = list(torch.broadcast_shapes(a, b))
    xb, ib = common.copy(), common.copy()
    xb[d], ib[d] = xs[d], ixs[d]
    gb = g.new_zeros(xb).scatter_add(d, idx.expand(ib), g)
    return sum_to(gb, xs), None


register("take_along_dim(Tensor self, Tensor indices, int? dim=None) -> Tensor", _take_along_dim_kernel,
         backward=_take_along_dim_bwd, save=("indices",), tags=IX)


# ---- masks ----------------------------------------------------------------------------------------
def _masked_fill_bwd(ctx, g):
    gs = g.masked_fill(ctx.mask, 0)
    gv = (g - gs).sum() if ctx.needs_input_grad[2] else None
    gs = sum_to(gs, ctx.self.shape) if ctx.needs_input_grad[0] else None
    return gs, None, gv


register("masked_fill(Tensor self, Tensor mask, Tensor value) -> Tensor", backward=_masked_fill_bwd, save=("mask",),
         tags=IX, inplace=True)


def _masked_select_meta(self, mask):
    if isinstance(mask, Tensor):
        mask = mask._data
    if mask.device.type == "meta":
        raise DataDependentShapeError("tp.masked_select: the output shape depends on the values of the mask "
                                      "(data-dependent shape); it has no meta function on meta tensors")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    n = int(mask.expand(shape).count_nonzero())
    return torch.empty(n, dtype=self.dtype, device="meta")


def _masked_select_bwd(ctx, g):
    shape = list(torch.broadcast_shapes(ctx.self.shape, ctx.mask.shape))
    z = OPS["_masked_select_backward"].fn(g, shape, ctx.mask)
    return sum_to(z, ctx.self.shape), None


def _masked_select_kernel(self, mask):
    if self.device.type == "meta" or mask.device.type == "meta":
        return _masked_select_meta(self, mask)
    return torch.masked_select(self, mask)


register("masked_select(Tensor self, Tensor mask) -> Tensor", _masked_select_kernel, backward=_masked_select_bwd,
         save=("mask",),
         tags=IX + ("dynamic_shape",), meta=_masked_select_meta)


def _masked_select_backward_kernel(grad, size, mask):
    z = grad.new_zeros(size)
    return z.masked_scatter_(mask.expand(size), grad)


register("_masked_select_backward(Tensor grad, int[] size, Tensor mask) -> Tensor", _masked_select_backward_kernel,
         backward=lambda ctx, g: (g.masked_select(ctx.mask), None), save=("mask",), tags=IX, method=False,
         function=False, meta=lambda grad, size, mask: torch.empty(size, dtype=grad.dtype, device="meta"))


def _one_hot_kernel(self, num_classes):
    if self.device.type == "meta":
        return _one_hot_meta(self, num_classes)
    if self.dtype != torch.int64:
        raise RuntimeError(f"one_hot is only applicable to int64 index tensors, got "
                           f"{str(self.dtype).replace('torch.', '')}")
    if self.device.type != "meta" and self.numel():
        mn, mx = int(self.min()), int(self.max())
        if mn < 0:
            raise RuntimeError(f"class values must be non-negative, got {mn}")
        if num_classes >= 0 and mx >= num_classes:
            raise RuntimeError(f"class value {mx} is out of range for num_classes={num_classes}")
    return torch.nn.functional.one_hot(self, num_classes)


def _one_hot_meta(self, num_classes):
    if num_classes < 0:
        d = self._data if isinstance(self, Tensor) else self
        if d.device.type == "meta":
            raise DataDependentShapeError("tp.one_hot: with num_classes=-1 the output shape depends on the data; "
                                          "pass num_classes")
        num_classes = int(d.max()) + 1 if d.numel() else 0
    return torch.empty(tuple(self.shape) + (num_classes,), dtype=torch.int64, device="meta")


register("one_hot(Tensor self, int num_classes=-1) -> Tensor", _one_hot_kernel, tags=IX + ("nondifferentiable",),
         meta=_one_hot_meta, method=False)


# ---- Tensor methods that are not table entries --------------------------------------------------
def _tensor_getitem(self, indices):
    if _is_basic(indices):
        return OPS["getitem"].fn(self, indices)
    return OPS["index"].fn(self, indices)


def _tensor_setitem(self, indices, value):
    if isinstance(value, (list, tuple)):
        value = _wrap(torch.tensor(value, dtype=self.dtype, device=self.device))
    OPS["setitem_"].fn(self, indices, value)


def _mT(self):
    return OPS["transpose"].fn(self, -2, -1)


def _T(self):
    return OPS["permute"].fn(self, list(range(self.dim() - 1, -1, -1)))


def swapdims(self, dim0, dim1):
    """Alias of ``swapaxes`` (and of ``transpose``)."""
    return OPS["swapaxes"].fn(self, dim0, dim1)


def moveaxis(self, source, destination):
    """Alias of ``movedim``."""
    return OPS["movedim"].fn(self, source, destination)


EXTRA_METHODS = {"__getitem__": _tensor_getitem, "__setitem__": _tensor_setitem,
                 "mT": property(_mT), "T": property(_T),
                 "expand_as": lambda self, other: OPS["expand"].fn(self, list(other.shape)),
                 "view_as": lambda self, other: OPS["view"].fn(self, list(other.shape)),
                 "reshape_as": lambda self, other: OPS["reshape"].fn(self, list(other.shape)),
                 "swapdims": swapdims, "moveaxis": moveaxis}
