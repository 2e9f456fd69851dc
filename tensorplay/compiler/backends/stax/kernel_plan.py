"""Kernel planning: one fused group -> a :class:`KernelPlan` (the chapter, §6.3–§6.8, §7.4, §8.1).

The scheduler (scheduler.py) hands over groups of nodes with an iteration space ``(outer,
inner)`` and a placement per node; a device backend prints kernels.  Between them sits the plan,
plain data that says *what* a kernel does, for any device:

* the **loop nest**: the group's index variables ``x0.., r0..`` (``scheduler.kernel_vars``) in
  memory order (a purely elementwise group runs along the unit stride of what it stores), then
  merged (Prop. 6.3: adjacent loops ``a`` outside ``b`` merge when every access has ``coeff(a) ==
  coeff(b) * size(b)``) into the loops ``xm0.., rm0..`` of the kernel (:class:`Loop`);
* the **nodes**: placement (``inner`` / ``reduce`` / ``outer``), **phase** (a node reading a row
  value of the same kernel runs in a later phase of the row: two passes, §7.4), where its value
  lives (``memory``, a ``register`` of the iteration, or a per-row ``scratch`` array when a later
  phase reads it), and for a reduction its kind, accumulator dtype and the sibling whose
  accumulator computes it (``leader``: the outputs of one argmax / Welford share one);
* every **access**: each buffer read and written with its index expression (over the group's
  index variables; :meth:`KernelPlan.translate` gives it in the loop variables) and, for a masked
  load, the condition under which it is made;
* the **bounds** (§6.8, bounds.py): every access is proved in range here (a data-dependent one
  that cannot be proved is checked at run time: ``checked_loads``) and the index width is chosen
  (``index_dtype``: int32 when every index, partial sum and loop counter fits);
* ``column_candidate``: a reduction over non-trailing dims whose reduced loop is strided while
  every access is contiguous (or constant) in the last outer loop -- its lanes could run across
  output columns (*column mode*); whether they do is a device decision.

Sizes in a plan (loop sizes, buffer extents) are expressions (sizevars.py): a merge is made only
when it is proved for every size; the memory order weighs strides at the size hints; the bounds
proofs hold for every value of the size symbols in their ranges (bounds.py: interval end points
are expressions, ordered by proofs), and int32 indices are chosen only when the ranges are
bounded so that every index fits (a symbol without an upper bound gives int64).

Guarantee: the plan is a function of the scheduler's group alone (no device numbers in it); the
device's own decisions (parallel depth, vector lanes, column mode, accumulators, cascades) go into
``device``, filled by the backend (cpp/plan.py for the CPU), and the renderer only prints.
``TP_STAX_DEBUG=plan`` prints every plan (:func:`format_plan`).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import sympy
import torch

from .bounds import Interval, IndirectIndex, bound, check_access, index_type, lane_bound, magnitude, record_accesses
from .ir import FixedLayout, Unsupported
from .scheduler import Group, kernel_index, kernel_vars
from .sizevars import is_size_expr, size_hint, statically_known_equals

__all__ = ["KernelPlan", "Loop", "Access", "NodePlan", "ReductionPlan", "Phase", "BufferFacts", "plan_kernel",
           "format_plan"]

#: > the largest step of a generated loop (a cascade block: 64 * 4 * VL): the loop counters' margin
LOOP_STEP_MARGIN = 1 << 16


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of the kernel's nest: ``var`` runs over ``[0, size)`` and stands for the group's
    index variables ``merged`` (outermost first; more than one: merged loops, Prop. 6.3)."""
    var: sympy.Symbol
    size: sympy.Expr
    merged: tuple


@dataclasses.dataclass(frozen=True)
class Access:
    """``buffer[index]`` read (``kind="load"``) or written (``"store"``) by ``node``; ``index`` is
    over the group's index variables.  ``mask``: the condition under which a masked load is
    made (None: always, or a mask bounds.py cannot read)."""
    kind: str
    buffer: str
    index: sympy.Expr
    node: str
    mask: object = None


