"""Triton code generation: a kernel plan printed as one ``@triton.jit`` function (the chapter, §9).

A pointwise plan (``TritonPlan.kind == "pointwise"``) reads::

    @triton.jit
    def kernel0(arg0, buf0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)     # one block of elements
        xmask = xindex < xnumel                                        # the tail
        xm1 = xindex % 2048                                            # the loops, innermost fastest
        xm0 = xindex // 2048
        t1 = tl.load(arg0 + (xm0 + 8192 * xm1), xmask, other=0)        # (a transpose's read)
        ...
        tl.store(buf0 + (2048 * xm0 + xm1), t5, xmask)

A reduction plan puts the outer loops on ``xindex`` (``[XBLOCK, 1]``, rows) and the reduced loops
on ``rindex`` (``[1, RBLOCK]``).  *Persistent* (plan.py): the row is one block, each phase's
reductions are ``tl.sum`` / ``tl.reduce`` of it, and a later phase reads the earlier phases'
values from registers (softmax: one read of the row, ``exp`` once per element).  *Looped*: a phase
runs ``for roffset in tl.range(0, rnumel, RBLOCK)`` with per-lane accumulators ``[XBLOCK, RBLOCK]``
folded by the monoid's combine (invariant 6) and reduced across lanes after the loop; a value an
earlier phase computed is recomputed from its compute function (§6.6: recomputing is cheaper on a
GPU than writing it out).  Row values (reductions, outer nodes) are ``[XBLOCK, 1]`` blocks.

argmax/argmin reduce (value, flat index) pairs with a NaN-aware combine (the first index among
equal values, NaN the largest); welford keeps (mean, m2, weight) per lane in a looped kernel and
combines them by Chan's formula, a persistent one computes the mean first and then the squared
deviations (two passes over registers); online_softmax keeps (m, d) per lane, d rescaled to each
new max (Prop. 9.1).  The combine functions are ``@triton.jit`` helpers printed before the kernel
(:data:`HELPERS`).

A *tiled* pointwise plan (a transpose) is one ``[YBLOCK, XBLOCK]`` tile per program, ``yindex``
the outer loop and ``xindex`` the inner.  A *split* reduction (few long rows) runs each program
over one chunk of its rows (``spid``), stores the chunk's partial results in workspaces
``ws0, ws1, ...`` and a second function ``<name>_final`` combines them and computes the row values
read from them.

The loops, their merges, the phases and where each value lives come from the plan; the kernel
kind and block sizes from its GPU section (plan.py); nothing is decided here but how each value is
printed.  The kernel's source starts with a ``# stax-launch:`` line (JSON: the grid's numel
expressions, the launch configuration) that the wrapper's launcher is written from (backend.py).
"""
from __future__ import annotations

import json
import math

import sympy
import torch

from ..ir import Unsupported
from ..ops_handler import set_handler
from .. import sizevars
from .ops import GPU_IMPORTS, TritonHandler, _Val, compute_dtype, literal, texpr, tl_type
from .plan import plan_triton

__all__ = ["generate_kernel", "HELPERS", "LAUNCH_TAG"]

#: the first line of a kernel's source: ``# stax-launch: {json}`` (backend.py reads it)
LAUNCH_TAG = "# stax-launch: "

