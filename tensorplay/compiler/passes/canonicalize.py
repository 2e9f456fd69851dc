"""Canonicalisation (chapter §4.1): one spelling per operation.

Capture already records op-table nodes with canonical arguments, but graphs built by hand (or by
other front ends) may say the same thing in many ways: ``call_method`` nodes (``x.add(y)``,
``x.view(2, 3)``, ``x.__radd__(2)``), ``call_function`` nodes whose target is a Python operator
(``operator.add``, ``operator.truediv``, ``operator.neg``, ``operator.matmul``, ``operator.getitem`` on
a tensor, ...), a tp or torch free function (``tp.add``, ``torch.exp``), or an op-table entry with
keyword arguments or missing defaults.  This pass rewrites each of them into a ``call_function``
node whose target is the ``OpDef`` and whose ``args`` are the op's full canonical tuple (schema
order, defaults filled, keyword arguments folded into their positions, ``*size`` varargs packed).

Which op: derived from the table, never from a second list — a method name is looked up on
``Tensor`` (methods generated from the table carry their ``OpDef``), ``operator.X`` through the
ops' ``dunders`` (``__add__`` -> ``operator.add``; reflected operators keep the order of operands,
``2 - x`` is ``sub(2, x)`` exactly as eager dispatch records it), ``torch.f``/``tp.f`` through
``tp.f``.  ``x[idx]`` is ``getitem`` for basic indices and ``index`` otherwise.  Anything else whose
inputs carry meta values (Python-level dispatchers such as ``x.max(dim=0)``, ``x.expand_as(y)``) is
canonicalised by tracing the call symbolically (``execute=False``) and splicing the recorded
op-table nodes in.  ``operator.getitem(node, i)`` on a multi-output node is already canonical (the
projection), and is left alone; calls that cannot be resolved are left alone as well.

Termination measure: the number of non-canonical nodes; each rewrite replaces one by canonical
nodes only.
"""
from __future__ import annotations

import functools
import inspect
import operator

from ...ops.registry import OPS
from ..graph.node import Node
from .node_meta import set_meta
from .splice import MissingMeta, replace_with_trace

__all__ = ["canonicalize", "is_canonical", "canonical_args"]


@functools.lru_cache(maxsize=None)
def _signature(name):
    return inspect.signature(OPS[name].fn)


def canonical_args(op, args, kwargs=None) -> tuple:
    """Bind ``args``/``kwargs`` the way ``op``'s generated function does; return the canonical tuple."""
    ba = _signature(op.name).bind(*args, **(kwargs or {}))
    ba.apply_defaults()
    vals = dict(ba.arguments)
    if op.varargs:
        v = vals[op.varargs]
        if isinstance(v, tuple) and len(v) == 1 and not isinstance(v[0], int):
            v = v[0]
        vals[op.varargs] = v
    return tuple(vals[n] for n in op.schema.arg_names)


@functools.lru_cache(maxsize=None)
def _operator_table():
    """``operator.add`` -> OpDef ``add`` etc., from the table's ``dunders``."""
    table = {}
    for op in OPS.values():
        for d in tuple(op.dunders) + tuple(op.rdunders):
            fname = d.strip("_")
            if d in op.rdunders and fname.startswith("r"):
                fname = fname[1:]
            f = getattr(operator, fname, None) or getattr(operator, fname + "_", None)
            if f is not None and f not in table:
                table[f] = op
    return table


def is_canonical(n: Node) -> bool:
    if n.op == "call_method":
        return False
    if n.op != "call_function":
        return True
    d = n.opdef
    if d is not None:
        return not n.kwargs and len(n.args) == len(d.schema.args)
    if n.target is operator.getitem and isinstance(n.args[0], Node):
        v = n.args[0].meta.get("val")
        return isinstance(v, (tuple, list)) or (n.args[0].opdef is not None and not n.args[0].opdef.schema.returns_tensor)
    return False


def _getitem_op(idx):
    from ...ops.view import _is_basic
    return OPS["getitem"] if _is_basic(idx) else OPS["index"]


def _resolve(n: Node):
    """(OpDef, args, kwargs) for a direct rewrite, or (callable, args, kwargs) to trace, or None."""
    from ... import _tensor
    import tensorplay as tp
    t, args, kwargs = n.target, n.args, n.kwargs
    if n.op == "call_method":
        if t == "__getitem__" and len(args) == 2 and not kwargs:
            return _getitem_op(args[1]), args, {}
        if t == "__setitem__" and len(args) == 3 and not kwargs:
            return OPS["setitem_"], args, {}
        attr = getattr(_tensor.Tensor, t, None)
        op = getattr(attr, "_opdef", None)
        if op is not None:
            return op, args, kwargs
        for cand in OPS.values():       # reflected operators: x.__rsub__(2) == sub(2, x)
            if t in cand.rdunders and len(args) == 2 and not kwargs:
                return cand, (args[1], args[0]), {}
        if attr is not None:
            return (lambda self, *a, **k: getattr(self, t)(*a, **k)), args, kwargs
        return None
    d = n.opdef
    if d is not None:
        return d, args, kwargs
    if t is operator.getitem:
        return _getitem_op(args[1]), args, kwargs
    if t is operator.setitem:
        return OPS["setitem_"], args, kwargs
    op = _operator_table().get(t)
    if op is not None:
        return op, args, kwargs
    op = getattr(t, "_opdef", None)
    if op is not None:
        return op, args, kwargs
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__name__", None)
    if name and (mod.startswith("torch") or mod.startswith("tensorplay")):
        f = getattr(tp, name, None)
        if f is not None:
            op = getattr(f, "_opdef", None)
            if op is not None:
                return op, args, kwargs
            return f, args, kwargs
    return None


def canonicalize(gm) -> bool:
    """Rewrite non-canonical call nodes into op-table nodes with canonical arguments (§4.1).
    Measure: the number of non-canonical nodes; True iff it decreased."""
    g = gm.graph
    changed = False
    alive = set(g.nodes)
    for n in list(g.nodes):
        if n not in alive or is_canonical(n):
            continue
        r = _resolve(n)
        if r is None:
            continue
        target, args, kwargs = r
        if hasattr(target, "schema"):
            try:
                canon = canonical_args(target, args, kwargs)
            except TypeError as e:
                raise TypeError(f"canonicalize: cannot bind {n.format_node()} to {target.schema.text}: {e}") from None
            with g.inserting_before(n):
                new = g.call_function(target, canon)
            set_meta(new)
            if "val" not in new.meta and "val" in n.meta:
                new.meta["val"] = n.meta["val"]
            n.replace_all_uses_with(new)
            g.erase_node(n)
            changed = True
        else:
            try:
                replace_with_trace(gm, n, target, args, kwargs, check_meta=False)
            except MissingMeta:
                continue
            changed = True
            alive = set(g.nodes)
    return changed
