"""Stax: the loop-level compiler backend (chapter §6–§8, §11; docs/stax.md).

Read in pipeline order:

  ops_handler.py      the ``ops`` interface compute functions are written against
  sizevars.py         sizes as expressions: size_hint, statically_known_*, evaluate_static_shape
  ir.py               values as functions (Pointwise, Reduction), buffers, views
  lowering.py         GraphLowering: op-level graph -> loop-level IR; fallbacks
  op_lowerings/       register_lowering, the pointwise helper, one rule per op (a module per op family)
  choices.py          heuristics: materialisation, can_fuse, score_fusion (the CPU's: cpp/choices.py)
  scheduler.py        dependency graph, greedy fusion, local (never written) buffers
  kernel_plan.py      one KernelPlan per fused group: loops and merges, phases, accesses, bounds
  device.py           the device seam: DeviceBackend (plan, render, how the wrapper defines and calls
                      a kernel), register_device_backend(device, backend, name); a knob per device
                      (stax.cpu_backend) picks among the backends registered for it
  reuse.py            identical kernels of a graph (unrolled steps, repeated layers): one definition
  codegen/wrapper.py  the generated Python ``call(args)`` module (device-neutral; CallWriter writes
                      the body of every wrapper's ``call``)
  codecache.py        content-addressed disk cache (TP_CACHE_DIR), file locks, compiled graphs
  debug.py            TP_STAX_DEBUG dumps of every stage (loop IR, schedule, plans, code)
  triton/cudagraphs.py  mode="reduce-overhead" on CUDA: a wrapper's ``call`` replayed as one CUDA graph
                      (§9.9), outputs of an earlier replay raise when read (exercise 27)
  cpp/                the CPU's backend: C++ kernels (OpenMP + SIMD), their build and call
                      (cpp/__init__.py lists its modules); registered for "cpu" by tensorplay.compiler

Nothing in this folder outside ``cpp/`` imports ``cpp/`` (test/test_layout.py checks it).

``stax_backend(gm, example_inputs)`` is registered as the ``"stax"`` backend.  Training regions (an
input requires grad with grad mode on) go through AOT autograd (compiler/aot, docs/aot.md): the
forward and backward graphs are both compiled by this backend.
"""
from __future__ import annotations

import contextlib

from ...._tensor import Tensor, _wrap
from .device import KernelBuildError
from ....profiler.recorder import span

__all__ = ["stax_backend", "StaxStrictError", "compile_graph", "plan_graph"]


#: ``f(module)`` once a wrapper module is loaded and annotated (a recording profiler: its kernel
#: timing proxies, profiler/hooks.py), or None
on_wrapper_ready = None

#: failures of a symbolic graph's compilation that retrying it with static sizes would not mend
#: (the compiler or the machine failed: device.KernelBuildError, a file or memory error)
_NOT_A_SHAPE_PROBLEM = (KernelBuildError, OSError, MemoryError)


class StaxStrictError(RuntimeError):
    """strict_native=True and some op would not run as a Stax kernel."""


@contextlib.contextmanager
def _scheduled(gm, example_inputs):
    """Lower and schedule a graph: (graph, scheduler), with the lowering's ``V.graph`` set while
    the caller plans and prints its kernels (compute functions are evaluated then)."""
    from .lowering import GraphLowering
    from .op_lowerings import V
    from .scheduler import Scheduler
    from .sizevars import use
    graph = GraphLowering(gm, example_inputs)
    prev = V.graph
    V.graph = graph
    try:
        with use(graph.sizevars):
            with span("stax lowering", "compile"):
                graph.run()
            with span("stax scheduling", "compile"):
                sched = Scheduler(graph).fuse()
            yield graph, sched
    finally:
        V.graph = prev


def _plans(sched):
    """(group, KernelPlan) of every Stax kernel of the schedule, in order (made as they are asked for)."""
    from .kernel_plan import plan_kernel
    for g in sched.groups:
        if not g.is_extern:
            yield g, plan_kernel(sched, g)


def plan_graph(gm, example_inputs):
    """Lower, schedule and plan a graph without generating code (the seam between scheduling and
    code, the chapter §8.1): (graph, scheduler, [KernelPlan of every kernel, in order])."""
    with _scheduled(gm, example_inputs) as (graph, sched):
        return graph, sched, [plan for _, plan in _plans(sched)]


