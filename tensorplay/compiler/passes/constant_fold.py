"""Constant folding (chapter §4.1): evaluate at compile time what does not depend on the inputs.

A value is *constant* if it is a ``get_attr`` constant, a pure non-random factory call whose
arguments are all Python values (``_zeros``, ``_ones``, ``_full``, ``_arange``, ``_eye``, ...), or a
node folded by this pass.  A ``call_function`` node is folded when

* its op is neither random, nor in-place, nor a factory (a lone factory is cheaper to regenerate
  than to store; it is folded together with its consumer), nor a collective or an op whose value
  depends on the process (tags ``collective``, ``per_process``: tensorplay.distributed);
* it has at least one tensor input and all of its tensor inputs are constant;
* its result has at most ``MAX_ELEMENTS`` (1M) elements in total;
* no input and not the result is written by an in-place op later (only possible before
  functionalisation), no constant input requires grad;
* it is not directly a graph output: a folded output would hand the *same* tensor object to every
  call, so a caller mutating it would change later results — the node is left to run, its inputs
  are folded.

The node is evaluated with the eager kernel (``OPS[name](*args)``, grad mode off) and replaced by a
new ``get_attr`` attribute of the GraphModule (multi-output ops: each ``getitem`` projection is
replaced).  A kernel that raises is left alone: the error will happen at run time as in eager.
Dead inputs (the factory nodes, the old constants) are left to DCE.

Termination measure: the number of call nodes that are not ``get_attr`` constants; each fold turns
one call node into a ``get_attr`` (and, for multi-output ops, removes its projections).
"""
from __future__ import annotations

import operator

import torch

from ..._tensor import Tensor
from ...autograd import grad_mode
from ..graph.node import Node, map_arg
from .functionalize import alias_root, mutated_roots
from .node_meta import fresh_meta
from .splice import new_attr

__all__ = ["constant_fold", "MAX_ELEMENTS"]

MAX_ELEMENTS = 1 << 20


def _numel(v):
    if isinstance(v, torch.Tensor):
        return v.numel()
    if isinstance(v, (tuple, list)):
        return sum(_numel(x) for x in v)
    return 0


def _pure_factory(n: Node) -> bool:
    d = n.opdef
    return (n.op == "call_function" and d is not None and "factory" in d.tags and "random" not in d.tags
            and not d.is_inplace and not n.all_input_nodes)


def _foldable_op(d) -> bool:
    return (d is not None and not d.is_inplace and not d.tags & _UNFOLDABLE)


#: random values, factories (module doc); communication, and values that differ by process (a
#: process's block: the compiled graph is the same on every process, and may be shared by them)
_UNFOLDABLE = frozenset({"random", "factory", "collective", "per_process"})


def constant_fold(gm) -> bool:
    """Fold constant subexpressions into ``get_attr`` constants (module doc, §4.1).
    Measure: the number of call nodes that are not constants; True iff it decreased."""
    g = gm.graph
    out = g.output_node
    mutated = mutated_roots(g)
    values: dict = {}

    def value_of(n):
        if n in values:
            return values[n]
        if n.op == "get_attr":
            v = gm
            for part in n.target.split("."):
                v = getattr(v, part)
        else:   # a pure factory
            with grad_mode.no_grad():
                v = n.opdef(*n.args)
        values[n] = v
        return v

    def is_const(n):
        return n.op == "get_attr" or _pure_factory(n)

    changed = False
    for n in list(g.nodes):
        if n.op != "call_function" or not _foldable_op(n.opdef) or n.graph is not g:
            continue
        ins = n.all_input_nodes
        if not ins or not all(is_const(i) for i in ins):
            continue
        if out in n.users:
            continue
        if mutated and (alias_root(n) in mutated or any(alias_root(i) in mutated for i in ins)):
            continue
        val = n.meta.get("val")
        if val is None or _numel(val) > MAX_ELEMENTS:
            continue
        try:
            args = map_arg(n.args, value_of)
            leaves = []
            map_arg(n.args, lambda i: leaves.append(value_of(i)))
            if any(isinstance(a, Tensor) and a.requires_grad for a in leaves):
                continue
            with grad_mode.no_grad():
                res = n.opdef(*args)
        except Exception:
            continue
        if isinstance(res, Tensor):
            if res.numel() > MAX_ELEMENTS:
                continue
            _replace(gm, n, res, values)
            g.erase_node(n)
            changed = True
        elif isinstance(res, (tuple, list)) and all(isinstance(r, Tensor) for r in res):
            users = list(n.users)
            if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
                continue
            for u in users:
                _replace(gm, u, res[u.args[1]], values)
                g.erase_node(u)
            g.erase_node(n)
            changed = True
    return changed


def _replace(gm, n, res, values):
    name = new_attr(gm, "_folded", res)
    with gm.graph.inserting_before(n):
        c = gm.graph.get_attr(name)
    c.meta["val"] = fresh_meta(res._data)
    values[c] = res
    n.replace_all_uses_with(c)

