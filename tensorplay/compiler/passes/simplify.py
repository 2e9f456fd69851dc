"""IEEE-754-safe algebraic simplification (chapter §4.1–4.2; the chapter's design point that rewrites keep IEEE semantics, §12.5; exercise 5).

Floating-point numbers do not obey the laws of real arithmetic, so every identity is checked
against IEEE 754 before it becomes a rule.  The rules used, for every float x (±0, ±inf, NaN and
subnormals included):

==================  =========================================================================
``x * 1 -> x``      exact (``1 * x`` too)
``x + 0 -> x``      the ONE accepted inexact rule: ``-0 + 0 = +0`` while ``x = -0``; only the
                    sign of zero differs (``x + (-0) -> x`` is exact); ``0 + x`` likewise
``x - 0 -> x``      exact (``-0 - 0 = -0``); ``x - (-0)`` differs only in the sign of zero
``x / 1 -> x``      exact (true division only; floor/trunc rounding modes are not identities)
``neg(neg(x))``     exact (the sign bit flips twice, NaN included)
``x ** 1 -> x``     exact (IEEE ``pow(x, 1) = x``)
``x / 2^k``         ``-> x * 2^-k``: exact — both are the correctly rounded value of the same real
                    ``x * 2^-k`` — when ``2^±k`` are normal numbers of the compute type; done only
                    for float32/float64 and ``|k| <= 64``
==================  =========================================================================

and the identities that are **not** used, with their counterexamples (tested numerically):
``x * 0 -> 0`` (``inf * 0 = NaN``, ``NaN * 0 = NaN``, ``-1 * 0 = -0``), ``x - x -> 0``
(``inf - inf = NaN``), ``x / 3 -> x * (1/3)`` (``1/3`` is rounded, so e.g. ``3 * (1/3) != 1`` for
many x; the two differ in the last bit), and reassociation ``(a + b) + c -> a + (b + c)``
(``(1e20 + -1e20) + 1 = 1`` but ``1e20 + (-1e20 + 1) = 0``).

The "1"/"0" may be a Python number, a constant tensor (``get_attr``) whose elements all equal it,
or a factory node (``_ones``, ``_zeros``, ``_full``).  A rule fires only when the result's meta
(shape, dtype, strides on dims of size > 1) equals x's: no type promotion (``int_x * 1.0`` is a
float tensor, not x), no broadcasting (``x * ones(2, 3)`` with ``x: [3]`` is not x).  It does not
fire when the node is a graph output and x is not a fresh computed tensor (a placeholder, a
constant, a view) or is aliased by another output — the compiled output would alias an input, a
constant or another output where eager returned a fresh tensor — nor, on a graph that still has
in-place ops, when x's or the node's storage is mutated.

Termination measure: ``(number of nodes, number of div nodes)``, lexicographic: an identity rule
erases the node (its uses go to x); the ``x / 2^k`` rule keeps the node count and removes a div.
No rule creates a div.
"""
from __future__ import annotations

import math
import numbers

import torch

from ...ops.registry import OPS
from ..graph.node import Node, map_arg
from .functionalize import alias_root, mutated_roots
from .node_meta import meta_of, set_meta

__all__ = ["simplify", "same_layout"]

_MAX_CONST_CHECK = 1 << 20


