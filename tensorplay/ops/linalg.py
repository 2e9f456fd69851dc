"""Linear algebra: matmul, mm, bmm, addmm, baddbmm, linear, einsum, outer, dot (chapter §9.8).

These are extern kernels for the compiler (ATen / BLAS); their pointwise consumers fuse.

Every derivative is again a product of the same family, so these ops are differentiable to any
order:

* ``C = A B``  gives  ``dA = dC Bᵀ``, ``dB = Aᵀ dC`` (``mm``, ``bmm``, ``matmul``; ``addmm`` and
  ``baddbmm`` add ``beta·self`` whose gradient is ``beta·dC`` summed back to ``self``'s shape);
* ``linear(x, W, b) = x Wᵀ + b``  gives  ``dx = dy W``, ``dW = dyᵀ x`` (leading dims flattened),
  ``db = Σ dy``;
* ``einsum``: the gradient for operand *k* is the einsum of the output gradient with the *other*
  operands, producing operand *k*'s subscripts.  Subscripts of operand *k* that occur nowhere
  else were summed in the forward pass, so the gradient is broadcast back along them; dimensions
  of size 1 that were broadcast are summed back.  Ellipsis is expanded to fresh letters first.
  An operand with a repeated subscript (a diagonal, ``'ii->i'``) is not differentiable here: the
  backward raises ``NotImplementedError`` naming ``tp.einsum`` and the operand.

Shape errors are ATen's, re-raised by the dispatcher as ``tp.<op>(self: float32[2, 3], ...): ...``,
so they always name the op and the shapes.
"""
from __future__ import annotations

import collections
import math
import string

import torch

from ._helpers import sum_to
from .registry import OPS, call, register

__all__ = []

L = ("linalg", "holomorphic")   # every product here: g * f'(z) (registry.py: the complex convention)


def _matmul_flops(ins, out):
    """FLOPs of a matrix product for the cost model: 2·(output elements)·K, K the last dim of the
    first tensor input -- the contracted size for matmul/mm/bmm/linear (and einsum's first operand);
    for addmm/baddbmm the first input is the added matrix, whose last dim is the product's N (the
    model's simplification).  None without metas (the model then counts nothing)."""
    if len(ins) >= 2 and hasattr(ins[0], "shape") and hasattr(out, "shape"):
        k = ins[0].shape[-1] if len(ins[0].shape) else 1
        return 2 * math.prod(out.shape) * k
    return None


def _matmul_bwd(ctx, g):
    a, b = ctx.self, ctx.other
    ga = gb = None
    if a.dim() == 1 and b.dim() == 1:
        return (g * b if ctx.needs_input_grad[0] else None, g * a if ctx.needs_input_grad[1] else None)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g2 = g
    if a.dim() == 1:
        g2 = g2.unsqueeze(-2)
    if b.dim() == 1:
        g2 = g2.unsqueeze(-1)
    if ctx.needs_input_grad[0]:
        ga = sum_to(g2.matmul(b2.mT), a2.shape)
        if a.dim() == 1:
            ga = ga.squeeze(0)
    if ctx.needs_input_grad[1]:
        gb = sum_to(a2.mT.matmul(g2), b2.shape)
        if b.dim() == 1:
            gb = gb.squeeze(-1)
    return ga, gb


register("matmul(Tensor self, Tensor other) -> Tensor", backward=_matmul_bwd, save=("self", "other"), tags=L,
         flops=_matmul_flops, dunders=("__matmul__",), rdunders=("__rmatmul__",))


# ---- mm / bmm / addmm / baddbmm ----------------------------------------------------------------
def _mm(a, b):
    return OPS["mm"].fn(a, b)


def _bmm(a, b):
    return OPS["bmm"].fn(a, b)


def _mm_bwd(ctx, g):
    n = ctx.needs_input_grad
    return (_mm(g, ctx.mat2.t()) if n[0] else None,
            _mm(ctx.self.t(), g) if n[1] else None)


