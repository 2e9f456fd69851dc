"""``tp.linalg``: PyTorch's ``torch.linalg`` API over the op table (signatures and defaults as in
PyTorch).

One op each (ATen kernels, bit-identical to PyTorch; derivative formulas in tp ops, see
tensorplay/ops/linalg_extra.py): vector_norm, inv, inv_ex, det, slogdet, solve, solve_triangular,
cholesky, cholesky_ex, qr, svd, svdvals, eigh, eigvalsh, lstsq, pinv, matrix_rank, cross.  Compositions of
those ops (so their gradients follow): norm, matrix_norm (ord 'fro', 'nuc', ±inf, ±1, ±2),
matrix_power (repeated squaring; inverse first for n < 0), multi_dot (the cheapest product order of
the chain).  The older top-level names keep their semantics: ``tp.svd`` returns V (not Vᴴ) and
takes ``some``; ``tp.qr`` takes ``some``; ``tp.matrix_power``.  Bad arguments raise an exception
whose message names ``tp.linalg.<function>`` or the op.
"""
from __future__ import annotations

import math
import numbers

from .ops.registry import OPS

__all__ = ["norm", "vector_norm", "matrix_norm", "inv", "inv_ex", "det", "slogdet", "solve", "solve_triangular",
           "cholesky", "cholesky_ex", "qr", "svd", "svdvals", "eigh", "eigvalsh", "lstsq", "pinv", "matrix_rank",
           "matrix_power", "multi_dot", "cross"]


def _op(name):
    return OPS[name].fn


def cross(input, other, *, dim=-1):
    """The cross product of 3-vectors along ``dim`` (broadcasting the other dims)."""
    return _op("linalg_cross")(input, other, dim)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if isinstance(dim, numbers.Integral):
        dim = [dim]
    return _op("linalg_vector_norm")(x, ord, list(dim) if dim is not None else None, keepdim, dtype=dtype)


def _matrix_dims(A, dim, fn):
    if len(dim) != 2:
        raise RuntimeError(f"tp.linalg.{fn}: dim must be a 2-tuple, got {dim}")
    if A.dim() < 2:
        raise RuntimeError(f"tp.linalg.{fn}: the input must have at least 2 dims, got shape {list(A.shape)}")
    d0, d1 = (d % A.dim() for d in dim)
    if d0 == d1:
        raise RuntimeError(f"tp.linalg.{fn}: dims must be different, got {dim}")
    return d0, d1


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    d0, d1 = _matrix_dims(A, dim, "matrix_norm")
    if dtype is not None:
        A = A.to(dtype)
    if ord == "fro":
        return vector_norm(A, 2, [d0, d1], keepdim)
    if ord in ("nuc", 2, -2):
        s = _op("linalg_svdvals")(A.movedim((d0, d1), (-2, -1)))
        r = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
        if keepdim:
            r = r.unsqueeze(min(d0, d1)).unsqueeze(max(d0, d1))
        return r
    if ord in (1, -1, math.inf, -math.inf):
        rows, cols = (d0, d1) if ord in (1, -1) else (d1, d0)    # ord 1: max column sum; inf: max row sum
        s = A.abs().sum(rows, keepdim=True)
        r = s.amax(cols, keepdim=True) if ord > 0 else s.amin(cols, keepdim=True)
        return r if keepdim else r.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    raise RuntimeError(f"tp.linalg.matrix_norm: order {ord!r} not supported (fro, nuc, inf, -inf, 1, -1, 2, -2)")


def norm(A, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    if out is not None:
        raise NotImplementedError("tp.linalg.norm: out= is not supported")
    if isinstance(dim, numbers.Integral):
        dim = (dim,)
    if dim is not None:
        if len(dim) == 1:
            return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.dim() == 1:
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    if A.dim() == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    raise RuntimeError(f"tp.linalg.norm: with ord={ord!r} and dim=None the input must be 1-d or 2-d, got shape "
                       f"{list(A.shape)}")


def inv(A):
    return _op("linalg_inv")(A)


def inv_ex(A, *, check_errors=False):
    return _op("linalg_inv_ex")(A, check_errors=check_errors)


def det(A):
    return _op("linalg_det")(A)


def slogdet(A):
    return _op("linalg_slogdet")(A)


def solve(A, B, *, left=True):
    return _op("linalg_solve")(A, B, left=left)


def solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    return _op("linalg_solve_triangular")(A, B, upper=upper, left=left, unitriangular=unitriangular)


def cholesky(A, *, upper=False):
    return _op("linalg_cholesky")(A, upper=upper)


def cholesky_ex(A, *, upper=False, check_errors=False):
    return _op("linalg_cholesky_ex")(A, upper=upper, check_errors=check_errors)


def qr(A, mode="reduced"):
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"tp.linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    return _op("linalg_qr")(A, mode)


def svd(A, full_matrices=True, *, driver=None):
    return _op("linalg_svd")(A, full_matrices, driver=driver)


def svdvals(A, *, driver=None):
    return _op("linalg_svdvals")(A, driver=driver)


def eigh(A, UPLO="L"):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"tp.linalg.eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    return _op("linalg_eigh")(A, UPLO)


def eigvalsh(A, UPLO="L"):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"tp.linalg.eigvalsh: UPLO must be 'L' or 'U', got {UPLO!r}")
    return _op("linalg_eigvalsh")(A, UPLO)


