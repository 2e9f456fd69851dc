"""Fused pointwise prologues of the matmul templates in a compiled graph (the chapter, §9.8).

§9.8's template computes ``C = epilogue(prologue(A) @ B)``: matmul.py prints a prologue as lines
that turn the loaded A tile into what ``tl.dot`` reads (``matmul_template(head=...)``).  This module
forms one from a graph.  When the first operand A of an extern product (matmul's ``a``, linear's
``x``) is computed by a pointwise group P that only reads a buffer X element for element::

    kernel0 reads x: buf0 = gelu(x)             ->   kernel0: a = tile of x; a = gelu(a), rounded
    extern  buf1 = linear(buf0, w)                   to buf0's dtype; acc += a @ w.t(); buf0 never
                                                     exists

P is printed over the tile of X that the template loads (the same printer as every Triton kernel,
kernel.py), X becomes the GEMM's A operand, and P leaves the schedule.  template_fusion.fuse asks
:func:`find` after it has chosen the epilogues: with an epilogue the fused kernel is
prologue -> GEMM -> epilogue; without one P's group stands in for the extern (at its place in the
schedule) and the template stores C itself.

**Legal** (:func:`find`; anything else stays a kernel plus the product, as it was): A is P's
output itself (not a view of it), read by nothing but the product (not as its second operand or
bias either) and no graph output; no other node of P is read outside P; P is pointwise over A's
``[M, K]`` (static, M, K > 1); P reads exactly one buffer X -- 2-D, static strides, offset 0,
float16/bfloat16/float32, at least ``[M, K]`` -- and every load of it is at X's own element
``X[m, k]`` for P's ``(m, k)`` (no transposed, broadcast or masked load), besides host scalars (passed by value) and
constants; P has no index expressions (no iota, no random numbers); P is no other product's fused
epilogue.  A transposed or sliced X costs nothing: the template takes X's strides.

**Numerics.**  X's tile is loaded in X's dtype (float16/bfloat16 upcast to float32, as the P
kernel loads it), P is computed by the P kernel's printer, and its value is rounded to A's dtype
(``.to(A)``: what the P kernel would have stored) before the template converts it for the dot; the
K tail is zeroed again after it (matmul.py), so ``f(0) != 0`` is fine.  Guarantee: the fused
kernel computes what the P kernel followed by the product computes, to the GEMM's float32
summation order.

**The rule** (:func:`prologue_terms`; knob ``stax.triton.templates``: ``rule``, ``always`` -- every
legal prologue -- or ``never``).  Fusing saves writing A and reading it back, ``2 M K s_A`` bytes
(``t_saved = 2 M K s_A / B``); it costs recomputing P once per N block of the grid, ``ops * M * K *
ceil(N / BLOCK_N)`` operations on the CUDA cores inside the main loop (``t_recompute``, at the
machine's float32 instruction rate).  ``ops`` counts P's printed Triton operations (constants
not counted).  The rule fuses iff ``ops <= PROLOGUE_MAX_OPS`` and ``t_recompute <= t_saved``; when
no epilogue already made the product a template, the template also replaces cuBLAS, so it needs
matmul.choose's wave (one program per SM) and must save more than the template's deficit:
``t_saved - t_recompute >= eps * t_gemm``.

**In the dumps**: the fused kernel's source (``TP_STAX_DEBUG=code``, or the compiled function's
wrapper) has the lines ``# the fused pointwise prologue`` in its K loop and the wrapper's function
is marked ``# GEMM + fused prologue`` (``... and epilogue``); P's kernel is gone.
"""
from __future__ import annotations

import dataclasses
import math
import re

import sympy
import torch

from ..ir import ComputedBuffer, Unsupported
from ..sizevars import is_static
from .kernel import TritonKernel
from .ops import _Val, compute_dtype, tl_type
from .plan import TritonPlan

__all__ = ["FusedPrologue", "find", "prologue_terms", "PROLOGUE_MAX_OPS", "TileKernel", "matrix_layout",
           "buffer_name", "loads_own_element", "FLOATS"]

FLOATS = (torch.float16, torch.bfloat16, torch.float32)

#: the most operations (printed Triton operations of P, constants not counted) a prologue may have
#: for the rule to fuse it: every one runs once per element of A and N block inside the GEMM's main
#: loop, on the CUDA cores, with its temporaries in registers next to the accumulator tile -- a
#: long prologue starves the pipeline whatever the byte model says
PROLOGUE_MAX_OPS = 12


