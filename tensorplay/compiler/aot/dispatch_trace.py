"""Retracing a captured region at the dispatcher level (chapter §5.1; §11.6, step 4).

The front end hands the backend a functionalised GraphModule.  :func:`dispatch_trace` runs that
graph again on **symbolic proxies** (meta tensors: shape, dtype, strides, no data) with the tracer
of :mod:`tensorplay.compiler.capture.tracer` listening to the eager dispatcher, so that every op
goes through the op table once more and is recorded as an op-table ``call_function`` node with a
``meta["val"]``.  Decompositions of ops outside an optional ``basis`` are applied afterwards
(:func:`tensorplay.compiler.passes.decompose.decompose`).  The result is the op-level graph the AOT
layer differentiates (:mod:`.joint`).

Guarantees of :func:`dispatch_trace`:

* the new graph has the same placeholders, in the same order and with the same names;
* its outputs are the region's outputs, then — one per graph input mutated by the region — the
  input's final value: the functionalisation pass's write-backs (``copy_(input, value)`` marked
  ``meta["writeback"]``) are lifted out of the graph, and the runtime applies them
  (``DispatchTrace.mutated_inputs`` lists which input each extra output belongs to);
* the graph is pure (no in-place node), every ``call_function`` node is an op-table call or the
  ``operator.getitem`` projection of a multi-output op, and every node has ``meta["val"]``;
* factory ops traced from formulas that say ``device=x.device`` (which reads ``meta`` on a proxy)
  get the region's real device back (:func:`fix_devices`).

:func:`tracing` is the shared context manager that installs a tracer on the dispatcher (used by the
joint builder to trace derivative formulas into the same graph).
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator

import torch

from ..._tensor import Tensor, _wrap
from ...autograd import grad_mode
from ...ops import registry
from ..capture.fakes import fake_mode_of, is_symbolic
from ..capture.tracer import Tracer
from ..graph import GraphModule
from ..graph.node import map_arg

__all__ = ["dispatch_trace", "DispatchTrace", "tracing", "retrace_nodes", "fix_devices", "meta_like",
           "symbolic_tracer", "is_symbolic", "fake_mode_of", "finish_symbolic"]


@dataclasses.dataclass
class DispatchTrace:
    gm: GraphModule            # op-level, pure; outputs: user outputs, then mutated inputs' new values
    num_user_outputs: int
    mutated_inputs: list       # placeholder index of each extra output


def _hints(sizes):
    """Sizes (ints or SymInts) at the sample's values, recording no guard."""
    return [int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in sizes]


def _empty_meta(d):
    """A meta tensor with ``d``'s dtype and layout (symbolic sizes at their hints)."""
    return torch.empty_strided(_hints(d.shape), _hints(d.stride()), dtype=d.dtype, device="meta")


def meta_like(t) -> Tensor:
    """A tp tensor on the meta device with ``t``'s shape, dtype and strides (a symbolic fake's at
    the hints)."""
    return _wrap(_empty_meta(t._data if isinstance(t, Tensor) else t))


@contextlib.contextmanager
def tracing(tracer: Tracer):
    """Record every eager op call into ``tracer`` (symbolic: ``tracer.execute`` is False), with grad
    mode off so that the traced ops build no autograd history."""
    registry.observers.append(tracer.on_op)
    registry.pre_observers.append(tracer.before_op)
    tracer.active = True
    try:
        with grad_mode.no_grad():
            yield tracer
    finally:
        tracer.active = False
        registry.observers.remove(tracer.on_op)
        registry.pre_observers.remove(tracer.before_op)


def retrace_nodes(gm, inputs, *, on_writeback=None, sym=None) -> tuple[dict, tuple]:
    """Run ``gm``'s nodes on ``inputs`` (proxies) through the dispatcher, inside an active tracer.
    ``sym``: the tracer's :class:`~.sizes.RetraceShapes` when ``gm`` is symbolic (size arguments
    become SymInts of the capture's environment).

    Returns ``(env, outputs)``: ``env`` maps every node of ``gm`` to its value (a proxy, a tuple of
    proxies for multi-output ops, or a Python value).  Write-back nodes are not run: ``on_writeback
    (placeholder_index, value)`` is called instead and the node's value is ``value``."""
    env: dict = {}
    it = iter(inputs)
    ph_index = {}
    outs = ()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            ph_index[n] = len(ph_index)
            env[n] = next(it)
        elif n.op == "get_attr":
            env[n] = getattr(gm, n.target)
        elif n.op == "output":
            outs = map_arg(n.args[0], env.__getitem__)
        elif n.op == "call_function":
            if n.meta.get("writeback"):
                dst, src = n.args[0], n.args[1]
                if dst not in ph_index:
                    raise NotImplementedError(f"AOT: write-back {n.name} into {dst} (not a graph input)")
                val = env[src]
                if on_writeback is None:
                    raise NotImplementedError(f"AOT: the region mutates its input {dst.name} in place")
                on_writeback(ph_index[dst], val)
                env[n] = val
                continue
            args = map_arg(n.args, env.__getitem__)
            kwargs = map_arg(n.kwargs, env.__getitem__)
            if sym is not None:
                args, kwargs = sym.symints(args), {k: sym.symints(v) for k, v in kwargs.items()}
                sym.captured = n.meta.get("val")
            registry.shape_hints.append(_captured_value(n))
            try:
                env[n] = n.target(*args, **kwargs)
            finally:
                registry.shape_hints.pop()
                if sym is not None:
                    sym.captured = None
        else:
            raise NotImplementedError(f"AOT: cannot retrace node {n.name} with opcode {n.op!r}")
    return env, outs


