"""The graph IR (chapter §3.1): an ordered list of nodes in SSA form.

``Graph`` owns its nodes in program order; every node appears after the nodes it reads (checked
by :meth:`Graph.lint`).  Values are never overwritten — except by in-place ops, which the
functionalisation pass (§4.4) removes before any pass that assumes purity.

Building: ``placeholder``, ``get_attr``, ``call_function``, ``call_method``, ``call_module``,
``output``; ``inserting_before(node)`` / ``inserting_after(node)`` set the insertion point.
``python_code()`` prints the graph as a readable Python function (what ``GraphModule.code`` shows).
"""
from __future__ import annotations

import builtins
import contextlib
import keyword
import re

from .node import Node, _fmt_arg, map_arg

__all__ = ["Graph", "GraphLintError"]


class GraphLintError(RuntimeError):
    pass


_RESERVED = set(dir(builtins)) | {"torch", "ops", "self", "tp", "operator", "fns", "inf"}


class Graph:
    def __init__(self):
        self.nodes: list[Node] = []
        self._names: dict[str, int] = {}
        self._insert_at: int | None = None  # None: append
        self.owning_module = None
        #: dynamic=True capture: size symbol -> where it is read from (capture/symbolic.SymbolSource)
        self.size_symbols: dict = {}

    # -- naming -------------------------------------------------------------------------------------
    def _unique(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint).strip("_") or "v"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "v_" + base
        elif base in _RESERVED:
            base = base + "_"
        n = self._names.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._names:          # a hint like "sum_1" may collide with a generated name
            n += 1
            name = f"{base}_{n}"
        self._names[base] = n + 1
        self._names.setdefault(name, 1)
        return name

    # -- building -----------------------------------------------------------------------------------
    def create_node(self, op, target, args=(), kwargs=None, name=None) -> Node:
        hint = name or (target if isinstance(target, str) else getattr(target, "name", None)
                        or getattr(target, "__name__", "v"))
        node = Node(self, self._unique(str(hint)), op, target, args, kwargs)
        if self._insert_at is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self._insert_at, node)
            self._insert_at += 1
        return node

    def placeholder(self, name: str) -> Node:
        return self.create_node("placeholder", name, name=name)

    def get_attr(self, target: str) -> Node:
        return self.create_node("get_attr", target, name=target.replace(".", "_"))

    def call_function(self, target, args=(), kwargs=None, name=None) -> Node:
        return self.create_node("call_function", target, args, kwargs, name=name)

    def call_method(self, method: str, args=(), kwargs=None) -> Node:
        return self.create_node("call_method", method, args, kwargs)

    def call_module(self, target: str, args=(), kwargs=None) -> Node:
        return self.create_node("call_module", target, args, kwargs)

    def output(self, value) -> Node:
        return self.create_node("output", "output", (value,), name="output")

    @contextlib.contextmanager
    def inserting_before(self, node: Node):
        prev = self._insert_at
        self._insert_at = self.nodes.index(node)
        try:
            yield
        finally:
            self._insert_at = prev

    @contextlib.contextmanager
    def inserting_after(self, node: Node):
        prev = self._insert_at
        self._insert_at = self.nodes.index(node) + 1
        try:
            yield
        finally:
            self._insert_at = prev

    def erase_node(self, node: Node):
        if node.users:
            raise GraphLintError(f"cannot erase {node.name}: still used by {list(node.users)}")
        node._update((), {})
        self.nodes.remove(node)

    # -- queries ------------------------------------------------------------------------------------
    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node:
        for n in reversed(self.nodes):
            if n.op == "output":
                return n
        raise GraphLintError("graph has no output node")

    def find_nodes(self, *, op: str, target=None) -> list[Node]:
        return [n for n in self.nodes if n.op == op and (target is None or n.target is target or n.target == target)]

    def lint(self):
        """Check SSA order, the users relation, a single trailing output, unique names."""
        seen, names = set(), set()
        outs = [n for n in self.nodes if n.op == "output"]
        if len(outs) != 1 or self.nodes[-1] is not outs[0]:
            raise GraphLintError("graph must end with exactly one output node")
        for n in self.nodes:
            if n.graph is not self:
                raise GraphLintError(f"node {n.name} belongs to another graph")
            if n.name in names:
                raise GraphLintError(f"duplicate node name {n.name}")
            names.add(n.name)
            for i in n.all_input_nodes:
                if i not in seen:
                    raise GraphLintError(f"node {n.name} uses {i.name} before it is defined")
                if n not in i.users:
                    raise GraphLintError(f"users of {i.name} lack {n.name}")
            for u in n.users:
                if n not in u.all_input_nodes:
                    raise GraphLintError(f"{u.name} is listed as a user of {n.name} but does not read it")
            if n.op == "call_function" and not callable(n.target):
                raise GraphLintError(f"call_function {n.name} has a non-callable target {n.target!r}")
            seen.add(n)
        return True

    def copy(self):
        """A deep copy of the structure (nodes new, targets and meta shared); returns (graph, map)."""
        g = Graph()
        g.size_symbols = dict(self.size_symbols)
        env: dict[Node, Node] = {}
        for n in self.nodes:
            new = g.create_node(n.op, n.target, map_arg(n.args, env.__getitem__),
                                map_arg(n.kwargs, env.__getitem__), name=n.name)
            new.meta = dict(n.meta)
            env[n] = new
        return g, env

    # -- printing -----------------------------------------------------------------------------------
    def __str__(self):
        lines = ["graph():"] + ["    " + n.format_node() for n in self.nodes]
        return "\n".join(lines)

    def size_bindings(self, indent="    ", after=None) -> list:
        """Lines binding the size symbols (dynamic=True) from the placeholders: ``s0 = x.shape[0]``
        (a strided view's stride symbol: ``s1 = x.stride(0)``);
        with ``after`` (a node), the data-dependent sizes that node's output has:
        ``u0 = index.shape[0]`` (emitted right after the node's line)."""
        name = None if after is None else after.name
        return [f"{indent}{sym} = {src.read(src.input)}   # {src.kind} symbol: {src.describe()}"
                for sym, src in sorted(self.size_symbols.items(), key=lambda kv: str(kv[0]))
                if (src.index is None) == (name is not None) and (name is None or src.input == name)]

    def python_code(self, fn_name="forward") -> str:
        """The graph as readable Python: each call_function line calls ``ops.<name>`` with the
        op's canonical arguments (see OpDef.__call__)."""
        params = [n.name for n in self.placeholders]
        lines = [f"def {fn_name}(self, {', '.join(params)}):" if params else f"def {fn_name}(self):"]
        lines += self.size_bindings()
        for n in self.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                lines.append(f"    return {_fmt_arg(n.args[0])}")
                continue
            args = ", ".join(_fmt_arg(a) for a in n.args)
            kw = ", ".join(f"{k}={_fmt_arg(v)}" for k, v in n.kwargs.items())
            call = ", ".join(x for x in (args, kw) if x)
            val = n.meta.get("val")
            comment = f"  # {str(val.dtype).replace('torch.', '')}{list(val.shape)}" if hasattr(val, "shape") else ""
            if n.op == "get_attr":
                lines.append(f"    {n.name} = self.{n.target}{comment}")
            elif n.op == "call_function":
                d = n.opdef
                fn = f"ops.{d.name}" if d is not None else _callable_name(n.target)
                lines.append(f"    {n.name} = {fn}({call}){comment}")
                lines += self.size_bindings(after=n)
            elif n.op == "call_method":
                lines.append(f"    {n.name} = {_fmt_arg(n.args[0])}.{n.target}({', '.join(_fmt_arg(a) for a in n.args[1:])}){comment}")
            elif n.op == "call_module":
                lines.append(f"    {n.name} = self.{n.target}({call}){comment}")
        return "\n".join(lines) + "\n"


def _callable_name(t) -> str:
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t))
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod == "builtins":
        return name
    return f"fns.{name}"
