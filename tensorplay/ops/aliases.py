"""PyTorch's small functions that are aliases or compositions of table ops, and the few table
entries they need (``signbit``, ``logcumsumexp``, ``gcd``, ``lcm``, ``isin``).

The compositions are written in tp ops, so autograd and ``tp.compile`` see the ops they are made
of (``mv`` is a ``matmul``, ``ravel`` a ``reshape``, ``addmv`` / ``addr`` scaled matmul / outer sums,
``vdot`` a conjugated dot, ``inner`` a ``tensordot`` over the last dims, ``dist`` a ``norm`` of the
difference, ``broadcast_tensors`` ``expand``\\ s, ``msort`` a ``sort`` along dim 0, ``sgn`` ``sign``
for real tensors and ``x / |x|`` (0 at 0) for complex ones).  Guarantees as PyTorch's: ``addmv``
and ``addr`` ignore ``input`` when ``beta == 0`` (its NaN and inf do not propagate); ``allclose``
and ``equal`` return Python bools; ``conj`` of a real tensor is the tensor itself, of a complex
tensor its conjugate (a copy here: PyTorch returns a lazily conjugated view).

Table entries: ``signbit`` (not differentiable; the sign bit, so -0.0 and -NaN count as negative),
``logcumsumexp`` (a scan; its derivative is PyTorch's log-space formula, split into the positive
and negative parts of the gradient so nothing overflows), ``gcd`` / ``lcm`` (integers, not
differentiable) and ``isin`` (not differentiable).
"""
from __future__ import annotations

import math

import torch

from .registry import OPS, register

__all__ = []

_ND = ("nondifferentiable",)


def _op(name):
    return OPS[name].fn


# ---- table entries ------------------------------------------------------------------------------
register("signbit(Tensor self) -> Tensor", tags=_ND + ("comparison",),
         doc="Whether the sign bit is set (True for -0.0 and negative values).")
register("gcd(Tensor self, Tensor other) -> Tensor", tags=_ND, doc="Greatest common divisor of integers.")
register("lcm(Tensor self, Tensor other) -> Tensor", tags=_ND, doc="Least common multiple of integers.")
register("isin(Tensor elements, Tensor test_elements, *, bool assume_unique=False, bool invert=False) -> Tensor",
         lambda elements, test_elements, assume_unique, invert: torch.isin(elements, test_elements,
                                                                           assume_unique=assume_unique, invert=invert),
         tags=_ND, method=False, doc="Whether each element occurs in test_elements (negated with invert=True).")


def _logcumsumexp_bwd(ctx, g):
    """grad_i = sum_{j >= i} g_j exp(x_i - out_j), summed in log space over the positive and the
    negative parts of g (reversed logcumsumexp), as PyTorch's logcumsumexp_backward."""
    x, out, d = ctx.self, ctx.result, ctx.dim
    if x.numel() == 0:
        return (g,)
    flip = _op("flip")

    def rev_lcse(w):
        return flip(_op("logcumsumexp")(flip(w, [d]), d), [d])
    neg_inf = float("-inf")
    pos = _op("where")(g > 0, g.log(), neg_inf) - out
    neg = _op("where")(g < 0, (-g).log(), neg_inf) - out
    return (_op("exp")(rev_lcse(pos) + x) - _op("exp")(rev_lcse(neg) + x),)


register("logcumsumexp(Tensor self, int dim) -> Tensor", backward=_logcumsumexp_bwd, save=("self", "result", "dim"),
         tags=("scan",), doc="log(cumsum(exp(x))) along dim, computed without overflow.")


# ---- compositions -------------------------------------------------------------------------------
def ravel(input):
    """The flattened tensor (a view when the layout allows it)."""
    return input.reshape(-1)


def mv(input, vec):
    if input.dim() != 2 or vec.dim() != 1:
        raise RuntimeError(f"tp.mv: expected a 2-D matrix and a 1-D vector, got shapes {list(input.shape)} and "
                           f"{list(vec.shape)}")
    return input.matmul(vec)


def _scaled_sum(input, prod, beta, alpha):
    p = prod if alpha == 1 else prod * alpha
    if beta == 0:    # PyTorch: input is ignored (its NaN / inf do not propagate)
        if tuple(input.shape) == tuple(p.shape):
            return p
        return p + _op("_zeros")(list(input.shape), dtype=p.dtype, device=p.device)   # (the broadcast shape)
    return (input if beta == 1 else input * beta) + p