def _captured_value(n):
    """The node's captured output metadata as a maker of meta tensors, for an op whose output shape
    depends on data (a bool-mask index, masked_select): the capture recorded that shape as a data
    gate, so this graph is only ever run with it (registry.shape_hints)."""
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return lambda: _empty_meta(val)
    if isinstance(val, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in val):
        return lambda: type(val)(_empty_meta(v) for v in val)
    return None


def fix_devices(graph, device):
    """Replace ``torch.device('meta')`` arguments (factories traced with ``device=proxy.device``)
    by the region's device.  Returns the number of nodes changed."""
    if device is None or torch.device(device).type == "meta":
        return 0
    device = torch.device(device)
    changed = 0

    def fix(a):
        if isinstance(a, torch.device) and a.type == "meta":
            return device
        if isinstance(a, (tuple, list)):
            r = [fix(x) for x in a]
            return tuple(r) if isinstance(a, tuple) else r
        return a
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        args, kwargs = fix(n.args), {k: fix(v) for k, v in n.kwargs.items()}
        if args != n.args or kwargs != n.kwargs:
            n.args, n.kwargs = args, kwargs
            changed += 1
    return changed


def region_device(example_inputs):
    for t in example_inputs:
        if isinstance(t, Tensor):
            return t.device
    return torch.device("cpu")


def symbolic_tracer(gm, extra_fakes=()) -> Tracer:
    """A symbolic-proxy tracer (execute=False) for retracing ``gm``; when ``gm`` is symbolic (a
    ``dynamic=True`` capture) its ops also run on the capture's fakes, placeholders first being
    ``gm``'s own, then ``extra_fakes`` (:mod:`.sizes`)."""
    tr = Tracer(execute=False)
    mode = fake_mode_of(gm)
    if mode is not None:
        from .sizes import RetraceShapes
        tr.sym = RetraceShapes(mode, [p.meta["val"] for p in gm.graph.placeholders] + list(extra_fakes))
    return tr


def finish_symbolic(tr: Tracer, what):
    """End of a symbolic retrace: ``meta["val"]`` are the fakes, ``size_symbols`` bound."""
    if tr.sym is not None:
        from .sizes import bind_sizes, use_symbolic_meta
        use_symbolic_meta(tr.graph)
        bind_sizes(tr.graph, tr.sym.env, what=what)


def dispatch_trace(gm, example_inputs, *, basis=None, decompose_if=None, name="aot_forward") -> DispatchTrace:
    """Retrace ``gm`` (functionalised) at the dispatcher level (see the module docstring)."""
    tr = symbolic_tracer(gm)
    names = [n.name for n in gm.graph.placeholders]
    if len(names) != len(example_inputs):
        raise ValueError(f"dispatch_trace: the graph has {len(names)} inputs, got {len(example_inputs)} examples")
    proxies = [tr.placeholder(nm, meta_like(t)) for nm, t in zip(names, example_inputs)]
    mutated, new_vals = [], []

    def on_writeback(i, v):
        mutated.append(i)
        new_vals.append(v)
    with tracing(tr):
        _, outs = retrace_nodes(gm, proxies, on_writeback=on_writeback, sym=tr.sym)
        out_nodes = [tr.node_of(o) for o in list(outs) + new_vals]
    tr.graph.output(tuple(out_nodes))
    fix_devices(tr.graph, region_device(example_inputs))
    finish_symbolic(tr, "forward graph")
    tr.graph.lint()
    new = GraphModule(tr.graph, dict(tr.constants), name=name)
    tr.release()
    if basis is not None or decompose_if is not None:
        from ..passes.dce import dce
        from ..passes.decompose import decompose, decompose_nodes
        decompose(new, basis)
        if decompose_if is not None:      # the backend's choice of nodes (docs/aot.md)
            decompose_nodes(new, decompose_if)
        dce(new)
        new.graph.lint()
        new.recompile()
    return DispatchTrace(new, len(outs), mutated)


def is_getitem(n) -> bool:
    return n.op == "call_function" and n.target is operator.getitem