def compile_graph(gm, example_inputs, cpp_wrapper=False, options=None):
    """Lower, schedule, plan and generate code; returns (wrapper source, graph, scheduler, kernels).
    The kernels and how the wrapper calls them are the device backend's (device.py: that of the
    inputs' device); ``cpp_wrapper``: on the CPU, one C++ translation unit and entry for the kernels;
    ``options``: the compiled function's (the backend reads those it acts on: tuning on the GPU)."""
    from .codegen.wrapper import generate_wrapper
    from .device import backend_for
    from .kernel_plan import model_cost
    from .reuse import KernelTable
    backend = backend_for(example_inputs)
    with _scheduled(gm, example_inputs) as (graph, sched), span(f"stax codegen ({backend.name})", "compile"):
        backend.prepare_schedule(graph, sched)
        kernels, plans = {}, {}
        sched.kernel_costs = {}
        table = KernelTable()       # identical kernels (unrolled steps, repeated layers): one definition
        for g, plan in _plans(sched):
            name = f"kernel{len(kernels)}"
            src, params = backend.render(plan, name)
            name, src = table.add(name, src, params, [n.name for n in g.nodes])
            kernels[id(g)] = (name, src, params)
            plans[id(g)] = plan
            sched.kernel_costs.setdefault(name, model_cost(plan, graph.sizevars))
        out = backend.generate_wrapper(graph, sched, kernels, cpp_wrapper=cpp_wrapper, options=options or {})
        src, materialized = out if out is not None else generate_wrapper(graph, sched, kernels, backend)
        from .debug import emit
        emit(gm, graph, sched, kernels, src, plans)      # TP_STAX_DEBUG=ir,schedule,plan,code
    return src, graph, sched, materialized


def _check_native(gm, example_inputs):
    """strict_native for a lazily compiled graph (the AOT backward): lower it now (no C++ build)
    and raise if some op would fall back."""
    _reject_fallbacks(compile_graph(gm, example_inputs)[1].fallbacks, "of the backward graph ")


def _reject_fallbacks(fallbacks, where=""):
    """strict_native=True: raise listing the ops that would run in eager (if any)."""
    if fallbacks:
        listing = "\n".join(f"  {name}: {why}" for name, why in fallbacks)
        raise StaxStrictError(f"strict_native=True: {len(fallbacks)} op(s) {where}have no Stax kernel and would run "
                              f"in eager (TP_STAX_LOWER_DEBUG=1 lists them):\n{listing}")


def stax_backend(gm, example_inputs, *, options=None, strict_native=False, **kw):
    from ...aot import aot_backend, is_training_region
    from ...capture.fakes import is_symbolic
    from ..eager import raw_function
    if is_training_region(example_inputs):
        # training region (docs/aot.md): joint graph -> partition -> both graphs through this backend
        # (no CUDA graphs for the forward and backward graphs: their saved activations and
        # gradients outlive the call, the pool would overwrite them -- triton/cudagraphs.py)
        graph_options = {**(options or {}), "stax.cudagraphs": False}

        def native(g, example):
            return stax_backend(g, example, options=graph_options, strict_native=strict_native, **kw)

        def check_native(g, example):
            from .device import use_backend
            with use_backend((options or {}).get("stax.kernel_backend")):
                _check_native(g, example)
        return aot_backend(gm, example_inputs, fw_compiler=native, options=options, strict_native=strict_native,
                           check_native=check_native if strict_native else None,
                           decompose_if=stax_backend.aot_decompose, bw_fallback=raw_function)
    from .device import registered_devices
    missing = sorted({t.device.type for t in example_inputs if isinstance(t, Tensor)} - set(registered_devices()))
    if missing:   # (built in: the CPU's C++ and Triton backends, CUDA's Triton backend)
        raise StaxStrictError(f"Stax has no device backend for {', '.join(missing)} tensors "
                              f"(registered: {', '.join(registered_devices())}; device.register_device_backend)")
    from . import codecache
    from .device import use_backend
    kernel_backend = (options or {}).get("stax.kernel_backend") or ""
    try:
        with use_backend(kernel_backend):
            rec, constants = _compiled_graph(gm, example_inputs, bool((options or {}).get("stax.cpp_wrapper")),
                                             kernel_backend, options)
    except Exception as e:
        if not is_symbolic(gm) or isinstance(e, _NOT_A_SHAPE_PROBLEM):
            raise
        from ..registry import StaticShapesRequired
        raise StaticShapesRequired(f"{type(e).__name__}: {e}") from e
    fallbacks = [tuple(f) for f in rec["fallbacks"]]
    if strict_native:
        _reject_fallbacks(fallbacks)
    src = rec["source"]
    with span("stax load wrapper (builds its kernels)", "compile"):
        mod = codecache.load_py(src)
    mod.constants.update(_on_device(constants, example_inputs))
    call = mod.call
    wrap = _wrap
    graphed = _cudagraphed(gm, example_inputs, options, mod)
    if graphed is not None:     # reduce-overhead on CUDA: one CUDA graph, stale outputs poisoned
        def run(*args):
            return graphed([a._data for a in args])
        run.cudagraph = graphed.graphed    # (no ``direct``: the fast path must not skip the poisoning)
    else:
        def run(*args):
            outs = call([a._data for a in args])
            return tuple(wrap(o) for o in outs)
        run.direct = call      # the fast first-level path calls the wrapper itself (api.Entry.fast_runner)
    run.source = src
    run.materialized = set(rec["materialized"])
    run.intermediate_bytes = rec["intermediate_bytes"]
    run.fallbacks = fallbacks
    run.module = mod
    mod.kernel_costs = rec.get("kernel_costs", {})    # (bytes, FLOPs) per kernel: the profiler's model
    mod.kernel_device = next((t.device.type for t in example_inputs if isinstance(t, Tensor)), "cpu")
    if on_wrapper_ready is not None:
        on_wrapper_ready(mod)
    return run


