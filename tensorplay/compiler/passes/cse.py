"""Common-subexpression elimination by value numbering (chapter §4.1; exercise 8(3)).

One forward sweep keeps a table ``key -> representative node``; a node whose key is already in
the table is replaced by the representative (its uses redirected, the node erased).  The key of
a pure node is ``(target, arguments with nodes replaced by their representatives, memory epoch)``.
Arguments are keyed *with their types* — ``1``, ``1.0`` and ``True`` are different arguments (they
promote differently), and ``0.0`` / ``-0.0`` are different (their bits are compared) — and nested
lists, tuples and slices are keyed structurally.  Linear time in the size of the graph.

What is never merged:

* random ops (two draws are two different values), in-place ops, placeholders, the output,
  calls that are not op-table entries (``call_method``/``call_module``/unknown functions);
* a fresh allocation whose storage is written by an in-place op later (merging ``a = zeros(3)``
  with ``b = zeros(3)`` would make ``a.add_(1)`` change ``b``).

**Memory epoch.**  The epoch starts at 0 and advances at every in-place op (and at every call the
pass does not understand); a node that *reads memory* carries the epoch in its key, so two reads
of the same tensor separated by a write are different values.  Exercise 8(3): in
``a = x.sum(); x.add_(1); b = x.sum()`` the captured graph has two ``sum(x)`` nodes with identical
arguments — before functionalisation they are different values, and plain value numbering would
merge them; here they get epochs 0 and 1 and are kept apart.  After functionalisation the second
sum reads ``add(x, 1)`` and the question does not arise.  Aliasing views (``t``, ``getitem``, ...)
and ``getitem`` projections of multi-output nodes do not read memory — a view made before a write
aliases the same storage as one made after — so they are keyed without the epoch.

Caveat: merged graph outputs become the same tensor object (eager returned equal but distinct
tensors).

Termination measure: the number of nodes (each merge erases one).
"""
from __future__ import annotations

import numbers
import operator

from ..graph.node import Node
from .functionalize import is_mutation, mutated_roots, view_step

__all__ = ["cse", "arg_key"]


def arg_key(x):
    """A hashable key for an argument that distinguishes what Python's ``==`` conflates."""
    if isinstance(x, Node):
        return ("node", x)
    if isinstance(x, bool):
        return ("bool", x)
    if isinstance(x, int):
        return ("int", x)
    if isinstance(x, float):
        return ("float", x.hex())
    if isinstance(x, complex):
        return ("complex", x.real.hex(), x.imag.hex())
    if isinstance(x, str):
        return ("str", x)
    if x is None or x is Ellipsis:
        return ("const", repr(x))
    if isinstance(x, slice):
        return ("slice", arg_key(x.start), arg_key(x.stop), arg_key(x.step))
    if isinstance(x, tuple):
        return ("tuple",) + tuple(arg_key(v) for v in x)
    if isinstance(x, list):
        return ("list",) + tuple(arg_key(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, arg_key(v)) for k, v in x.items())
    if isinstance(x, numbers.Number):
        return (type(x).__name__, repr(x))
    if hasattr(x, "shape"):     # a tensor object in the arguments: identity
        return ("id", id(x))
    try:
        hash(x)
        return ("obj", type(x).__name__, x)
    except TypeError:
        return ("id", id(x))


def _barrier(n: Node) -> bool:
    if is_mutation(n):
        return True
    if n.op in ("call_method", "call_module"):
        return True
    return n.op == "call_function" and n.opdef is None and n.target is not operator.getitem


def cse(gm) -> bool:
    """Merge nodes that compute the same value (module doc, §4.1; exercise 8(3)).
    Measure: the number of nodes; True iff a node was merged."""
    g = gm.graph
    mutated = mutated_roots(g)
    table: dict = {}
    epoch = 0
    changed = False
    for n in list(g.nodes):
        if _barrier(n):
            epoch += 1
            continue
        if n.op == "get_attr":
            key = ("get_attr", n.target)
        elif n.op == "call_function":
            d = n.opdef
            if d is None:       # operator.getitem projection of a multi-output node
                key = ("proj", arg_key(n.args), arg_key(n.kwargs))
            else:
                if "random" in d.tags:
                    continue
                aliasing = view_step(n) is not None
                if not aliasing and n in mutated:
                    continue
                key = (d.name, arg_key(n.args), arg_key(n.kwargs), None if aliasing else epoch)
        else:
            continue
        rep = table.get(key)
        if rep is None:
            table[key] = n
            continue
        n.replace_all_uses_with(rep)
        g.erase_node(n)
        changed = True
    return changed