def _bmm_bwd(ctx, g):
    n = ctx.needs_input_grad
    return (_bmm(g, ctx.mat2.transpose(1, 2)) if n[0] else None,
            _bmm(ctx.self.transpose(1, 2), g) if n[1] else None)


register("mm(Tensor self, Tensor mat2) -> Tensor", backward=_mm_bwd, save=("self", "mat2"), tags=L,
         flops=_matmul_flops)
register("bmm(Tensor self, Tensor mat2) -> Tensor", backward=_bmm_bwd, save=("self", "mat2"), tags=L,
         flops=_matmul_flops)


def _scaled(g, s):
    return g if s == 1 else g * s


def _addmm_like_bwd(prod, tr):
    def bwd(ctx, g):
        n = ctx.needs_input_grad
        gs = sum_to(_scaled(g, ctx.beta), ctx.self.shape) if n[0] else None
        ga = gb = None
        if n[1] or n[2]:
            ga_ = _scaled(g, ctx.alpha)
            if n[1]:
                ga = prod(ga_, tr(ctx.mat2))
            if n[2]:
                gb = prod(tr(ctx.mat1), ga_)
        return gs, ga, gb
    return bwd


register("addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
         backward=_addmm_like_bwd(_mm, lambda m: m.t()), save=("mat1", "mat2"), tags=L, flops=_matmul_flops)
register("baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
         backward=lambda ctx, g: _baddbmm_bwd(ctx, g), save=("batch1", "batch2"), tags=L, flops=_matmul_flops)


def _baddbmm_bwd(ctx, g):
    n = ctx.needs_input_grad
    gs = sum_to(_scaled(g, ctx.beta), ctx.self.shape) if n[0] else None
    ga = gb = None
    if n[1] or n[2]:
        g2 = _scaled(g, ctx.alpha)
        if n[1]:
            ga = _bmm(g2, ctx.batch2.transpose(1, 2))
        if n[2]:
            gb = _bmm(ctx.batch1.transpose(1, 2), g2)
    return gs, ga, gb


# ---- outer / dot --------------------------------------------------------------------------------
register("outer(Tensor self, Tensor vec2) -> Tensor",
         backward=lambda ctx, g: (g.matmul(ctx.vec2) if ctx.needs_input_grad[0] else None,
                                  ctx.self.matmul(g) if ctx.needs_input_grad[1] else None),
         save=("self", "vec2"), tags=L)
register("dot(Tensor self, Tensor tensor) -> Tensor",
         backward=lambda ctx, g: (g * ctx.tensor if ctx.needs_input_grad[0] else None,
                                  g * ctx.self if ctx.needs_input_grad[1] else None),
         save=("self", "tensor"), tags=L)


# ---- linear --------------------------------------------------------------------------------------
def _linear_bwd(ctx, g):
    x, w = ctx.input, ctx.weight
    n = ctx.needs_input_grad
    gx = gw = gb = None
    if w.dim() == 1:  # y[...] = x[..., :] · w
        if n[0]:
            gx = g.unsqueeze(-1) * w
        if n[1]:
            gw = sum_to(g.unsqueeze(-1) * x, w.shape)
    else:
        if n[0]:
            gx = g.matmul(w)
        if n[1]:
            if x.dim() == 1:
                gw = OPS["outer"].fn(g, x)
            else:
                gw = _mm(g.reshape(-1, g.shape[-1]).t(), x.reshape(-1, x.shape[-1]))
    if len(n) > 2 and n[2]:
        gb = sum_to(g, ctx.bias.shape)
    return gx, gw, gb


def _linear_decomp(input, weight, bias=None):
    y = input.matmul(weight.t()) if weight.dim() == 2 else input.matmul(weight)
    return y if bias is None else y + bias


register("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", "torch.nn.functional.linear",
         backward=_linear_bwd, save=("input", "weight"), decomp=_linear_decomp, tags=L, flops=_matmul_flops,
         method=False)


