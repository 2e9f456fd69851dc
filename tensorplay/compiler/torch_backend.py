"""Stax as a ``torch.compile`` backend: ``torch.compile(model, backend=tensorplay.compiler.torch_backend)``.

TorchDynamo captures a ``torch.fx.GraphModule`` of torch-level calls (``torch.nn.functional.linear``,
``operator.add``, tensor methods, parameters as placeholders) and hands it to the backend with
example inputs.  This backend

1. maps every node onto tensorplay: a ``call_function`` whose target is a torch function found in
   the torch namespaces below is the tp function of the same name (``torch.relu`` -> ``tp.relu``,
   ``torch.nn.functional.linear`` -> ``tp.nn.functional.linear``), so it goes through the one op
   table; ``operator``/builtin targets are applied to tp values as they are (tp.Tensor has the
   operators); ``call_method`` is the ``tp.Tensor`` method of that name; ``get_attr`` reads the
   module's tensor (zero copy);
2. cuts the graph in order into segments of mapped nodes and the unmapped nodes between them; each
   mapped segment is a tp function interpreting its nodes, compiled by ``tp.compile`` (backend
   Stax: fused C++/OpenMP kernels on CPU, Triton on GPU); an unmapped node (a ``call_module``, a
   torch function tp lacks) runs with torch on the torch views of its inputs, and is listed in the
   fallback report (:func:`report`) and in a warning;
3. converts inputs torch -> tp and outputs tp -> torch without copies (a tp.Tensor holds a torch
   tensor).

Training: when an input requires grad and torch's grad mode is on, the whole graph runs inside one
``torch.autograd.Function`` whose forward runs the tp segments with tp's autograd recording (each
compiled segment is a training region of tp.compile: AOT joint graph, min-cut partition, Stax forward
and backward) and whose backward is ``tp.autograd.grad`` of the recorded outputs; gradients reach
the torch leaves (parameters) as torch tensors.  Torch-fallback nodes join tp's graph through a
small tp autograd function that calls torch.autograd on the node.

Guarantee: the outputs are those of the graph's torch eager run up to the compiled kernels' float
reassociation (tests compare against torch eager); a node tp cannot run is never dropped: it runs
with torch and is reported.  :func:`report` returns, per compiled graph, the ops that ran under
tp.compile on Stax (with the op-table ops Stax ran as fallback kernels) and the torch fallbacks.
"""
from __future__ import annotations

import builtins
import operator
import warnings

import torch

from .. import _tensor
from ..autograd import enable_grad, no_grad
from ..autograd.function import Function as _TpFunction

__all__ = ["torch_backend", "report", "reset_report"]

_REPORTS: list[dict] = []


def reset_report():
    _REPORTS.clear()


def report() -> str:
    """What ran where, for every graph this backend compiled since the last :func:`reset_report`."""
    lines = []
    for i, r in enumerate(_REPORTS):
        lines.append(f"graph {i}: {r['nodes']} nodes, {len(r['segments'])} tp.compile segment(s), "
                     f"{len(r['torch_fallback'])} torch fallback node(s)")
        for s in r["segments"]:
            ops = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(s["tp_ops"].items()))
            state = s["status"]
            lines.append(f"  stax segment ({state}): {ops}")
            if s["stax_fallback_kernels"]:
                lines.append(f"    ops Stax ran as eager fallback kernels: {', '.join(s['stax_fallback_kernels'])}")
        for name, why in r["torch_fallback"]:
            lines.append(f"  torch fallback: {name} ({why})")
    return "\n".join(lines) if lines else "torch_backend: nothing compiled yet"


def reports() -> list[dict]:
    return list(_REPORTS)


# -- mapping torch targets onto tensorplay ---------------------------------------------------------

def _namespaces():
    import tensorplay as tp
    pairs = [(torch, tp), (torch.nn.functional, tp.nn.functional), (torch._C._nn, tp.nn.functional)]
    for sub in ("linalg", "special", "fft"):
        if hasattr(tp, sub):
            pairs.append((getattr(torch, sub), getattr(tp, sub)))
    return pairs


_FN_MAP: dict | None = None


