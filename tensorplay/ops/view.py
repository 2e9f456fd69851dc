"""Views, shape ops and indexing (chapter §1.1, §6.4: views are affine index maps).

View ops return tensors sharing storage (and version counter) with their input; the dispatcher
records ``_base`` and a replay function so that autograd can handle in-place ops on views
(``CopySlices``).  Indexing: ``x[...]`` with only ints, slices, None and Ellipsis is the view op
``getitem``; anything with tensors, lists or bool masks is the copying op ``index``.
``x[...] = v`` is the in-place op ``setitem_``.
"""
from __future__ import annotations

import torch

from .._tensor import Tensor
from ._helpers import sum_to
from .registry import OPS, register

__all__ = []

V = ("view",)


def _inv_perm(dims):
    n = len(dims)
    inv = [0] * n
    for i, d in enumerate(dims):
        inv[d % n] = i
    return inv


register("view(Tensor self, int[] size) -> Tensor", lambda self, size: self.view(size),
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V, varargs="size", function=False)
register("reshape(Tensor self, int[] shape) -> Tensor", lambda self, shape: self.reshape(shape),
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V, varargs="shape")
register("permute(Tensor self, int[] dims) -> Tensor", lambda self, dims: self.permute(dims),
         backward=lambda ctx, g: g.permute(_inv_perm(ctx.dims)), save=(), tags=V, varargs="dims")
register("transpose(Tensor self, int dim0, int dim1) -> Tensor",
         backward=lambda ctx, g: g.transpose(ctx.dim0, ctx.dim1), save=(), tags=V)
register("expand(Tensor self, int[] size) -> Tensor", lambda self, size: self.expand(size),
         backward=lambda ctx, g: sum_to(g, ctx.self.shape), save=(), tags=V, varargs="size", function=False)
register("unsqueeze(Tensor self, int dim) -> Tensor", backward=lambda ctx, g: g.squeeze(ctx.dim), save=(), tags=V)


def _squeeze_kernel(self, dim):
    return self.squeeze() if dim is None else self.squeeze(dim)


register("squeeze(Tensor self, int[]? dim=None) -> Tensor", _squeeze_kernel,
         backward=lambda ctx, g: g.reshape(ctx.self.shape), save=(), tags=V)
register("t(Tensor self) -> Tensor", backward=lambda ctx, g: g.t(), save=(), tags=V)
register("contiguous(Tensor self) -> Tensor", lambda self: self.contiguous(),
         backward=lambda ctx, g: g, save=(), tags=("shape",), function=False)
register("clone(Tensor self) -> Tensor", lambda self: self.clone(),
         backward=lambda ctx, g: g, save=(), tags=("pointwise",))
register("_to_copy(Tensor self, *, ScalarType? dtype=None, Device? device=None, bool non_blocking=False) -> Tensor",
         lambda self, dtype, device, non_blocking: self.to(dtype=dtype, device=device, non_blocking=non_blocking, copy=True),
         backward=lambda ctx, g: g.to(dtype=ctx.self.dtype, device=ctx.self.device), save=(), tags=("pointwise",),
         method=False)


# ---- indexing ----------------------------------------------------------------------------------
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
    return self[indices]


register("getitem(Tensor self, Index indices) -> Tensor", _getitem_kernel, backward=_getitem_bwd, save=(),
         tags=("view", "indexing"), method=False, function=False)


def _getitem_backward_kernel(grad, size, indices):
    z = grad.new_zeros(size)
    z[indices] = grad
    return z


register("_getitem_backward(Tensor grad, int[] size, Index indices) -> Tensor", _getitem_backward_kernel,
         backward=lambda ctx, g: (g[ctx.indices],), save=(), tags=("indexing",), method=False, function=False)


def _setitem_kernel(self, indices, value):
    self[indices] = value
    return self


def _setitem_bwd(ctx, g):
    gs = None
    if ctx.needs_input_grad[0]:
        gs = g.clone()
        gs[ctx.indices] = 0
    gv = None
    if ctx.needs_input_grad[1]:
        gv = sum_to(g[ctx.indices], ctx.value.shape)
    return gs, gv


register("setitem_(Tensor(a!) self, Index indices, Tensor value) -> Tensor(a!)", _setitem_kernel,
         backward=_setitem_bwd, save=(), tags=("inplace", "indexing"), method=False, function=False)


def _tensor_getitem(self, indices):
    if _is_basic(indices):
        return OPS["getitem"].fn(self, indices)
    return OPS["index"].fn(self, indices)


def _tensor_setitem(self, indices, value):
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value, dtype=self.dtype)
        from .._tensor import _wrap
        value = _wrap(value)
    OPS["setitem_"].fn(self, indices, value)


def _mT(self):
    return OPS["transpose"].fn(self, -2, -1)


def _T(self):
    return OPS["permute"].fn(self, list(range(self.dim() - 1, -1, -1)))


EXTRA_METHODS = {"__getitem__": _tensor_getitem, "__setitem__": _tensor_setitem,
                 "mT": property(_mT), "T": property(_T)}
