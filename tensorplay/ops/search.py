"""Search, counting and flat-index ops: nonzero (and one-argument ``where``), argwhere, searchsorted,
bucketize, bincount, histc, histogram, repeat_interleave, take, put, index_copy, masked_scatter, scatter_reduce.

Every kernel is ATen's, so eager results equal PyTorch's bit for bit.  Guarantees:

* ops whose output *shape* depends on the data (``nonzero``, ``argwhere``, ``bincount``) are tagged
  ``dynamic_shape``; their meta function computes the shape from real data and raises
  :class:`~tensorplay.ops.registry.DataDependentShapeError` on meta tensors (the tracer records a
  data gate).  ``repeat_interleave`` is data dependent only with tensor repeats and no
  ``output_size``: its meta function says so in the same way;
* integer outputs (indices, counts, histograms) never require grad;
* the derivatives are adjoint pairs in tp ops (so double backward works): take <-> put(accumulate),
  repeat_interleave <-> index_add, index_copy <-> index_fill / index_select, masked_scatter <->
  masked_select, scatter_reduce's formulas for sum, prod (zero-safe: no division by a zero factor),
  mean, amax/amin (ties share the gradient equally, as in PyTorch);
* indices are range-checked before the kernel runs (IndexError naming the op, the index and the
  size), so a bad index never reaches a device-side assert.
"""
from __future__ import annotations

import torch

from .._tensor import Tensor
from .registry import OPS, DataDependentShapeError, register
from .view import _check_dim_index, _check_range

__all__ = []

IX = ("indexing", "extern")          # Stax runs them as library (ATen) kernels
ND = ("nondifferentiable", "extern")


def _raw(t):
    return t._data if isinstance(t, Tensor) else t


def _on_meta(*ts):
    return any(isinstance(_raw(t), torch.Tensor) and _raw(t).device.type == "meta" for t in ts)


def _dynamic(op, reason):
    raise DataDependentShapeError(f"tp.{op}: the output shape depends on the values of {reason} "
                                  f"(data-dependent shape); it has no meta function on meta tensors")


# ---- nonzero / argwhere ---------------------------------------------------------------------------
def _nonzero_meta_for(name):
    def meta(self):
        if _on_meta(self):
            _dynamic(name, "the input")
        d = _raw(self)
        return torch.empty((int(d.count_nonzero()), d.dim()), dtype=torch.int64, device="meta")
    return meta


def _nonzero_kernel_for(name, fn):
    meta = _nonzero_meta_for(name)

    def kernel(self):
        return meta(self) if self.device.type == "meta" else fn(self)
    return kernel


_DYN = IX + ND + ("dynamic_shape",)
register("nonzero(Tensor self) -> Tensor", _nonzero_kernel_for("nonzero", torch.nonzero), tags=_DYN,
         meta=_nonzero_meta_for("nonzero"), function=False, method=False)
register("argwhere(Tensor self) -> Tensor", _nonzero_kernel_for("argwhere", torch.argwhere), tags=_DYN,
         meta=_nonzero_meta_for("argwhere"))


def nonzero(input, *, as_tuple=False):
    """Indices of the non-zero elements: an ``[n, ndim]`` int64 tensor, or with ``as_tuple`` one
    1-d index tensor per dimension (a 0-d input counts as 1-d), like ``torch.nonzero``."""
    if not as_tuple:
        return OPS["nonzero"].fn(input)
    x = input.reshape(1) if input.dim() == 0 else input
    return tuple(OPS["nonzero"].fn(x).unbind(1))


def where(condition, input=None, other=None):
    """``where(condition, input, other)``: ``input`` where ``condition`` else ``other`` (the table op
    ``where``); ``where(condition)`` alone is ``nonzero(condition, as_tuple=True)``, as in PyTorch."""
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("tp.where: pass both input and other, or neither")
    return OPS["where"].fn(condition, input, other)


# ---- searchsorted / bucketize -----------------------------------------------------------------------
def _check_side(op, side):
    if side is not None and side not in ("left", "right"):
        raise ValueError(f"tp.{op}: side must be 'left' or 'right', got {side!r}")


def _searchsorted_kernel(sorted_sequence, self, out_int32, right, side, sorter):
    _check_side("searchsorted", side)
    if sorter is not None:
        _check_range(sorter, sorted_sequence.shape[-1] if sorted_sequence.dim() else 1, -1, False)
    return torch.searchsorted(sorted_sequence, self, out_int32=out_int32, right=right, side=side, sorter=sorter)


