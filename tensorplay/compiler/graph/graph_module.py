"""GraphModule: a graph plus the attributes it reads, compiled to a Python function (chapter §3.1).

``code`` is the graph printed as Python (one line per node, calling ``ops.<name>`` with the op's
canonical arguments); ``forward`` is that source compiled with ``exec`` — running it is running the
captured program op by op through the eager dispatcher, which is exactly the ``"eager"`` backend.
"""
from __future__ import annotations

import operator
import types

import torch

from ...ops.registry import OPS
from .graph import Graph
from .node import generators

__all__ = ["GraphModule", "ops_namespace"]


class _Ops:
    """``ops.add(x, y, 1)`` in generated code: the op-table entry called on canonical arguments."""

    def __getattr__(self, name):
        try:
            return OPS[name]
        except KeyError:
            raise AttributeError(f"no op {name!r} in the op table") from None


ops_namespace = _Ops()


class GraphModule:
    def __init__(self, graph: Graph, attrs: dict | None = None, name: str = "GraphModule"):
        self.graph = graph
        graph.owning_module = self
        self._attrs = dict(attrs or {})
        for k, v in self._attrs.items():
            setattr(self, k, v)
        self._name = name
        self.recompile()

    def recompile(self):
        fns = {}
        for n in self.graph.nodes:
            if n.op == "call_function" and n.opdef is None:
                mod = getattr(n.target, "__module__", "")
                if mod not in ("_operator", "operator", "builtins"):
                    fns[getattr(n.target, "__qualname__", getattr(n.target, "__name__", "f"))] = n.target
        self._code = self.graph.python_code()
        ns = {"ops": ops_namespace, "torch": torch, "operator": operator, "fns": types.SimpleNamespace(**fns),
              "generators": generators, "float": float, "inf": float("inf")}
        exec(compile(self._code, f"<tp graph {self._name}>", "exec"), ns)
        self._forward = ns["forward"]

    @property
    def code(self) -> str:
        return self._code

    def forward(self, *args):
        return self._forward(self, *args)

    def __call__(self, *args):
        return self._forward(self, *args)

    def print_readable(self, print_output=True) -> str:
        s = f"class {self._name}:\n" + "\n".join("    " + ln for ln in self._code.splitlines())
        if print_output:
            print(s)
        return s

    def add_attr(self, name: str, value) -> str:
        base, i = name, 0
        while hasattr(self, name):      # never overwrite an existing attribute
            i += 1
            name = f"{base}_{i}"
        self._attrs[name] = value
        setattr(self, name, value)
        return name

    @property
    def attrs(self) -> dict:
        return self._attrs

    def __repr__(self):
        return self.print_readable(print_output=False)
