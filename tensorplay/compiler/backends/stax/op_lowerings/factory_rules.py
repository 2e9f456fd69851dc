"""Factory lowering rules (chapter §6.2): zeros/ones/empty/full/arange/linspace/eye as Pointwise
values of the index, computed with ATen's formulas (arange and linspace: the same accumulation types
and the same two halves), so that a consumer fuses them and no tensor is written."""
from __future__ import annotations

import torch

from ..ir import Pointwise, TensorBox
from ..ops_handler import ops
from .pointwise_rules import _device
from .registry import _node, _out_val, register_lowering


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
