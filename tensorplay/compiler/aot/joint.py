"""The joint forward + backward graph of a training region (chapter §5.1–5.2, §5.6).

:func:`build_joint` retraces the region at the dispatcher level (:mod:`.dispatch_trace`) and then
runs reverse-mode differentiation **symbolically**: it walks the op-level forward graph backwards
and calls each op's derivative formula from the op table (``OpDef.backward``) on proxies, with the
same tracer listening, so the formulas — written in tp ops — are recorded into the same graph.  The
result is one graph

    placeholders  primals_0 .. primals_{n-1}     (the region's flat inputs, in order)
                  tangents_0 .. tangents_{k-1}   (one per differentiable forward output)
    output        (forward outputs..., one gradient per primal (None where there is none))

and every ``call_function`` node is an op-table call (or the ``getitem`` projection of a
multi-output op) with ``meta["val"]``; random ops keep their op-table tag ``random``.

The walk follows the eager engine (:mod:`tensorplay.autograd.engine`) exactly, so that the
``aot_eager`` backend is bit-for-bit equal to eager autograd:

* a value *requires grad* when it is a floating (or complex) output of a differentiable op with an
  input that requires grad; primals require grad as their example inputs do (with grad mode on);
* nodes are visited in reverse program order — the order in which the engine runs them (it pops the
  latest-created ready node, and a node's consumers are all created after it) — and the gradient
  contributions to a value are summed in arrival order, ``((g_last + g_prev) + ...)``, as the
  engine's input buffers do; the output tangents are seeded in output order;
* a node that receives no gradient is skipped; a node that receives some gets zeros for its other
  outputs (the engine materialises them the same way); gradients are flattened, shape-checked and
  cast to the input's dtype by the engine's own helper (``_flatten_grads``);
* the formula's ``ctx`` gives every argument (as a proxy: a formula that only reads ``.shape``
  creates no dependency), ``ctx.result`` and ``ctx.needs_input_grad``.

Inputs that do not require grad get ``None``; outputs that are not differentiable (integer or bool
outputs, values independent of the primals, and the new values of mutated inputs that do not
require grad) get no tangent.  The new value of a mutated input that requires grad is a
differentiable output: the runtime writes it into the input and rebases the input's history on
the compiled node (``mark_dirty``), and the gradient computed for the primal is that of the value
*before* the mutation, as in eager.  Refused (NotImplementedError: the backend then falls back to
eager autograd): such an input that is a view, or whose new value does not require grad.  Views
returned as outputs are fresh tensors in the compiled region (values, not identities, as after
functionalisation); their gradients flow through the view ops' formulas like any other.

After tracing, the front end's pass pipeline (functionalisation, simplification, CSE, DCE) runs on
the joint graph; it never merges or folds random ops (CSE and constant folding exclude them), so
each random draw stays a single node whose outputs both halves read — the partitioner saves it
(see docs/aot.md on dropout).
"""
from __future__ import annotations

import dataclasses
import operator

import torch

from ..._tensor import Tensor, _wrap
from ...autograd.graph import _flatten_grads, _tensor_slots
from ...ops.registry import OPS
from ..capture.tracer import Tracer
from ..graph import GraphModule
from ..graph.node import Node
from .dispatch_trace import (dispatch_trace, fake_mode_of, finish_symbolic, fix_devices, is_symbolic, meta_like,
                             region_device, retrace_nodes, symbolic_tracer, tracing)

__all__ = ["build_joint", "JointGraph", "requires_grad_map"]


@dataclasses.dataclass
class JointGraph:
    gm: GraphModule                 # primals_*, tangents_* -> (fwd outputs..., grad per primal)
    num_fwd_outputs: int
    primals_requiring_grad: list    # bool per primal
    fwd_output_differentiable: list = dataclasses.field(default_factory=list)  # bool per fwd output
    num_user_outputs: int = 0       # fwd outputs = user outputs, then mutated inputs' new values
    mutated_inputs: list = dataclasses.field(default_factory=list)             # primal index per extra output

    @property
    def num_tangents(self) -> int:
        return sum(self.fwd_output_differentiable)