def _fn_map():
    global _FN_MAP
    if _FN_MAP is None:
        m = {}
        for tns, pns in reversed(_namespaces()):    # torch.* wins over the _C._nn alias
            for name in dir(tns):
                if name.startswith("__"):
                    continue
                try:
                    obj = getattr(tns, name)
                    mine = getattr(pns, name)
                except Exception:  # noqa: BLE001 - lazily failing attributes
                    continue
                if callable(obj) and callable(mine) and not isinstance(mine, type):
                    try:
                        m[obj] = mine
                    except TypeError:   # unhashable
                        pass
        _FN_MAP = m
    return _FN_MAP


_PASSTHROUGH_MODULES = ("_operator", "operator", "builtins", "math")


def _map_node(node, gm):
    """('tp', callable) for a node tp runs, ('torch', why) for one that runs with torch, or
    (kind, None) for placeholder/output."""
    if node.op == "call_function":
        t = node.target
        mod = getattr(t, "__module__", None) or ""
        if mod in _PASSTHROUGH_MODULES or t in (builtins.getattr, operator.getitem):
            return "tp", t
        try:
            mine = _fn_map().get(t)
        except TypeError:
            mine = None
        if mine is not None:
            return "tp", mine
        name = getattr(t, "__qualname__", "") or ""
        if name.startswith(("Tensor.", "TensorBase.")):       # torch.Tensor.add used as a function
            meth = name.split(".", 1)[1]
            if callable(getattr(_tensor.Tensor, meth, None)):
                return "tp", lambda self, *a, _m=meth, **k: getattr(self, _m)(*a, **k)
        return "torch", f"{_target_name(t)} has no tensorplay counterpart"
    if node.op == "call_method":
        if callable(getattr(_tensor.Tensor, node.target, None)):
            return "tp", lambda self, *a, _m=node.target, **k: getattr(self, _m)(*a, **k)
        return "torch", f"tp.Tensor has no method {node.target!r}"
    if node.op == "call_module":
        return "torch", f"module {type(gm.get_submodule(node.target)).__name__} (call_module)"
    return node.op, None


def _target_name(t):
    mod = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)
    return f"{mod}.{name}" if mod else name


# -- values ----------------------------------------------------------------------------------------

def _map(obj, fn):
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map(v, fn) for v in obj)
    if isinstance(obj, tuple):   # a named tuple
        return type(obj)(*(_map(v, fn) for v in obj))
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return fn(obj)


def _to_tp(x):
    if isinstance(x, torch.Tensor):
        return _tensor.from_torch(x)
    return x


def _to_torch(x):
    return x.torch() if isinstance(x, _tensor.Tensor) else x


def _env_arg(a, env):
    import torch.fx as fx
    if isinstance(a, fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
        return type(a)(_env_arg(v, env) for v in a)
    if isinstance(a, tuple):
        return type(a)(*(_env_arg(v, env) for v in a))
    if isinstance(a, dict):
        return {k: _env_arg(v, env) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_env_arg(a.start, env), _env_arg(a.stop, env), _env_arg(a.step, env))
    if isinstance(a, torch.Tensor):
        return _tensor.from_torch(a)
    return a


class _TorchNode(_TpFunction):
    """One torch-fallback node inside tp's autograd: forward calls torch on the torch views,
    backward asks torch.autograd for the gradients of its tensor inputs."""

    @staticmethod
    def forward(ctx, fn, spec_args, spec_kwargs, *tensors):
        tt = [t.torch().detach().requires_grad_(t.requires_grad and t.is_floating_point()) for t in tensors]
        it = iter(tt)
        args = _map(spec_args, lambda v: next(it) if v is _SLOT else v)
        kwargs = _map(spec_kwargs, lambda v: next(it) if v is _SLOT else v)
        with torch.enable_grad():
            out = fn(*args, **kwargs)
        ctx.torch_in, ctx.torch_out = tt, out
        return _map(out, _to_tp)

    @staticmethod
    def backward(ctx, *grads):
        outs = [o for o in (ctx.torch_out if isinstance(ctx.torch_out, (list, tuple)) else [ctx.torch_out])]
        pairs = [(o, g) for o, g in zip(outs, grads) if isinstance(o, torch.Tensor) and o.requires_grad
                 and g is not None]
        need = [t for t in ctx.torch_in if t.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], need, [g.torch() for _, g in pairs],
                                       allow_unused=True) if pairs and need else [])
        res = []
        for t in ctx.torch_in:
            g = next(got, None) if t.requires_grad else None
            res.append(None if g is None else _tensor.from_torch(g))
        return (None, None, None, *res)