def same_layout(a, b) -> bool:
    """Same shape, dtype and strides (on dims of size > 1)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return all(sa == sb for s, sa, sb in zip(a.shape, a.stride(), b.stride()) if s > 1)


def _number(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not isinstance(x, Node)


def _is_const(gm, x, v) -> bool:
    """Is ``x`` (an argument) the constant ``v`` everywhere?"""
    if _number(x):
        return x == v
    if not isinstance(x, Node):
        return False
    if x.op == "get_attr":
        t = getattr(gm, x.target, None)
        d = getattr(t, "_data", t)
        if not isinstance(d, torch.Tensor) or d.numel() > _MAX_CONST_CHECK or d.is_complex() or d.numel() == 0:
            return False
        return bool((d == v).all())
    d = x.opdef
    if x.op == "call_function" and d is not None:
        if d.name == "_ones":
            return v == 1
        if d.name == "_zeros":
            return v == 0
        if d.name == "_full":
            return _number(x.args[1]) and x.args[1] == v
    return False


def _pow2_exponent(c):
    if not _number(c) or c == 0 or not math.isfinite(c):
        return None
    m, e = math.frexp(abs(c))
    return e - 1 if m == 0.5 else None


class _Ctx:
    def __init__(self, gm, basis):
        self.gm = gm
        self.basis = basis
        self.mutated = mutated_roots(gm.graph)
        self.out = gm.graph.output_node


def _candidate(ctx, n: Node):
    """The node x that n simplifies to, or ("mul", x, c) for the power-of-two rule, or None."""
    d = n.opdef
    gm = ctx.gm
    a = n.args
    name = d.name
    if name == "mul":
        if _is_const(gm, a[1], 1):
            return a[0]
        if _is_const(gm, a[0], 1):
            return a[1]
    elif name == "add":
        if _number(a[2]) and math.isfinite(a[2]):
            if _is_const(gm, a[1], 0):
                return a[0]
            if _is_const(gm, a[0], 0) and a[2] == 1:
                return a[1]
    elif name == "sub":
        if _number(a[2]) and math.isfinite(a[2]) and _is_const(gm, a[1], 0):
            return a[0]
    elif name == "div":
        if a[2] is None:
            if _is_const(gm, a[1], 1):
                return a[0]
            k = _pow2_exponent(a[1])
            v = meta_of(a[0])
            if (k is not None and k != 0 and abs(k) <= 64 and isinstance(v, torch.Tensor)
                    and v.dtype in (torch.float32, torch.float64) and _mul_allowed(ctx.basis)):
                return ("mul", a[0], math.ldexp(math.copysign(1.0, a[1]), -k))
    elif name == "neg":
        x = a[0]
        if isinstance(x, Node) and x.opdef is not None and x.opdef.name == "neg":
            return x.args[0]
    elif name == "pow":
        if _is_const(gm, a[1], 1):
            return a[0]
    elif name == "positive":
        return a[0]
    return None


def _mul_allowed(basis):
    return basis is None or "mul" in basis or OPS["mul"].decomp is None


def _safe(ctx, n, x) -> bool:
    if not isinstance(x, Node) or x is n:
        return False
    if "val" not in n.meta:
        set_meta(n)
    if not same_layout(meta_of(n), meta_of(x)):
        return False
    if ctx.mutated and (alias_root(x) in ctx.mutated or alias_root(n) in ctx.mutated):
        return False
    if ctx.out in n.users:
        # n is a graph output, a fresh tensor in eager: x must be one too, and not aliased by
        # another output (else the compiled outputs would alias an input, a constant, or each other)
        if x.op != "call_function" or alias_root(x) is not x:
            return False
        outs = []
        map_arg(ctx.out.args, outs.append)
        if any(o is not n and alias_root(o) is x for o in outs):
            return False
    return True


def simplify(gm, basis=None) -> bool:
    """Apply the IEEE-754-safe identities of the module docstring once over the graph (§4.1-4.2).
    ``basis``: the backend basis (the ``x / 2^k -> x * 2^-k`` rule needs ``mul`` in it).
    Measure: (number of nodes, number of div nodes); True iff it decreased."""
    g = gm.graph
    ctx = _Ctx(gm, basis)
    changed = False
    for n in list(g.nodes):
        if n.op != "call_function" or n.opdef is None or n.graph is not g:
            continue
        try:
            c = _candidate(ctx, n)
        except Exception:
            continue
        if c is None:
            continue
        if isinstance(c, tuple):
            _, x, factor = c
            if ctx.mutated and alias_root(x) in ctx.mutated:
                continue
            with g.inserting_before(n):
                new = g.call_function(OPS["mul"], (x, factor))
            set_meta(new)
            if not same_layout(meta_of(new), meta_of(n)):
                g.erase_node(new)
                continue
            n.replace_all_uses_with(new)
            g.erase_node(n)
            changed = True
            continue
        if not _safe(ctx, n, c):
            continue
        n.replace_all_uses_with(c)
        g.erase_node(n)
        changed = True
    return changed