@dataclasses.dataclass(frozen=True)
class ReductionPlan:
    """A reduction node: ``kind`` (ir.Reduction.TYPES), which ``output`` of it the node is, the
    dtype its accumulator holds (argmax/argmin: of the values compared; any/all: bool), the dtype
    of the reduced values, and the ``leader``: the node of the same phase whose accumulator
    computes this one (itself, or the first sibling of a multi-result reduction)."""
    kind: str
    output: object
    acc_dtype: torch.dtype
    src_dtype: torch.dtype
    leader: str


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """One node of the group.  ``storage``: ``memory`` (stored at ``store``), ``register`` (a local
    value of the iteration or row) or ``scratch`` (a local read by a later phase: a per-row
    array).  ``index``: the (index, reduction index) its compute function is called with.  ``ir``
    is the scheduler node (its compute function, for the renderer)."""
    name: str
    placement: str
    phase: int
    storage: str
    dtype: torch.dtype
    index: tuple
    store: Access = None
    reduction: ReductionPlan = None
    ir: object = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Phase:
    """The nodes of one phase, program order: ``inner`` (inner and reduce placements, computed in
    the inner loops), ``reductions`` (the reduce ones among them) and ``outer`` (row values
    computed after the inner loops)."""
    number: int
    nodes: tuple
    inner: tuple
    reductions: tuple
    outer: tuple


@dataclasses.dataclass(frozen=True)
class BufferFacts:
    """A buffer the kernel touches: element dtype, elements of storage it spans (an expression),
    bytes at the size hints (for the device's heuristics; 0 for a constant)."""
    dtype: torch.dtype
    extent: sympy.Expr
    nbytes: int


@dataclasses.dataclass
class KernelPlan:
    """What one kernel does (module doc).  ``iteration``: the group's (outer, inner) sizes;
    ``index_vars``: its (outer, inner) index variables; ``loop_order``: those variables in the
    order of the nest before merging, ``n_outer`` of them outer."""
    iteration: tuple
    index_vars: tuple
    loop_order: tuple
    n_outer: int
    outer_loops: tuple
    inner_loops: tuple
    nodes: dict
    phases: tuple
    accesses: tuple
    index_exprs: tuple
    index_dtype: torch.dtype
    buffers: dict
    checked_loads: frozenset
    locals: frozenset
    scratch: tuple
    column_candidate: bool
    device: object = None     # the device backend's decisions (cpp/plan.CppPlan on the CPU)

    @property
    def reads(self):
        return tuple(a for a in self.accesses if a.kind == "load")

    @property
    def writes(self):
        return tuple(a for a in self.accesses if a.kind == "store")

    @property
    def has_reduction(self):
        return any(n.placement == "reduce" for n in self.nodes.values())

    @functools.cached_property
    def substitution(self) -> dict:
        """Index variable -> loop variable: a merged loop stands for its innermost variable, the
        others become 0 (exact for every access: the merge condition)."""
        subs = {}
        for loop in self.outer_loops + self.inner_loops:
            for v in loop.merged[:-1]:
                subs[v] = 0
            subs[loop.merged[-1]] = loop.var
        return subs

    def translate(self, expr):
        """An index over the group's index variables, in the loop variables."""
        e = sympy.expand(sympy.sympify(expr))
        subs = self.substitution
        return e.xreplace(subs) if subs else e


# ---- building a plan ------------------------------------------------------------------------------------
def plan_kernel(sched, group) -> KernelPlan:
    """The plan of one fused (non-extern) group of ``sched``.  Raises Unsupported when a node has
    no placement in the group's iteration space or an access cannot be proved in range."""
    sig = sched.kernel_sig(group)
    placements = {n.name: Group.placement(n, sig) for n in group.nodes}
    if any(p is None for p in placements.values()):
        raise Unsupported(f"node placement in group {group}")
    xs, rs = kernel_vars(sig)
    local = sched.local_buffers(group)
    index = {n.name: kernel_index(n, placements[n.name], sig) for n in group.nodes}
    accesses, index_exprs = _accesses(group, placements, index, local)
    facts = _buffer_facts(sched, group, accesses)
    index_dtype, checked = _check_bounds(sig, xs, rs, accesses, index_exprs, facts, local)
    exprs = [a.index for a in accesses] + list(index_exprs)
    order, sizes, n_out = _memory_order(group, sig, xs, rs, placements, accesses)
    outer = _merge(order[:n_out], sizes[:n_out], exprs, "xm")
    inner = _merge(order[n_out:], sizes[n_out:], exprs, "rm")
    phase = _phases(group, placements)
    scratch = tuple(n.name for n in group.nodes if n.name in local and placements[n.name] == "inner"
                    and any(phase[o.name] > phase[n.name] for o in group.nodes if n.name in o.reads))
    nodes = {}
    for n in group.nodes:
        storage = "scratch" if n.name in scratch else "register" if n.name in local else "memory"
        store = next((a for a in accesses if a.kind == "store" and a.node == n.name), None)
        nodes[n.name] = NodePlan(n.name, placements[n.name], phase[n.name], storage, n.buf.layout.dtype,
                                 index[n.name], store, None, n)
    phases = []
    for p in range(1 + max(phase.values(), default=0)):
        ns = [n for n in group.nodes if phase[n.name] == p]
        inner_ns = [n.name for n in ns if placements[n.name] in ("inner", "reduce")]
        reds = [n for n in ns if placements[n.name] == "reduce"]
        for n, leader in _leaders(reds).items():
            nodes[n] = dataclasses.replace(nodes[n], reduction=_reduction(sched.by_name[n], leader))
        phases.append(Phase(p, tuple(n.name for n in ns), tuple(inner_ns), tuple(n.name for n in reds),
                            tuple(n.name for n in ns if placements[n.name] == "outer")))
    plan = KernelPlan(sig, (tuple(xs), tuple(rs)), tuple(order), n_out, outer, inner, nodes, tuple(phases),
                      tuple(accesses), tuple(index_exprs), index_dtype, facts, frozenset(checked),
                      frozenset(local), scratch, False)
    plan.column_candidate = _column_candidate(plan)
    return plan