_SLOT = object()


def _run_torch_node(node, gm, env):
    args = _env_arg(node.args, env)
    kwargs = _env_arg(dict(node.kwargs), env)
    if node.op == "call_function":
        fn = node.target
    elif node.op == "call_method":
        fn = lambda self, *a, _m=node.target, **k: getattr(self, _m)(*a, **k)  # noqa: E731
    else:
        fn = gm.get_submodule(node.target)
    tensors = []

    def slot(v):
        if isinstance(v, _tensor.Tensor):
            tensors.append(v)
            return _SLOT
        return v
    sa, sk = _map(args, slot), _map(kwargs, slot)
    if any(t.requires_grad for t in tensors):
        return _TorchNode.apply(fn, sa, sk, *tensors)
    it = iter(t.torch() for t in tensors)
    out = fn(*_map(sa, lambda v: next(it) if v is _SLOT else v), **_map(sk, lambda v: next(it) if v is _SLOT else v))
    return _map(out, _to_tp)


# -- segments --------------------------------------------------------------------------------------

class _Segment:
    """A run of mapped nodes compiled as one tp.compile function of its live-in values."""

    def __init__(self, nodes, inputs, outputs, gm, name, rec):
        self.nodes, self.inputs, self.outputs, self.gm = nodes, inputs, outputs, gm
        self.rec = rec
        self.fn = None
        self.name = name

    def _interpret(self, *vals):
        env = dict(zip(self.inputs, vals))
        for n in self.nodes:
            if n.op == "get_attr":
                env[n] = _tensor.from_torch(_fetch_attr(self.gm, n.target))
                continue
            _, fn = _map_node(n, self.gm)
            env[n] = fn(*_env_arg(n.args, env), **_env_arg(dict(n.kwargs), env))
        return tuple(env[o] for o in self.outputs)

    def __call__(self, env):
        vals = [env[i] for i in self.inputs]
        if self.fn is None:
            from .api import compile as tp_compile
            self.fn = tp_compile(self._interpret, backend=_recording_stax(self.rec), name=self.name)
        try:
            outs = self.fn(*vals)
        except Exception as e:  # noqa: BLE001 - capture failed: run the segment op by op in tp
            if self.rec["status"] != "tp eager (capture failed)":
                self.rec["status"] = "tp eager (capture failed)"
                self.rec["error"] = f"{type(e).__name__}: {e}"
                warnings.warn(f"tensorplay torch_backend: {self.name} could not be captured by tp.compile "
                              f"({type(e).__name__}: {e}); it runs op by op in tensorplay", RuntimeWarning)
            outs = self._interpret(*vals)
        for o, v in zip(self.outputs, outs):
            env[o] = v


def _fetch_attr(gm, target):
    obj = gm
    for p in target.split("."):
        obj = getattr(obj, p)
    return obj.detach() if isinstance(obj, torch.Tensor) else obj


def _recording_stax(rec):
    """The Stax backend, recording the tp graph it got and the ops it ran as fallback kernels."""
    from .backends.registry import lookup_backend

    def backend(gm, example, **kw):
        ops = {}
        for n in gm.graph.nodes:
            if n.op == "call_function":
                name = getattr(n, "target_name", None) or _target_name(n.target)
                ops[name] = ops.get(name, 0) + 1
        rec["tp_ops"] = ops
        try:
            from .backends.stax import plan_graph
            graph, _, _ = plan_graph(gm, example)
            rec["stax_fallback_kernels"] = sorted({name for name, _ in graph.fallbacks})
        except Exception:  # noqa: BLE001 - the real compile below reports the failure
            pass
        try:
            out = lookup_backend("stax")(gm, example, **kw)
        except Exception as e:
            rec["status"] = f"Stax failed, tp eager: {type(e).__name__}: {e}"
            raise
        if rec["status"] == "pending":
            rec["status"] = "compiled by Stax"
        return out
    backend.dynamic_shapes = getattr(lookup_backend("stax"), "dynamic_shapes", True)
    return backend