def _on_device(constants, example_inputs):
    """The graph's constant tensors on its device: a constant captured on the CPU (a lifted scalar)
    read by a GPU kernel is copied there once, when the graph is loaded."""
    devs = {t.device for t in example_inputs if isinstance(t, Tensor)}
    dev = devs.pop() if len(devs) == 1 else None
    if dev is None or dev.type == "cpu":
        return constants
    return {k: (v.to(dev) if hasattr(v, "device") and v.device.type == "cpu" else v) for k, v in constants.items()}


def _cudagraphed(gm, example_inputs, options, mod):
    """``mod.call`` replayed as one CUDA graph, its outputs as tp.Tensors whose stale ones raise,
    when ``options["stax.cudagraphs"]`` (mode="reduce-overhead") is on and the device's backend
    replays graphs (``DeviceBackend.graph_runner``: the CUDA one, triton/cudagraphs.py); else None.
    The lifted free tensors (placeholders ``free_*``, capture/tracer.py: parameters, globals) are
    static inputs: used in place, not copied each call."""
    if not (options or {}).get("stax.cudagraphs"):
        return None
    from .device import backend_for, use_backend
    with use_backend((options or {}).get("stax.kernel_backend")):
        backend = backend_for(example_inputs)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    free = [i for i, n in enumerate(names) if n.startswith("free_")] if len(names) == len(example_inputs) else []
    return backend.graph_runner(mod, free, _wrap)


#: the options that change a wrapper's code beyond the cpp wrapper and the backend (its graph key)
_CODE_OPTIONS = ("stax.max_autotune", "stax.coordinate_descent_tuning")


def _compiled_graph(gm, example_inputs, cpp_wrapper, kernel_backend="", options=None):
    """(record, constants): the wrapper source and facts of a graph, from the graph cache (a warm
    process does no lowering and no code generation) or compiled now and stored
    (codecache.graph_key); the constant tensors its ``call`` reads."""
    from . import codecache
    variant = f"kernel_backend={kernel_backend}" + "".join(f";{k}={bool((options or {}).get(k))}" for k in _CODE_OPTIONS)
    key = codecache.graph_key(gm, example_inputs, cpp_wrapper=cpp_wrapper, variant=variant)
    rec = codecache.load_graph(key)
    if rec is not None:
        with span("stax graph cache hit", "compile", key=key):
            return rec, codecache.graph_constants(gm)
    src, graph, sched, materialized = compile_graph(gm, example_inputs, cpp_wrapper, options)
    outs = {o.name if hasattr(o, "name") else None for o in graph.outputs}
    rec = {"source": src, "materialized": sorted(materialized), "fallbacks": [list(f) for f in graph.fallbacks],
           "kernel_costs": getattr(sched, "kernel_costs", {}),
           "intermediate_bytes": sum(2 * graph.sizevars.size_hint(b.layout.numel) * b.layout.dtype.itemsize
                                     for b in graph.buffers if b.name in materialized and b.name not in outs)}
    consts = codecache.graph_constants(gm)
    if list(consts) == list(graph.constants) and all(consts[k] is graph.constants[k] for k in consts):
        codecache.save_graph(key, rec)   # only when a hit would rebuild the same constants
    return rec, graph.constants


def _aot_decompose(node):
    from . import choices
    return choices.aot_decompose(node)


stax_backend.aot_decompose = _aot_decompose   # read by aot_backend and Lowered.aot
#: kernels take size arguments (dynamic=True): a graph whose lowering, planning or code
#: generation needs a static size raises StaticShapesRequired, and tp.compile specialises it
stax_backend.dynamic_shapes = True


def _register():
    from ..registry import register_backend
    register_backend(stax_backend, name="stax")


_register()
