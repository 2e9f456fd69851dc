"""Functional twins used by the compiler's functionalisation pass (chapter §4.4).

``_scatter_view(Tensor base, Tensor src, str view, Index view_args) -> Tensor``
    A fresh copy of ``base`` whose region ``OPS[view](base, *view_args)`` is replaced by ``src``
    (``src`` broadcasts to the region's shape and is cast to ``base``'s dtype, as in
    ``region.copy_(src)``).  It is the generic **scatter inverse** of a view: for every view op
    ``v(b) = OPS[view](b, *view_args)`` the two conditions of Prop. 4.4 hold,

    * ``v(_scatter_view(b, s, view, args)) == s``   (what was written is read back), and
    * ``_scatter_view(b, v(b), view, args) == b``    (writing back what was read changes nothing),

    so ``v = view(b); v.op_(...)`` can be rewritten as the pure ``v1 = op(v, ...);
    b1 = _scatter_view(b, v1, view, args)``.  ``view`` names any aliasing view op of the table
    (``getitem``, ``select``, ``narrow``, ``t``, ``transpose``, ``permute``, ``view``, ``reshape``,
    ``unsqueeze``, ``squeeze``, ``diagonal``, ...).  Two region kinds are written with Python's
    assignment semantics instead: ``"getitem"`` (basic indexing, ``out[idx] = src``; the index
    ``(Ellipsis,)`` replaces the whole tensor, the functional form of ``copy_``/``fill_``/``zero_``)
    and ``"index"`` (advanced indexing with tensors / masks / lists, the functional ``setitem_``).
    ``src`` may be a Python number (``fill_``/``zero_``).

Guarantees: the output never aliases ``base`` or ``src``; for a view op the kernel checks that the
region really aliases the copy (a view op that would have to copy raises ``RuntimeError`` naming
the op — never a silently lost write).  Derivative (in tp ops): ``d base = _scatter_view(g, 0,
view, args)`` (the gradient with the overwritten region zeroed), ``d src = region(g)`` summed to
``src``'s shape (the adjoint of broadcasting) and cast to ``src``'s dtype.
"""
from __future__ import annotations

import torch

from ._helpers import sum_to
from .registry import OPS, register

__all__: list = []

_SETITEM_VIEWS = ("getitem", "index")


def _scatter_view_kernel(base, src, view, view_args):
    if view in _SETITEM_VIEWS:
        (idx,) = view_args
        out = base.clone()
        out[idx] = src
        return out
    op = OPS.get(view)
    if op is None or "view" not in op.tags:
        raise ValueError(f"_scatter_view: {view!r} is not a view op of the table")
    out = base.clone(memory_format=torch.contiguous_format)
    region = op.eager(out, *view_args)
    if region is not out and region._base is not out:
        raise RuntimeError(f"_scatter_view: view op {view}{tuple(view_args)!r} copies instead of aliasing "
                           f"a {list(base.shape)} tensor; cannot write the region back")
    region.copy_(src)
    return out


def _region(g, view, view_args):
    if view in _SETITEM_VIEWS:
        return OPS[view].fn(g, view_args[0])
    return OPS[view].fn(g, *view_args)


def _scatter_view_bwd(ctx, g):
    need = ctx.needs_input_grad
    gb = gs = None
    if need[0]:
        gb = OPS["_scatter_view"].fn(g, 0, ctx.view, ctx.view_args)
    if len(need) > 1 and need[1]:
        r = _region(g, ctx.view, ctx.view_args)
        shape = tuple(ctx.src.shape)
        if r.dim() < len(shape):
            r = r.reshape([1] * (len(shape) - r.dim()) + list(r.shape))
        gs = sum_to(r, shape)
        if gs.dtype != ctx.src.dtype:
            gs = OPS["_to_copy"].fn(gs, dtype=ctx.src.dtype)
    return gb, gs


register("_scatter_view(Tensor base, Tensor src, str view, Index view_args) -> Tensor", _scatter_view_kernel,
         backward=_scatter_view_bwd, save=(), tags=("indexing",), method=False, function=False,
         doc="A copy of base whose region OPS[view](base, *view_args) is replaced by src (the scatter inverse "
             "of a view, §4.4).")
