"""Dumps of every Stax stage (the chapter's experiment 2: every stage can be read).

``TP_STAX_DEBUG`` (the knob ``stax.debug``) selects what ``compile_graph`` prints to stderr,
comma-separated (``1`` or ``all``: everything):

  ir        the loop-level IR after lowering: one line per buffer, its compute function printed
            through :class:`IRPrinter` (``buf1[i0] = sum_{j0<2048} exp(load(arg0, 2048*i0 + j0))``)
  schedule  the fused groups in execution order: iteration space, nodes with placement and phase,
            which values stay local (never reach memory), the modelled peak of live bytes
  plan      each kernel's KernelPlan (kernel_plan.format_plan): its loops and their merges, the
            nodes of each phase with placement, dtype, storage and store index, reduction kinds,
            every buffer read with its index expression, and the device's decisions (CPU:
            parallel depth, threads, vector loop, column mode, accumulators, cascades)
  code      each kernel's C++ source and the generated wrapper

``TP_STAX_DEBUG_DIR=dir`` (``stax.debug_dir``) writes the same text to
``dir/<graph hash>/{ir,schedule,plan,code}.txt`` instead.  ``TP_STAX_LOWER_DEBUG=1`` (lowering.py)
lists fallback kernels only.
"""
from __future__ import annotations

import hashlib
import os
import sys

from ... import config
from .ir import ComputedBuffer, ExternBuffer, Reduction
from .ops_handler import OPS_NAMES, set_handler

__all__ = ["IRPrinter", "format_ir", "format_schedule", "format_plans", "wanted", "emit"]

STAGES = ("ir", "schedule", "plan", "code")


def wanted() -> set:
    """The stages ``stax.debug`` (TP_STAX_DEBUG) asks for (empty: none)."""
    v = config.get("stax.debug").strip().lower()
    if v in ("", "0"):
        return set()
    if v in ("1", "all"):
        return set(STAGES)
    return {s.strip() for s in v.split(",") if s.strip() in STAGES}


class IRPrinter:
    """An ``ops`` handler whose values are strings: prints a compute function as an expression."""

    def __getattr__(self, name):
        if name not in OPS_NAMES:
            raise AttributeError(name)

        def f(*args, **kw):
            if name == "load":
                return f"load({args[0]}, {args[1]})"
            if name == "constant":
                return repr(args[0])
            if name == "index_expr":
                return f"index({args[0]})"
            if name == "to_dtype":
                return f"to_{str(args[1])[6:]}({args[0]})"
            if name == "masked":
                return f"masked({args[0]}, {args[1]()}, {args[2]!r})"
            if name == "indirect_indexing":
                return f"checked({args[0]}, {args[1]})"
            return f"{name}({', '.join(str(a) for a in args)})"
        return f


def _idx(prefix, n):
    import sympy
    return [sympy.Symbol(f"{prefix}{k}", integer=True) for k in range(n)]


def format_ir(graph) -> str:
    lines = [f"# loop IR: {len(graph.buffers)} buffers; inputs "
             + ", ".join(f"{b.name}{list(b.layout.size)}" for b in graph.inputs)]
    for b in graph.buffers:
        head = f"{b.name}: {str(b.layout.dtype)[6:]}{list(b.layout.size)} stride {list(b.layout.stride)}"
        if isinstance(b, ExternBuffer):
            lines.append(f"{head} = {b.kind} {getattr(b.op, 'name', b.op)}(...)  {b.reason}")
            continue
        if not isinstance(b, ComputedBuffer):
            lines.append(head)
            continue
        d = b.data
        idx = _idx("i", len(d.ranges))
        with set_handler(IRPrinter()):
            if isinstance(d, Reduction):
                ridx = _idx("j", len(d.reduction_ranges))
                body = d.inner_fn(idx, ridx)
                body = body if isinstance(body, str) else ", ".join(map(str, body))
                over = ", ".join(f"{j}<{n}" for j, n in zip(ridx, d.reduction_ranges))
                out = f".{d.output}" if d.output else ""
                lines.append(f"{head}\n    [{', '.join(map(str, idx))}] = {d.reduction_type}{out}_{{{over}}} {body}")
            else:
                lines.append(f"{head}\n    [{', '.join(map(str, idx))}] = {d.inner_fn(idx)}")
    return "\n".join(lines)


def format_schedule(sched, kernels) -> str:
    lines = [f"# schedule: {len(sched.groups)} groups (program order -> memory order, §7.5); "
             f"peak live bytes {sched.peak_bytes()} (program order: {sched.peak_bytes(sched.program_order)})"]
    from .scheduler import Group
    for g in sched.groups:
        if g.is_extern:
            n = g.nodes[0]
            lines.append(f"{n.name}: {n.buf.kind} call {getattr(n.buf.op, 'name', n.buf.op)}")
            continue
        name = kernels.get(id(g), ("?",))[0]
        local = sched.local_buffers(g)
        sig = sched.kernel_sig(g)
        lines.append(f"{name}: rows {list(sig[0])} x inner {list(sig[1])}, reads {sorted(g.reads - g.writes)}")
        for n in g.nodes:
            where = "local" if n.name in local else "memory"
            lines.append(f"    {n.name:8s} {Group.placement(n, sig) or '?':7s} {where}")
        for n in g.absorbed:        # (an extern's result the kernel computes: a GEMM template's product)
            lines.append(f"    {n.name:8s} {'product':7s} memory ({getattr(n.buf.op, 'name', n.buf.op)} in this kernel)")
    return "\n".join(lines)


def format_plans(kernels, plans) -> str:
    """Every kernel's plan, in kernel order."""
    from .kernel_plan import format_plan
    return "\n".join(format_plan(plans[k], kernels[k][0]) for k in kernels if k in plans)


def emit(gm, graph, sched, kernels, wrapper_src, plans=None) -> None:
    """Print (or write under TP_STAX_DEBUG_DIR) the stages TP_STAX_DEBUG asks for; ``plans``:
    id(group) -> KernelPlan, like ``kernels``."""
    stages = wanted()
    if not stages:
        return
    texts = {}
    if "ir" in stages:
        texts["ir"] = format_ir(graph)
    if "schedule" in stages:
        texts["schedule"] = format_schedule(sched, kernels)
    if "plan" in stages:
        texts["plan"] = format_plans(kernels, plans or {})
    if "code" in stages:
        texts["code"] = "\n\n".join([src for _, src, _ in kernels.values()] + [wrapper_src])
    out_dir = config.get("stax.debug_dir")
    if out_dir:
        d = os.path.join(out_dir, hashlib.sha256(gm.code.encode()).hexdigest()[:16])
        os.makedirs(d, exist_ok=True)
        for k, t in texts.items():
            with open(os.path.join(d, f"{k}.txt"), "w", encoding="utf-8") as f:
                f.write(t + "\n")
        print(f"[stax] debug dumps written to {d}", file=sys.stderr)
        return
    for k in STAGES:
        if k in texts:
            print(f"===== [stax] {k} =====\n{texts[k]}", file=sys.stderr)
