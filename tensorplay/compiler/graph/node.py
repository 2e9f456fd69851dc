"""Graph nodes (chapter §3.1): one value of the captured program.

A :class:`Node` has an opcode (``placeholder``, ``get_attr``, ``call_function``, ``call_method``,
``call_module``, ``output``), a ``target`` (for ``call_function`` an op-table entry, ``OpDef``), its
``args``/``kwargs`` (which may hold other nodes, nested in tuples, lists, dicts or slices), the set of
``users`` (nodes that read it) and ``meta`` — at least ``val`` (a tensor carrying shape, dtype and
strides: the sample value when captured with ``execute=True``, a meta tensor otherwise).

Guarantee: ``users`` is always the exact inverse of the argument relation; every mutation goes
through ``args``/``kwargs`` setters or ``replace_all_uses_with``, which keep it so.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["Node", "map_arg", "map_aggregate", "OPCODES", "generators", "generator_ref"]

#: The random generators (``tp.Generator`` / ``torch.Generator``) that captured programs hand to
#: random ops, numbered for the life of the process: generated code (a graph's ``forward``, a Stax
#: wrapper) names one as ``generators[n]``, so that the code text tells generators apart (a code
#: cache keyed by the text never gives one generator's program another's) and the op draws from
#: that very object.  Entries are kept (a number is never reused).
generators: list = []


def generator_ref(g) -> str:
    """``generators[n]``: the source naming generator ``g`` (numbered on first sight)."""
    for i, x in enumerate(generators):
        if x is g:
            return f"generators[{i}]"
    generators.append(g)
    return f"generators[{len(generators) - 1}]"

OPCODES = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")


def map_aggregate(a, fn: Callable):
    """Apply ``fn`` to every leaf of a nested structure of tuples, lists, dicts and slices."""
    if isinstance(a, tuple):
        t = tuple(map_aggregate(x, fn) for x in a)
        return type(a)(*t) if hasattr(a, "_fields") else t
    if isinstance(a, list):
        return [map_aggregate(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_aggregate(a.start, fn), map_aggregate(a.stop, fn), map_aggregate(a.step, fn))
    return fn(a)


def map_arg(a, fn: Callable[["Node"], Any]):
    """Apply ``fn`` to every Node inside ``a``."""
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)


def _fmt_arg(a, prefix=""):
    """An argument as Python source (``prefix`` before node names: ``%x`` in ``format_node``)."""
    if isinstance(a, Node):
        return f"{prefix}{a.name}"
    if isinstance(a, tuple):
        inner = ", ".join(_fmt_arg(x, prefix) for x in a)
        return f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, list):
        return "[" + ", ".join(_fmt_arg(x, prefix) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt_arg(v, prefix)}" for k, v in a.items()) + "}"
    if isinstance(a, slice):
        return f"slice({_fmt_arg(a.start, prefix)}, {_fmt_arg(a.stop, prefix)}, {_fmt_arg(a.step, prefix)})"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, torch.Generator):
        return generator_ref(a)
    if a is Ellipsis:
        return "..."
    if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
        return f"float({str(a)!r})"
    if _is_size_expr(a):
        return _size_source(a)
    if isinstance(a, torch.SymInt):
        return _size_source(a.node.expr)
    return repr(a)


def _is_size_expr(a) -> bool:
    """A sympy expression of size symbols (dynamic=True capture: capture/symbolic.py)."""
    return type(a).__module__.startswith(("sympy", "torch.utils._sympy"))


def _size_source(e) -> str:
    """A size expression as Python over the symbols the graph's code binds (``s0 = x.shape[0]``)."""
    from torch.utils._sympy.printers import PythonPrinter
    return f"({PythonPrinter().doprint(e)})"


def _collect(a, out: dict):
    map_arg(a, lambda n: out.setdefault(n, None))
    return out


class Node:
    def __init__(self, graph, name: str, op: str, target, args=(), kwargs=None):
        if op not in OPCODES:
            raise ValueError(f"unknown opcode {op!r}")
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._inputs: dict = {}
        self.users: dict = {}
        self.meta: dict = {}
        self._update(tuple(args), dict(kwargs or {}))

    # -- arguments --------------------------------------------------------------------------------
    def _update(self, args, kwargs):
        for n in self._inputs:
            n.users.pop(self, None)
        self._args, self._kwargs = args, kwargs
        self._inputs = _collect((args, kwargs), {})
        for n in self._inputs:
            n.users.setdefault(self, None)

    @property
    def args(self) -> tuple:
        return self._args

    @args.setter
    def args(self, value):
        self._update(tuple(value), self._kwargs)

    @property
    def kwargs(self) -> dict:
        return self._kwargs

    @kwargs.setter
    def kwargs(self, value):
        self._update(self._args, dict(value))

    @property
    def all_input_nodes(self) -> list["Node"]:
        return list(self._inputs)

    def replace_input_with(self, old: "Node", new: "Node"):
        self._update(map_arg(self._args, lambda n: new if n is old else n),
                     map_arg(self._kwargs, lambda n: new if n is old else n))

    def replace_all_uses_with(self, new: "Node", *, except_for=()) -> list["Node"]:
        users = [u for u in self.users if u not in except_for]
        for u in users:
            u.replace_input_with(self, new)
        return users

    # -- properties ---------------------------------------------------------------------------------
    @property
    def opdef(self):
        """The op-table entry of a call_function node (or None)."""
        from ...ops.registry import OpDef
        return self.target if isinstance(self.target, OpDef) else None

    @property
    def target_name(self) -> str:
        t = self.target
        if hasattr(t, "schema"):
            return t.name
        if callable(t):
            return getattr(t, "__name__", repr(t))
        return str(t)

    @property
    def tags(self) -> frozenset:
        d = self.opdef
        return d.tags if d is not None else frozenset()

    @property
    def is_impure(self) -> bool:
        """Nodes DCE must keep: outputs, placeholders, and mutations."""
        if self.op in ("placeholder", "output"):
            return True
        d = self.opdef
        return d is not None and d.is_inplace

    def format_node(self) -> str:
        val = self.meta.get("val")
        ty = ""
        if val is not None and hasattr(val, "shape"):
            ty = f": {str(val.dtype).replace('torch.', '')}{list(val.shape)}"
        if self.op == "placeholder":
            return f"%{self.name}{ty} = placeholder[{self.target}]"
        if self.op == "output":
            return f"return {_fmt_arg(self.args[0], '%')}"
        a = ", ".join(_fmt_arg(x, "%") for x in self.args)
        if self.kwargs:
            a += (", " if a else "") + ", ".join(f"{k}={_fmt_arg(v, '%')}" for k, v in self.kwargs.items())
        return f"%{self.name}{ty} = {self.op}[{self.target_name}]({a})"

    def __repr__(self):
        return self.name
