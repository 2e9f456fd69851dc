"""Trace and splice (chapter §4.1, §4.3): replace a node by the graph of a function traced on its metas.

``trace_function(fn, args)`` captures ``fn`` symbolically (``execute=False``) on the meta values of
the graph nodes among its arguments; ``splice`` copies the captured nodes into the graph before a
node, binding the capture's placeholders to those nodes and copying its constants into the
GraphModule under fresh names (:func:`new_attr`); ``replace_with_trace`` does both and redirects the
node's uses to the spliced results (for multi-output nodes, each ``getitem`` projection to its
result).  Canonicalisation splices Python-level dispatchers (``x.max(dim=0)``), decomposition splices
``OpDef.decomp``.  A node without a tensor meta value cannot be traced: :class:`MissingMeta`.
"""
from __future__ import annotations

import operator

import torch

from ..._tensor import _wrap
from ..capture.pytree import tree_flatten, tree_unflatten
from ..capture.tracer import TENSOR_LEAF
from ..graph.node import Node, map_arg
from .node_meta import fresh_meta

__all__ = ["MissingMeta", "new_attr", "meta_tensor", "trace_function", "splice", "replace_with_trace"]


class MissingMeta(RuntimeError):
    pass


def new_attr(gm, base: str, value) -> str:
    """Store ``value`` as a new, uniquely named attribute of ``gm`` (never overwrites)."""
    base = base or "const"
    name, i = base, 0
    while name in gm._attrs or hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm._attrs[name] = value
    setattr(gm, name, value)
    return name


def meta_tensor(node: Node):
    """A tp tensor on the meta device standing for ``node``'s value (its meta's shape, strides, dtype)."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        raise MissingMeta(f"node {node.name} has no tensor meta value")
    return _wrap(fresh_meta(v))


def _leaf_value(leaf):
    if isinstance(leaf, Node):
        return meta_tensor(leaf)
    hidden = []
    map_arg(leaf, hidden.append)
    if hidden:
        raise MissingMeta(f"graph nodes nested inside {type(leaf).__name__} cannot be traced")
    return leaf


def trace_function(fn, args, kwargs=None, name="sub"):
    """Capture ``fn(*args, **kwargs)`` symbolically, where the arguments may hold graph nodes (their
    meta values stand in for the tensors).  Returns ``(capture, input nodes in placeholder order)``."""
    from ..capture.tracer import TENSOR_LEAF, capture
    leaves, spec = tree_flatten((tuple(args), dict(kwargs or {})))
    vals = [_leaf_value(x) for x in leaves]
    inputs = [x for x in leaves if isinstance(x, Node)]
    targs, tkw = tree_unflatten(vals, spec)
    cap = capture(fn, targs, tkw, execute=False, name=name)
    if cap.n_inputs != len(inputs) or cap.free:
        raise RuntimeError(f"trace of {name}: placeholders do not match the inputs")
    return cap, inputs


def splice(gm, before: Node, cap, inputs):
    """Copy the captured graph into ``gm.graph`` before ``before``; returns the output leaves (nodes
    for tensors, the Python values otherwise) in flattening order."""
    g = gm.graph
    sub = cap.gm.graph
    env: dict = {}
    it = iter(inputs)
    outs = None
    with g.inserting_before(before):
        for n in sub.nodes:
            if n.op == "placeholder":
                env[n] = next(it)
                continue
            if n.op == "output":
                outs = list(n.args[0])
                continue
            if n.op == "get_attr":
                attr = new_attr(gm, n.target, getattr(cap.gm, n.target))
                new = g.get_attr(attr)
            else:
                new = g.create_node(n.op, n.target, map_arg(n.args, env.__getitem__),
                                    map_arg(n.kwargs, env.__getitem__))
            new.meta = dict(n.meta)
            env[n] = new
    it_nodes = iter(outs)
    leaves = [next(it_nodes) if c is TENSOR_LEAF else c for c in cap.out_consts]
    return [env[x] if isinstance(x, Node) else x for x in leaves]


def replace_with_trace(gm, node: Node, fn, args, kwargs=None, *, check_meta=True, prepare=None):
    """Replace ``node`` by the traced ``fn(*args, **kwargs)``; returns the spliced result leaves.
    ``prepare(traced_gm, node)`` runs on the traced graph before it is spliced (decomposition
    functionalises it there)."""
    cap, inputs = trace_function(fn, args, kwargs, name=node.name)
    if prepare is not None:
        prepare(cap.gm, node)
    leaves = splice(gm, node, cap, inputs)
    _redirect(gm, node, leaves, check_meta)
    return leaves


def _redirect(gm, node, leaves, check_meta):
    old = node.meta.get("val")
    if isinstance(old, (tuple, list)) or len(leaves) != 1:
        for u in list(node.users):
            if u.op == "call_function" and u.target is operator.getitem and u.args[0] is node:
                r = leaves[u.args[1]]
                if not isinstance(r, Node):
                    raise RuntimeError(f"replacement of {node.name}: output {u.args[1]} is not a tensor")
                u.replace_all_uses_with(r)
                gm.graph.erase_node(u)
            else:
                raise RuntimeError(f"replacement of {node.name}: multi-output node used by {u.name} directly")
    else:
        tensors = [x for x in leaves if isinstance(x, Node)]
        if len(tensors) != 1:
            raise RuntimeError(f"replacement of {node.name}: expected one tensor result, got {len(tensors)}")
        r = tensors[0]
        new = r.meta.get("val")
        if check_meta and isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            if tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype:
                raise RuntimeError(f"replacement of {node.name} ({node.target_name}) changes its type: "
                                   f"{old.dtype}{list(old.shape)} -> {new.dtype}{list(new.shape)}")
        node.replace_all_uses_with(r)
    gm.graph.erase_node(node)
