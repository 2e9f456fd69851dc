"""Data gates and their guard-replay subgraphs (chapter §3.4–3.5).

A data gate is a point where Python needed a value of a traced tensor (``if x.sum() > 0``).  The
captured graph is valid only for inputs that take the same branch, so the outcome joins the
specialization key.  To check it on a new call we need the gate's value *before* running the
artifact: the **backward slice** of each gate's node (the nodes it transitively reads) is copied
into a separate replay graph whose outputs are the gate values (Algorithm 3.1, O(|V|+|E|)).

Extraction must happen **before dead-code elimination** (Prop. 3.1): a gate's condition often
feeds no output (``x.sum() > 0`` only chooses the branch), so DCE deletes it; a replay extracted
afterwards could not compute the gate and the branch would go unchecked — calls that should take
the other branch would silently get the wrong one (test_compiler_front: the after-DCE variant).
"""
from __future__ import annotations

from ..graph import Graph, GraphModule
from ..graph.node import map_arg
from .tracer import convert_gate

__all__ = ["backward_slice", "extract_replay", "GateReplay"]


def backward_slice(graph: Graph, roots, stop=()) -> set:
    """All nodes the roots depend on (inclusive): reverse reachability, linear time.  Nodes in
    ``stop`` are included but not looked through (the AOT partitioner's graph extraction)."""
    seen = set()
    stop = set(stop)
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.all_input_nodes)
    return seen


def extract_replay(gm: GraphModule, gates) -> "GateReplay | None":
    """Copy the backward slice of the gates' nodes into a replay GraphModule that takes the same
    placeholders as ``gm`` and returns the gate values.  Gates whose node is no longer in the graph
    are reported (and ignored) — this only happens if extraction runs after DCE, which is the bug
    Prop. 3.1 warns about."""
    if not gates:
        return None
    present = set(gm.graph.nodes)
    live = [g for g in gates if g.node in present]
    dropped = [g for g in gates if g.node not in present]
    keep = backward_slice(gm.graph, [g.node for g in live])
    g2 = Graph()
    g2.size_symbols = dict(gm.graph.size_symbols)   # same placeholders: the same size bindings
    env = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in keep:
            if n.op == "output":
                continue
            new = g2.create_node(n.op, n.target, map_arg(n.args, env.__getitem__),
                                 map_arg(n.kwargs, env.__getitem__), name=n.name)
            new.meta = dict(n.meta)
            env[n] = new
    g2.output(tuple(env[g.node] for g in live))
    g2.lint()
    attrs = {k: v for k, v in gm.attrs.items() if any(n.op == "get_attr" and n.target == k for n in g2.nodes)}
    return GateReplay(GraphModule(g2, attrs, name="gate_replay"), live, dropped)


class GateReplay:
    def __init__(self, gm, gates, dropped):
        self.gm, self.gates, self.dropped = gm, gates, dropped

    def check(self, flat_inputs):
        """None if every gate reproduces its recorded outcome, else a description of the first
        that differs."""
        from ...autograd import grad_mode
        with grad_mode.no_grad():
            vals = self.gm(*list(flat_inputs))
        for g, v in zip(self.gates, vals):
            got = convert_gate(g.kind, v, g.convert)
            if got != g.value:
                return f"data gate {g.describe()}: expected {g.value!r}, got {got!r}"
        return None

    def as_text(self):
        return self.gm.code
