"""Symbolic sizes through AOT autograd (the chapter, §10.1–§10.2 applied to §5): one joint graph,
one forward and one backward graph for every size a ``dynamic=True`` capture admits.

A ``dynamic=True`` capture hands the backend a graph whose ``meta["val"]`` are symbolic fake
tensors of one ``ShapeEnv`` (capture/symbolic.py).  The AOT layer keeps those symbols:

* :class:`RetraceShapes` gives the retracing tracers (dispatch_trace.py, joint.py) a
  :class:`~tensorplay.compiler.capture.symbolic.SymbolicShapes` over the capture's *own* shape
  environment and fake mode, whose placeholders are the given fakes (the captured inputs', then
  the tangents'); every op the retrace records — the forward's and the derivative formulas' — runs
  on fakes, so every node of the joint graph gets a symbolic ``meta["val"]``, size arguments are
  expressions of the capture's symbols, and a formula that branches on a size records a shape
  guard in the same environment (it reaches the key: the backend compiles before
  ``Lowered.add_shape_guards`` reads the guards);
* :func:`bind_sizes` says where a graph reads each symbol it uses from (``Graph.size_symbols``:
  placeholder, dim), for the joint, forward and backward graphs alike; a symbol that no placeholder
  carries is reported (:func:`unbound_symbols`) so that the partitioner can save an input that does;
* sizes are read as numbers only at their hints (``SymNode.hint``: the sample's value, no guard
  recorded) — the partitioner's byte costs (partition.py) and the example tensors the forward and
  backward compilers receive (function.py).

Imported only for a symbolic graph (a static compile imports neither sympy nor fake tensors).
"""
from __future__ import annotations

import sympy
import torch

from ..capture.symbolic import SymbolicShapes, SymbolSource, map_leaves
from ..graph.node import _is_size_expr

__all__ = ["RetraceShapes", "bind_sizes", "unbound_symbols", "used_symbols",
           "use_symbolic_meta"]


class RetraceShapes(SymbolicShapes):
    """A capture's shape environment and fake mode seen by a retrace: placeholder ``i`` is the
    ``i``-th given fake (no new symbol is created).  A recorded node whose op cannot run on fakes —
    its output size depends on values (``x[mask]``) — gets the node's captured value (``captured``,
    set by ``retrace_nodes``; the capture checks that size with a shape gate before every call)."""

    def __init__(self, mode, fakes):
        super().__init__(unbacked=False, mode=mode)
        self._given = list(fakes)
        self.captured = None

    def input_fake(self, t, placeholder, index, name, dims=None, marks=None):
        return self._given[index]     # (the capture's fake: its symbols were chosen there)

    def run(self, op, args, device="cpu"):
        try:
            return super().run(op, args, device)
        except Exception:
            if self.captured is None:
                raise
            return self.captured

    def symints(self, x):
        """Node arguments with every size expression as a SymInt of this environment (what the op
        receives when the retrace runs a recorded node)."""
        def leaf(v):
            if not _is_size_expr(v):
                return v
            e = sympy.sympify(v)
            if e.is_Integer:
                return int(e)
            return self.env.create_symintnode(e, hint=self.hint(e))
        return map_leaves(x, leaf)


def use_symbolic_meta(graph):
    """After a symbolic retrace: every node's ``meta["val"]`` is its fake (``meta["sym"]``), as at
    the end of a capture."""
    for n in graph.nodes:
        if "sym" in n.meta:
            n.meta["val"] = n.meta["sym"]


# -- where a graph reads its size symbols ------------------------------------------------------------
def _exprs(v):
    """The expressions of the symbolic sizes and strides of a fake tensor (or tuple of them)."""
    out = []
    if isinstance(v, (tuple, list)):
        for x in v:
            out += _exprs(x)
        return out
    if isinstance(v, torch.Tensor):
        for s in list(v.shape) + list(v.stride()):
            if isinstance(s, torch.SymInt):
                out.append(s.node.expr)
    return out


def _arg_symbols(a) -> set:
    found = set()

    def leaf(x):
        if _is_size_expr(x):
            found.update(sympy.sympify(x).free_symbols)
        elif isinstance(x, torch.SymInt):
            found.update(x.node.expr.free_symbols)
        return x
    map_leaves(a, leaf)
    return found


def used_symbols(graph, env) -> set:
    """Every size symbol a graph's code or metadata mentions (raw, and after the environment's
    replacements)."""
    used = set()
    for n in graph.nodes:
        if n.op == "placeholder":
            continue
        used |= _arg_symbols(n.args) | _arg_symbols(list(n.kwargs.values()))
        for e in _exprs(n.meta.get("val")):
            used |= e.free_symbols | env.replace(e).free_symbols
    return used


def _carried(graph, env) -> dict:
    """symbol -> SymbolSource for every symbol a placeholder's size (or, failing that, stride: a
    strided view's) *is*, raw or after replacement."""
    out = {}
    for kind in ("size", "stride"):
        for i, p in enumerate(graph.placeholders):
            v = p.meta.get("val")
            if not isinstance(v, torch.Tensor):
                continue
            for d, s in enumerate(v.shape if kind == "size" else v.stride()):
                if not isinstance(s, torch.SymInt):
                    continue
                for e in (s.node.expr, env.replace(s.node.expr)):
                    if isinstance(e, sympy.Symbol) and e not in out:
                        out[e] = SymbolSource(p.name, i, d, p.name, kind=kind)
    return out


def unbound_symbols(graph, env) -> set:
    """Symbols the graph uses that no placeholder size carries (raw or canonical)."""
    carried = _carried(graph, env)
    return {s for s in used_symbols(graph, env) if s not in carried and env.replace(s) not in carried}


def bind_sizes(graph, env, *, what="graph"):
    """Set ``graph.size_symbols``: each symbol the graph uses, read from a placeholder that carries
    it (a replaced symbol from one carrying its replacement: the key guards that they are equal).
    Raises NotImplementedError naming a symbol no placeholder carries."""
    carried = _carried(graph, env)
    out = {}
    for s in sorted(used_symbols(graph, env) | set(carried), key=str):
        src = carried.get(s) or carried.get(env.replace(s))
        if src is None:
            raise NotImplementedError(f"AOT: the {what} uses the size {s}, which none of its inputs carries")
        out[s] = src
    graph.size_symbols = out
    return out