def addmv(input, mat, vec, *, beta=1, alpha=1):
    """beta * input + alpha * (mat @ vec)."""
    return _scaled_sum(input, mv(mat, vec), beta, alpha)


def addr(input, vec1, vec2, *, beta=1, alpha=1):
    """beta * input + alpha * outer(vec1, vec2)."""
    if vec1.dim() != 1 or vec2.dim() != 1:
        raise RuntimeError(f"tp.addr: expected 1-D vectors, got shapes {list(vec1.shape)} and {list(vec2.shape)}")
    return _scaled_sum(input, _op("outer")(vec1, vec2), beta, alpha)


def conj(input):
    """The complex conjugate; a real tensor itself."""
    return _op("conj_physical")(input) if input.is_complex() else input


def vdot(input, other):
    """sum(conj(input) * other) of two 1-D tensors."""
    if input.dim() != 1 or other.dim() != 1 or input.shape != other.shape:
        raise RuntimeError(f"tp.vdot: expected two 1-D tensors of the same size, got shapes {list(input.shape)} and "
                           f"{list(other.shape)}")
    return (conj(input) * other).sum()


def inner(input, other):
    """The sum over the last dims of the products (a scalar times a tensor for a 0-d operand)."""
    if input.dim() == 0 or other.dim() == 0:
        return input * other
    if input.shape[-1] != other.shape[-1]:
        raise RuntimeError(f"tp.inner: the last dims must agree, got shapes {list(input.shape)} and "
                           f"{list(other.shape)}")
    return _op("tensordot")(input, other, [input.dim() - 1], [other.dim() - 1])


def true_divide(input, other):
    return _op("div")(input, other)


def deg2rad(input):
    return input * (math.pi / 180.0)


def rad2deg(input):
    return input * (180.0 / math.pi)


def sgn(input):
    """sign for real tensors; x / |x| (0 at 0) for complex ones."""
    if not input.is_complex():
        return _op("sign")(input)
    a = input.abs()
    return _op("where")(a == 0, input * 0, input / _op("where")(a == 0, 1.0, a))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return bool(_op("isclose")(input, other, rtol, atol, equal_nan).all().item())


def equal(input, other) -> bool:
    """Same shape and equal elements."""
    return tuple(input.shape) == tuple(other.shape) and bool((input == other).all().item())


def broadcast_shapes(*shapes):
    return torch.broadcast_shapes(*shapes)


def broadcast_tensors(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    return tuple(t.expand(shape) for t in tensors)


def msort(input):
    """The tensor sorted along dim 0."""
    return _op("sort")(input, 0)[0]


def dist(input, other, p=2):
    """The p-norm of input - other."""
    return _op("norm")(input - other, p)


def split_with_sizes(input, split_sizes, dim=0):
    return _op("split")(input, list(split_sizes), dim)


def sum_to_size(input, *size):
    """The sum of ``input`` down to ``size`` (which ``input``'s shape broadcasts from)."""
    from ._helpers import sum_to
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    try:
        expandable = torch.broadcast_shapes(tuple(size), tuple(input.shape)) == tuple(input.shape)
    except RuntimeError:
        expandable = False
    if not expandable:
        raise RuntimeError(f"tp.sum_to_size: size {list(size)} is not expandable to the tensor's size "
                           f"{list(input.shape)}")
    return sum_to(input, tuple(size))


_BOTH = (ravel, mv, addmv, addr, conj, vdot, inner, true_divide, deg2rad, rad2deg, sgn, allclose, equal, msort, dist,
         split_with_sizes)     # free functions and Tensor methods
EXTRA_FUNCTIONS = {f.__name__: f for f in _BOTH + (broadcast_shapes, broadcast_tensors)}
EXTRA_METHODS = {f.__name__: f for f in _BOTH + (sum_to_size,)}
EXTRA_METHODS["H"] = property(lambda self: conj(self).transpose(0, 1) if self.dim() == 2 else conj(self))
EXTRA_METHODS["mH"] = property(lambda self: conj(self).transpose(-2, -1))
EXTRA_METHODS["is_conj"] = lambda self: self._data.is_conj()