def _accesses(group, placements, index, local):
    """Every (buffer, index) access of the group over its index variables, node by node (its
    loads, then its store if it reaches memory), and the ``ops.index_expr`` arguments (they pin
    the loops they use: no merging across them)."""
    accesses, index_exprs = [], []
    for n in group.nodes:
        idx = index[n.name]
        rec = record_accesses(n.buf.data.inner_fn, *(idx if n.is_reduction else idx[:1]))
        accesses += [Access("load", name, e, n.name, cond) for name, e, cond in rec.loads]
        index_exprs += rec.index_exprs
        if n.name not in local:
            accesses.append(Access("store", n.name, n.buf.layout.index(idx[0]), n.name))
    return accesses, index_exprs


def _buffer_facts(sched, group, accesses):
    graph = sched.graph
    wanted = {a.buffer for a in accesses} | {n.name for n in group.nodes}
    facts = {}
    for b in list(graph.inputs) + list(graph.buffers):
        if b.name in wanted:
            facts[b.name] = BufferFacts(b.layout.dtype, b.layout.storage_extent(), sched.buffer_bytes(b.name))
    for name, t in graph.constants.items():
        if name in wanted:
            extent = FixedLayout(t.dtype, t.device, t.shape, t.stride()).storage_extent()
            facts[name] = BufferFacts(t.dtype, extent, sched.buffer_bytes(name))
    return facts


def _check_bounds(sig, xs, rs, accesses, index_exprs, facts, local):
    """§6.8: prove every access in range (no run-time checks) and pick the index width.  Returns
    (index dtype, buffers whose data-dependent loads are checked at run time)."""
    outer, inner = list(sig[0]), list(sig[1])      # (expressions of the size symbols when symbolic)
    ranges = {v: (0, n - 1) for v, n in zip(xs, outer)}
    ranges.update({v: (0, n - 1) for v, n in zip(rs, inner)})
    ivs, checked = [], set()
    nonempty = not any(Interval(lo, hi).empty() for lo, hi in ranges.values())
    for a in accesses:
        if a.buffer in local:
            continue
        try:
            check_access(a.buffer, a.index, ranges, facts[a.buffer].extent, a.mask)   # a masked load: where its mask holds
        except Unsupported:
            if not a.index.atoms(IndirectIndex):
                raise
            # a data-dependent access bounds.py cannot prove: every indirect load of this buffer
            # checks its element offsets in the kernel
            checked.add(a.buffer)
        if nonempty:
            ivs.append(lane_bound(a.index, ranges))   # computed in every lane (masked or not): sets the width
    if nonempty:
        ivs += [lane_bound(e, ranges) for e in index_exprs]
        # every partial sum formed on the way (|term| maxima added up), and the loop counters: a
        # merged loop runs to the product of its sizes and a vector loop tests `rm0 + 2 * VL <=
        # size` -- an expanded input (stride 0) has small indices over a huge loop
        # (x.expand(1, 2**31 - 1).sum(-1) looped forever with int32 counters)
        ivs += [Interval(-m, m) for m in (magnitude(a.index, ranges) for a in accesses)]
        ivs.append(Interval(0, math.prod(outer) * math.prod(inner) + LOOP_STEP_MARGIN))
    return (torch.int32 if index_type(ivs) == "int32_t" else torch.int64), checked


