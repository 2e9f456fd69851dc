"""Dead-code elimination by backward reachability (chapter §4.1).

The live nodes are those reachable backwards (through arguments) from the *roots*: the output, the
placeholders (the signature is kept even for unused inputs), in-place ops (their effect is
observable: the write-backs of functionalisation, or mutation before it), and calls the pass cannot
prove pure (``call_method``, ``call_module``, ``call_function`` of something that is neither an
op-table entry nor ``operator.getitem``).  Every other node is dead and erased, in reverse order;
unused ``get_attr`` constants also lose their attribute.  Linear time.

Random ops without users are dead too and are removed: a draw nobody reads has no observable value.
The one observable consequence is the random-number stream — eager would have advanced the
generator for the removed draw, so later draws in the same program differ from eager's (as with
any compiler that eliminates dead random ops; compare distributions, not bits, for random programs).
A draw from an explicit ``generator=`` is kept, unread or not: that generator's state is the
program's to observe (``g.get_state()``, its later draws), so it advances as in eager.

Data gates (§3.5) must be extracted before this pass runs (invariant 2): their backward slice may
be dead in the graph.

Termination measure: the number of nodes (each step erases one).
"""
from __future__ import annotations

import operator

import torch

from ..graph.node import Node

__all__ = ["dce", "is_root"]


def is_root(n: Node) -> bool:
    """Nodes DCE must keep regardless of users."""
    if n.is_impure:
        return True
    if n.op in ("call_method", "call_module"):
        return True
    if n.op == "call_function" and n.opdef is None and n.target is not operator.getitem:
        return True
    if n.op == "call_function" and n.opdef is not None and "random" in n.opdef.tags:
        return any(isinstance(a, torch.Generator) for a in n.args)   # its generator's state is observable
    return False


def _symbols_in(x) -> set:
    """The size symbols a node's arguments read (sympy expressions inside lists, tuples, dicts)."""
    from ..graph.node import _is_size_expr
    if isinstance(x, (list, tuple)):
        return set().union(*(_symbols_in(v) for v in x)) if x else set()
    if isinstance(x, dict):
        return _symbols_in(list(x.values()))
    if isinstance(x, slice):
        return _symbols_in([x.start, x.stop, x.step])
    return set(x.free_symbols) if _is_size_expr(x) else set()


def dce(gm) -> bool:
    """Erase the nodes not backward-reachable from the roots (module doc, §4.1).
    Measure: the number of nodes; True iff a node was erased."""
    g = gm.graph
    live = set()
    stack = [n for n in g.nodes if is_root(n)]
    # a data-dependent size (dynamic=True: ``u0 = index.shape[0]``) is read from the output of the
    # node that computes it: a live node whose arguments use it keeps that node live
    binders = {src.input: sym for sym, src in g.size_symbols.items() if getattr(src, "index", 0) is None}
    by_name = {n.name: n for n in g.nodes if n.name in binders} if binders else {}
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
        if by_name:
            used = _symbols_in((n.args, n.kwargs))
            stack.extend(m for name, m in by_name.items() if binders[name] in used)
    dead = [n for n in g.nodes if n not in live]
    if not dead:
        return False
    for n in reversed(dead):
        g.erase_node(n)
    used_attrs = {n.target for n in g.nodes if n.op == "get_attr"}
    for n in dead:
        if n.op == "get_attr" and n.target not in used_attrs and n.target in gm._attrs:
            del gm._attrs[n.target]
            try:
                delattr(gm, n.target)
            except AttributeError:
                pass
    return True
