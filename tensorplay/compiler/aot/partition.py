"""Partitioning the joint graph: what the forward saves, what the backward recomputes (§5.3–5.5).

The joint graph (:mod:`.joint`) computes the forward outputs and the gradients in one program.  A
partitioner splits it into a **forward graph** (run at the call; it returns the user's outputs and
the values kept for the backward) and a **backward graph** (run at ``backward()``; it reads those
saved values and the output tangents).  Both are ordinary, linted :class:`GraphModule` s built from
the joint graph's nodes (same names, same ``meta``):

    fw_gm   placeholders primals_0..      outputs  (forward outputs..., saved values...)
    bw_gm   placeholders saved..., tangents_0..     outputs  (one gradient per primal, None allowed)

Vocabulary (the sets of §5.4).  ``T`` = nodes that depend on a tangent (they can only run in the
backward); ``F`` = nodes the forward outputs need (they run in the forward); ``B`` = values of
``F`` (or primals) that a node outside ``F`` reads, or that are returned as a gradient; the other
nodes are *unclaimed* (tangent-independent parts of derivative formulas, e.g. ``erf(h/sqrt 2)`` in
the GELU formula): either pass may compute them.  ``U`` ⊆ ``F`` = values that must not be
recomputed: the outputs of ops that are not cheap (see below) and primals.

**Definition 5.1 (feasible saved set).**  ``S`` is feasible if every value the backward needs can be
computed from ``S`` and the tangents alone, recomputing only values outside ``U``.  Consequently
(exercise 10) a value ``v ∈ U ∩ B`` — e.g. a reduction or matmul output the backward reads — is in
every feasible ``S``: it cannot be recomputed, and nothing else can stand in for it.

**Definition 5.2 (rematerialisation network).**  One directed graph over the joint graph's values:
each value ``v`` is split into ``v_in -> v_out`` with capacity ``bytes(v)``; for every data edge
``u -> v`` an edge ``u_out -> v_in`` of infinite capacity; ``source -> v_in`` (infinite) for
primals and for ``v ∈ U``; ``v_in -> sink`` (infinite) for tangent-dependent ``v``;
``v_out -> sink`` (infinite) for gradient outputs.  A finite ``source``/``sink`` cut puts each
value on one side or the other: ``v_in`` on the source side and ``v_out`` on the sink side means
*v is computed in the forward and saved* (the cut edge costs ``bytes(v)``); both on the sink side
means *v is (re)computed in the backward*.  The infinite edges make exactly the feasible saved sets
of Def. 5.1 the finite cuts (Prop. 5.1), so a **minimum cut** — found with
``networkx.minimum_cut`` (max-flow by preflow-push) in polynomial time — is a feasible saved set of
least bytes.  For ``v ∈ U ∩ B`` the paths ``source -> v_in`` and ``v_out -> ... -> sink`` are both
infinite, so every finite cut cuts
``v_in -> v_out``: the *forced-save* rule is a consequence of the network, not a special case.

Cost model (documented, replaceable — invariant 7):

* ``bytes(v) = numel * itemsize`` of ``meta["val"]`` (a bool mask costs a quarter of a float32
  tensor of the same shape); a multi-output node (tuple value) cannot be saved as such (infinite
  capacity: its ``getitem`` projections are saved instead); a non-tensor value likewise;
  ``get_attr`` constants are available to both graphs and are never saved.
* *cheap* ops — the only ones a backward may recompute: op-table ops tagged ``pointwise``, ``view``
  or ``shape`` (copies), non-random ``factory`` ops, and ``getitem`` projections; never ``random``
  or ``nondeterministic`` ops (recomputing a dropout would draw a different mask).  Reductions,
  matmuls, ``nn`` ops (softmax, layer_norm, attention), losses, indexing, scans and sorts are not
  cheap: when the backward reads their forward outputs they are saved.
* recomputation is assumed free (Stax inlines a recomputed pointwise chain into the backward kernel
  that reads it, §6), with one limit: a cheap forward value read by more than
  ``max_recompute_fanout`` (default 4) nodes outside ``F`` is treated as not cheap — each of those
  readers would recompute it.
* a saved *cheap* value costs ``bytes + bytes // CHEAP_SAVE_PENALTY`` (1/64 more): the forward
  must write it, a pass its fused kernel would not otherwise make, where a value that is not cheap
  (a primal, a matmul's or a reduction's output) is in memory anyway and is only kept.  Near-ties
  go to the latter: cross_entropy's backward reads the logits and the (N, 1) row statistics, not
  the (N, C) log-probabilities ``x - lse`` one row of statistics smaller (a GPT step's forward wrote
  them: 1.65 GB more, +0.3 ms on an H200).
* ties: among all minimum cuts we take the one with the **smallest source side** (the nodes
  reachable from ``source`` in the residual network of the maximum flow, which is unique), i.e. the
  values saved as early as possible and the most recomputation.  This is why example 5.1 saves
  ``h = x @ W`` rather than ``erf(h / sqrt 2)`` or the whole GELU derivative, which cost the same
  bytes (table 5.1).

The **default partitioner** does no recomputation: the forward computes ``F``, the backward
everything else, and the saved set is ``B`` (what the backward reads).

Both return a :class:`Partition`; ``saved`` describes each saved value (name, shape, dtype, bytes)
for ``Lowered`` and the benchmark; ``recomputed`` names the forward values the backward recomputes.

When the memory for saved values has a hard limit, a long chain is reversed by **binomial
checkpointing** (Theorem 5.4, exercise 51): :func:`beta`, :func:`min_slots` and :func:`checkpoint_schedule` at the
end of the module.
"""
from __future__ import annotations

