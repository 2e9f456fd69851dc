"""Combination and shape ops: diag family, stacks, meshgrid, tensordot, kron, trace, cdist, cross,
atleast_nd, tensor_split / h- v- dsplit, ``Tensor.unfold``, rot90, fliplr/flipud, tril/triu_indices,
combinations, cartesian_prod, block_diag, trapezoid / cumulative_trapezoid, diff, vander, narrow_copy.

Eager kernels are ATen's (bit-exact with PyTorch).  Guarantees:

* views stay views (tag ``view``: ``atleast_nd``, ``tensor_split``, ``hsplit``/``vsplit``/``dsplit``,
  ``unfold``): they share storage with their input, and Stax lowers them as index maps of a buffer
  (view_rules' meta trick); never the input object itself.  ``meshgrid`` is, as in ATen, a
  composition of views (reshape + expand of each input);
* copying ops are tagged ``shape`` + ``extern`` (``linalg`` for the products): Stax runs them as
  library (ATen) kernels, and their consumers fuse; a decomposition into table ops is given where
  one exists (hstack -> cat, trace -> diagonal + sum, fliplr -> flip, ...), for backends with a
  smaller basis;
* every differentiable op has a derivative written in tp ops (double backward works): the diag
  family and trace use ``diagonal`` / ``_diagonal_backward``, the splits and stacks ``cat`` /
  ``narrow``, tensordot is again a tensordot, unfold has ``_unfold_backward`` (adjoint pair);
* bad arguments raise errors naming the op (the dispatcher prefixes ``tp.<op>(...)``).
"""
from __future__ import annotations

import math

import torch

from .._tensor import Tensor
from ._helpers import sum_to
from .registry import OPS, register
from .view import _alias, _inv_perm, _narrow_bwd

__all__ = []

V = ("view",)
S = ("shape", "extern")     # copying shape ops: library (ATen) kernels in Stax
L = ("linalg",)
LH = ("linalg", "holomorphic")   # (registry.py: the complex convention)


def _op(name):
    return OPS[name].fn


# ---- diag family -------------------------------------------------------------------------------------
def _diag_bwd(ctx, g):
    if len(ctx.self.shape) == 1:
        return g.diagonal(ctx.diagonal)
    return _op("_diagonal_backward")(g, list(ctx.self.shape), ctx.diagonal, 0, 1)


def _diag_kernel(self, diagonal):
    if self.dim() not in (1, 2):
        raise RuntimeError(f"expected a 1-d or 2-d tensor, got {self.dim()}-d")
    return torch.diag(self, diagonal)


register("diag(Tensor self, int diagonal=0) -> Tensor", _diag_kernel, backward=_diag_bwd, save=(), tags=S)
register("diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1) -> Tensor",
         backward=lambda ctx, g: g.diagonal(ctx.offset, ctx.dim1, ctx.dim2), save=(), tags=S)
register("diagflat(Tensor self, int offset=0) -> Tensor",
         backward=lambda ctx, g: g.diagonal(ctx.offset).reshape(ctx.self.shape), save=(), tags=S)


def _trace_kernel(self):
    if self.dim() != 2:
        raise RuntimeError(f"expected a matrix (2-d tensor), got {self.dim()}-d")
    return torch.trace(self)


def _trace_bwd(ctx, g):
    n, m = ctx.self.shape
    return _op("_diagonal_backward")(g.expand([min(n, m)]), [n, m], 0, 0, 1)


register("trace(Tensor self) -> Tensor", _trace_kernel, backward=_trace_bwd, save=(), tags=S,
         decomp=lambda self: self.diagonal().sum())


# ---- stacks ---------------------------------------------------------------------------------------------
def _atleast(shape, n):
    shape = list(shape)
    if len(shape) >= n:
        return shape
    if n == 1:
        return [1]
    if n == 2:
        return [1] * (2 - len(shape)) + shape
    return {0: [1, 1, 1], 1: [1] + shape + [1], 2: shape + [1]}[len(shape)]


def _stack_plan(name, shapes):
    """(dim, shape each input takes before the concatenation) of hstack/vstack/dstack/column_stack."""
    if name == "hstack":
        s = [_atleast(x, 1) for x in shapes]
        return (0 if len(s[0]) == 1 else 1), s
    if name in ("vstack", "row_stack"):
        return 0, [_atleast(x, 2) for x in shapes]
    if name == "dstack":
        return 2, [_atleast(x, 3) for x in shapes]
    return 1, [list(x) if len(x) >= 2 else [max(math.prod(x), 1) if len(x) else 1, 1] for x in shapes]


