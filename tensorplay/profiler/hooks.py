"""Where a profile listens (seed 001 §1-2): installed when a profile starts recording, removed
when it stops, so that nothing runs on the hot paths while no profile records.

* **eager ops** -- a pre- and a post-observer on the op table's dispatch (``ops.registry``): one
  span per op call, with its input shapes and dtypes under ``record_shapes`` and the user's source
  line under ``with_stack``;
* **autograd** -- ``autograd.engine.node_hook``: one span per backward node; the tensors a node
  saved for backward are marked ``activation``, the gradient an AccumulateGrad writes ``gradient``;
* **optimizers** -- ``Optimizer.step`` of every optimizer (optim/optimizer.py wraps each subclass's
  ``step``): one span per step, its state tensors marked ``optimizer state``;
* **Stax kernels** -- every loaded wrapper module's ``kernelN`` (codecache's modules, and each one
  loaded while the profile records) is replaced by a timing proxy: one ``kernel`` span per call
  with the kernel's model bytes and FLOPs (kernel_plan.model_cost) and, on the CPU where the call
  is the kernel's whole run, the achieved GB/s.  The C++ wrapper (``stax.cpp_wrapper``) calls its
  kernels inside one C++ entry: no kernel spans there.

Compile phases are spans the compiler opens itself (``recorder.span``, a no-op without a profile).
"""
from __future__ import annotations

import sys
import time

from . import recorder

__all__ = ["install", "uninstall"]

# --- eager ops ----------------------------------------------------------------------------------
_PACKAGE_DIR = __file__.rsplit("profiler", 1)[0]      # .../tensorplay/


def _user_frame() -> str:
    """``file:line`` of the innermost frame outside tensorplay (the user's call)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith(_PACKAGE_DIR) or f.f_code.co_filename.startswith("<")):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else ""


def _before_op(op, args, raw):
    rec = recorder._ACTIVE
    a = None
    if rec.record_shapes:
        shapes = [list(x.shape) if hasattr(x, "shape") else None for x in raw]
        a = {"input_shapes": shapes, "input_dtypes": [str(x.dtype) if hasattr(x, "dtype") else None for x in raw]}
    if rec.with_stack:
        a = {**(a or {}), "source": _user_frame()}
    if "collective" in op.tags:
        a = {**(a or {}), **_collective_args(rec, op, raw)}
    rec.stack.append((op, rec.begin(op.name, "op", a)))
    return raw


def _collective_args(rec, op, raw) -> dict:
    """A collective's bytes (its tensor inputs) and its group id: the same on every rank that takes
    part in the call (the op, the participating ranks, the call's number among theirs), so that the
    critical path across merged traces sees one collective (critical_path.py: ``collective``)."""
    from ..distributed.collectives import participants
    try:
        ranks = participants(op, raw)
    except Exception:       # (not a mesh collective, or no process group: a local call)
        ranks = ()
    key = (op.name, ranks)
    k = rec.collectives[key] = rec.collectives.get(key, 0) + 1
    nbytes = sum(x.numel() * x.element_size() for x in raw if hasattr(x, "element_size"))
    return {"collective": f"{op.name}:{','.join(map(str, ranks))}#{k}", "bytes": nbytes}


def _after_op(op, args, outs):
    rec = recorder._ACTIVE
    st = rec.stack
    while st:
        key, s = st.pop()
        rec.end(s)
        if key is op:
            break
        s.args["raised"] = True     # an op whose kernel raised: closed by the next op that ends


# --- autograd -------------------------------------------------------------------------------------
def _saved_tensors(node):
    """The tensors a backward node keeps for its formula (its ctx's values, one level deep)."""
    import torch
    ctx = getattr(node, "ctx", None)
    if ctx is None:
        return
    for v in getattr(ctx, "__dict__", {}).values():
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, torch.Tensor) or hasattr(x, "_data"):
                yield x


def _run_node(node, grads):
    rec = recorder._ACTIVE
    for t in _saved_tensors(node):
        rec.mark(t, "activation")
    s = rec.begin(f"autograd::{node.name()}", "backward")
    try:
        return node.apply(grads)
    finally:
        rec.end(s)
        v = getattr(node, "variable", None)      # AccumulateGrad: the leaf's gradient
        if v is not None and v.grad is not None:
            rec.mark(v.grad, "gradient")


# --- Stax kernels ---------------------------------------------------------------------------------
class TimedKernel:
    """A wrapper module's kernel while a profile records: the call, timed as a ``kernel`` span."""
    __slots__ = ("fn", "name", "module", "cost", "on_cpu", "__weakref__")

    def __init__(self, fn, name, module, cost):
        self.fn, self.name, self.module, self.cost = fn, name, module, cost
        #: the call is the kernel's whole run (not an asynchronous GPU launch): its GB/s are achieved
        self.on_cpu = getattr(module, "kernel_device", "cpu") == "cpu"

    def __call__(self, *args):
        rec = recorder._ACTIVE
        if rec is None:
            return self.fn(*args)
        t0 = time.time_ns()
        r = self.fn(*args)
        t1 = time.time_ns()
        nbytes, flops = self.cost
        a = {"graph": self.module.__name__, "model_bytes": nbytes, "model_flops": flops}
        if self.on_cpu and t1 > t0:
            a["achieved_GBps"] = round(nbytes / (t1 - t0), 3)
        rec.add(self.name, "kernel", t0, t1, a)
        return r


def instrument_module(mod) -> None:
    """Put timing proxies on a wrapper module's kernels (its ``kernel_costs``)."""
    costs = getattr(mod, "kernel_costs", None) or {}
    g = mod.__dict__
    for name, cost in costs.items():
        fn = g.get(name)
        if fn is not None and not isinstance(fn, TimedKernel):
            g[name] = TimedKernel(fn, name, mod, tuple(cost))


def _restore_module(mod) -> None:
    g = mod.__dict__
    for name, fn in list(g.items()):
        if isinstance(fn, TimedKernel):
            g[name] = fn.fn


def _wrapper_modules():
    from ..compiler.backends.stax import codecache
    return list(codecache._modules.values())


# --- install / uninstall --------------------------------------------------------------------------
def install(rec) -> None:
    """Start listening for ``rec`` (module doc)."""
    from ..autograd import engine
    from ..compiler.backends import stax
    from ..ops import registry
    if recorder.active() is not None:
        raise RuntimeError("tp.profiler: another profile is already recording (profiles do not nest)")
    recorder.set_active(rec)
    registry.pre_observers.append(_before_op)
    registry.observers.append(_after_op)
    engine.node_hook = _run_node
    stax.on_wrapper_ready = instrument_module
    for mod in _wrapper_modules():
        instrument_module(mod)


def uninstall() -> None:
    from ..autograd import engine
    from ..compiler.backends import stax
    from ..ops import registry
    rec = recorder.active()
    recorder.set_active(None)
    if _before_op in registry.pre_observers:
        registry.pre_observers.remove(_before_op)
    if _after_op in registry.observers:
        registry.observers.remove(_after_op)
    engine.node_hook = None
    stax.on_wrapper_ready = None
    for mod in _wrapper_modules():
        _restore_module(mod)
    if rec is not None:
        rec.close()