#: combine functions of the reductions that are not tl.sum / tl.max / tl.min
HELPERS = {
    "_max_combine": '''@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)    # (max.NaN: one instruction)
''',
    "_min_combine": '''@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_prod_combine": '''@triton.jit
def _prod_combine(a, b):
    return a * b
''',
    "_argmax_combine": '''@triton.jit
def _argmax_combine(va, ia, vb, ib):
    # a wins: larger, or NaN (the largest), or equal / both NaN with the smaller index
    a_nan, b_nan = va != va, vb != vb
    take_a = (va > vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)
''',
    "_argmin_combine": '''@triton.jit
def _argmin_combine(va, ia, vb, ib):
    a_nan, b_nan = va != va, vb != vb
    take_a = (va < vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)
''',
    "_floordiv_float": '''@triton.jit
def _floordiv_float(a, b):
    # torch's floor division of floats: from fmod, rounded to the nearest integer quotient
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    zero = libdevice.copysign(a * 0.0 + 0.0, a / b)
    return tl.where(b == 0, a / b, tl.where(div != 0, fl, zero))
''',
    "_pow_int": '''@triton.jit
def _pow_int(a, b):
    # a ** b of integers by squaring (64 bits of the exponent; a negative one gives 0, 1 or -1 as 1/a**n truncated)
    r = tl.full(a.shape, 1, a.dtype) + a * 0
    base = a
    e = b
    for _ in tl.static_range(64):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0)).to(a.dtype)
    return tl.where(b < 0, neg, r)
''',
    "_online_softmax_combine": '''@triton.jit
def _online_softmax_combine(m_a, d_a, m_b, d_b):
    # Prop. 9.1: (m, d) of two parts of a row -- d rescaled to the larger max (an equal max: no
    # exp, so that a part of -inf only, d = 0, adds 0 rather than 0 * exp(-inf - -inf) = NaN)
    m = tl.maximum(m_a, m_b, propagate_nan=tl.PropagateNan.ALL)
    s_a = tl.where(m_a == m, 1.0, tl.exp(m_a - m))
    s_b = tl.where(m_b == m, 1.0, tl.exp(m_b - m))
    return m, d_a * s_a + d_b * s_b
''',
    "_welford_combine": '''@triton.jit
def _welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # Chan et al.: the (mean, m2, weight) of two disjoint sets
    n = n_a + n_b
    delta = mean_b - mean_a
    w_b = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    return mean_a + delta * w_b, m2_a + m2_b + delta * delta * n_a * w_b, n
