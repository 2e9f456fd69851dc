"""Interpreter: run a graph node by node (chapter §3.1).

Subclass and override ``call_function`` (or ``run_node``) to give nodes another meaning: the
guard-replay of data gates, shape propagation and debugging backends are interpreters.
"""
from __future__ import annotations

from .node import map_arg

__all__ = ["Interpreter"]


class Interpreter:
    def __init__(self, module):
        self.module = module
        self.graph = module.graph
        self.env: dict = {}

    def run(self, *args):
        self.env = {}
        it = iter(args)
        for n in self.graph.nodes:
            if n.op == "placeholder":
                try:
                    self.env[n] = next(it)
                except StopIteration:
                    raise TypeError(f"Interpreter: missing value for placeholder {n.name}") from None
                continue
            if n.op == "output":
                return map_arg(n.args[0], self.env.__getitem__)
            self.env[n] = self.run_node(n)
        return None

    def run_node(self, n):
        args = map_arg(n.args, self.env.__getitem__)
        kwargs = map_arg(n.kwargs, self.env.__getitem__)
        return getattr(self, n.op)(n.target, args, kwargs)

    def get_attr(self, target, args, kwargs):
        obj = self.module
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def call_function(self, target, args, kwargs):
        return target(*args, **kwargs)

    def call_method(self, target, args, kwargs):
        return getattr(args[0], target)(*args[1:], **kwargs)

    def call_module(self, target, args, kwargs):
        return self.get_attr(target, (), {})(*args, **kwargs)