register("searchsorted(Tensor sorted_sequence, Tensor self, *, bool out_int32=False, bool right=False, "
         "str? side=None, Tensor? sorter=None) -> Tensor", _searchsorted_kernel, tags=ND, method=False)
register("bucketize(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor",
         tags=ND, method=False)


# ---- bincount / histc / histogram ---------------------------------------------------------------------
def _bincount_check(self, weights):
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise RuntimeError(f"bincount takes a 1-d tensor of non-negative integers, got "
                           f"{str(self.dtype).replace('torch.', '')}{list(self.shape)}")
    if weights is not None and tuple(weights.shape) != tuple(self.shape):
        raise RuntimeError(f"weights must have the input's shape {list(self.shape)}, got {list(weights.shape)}")
    if self.device.type != "meta" and self.numel() and int(self.min()) < 0:
        raise RuntimeError(f"bincount takes non-negative integers, got the value {int(self.min())}")


def _bincount_dtype(weights):
    if weights is None:
        return torch.int64
    return weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64


def _bincount_meta(self, weights, minlength):
    if _on_meta(self):
        _dynamic("bincount", "the input")
    d = _raw(self)
    n = max(int(d.max()) + 1 if d.numel() else 0, minlength)
    return torch.empty(n, dtype=_bincount_dtype(_raw(weights)), device="meta")


def _bincount_kernel(self, weights, minlength):
    _bincount_check(self, weights)
    if self.device.type == "meta":
        return _bincount_meta(self, weights, minlength)
    return torch.bincount(self, weights, minlength)


register("bincount(Tensor self, Tensor? weights=None, int minlength=0) -> Tensor", _bincount_kernel,
         tags=_DYN, meta=_bincount_meta)


def _histc_kernel(self, bins, min, max):
    if bins <= 0:
        raise RuntimeError(f"bins must be positive, got {bins}")
    if min > max:
        raise RuntimeError(f"max must be larger than min, got min={min}, max={max}")
    return torch.histc(self, bins, min, max)


register("histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor", _histc_kernel, tags=ND,
         meta=lambda self, bins, min, max: torch.empty(bins, dtype=self.dtype, device="meta"))


def _histogram_kernel(self, bins, range, weight, density):
    if isinstance(bins, torch.Tensor):
        return torch.histogram(self, bins, weight=weight, density=density)
    return torch.histogram(self, bins, range=range, weight=weight, density=density)


def _histogram_meta(self, bins, range, weight, density):
    n = bins.shape[0] - 1 if isinstance(_raw(bins), torch.Tensor) else bins
    return (torch.empty(n, dtype=self.dtype, device="meta"), torch.empty(n + 1, dtype=self.dtype, device="meta"))


register("histogram(Tensor self, Tensor bins=100, *, float[]? range=None, Tensor? weight=None, bool density=False) "
         "-> (Tensor hist, Tensor bin_edges)", _histogram_kernel, tags=ND, meta=_histogram_meta)


# ---- repeat_interleave ------------------------------------------------------------------------------
def _ri_kernel(self, repeats, dim, output_size):
    if isinstance(repeats, torch.Tensor) and repeats.device.type != "meta" and repeats.numel():
        if repeats.dim() > 1:
            raise RuntimeError(f"repeats must be 0-d or 1-d, got shape {list(repeats.shape)}")
        if int(repeats.min()) < 0:
            raise RuntimeError(f"repeats must be non-negative, got {int(repeats.min())}")
    elif isinstance(repeats, int) and repeats < 0:
        raise RuntimeError(f"repeats must be non-negative, got {repeats}")
    if self.device.type == "meta":
        return _ri_meta(self, repeats, dim, output_size)
    return torch.repeat_interleave(self, repeats, dim, output_size=output_size)


def _ri_meta(self, repeats, dim, output_size):
    x, r = _raw(self), _raw(repeats)
    shape = [x.numel()] if dim is None else (list(x.shape) or [1])
    d = 0 if dim is None else dim % max(x.dim(), 1)
    if output_size is not None:
        n = output_size
    elif not isinstance(r, torch.Tensor):
        n = shape[d] * r
    elif r.device.type == "meta":
        _dynamic("repeat_interleave", "a repeats tensor (pass output_size)")
    else:
        n = shape[d] * int(r) if r.numel() == 1 else int(r.sum())
    shape[d] = n
    return torch.empty(shape, dtype=x.dtype, device="meta")