def _floating(v) -> bool:
    return isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())


def requires_grad_map(gm, primal_rg) -> dict:
    """node -> does its value require grad (the eager rule, see the module docstring)."""
    rg: dict = {}
    it = iter(primal_rg)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            rg[n] = bool(next(it))
        elif n.op == "call_function":
            if n.target is operator.getitem:
                src = n.args[0]
                rg[n] = rg.get(src, False) and _floating(n.meta.get("val"))
                continue
            d = n.opdef
            ins = any(rg.get(i, False) for i in n.all_input_nodes)
            if ins and d is None:
                raise NotImplementedError(f"AOT: node {n.name} calls {n.target_name}, which is not an op-table op, "
                                          f"on a value that requires grad")
            val = n.meta.get("val")
            multi = isinstance(val, (tuple, list))
            rg[n] = bool(ins and d.differentiable and (multi or _floating(val)))
        else:
            rg[n] = False
    return rg


class _JointCtx:
    """What a derivative formula sees while it is traced: ``ctx.<arg>`` (proxies or Python values),
    ``ctx.result`` and ``ctx.needs_input_grad`` — the interface of the engine's SavedCtx (also its
    ``_released`` flag and ``_values``, which formulas that read a saved input's layout use)."""

    _released = False   # a traced formula runs once: never the engine's "backward twice" case

    def __init__(self, op, values, result, needs):
        self._op, self._values, self._result = op, values, result
        self.needs_input_grad = needs

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "result":
            return self._result
        idx = self._op._argidx.get(name)
        if idx is None:
            raise AttributeError(f"autograd formula of tp.{self._op.name}: no argument named {name!r}")
        return self._values[idx]


def _needs(op, slot_nodes, arg_nodes, rg):
    if not op.schema.list_pos:
        return tuple(isinstance(s, Node) and rg[s] for s in slot_nodes)
    out = []
    for i in op._tensorish:
        a = arg_nodes[i]
        if i in op.schema.list_pos:
            out.append(any(isinstance(t, Node) and rg[t] for t in (a or ())))
        else:
            out.append(isinstance(a, Node) and rg[a])
    return tuple(out)


def _zeros(meta, device):
    return OPS["_zeros"].fn(list(meta.shape), dtype=meta.dtype, device=device)