@dataclasses.dataclass
class FusedPrologue:
    """P of a fusion (module doc): its group, A (its output, never written) and A's dtype, X (its
    one buffer: the GEMM's A operand), the host scalars it reads, its Triton lines over the tile
    ``a`` (parameters renamed ``pro_<name>``) and their operation count."""
    group: object
    a: str
    a_dtype: torch.dtype
    x: object
    scalars: tuple
    lines: list
    ops: int


def matrix_layout(x):
    """The layout of ``x`` when it is a 2-D matrix of static sizes, strides and offset, else None."""
    lay = getattr(x, "layout", None)
    if lay is None or len(lay.size) != 2 or not all(is_static(e) for e in (*lay.size, *lay.stride, lay.offset)):
        return None
    return lay


def buffer_name(x):
    """The buffer ``x`` names (a view's: the buffer it views)."""
    return x.data.name if hasattr(x, "data") and hasattr(x.data, "name") else x.name


def loads_own_element(plan, name, layout) -> bool:
    """Every load of buffer ``name`` in a 2-D group's plan is at the group's own element of
    ``layout`` (``name[m, n]`` for the group's ``(m, n)``)."""
    rows, cols = plan.index_vars[0] + plan.index_vars[1]
    own = sympy.expand(layout.index([rows, cols]))
    return all(sympy.expand(a.index - own) == 0 for a in plan.accesses if a.buffer == name)


class TileKernel(TritonKernel):
    """A pointwise group of a fusion printed over a tile of the GEMM template (``shape``, of
    ``numel`` elements in all): the group's row index variable is the template's ``row``, its
    column variable ``col`` (the printer's own loops are not used)."""

    def __init__(self, plan, name, host_scalars, numel, row, col, shape):
        plan.device = TritonPlan("pointwise", False, False, sympy.Integer(numel), sympy.Integer(1), 1, 1, 4)
        super().__init__(plan, name, host_scalars)
        rows, cols = plan.index_vars[0] + plan.index_vars[1]
        r, c = (sympy.Symbol(v, integer=True, nonnegative=True) for v in (row, col))
        self._subs = {rows: r, cols: c}
        self.tiled, self.yvars, self.xvars, self.rvars = True, [r], [c], []
        self._shape = shape

    def full_shape(self, row):
        return self._shape

    def group_lines(self):
        """The lines computing the group's nodes (their values in ``phase_values``)."""
        out = []
        for ph in self.plan.phases:
            out += self._nodes([self.plan.nodes[n].ir for n in ph.nodes], row=False)
        return out


class _PrologueKernel(TileKernel):
    """P over the template's A tile: a load of X is the tile ``a``; A is not stored (its value is
    the prologue's result); temporaries ``ptN`` (the epilogue's are ``tN``)."""

    def __init__(self, plan, a, x, M, K, host_scalars):
        super().__init__(plan, "prologue", host_scalars, M * K, "pm", "pk", "[BLOCK_M, BLOCK_K]")
        self.a, self.x = a, x
        self.locals = plan.locals | {a}

    def tmp(self):
        self._tmp += 1
        return f"pt{self._tmp}"

    def local_value(self, name, handler):
        if name == self.x.name:
            return _Val("a", self.x.layout.dtype)
        return super().local_value(name, handler)

    def lines(self, a_dtype) -> tuple:
        """(lines, operation count) of the prologue."""
        xdt = self.x.layout.dtype
        out = ["# the fused pointwise prologue: a is X's tile, A's value (rounded to its dtype) is what the dot reads"]
        if compute_dtype(xdt) != xdt:
            out.append("a = a.to(tl.float32)")
        body = self.group_lines()
        v = self.phase_values[self.a]
        narrow = compute_dtype(a_dtype) != a_dtype or getattr(v, "dtype", a_dtype) != a_dtype
        out += body + [f"a = {v}.to({tl_type(a_dtype)})" if narrow else f"a = {v}"]
        return out, sum(1 for ln in body if "= tl.full([], " not in ln)


