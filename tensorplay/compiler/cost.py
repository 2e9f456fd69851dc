"""Cost analysis of a lowered graph: FLOPs and model bytes (chapter §1.1, seed 001 §2).

Model bytes (§1.1): every graph input is read once, every output written once, and every
*materialised* intermediate is written once and read once.  With the eager backend every op's
result is materialised; Stax passes the set of buffers it really writes.  FLOPs: the op table's
formula where an op has one (``OpDef.flops``: 2·M·N·K for matrix products, 2·(output elements)·
(kernel volume · C_in / groups) for convolutions), else by tags: one per output element for
pointwise and nn ops, one per input element for reductions and scans.
"""
from __future__ import annotations

import math

__all__ = ["cost_analysis", "nbytes"]


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