# ---- einsum --------------------------------------------------------------------------------------
def einsum_canonical(equation: str, shapes) -> tuple[list[str], str]:
    """Rewrite ``equation`` for operands of the given shapes without ellipsis and with an explicit
    output: ``('...ij,jk', [(5, 2, 3), (3, 4)])`` -> ``(['Aij', 'jk'], 'Aik')``.  The ellipsis dims
    are right-aligned across operands (broadcasting) and get letters unused by the equation."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->", 1)
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"tp.einsum: equation {equation!r} has {len(terms)} operand(s) but "
                         f"{len(shapes)} tensor(s) were given")
    used = {c for c in eq if c.isalpha()}
    ell_n = []
    for t, s in zip(terms, shapes):
        letters = t.replace("...", "")
        if not all(c.isalpha() for c in letters):
            raise ValueError(f"tp.einsum: invalid subscript {t!r} in equation {equation!r}")
        n = len(s) - len(letters) if "..." in t else 0
        if n < 0 or ("..." not in t and len(letters) != len(s)):
            raise ValueError(f"tp.einsum: subscript {t!r} does not match an operand of shape {list(s)} "
                             f"in equation {equation!r}")
        ell_n.append(n)
    e = max(ell_n, default=0)
    free = [c for c in string.ascii_letters if c not in used]
    ell = "".join(free[:e])
    subs = [t.replace("...", ell[e - n:]) for t, n in zip(terms, ell_n)]
    if rhs is None:
        counts = collections.Counter("".join(t.replace("...", "") for t in terms))
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1))
    else:
        out = rhs.replace("...", ell)
    return subs, out


def _einsum_kernel(equation, tensors):
    return torch.einsum(equation, *tensors)


def _einsum_bwd(ctx, g):
    ops = ctx.tensors
    subs, out = einsum_canonical(ctx.equation, [t.shape for t in ops])
    grads = []
    for k, need in enumerate(ctx.needs_input_grad_list):
        if not need:
            grads.append(None)
            continue
        target = subs[k]
        dup = [c for c, n in collections.Counter(target).items() if n > 1]
        if dup:
            raise NotImplementedError(
                f"tp.einsum backward: operand {k} has the repeated subscript {dup[0]!r} (a diagonal) in "
                f"{ctx.equation!r}; differentiating through diagonals is not supported — take the "
                f"diagonal with a separate op first")
        others = [j for j in range(len(ops)) if j != k]
        avail = set(out).union(*[set(subs[j]) for j in others]) if others else set(out)
        keep = "".join(c for c in target if c in avail)
        eq = ",".join([out] + [subs[j] for j in others]) + "->" + keep
        gk = OPS["einsum"].fn(eq, [g] + [ops[j] for j in others])
        shape_k = list(ops[k].shape)
        if len(keep) != len(target):
            for i, c in enumerate(target):
                if c not in avail:
                    gk = gk.unsqueeze(i)
            gk = gk.expand([shape_k[i] if c not in avail else gk.shape[i] for i, c in enumerate(target)])
        grads.append(sum_to(gk, shape_k))
    return grads


def _einsum_bwd_entry(ctx, g):
    # needs_input_grad is one flag per tensor *argument*; for the Tensor[] argument recompute the
    # per-operand flags from the saved operands.
    ctx.needs_input_grad_list = [bool(getattr(t, "requires_grad", False)) for t in ctx.tensors]
    return (_einsum_bwd(ctx, g),)


_einsum_op = register("einsum(str equation, Tensor[] tensors) -> Tensor", _einsum_kernel, backward=_einsum_bwd_entry,
                      save=("tensors",), tags=L, flops=_matmul_flops, method=False)


def einsum(equation, *operands):
    """``tp.einsum('ij,jk->ik', a, b)`` (operands as arguments or as one list)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = operands[0]
    return call(_einsum_op, (equation, list(operands)))


einsum.__doc__ = f"{_einsum_op.schema.text}\n\n{einsum.__doc__}"
einsum._opdef = _einsum_op
einsum.__module__ = "tensorplay"
_einsum_op.fn = einsum  # accepts both the canonical (equation, [tensors]) and torch's varargs form