def _memory_order(group, sig, xs, rs, placements, accesses):
    """Loop order of a purely elementwise group: its variables sorted by the stride of its stored
    buffers, largest outermost (stable), so that the innermost loop runs along the unit stride
    of what it writes -- ``x.t().exp()`` keeps eager's column-major output and reads and writes it
    contiguously instead of gathering and scattering.  Returns the nest's (vars, sizes) and how
    many of them are outer loops (the rest are the inner ones)."""
    outer, inner = sig
    vars_, sizes = list(xs) + list(rs), list(outer) + list(inner)
    keep = vars_, sizes, len(xs)
    if group.sig[0] != "pw" or any(p != "inner" for p in placements.values()) or len(vars_) < 2:
        return keep
    produced = {n.name for n in group.nodes}
    stores = [a.index for a in accesses if a.buffer in produced]
    if not stores:
        return keep

    def stride(v):   # at the size hints: this order is a heuristic
        cs = [sympy.diff(e, v) for e in stores]
        return min(abs(size_hint(c)) for c in cs) if all(is_size_expr(c) for c in cs) else None
    st = [stride(v) for v in vars_]
    if None in st or st[-1] == min(st):
        return keep
    order = sorted(range(len(vars_)), key=lambda k: -st[k])
    return [vars_[k] for k in order], [sizes[k] for k in order], len(vars_) - 1


def _merge(vars_, sizes, exprs, prefix):
    """Prop. 6.3: merge adjacent loops (a outer, b inner) when every access has coeff(a) ==
    coeff(b) * size(b).  Returns the loops ``<prefix>0, <prefix>1, ...``."""
    groups = [[v] for v in vars_]
    gsizes = list(sizes)
    i = 0
    while i + 1 < len(groups):
        a, b = groups[i][-1], groups[i + 1][-1]
        ok = True
        for e in exprs:
            ca, cb = sympy.diff(e, a), sympy.diff(e, b)   # the merge must hold for every size: proved
            if not (is_size_expr(ca) and is_size_expr(cb)) or not statically_known_equals(ca, cb * gsizes[i + 1]):
                ok = False
                break
        if ok and len(groups[i + 1]) == 1:
            groups[i] = groups[i] + groups[i + 1]
            gsizes[i] = gsizes[i] * gsizes[i + 1]
            del groups[i + 1]
            del gsizes[i + 1]
        else:
            i += 1
    return tuple(Loop(sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True), size, tuple(grp))
                 for k, (grp, size) in enumerate(zip(groups, gsizes)))


def _phases(group, placements):
    """Node -> phase: a node runs in the phase after the row values (reduce / outer nodes) it
    reads -- an outer node in the same phase as them, after the inner loops -- and in the phase
    of the inner values it reads."""
    ph = {}
    for n in group.nodes:
        pl = placements[n.name]
        p = 0
        for r in n.reads:
            if r in ph:
                rp, rpl = ph[r], placements[r]
                if rpl in ("reduce", "outer"):
                    p = max(p, rp + (0 if pl == "outer" else 1))
                else:
                    p = max(p, rp)
        ph[n.name] = p
    return ph


def _leaders(reds):
    """Reduction name -> the node whose accumulator computes it: the siblings of a multi-result
    reduction (Reduction.multi: one ``inner_fn``) share the first one's."""
    leader, first = {}, {}
    for n in reds:
        r = n.buf.data
        key = (r.reduction_type, id(r.inner_fn)) if r.reduction_type in r.OUTPUTS else n.name
        leader[n.name] = first.setdefault(key, n).name
    return leader


def _reduction(n, leader):
    r = n.buf.data
    acc = torch.bool if r.reduction_type in ("any", "all") else \
        r.src_dtype if r.reduction_type in ("argmax", "argmin") else r.dtype
    return ReductionPlan(r.reduction_type, r.output, acc, r.src_dtype, leader)


