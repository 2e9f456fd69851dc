"""Cost analysis of a lowered graph: FLOPs and model bytes (chapter §1.1, seed 001 §2).

Model bytes (§1.1): every graph input is read once, every output written once, and every
*materialised* intermediate is written once and read once.  With the eager backend every op's
result is materialised; Stax passes the set of buffers it really writes.  FLOPs: the op table's
formula where an op has one (``OpDef.flops``: 2·M·N·K for matrix products, 2·(output elements)·
(kernel volume · C_in / groups) for convolutions), else by tags: one per output element for
pointwise and nn ops, one per input element for reductions and scans.

Compile amortisation (chapter §13.4, Prop. 13.4): a specialization that costs ``C`` seconds once
and then ``t_c`` per call, against ``t_e`` per call eagerly, has paid for itself after
``m >= N* = C / (t_e - t_c)`` calls when ``t_e > t_c``; never (``N* = inf``) otherwise
(``break_even_calls``; ``amortization`` measures the times; ``Compiled.cost_analysis`` reports both).
"""
from __future__ import annotations

import math

__all__ = ["cost_analysis", "nbytes", "compiled_cost_analysis", "break_even_calls", "amortization"]


def nbytes(val) -> int:
    if isinstance(val, (tuple, list)):
        return sum(nbytes(v) for v in val)
    if hasattr(val, "shape") and hasattr(val, "dtype"):
        return math.prod(val.shape) * val.element_size()
    return 0


def _numel(v):
    return math.prod(v.shape) if hasattr(v, "shape") else 0


def _flops(n) -> int:
    d = n.opdef
    if d is None:
        return 0
    out = n.meta.get("val")
    ins = [a.meta.get("val") for a in n.all_input_nodes]
    if d.flops is not None:                  # the op table's formula (matrix products, convolutions)
        f = d.flops(ins, out)
        if f is not None:
            return f
    if "reduction" in d.tags or "scan" in d.tags:
        return sum(_numel(i) for i in ins[:1])
    if "pointwise" in d.tags or "nn" in d.tags:
        return _numel(out) if not isinstance(out, tuple) else sum(_numel(o) for o in out)
    return 0


def cost_analysis(gm, materialized=None, intermediate_bytes=None) -> dict:
    """``intermediate_bytes``: the backend's own count of bytes written and read back for the
    buffers it materialises (Stax passes it); otherwise every op result counts (eager)."""
    g = gm.graph
    inputs = sum(nbytes(n.meta.get("val")) for n in g.nodes if n.op in ("placeholder", "get_attr"))
    out_nodes = [o for o in g.output_node.args[0]]
    outputs = sum(nbytes(o.meta.get("val")) for o in out_nodes)
    inter = 0
    for n in (g.nodes if intermediate_bytes is None else ()):
        if n.op != "call_function" or n in out_nodes or n.opdef is None or n.opdef.is_view:
            continue
        if materialized is not None and n.name not in materialized:
            continue
        inter += 2 * nbytes(n.meta.get("val"))
    if intermediate_bytes is not None:
        inter = intermediate_bytes
    flops = sum(_flops(n) for n in g.nodes if n.op == "call_function")
    return {"flops": float(flops), "bytes_accessed": float(inputs + outputs + inter),
            "input_bytes": float(inputs), "output_bytes": float(outputs), "intermediate_bytes": float(inter)}


def compiled_cost_analysis(cf, index=0) -> dict:
    """``cost_analysis`` of specialization ``index`` of a compiled function (what ``tp.compile``
    returns, after a call has compiled it), with the backend's own count of the buffers it writes."""
    if not cf._cache:
        raise ValueError(f"compiled_cost_analysis: {cf!r} has no specialization yet (call it once first)")
    e = cf._cache[index]
    return cost_analysis(e.lowered.graph_module, intermediate_bytes=getattr(e.artifact, "intermediate_bytes", None))


def break_even_calls(compile_s, t_eager, t_compiled) -> float:
    """Prop. 13.4: ``N* = compile_s / (t_eager - t_compiled)`` (seconds in, calls out): after ``m >=
    N*`` calls the compiled total ``C + m·t_c`` is at most the eager ``m·t_e``; ``inf`` where the
    compiled call is not faster.  The smallest whole number of calls is ``ceil(N*)``."""
    if compile_s < 0 or t_eager < 0 or t_compiled < 0:
        raise ValueError(f"break_even_calls: times must be >= 0, got C={compile_s}, t_e={t_eager}, t_c={t_compiled}")
    saving = t_eager - t_compiled
    return compile_s / saving if saving > 0 else math.inf


def amortization(eager, compiled, *, compile_s, t_eager=None, t_compiled=None, repeats=15, warmup=3) -> dict:
    """Prop. 13.4 for one specialization: ``t_eager`` and ``t_compiled`` (seconds per call of the
    zero-argument callables ``eager`` and ``compiled``) are measured where not given, interleaved
    (``utils.benchmark.compare``: the medians of ``repeats`` readings after ``warmup`` calls).
    Returns ``{"compile_s", "t_eager_s", "t_compiled_s", "saving_per_call_s", "break_even_calls"}``."""
    if t_eager is None or t_compiled is None:
        from ..utils.benchmark import compare
        fns = {k: f for k, f, t in (("eager", eager, t_eager), ("compiled", compiled, t_compiled)) if t is None}
        r = compare(fns, repeats=repeats, warmup=warmup)
        t_eager = r["eager"].median if t_eager is None else t_eager
        t_compiled = r["compiled"].median if t_compiled is None else t_compiled
    return {"compile_s": compile_s, "t_eager_s": t_eager, "t_compiled_s": t_compiled,
            "saving_per_call_s": t_eager - t_compiled,
            "break_even_calls": break_even_calls(compile_s, t_eager, t_compiled)}