def build_joint(gm, example_inputs, *, basis=None, decompose_if=None, run_passes=True, name="joint") -> JointGraph:
    """The joint graph of the region ``gm`` (functionalised, as the front end produces it) for these
    example inputs (their ``requires_grad`` flags decide what is differentiated).  See the module
    docstring for the layout and the guarantees."""
    from ...autograd import grad_mode
    grad_on = grad_mode.is_grad_enabled()
    primal_rg = [bool(grad_on and getattr(t, "requires_grad", False)) for t in example_inputs]
    fwd = dispatch_trace(gm, example_inputs, basis=basis, decompose_if=decompose_if, name=f"{name}_forward")
    fgm = fwd.gm
    rg = requires_grad_map(fgm, primal_rg)
    out_nodes = list(fgm.graph.output_node.args[0])
    n_user = fwd.num_user_outputs
    for k, i in enumerate(fwd.mutated_inputs):
        new = out_nodes[n_user + k]
        if primal_rg[i] and (getattr(example_inputs[i], "_base", None) is not None
                             or not (isinstance(new, Node) and rg[new])):
            raise NotImplementedError(f"AOT: the region mutates input {i} in place, that input requires grad and "
                                      f"is a view or gets a value without gradient; compiled training does not "
                                      f"support this (it runs in eager instead)")
    # a mutated input that requires grad: its new value is a differentiable output (the runtime
    # rebases the input onto the compiled node, like eager's in-place history)
    differentiable = [isinstance(o, Node) and rg[o] and (i < n_user or primal_rg[fwd.mutated_inputs[i - n_user]])
                      for i, o in enumerate(out_nodes)]
    device = region_device(example_inputs)

    tan_vals = [o.meta["val"] for i, o in enumerate(out_nodes) if differentiable[i]]
    tr = Tracer(execute=False)
    if is_symbolic(fgm):      # symbolic sizes: the tangents are contiguous fakes of the outputs' shapes
        tr = symbolic_tracer(fgm, [_tangent_fake(fgm, v) for v in tan_vals])
    primals = [tr.placeholder(f"primals_{i}", meta_like(t)) for i, t in enumerate(example_inputs)]
    tangents = [tr.placeholder(f"tangents_{k}", _wrap(torch.empty(meta_like(v).shape, dtype=v.dtype, device="meta")))
                for k, v in enumerate(tan_vals)]
    with tracing(tr):
        env, fwd_outs = retrace_nodes(fgm, primals, sym=tr.sym)
        grads: dict = {}

        def acc(node, g):
            prev = grads.get(node)
            grads[node] = g if prev is None else prev + g
        it = iter(tangents)
        for i, o in enumerate(out_nodes):
            if differentiable[i]:
                acc(o, next(it))
        for n in reversed(fgm.graph.nodes):
            if n.op != "call_function" or n.target is operator.getitem or not rg[n]:
                continue
            op = n.opdef
            val = n.meta.get("val")
            if isinstance(val, (tuple, list)):
                gl = [None] * len(val)
                for u in n.users:
                    if u.target is operator.getitem and u in grads:
                        k = u.args[1]
                        gl[k] = grads[u] if gl[k] is None else gl[k] + grads[u]
                res = env[n]
                result = tuple(r for r in res if isinstance(r, Tensor))
                metas = list(val)
            else:
                gl = [grads.get(n)]
                result = env[n]
                metas = [val]
            if all(g is None for g in gl):
                continue
            gl = [g if g is not None or not isinstance(m, torch.Tensor) else _zeros(m, device)
                  for g, m in zip(gl, metas)]
            slot_nodes = _tensor_slots(op, n.args)
            values = [env.get(a, a) if isinstance(a, Node) else _map_env(a, env) for a in n.args]
            if tr.sym is not None:       # size expressions of the node's arguments as SymInts
                values = tr.sym.symints(values)
            ctx = _JointCtx(op, values, result, _needs(op, slot_nodes, n.args, rg))
            # (the engine's shape check compares the sample's sizes: the proxies' data are at the hints)
            slot_meta = tuple((meta_like(s.meta["val"]).shape, s.meta["val"].dtype)
                              if isinstance(s, Node) and rg[s] else None for s in slot_nodes)
            try:
                res = op.backward(ctx, *gl)
                flat = _flatten_grads(op, res, slot_meta)
            except NotImplementedError:
                raise
            except Exception as e:
                raise RuntimeError(f"AOT: tracing the derivative formula of tp.{op.name} (node {n.name}) failed: "
                                   f"{type(e).__name__}: {e}") from e
            for s, g in zip(slot_nodes, flat):
                if g is not None and isinstance(s, Node) and rg[s]:
                    acc(s, g)
        grad_outs = []
        for p in fgm.graph.placeholders:
            g = grads.get(p) if rg[p] else None
            grad_outs.append(g)
        outs = [tr.node_of(o) for o in fwd_outs] + [tr.node_of(g) if g is not None else None for g in grad_outs]
    tr.graph.output(tuple(outs))
    fix_devices(tr.graph, device)
    finish_symbolic(tr, "joint graph")
    tr.graph.lint()
    jgm = GraphModule(tr.graph, dict(tr.constants), name=name)
    tr.release()
    if run_passes:
        from ..passes.pipeline import run_passes as _run
        _run(jgm, basis=basis)
    return JointGraph(jgm, len(fwd_outs), primal_rg, differentiable, n_user, list(fwd.mutated_inputs))


def _tangent_fake(fgm, v):
    """The tangent of symbolic output ``v``: a contiguous fake of its shape in the capture's mode."""
    with fake_mode_of(fgm):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")


def _map_env(a, env):
    from ..graph.node import map_arg
    return map_arg(a, lambda x: env[x])
