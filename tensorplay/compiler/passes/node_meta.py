"""Meta values of graph nodes (chapter §3.1, §4): a node's ``meta["val"]`` from its op's meta kernel.

Every pass that creates a node gives it a meta value (shape, dtype, strides, no data) by running the
op's meta function on its inputs' metas, so that later passes and the backend see the same facts
capture recorded.  Meta values are fresh allocations (no ``_base``): whether a result aliases its
input is the alias analysis's question (functionalize.py), not the meta value's.
"""
from __future__ import annotations

import torch

from ...ops.registry import _to_meta
from ..graph.node import Node, map_arg

__all__ = ["meta_of", "fresh_meta", "set_meta"]


def meta_of(x):
    """The meta value of a node (``meta["val"]``) or of a constant argument (returned as is)."""
    if isinstance(x, Node):
        return x.meta.get("val")
    return x


def fresh_meta(t):
    """A meta tensor with ``t``'s shape/dtype/strides and no ``_base`` (a fresh allocation)."""
    return _to_meta(t)


def _meta_args(args):
    def conv(n):
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise _NoMeta(n.name)
        return fresh_meta(v)
    return map_arg(args, conv)


class _NoMeta(Exception):
    pass


def set_meta(node: Node, op=None):
    """Fill ``node.meta["val"]`` by the op's meta function on its inputs' metas (best effort)."""
    op = op or node.opdef
    if op is None:
        return
    try:
        from ..capture.symbolic import _on_meta, map_leaves
        args = _meta_args(node.args)
        modes = []      # the fake mode of a symbolic graph's inputs (dynamic=True), if any
        map_leaves(args, lambda v: modes.append(v.fake_mode) if getattr(v, "fake_mode", None) is not None else v)
        if not modes:
            out = op.run_meta(*args)
        else:   # the op on its inputs' fakes, in their ShapeEnv
            from torch._dispatch.python import enable_python_dispatcher
            with modes[0], enable_python_dispatcher():
                out = op.run_meta(*_on_meta(args))
    except Exception:
        return
    if isinstance(out, torch.Tensor):
        node.meta["val"] = fresh_meta(out)
    elif isinstance(out, (list, tuple)):
        node.meta["val"] = tuple(fresh_meta(o) for o in out)
