"""Matmul templates with fused epilogues in a compiled graph (the chapter, §9.8, table 11.1).

After scheduling, a matrix product that the lowering made an extern call (``matmul`` of two
matrices, or ``linear`` with its bias) followed by the pointwise group that alone reads its result
becomes one Triton kernel: the GEMM template of matmul.py, whose epilogue is that group -- printed
by the same printer as every Triton kernel (kernel.py), over the float32 accumulator tile instead
of a load of the product::

    extern  buf0 = linear(x, w, b)           ->   kernel0: acc = x @ w.t() (+ b), then
    kernel0 reads buf0: gelu(buf0) * 2             gelu(acc) * 2 stored; buf0 never exists

:func:`fuse` finds the pairs and rewrites the schedule (the extern group leaves it, the pointwise
group reads the product's operands instead); :func:`render` prints the fused kernel. A pair is
fused when the choice rule (matmul.choose: the bytes a separate epilogue pass moves against the
template's slower main loop) says ``template``; ``max-autotune`` measures the two in
matmul.tune when asked directly, the compiled graph uses the rule.

Legal pairs (everything else stays an extern plus a kernel): static sizes and strides; the
operands 2-D float16/bfloat16/float32 matrices; the product read by no other group and not an
output; the pointwise group's iteration space the product's ``[M, N]`` and every load of the
product at its own element (``buf0[m, n]`` for the group's ``(m, n)``). The product's value the
epilogue sees is rounded to its dtype first (what the extern would have stored). The group's other
loads (a bias, a residual, anything) are loads of the tile's rows ``rm`` and columns ``rn``.

Guarantee: the fused kernel computes what the extern call followed by the group computes, to the
GEMM's float32 summation order.
"""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ..ir import ExternBuffer
from ..sizevars import is_static
from .kernel import TritonKernel, LAUNCH_TAG
from .ops import _Val, compute_dtype, tl_type
from .plan import TritonPlan