def _ri_bwd(ctx, g):
    shape = ctx.self.shape
    n = ctx.self.numel() if ctx.dim is None else (shape[ctx.dim % len(shape)] if len(shape) else 1)
    from .factories import arange
    idx = OPS["repeat_interleave"].fn(arange(n, device=g.device), ctx.repeats, 0)
    d = 0 if ctx.dim is None else ctx.dim % max(len(shape), 1)
    base = [ctx.self.numel()] if ctx.dim is None else (list(shape) or [1])
    base[d] = n
    return g.new_zeros(base).index_add(d, idx, g).reshape(shape), None


register("repeat_interleave(Tensor self, Tensor repeats, int? dim=None, *, int? output_size=None) -> Tensor",
         _ri_kernel, backward=_ri_bwd, save=("repeats",), tags=IX, meta=_ri_meta, function=False)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Repeat each element (or each slice along ``dim``) ``repeats`` times (an int, or a tensor of
    per-element counts); ``repeat_interleave(counts)`` alone gives ``[0]*counts[0] + [1]*counts[1]...``."""
    if repeats is None:
        from .factories import arange
        return OPS["repeat_interleave"].fn(arange(input.shape[0], device=input.device), input, 0,
                                               output_size=output_size)
    return OPS["repeat_interleave"].fn(input, repeats, dim, output_size=output_size)


# ---- take / put ------------------------------------------------------------------------------------------
def _take_kernel(self, index):
    _check_range(index, self.numel(), 0, True)
    if self.numel() == 0 and index.numel():
        raise IndexError("cannot take from an empty tensor")
    return torch.take(self, index)


register("take(Tensor self, Tensor index) -> Tensor", _take_kernel,
         backward=lambda ctx, g: (g.new_zeros(ctx.self.shape).put(ctx.index, g, True), None),
         save=("index",), tags=IX)


def _put_check(self, index, source):
    _check_range(index, self.numel(), 0, True)
    if index.numel() != source.numel():
        raise RuntimeError(f"index and source must have the same number of elements, got {index.numel()} "
                           f"and {source.numel()}")


def _put_kernel(self, index, source, accumulate):
    _put_check(self, index, source)
    return torch.put(self, index, source, accumulate)


def _put__kernel(self, index, source, accumulate):
    _put_check(self, index, source)
    return self.put_(index, source, accumulate)


def _put_bwd(ctx, g):
    gs = None
    if ctx.needs_input_grad[0]:
        gs = g if ctx.accumulate else g.put(ctx.index, g.new_zeros(ctx.index.shape), False)
    gsrc = g.take(ctx.index).reshape(ctx.source.shape) if ctx.needs_input_grad[2] else None
    return gs, None, gsrc


register("put(Tensor self, Tensor index, Tensor source, bool accumulate=False) -> Tensor", _put_kernel,
         backward=_put_bwd, save=("index",), tags=IX, inplace=True, inplace_eager=_put__kernel)


# ---- index_copy / masked_scatter ------------------------------------------------------------------------
def _index_copy_kernel(self, dim, index, source):
    _check_dim_index(self, dim, index)
    return torch.index_copy(self, dim, index, source)


def _index_copy__kernel(self, dim, index, source):
    _check_dim_index(self, dim, index)
    return self.index_copy_(dim, index, source)


def _index_copy_bwd(ctx, g):
    gs = g.index_fill(ctx.dim, ctx.index, 0) if ctx.needs_input_grad[0] else None
    gsrc = None
    if ctx.needs_input_grad[2]:
        gsrc = (g.reshape(-1) if g.dim() == 0 else g.index_select(ctx.dim, ctx.index)).reshape(ctx.source.shape)
    return gs, None, gsrc


register("index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor", _index_copy_kernel,
         backward=_index_copy_bwd, save=("index",), tags=IX, inplace=True, inplace_eager=_index_copy__kernel)


def _masked_scatter_check(self, mask, source):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"mask must be a bool tensor, got {str(mask.dtype).replace('torch.', '')}")
    if mask.device.type != "meta" and self.device.type != "meta":
        shape = torch.broadcast_shapes(self.shape, mask.shape)
        n = int(mask.expand(shape).count_nonzero())
        if n > source.numel():
            raise RuntimeError(f"the mask selects {n} elements but source has only {source.numel()}")


def _masked_scatter_kernel(self, mask, source):
    _masked_scatter_check(self, mask, source)
    return torch.masked_scatter(self, mask, source)


def _masked_scatter__kernel(self, mask, source):
    _masked_scatter_check(self, mask, source)
    return self.masked_scatter_(mask, source)


def _masked_scatter_bwd(ctx, g):
    from ._helpers import sum_to
    gs = sum_to(g.masked_fill(ctx.mask, 0), ctx.self.shape) if ctx.needs_input_grad[0] else None
    gsrc = None
    if ctx.needs_input_grad[2]:
        sel = g.masked_select(ctx.mask)
        n = ctx.source.numel()
        gsrc = OPS["pad"].fn(sel, [0, n - sel.shape[0]]).reshape(ctx.source.shape)
    return gs, None, gsrc


register("masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor", _masked_scatter_kernel,
         backward=_masked_scatter_bwd, save=("mask",), tags=IX, inplace=True, inplace_eager=_masked_scatter__kernel)


# ---- scatter_reduce ---------------------------------------------------------------------------------------
_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _scatter_reduce_check(self, dim, index, reduce):
    if reduce not in _REDUCES:
        raise ValueError(f"reduce must be one of {', '.join(_REDUCES)}, got {reduce!r}")
    _check_dim_index(self, dim, index)


def _scatter_reduce_kernel(self, dim, index, src, reduce, include_self):
    _scatter_reduce_check(self, dim, index, reduce)
    return torch.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)


def _scatter_reduce__kernel(self, dim, index, src, reduce, include_self):
    _scatter_reduce_check(self, dim, index, reduce)
    return self.scatter_reduce_(dim, index, src, reduce, include_self=include_self)


def _scatter_reduce_bwd(ctx, g):
    """Gradients of ``out = self ⊕ (src scattered by index)`` for each reduction."""
    x, dim, index, src, red, inc = ctx.self, ctx.dim, ctx.index, ctx.src, ctx.reduce, ctx.include_self
    out = ctx.result
    gx = gsrc = None
    if red == "sum":
        gx = g if inc else g.scatter(dim, index, 0)
        gsrc = g.gather(dim, index)
    elif red == "mean":
        n = (x.new_ones(x.shape) if inc else x.new_zeros(x.shape)).scatter_add(dim, index, src.new_ones(index.shape))
        gn = g / n.clamp(min=1)
        gx = gn if inc else g.scatter(dim, index, 0)
        gsrc = gn.gather(dim, index)
    elif red in ("amax", "amin"):
        xs = (x == out) if inc else x.new_zeros(x.shape).bool()
        hit = src == out.gather(dim, index)
        cnt = xs.to(g.dtype).scatter_add(dim, index, hit.to(g.dtype))
        gn = g / cnt.clamp(min=1)
        gx = gn * xs if inc else g.scatter(dim, index, 0)
        gsrc = gn.gather(dim, index) * hit
    else:  # prod, zero-safe: P = product of the non-zero factors, Z = number of zero factors
        xz = (x == 0) if inc else x.new_zeros(x.shape).bool()
        sz = src == 0
        z = xz.to(g.dtype).scatter_add(dim, index, sz.to(g.dtype))
        x1 = x.masked_fill(xz, 1) if inc else x.new_ones(x.shape)
        p = x1.scatter_reduce(dim, index, src.masked_fill(sz, 1), "prod", include_self=True)

        def factor_grad(v, vz, zs, ps):   # d(prod)/d(factor v): the other factors' product
            return OPS["where"].fn(vz, ps * (zs == 1), ps / v.masked_fill(vz, 1) * (zs == 0))
        gx = g * factor_grad(x, xz, z, p) if inc else g.scatter(dim, index, 0)
        gsrc = g.gather(dim, index) * factor_grad(src, sz, z.gather(dim, index), p.gather(dim, index))
    return (gx if ctx.needs_input_grad[0] else None), None, (gsrc if ctx.needs_input_grad[2] else None)


register("scatter_reduce(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) "
         "-> Tensor", _scatter_reduce_kernel, backward=_scatter_reduce_bwd, save=("self", "index", "src", "result"),
         tags=IX, inplace=True, inplace_eager=_scatter_reduce__kernel)


EXTRA_FUNCTIONS = {"nonzero": nonzero, "repeat_interleave": repeat_interleave, "where": where}
EXTRA_METHODS = {"nonzero": lambda self, *, as_tuple=False: nonzero(self, as_tuple=as_tuple)}
for _f in EXTRA_FUNCTIONS.values():
    _f.__module__ = "tensorplay"
