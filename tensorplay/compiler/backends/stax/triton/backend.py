"""The GPU's device backend: Triton kernels launched from the Python wrapper (the chapter, §9,
§11.2).

:class:`TritonBackend` is what ``compile_graph`` asks for a graph on a CUDA device (device.py),
and, under the name ``"triton"``, for CPU tensors when ``tp.compile(options={"stax.kernel_backend":
"triton"})`` asks for it -- the same kernels, run by Triton's interpreter (testing without a GPU).
Per kernel: the GPU decisions of its plan (plan.py), its Triton source (kernel.py); per wrapper:
each kernel loaded from the cache (runtime.load_kernel) and a launcher ``kernelN(buffers...,
sizes...)`` that computes the grid from the plan's numel expressions and launches on the current
stream::

    _kernel0 = load_kernel(r'''...''', 'kernel0')
    _kernel0_launch = Launcher(_kernel0, {'XBLOCK': 1024, 'num_warps': 4, 'num_stages': 1})
    def kernel0(arg0, buf0, s0):
        xnumel = 2048 * s0
        if xnumel > 0:
            _kernel0_launch(xnumel, arg0, buf0, s0, xnumel)

(with static sizes ``kernel0 = partial(_kernel0_launch, 16384)``: the launcher with its numel bound)

(``Launcher``: Triton's JIT at the first call of each argument specialisation, the compiled
kernel launched directly after it, its grid from the numel and its XBLOCK; under ``max-autotune``
``Launcher(..., tune="both")`` searches the launch configuration first; in the interpreter
``_kernel0[grid](...)``.)
"""
from __future__ import annotations

import json
import threading

import torch

from ..device import DeviceBackend

__all__ = ["TritonBackend", "TRITON_DTYPES"]

#: the dtypes Triton kernels compute in (float16/bfloat16 in float32 registers, ops.py)
TRITON_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                           torch.int16, torch.int32, torch.int64, torch.bool})


