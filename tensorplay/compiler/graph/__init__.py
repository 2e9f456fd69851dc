"""The graph IR: Node, Graph, GraphModule, Interpreter (chapter §3.1)."""
from .graph import Graph, GraphLintError
from .graph_module import GraphModule
from .interpreter import Interpreter
from .node import Node, map_aggregate, map_arg

__all__ = ["Graph", "GraphLintError", "GraphModule", "Interpreter", "Node", "map_arg", "map_aggregate"]