def find(sched, product_group, a, others, claimed=frozenset(), host_scalars=frozenset()):
    """The :class:`FusedPrologue` of the extern ``product_group`` whose first operand is ``a`` and
    whose other operands are ``others`` (module doc: legal), else None; ``claimed``: ids of groups
    fused already (epilogues)."""
    from ..kernel_plan import plan_kernel
    if not isinstance(a, ComputedBuffer) or a.name in sched.output_names or a.layout.dtype not in FLOATS:
        return None
    if a.name in {buffer_name(o) for o in others if o is not None}:
        return None
    p = sched.group_of.get(a.name)
    if p is None or p.is_extern or id(p) in claimed or p not in sched.groups or p.sig is None or p.sig[0] != "pw":
        return None
    M, K = (int(e) for e in a.layout.size)
    if not all(is_static(e) for e in p.sig[1]) or tuple(int(e) for e in p.sig[1]) != (M, K):
        return None
    if p.writes & sched.output_names:
        return None
    for h in sched.groups:          # A read by the product alone, P's other nodes by nobody outside P
        seen = h.reads & p.writes
        if h is not p and seen and (h is not product_group or seen != {a.name}):
            return None
    outside = p.reads - p.writes
    scalars = tuple(sorted(outside & host_scalars))
    bufs = outside - set(scalars)
    if len(bufs) != 1:
        return None
    xname = bufs.pop()
    x = next((b for b in list(sched.graph.inputs) + list(sched.graph.buffers) if b.name == xname), None)
    lay = matrix_layout(x)
    if lay is None or int(lay.offset) != 0 or lay.dtype not in FLOATS or int(lay.size[0]) < M or int(lay.size[1]) < K:
        return None         # (a size-1 dim is no dim of layout.index: X[0, k] would pass for X[m, k])
    try:
        plan = plan_kernel(sched, p)
    except Unsupported:
        return None
    loads = [acc for acc in plan.reads if acc.buffer == xname]
    if plan.index_exprs or plan.checked_loads or not loads or any(acc.mask is not None for acc in loads) \
            or not loads_own_element(plan, xname, lay):
        return None
    try:
        k = _PrologueKernel(plan, a.name, x, M, K, host_scalars)
        lines, ops = k.lines(a.layout.dtype)
    except Unsupported:
        return None
    if set(k.params) - set(scalars):
        return None
    for s in scalars:               # (the template's parameters: pro_<name>)
        lines = [re.sub(rf"\b{re.escape(s)}\b", f"pro_{s}", ln) for ln in lines]
    return FusedPrologue(p, a.name, a.layout.dtype, x, scalars, lines, ops)


def prologue_terms(M: int, N: int, K: int, a_dtype, ops: int, *, templated: bool, dtype=None,
                   machine="H100") -> dict:
    """The quantities of the prologue rule (module doc) for a product ``[M, K] @ [K, N]`` of
    ``dtype`` (default ``a_dtype``) whose prologue has ``ops`` operations and writes A in
    ``a_dtype``; ``templated``: an epilogue already made the product a template.  Keys:
    ``saved_bytes``, ``t_saved``, ``n_blocks`` (N blocks of the default config), ``t_recompute``,
    ``ops``, ``max_ops``, and without ``templated`` matmul.choice_terms' ``tiles``, ``sms``,
    ``deficit``, ``t_gemm``; ``choice``: ``"template"`` (fuse) or ``"extern"``."""
    from .matmul import MACHINES, choice_terms, default_config
    mach = MACHINES[machine] if isinstance(machine, str) else machine
    dtype = dtype or a_dtype
    n_blocks = math.ceil(N / default_config(M, N, K, dtype)["BLOCK_N"])
    saved = 2 * M * K * torch.empty((), dtype=a_dtype).element_size()
    rate = mach.peak["fp32"] / 2        # float32 instructions per second of the CUDA cores (an FMA: 2 FLOPs)
    t_saved, t_recompute = saved / mach.bandwidth, ops * M * K * n_blocks / rate
    ok = ops <= PROLOGUE_MAX_OPS and t_recompute <= t_saved
    terms = {"saved_bytes": saved, "t_saved": t_saved, "n_blocks": n_blocks, "t_recompute": t_recompute,
             "ops": ops, "max_ops": PROLOGUE_MAX_OPS}
    if not templated:           # the template replaces cuBLAS: matmul.choose's wave and deficit
        base = choice_terms(M, N, K, dtype, (), machine=mach)
        terms.update({k: base[k] for k in ("tiles", "sms", "deficit", "t_gemm")})
        ok = ok and base["tiles"] >= base["sms"] and t_saved - t_recompute >= base["deficit"] * base["t_gemm"]
    terms["choice"] = "template" if ok else "extern"
    return terms
