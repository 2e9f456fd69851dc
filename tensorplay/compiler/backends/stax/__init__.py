"""Stax: the loop-level compiler backend (chapter §6–§8, §11; docs/stax.md).

Read in pipeline order:

  ops_handler.py      the ``ops`` interface compute functions are written against
  ir.py               values as functions (Pointwise, Reduction), buffers, views
  lowering.py         GraphLowering: op-level graph -> loop-level IR; fallbacks
  op_lowerings.py     register_lowering, the pointwise helper, one rule per op
  choices.py          heuristics: materialisation, can_fuse, score_fusion, parallel depth
  scheduler.py        dependency graph, greedy fusion, local (never written) buffers
  codegen/cpp.py      one C++ function per fused group (tp::Vec vectors, OpenMP)
  codegen/cpp_prelude.h, codegen/stax_kernel.h   the vector library the kernels use
  codegen/wrapper.py  the generated Python ``call(args)`` module
  codecache.py        content-addressed disk cache (TP_CACHE_DIR), g++, file locks
  async_compile.py    parallel compilation of a wrapper's kernels

``stax_backend(gm, example_inputs)`` is registered as the ``"stax"`` backend.  Regions that need
autograd (an input requires grad with grad mode on) run op by op until AOT autograd lands.
"""
from __future__ import annotations

from ...._tensor import Tensor, _wrap
from ....autograd import grad_mode

__all__ = ["stax_backend", "StaxStrictError", "compile_graph"]


class StaxStrictError(RuntimeError):
    """strict_native=True and some op would not run as a Stax kernel."""


def compile_graph(gm, example_inputs):
    """Lower, schedule and generate code; returns (wrapper source, graph, scheduler, kernels)."""
    from .codegen.cpp import generate_kernel
    from .codegen.wrapper import generate_wrapper
    from .lowering import GraphLowering
    from .op_lowerings import V
    from .scheduler import Scheduler
    graph = GraphLowering(gm, example_inputs)
    prev = V.graph
    V.graph = graph
    try:
        graph.run()
        sched = Scheduler(graph).fuse()
        kernels = {}
        for i, g in enumerate(sched.groups):
            if g.is_extern:
                continue
            name = f"kernel{len(kernels)}"
            src, params = generate_kernel(sched, g, name)
            kernels[id(g)] = (name, src, params)
        src, materialized = generate_wrapper(graph, sched, kernels)
    finally:
        V.graph = prev
    return src, graph, sched, materialized


def stax_backend(gm, example_inputs, *, options=None, strict_native=False, **kw):
    needs_autograd = grad_mode.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in example_inputs)
    if needs_autograd:
        if strict_native:
            raise StaxStrictError("strict_native=True: this region needs autograd, which Stax does not compile "
                                  "yet (AOT autograd is a later issue); it would run op by op")
        from ..eager import eager_backend
        return eager_backend(gm, example_inputs)
    if any(isinstance(t, Tensor) and t.device.type != "cpu" for t in example_inputs):
        raise StaxStrictError("the Stax CPU backend got a non-CPU tensor (the GPU backend is a later issue)")
    src, graph, sched, materialized = compile_graph(gm, example_inputs)
    if strict_native and graph.fallbacks:
        listing = "\n".join(f"  {name}: {why}" for name, why in graph.fallbacks)
        raise StaxStrictError(f"strict_native=True: {len(graph.fallbacks)} op(s) have no Stax kernel and would run "
                              f"in eager (TP_STAX_LOWER_DEBUG=1 lists them):\n{listing}")
    from . import codecache
    mod = codecache.load_py(src)
    mod.constants.update(graph.constants)
    call = mod.call
    wrap = _wrap

    def run(*args):
        outs = call([a._data for a in args])
        return tuple(wrap(o) for o in outs)
    run.source = src
    run.materialized = materialized
    outs = {o.name if hasattr(o, "name") else None for o in graph.outputs}
    run.intermediate_bytes = sum(2 * b.layout.numel * b.layout.dtype.itemsize for b in graph.buffers
                                 if b.name in materialized and b.name not in outs)
    run.fallbacks = list(graph.fallbacks)
    run.module = mod
    return run


def _register():
    from ..registry import register_backend
    register_backend(stax_backend, name="stax")


_register()