import dataclasses
import operator

import torch

from ..capture.gates import backward_slice
from ..graph import Graph, GraphModule
from ..graph.node import Node, map_arg
from .dispatch_trace import fake_mode_of

__all__ = ["SavedValue", "Partition", "default_partition", "min_cut_partition", "PARTITIONERS",
           "remat_network", "is_cheap", "value_bytes", "format_saved", "MAX_RECOMPUTE_FANOUT", "beta", "min_slots",
           "checkpoint_schedule"]

#: a cheap forward value read by more backward nodes than this is saved rather than recomputed
MAX_RECOMPUTE_FANOUT = 4
#: a saved cheap value costs 1/CHEAP_SAVE_PENALTY more than its bytes (the module doc's cost model)
CHEAP_SAVE_PENALTY = 64

_CHEAP_TAGS = frozenset({"pointwise", "view", "shape"})
_NEVER_RECOMPUTE_TAGS = frozenset({"random", "nondeterministic", "dynamic_shape"})


@dataclasses.dataclass(frozen=True)
class SavedValue:
    """One value the forward keeps for the backward."""
    name: str
    shape: tuple
    dtype: torch.dtype
    nbytes: int
    is_input: bool = False          # a primal (the region's input): saving it keeps it alive

    def __str__(self):
        kind = " (input)" if self.is_input else ""
        return f"{self.name}: {str(self.dtype).replace('torch.', '')}{list(self.shape)}, {self.nbytes} B{kind}"


@dataclasses.dataclass
class Partition:
    fw_gm: GraphModule          # primals -> (forward outputs..., saved values...)
    bw_gm: GraphModule          # (saved values..., tangents...) -> one gradient per primal
    saved: list                 # SavedValue per saved value, in fw_gm output order
    num_fwd_outputs: int
    strategy: str = ""
    recomputed: list = dataclasses.field(default_factory=list)   # names of forward values the backward recomputes

    @property
    def saved_names(self) -> list:
        return [s.name for s in self.saved]

    def saved_bytes(self, include_inputs=True) -> int:
        """Bytes of the saved values (``include_inputs=False``: activations only, no primals)."""
        return sum(s.nbytes for s in self.saved if include_inputs or not s.is_input)

    def describe(self) -> str:
        return format_saved(self.saved, title=f"saved for backward ({self.strategy})")


def format_saved(saved, title="saved for backward") -> str:
    """A small table of saved values (what ``Lowered`` prints)."""
    total = sum(s.nbytes for s in saved)
    act = sum(s.nbytes for s in saved if not s.is_input)
    lines = [f"{title}: {len(saved)} values, {total} B ({act} B besides inputs)"]
    lines += ["  " + str(s) for s in saved]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# cost model
