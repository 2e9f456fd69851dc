"""Forward-mode AD with dual numbers (chapter §5.7).

Inside ``with dual_level():`` a tensor made by ``make_dual(primal, tangent)`` carries a tangent;
every op that sees a tangent on an input propagates ``J·v`` to its outputs.  The tangent rule of an
op is its ``jvp`` entry in the op table when it has one; otherwise it is derived from the reverse
formula by the *double-vjp* identity ``J v = d/du <Jᵀu, v>`` — the backward formulas are written in
tp ops and are linear in ``u``, so this is exact (it costs about three backward evaluations; ops
on hot forward-mode paths get an explicit ``jvp``).  Random ops must give an explicit ``jvp`` (a
recomputation would draw new random numbers).

Guarantee: tangents are exact to rounding (tested against finite differences); outputs of integer
dtype carry no tangent; leaving the level clears every tangent made in it.
"""
from __future__ import annotations

import collections

import torch

from .._tensor import Tensor, _wrap
from . import grad_mode

__all__ = ["dual_level", "make_dual", "unpack_dual", "UnpackedDualTensor"]

UnpackedDualTensor = collections.namedtuple("UnpackedDualTensor", ["primal", "tangent"])
_fw = grad_mode._fw_state
_level_tensors: list[list] = []


class dual_level:
    def __enter__(self):
        _fw.level += 1
        _level_tensors.append([])
        return _fw.level

    def __exit__(self, *exc):
        for t in _level_tensors.pop():
            t._fw_grad = None
        _fw.level -= 1
        return False


def _alias(t: Tensor) -> Tensor:
    a = _wrap(t._data)
    if t.requires_grad:
        a.requires_grad = True
        a.grad_fn, a._output_nr, a._accumulate = t.grad_fn, t._output_nr, t._accumulate
    return a


def make_dual(tensor: Tensor, tangent: Tensor, *, level=None) -> Tensor:
    if not _fw.level:
        raise RuntimeError("make_dual: must be called inside `with tp.autograd.forward_ad.dual_level():`")
    if tangent.shape != tensor.shape:
        raise RuntimeError(f"make_dual: tangent shape {list(tangent.shape)} must match primal shape {list(tensor.shape)}")
    if not tensor.is_floating_point():
        raise RuntimeError(f"make_dual: expected a floating point primal, got {tensor.dtype}")
    d = _alias(tensor)
    _set_tangent(d, tangent if tangent.dtype == tensor.dtype else tangent.to(tensor.dtype))
    return d


def unpack_dual(tensor: Tensor, *, level=None) -> UnpackedDualTensor:
    return UnpackedDualTensor(_alias(tensor), tensor._fw_grad)


def _set_tangent(t, tangent):
    t._fw_grad = tangent
    if _level_tensors:
        _level_tensors[-1].append(t)


def _slots(op, args):
    out = []
    for i in op._tensorish:
        a = args[i]
        if i in op.schema.list_pos:
            out.extend(a or ())
        else:
            out.append(a)
    return out


def propagate(op, args, outs, old_self=None):
    slots = _slots(op, args)
    tangents = [t._fw_grad if isinstance(t, Tensor) else None for t in slots]
    if all(t is None for t in tangents):
        if op.is_inplace:
            self_ = args[op.schema.mutated_pos]
            self_._fw_grad = None
            if self_._base is not None and self_._base._fw_grad is not None:
                _write_base_tangent(self_, None)
        return
    level = _fw.level
    _fw.level = 0
    try:
        if op.jvp is not None:
            touts = op.jvp(args, outs, tangents)
        else:
            if "random" in op.tags:
                raise RuntimeError(f"forward AD: tp.{op.name} is random and has no jvp formula")
            touts = _double_vjp(op, args, tangents, old_self)
    finally:
        _fw.level = level
    if not isinstance(touts, (tuple, list)):
        touts = (touts,)
    for o, t in zip(outs, touts):
        if isinstance(o, Tensor) and t is not None and (o._data.is_floating_point() or o._data.is_complex()):
            _set_tangent(o, t.detach())
    if op.is_inplace:
        self_ = args[op.schema.mutated_pos]
        if self_._base is not None:
            _write_base_tangent(self_, self_._fw_grad)


def _write_base_tangent(view, tangent):
    """An in-place op on a view changed part of its base: the base's tangent gets the view's new
    tangent (zeros if None) in that region (the forward-mode twin of CopySlices)."""
    from .graph import relayout, view_replay
    base = view._base
    level = _fw.level
    _fw.level = 0
    try:
        bd = base._data   # the view chain replays on a tangent laid out like the base
        src = base._fw_grad if base._fw_grad is not None else _wrap(torch.zeros(bd.shape, dtype=bd.dtype,
                                                                                device=bd.device))
        bt = relayout(src, bd.shape, bd.stride(), bd.storage_offset())
        region = view_replay(view)(bt)
        if tangent is None:
            region.zero_()
        else:
            region.copy_(tangent)
    finally:
        _fw.level = level
    _set_tangent(base, bt)


def _double_vjp(op, args, tangents, old_self):
    from .engine import grad
    fn_op = op
    args = list(args)
    if op.is_inplace:
        from ..ops.registry import OPS
        fn_op = OPS[op.inplace_of]
        args[op.schema.mutated_pos] = old_self
    with grad_mode.enable_grad():
        prims, p_tangents = [], []
        k = 0
        for i in op._tensorish:
            a = args[i]
            if i in op.schema.list_pos:
                new = []
                for t in (a or ()):
                    new.append(_leaf_if_tangent(t, tangents[k], prims, p_tangents))
                    k += 1
                args[i] = new
            else:
                args[i] = _leaf_if_tangent(a, tangents[k], prims, p_tangents)
                k += 1
        y = fn_op(*args)
        ys = list(y) if isinstance(y, (tuple, list)) else [y]
        diff = [(j, o) for j, o in enumerate(ys) if isinstance(o, Tensor) and o.requires_grad]
        if not diff:
            return [None] * len(ys)
        us = [_wrap(torch.zeros_like(o._data)).requires_grad_() for _, o in diff]
        gs = grad([o for _, o in diff], prims, us, create_graph=True, allow_unused=True)
        dot = None
        for g, t in zip(gs, p_tangents):
            if g is not None:
                term = (g * t).sum()
                dot = term if dot is None else dot + term
        res = [None] * len(ys)
        if dot is None or not dot.requires_grad:
            for j, o in diff:
                res[j] = _wrap(torch.zeros_like(o._data))
            return res
        jv = grad(dot, us, allow_unused=True, materialize_grads=True)
        for (j, _), t in zip(diff, jv):
            res[j] = t
        return res


def _leaf_if_tangent(t, tangent, prims, p_tangents):
    if not isinstance(t, Tensor):
        return t
    if tangent is None:
        return t.detach()
    p = _wrap(t._data).requires_grad_()
    prims.append(p)
    p_tangents.append(tangent)
    return p
