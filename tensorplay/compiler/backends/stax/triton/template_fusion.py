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

A pointwise prologue (template_prologue.py) composes with this: after the epilogues are chosen,
the product's first operand may be the prologue's (prologue -> GEMM -> epilogue in one kernel), and
a product without a fused epilogue may still take a prologue (then the kernel stores C itself).

Guarantee: the fused kernel computes what the extern call followed by the group computes, to the
GEMM's float32 summation order.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re

import torch

from ..ir import ExternBuffer
from ..sizevars import is_static
from .kernel import LAUNCH_TAG
from .ops import _Val, compute_dtype, tl_type
from .template_prologue import FLOATS, TileKernel, buffer_name as _name, find as find_prologue, \
    loads_own_element, matrix_layout as _matrix, prologue_terms

__all__ = ["Fusion", "fuse", "render"]


@dataclasses.dataclass
class Fusion:
    """One extern product fused into a GEMM template: ``C = a @ b`` (``b`` the transpose of the
    weight for ``linear``) plus ``bias`` (linear's, or None), of ``(M, N, K)``; ``group``: the
    pointwise group fused as its epilogue (None: the kernel stores C); ``prologue``: the fused
    prologue (template_prologue.FusedPrologue) or None; ``c_stride``: the product's strides."""
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
    prologue: object = None
    c_stride: tuple = ()


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
    if la is None or lb is None or la.dtype not in FLOATS or lb.dtype not in FLOATS:
        return None
    if bias is not None:
        lz = getattr(bias, "layout", None)
        if lz is None or len(lz.size) != 1 or not is_static(lz.stride[0]) or not is_static(lz.offset):
            return None
    if any(int(x.layout.offset) for x in (a, b, bias) if x is not None) or _matrix(buf) is None:
        return None
    return a, b, bias, tb


def fuse(graph, sched, mode="rule", host_scalars=frozenset()) -> dict:
    """Find the fusable products of a schedule, their epilogue groups (module doc) and then their
    prologues (template_prologue.find), and rewrite the schedule; returns {frozenset of the fused
    kernel group's node names: Fusion}.  ``mode`` (knob ``stax.triton.templates``): ``rule``
    (matmul.choose and template_prologue.prologue_terms decide), ``always`` (every legal pair),
    ``never``; ``host_scalars``: the one-element host buffers a kernel takes by value."""
    from ..kernel_plan import plan_kernel
    from .matmul import activation, choose as choose_rule
    fused = {}
    if mode == "never":
        return fused
    groups = sched.groups
    products = []
    for g in list(groups):
        if not g.is_extern or len(g.nodes) != 1:
            continue
        buf = g.nodes[0].buf
        found = _product(buf)
        if found is None:
            continue
        M, N = (int(e) for e in buf.layout.size)
        a, b, bias, tb = found
        K = int(a.layout.size[1])
        if M * N * K == 0:
            continue
        f = Fusion(buf.name, None, a, b, bias, tb, M, N, K, buf.layout.dtype,
                   c_stride=tuple(int(e) for e in buf.layout.stride))
        products.append((g, f))
        if buf.name in sched.output_names:
            continue
        readers = [h for h in groups if buf.name in h.reads]
        if len(readers) != 1 or readers[0].is_extern or readers[0].sig is None or readers[0].sig[0] != "pw":
            continue
        h = readers[0]
        if not all(is_static(e) for e in h.sig[1]) or tuple(int(e) for e in h.sig[1]) != (M, N):
            continue
        if mode == "rule" and choose_rule(M, N, K, buf.layout.dtype, [activation("gelu")]) != "template":
            continue
        if not loads_own_element(plan_kernel(sched, h), buf.name, buf.layout):
            continue
        f.group = h
        fused[frozenset(n.name for n in h.nodes)] = f
    claimed = {id(f.group) for f in fused.values()}
    for g, f in products:
        pro = find_prologue(sched, g, f.a, (f.b, f.bias), claimed, host_scalars)
        if pro is None:
            continue
        if mode == "rule" and prologue_terms(f.M, f.N, f.K, pro.a_dtype, pro.ops, templated=f.group is not None,
                                             dtype=f.dtype)["choice"] != "template":
            continue
        f.prologue = pro
        claimed.add(id(pro.group))
        if f.group is None:
            fused[frozenset(n.name for n in pro.group.nodes)] = f
    orders = [groups] + ([sched.program_order] if getattr(sched, "program_order", None) is not None else [])
    for g, f in products:
        if f.group is None and f.prologue is None:
            continue
        pro = f.prologue
        operands = {_name(x) for x in (pro.x if pro else f.a, f.b, f.bias) if x is not None} | \
            set(pro.scalars if pro else ())
        for order in orders:            # (the program order too: debug.py's peak bytes walk it)
            if pro is not None:
                order.remove(pro.group)
            if f.group is not None:
                order.remove(g)
            else:
                order[order.index(g)] = pro.group
        if f.group is not None:        # the epilogue group computes the product
            f.group.reads = (f.group.reads - {f.product}) | operands
        else:                          # P's group computes it, at the product's place
            pro.group.reads |= operands
            pro.group.writes.add(f.product)
            pro.group.absorbed.append(g.nodes[0])
            sched.group_of[f.product] = pro.group
    return fused