def _make_stack(name):
    def kernel(tensors):
        if len(tensors) == 0:
            raise RuntimeError("expected a non-empty list of Tensors")
        return getattr(torch, name)(tensors)

    def bwd(ctx, g):
        shapes = [t.shape for t in ctx.tensors]
        dim, s = _stack_plan(name, shapes)
        parts = g.split([p[dim] for p in s], dim)
        return ([p.reshape(list(sh)) for p, sh in zip(parts, shapes)],)

    def decomp(tensors):
        dim, s = _stack_plan(name, [t.shape for t in tensors])
        return _op("cat")([t.reshape(sh) for t, sh in zip(tensors, s)], dim)
    register(f"{name}(Tensor[] tensors) -> Tensor", kernel, backward=bwd, save=(), tags=S, decomp=decomp,
             method=False)


for _n in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
    _make_stack(_n)


def _block_diag_shapes(shapes):
    return [[1, 1] if len(s) == 0 else ([1, s[0]] if len(s) == 1 else list(s)) for s in shapes]


def _block_diag_bwd(ctx, g):
    shapes = [t.shape for t in ctx.tensors]
    out, r, c = [], 0, 0
    for sh, (h, w) in zip(shapes, _block_diag_shapes(shapes)):
        out.append(g.narrow(0, r, h).narrow(1, c, w).reshape(list(sh)))
        r, c = r + h, c + w
    return (out,)


def _block_diag_kernel(tensors):
    for t in tensors:
        if t.dim() > 2:
            raise RuntimeError(f"block_diag takes tensors of at most 2 dimensions, got shape {list(t.shape)}")
    return torch.block_diag(*tensors)


register("block_diag(Tensor[] tensors) -> Tensor", _block_diag_kernel, backward=_block_diag_bwd, save=(), tags=S,
         method=False, function=False)


def block_diag(*tensors):
    """A block-diagonal matrix of the inputs (0-d, 1-d as a row, or 2-d), zeros elsewhere."""
    return OPS["block_diag"].fn(list(tensors))