class TritonBackend(DeviceBackend):
    name = "triton"
    native_dtypes = TRITON_DTYPES

    def __init__(self, interpret: bool = False):
        #: run the kernels in Triton's interpreter (CPU tensors)
        self.interpret = interpret
        self._local = threading.local()     # the graph being generated: its tuning method

    def generate_wrapper(self, graph, sched, kernels, options=None, **_):
        """The common Python wrapper (None), after noting the graph's tuning method (``max-autotune``:
        autotune.method_for_options) for the kernel definitions that follow."""
        from .autotune import method_for_options
        self._local.tune = None if self.interpret else method_for_options(options or {})
        return None

    def plan(self, kernel_plan):
        from .plan import plan_triton
        if kernel_plan.device is None:
            kernel_plan.device = plan_triton(kernel_plan)
        return kernel_plan

    def prepare_schedule(self, graph, sched):
        """Matmul templates (template_fusion.py): an extern product and the pointwise group reading
        it become one GEMM kernel with that group as its epilogue, the pointwise group computing its
        first operand as its prologue (template_prologue.py; knob ``stax.triton.templates``)."""
        from .... import config
        from . import template_fusion
        self._local.host_scalars = self._host_scalars(graph)     # (once per graph, not per kernel)
        self._local.fusions = template_fusion.fuse(graph, sched, config.get("stax.triton.templates"),
                                                   self._local.host_scalars)

    def render(self, kernel_plan, name):
        from . import kernel       # looked up at each call (tools patch kernel.generate_kernel)
        fusion = getattr(self._local, "fusions", {}).get(frozenset(kernel_plan.nodes))
        if fusion is not None:
            from .template_fusion import render
            return render(kernel_plan, name, fusion, self._local.host_scalars, self.interpret)
        return kernel.generate_kernel(self.plan(kernel_plan), name, self._local.host_scalars)

    def _host_scalars(self, graph):
        """One-element buffers of the graph in host memory (the random seed an extern draws on the
        CPU): a GPU kernel takes their value as an argument (``.item()``, no copy to the device)."""
        if self.interpret:
            return frozenset()
        return frozenset(b.name for b in graph.buffers if getattr(b, "layout", None) is not None
                         and torch.device(b.layout.device).type == "cpu" and b.layout.size == ())

    def wrapper_imports(self):
        lines = ["from tensorplay.compiler.backends.stax.triton.runtime import load_kernel, cdiv, checked_launch, Launcher"]
        if not self.interpret:
            lines += ["from functools import partial",
                      "from tensorplay.compiler.backends.stax.triton.runtime import precompile",
                      "_precompile = []   # kernels compiled in parallel when this module is imported (wait())"]
        return lines

    def wait(self):
        return [] if self.interpret else ["precompile(_precompile)"]

    @staticmethod
    def _precompile_job(name, params, ints, cfg):
        """The wrapper line queueing kernel ``name`` for :func:`runtime.precompile`, when every
        argument is a buffer (its dtype) or a known int; None otherwise (a size argument's value
        decides Triton's specialisation: compiled at the launch)."""
        from .ops import TL_DTYPE
        torch_of = {v: k for k, v in TL_DTYPE.items()}
        dts = [torch_of.get(v[0]) if isinstance(v, tuple) else None for v in params.values()]
        if any(d is None for d in dts):
            return None
        args = ", ".join([str(d) for d in dts] + [str(i) for i in ints])
        return f"_precompile.append((_{name}, ({args}{',' if len(dts) + len(ints) == 1 else ''}), {cfg!r}))"

    def kernel_definition(self, name, source, params):
        import sympy     # (here: a warm process loads wrappers without sympy)

        from ..codegen.wrapper import pexpr
        from .kernel import LAUNCH_TAG
        head = source.split("\n", 1)[0]
        if not head.startswith(LAUNCH_TAG):
            raise ValueError(f"Triton kernel {name}: its source does not start with {LAUNCH_TAG!r}")
        launch = json.loads(head[len(LAUNCH_TAG):])
        if launch["kind"] == "template":
            return self._template_definition(name, source, params, launch)
        if launch.get("split"):
            return self._split_definition(name, source, params, launch)
        cfg = launch["config"]
        args = list(params)
        lines = [f"_{name} = load_kernel(r'''{source}''', '{name}'{', interpret=True' if self.interpret else ''})",
                 f"def {name}({', '.join(args)}):"]
        numels = [("xnumel", launch["xnumel"])] + ([("rnumel", launch["rnumel"])] if launch["rnumel"] else []) + \
            ([("ynumel", launch["ynumel"])] if launch.get("ynumel") else [])
        grid_args = []   # the symbolic numels (a static one is a constant of the kernel)
        for var, text in numels:
            e = sympy.sympify(text)
            if not e.is_Integer:
                grid_args.append(var)
                lines.append(f"    {var} = {pexpr(e)}")
        xn = sympy.sympify(launch["xnumel"])
        yn = sympy.sympify(launch.get("ynumel") or 1)
        xtext, ytext = (str(int(e)) if e.is_Integer else v for e, v in ((xn, "xnumel"), (yn, "ynumel")))
        if "YBLOCK" in cfg:      # a tiled kernel: the tiles of (rows, columns), one program each
            grid = (f"({-(-int(yn) // cfg['YBLOCK']) * -(-int(xn) // cfg['XBLOCK'])},)" if xn.is_Integer and yn.is_Integer
                    else f"(cdiv({ytext}, {cfg['YBLOCK']}) * cdiv({xtext}, {cfg['XBLOCK']}),)")
        else:
            grid = f"({-(-int(xn) // cfg['XBLOCK'])},)" if xn.is_Integer else f"(cdiv(xnumel, {cfg['XBLOCK']}),)"
        consts = ", ".join(f"{k}={v}" for k, v in cfg.items())
        if self.interpret and "tl.device_assert" in source:
            call = f"checked_launch(_{name}, {grid}, {', '.join(args + grid_args)}, {consts})"
        elif self.interpret:
            call = f"_{name}[{grid}]({', '.join(args + grid_args)}, {consts})"
        else:    # the compiled kernel launched directly after its first call (runtime.Launcher)
            tune = getattr(self._local, "tune", None)
            extra = (f", tune={tune!r}" + (", persistent=True" if launch.get("persistent") else "")) if tune else ""
            lines.insert(1, f"_{name}_launch = Launcher(_{name}, {cfg!r}{extra})")
            job = None if grid_args else self._precompile_job(name, params, [], cfg)
            if job is not None and not tune:
                lines.insert(2, job)
            numel = f"({ytext}, {xtext})" if "YBLOCK" in cfg else xtext
            call = f"_{name}_launch({numel}, {', '.join(args + grid_args)})"
        if xn.is_Integer and yn.is_Integer and not self.interpret and int(xn) * int(yn) > 0:
            # static sizes: the launcher with its numel bound (functools.partial: no Python frame
            # between the wrapper's call and the launch)
            lines[lines.index(f"def {name}({', '.join(args)}):")] = f"{name} = partial(_{name}_launch, {numel})"
        elif xn.is_Integer and yn.is_Integer:
            lines.append(f"    {call}" if int(xn) * int(yn) > 0 else "    pass   # no elements")
        else:
            lines += [f"    if {xtext} * {ytext} > 0:", f"        {call}"]
        return lines

    def _split_definition(self, name, source, params, launch):
        """A split reduction (plan.py): its workspaces allocated on the device of its first buffer,
        the partial kernel over (row blocks x chunks), then ``<name>_final`` over the rows."""
        cfg, sp = launch["config"], launch["split"]
        xn = int(launch["xnumel"])
        fcfg = sp["final_config"]
        g1 = -(-xn // cfg["XBLOCK"]) * sp["split"]
        g2 = -(-xn // fcfg["XBLOCK"])
        first = next(p for p, (kind, _) in params.items() if kind not in ("size", "host scalar"))
        ws = [f"ws{k}" for k in range(len(sp["workspaces"]))]
        args = ", ".join(list(params) + ws)
        interp = ", interpret=True" if self.interpret else ""
        lines = [f"_{name} = load_kernel(r'''{source}''', '{name}'{interp})",
                 f"_{name}_final = load_kernel(r'''{source}''', '{name}_final'{interp})"]
        if not self.interpret:
            lines += [f"_{name}_launch = Launcher(_{name}, {cfg!r}, grid={g1})",
                      f"_{name}_final_launch = Launcher(_{name}_final, {fcfg!r}, grid={g2})"]
        lines.append(f"def {name}({', '.join(params)}):   # a split reduction: partial results, then their combine")
        for w, (dt, n) in zip(ws, sp["workspaces"]):
            lines.append(f"    {w} = torch.empty({n}, dtype={dt}, device={first}.device)")
        if self.interpret:
            lines += [f"    _{name}[({g1},)]({args}, {', '.join(f'{k}={v!r}' for k, v in cfg.items())})",
                      f"    _{name}_final[({g2},)]({args}, {', '.join(f'{k}={v!r}' for k, v in fcfg.items())})"]
        else:
            lines += [f"    _{name}_launch(None, {args})", f"    _{name}_final_launch(None, {args})"]
        return lines

    def _template_definition(self, name, source, params, launch):
        """A fused GEMM (template_fusion.py): a fixed grid, the operands (C when no epilogue stores
        it) and the epilogue's buffers and the prologue's scalars, then the sizes and strides as
        integers."""
        cfg, ints = launch["config"], ", ".join(map(str, launch["ints"]))
        args = ", ".join(launch["args"])
        lines = [f"_{name} = load_kernel(r'''{source}''', '{name}'{', interpret=True' if self.interpret else ''})"]
        if self.interpret:
            call = f"_{name}[({launch['grid']},)]({args}, {ints}, {', '.join(f'{k}={v!r}' for k, v in cfg.items())})"
        else:
            lines.append(f"_{name}_launch = Launcher(_{name}, {cfg!r}, grid={launch['grid']}, "
                         f"constexprs={tuple(launch['constexprs'])!r})")
            job = self._precompile_job(name, {a: params[a] for a in launch["args"]} if
                                       len(set(launch["args"])) == len(launch["args"]) else {"?": (None, 0)},
                                       launch["ints"], cfg)
            if job is not None:
                lines.append(job)
            call = f"_{name}_launch(None, {args}, {ints})"
        return lines + [f"def {name}({', '.join(params)}):   # {launch.get('what', 'GEMM + fused epilogue')}",
                        f"    {call}"]

    def kernel_call(self, name, params):
        return f"{name}({', '.join(p + '.item()' if kind == 'host scalar' else p for p, (kind, _) in params.items())})"

    def graph_runner(self, module, static_argnums, wrap):
        """CUDA graphs (triton/cudagraphs.py): the wrapper captured once and replayed; outputs of an
        earlier replay raise when read (exercise 27's hazard).  Not in the interpreter."""
        if self.interpret:
            return None
        with open(module.__file__, encoding="utf-8") as f:
            if "OPS['_random_seed']" in f.read():
                return None     # a replay would repeat the captured seed: random graphs are not replayed
        from .cudagraphs import OutputLifetimes, cudagraphify
        graphed = cudagraphify(module.call, static_argnums=static_argnums, spare=module.__dict__.get("spare"),
                               fixed=module.__dict__.get("constants", ()))
        return OutputLifetimes(graphed, wrap)

    def online_softmax(self, row):
        """Rows too long for a persistent kernel (plan.PERSISTENT_MAX_ROW) are passes through memory:
        the (m, d) monoid saves one of the three (kernel.py's ``online_softmax``)."""
        from ..sizevars import is_static, size_upper_bound
        from .plan import PERSISTENT_MAX_ROW
        top = int(row) if is_static(row) else size_upper_bound(row)
        return top is None or top > PERSISTENT_MAX_ROW

    def fits_row_scratch(self, elements):
        return True     # a persistent row lives in registers; a looped one recomputes (kernel.py)