# ---------------------------------------------------------------------------------------------
def value_bytes(node: Node):
    """``numel * itemsize`` of the node's meta value (symbolic sizes at their hints: the sample's
    bytes, no guard recorded); None when it cannot be saved as one tensor."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        return None
    n = v.numel()
    if isinstance(n, torch.SymInt):
        n = n.node.hint
        if n is None:                      # a size without a sample value: not saveable
            return None
    return int(n) * v.element_size()


def _size(s):
    """A saved value's size for :class:`SavedValue`: an int, or (symbolic) its expression."""
    if not isinstance(s, torch.SymInt):
        return int(s)
    e = s.node.shape_env.replace(s.node.expr)
    return int(e) if e.is_Integer else e


def is_cheap(node: Node) -> bool:
    """May the backward recompute this node?  (cheap ops, see the module docstring)"""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    d = node.opdef
    if d is None:
        return False
    tags = d.tags
    if tags & _NEVER_RECOMPUTE_TAGS:
        return False
    if tags & _CHEAP_TAGS:
        return True
    return "factory" in tags


class _Joint:
    """The sets of the module docstring for one joint graph."""

    def __init__(self, joint):
        self.joint = joint
        self.gm = joint.gm
        g = self.gm.graph
        self.nodes = [n for n in g.nodes if n.op != "output"]
        phs = g.placeholders
        self.tangents = [p for p in phs if str(p.target).startswith("tangents")]
        self.primals = [p for p in phs if not str(p.target).startswith("tangents")]
        outs = g.output_node.args[0]
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        nf = joint.num_fwd_outputs
        self.fwd_outputs = list(outs[:nf])
        self.grads = list(outs[nf:])
        if len(self.grads) != len(self.primals):
            raise ValueError(f"partition: the joint graph returns {len(self.grads)} gradients for "
                             f"{len(self.primals)} primals")
        self.tangent_dep = set(self.tangents)
        for n in self.nodes:
            if n not in self.tangent_dep and any(i in self.tangent_dep for i in n.all_input_nodes):
                self.tangent_dep.add(n)
        roots = [o for o in self.fwd_outputs if isinstance(o, Node)]
        roots += [n for n in self.nodes if n.op == "call_function" and n.is_impure and n not in self.tangent_dep]
        self.fwd = _closure(roots, stop=())
        bad = self.fwd & self.tangent_dep
        if bad:
            raise ValueError(f"partition: forward outputs depend on tangents ({sorted(n.name for n in bad)})")
        self.fwd |= set(self.primals)
        # the projections of a forward multi-output node are forward values too (e.g. a dropout mask)
        self.fwd |= {u for n in list(self.fwd) if isinstance(n.meta.get("val"), (tuple, list))
                     for u in n.users if u.op == "call_function" and u.target is operator.getitem}

    def bw_users(self, n):
        return [u for u in n.users if u.op != "output" and u not in self.fwd]

    def unrecomputable(self, n, max_fanout) -> bool:
        """``n ∈ U``: a forward value the backward may not recompute."""
        if n.op == "placeholder":
            return n not in self.tangent_dep
        if n.op == "get_attr" or n not in self.fwd:
            return False
        if not is_cheap(n):
            return True
        return max_fanout is not None and len(self.bw_users(n)) > max_fanout


def _closure(roots, stop) -> set:
    """Nodes needed to compute ``roots`` (inclusive), not looking past ``stop``."""
    return backward_slice(None, roots, stop)


# ---------------------------------------------------------------------------------------------
# the two partitioners
# ---------------------------------------------------------------------------------------------
def default_partition(joint) -> Partition:
    """Save what the backward reads: ``F`` in the forward, everything else in the backward."""
    a = _Joint(joint)
    saved = set()
    for n in a.nodes:
        if n in a.fwd or n.op == "get_attr":
            continue
        saved.update(i for i in n.all_input_nodes if i in a.fwd)
    saved.update(g for g in a.grads if isinstance(g, Node) and g in a.fwd)
    return _build(a, saved, "default")


def remat_network(joint, *, max_recompute_fanout=MAX_RECOMPUTE_FANOUT):
    """The network of Def. 5.2 as a ``networkx.DiGraph`` (nodes ``"source"``, ``"sink"``,
    ``"<name>_in"``, ``"<name>_out"``; an edge without ``capacity`` is infinite)."""
    return _network(_Joint(joint), max_recompute_fanout)