__all__ = ["Fusion", "fuse", "render"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass
class Fusion:
    """One extern product fused into the pointwise group ``group``: ``C = a @ b`` (``b`` the
    transpose of the weight for ``linear``) plus ``bias`` (linear's, or None), of ``(M, N, K)``."""
    product: str
    group: object
    a: object
    b: object
    bias: object
    transpose_b: bool
    M: int
    N: int
    K: int
    dtype: torch.dtype


def _matrix(x):
    lay = getattr(x, "layout", None)
    if lay is None or len(lay.size) != 2 or not all(is_static(e) for e in (*lay.size, *lay.stride, lay.offset)):
        return None
    return lay


def _product(buf):
    """(a, b, bias, transpose_b) of an extern product the template computes, else None."""
    if not isinstance(buf, ExternBuffer) or buf.op is None or buf.index is not None:
        return None
    args = list(buf.args)
    if buf.op.name == "matmul" and len(args) == 2:
        a, b, bias, tb = args[0], args[1], None, False
    elif buf.op.name == "linear" and len(args) in (2, 3):
        a, b, bias, tb = args[0], args[1], (args[2] if len(args) == 3 else None), True
    else:
        return None
    la, lb = _matrix(a), _matrix(b)
    if la is None or lb is None or la.dtype not in _FLOATS or lb.dtype not in _FLOATS:
        return None
    if bias is not None:
        lz = getattr(bias, "layout", None)
        if lz is None or len(lz.size) != 1 or not is_static(lz.stride[0]) or not is_static(lz.offset):
            return None
    return a, b, bias, tb


def fuse(graph, sched, mode="rule") -> dict:
    """Find the fusable (product, group) pairs of a schedule and rewrite it (module doc); returns
    {frozenset of the group's node names: Fusion}.  ``mode`` (knob ``stax.triton.templates``):
    ``rule`` (matmul.choose decides), ``always`` (every legal pair), ``never``."""
    from ..kernel_plan import plan_kernel
    from .matmul import activation, choose as choose_rule
    fused = {}
    if mode == "never":
        return fused
    groups = sched.groups
    for g in list(groups):
        if not g.is_extern or len(g.nodes) != 1:
            continue
        buf = g.nodes[0].buf
        found = _product(buf)
        if found is None or buf.name in sched.output_names:
            continue
        readers = [h for h in groups if buf.name in h.reads]
        if len(readers) != 1 or readers[0].is_extern or readers[0].sig is None or readers[0].sig[0] != "pw":
            continue
        h = readers[0]
        M, N = (int(e) for e in buf.layout.size)
        a, b, bias, tb = found
        K = int(a.layout.size[1])
        if tuple(int(e) for e in h.sig[1]) != (M, N) or M * N * K == 0:
            continue
        if any(int(x.layout.offset) for x in (a, b, bias) if x is not None):
            continue
        if mode == "rule" and choose_rule(M, N, K, buf.layout.dtype, [activation("gelu")]) != "template":
            continue
        f = Fusion(buf.name, h, a, b, bias, tb, M, N, K, buf.layout.dtype)
        if not _loads_own_element(plan_kernel(sched, h), f, buf):
            continue
        fused[frozenset(n.name for n in h.nodes)] = f
    for f in fused.values():
        groups.remove(next(g for g in groups if g.is_extern and g.nodes[0].name == f.product))
        operands = {x.name if not hasattr(x, "data") or not hasattr(x.data, "name") else x.data.name
                    for x in (f.a, f.b, f.bias) if x is not None}
        f.group.reads = (f.group.reads - {f.product}) | operands
    return fused


class _Epilogue(TritonKernel):
    """The pointwise group of a fusion printed over the template's tile: the group's row variable
    is ``ym = rm[:, None]``, its column variable ``xn = rn[None, :]``, a load of the product is
    the accumulator rounded to the product's dtype (``acc_c``)."""

    def __init__(self, plan, name, fusion, host_scalars):
        plan.device = TritonPlan("pointwise", False, False, sympy.Integer(fusion.M * fusion.N), sympy.Integer(1),
                                 1, 1, 4)
        super().__init__(plan, name, host_scalars)
        self.fusion = fusion
        rows, cols = plan.index_vars[0] + plan.index_vars[1]
        ym, xn = sympy.Symbol("ym", integer=True, nonnegative=True), sympy.Symbol("xn", integer=True, nonnegative=True)
        self._subs = {rows: ym, cols: xn}
        self.tiled, self.yvars, self.xvars, self.rvars = True, [ym], [xn], []

    def full_shape(self, row):
        return "[BLOCK_M, BLOCK_N]"

    def local_value(self, name, handler):
        if name == self.fusion.product:
            return _Val("acc_c", self.fusion.dtype)
        return super().local_value(name, handler)

    def lines(self):
        dt = self.fusion.dtype
        out = ["# the fused pointwise group: the product's element is acc (rounded to its dtype)",
               "ym = rm[:, None]", "xn = rn[None, :]", "ymask = ym < M", "xmask = xn < N",
               "acc_c = acc" if compute_dtype(dt) == dt else f"acc_c = acc.to({tl_type(dt)}).to(tl.float32)"]
        for ph in self.plan.phases:
            out += self._nodes([self.plan.nodes[n].ir for n in ph.nodes], row=False)
        return out


def _loads_own_element(plan, fusion, buf):
    """Every load of the product in the group's plan is at the group's own element."""
    rows, cols = plan.index_vars[0] + plan.index_vars[1]
    own = sympy.expand(buf.layout.index([rows, cols]))
    return all(sympy.expand(a.index - own) == 0 for a in plan.accesses if a.buffer == fusion.product)


def render(plan, name, fusion, host_scalars, interpret):
    """(source, params) of the fused kernel (its first line ``# stax-launch:`` with the launch:
    the grid, the call's arguments and integers, the configuration; backend.kernel_definition)."""
    from .matmul import bias as bias_step, default_config, matmul_template, tf32_enabled
    ep = _Epilogue(plan, name, fusion, host_scalars)
    body = ep.lines()
    a, b, bias = fusion.a, fusion.b, fusion.bias
    params = {_name(a): (tl_type(a.layout.dtype), False), _name(b): (tl_type(b.layout.dtype), False)}
    if bias is not None:
        params[_name(bias)] = (tl_type(bias.layout.dtype), False)
    operands = list(params)
    tail_params = [f"ep_{p}" for p in ep.params]      # (a buffer the epilogue reads may be an operand too)
    for p in ep.params:
        params.setdefault(p, ep.params[p])
    cfg = default_config(fusion.M, fusion.N, fusion.K, fusion.dtype)
    steps = [bias_step(_name(bias), axis=1)] if bias is not None else []
    src, tname, constexprs = matmul_template(cfg, epilogue=steps, a_dtype=a.layout.dtype, b_dtype=b.layout.dtype,
                                             tf32=tf32_enabled(), even_k=fusion.K % cfg["BLOCK_K"] == 0,
                                             interpret=interpret, tail=(tail_params, body))
    src = src.replace(f"def {tname}(", f"def {name}(", 1)
    for p in ep.params:       # the epilogue's names of its buffers are its parameters' names
        src = _rename(src, p, f"ep_{p}", after="# the fused pointwise group")
    (sa_m, sa_k), (sb0, sb1) = (tuple(int(e) for e in x.layout.stride) for x in (a, b))
    sb_k, sb_n = (sb1, sb0) if fusion.transpose_b else (sb0, sb1)
    ints = [fusion.M, fusion.N, fusion.K, sa_m, sa_k, sb_k, sb_n] + \
        ([int(bias.layout.stride[0])] if bias is not None else [])
    grid = math.ceil(fusion.M / cfg["BLOCK_M"]) * math.ceil(fusion.N / cfg["BLOCK_N"])
    launch = {"kind": "template", "grid": grid, "ints": ints, "args": operands + list(ep.params),
              "config": {**constexprs, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
              "constexprs": list(constexprs), "product": fusion.product}
    import json
    return LAUNCH_TAG + json.dumps(launch) + "\n" + src, params


def _name(x):
    return x.data.name if hasattr(x, "data") and hasattr(x.data, "name") else x.name


def _rename(src, old, new, after):
    """``old`` as a whole word replaced by ``new`` after the marker ``after`` (the epilogue)."""
    import re
    head, sep, tail = src.partition(after)
    return head + sep + re.sub(rf"\b{re.escape(old)}\b", new, tail)