# ---- meshgrid / cartesian_prod ------------------------------------------------------------------------------
def meshgrid(*tensors, indexing=None):
    """Coordinate grids of 0-d or 1-d tensors (``indexing='ij'``: matrix order, the default;
    ``'xy'``: Cartesian order, the first two dims swapped), like ``torch.meshgrid``.  Each grid is
    a view of its input (``reshape`` then ``expand``: ATen's own composition), so the values and
    strides are PyTorch's, gradients sum over the expanded dims, and Stax lowers them as index maps."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = indexing or "ij"
    if indexing not in ("ij", "xy"):
        raise ValueError(f"tp.meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"tp.meshgrid: expected Tensors, got {type(t).__name__}")
        if t.dim() > 1:
            raise RuntimeError(f"tp.meshgrid: takes 0-d or 1-d tensors, got shape {list(t.shape)}")
    n = len(tensors)
    dims = list(range(n))
    if indexing == "xy" and n >= 2:
        dims[0], dims[1] = 1, 0
    sizes = [t.numel() for t in tensors]
    grid = [sizes[dims.index(d)] for d in range(n)]
    out = []
    for t, d in zip(tensors, dims):
        shape = [1] * n
        shape[d] = -1
        out.append(_op("expand")(_op("reshape")(t, shape), grid))
    return tuple(out)


def _cartesian_prod_kernel(tensors):
    for t in tensors:
        if t.dim() != 1:
            raise RuntimeError(f"cartesian_prod takes 1-d tensors, got shape {list(t.shape)}")
    r = torch.cartesian_prod(*tensors)
    return r.clone() if len(tensors) == 1 else r    # a copy, as the op is not a view (the wrapper's is)


def _cartesian_prod_bwd(ctx, g):
    shapes = [t.shape[0] for t in ctx.tensors]
    if len(shapes) == 1:
        return ([g],)
    out = []
    for i in range(len(shapes)):
        gi = g.select(1, i).reshape(shapes)
        others = [k for k in range(len(shapes)) if k != i]
        out.append(gi.sum(others))
    return (out,)


register("cartesian_prod(Tensor[] tensors) -> Tensor", _cartesian_prod_kernel, backward=_cartesian_prod_bwd,
         save=(), tags=S, method=False, function=False)


def cartesian_prod(*tensors):
    """All combinations of the elements of the 1-d inputs (rows in lexicographic order).  One input
    is returned as a view of itself, as in PyTorch (a tracked alias)."""
    if len(tensors) == 1 and isinstance(tensors[0], Tensor) and tensors[0].dim() == 1:
        return _op("reshape")(tensors[0], [-1])
    return OPS["cartesian_prod"].fn(list(tensors))


def _combinations_kernel(self, r, with_replacement):
    if self.dim() != 1:
        raise RuntimeError(f"expected a 1-d tensor, got shape {list(self.shape)}")
    if r < 0:
        raise ValueError(f"r must be non-negative, got {r}")
    return torch.combinations(self, r, with_replacement)


def _combinations_bwd(ctx, g):
    from .factories import arange
    n = ctx.self.shape[0]
    idx = OPS["combinations"].fn(arange(n, device=g.device), ctx.r, ctx.with_replacement)
    return g.new_zeros([n]).index_add(0, idx.reshape(-1), g.reshape(-1))


def _combinations_meta(self, r, with_replacement):
    n = self.shape[0] if self.dim() == 1 else 0
    if r == 0:
        return torch.empty(0, dtype=self.dtype, device="meta")
    k = math.comb(n + r - 1, r) if with_replacement else math.comb(n, r)
    return torch.empty((k, r), dtype=self.dtype, device="meta")


register("combinations(Tensor self, int r=2, bool with_replacement=False) -> Tensor", _combinations_kernel,
         backward=_combinations_bwd, save=(), tags=S, method=False, meta=_combinations_meta)


# ---- tensordot / kron ----------------------------------------------------------------------------------
def _tensordot_dims(a_ndim, dims):
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tp.tensordot: dims must be non-negative, got {dims}")
        return list(range(a_ndim - dims, a_ndim)), list(range(dims))
    da, db = dims
    da = [da] if isinstance(da, int) else list(da)
    db = [db] if isinstance(db, int) else list(db)
    return da, db


def _tensordot_bwd(ctx, g):
    na, nb = len(ctx.self.shape), len(ctx.other.shape)
    ca = [d % na for d in ctx.dims_self]
    cb = [d % nb for d in ctx.dims_other]
    fa = [d for d in range(na) if d not in ca]
    fb = [d for d in range(nb) if d not in cb]
    ga = gb = None
    if ctx.needs_input_grad[0]:
        r = _op("tensordot")(g, ctx.other, list(range(len(fa), len(fa) + len(fb))), fb)
        order = fa + [ca[cb.index(s)] for s in sorted(cb)]
        ga = r.permute(_inv_perm(order))
    if ctx.needs_input_grad[1]:
        r = _op("tensordot")(ctx.self, g, fa, list(range(len(fa))))
        order = [cb[ca.index(s)] for s in sorted(ca)] + fb
        gb = r.permute(_inv_perm(order))
    return ga, gb


register("tensordot(Tensor self, Tensor other, int[] dims_self, int[] dims_other) -> Tensor",
         lambda self, other, dims_self, dims_other: torch.tensordot(self, other, dims=(dims_self, dims_other)),
         backward=_tensordot_bwd, save=("self", "other"), tags=LH, method=False, function=False)


def tensordot(a, b, dims=2):
    """Contract ``dims`` (an int: the last dims of ``a`` with the first of ``b``; or two lists of
    dims) of ``a`` and ``b``, like ``torch.tensordot``."""
    da, db = _tensordot_dims(a.dim(), dims)
    return OPS["tensordot"].fn(a, b, da, db)


def _kron_bwd(ctx, g):
    a, b = ctx.self, ctx.other
    n = max(a.dim(), b.dim())
    sa = [1] * (n - a.dim()) + list(a.shape)
    sb = [1] * (n - b.dim()) + list(b.shape)
    inter = [v for pair in zip(sa, sb) for v in pair]
    gi = g.reshape(inter)
    ae = a.reshape([v for s in sa for v in (s, 1)])
    be = b.reshape([v for s in sb for v in (1, s)])
    ga = (gi * be).sum(list(range(1, 2 * n, 2))).reshape(a.shape) if ctx.needs_input_grad[0] else None
    gb = (gi * ae).sum(list(range(0, 2 * n, 2))).reshape(b.shape) if ctx.needs_input_grad[1] else None
    return ga, gb


register("kron(Tensor self, Tensor other) -> Tensor", backward=_kron_bwd, save=("self", "other"), tags=LH)


# ---- cdist / cross ---------------------------------------------------------------------------------------
def _cdist_kernel(x1, x2, p, compute_mode):
    if p < 0:
        raise RuntimeError(f"p must be non-negative, got {p}")
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"expected x1 [..., P, M] and x2 [..., R, M] with equal M, got "
                           f"{list(x1.shape)} and {list(x2.shape)}")
    return torch.cdist(x1, x2, p, compute_mode or "use_mm_for_euclid_dist_if_necessary")


def _cdist_bwd(ctx, g):
    x1, x2, p, d = ctx.x1, ctx.x2, ctx.p, ctx.result
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    gd, dd = g.unsqueeze(-1), d.unsqueeze(-1)
    if p == 0:
        gdiff = diff * 0
    elif p == 1:
        gdiff = gd * diff.sign()
    elif p == 2:
        gdiff = gd * diff / dd.masked_fill(dd == 0, 1) * (dd != 0)
    elif math.isinf(p):
        gdiff = gd * diff.sign() * (diff.abs() == dd)
    else:
        nz = dd != 0
        gdiff = gd * diff * diff.abs().pow(p - 2) / dd.masked_fill(~nz, 1).pow(p - 1) * nz
        if p < 2:
            gdiff = gdiff.masked_fill(diff == 0, 0)
    g1 = sum_to(gdiff.sum(-2), x1.shape) if ctx.needs_input_grad[0] else None
    g2 = sum_to(-gdiff.sum(-3), x2.shape) if ctx.needs_input_grad[1] else None
    return g1, g2


register("cdist(Tensor x1, Tensor x2, float p=2.0, str? compute_mode=None) -> Tensor", _cdist_kernel,
         backward=_cdist_bwd, save=("x1", "x2", "result"), tags=L, method=False)


def _cross_dim(shape_a, shape_b, dim):
    shape = torch.broadcast_shapes(shape_a, shape_b)
    if dim is not None:
        return dim % len(shape)
    for i, s in enumerate(shape):
        if s == 3:
            return i
    raise RuntimeError(f"no dimension of size 3 in the broadcast shape {list(shape)}")


def _cross_kernel(self, other, dim):
    d = _cross_dim(self.shape, other.shape, dim)
    shape = torch.broadcast_shapes(self.shape, other.shape)
    if shape[d] != 3:
        raise RuntimeError(f"dimension {d} must have size 3, got {shape[d]}")
    return torch.linalg.cross(self.expand(shape), other.expand(shape), dim=d)


def _cross_bwd(ctx, g):
    d = _cross_dim(ctx.self.shape, ctx.other.shape, ctx.dim)
    ga = sum_to(_op("linalg_cross")(ctx.other, g, d), ctx.self.shape) if ctx.needs_input_grad[0] else None
    gb = sum_to(_op("linalg_cross")(g, ctx.self, d), ctx.other.shape) if ctx.needs_input_grad[1] else None
    return ga, gb


register("cross(Tensor self, Tensor other, int? dim=None) -> Tensor", _cross_kernel, backward=_cross_bwd,
         save=("self", "other"), tags=LH)
register("linalg_cross(Tensor self, Tensor other, int dim=-1) -> Tensor", _cross_kernel, backward=_cross_bwd,
         save=("self", "other"), tags=LH, method=False, function=False,
         doc="torch.linalg.cross: the cross product along ``dim`` (default -1), inputs broadcast.")


# ---- atleast_nd / splits / unfold (views) ---------------------------------------------------------------
def _make_atleast(n):
    name = f"atleast_{n}d"
    fn = getattr(torch, name)
    register(f"{name}(Tensor self) -> Tensor", lambda self: _alias(fn(self), self),
             backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V, method=False, function=False)

    def wrapper(*tensors):
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
            return tuple(OPS[name].fn(t) for t in tensors)
        if len(tensors) == 1:
            return OPS[name].fn(tensors[0])
        return tuple(OPS[name].fn(t) for t in tensors)
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"View of each input with at least {n} dimensions (like ``torch.{name}``)."
    return name, wrapper


_ATLEAST = dict(_make_atleast(n) for n in (1, 2, 3))


def _split_bwd_at(dim_of):
    """Backward of a split into views: the output gradients concatenated along the split dim
    (unused outputs get zero gradients from the engine)."""
    def bwd(ctx, *grads):
        return OPS["cat"].fn(list(grads), dim_of(ctx))
    return bwd


def _tensor_split_kernel(self, indices_or_sections, dim):
    if self.dim() == 0:
        raise RuntimeError("expected at least a 1-dimensional tensor")
    if isinstance(indices_or_sections, int) and indices_or_sections <= 0:
        raise RuntimeError(f"number of sections must be larger than 0, got {indices_or_sections}")
    return list(torch.tensor_split(self, indices_or_sections, dim))


register("tensor_split(Tensor self, int[] indices_or_sections, int dim=0) -> Tensor[]", _tensor_split_kernel,
         backward=_split_bwd_at(lambda ctx: ctx.dim), save=(), tags=V, function=False, method=False)


def _int_or_list(v):
    if isinstance(v, (Tensor, torch.Tensor)):
        if v.dim() > 1 or v.dtype.is_floating_point or v.dtype == torch.bool:
            raise RuntimeError(f"tp.tensor_split: a tensor of indices must be a 0-d or 1-d integer tensor, "
                               f"got {v.dtype}{list(v.shape)}")
        v = v.tolist()
    return v if isinstance(v, int) else list(v)


def tensor_split(input, indices_or_sections, dim=0):
    """Split into ``n`` nearly equal parts (an int) or at the given indices (a list), as views."""
    return tuple(OPS["tensor_split"].fn(input, _int_or_list(indices_or_sections), dim))


def _hvd_dim(name, ndim):
    return {"hsplit": 0 if ndim == 1 else 1, "vsplit": 0, "dsplit": 2}[name]


def _make_hvd(name, min_dim):
    def kernel(self, indices_or_sections):
        if self.dim() < min_dim:
            raise RuntimeError(f"{name} requires a tensor with at least {min_dim} dimension(s), got {self.dim()}")
        if isinstance(indices_or_sections, int):
            d = _hvd_dim(name, self.dim())
            if indices_or_sections <= 0 or self.shape[d] % indices_or_sections:
                raise RuntimeError(f"dimension {d} of size {self.shape[d]} cannot be split into "
                                   f"{indices_or_sections} equal parts")
        return list(getattr(torch, name)(self, indices_or_sections))
    register(f"{name}(Tensor self, int[] indices_or_sections) -> Tensor[]", kernel,
             backward=_split_bwd_at(lambda ctx: _hvd_dim(name, len(ctx.self.shape))), save=(), tags=V,
             function=False, method=False)

    def wrapper(input, indices_or_sections):
        return tuple(OPS[name].fn(input, _int_or_list(indices_or_sections)))
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"``torch.{name}``: tensor_split along dim {_hvd_dim(name, 2)}, as views."
    return name, wrapper


_HVD = dict(_make_hvd(n, m) for n, m in (("hsplit", 1), ("vsplit", 2), ("dsplit", 3)))


def _unfold_kernel(self, dimension, size, step):
    n = self.dim()
    d = dimension % max(n, 1) if -max(n, 1) <= dimension < max(n, 1) else None
    if d is None:
        raise IndexError(f"dimension {dimension} out of range for a {n}-d tensor")
    length = self.shape[d] if n else 1
    if size < 0 or size > length:
        raise RuntimeError(f"size {size} exceeds the size {length} of dimension {d}")
    if step <= 0:
        raise RuntimeError(f"step must be positive, got {step}")
    return self.unfold(dimension, size, step)


register("unfold(Tensor self, int dimension, int size, int step) -> Tensor", _unfold_kernel,
         backward=lambda ctx, g: _op("_unfold_backward")(g, list(ctx.self.shape), ctx.dimension, ctx.size, ctx.step),
         save=(), tags=V, function=False)
register("_unfold_backward(Tensor grad, int[] input_sizes, int dim, int size, int step) -> Tensor",
         lambda grad, input_sizes, dim, size, step: torch.ops.aten.unfold_backward(grad, input_sizes, dim, size, step),
         backward=lambda ctx, g: (g.unfold(ctx.dim, ctx.size, ctx.step),), save=(), tags=S, method=False,
         function=False)


# ---- rot90 / flips / narrow_copy ------------------------------------------------------------------------
register("rot90(Tensor self, int k=1, int[] dims=[0, 1]) -> Tensor",
         backward=lambda ctx, g: g.rot90(-ctx.k, ctx.dims), save=(), tags=S)


def _flip_lr_ud(name, min_dim):
    def kernel(self):
        if self.dim() < min_dim:
            raise RuntimeError(f"{name} requires a tensor with at least {min_dim} dimension(s), got {self.dim()}")
        return getattr(torch, name)(self)
    register(f"{name}(Tensor self) -> Tensor", kernel, backward=lambda ctx, g: getattr(g, name)(), save=(),
             tags=S, decomp=lambda self: self.flip([min_dim - 1]))


_flip_lr_ud("fliplr", 2)
_flip_lr_ud("flipud", 1)
register("narrow_copy(Tensor self, int dim, int start, int length) -> Tensor", backward=_narrow_bwd, save=(),
         tags=S, decomp=lambda self, dim, start, length: self.narrow(dim, start, length).clone())


# ---- tril_indices / triu_indices -------------------------------------------------------------------------
def _tri_indices(name):
    fn = getattr(torch, name)

    def kernel(row, col, offset, dtype, device):
        if row < 0 or col < 0:
            raise RuntimeError(f"row and col must be non-negative, got row={row}, col={col}")
        return fn(row, col, offset, dtype=torch.long if dtype is None else dtype, device=device or "cpu")
    register(f"{name}(int row, int col, int offset=0, *, ScalarType? dtype=None, Device? device=None) -> Tensor",
             kernel, tags=("factory", "extern"), method=False)


_tri_indices("tril_indices")
_tri_indices("triu_indices")


# ---- trapezoid / cumulative_trapezoid / diff / vander ------------------------------------------------------
def _trapz_spacing(ctx, n):
    """Spacings (..., n-1) along the last dim (the integration dim moved last)."""
    if ctx.x is None:
        return None
    x = ctx.x
    xs = x if x.dim() == 1 else x.movedim(ctx.dim, -1)
    return xs.narrow(-1, 1, n - 1) - xs.narrow(-1, 0, n - 1)


def _trapz_grads(ctx, G):
    """Gradients of ``sum_k G_k * dx_k * (y_k + y_{k+1}) / 2`` (G: the upstream gradient of every
    trapezoid term, shape ``(..., n-1)`` with the integration dim last)."""
    y = ctx.y
    ym = y.movedim(ctx.dim, -1)
    n = ym.shape[-1]
    dx = _trapz_spacing(ctx, n)
    w = G * (ctx.dx if ctx.dx is not None else 1.0) if dx is None else G * dx
    gy = None
    if ctx.needs_input_grad[0]:
        gy = (OPS["pad"].fn(w, [1, 0]) + OPS["pad"].fn(w, [0, 1])) * 0.5
        gy = sum_to(gy, ym.shape).movedim(-1, ctx.dim)
    gx = None
    if dx is not None and ctx.needs_input_grad[1]:
        s = (ym.narrow(-1, 1, n - 1) + ym.narrow(-1, 0, n - 1)) * 0.5 * G
        gxm = OPS["pad"].fn(s, [1, 0]) - OPS["pad"].fn(s, [0, 1])
        gx = sum_to(gxm, ctx.x.shape) if ctx.x.dim() == 1 else sum_to(gxm, ctx.x.movedim(ctx.dim, -1).shape).movedim(
            -1, ctx.dim)
    return gy, gx


def _trapz_kernel(fn):
    def kernel(y, x, dx, dim):
        if x is not None and dx is not None:
            raise RuntimeError("pass either x or dx, not both")
        if x is not None:
            return fn(y, x, dim=dim)
        return fn(y, dx=1 if dx is None else dx, dim=dim)
    return kernel


def _trapezoid_bwd(ctx, g):
    ym = ctx.y.movedim(ctx.dim, -1)
    n = ym.shape[-1]
    if n == 0:   # an empty integral: zero, and nothing to differentiate
        return g.new_zeros(ctx.y.shape), (g.new_zeros(ctx.x.shape) if ctx.x is not None else None)
    return _trapz_grads(ctx, g.unsqueeze(-1).expand(list(ym.shape[:-1]) + [n - 1]))


def _cumtrapz_bwd(ctx, g):
    G = g.movedim(ctx.dim, -1).flip([-1]).cumsum(-1).flip([-1])
    return _trapz_grads(ctx, G)


register("trapezoid(Tensor y, Tensor? x=None, *, Scalar? dx=None, int dim=-1) -> Tensor",
         _trapz_kernel(torch.trapezoid), backward=_trapezoid_bwd, save=("y", "x"), tags=S, method=False)
register("cumulative_trapezoid(Tensor y, Tensor? x=None, *, Scalar? dx=None, int dim=-1) -> Tensor",
         _trapz_kernel(torch.cumulative_trapezoid), backward=_cumtrapz_bwd, save=("y", "x"), tags=S, method=False)


def _diff_kernel(self, n, dim, prepend, append):
    if self.dim() == 0:
        raise RuntimeError("diff expects a tensor with at least one dimension")
    if n < 0:
        raise RuntimeError(f"order must be non-negative, got {n}")
    return torch.diff(self, n, dim, prepend, append)


def _diff_bwd(ctx, g):
    d = ctx.dim % len(ctx.self.shape)
    for _ in range(ctx.n):   # the adjoint of one difference: gz_k = g_{k-1} - g_k
        gm = g.movedim(d, -1)
        g = (OPS["pad"].fn(gm, [1, 0]) - OPS["pad"].fn(gm, [0, 1])).movedim(-1, d)
    sizes = [ctx.prepend.shape[d] if ctx.prepend is not None else 0, ctx.self.shape[d],
             ctx.append.shape[d] if ctx.append is not None else 0]
    total = sum(sizes)
    if g.shape[d] > total:   # n larger than the length: the output was empty
        g = g.narrow(d, 0, total)
    gp, gs, ga = g.split(sizes, d)
    return gs, (gp if ctx.prepend is not None else None), (ga if ctx.append is not None else None)


register("diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor",
         _diff_kernel, backward=_diff_bwd, save=(), tags=S)


def _vander_kernel(x, N, increasing):
    if x.dim() != 1:
        raise RuntimeError(f"x must be a 1-d tensor, got shape {list(x.shape)}")
    if N is not None and N < 0:
        raise RuntimeError(f"N must be non-negative, got {N}")
    return torch.vander(x, N, increasing)


def _vander_bwd(ctx, g):
    from .factories import arange
    x = ctx.x
    n = g.shape[1]
    p = arange(n, dtype=x.dtype, device=x.device)
    if not ctx.increasing:
        p = p.flip([0])
    dp = p * x.unsqueeze(1).pow((p - 1).clamp(min=0))
    return (g * dp).sum(1)


register("vander(Tensor x, int? N=None, bool increasing=False) -> Tensor", _vander_kernel, backward=_vander_bwd,
         save=("x",), tags=S, method=False)



# ---- im2col / col2im (F.unfold / F.fold) ------------------------------------------------------------------
def _im2col_kernel(self, kernel_size, dilation, padding, stride):
    if self.dim() not in (3, 4):
        raise RuntimeError(f"expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape {list(self.shape)}")
    return torch._C._nn.im2col(self, kernel_size, dilation, padding, stride)


def _col2im_kernel(self, output_size, kernel_size, dilation, padding, stride):
    if self.dim() not in (2, 3):
        raise RuntimeError(f"expected a 2-d (C*kh*kw, L) or 3-d (N, C*kh*kw, L) input, got shape {list(self.shape)}")
    return torch._C._nn.col2im(self, output_size, kernel_size, dilation, padding, stride)


register("im2col(Tensor self, int[] kernel_size, int[] dilation, int[] padding, int[] stride) -> Tensor",
         _im2col_kernel, backward=lambda ctx, g: _op("col2im")(g, list(ctx.self.shape[-2:]), ctx.kernel_size,
                                                               ctx.dilation, ctx.padding, ctx.stride),
         save=(), tags=("nn", "extern"), method=False, function=False)
register("col2im(Tensor self, int[] output_size, int[] kernel_size, int[] dilation, int[] padding, int[] stride) "
         "-> Tensor", _col2im_kernel,
         backward=lambda ctx, g: _op("im2col")(g, ctx.kernel_size, ctx.dilation, ctx.padding, ctx.stride),
         save=(), tags=("nn", "extern"), method=False, function=False)

EXTRA_FUNCTIONS = {"meshgrid": meshgrid, "cartesian_prod": cartesian_prod, "block_diag": block_diag,
                   "tensordot": tensordot,
                   "tensor_split": tensor_split, **_ATLEAST, **_HVD}
EXTRA_METHODS = {"tensor_split": tensor_split, **_HVD}
for _f in EXTRA_FUNCTIONS.values():
    _f.__module__ = "tensorplay"