def _network(a: _Joint, max_fanout):
    import networkx as nx
    G = nx.DiGraph()
    G.add_node("source")
    G.add_node("sink")
    for n in a.nodes:
        if n.op == "get_attr":
            continue
        nin, nout = n.name + "_in", n.name + "_out"
        b = value_bytes(n)
        fixed = a.unrecomputable(n, max_fanout)
        if b is None:
            G.add_edge(nin, nout)
        else:
            G.add_edge(nin, nout, capacity=b if fixed else b + b // CHEAP_SAVE_PENALTY)
        if fixed:
            G.add_edge("source", nin)
        if n in a.tangent_dep:
            G.add_edge(nin, "sink")
        for i in n.all_input_nodes:
            if i.op != "get_attr":
                G.add_edge(i.name + "_out", nin)
    for gr in a.grads:
        if isinstance(gr, Node) and gr.op != "get_attr":
            G.add_edge(gr.name + "_out", "sink")
    return G


def min_cut_partition(joint, *, max_recompute_fanout=MAX_RECOMPUTE_FANOUT) -> Partition:
    """Save a minimum-bytes feasible set (Def. 5.1) found as a minimum cut of Def. 5.2's network;
    recompute the rest of what the backward needs.  See the module docstring for the cost model."""
    import networkx as nx
    a = _Joint(joint)
    G = _network(a, max_recompute_fanout)
    # networkx.minimum_cut returns the cut nearest to the sink (its sink side is the set of nodes that
    # reach the sink in the residual network).  Ties must go the other way — the smallest source side,
    # save early and recompute (table 5.1: h, not the GELU derivative) — so it runs on the reversed
    # network, whose "sink" is our source.
    try:
        _, (_, side) = nx.minimum_cut(G.reverse(copy=False), "sink", "source")
    except nx.NetworkXUnbounded:
        raise RuntimeError("min-cut partition: no finite cut — the backward needs a value that can neither "
                           "be saved (not a single tensor) nor recomputed: "
                           + ", ".join(n.name for n in a.nodes if value_bytes(n) is None and n in a.fwd)) from None
    saved = {n for n in a.nodes if n.op != "get_attr" and n.name + "_in" in side and n.name + "_out" not in side}
    return _build(a, saved, "min_cut")


#: name -> partitioner; ``tp.compile`` uses the option ``aot.partitioner`` (compiler/config.py; default "min_cut")
PARTITIONERS = {"default": default_partition, "min_cut": min_cut_partition}


# ---------------------------------------------------------------------------------------------
# building the two graphs
# ---------------------------------------------------------------------------------------------
def _build(a: _Joint, saved: set, strategy: str) -> Partition:
    order = {n: i for i, n in enumerate(a.nodes)}
    saved = sorted(saved, key=order.__getitem__)
    for s in saved:
        if s in a.tangent_dep:
            raise RuntimeError(f"partition ({strategy}): saved value {s.name} depends on a tangent")
        if value_bytes(s) is None:
            raise RuntimeError(f"partition ({strategy}): cannot save {s.name} (not a single tensor of known size)")
    mode = fake_mode_of(a.gm)
    env = None if mode is None else mode.shape_env
    if env is not None:       # a size the backward uses but no saved value carries: save an input that does
        saved += _size_carriers(a, saved, env)
    fw = _extract(a, a.primals, a.fwd_outputs + saved, f"{strategy}_forward", env)
    bw = _extract(a, saved + a.tangents, a.grads, f"{strategy}_backward", env)
    fw_names = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    recomputed = [n.name for n in bw.graph.nodes if n.op == "call_function" and n.name in fw_names]
    descr = []
    for s in saved:
        v = s.meta["val"]
        descr.append(SavedValue(s.name, tuple(_size(d) for d in v.shape), v.dtype, value_bytes(s),
                                s.op == "placeholder"))
    return Partition(fw, bw, descr, len(a.fwd_outputs), strategy, recomputed)


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _size_carriers(a: _Joint, saved, env) -> list:
    """Primals to save besides ``saved`` so that every size symbol the backward uses is a size of
    one of its inputs (the backward reads its sizes from its inputs: ``Graph.size_symbols``)."""
    from .sizes import unbound_symbols
    probe = _extract(a, saved + a.tangents, a.grads, "probe", None)
    missing = unbound_symbols(probe.graph, env)
    extra = []
    for sym in sorted(missing, key=str):
        for p in a.primals:
            v = p.meta.get("val")
            if p not in saved and p not in extra and isinstance(v, torch.Tensor) and any(
                    isinstance(d, torch.SymInt) and sym in (d.node.expr, env.replace(d.node.expr)) for d in v.shape):
                extra.append(p)
                break
    return extra


def _extract(a: _Joint, inputs, outputs, name, shape_env=None) -> GraphModule:
    """A new GraphModule computing ``outputs`` from ``inputs`` with the joint graph's nodes."""
    ins = list(dict.fromkeys(inputs))
    needed = _closure([o for o in outputs if isinstance(o, Node)], stop=ins)
    missing = [n for n in needed if n.op == "placeholder" and n not in ins]
    if missing:
        raise RuntimeError(f"partition: {name} needs {sorted(n.name for n in missing)}, which it does not receive")
    g = Graph()
    env: dict = {}
    attrs = {}
    for i in ins:
        new = g.placeholder(i.name)
        new.meta = dict(i.meta)
        env[i] = new
    for n in a.nodes:
        if n not in needed or n in env:
            continue
        if n.op == "get_attr":
            attrs[n.target] = _attr(a.gm, n.target)
            new = g.get_attr(n.target)
        else:
            new = g.create_node(n.op, n.target, map_arg(n.args, env.__getitem__),
                                map_arg(n.kwargs, env.__getitem__), name=n.name)
        new.meta = dict(n.meta)
        env[n] = new
    g.output(tuple(env[o] if isinstance(o, Node) else o for o in outputs))
    g.lint()
    if shape_env is not None:
        from .sizes import bind_sizes
        bind_sizes(g, shape_env, what=name.replace("_", " ") + " graph")
    return GraphModule(g, attrs, name=name)


# ---------------------------------------------------------------------------------------------
# storage-limited chains: binomial checkpointing (Theorem 5.4, exercise 51)
# ---------------------------------------------------------------------------------------------
def beta(s: int, t: int) -> int:
    """Theorem 5.4: the longest chain ``x_0 -> x_1 -> ... -> x_l`` whose steps can be reversed with
    ``s`` checkpoint slots (besides the input ``x_0``, always available) when no step is evaluated
    forward more than ``t`` times: ``beta(s, t) = C(s + t, s)``.  (Pascal's rule is the recursion of
    :func:`checkpoint_schedule`: advance ``m <= beta(s, t-1)`` steps, checkpoint, reverse the right
    part with one slot less, then the left part with one repetition less.)"""
    import math
    if s < 0 or t < 0:
        raise ValueError(f"beta(s={s}, t={t}): s and t must be >= 0")
    return math.comb(s + t, s)


def min_slots(length: int, t: int) -> int:
    """The fewest checkpoint slots that reverse a chain of ``length`` steps with at most ``t``
    forward evaluations per step (smallest ``s`` with ``beta(s, t) >= length``)."""
    if length < 1:
        raise ValueError(f"min_slots: chain length must be >= 1, got {length}")
    if t < 1 and length > 1:
        raise ValueError(f"min_slots(length={length}, t={t}): a chain longer than 1 needs t >= 1")
    s = 0
    while beta(s, t) < length:
        s += 1
    return s


def checkpoint_schedule(length: int, s: int, t: int) -> list:
    """A reversal order for a chain of ``length`` steps with ``s`` slots and ``t`` repetitions
    (Theorem 5.4; ``length <= beta(s, t)``).  Actions, in order: ``("advance", i)`` evaluates step i
    (x_i -> x_{i+1}), ``("store", i)`` / ``("free", i)`` put x_i into / take it out of a slot,
    ``("restore", i)`` makes x_i current again, ``("reverse", i)`` runs the adjoint of step i (it
    needs x_i current).  The reverses come in the order length-1, ..., 0."""
    if length > beta(s, t):
        raise ValueError(f"checkpoint_schedule: a chain of {length} steps needs beta(s, t) >= {length}; "
                         f"beta({s}, {t}) = {beta(s, t)}")
    out: list = []

    def rev(a, n, s, t):
        if n == 1:
            out.append(("reverse", a))
            return
        m = max(1, n - beta(s - 1, t))          # smallest left part whose right part fits in s-1 slots
        for i in range(a, a + m):
            out.append(("advance", i))
        out.append(("store", a + m))
        rev(a + m, n - m, s - 1, t)
        out.append(("free", a + m))
        out.append(("restore", a))
        rev(a, m, s, t - 1)
    if length >= 1:
        rev(0, length, s, t)
    return out
