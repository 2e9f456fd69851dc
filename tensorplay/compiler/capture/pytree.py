"""Flatten nested inputs/outputs (tuples, lists, dicts, namedtuples) to leaves and back.

The specialization key and the graph see flat leaves; the user sees the original structure.
"""
from __future__ import annotations

__all__ = ["tree_flatten", "tree_unflatten", "LEAF"]

LEAF = "*"


def tree_flatten(obj):
    leaves: list = []

    def rec(o):
        if isinstance(o, tuple) and hasattr(o, "_fields"):
            return ("namedtuple", type(o), [rec(x) for x in o])
        if isinstance(o, tuple):
            return ("tuple", None, [rec(x) for x in o])
        if isinstance(o, list):
            return ("list", None, [rec(x) for x in o])
        if isinstance(o, dict):
            keys = list(o.keys())
            return ("dict", keys, [rec(o[k]) for k in keys])
        leaves.append(o)
        return LEAF
    spec = rec(obj)
    return leaves, spec


def tree_unflatten(leaves, spec):
    it = iter(leaves)

    def rec(s):
        if s == LEAF:
            return next(it)
        kind, aux, children = s
        vals = [rec(c) for c in children]
        if kind == "tuple":
            return tuple(vals)
        if kind == "list":
            return vals
        if kind == "namedtuple":
            return aux(*vals)
        return dict(zip(aux, vals))
    return rec(spec)