class _Epilogue(TileKernel):
    """The pointwise group of a fusion printed over the template's tile: the group's row variable
    is ``ym = rm[:, None]``, its column variable ``xn = rn[None, :]``, a load of the product is
    the accumulator rounded to the product's dtype (``acc_c``)."""

    def __init__(self, plan, name, fusion, host_scalars):
        super().__init__(plan, name, host_scalars, fusion.M * fusion.N, "ym", "xn", "[BLOCK_M, BLOCK_N]")
        self.fusion = fusion

    def local_value(self, name, handler):
        if name == self.fusion.product:
            return _Val("acc_c", self.fusion.dtype)
        return super().local_value(name, handler)

    def lines(self):
        dt = self.fusion.dtype
        out = ["# the fused pointwise group: the product's element is acc (rounded to its dtype)",
               "ym = rm[:, None]", "xn = rn[None, :]", "ymask = ym < M", "xmask = xn < N",
               "acc_c = acc" if compute_dtype(dt) == dt else f"acc_c = acc.to({tl_type(dt)}).to(tl.float32)"]
        return out + self.group_lines()


def render(plan, name, fusion, host_scalars, interpret):
    """(source, params) of the fused kernel (its first line ``# stax-launch:`` with the launch:
    the grid, the call's arguments and integers, the configuration; backend.kernel_definition)."""
    from .matmul import Prologue, bias as bias_step, default_config, matmul_template, tf32_enabled
    pro = fusion.prologue
    a, b, bias = (pro.x if pro is not None else fusion.a), fusion.b, fusion.bias
    params = {_name(a): (tl_type(a.layout.dtype), False), _name(b): (tl_type(b.layout.dtype), False)}
    if fusion.group is None:           # the kernel stores C
        params[fusion.product] = (tl_type(fusion.dtype), True)
    if bias is not None:
        params[_name(bias)] = (tl_type(bias.layout.dtype), False)
    operands = list(params)
    tail, ep_params = None, []
    if fusion.group is not None:
        ep = _Epilogue(plan, name, fusion, host_scalars)
        body = ep.lines()
        ep_params = list(ep.params)
        tail = ([f"ep_{p}" for p in ep_params], body)      # (a buffer the epilogue reads may be an operand too)
        for p in ep_params:
            params.setdefault(p, ep.params[p])
    head, prologue = None, None
    if pro is not None:
        head, prologue = ([f"pro_{s}" for s in pro.scalars], pro.lines), Prologue("a", dtype=pro.a_dtype)
        for s in pro.scalars:
            params.setdefault(s, ("host scalar", False))
    cfg = default_config(fusion.M, fusion.N, fusion.K, fusion.dtype)
    steps = [bias_step(_name(bias), axis=1)] if bias is not None else []
    src, tname, constexprs = matmul_template(cfg, epilogue=steps, prologue=prologue, a_dtype=a.layout.dtype,
                                             b_dtype=b.layout.dtype, tf32=tf32_enabled(),
                                             even_k=fusion.K % cfg["BLOCK_K"] == 0, interpret=interpret,
                                             tail=tail, head=head)
    src = src.replace(f"def {tname}(", f"def {name}(", 1)
    for p in ep_params:       # the epilogue's names of its buffers are its parameters' names
        src = _rename(src, p, f"ep_{p}", after="# the fused pointwise group")
    (sa_m, sa_k), (sb0, sb1) = (tuple(int(e) for e in x.layout.stride) for x in (a, b))
    sb_k, sb_n = (sb1, sb0) if fusion.transpose_b else (sb0, sb1)
    ints = [fusion.M, fusion.N, fusion.K, sa_m, sa_k, sb_k, sb_n]
    if fusion.group is None:
        ints += list(fusion.c_stride)
    ints += [int(bias.layout.stride[0])] if bias is not None else []
    grid = math.ceil(fusion.M / cfg["BLOCK_M"]) * math.ceil(fusion.N / cfg["BLOCK_N"])
    what = " and ".join(w for w, on in (("prologue", pro is not None), ("epilogue", fusion.group is not None)) if on)
    launch = {"kind": "template", "grid": grid, "ints": ints,
              "args": operands + ep_params + list(pro.scalars if pro is not None else ()),
              "config": {**constexprs, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]},
              "constexprs": list(constexprs), "product": fusion.product, "what": f"GEMM + fused {what}"}
    return LAUNCH_TAG + json.dumps(launch) + "\n" + src, params


def _rename(src, old, new, after):
    """``old`` as a whole word replaced by ``new`` after the marker ``after`` (the epilogue)."""
    head, sep, tail = src.partition(after)
    return head + sep + re.sub(rf"\b{re.escape(old)}\b", new, tail)