class _TorchGraph:
    """The callable handed back to dynamo."""

    def __init__(self, gm):
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        self.output = next(n for n in nodes if n.op == "output")
        self.rec = {"nodes": len(nodes), "segments": [], "torch_fallback": []}
        _REPORTS.append(self.rec)
        users_after = {}
        order = {n: i for i, n in enumerate(nodes)}
        for n in nodes:
            for u in n.users:
                users_after[n] = max(users_after.get(n, -1), order[u])
        self.steps = []
        run = []

        def close():
            if not run:
                return
            inside = set(run)
            ins = []
            for n in run:
                for a in n.all_input_nodes:
                    if a not in inside and a not in ins:
                        ins.append(a)
            last = order[run[-1]]
            outs = [n for n in run if users_after.get(n, -1) > last]
            seg_rec = {"tp_ops": {}, "stax_fallback_kernels": [], "status": "pending"}
            self.rec["segments"].append(seg_rec)
            self.steps.append(("seg", _Segment(list(run), ins, outs, gm, f"torch_backend_seg{len(self.steps)}",
                                               seg_rec)))
            run.clear()
        for n in nodes:
            kind, target = _map_node(n, gm)
            if kind in ("placeholder", "output"):
                continue
            if kind == "torch":
                close()
                self.rec["torch_fallback"].append((_node_name(n), target))
                self.steps.append(("torch", n))
            else:
                run.append(n)
        close()
        if self.rec["torch_fallback"]:
            warnings.warn("tensorplay torch_backend: these nodes run with torch (no tensorplay counterpart): "
                          + "; ".join(f"{a} ({b})" for a, b in self.rec["torch_fallback"]), RuntimeWarning)

    def _run(self, tp_inputs):
        env = dict(zip(self.placeholders, tp_inputs))
        for kind, step in self.steps:
            if kind == "seg":
                step(env)
            else:
                env[step] = _run_torch_node(step, self.gm, env)
        return _env_arg(self.output.args[0], env)

    def __call__(self, *args):
        needs_grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        if needs_grad:
            return _TrainingCall.apply(self, *args)
        with no_grad():
            out = self._run([_to_tp(a.detach()) if isinstance(a, torch.Tensor) else a for a in args])
        return _map(out, _to_torch)


class _TrainingCall(torch.autograd.Function):
    """torch autograd around the whole tp run: forward records tp's graph, backward is tp.autograd.grad."""

    @staticmethod
    def forward(ctx, graph, *args):
        leaves = []
        tp_in = []
        for a in args:
            if isinstance(a, torch.Tensor):
                t = _tensor.from_torch(a.detach())
                if a.requires_grad and a.is_floating_point():
                    t.requires_grad_(True)
                    leaves.append((len(tp_in), t))
                tp_in.append(t)
            else:
                tp_in.append(a)
        with enable_grad():
            out = graph._run(tp_in)
        flat = out if isinstance(out, (list, tuple)) else [out]
        ctx.tp_outs = [o for o in flat]
        ctx.leaves = leaves
        ctx.n_args = len(args)
        res = tuple(_to_torch(o) for o in flat)
        for o, r in zip(flat, res):
            if isinstance(o, _tensor.Tensor) and not o.requires_grad and isinstance(r, torch.Tensor):
                ctx.mark_non_differentiable(r)
        ctx.single = not isinstance(out, (list, tuple))
        return res[0] if ctx.single else res

    @staticmethod
    def backward(ctx, *grads):
        from ..autograd import grad as tp_grad
        pairs = [(o, g) for o, g in zip(ctx.tp_outs, grads)
                 if isinstance(o, _tensor.Tensor) and o.requires_grad and g is not None]
        result = [None] * ctx.n_args
        if pairs and ctx.leaves:
            gs = tp_grad([o for o, _ in pairs], [t for _, t in ctx.leaves],
                         [_tensor.from_torch(g.contiguous()) for _, g in pairs], allow_unused=True)
            for (i, _), g in zip(ctx.leaves, gs):
                result[i] = None if g is None else g.torch()
        return (None, *result)


def _node_name(n):
    if n.op == "call_function":
        return _target_name(n.target)
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    return f"{n.op} {n.target}"


def torch_backend(gm, example_inputs):
    """``torch.compile(model, backend=torch_backend)``: dynamo's FX graph run by tensorplay, its
    mapped segments compiled by tp.compile (Stax); see the module docstring."""
    return _TorchGraph(gm)