def lstsq(A, B, rcond=None, *, driver=None):
    return _op("linalg_lstsq")(A, B, rcond, driver=driver)


def _tol(t):
    return None if t is None else float(t)


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    return _op("linalg_pinv")(A, atol=_tol(atol), rtol=_tol(rtol), hermitian=hermitian)


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    return _op("linalg_matrix_rank")(A, atol=_tol(atol), rtol=_tol(rtol), hermitian=hermitian)


def matrix_power(A, n):
    """A^n by repeated squaring (n < 0: of the inverse; n = 0: the identity, batched)."""
    if not isinstance(n, numbers.Integral):
        raise TypeError(f"tp.linalg.matrix_power: n must be an int, got {type(n).__name__}")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"tp.linalg.matrix_power: A must be a batch of square matrices, got shape "
                           f"{list(A.shape)}")
    if n == 0:
        from .ops.factories import eye as _eye
        eye = _eye(A.shape[-1], dtype=A.dtype, device=A.device)
        return eye.expand(list(A.shape)).clone()
    if n < 0:
        A, n = inv(A), -n
    result, z = None, A
    while True:
        if n & 1:
            result = z if result is None else result @ z
        n >>= 1
        if not n:
            return result if result is not A else A.clone()
        z = z @ z


def _chain_order(dims):
    """Cheapest parenthesisation of the chain (matrix i is dims[i] x dims[i + 1]): split points."""
    k = len(dims) - 1
    cost = [[0] * k for _ in range(k)]
    split = [[0] * k for _ in range(k)]
    for length in range(1, k):
        for i in range(k - length):
            j = i + length
            cost[i][j] = math.inf
            for s in range(i, j):
                c = cost[i][s] + cost[s + 1][j] + dims[i] * dims[s + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, s
    return split


def multi_dot(tensors):
    """The product of a chain of matrices (the first may be a row vector, the last a column vector),
    multiplied in the cheapest order."""
    ts = list(tensors)
    if len(ts) < 2:
        raise RuntimeError(f"tp.linalg.multi_dot: expected at least 2 tensors, got {len(ts)}")
    first_vec, last_vec = ts[0].dim() == 1, ts[-1].dim() == 1
    if first_vec:
        ts[0] = ts[0].unsqueeze(0)
    if last_vec:
        ts[-1] = ts[-1].unsqueeze(-1)
    for i, t in enumerate(ts):
        if t.dim() != 2:
            raise RuntimeError(f"tp.linalg.multi_dot: tensor {i} must be 2-d (the first and last may be 1-d), got "
                               f"shape {list(tensors[i].shape)}")
    for i in range(len(ts) - 1):
        if ts[i].shape[1] != ts[i + 1].shape[0]:
            raise RuntimeError(f"tp.linalg.multi_dot: tensors {i} and {i + 1} cannot be multiplied "
                               f"({list(ts[i].shape)} and {list(ts[i + 1].shape)})")
    split = _chain_order([ts[0].shape[0]] + [t.shape[1] for t in ts])

    def prod(i, j):
        if i == j:
            return ts[i]
        s = split[i][j]
        return prod(i, s) @ prod(s + 1, j)
    out = prod(0, len(ts) - 1)
    if first_vec:
        out = out.squeeze(0)
    if last_vec:
        out = out.squeeze(-1)
    return out


# ---- the older top-level names with their own semantics (installed as tp.<name> and methods) --------
def _svd_legacy(input, some=True, compute_uv=True):
    """U, S, V (not Vᴴ); some=False gives square U and V; compute_uv=False gives zero U and V."""
    if not compute_uv:
        s = svdvals(input)
        m, n = input.shape[-2], input.shape[-1]
        batch = list(input.shape[:-2])
        return input.new_zeros(batch + [m, m if not some else min(m, n)]), s, \
            input.new_zeros(batch + [n, n if not some else min(m, n)])
    u, s, vh = svd(input, full_matrices=not some)
    return u, s, vh.mT


def _qr_legacy(input, some=True):
    return qr(input, "reduced" if some else "complete")


LEGACY = {"svd": _svd_legacy, "qr": _qr_legacy, "matrix_power": matrix_power}