''',
}

_IDENT = {"sum": 0, "prod": 1, "any": 0, "all": 1}


def _identity(rt, dtype) -> str:
    if rt in _IDENT:
        return literal(_IDENT[rt], dtype)
    if dtype.is_floating_point:
        return f"float('{'-' if rt in ('max', 'argmax') else ''}inf')"
    if dtype == torch.bool:
        return "False" if rt in ("max", "argmax") else "True"
    info = torch.iinfo(dtype)
    return str(info.min if rt in ("max", "argmax") else info.max)


class TritonKernel:
    """Prints the Triton function of one plan whose ``device`` is a TritonPlan (module doc)."""

    def __init__(self, plan, name, host_scalars=frozenset()):
        self.plan, self.gpu, self.name = plan, plan.device, name
        #: one-element buffers in host memory (the graph's random seed on a GPU): scalar arguments
        self.host_scalars = host_scalars
        self._tmp = 0
        self.dtypes = {b: f.dtype for b, f in plan.buffers.items()}
        self.locals = plan.locals
        self.placements = {n.name: n.placement for n in plan.nodes.values()}
        self.index_dtype = plan.index_dtype
        self.params = {}          # buffer name -> (Triton element type, written?)
        self.row_values = {}      # reduce/outer results: name -> Triton variable ([XBLOCK, 1])
        self.phase_values = {}    # inner values of the current block: name -> _Val
        self.helpers = set()
        self.cse = {}             # expression -> value of the current scope (the kernel; a loop body)
        self.workspaces = []      # a split reduction's partial results: (reduction node plan, acc dtype)
        self.reduction = self.gpu.kind == "reduction"
        self._subs = dict(plan.substitution)
        self.tiled = bool(self.gpu.YBLOCK)
        loops = plan.outer_loops + plan.inner_loops
        self.yvars = [loops[0].var] if self.tiled else []
        self.xvars = [lp.var for lp in (plan.outer_loops if self.reduction else loops[1:] if self.tiled else loops)]
        self.rvars = [lp.var for lp in plan.inner_loops] if self.reduction else []
        # a static numel is a literal of the kernel (constant trip counts), a symbolic one an argument
        g = self.gpu
        self.xnumel = str(int(g.xnumel)) if sympy.sympify(g.xnumel).is_Integer else "xnumel"
        self.rnumel = str(int(g.rnumel)) if sympy.sympify(g.rnumel).is_Integer else "rnumel"

    # -- what the handler asks ------------------------------------------------------------------------
    def tmp(self):
        self._tmp += 1
        return f"t{self._tmp}"

    def dtype_of(self, name):
        return self.dtypes[name]

    def helper(self, name):
        """The name of a helper function of :data:`HELPERS`, printed before the kernel."""
        self.helpers.add(name)
        return name

    def ptr(self, name):
        if name in self.host_scalars:
            self.params[name] = ("host scalar", False)      # passed by value (backend.kernel_call)
            return name
        if name not in self.params:
            self.params[name] = (tl_type(self.dtypes[name]), False)
        return name

    def translate(self, expr):
        e = sympy.expand(sympy.sympify(expr))
        return e.xreplace(self._subs) if self._subs else e

    def size_symbols(self):
        return sizevars.current().symbols

    def groups_of(self, e, row):
        """The block axes an index over the loop variables varies along: ``x`` (rows / elements)
        and ``r`` (a reduction's row block); all of the context's for a data-dependent one."""
        ctx = self.context_groups(row)
        if e is None:
            return ctx
        free = e.free_symbols
        return [g for g, vs in (("y", self.yvars), ("x", self.xvars), ("r", self.rvars)) if g in ctx and free & set(vs)]

    def context_groups(self, row):
        return ["x", "r"] if self.reduction and not row else ["y", "x"] if self.tiled else ["x"]

    def full_shape(self, row):
        """The shape of a full block of the context."""
        if self.tiled:
            return "[YBLOCK, XBLOCK]"
        return "[XBLOCK]" if not self.reduction else "[XBLOCK, 1]" if row else "[XBLOCK, RBLOCK]"

    def local_value(self, name, handler):
        if name in self.row_values:
            return _Val(self.row_values[name], self.dtypes[name])
        if name in self.phase_values:
            return self.phase_values[name]
        node = self.plan.nodes.get(name)
        if node is not None and node.placement == "inner" and name in self.locals:
            # an inner value of an earlier phase of a looped reduction: recomputed here
            v = node.ir.buf.data.inner_fn(node.index[0])
            self.phase_values[name] = v
            return v
        return None

    # -- printing -------------------------------------------------------------------------------------
    def _split(self, flat, loops):
        """Lines defining the loop variables ``loops`` [(var, size)] from the flat index ``flat``."""
        lines = []
        if len(loops) == 1:
            return [f"{loops[0][0]} = {flat}"]
        stride = sympy.Integer(1)
        for k in range(len(loops) - 1, -1, -1):
            var, size = loops[k]
            q = flat if stride == 1 else f"({flat} // {texpr(stride)})"
            lines.append(f"{var} = {q}" if k == 0 else f"{var} = {q} % {texpr(size)}")
            stride = stride * size
        return lines

    def _loops(self, loops):
        return [(lp.var, lp.size) for lp in loops]

    def generate(self):
        g, plan = self.gpu, self.plan
        wide = self.index_dtype == torch.int64
        pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        body = []
        if self.tiled:
            ynumel = str(int(g.ynumel)) if sympy.sympify(g.ynumel).is_Integer else "ynumel"
            body += [f"ytiles = ({ynumel} + YBLOCK - 1) // YBLOCK",
                     f"yindex = ({pid} % ytiles) * YBLOCK + tl.arange(0, YBLOCK)[:, None]",
                     f"xindex = ({pid} // ytiles) * XBLOCK + tl.arange(0, XBLOCK)[None, :]",
                     f"ymask = yindex < {ynumel}", f"xmask = xindex < {self.xnumel}",
                     f"{self.yvars[0]} = yindex", f"{self.xvars[0]} = xindex"]
            for ph in plan.phases:
                body += self._nodes([plan.nodes[n].ir for n in ph.nodes], row=False)
        elif not self.reduction:
            body += [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", f"xmask = xindex < {self.xnumel}"]
            body += self._split("xindex", self._loops(plan.outer_loops + plan.inner_loops))
            for ph in plan.phases:
                body += self._nodes([plan.nodes[n].ir for n in ph.nodes], row=False)
        else:
            if g.split:     # a split reduction (plan.py): program = (row block, chunk of the rows)
                body += [f"spid = {pid} % {g.split}", f"xindex = ({pid} // {g.split}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
                         f"xmask = xindex < {self.xnumel}"]
            else:
                body += [f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", f"xmask = xindex < {self.xnumel}"]
            if plan.outer_loops:
                body += self._split("xindex", self._loops(plan.outer_loops))
            body.append("rbase = tl.arange(0, RBLOCK)[None, :]")
            if g.persistent:
                body += self._rdefs("rbase")
            for ph in plan.phases:
                body += self._phase(ph)
        return self._finish(body)

    def _rdefs(self, rindex):
        if self.gpu.persistent and self.rnumel == str(self.gpu.RBLOCK):
            # the block is the row (RBLOCK is fixed for a persistent kernel, also when tuned): no tail
            lines = [f"rindex = {rindex}", "rmask = tl.full([1, RBLOCK], True, tl.int1)"]
        else:
            lines = [f"rindex = {rindex}", f"rmask = rindex < {self.rnumel}"]
        return lines + (self._split("rindex", self._loops(self.plan.inner_loops)) if self.plan.inner_loops else [])

    def _finish(self, body):
        final_body = self._split_final_body() if self.gpu.split else None   # (its loads are parameters too)
        params = list(self.params)
        text = "\n".join(body)
        g = self.gpu
        numel_syms = sympy.sympify(g.xnumel).free_symbols | sympy.sympify(g.rnumel).free_symbols | \
            sympy.sympify(g.ynumel).free_symbols
        syms = sorted((s for s in self.size_symbols() if _mentions(text, s.name) or s in numel_syms),
                      key=lambda s: (len(s.name), s.name))      # (the launcher computes the grid from them)
        for s in syms:
            self.params[s.name] = ("size", None)    # a size argument (sizevars.py)
        if self.gpu.split:
            params = params + [f"ws{k}" for k in range(len(self.workspaces))]
        g = self.gpu
        numels = [("xnumel", g.xnumel)] + ([("rnumel", g.rnumel)] if self.reduction else []) + \
            ([("ynumel", g.ynumel)] if self.tiled else [])
        # a static numel is a constant of the kernel (constant trip counts), a symbolic one an argument
        sig = params + [s.name for s in syms] + [v for v, e in numels if not sympy.sympify(e).is_Integer] + \
            ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.reduction else []) + \
            (["YBLOCK: tl.constexpr"] if self.tiled else [])
        launch = {"xnumel": str(g.xnumel), "rnumel": str(g.rnumel) if self.reduction else None,
                  "ynumel": str(g.ynumel) if self.tiled else None,
                  "config": g.config, "kind": g.kind, "persistent": g.persistent}
        head = [LAUNCH_TAG + json.dumps(launch), *GPU_IMPORTS, ""]
        final = self._split_final(sig, final_body) if g.split else []
        if g.split:
            launch["split"] = {"split": g.split, "final_config": {"XBLOCK": self._final_xblock(), "num_warps": 4,
                                                                   "num_stages": 1},
                               "workspaces": [[str(dt), int(g.xnumel) * g.split] for _, dt in self.workspaces]}
            head[0] = LAUNCH_TAG + json.dumps(launch)
        helpers = [HELPERS[h] for h in sorted(self.helpers)]
        # a data-dependent index is checked by tl.device_assert, which Triton compiles in debug mode only
        jit = "@triton.jit(debug=True)" if "tl.device_assert" in text else "@triton.jit"
        fn = [jit, f"def {self.name}({', '.join(sig)}):"] + ["    " + ln for ln in body]
        return "\n".join(head + helpers + fn + final) + "\n"

    def _final_xblock(self):
        return max(1, min(64, 4096 // self.gpu.split, 1 << max(0, int(self.gpu.xnumel) - 1).bit_length()))

    def _split_final(self, sig, lines):
        """The second kernel of a split reduction, ``<name>_final`` (body: :meth:`_split_final_body`),
        with the first kernel's parameters but RBLOCK."""
        fsig = [p for p in sig if not p.startswith("RBLOCK")]
        return ["", "", "@triton.jit", f"def {self.name}_final({', '.join(fsig)}):"] + ["    " + ln for ln in lines]

    def _split_final_body(self):
        """Per row, the ``split`` partial results of each reduction combined by its monoid, stored
        where the reduction's output goes, then the phase's row values computed from them."""
        g, lines = self.gpu, []
        self.cse = {}       # (a new kernel: none of the first one's values)
        lines += ["xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]", f"xmask = xindex < {self.xnumel}",
                  f"sindex = tl.arange(0, {g.split})[None, :]"]
        if self.plan.outer_loops:
            lines += self._split("xindex", self._loops(self.plan.outer_loops))
        for k, (r, acc) in enumerate(self.workspaces):
            kind = r.reduction.kind
            part = f"tl.load(ws{k} + xindex * {g.split} + sindex, xmask, other={_identity(kind, acc)})"
            lines.append(f"v_{r.name} = {self._tree(kind, part, tl_type(acc))}")
            self.row_values[r.name] = f"v_{r.name}"
            if r.name not in self.locals:
                lines.append(self._store(r.ir, _Val(f"v_{r.name}", r.ir.buf.layout.dtype), self._handler(True), True))
        lines += self._nodes(getattr(self, "split_outer", []), True)
        return lines

    def _handler(self, row):
        return TritonHandler(self, row=row)

    def _nodes(self, nodes, row, acc_update=None):
        """Lines computing ``nodes`` (inner or outer placement; reduce nodes through
        ``acc_update(node, value, handler)``) and storing those that reach memory."""
        out = []
        for n in nodes:
            pl = self.placements[n.name]
            h = self._handler(row or pl == "outer")
            idx, ridx = self.plan.nodes[n.name].index
            with set_handler(h):
                if pl == "reduce":
                    if self.plan.nodes[n.name].reduction.leader != n.name:
                        continue
                    v = n.buf.data.inner_fn(idx, ridx)
                    if n.buf.data.reduction_type in ("argmax", "argmin"):
                        flat = sum((r * math.prod(n.rranges[k + 1:]) for k, r in enumerate(ridx)), sympy.Integer(0))
                        v = (v, h.index_expr(flat, torch.int64))
                    out += h.lines
                    out += acc_update(n, v, h)
                    continue
                v = n.buf.data.inner_fn(idx)
            out += h.lines
            if pl == "outer":
                self.row_values[n.name] = v.name
            else:
                self.phase_values[n.name] = v
            if n.name not in self.locals:
                out.append(self._store(n, v, h, row or pl == "outer"))
        return out

    def _store(self, n, v, h, row):
        self.params[n.name] = (tl_type(n.buf.layout.dtype), True)
        index = n.buf.layout.index(self.plan.nodes[n.name].index[0])
        ptr, mask = h.pointer(n.name, index, store=True)
        val = v.name if isinstance(v, _Val) else str(v)
        dt = n.buf.layout.dtype
        if compute_dtype(dt) != dt or v.dtype != dt:
            val = f"{val}.to({tl_type(dt)})"
        return f"tl.store({ptr}, {val}, {mask})"

    # -- reductions -----------------------------------------------------------------------------------
    def _phase(self, ph):
        plan, out = self.plan, [f"# phase {ph.number}: {', '.join(ph.nodes)}"]
        inner = [plan.nodes[k].ir for k in ph.inner]
        reds = [plan.nodes[k] for k in ph.reductions]
        leaders = [r for r in reds if r.reduction.leader == r.name]
        if inner:
            if self.gpu.persistent:
                out += self._nodes(inner, False, self._reduce_block)
            else:
                self.phase_values = {}
                for r in leaders:
                    out += self._acc_init(r)
                outside, self.cse = self.cse, dict(self.cse)     # values of the loop body stay in it
                loop = self._nodes(inner, False, self._acc_update)
                self.cse = outside
                if self.gpu.split:     # this program's chunk of the rows (a constant trip count)
                    out.append(f"for roffset in tl.range(0, {self.gpu.chunk}, RBLOCK):")
                    start = f"spid * {self.gpu.chunk} + roffset + rbase"
                else:
                    out.append(f"for roffset in tl.range(0, {self.rnumel}, RBLOCK):")
                    start = "roffset + rbase"
                out += ["    " + ln for ln in self._rdefs(start) + loop]
                self.phase_values = {}
                for r in leaders:
                    out += self._acc_final(r)
        for r in reds:       # siblings read their leader's results
            node = r.ir
            if r.reduction.leader != r.name:
                self.row_values[r.name] = f"v_{r.reduction.leader}_{r.reduction.output}"
            elif r.reduction.output is not None:
                self.row_values[r.name] = f"v_{r.name}_{r.reduction.output}"
            else:
                self.row_values[r.name] = f"v_{r.name}"
            if self.gpu.split:     # the partial result of this chunk (the combine stores the output)
                k = len(self.workspaces)
                self.workspaces.append((r, self._acc_types(r)))
                if r.name not in self.locals:
                    self.params[r.name] = (tl_type(node.buf.layout.dtype), True)
                out.append(f"tl.store(ws{k} + xindex * {self.gpu.split} + spid, "
                           f"{self.row_values[r.name]}.to({tl_type(self._acc_types(r))}), xmask)")
            elif r.name not in self.locals:
                h = self._handler(True)
                out.append(self._store(node, _Val(self.row_values[r.name], node.buf.layout.dtype), h, True))
        outer = [plan.nodes[k].ir for k in ph.outer]
        if self.gpu.split:       # row values of the combined results: the combining kernel's
            self.split_outer = outer
            for o in outer:
                if o.name not in self.locals:
                    self.params[o.name] = (tl_type(o.buf.layout.dtype), True)
            return out
        out += self._nodes(outer, True)
        return out

    def _acc_types(self, r):
        acc = compute_dtype(r.reduction.acc_dtype)
        if r.reduction.kind in ("any", "all"):
            acc = torch.int8
        return acc

    def _masked(self, val, ident, dt):
        return f"tl.where(xmask & rmask, {val}, {ident})"


    def _reduce_block(self, n, v, h):
        """Persistent: the reduction of the whole row block ``v`` -> ``v_<name>`` ([XBLOCK, 1])."""
        r = self.plan.nodes[n.name]
        kind, acc = r.reduction.kind, self._acc_types(r)
        full = "[XBLOCK, RBLOCK]"
        if kind in ("argmax", "argmin"):
            val, idx = v
            vt = compute_dtype(r.reduction.acc_dtype)
            self.helpers.add(f"_{kind}_combine")
            return [f"a_{n.name} = tl.broadcast_to({self._masked(val, _identity(kind, vt), vt)}, {full})",
                    f"i_{n.name} = tl.broadcast_to(tl.where(xmask & rmask, {idx}, {2**62}), {full})",
                    f"v_{n.name}_value, v_{n.name}_index = tl.reduce((a_{n.name}, i_{n.name}), 1, "
                    f"_{kind}_combine, keep_dims=True)"]
        if kind == "online_softmax":     # the row in registers: its max, then the sum of exp(x - max)
            t = tl_type(acc)
            x = f"{v}.to({t})"
            self.helpers.add("_max_combine")
            return [f"v_{n.name}_max = tl.reduce(tl.broadcast_to({self._masked(x, _identity('max', acc), acc)}, {full}), 1, "
                    f"_max_combine, keep_dims=True)",
                    f"e_{n.name} = tl.where(xmask & rmask & (v_{n.name}_max != float('-inf')), "
                    f"tl.exp({x} - v_{n.name}_max), 0.0)",
                    f"v_{n.name}_sum = tl.sum(tl.broadcast_to(e_{n.name}, {full}), 1, keep_dims=True)"]
        if kind == "welford":
            t = tl_type(acc)
            # the count of a row: its length when static (no reduction), else the lanes in range
            count = (f"tl.full([XBLOCK, 1], {self.rnumel}, {t})" if self.rnumel.isdigit() else
                     f"tl.sum(tl.broadcast_to((xmask & rmask).to({t}), {full}), 1, keep_dims=True)")
            return [f"c_{n.name} = {count}",
                    f"v_{n.name}_mean = tl.sum(tl.broadcast_to(tl.where(xmask & rmask, {v}.to({t}), 0.0), {full}), 1, "
                    f"keep_dims=True) / tl.maximum(c_{n.name}, 1.0)",
                    f"d_{n.name} = tl.where(xmask & rmask, {v}.to({t}) - v_{n.name}_mean, 0.0)",
                    f"v_{n.name}_m2 = tl.sum(tl.broadcast_to(d_{n.name} * d_{n.name}, {full}), 1, keep_dims=True)",
                    f"v_{n.name}_count = c_{n.name}",
                    f"v_{n.name}_mean = tl.where(c_{n.name} == 0, float('nan'), v_{n.name}_mean)"]
        t = tl_type(acc)
        x = f"tl.broadcast_to({self._masked(f'{v}.to({t})', _identity(kind, acc), acc)}, {full})"
        return [f"v_{n.name} = {self._tree(kind, x, t)}"]

    def _tree(self, kind, x, t):
        """The cross-lane reduction of ``x`` along the row axis, keeping it as [XBLOCK, 1]."""
        if kind == "sum":
            return f"tl.sum({x}, 1, keep_dims=True)"
        if kind in ("max", "min", "prod"):
            self.helpers.add(f"_{kind}_combine")
            return f"tl.reduce({x}, 1, _{kind}_combine, keep_dims=True)"
        if kind == "any":
            return f"(tl.max({x}, 1, keep_dims=True) != 0)"
        if kind == "all":
            return f"(tl.min({x}, 1, keep_dims=True) != 0)"
        raise Unsupported(f"reduction {kind} in a Triton kernel")

    def _acc_init(self, r):
        kind, acc = r.reduction.kind, self._acc_types(r)
        full = "[XBLOCK, RBLOCK]"
        if kind in ("argmax", "argmin"):
            return [f"a_{r.name} = tl.full({full}, {_identity(kind, acc)}, {tl_type(acc)})",
                    f"i_{r.name} = tl.full({full}, {2**62}, tl.int64)"]
        if kind == "welford":
            t = tl_type(acc)
            return [f"m_{r.name} = tl.zeros({full}, {t})", f"q_{r.name} = tl.zeros({full}, {t})",
                    f"c_{r.name} = tl.zeros({full}, {t})"]
        if kind == "online_softmax":
            t = tl_type(acc)
            return [f"m_{r.name} = tl.full({full}, float('-inf'), {t})", f"d_{r.name} = tl.zeros({full}, {t})"]
        return [f"a_{r.name} = tl.full({full}, {_identity(kind, acc)}, {tl_type(acc)})"]

    def _acc_update(self, n, v, h):
        r = self.plan.nodes[n.name]
        kind, acc = r.reduction.kind, self._acc_types(r)
        t, a = tl_type(acc), f"a_{n.name}"
        m = "xmask & rmask"
        if kind in ("argmax", "argmin"):
            val, idx = v
            self.helpers.add(f"_{kind}_combine")
            return [f"{a}_n, i_{n.name}_n = _{kind}_combine({a}, i_{n.name}, {val}.to({t}), {idx})",
                    f"{a} = tl.where({m}, {a}_n, {a})", f"i_{n.name} = tl.where({m}, i_{n.name}_n, i_{n.name})"]
        if kind == "welford":
            x = f"{v}.to({t})"
            return [f"c_{n.name}_n = c_{n.name} + 1.0",
                    f"d_{n.name} = {x} - m_{n.name}",
                    f"m_{n.name}_n = m_{n.name} + d_{n.name} / c_{n.name}_n",
                    f"q_{n.name} = tl.where({m}, q_{n.name} + d_{n.name} * ({x} - m_{n.name}_n), q_{n.name})",
                    f"m_{n.name} = tl.where({m}, m_{n.name}_n, m_{n.name})",
                    f"c_{n.name} = tl.where({m}, c_{n.name}_n, c_{n.name})"]
        if kind == "online_softmax":     # per lane: the running max and the rescaled sum
            x, nm = f"{v}.to({t})", f"m_{n.name}_n"
            return [f"{nm} = tl.maximum(m_{n.name}, {x}, propagate_nan=tl.PropagateNan.ALL)",
                    f"d_{n.name}_n = d_{n.name} * tl.where(m_{n.name} == {nm}, 1.0, tl.exp(m_{n.name} - {nm})) + "
                    f"tl.where({nm} == float('-inf'), 0.0, tl.exp({x} - {nm}))",
                    f"d_{n.name} = tl.where({m}, d_{n.name}_n, d_{n.name})",
                    f"m_{n.name} = tl.where({m}, {nm}, m_{n.name})"]
        x = f"{v}.to({t})"
        comb = {"sum": f"{a} + {x}", "prod": f"{a} * {x}", "any": f"{a} | {x}", "all": f"{a} & {x}"}.get(kind)
        if comb is None:
            self.helpers.add(f"_{kind}_combine")
            comb = f"_{kind}_combine({a}, {x})"
        return [f"{a} = tl.where({m}, {comb}, {a})"]

    def _acc_final(self, r):
        kind = r.reduction.kind
        n = r.name
        if kind in ("argmax", "argmin"):
            return [f"v_{n}_value, v_{n}_index = tl.reduce((a_{n}, i_{n}), 1, _{kind}_combine, keep_dims=True)"]
        if kind == "online_softmax":
            self.helpers.add("_online_softmax_combine")
            return [f"v_{n}_max, v_{n}_sum = tl.reduce((m_{n}, d_{n}), 1, _online_softmax_combine, keep_dims=True)"]
        if kind == "welford":
            self.helpers.add("_welford_combine")
            return [f"v_{n}_mean, v_{n}_m2, v_{n}_count = tl.reduce((m_{n}, q_{n}, c_{n}), 1, _welford_combine, "
                    f"keep_dims=True)",
                    f"v_{n}_mean = tl.where(v_{n}_count == 0, float('nan'), v_{n}_mean)"]
        return [f"v_{n} = {self._tree(kind, f'a_{n}', tl_type(self._acc_types(r)))}"]


def _mentions(text, name):
    import re
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def generate_kernel(plan, name, host_scalars=frozenset()):
    """(source, params) of Triton kernel ``name`` for ``plan``; fills ``plan.device`` first.
    ``host_scalars``: one-element buffers the kernel reads as scalar arguments."""
    if plan.device is None:
        plan.device = plan_triton(plan)
    k = TritonKernel(plan, name, host_scalars)
    return k.generate(), k.params