def _column_candidate(plan):
    """Could the lanes run across the last outer loop (column mode)?  When the group has a
    reduction whose innermost reduced loop walks memory with a stride (coefficient != 1) for
    some load, and every access to memory has coefficient 0 or 1 in the last outer loop: then VL
    output columns can be computed at once with plain vector loads instead of gathers.  Groups
    needing a scratch array, indirect indices or Mod/floor of the column variable cannot."""
    if not (plan.outer_loops and plan.inner_loops) or plan.scratch or not plan.has_reduction:
        return False
    xl, rl = plan.outer_loops[-1].var, plan.inner_loops[-1].var
    strided = False
    for a in plan.accesses:
        if a.buffer in plan.locals:
            continue
        t = plan.translate(a.index)
        if t.atoms(IndirectIndex) or any(xl in m.free_symbols for m in t.atoms(sympy.Mod, sympy.floor)):
            return False
        c, cr = sympy.diff(t, xl), sympy.diff(t, rl)
        if not (is_size_expr(c) and (statically_known_equals(c, 0) or statically_known_equals(c, 1))):
            return False
        if a.buffer not in plan.nodes and cr != 1:
            strided = True
    return strided


# ---- TP_STAX_DEBUG=plan --------------------------------------------------------------------------------------
def _dt(dtype):
    return str(dtype).replace("torch.", "")


def format_plan(plan: KernelPlan, name: str = "kernel") -> str:
    """A readable multi-line description of a plan (TP_STAX_DEBUG=plan)."""
    outer, inner = plan.iteration
    lines = [f"{name}: rows {list(outer)} x inner {list(inner)}, index {_dt(plan.index_dtype)}"]

    def loops(ls):
        return ", ".join(f"{lp.var} < {lp.size}" + (f" (merges {', '.join(map(str, lp.merged))})"
                                                     if len(lp.merged) > 1 else f" ({lp.merged[0]})")
                         for lp in ls) or "-"
    lines.append(f"  loops: outer {loops(plan.outer_loops)}; inner {loops(plan.inner_loops)}")
    if [str(v) for v in plan.loop_order] != [str(v) for v in plan.index_vars[0] + plan.index_vars[1]]:
        lines.append(f"  memory order: {', '.join(map(str, plan.loop_order))}")
    for ph in plan.phases:
        lines.append(f"  phase {ph.number}: inner {list(ph.inner)}, outer {list(ph.outer)}")
        for n in (plan.nodes[k] for k in ph.nodes):
            red = n.reduction
            what = f"{red.kind}{'.' + red.output if red.output else ''} acc {_dt(red.acc_dtype)}" + \
                ("" if red.leader == n.name else f" (accumulator of {red.leader})") if red else ""
            store = f" -> {n.store.buffer}[{plan.translate(n.store.index)}]" if n.store else ""
            lines.append(f"    {n.name:8s} {n.placement:6s} {_dt(n.dtype):8s} {n.storage:8s}{store} {what}".rstrip())
    for a in plan.reads:
        mask = f"  if {a.mask}" if a.mask is not None else ""
        local = " (local)" if a.buffer in plan.locals else ""
        lines.append(f"  read  {a.buffer}[{plan.translate(a.index)}]{local} by {a.node}{mask}")
    extra = []
    if plan.checked_loads:
        extra.append(f"checked loads {sorted(plan.checked_loads)}")
    if plan.scratch:
        extra.append(f"scratch {list(plan.scratch)}")
    if plan.column_candidate:
        extra.append("column candidate")
    if extra:
        lines.append("  " + "; ".join(extra))
    if plan.device is not None and hasattr(plan.device, "describe"):
        lines.append("  device: " + plan.device.describe())
    return "\n".join(lines)


def model_cost(plan: KernelPlan, sizevars) -> list:
    """``[bytes, flops]`` of one call of the kernel at the size hints: the model the profiler and the
    roofline place a kernel by (seed 001 §1-3; the chapter §13.2).  Bytes: every buffer the kernel
    reads or writes in memory, each counted once (``BufferFacts.nbytes``; kernel-local values move
    nothing).  FLOPs: per node, the compute calls of one element of its function (``choices.price``:
    every ops-handler call but the loads) times the elements it iterates (output elements of a
    pointwise node, input elements of a reduction).  A model, not a hardware count."""
    from .choices import price
    nbytes = sum(f.nbytes for name, f in plan.buffers.items() if name not in plan.locals)
    flops = 0
    for n in plan.nodes.values():
        loops = getattr(n.ir.buf, "data", None)
        if loops is None or not hasattr(loops, "inner_fn"):
            continue
        h = price(loops)
        elems = math.prod(loops.ranges) * math.prod(getattr(loops, "reduction_ranges", ()) or (1,))
        flops += max(h.ops - h.n_loads, 0) * int(sizevars.size_hint(elems))
    return [int(nbytes), int(flops)]
