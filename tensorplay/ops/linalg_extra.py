"""Matrix functions of ``tp.linalg`` (chapter §9.8): vector_norm, inv (+ inv_ex), det, slogdet,
logdet, solve, solve_triangular, cholesky (+ cholesky_ex), qr, svd, svdvals, eigh, eigvalsh, lstsq,
pinv, matrix_rank.

Every kernel is ATen's ``torch.linalg`` function, so forward results are PyTorch's bit for bit; for
the compiler these are extern library kernels (tag ``linalg``).  Derivatives are written in tp ops
(so they differentiate again) with the standard formulas, for real inputs.  inv, det and solve
(tag ``holomorphic``) also differentiate complex inputs, with PyTorch's convention (the registry
conjugates the formula); vector_norm's complex gradient is ``sgn(x)``-based like
PyTorch's; the other complex gradients are not implemented and raise:

* ``inv``: ``dA = -Xᵀ G Xᵀ`` (X the inverse); ``det``: ``dA = g det A⁻ᵀ``; ``slogdet`` / ``logdet``:
  ``dA = g A⁻ᵀ``;
* ``solve`` (``A X = B`` or ``X A = B``): ``dB = A⁻ᵀ G``, ``dA = -dB Xᵀ`` (left), summed back over
  broadcast batch dims; ``solve_triangular`` likewise, masked to A's triangle;
* ``cholesky``: ``dA = sym(L⁻ᵀ Φ(Lᵀ G) L⁻¹)``, Φ the lower triangle with the diagonal halved;
* ``qr`` (reduced, m >= n): ``dA = Q (dR + tril(M - Mᵀ) R⁻ᵀ) + (dQ - Q QᵀdQ) R⁻ᵀ`` with
  ``M = QᵀdQ + R dRᵀ``-style skew terms (Walter and Lehmann);
* ``svd`` / ``svdvals``: the gauge-invariant formula with ``F_ij = 1 / (s_j² - s_i²)`` plus the
  projections onto the complements of U and V (full_matrices narrows U, Vh to k = min(m, n));
* ``eigh`` / ``eigvalsh``: ``dA = V (diag(dL) + (VᵀdV) / E) Vᵀ``, ``E_ij = λ_j - λ_i`` (PyTorch's
  convention: not symmetrised);
* ``lstsq`` (full column rank, m >= n): ``dB = A Y``, ``dA = (B - A X) Yᵀ - A Y Xᵀ``,
  ``Y = (AᵀA)⁻¹ G``; ``pinv``: Golub and Pereyra's formula for the derivative of the pseudo-inverse;
* ``vector_norm`` shares the derivative of ``norm`` (reduction.py); ``matrix_rank`` has none.

Bad input raises the dispatcher's ``tp.<op>(A: float32[3, 4]): ...`` with ATen's message, or a
``RuntimeError`` / ``NotImplementedError`` naming the op where a gradient is not defined here.
"""
from __future__ import annotations

import torch

from ._helpers import sum_to
from .factories import eye
from .reduction import _norm_grad, _rdims, _restore
from .registry import OPS, DataDependentShapeError, _to_meta, register

__all__ = []

L = ("linalg",)
LH = ("linalg", "holomorphic")   # inv, det, solve: holomorphic in the entries (registry.py)


def _op(name):
    return OPS[name].fn


def _real_only(name, *xs):
    if any(x is not None and x.is_complex() for x in xs):
        raise NotImplementedError(f"tp.{name}: the gradient for complex inputs is not implemented")


def _t(x):
    return x.mT


def _mm(a, b):
    return _op("matmul")(a, b)


def _eye_like(x, n):
    return eye(n, dtype=x.dtype, device=x.device)


def _diag_embed(v):
    n = v.shape[-1]
    return v.unsqueeze(-1) * _eye_like(v, n)


def _inv(a):
    return _op("linalg_inv")(a)


def _solve(a, b, left=True):
    return _op("linalg_solve")(a, b, left=left)


def _solve_tri(a, b, upper, left=True, unitriangular=False):
    return _op("linalg_solve_triangular")(a, b, upper=upper, left=left, unitriangular=unitriangular)


# ---- vector_norm -------------------------------------------------------------------------------
def _vector_norm_bwd(ctx, g):
    x = ctx.self
    dim = ctx.dim if ctx.dim else None
    g = _restore(g, x.dim(), dim, ctx.keepdim)
    r = _restore(ctx.result, x.dim(), dim, ctx.keepdim)
    if x.dtype != g.dtype and not x.is_complex():      # (a complex x has a real norm: keep x complex)
        x = x.to(g.dtype)
    return _norm_grad(x, g, r, float(ctx.ord), _rdims(dim, x.dim()))


register("linalg_vector_norm(Tensor self, Scalar ord=2, int[]? dim=None, bool keepdim=False, *, "
         "ScalarType? dtype=None) -> Tensor", "torch.linalg.vector_norm", backward=_vector_norm_bwd,
         save=("self", "result"), tags=("reduction",), function=False, method=False,
         doc="(sum |x|^ord)^(1/ord) over dim (all dims if None); ord inf / -inf / 0: max |x|, min |x|, count.")


# ---- inv, det, slogdet, logdet -------------------------------------------------------------------
def _inv_grad(g, x):
    xt = _t(x)
    return -_mm(_mm(xt, g), xt)


def _inv_bwd(ctx, g):
    return _inv_grad(g, ctx.result)


register("linalg_inv(Tensor A) -> Tensor", "torch.linalg.inv", backward=_inv_bwd, save=("A", "result"), tags=LH,
         function=False, method=False, doc="The inverse of each square matrix of A (batched).")
register("inverse(Tensor self) -> Tensor", backward=lambda ctx, g: _inv_grad(g, ctx.result), save=("result",),
         tags=LH, doc="The inverse of each square matrix (the older name of linalg.inv).")
register("linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (Tensor inverse, Tensor info)",
         "torch.linalg.inv_ex", backward=lambda ctx, g, _gi: _inv_grad(g, ctx.result[0]), save=("result",), tags=LH,
         function=False, method=False, doc="inv without the error check: info > 0 marks singular matrices.")


def _det_bwd(ctx, g):
    a = ctx.A
    return (g * ctx.result).unsqueeze(-1).unsqueeze(-1) * _t(_inv(a))


register("linalg_det(Tensor A) -> Tensor", "torch.linalg.det", backward=_det_bwd, save=("A", "result"), tags=LH,
         function=False, method=False, doc="The determinant of each square matrix of A.")
register("det(Tensor self) -> Tensor", backward=lambda ctx, g: (g * ctx.result).unsqueeze(-1).unsqueeze(-1) *
         _t(_inv(ctx.self)), save=("self", "result"), tags=LH, doc="The determinant (the older name of linalg.det).")


def _logdet_grad(g, a):
    _real_only("slogdet", a)
    return g.unsqueeze(-1).unsqueeze(-1) * _t(_inv(a))


register("linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet)", "torch.linalg.slogdet",
         backward=lambda ctx, _gs, g: _logdet_grad(g, ctx.A), save=("A",), tags=L, function=False, method=False,
         doc="sign and log |det| of each square matrix (the sign has no gradient).")
register("slogdet(Tensor self) -> (Tensor sign, Tensor logabsdet)",
         backward=lambda ctx, _gs, g: _logdet_grad(g, ctx.self), save=("self",), tags=L,
         doc="sign and log |det| (the older name of linalg.slogdet).")
register("logdet(Tensor self) -> Tensor", backward=lambda ctx, g: _logdet_grad(g, ctx.self), save=("self",), tags=L,
         doc="log det of each square matrix (nan where det < 0, -inf where det = 0).")


# ---- solve, solve_triangular -------------------------------------------------------------------
def _is_vector_rhs(a, b):
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


def _solve_bwd(ctx, g):
    a, b, x, left = ctx.A, ctx.B, ctx.result, ctx.left
    n = ctx.needs_input_grad
    vec = left and _is_vector_rhs(a, b)
    if vec:
        g, x = g.unsqueeze(-1), x.unsqueeze(-1)
    gb = _solve(_t(a), g, left=left)
    ga = None
    if n[0]:
        ga = sum_to(-_mm(gb, _t(x)) if left else -_mm(_t(x), gb), a.shape)
    if n[1]:
        gb = sum_to(gb.squeeze(-1) if vec else gb, b.shape)
    return ga, gb if n[1] else None


register("linalg_solve(Tensor A, Tensor B, *, bool left=True) -> Tensor", "torch.linalg.solve", backward=_solve_bwd,
         save=("A", "B", "result"), tags=LH, function=False, method=False,
         doc="X with A X = B (left) or X A = B; B may be a (batch of) vector(s); batch dims broadcast.")


def _solve_tri_bwd(ctx, g):
    a, x = ctx.A, ctx.result
    up, left, unit = ctx.upper, ctx.left, ctx.unitriangular
    n = ctx.needs_input_grad
    gb = _solve_tri(_t(a), g, upper=not up, left=left, unitriangular=unit)
    ga = None
    if n[0]:
        ga = -_mm(gb, _t(x)) if left else -_mm(_t(x), gb)
        ga = ga.triu(1 if unit else 0) if up else ga.tril(-1 if unit else 0)
        ga = sum_to(ga, a.shape)
    return ga, sum_to(gb, ctx.B.shape) if n[1] else None


register("linalg_solve_triangular(Tensor A, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) "
         "-> Tensor", "torch.linalg.solve_triangular", backward=_solve_tri_bwd, save=("A", "B", "result"), tags=LH,
         function=False, method=False,
         doc="X with A X = B (left) or X A = B for triangular A (only its upper / lower triangle is read).")


# ---- cholesky ------------------------------------------------------------------------------------
def _cholesky_grad(gl, l_):
    """Gradient w.r.t. A of L = cholesky(A) (lower) given dL: sym(L^-T P L^-1)."""
    p = _mm(_t(l_), gl).tril()
    p = p - 0.5 * _diag_embed(p.diagonal(0, -2, -1))
    y = _solve_tri(_t(l_), p, upper=True)                      # L^-T P
    ga = _solve_tri(l_, y, upper=False, left=False)             # (L^-T P) L^-1
    return 0.5 * (ga + _t(ga))


def _chol_bwd_from(l_, g, upper):
    if upper:
        return _cholesky_grad(_t(g), _t(l_))
    return _cholesky_grad(g, l_)


register("linalg_cholesky(Tensor A, *, bool upper=False) -> Tensor", "torch.linalg.cholesky",
         backward=lambda ctx, g: (_real_only("linalg_cholesky", ctx.A), _chol_bwd_from(ctx.result, g, ctx.upper))[1],
         save=("A", "result"), tags=L, function=False, method=False,
         doc="L lower triangular with A = L Lᴴ (upper=True: U with A = Uᴴ U) of a positive-definite A.")
register("cholesky(Tensor self, bool upper=False) -> Tensor",
         backward=lambda ctx, g: (_real_only("cholesky", ctx.result), _chol_bwd_from(ctx.result, g, ctx.upper))[1],
         save=("result",), tags=L,
         doc="The Cholesky factor (the older name of linalg.cholesky).")
register("linalg_cholesky_ex(Tensor A, *, bool upper=False, bool check_errors=False) -> (Tensor L, Tensor info)",
         "torch.linalg.cholesky_ex", backward=lambda ctx, g, _gi: (_real_only("linalg_cholesky_ex", ctx.result[0]),
                                       _chol_bwd_from(ctx.result[0], g, ctx.upper))[1],
         save=("result",), tags=L, function=False, method=False,
         doc="cholesky without the error check: info > 0 is the order of the first non-positive leading minor.")


# ---- qr ------------------------------------------------------------------------------------------
def _qr_bwd(ctx, gq, gr):
    a = ctx.A
    _real_only("linalg_qr", a)
    q, r = ctx.result
    m, n = a.shape[-2], a.shape[-1]
    if ctx.mode == "r":
        raise RuntimeError("tp.linalg_qr: the derivative of mode='r' is not defined (Q is not computed); "
                           "use mode='reduced'")
    if m < n or (ctx.mode == "complete" and m > n):
        raise NotImplementedError(f"tp.linalg_qr: the gradient is implemented for mode='reduced' with m >= n, got "
                                  f"A of shape {list(a.shape)} and mode={ctx.mode!r}")
    gq = gq if gq is not None else q.new_zeros(list(q.shape))
    gr = gr if gr is not None else r.new_zeros(list(r.shape))
    qdq = _mm(_t(q), gq)
    rdr = _mm(r, _t(gr))
    tl = (qdq - _t(qdq) + rdr - _t(rdr)).tril()

    def xr(x):   # x R^-T = (R^-1 x^T)^T
        return _t(_solve_tri(r, _t(x), upper=True))
    return _mm(q, gr + xr(tl)) + xr(gq - _mm(q, qdq))


register("linalg_qr(Tensor A, str mode='reduced') -> (Tensor Q, Tensor R)", "torch.linalg.qr", backward=_qr_bwd,
         save=("A", "result"), tags=L, function=False, method=False,
         doc="A = Q R with orthonormal columns Q and upper triangular R (mode 'reduced', 'complete' or 'r').")


# ---- svd -----------------------------------------------------------------------------------------
def _svd_grad(a, u, s, vh, gu, gs, gvh):
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    u, vh = u[..., :, :k], vh[..., :k, :]
    gu = gu[..., :, :k] if gu is not None else None
    gvh = gvh[..., :k, :] if gvh is not None else None
    v = _t(vh)
    if gu is None and gvh is None:
        return _mm(u * gs.unsqueeze(-2), vh)
    eye = _eye_like(s, k)
    s2 = s * s
    diff = s2.unsqueeze(-2) - s2.unsqueeze(-1)                  # s_j^2 - s_i^2 at (i, j)
    f = _op("where")(eye != 0, 0.0, 1.0 / _op("where")(eye != 0, 1.0, diff))
    inner = _diag_embed(gs) if gs is not None else a.new_zeros(list(s.shape) + [k])
    sd = s.unsqueeze(-2)                                        # multiplies columns by s_j
    out = 0
    if gu is not None:
        utgu = _mm(_t(u), gu)
        inner = inner + (f * (utgu - _t(utgu))) * sd
    if gvh is not None:
        gv = _t(gvh)
        vtgv = _mm(_t(v), gv)
        inner = inner + s.unsqueeze(-1) * (f * (vtgv - _t(vtgv)))
    out = _mm(_mm(u, inner), vh)
    sinv = 1.0 / s
    if gu is not None and m > k:
        proj = gu - _mm(u, _mm(_t(u), gu))
        out = out + _mm(proj * sinv.unsqueeze(-2), vh)
    if gvh is not None and n > k:
        gv = _t(gvh)
        proj = gv - _mm(v, _mm(_t(v), gv))
        out = out + _mm(u * sinv.unsqueeze(-2), _t(proj))
    return out


def _svd_bwd(ctx, gu, gs, gvh):
    _real_only("linalg_svd", ctx.A)
    u, s, vh = ctx.result
    return _svd_grad(ctx.A, u, s, vh, gu, gs, gvh)


def _column_major(t):
    """An empty tensor of t's shape whose matrices are stored column by column (LAPACK's layout)."""
    if t.dim() < 2:
        return t
    m, n = t.shape[-2], t.shape[-1]
    strides, acc = [], m * n
    for s in reversed(t.shape[:-2]):
        strides.insert(0, acc)
        acc *= s
    return torch.empty_strided(t.shape, strides + [1, m], dtype=t.dtype, device=t.device)


def _svd_meta(A, full_matrices, driver):
    u, s, vh = torch.linalg.svd(_to_meta(A), full_matrices, driver=driver)
    if A.device.type == "cpu" or getattr(A, "device", None) is None:   # LAPACK writes Vh column-major
        vh = _column_major(vh)
    return u, s, vh


register("linalg_svd(Tensor A, bool full_matrices=True, *, str? driver=None) -> (Tensor U, Tensor S, Tensor Vh)",
         "torch.linalg.svd", backward=_svd_bwd, meta=_svd_meta, save=("A", "result"), tags=L, function=False, method=False,
         doc="A = U diag(S) Vh, S descending; full_matrices gives square U and Vh.")


def _svdvals_bwd(ctx, g):
    a = ctx.A
    _real_only("linalg_svdvals", a)
    u, _s, vh = _op("linalg_svd")(a, False)
    return _mm(u * g.unsqueeze(-2), vh)


register("linalg_svdvals(Tensor A, *, str? driver=None) -> Tensor", "torch.linalg.svdvals", backward=_svdvals_bwd,
         save=("A",), tags=L, function=False, method=False, doc="The singular values of A, descending.")


# ---- eigh ----------------------------------------------------------------------------------------
def _eigh_grad(lam, v, gl, gv):
    if gv is None:
        return _mm(v * gl.unsqueeze(-2), _t(v))
    n = lam.shape[-1]
    eye = _eye_like(lam, n) != 0
    e = lam.unsqueeze(-2) - lam.unsqueeze(-1)                   # lambda_j - lambda_i at (i, j)
    inner = _mm(_t(v), gv) / _op("where")(eye, 1.0, e)
    inner = _op("where")(eye, 0.0, inner)
    if gl is not None:
        inner = inner + _diag_embed(gl)
    return _mm(_mm(v, inner), _t(v))


def _eigh_bwd(ctx, gl, gv):
    _real_only("linalg_eigh", ctx.A)
    lam, v = ctx.result
    return _eigh_grad(lam, v, gl, gv)


register("linalg_eigh(Tensor A, str UPLO='L') -> (Tensor eigenvalues, Tensor eigenvectors)", "torch.linalg.eigh",
         backward=_eigh_bwd, save=("A", "result"), tags=L, function=False, method=False,
         doc="Eigenvalues (ascending) and orthonormal eigenvectors of a symmetric / Hermitian A (one triangle read).")


def _eigvalsh_bwd(ctx, g):
    _real_only("linalg_eigvalsh", ctx.A)
    lam, v = _op("linalg_eigh")(ctx.A, ctx.UPLO)
    return _eigh_grad(lam, v, g, None)


register("linalg_eigvalsh(Tensor A, str UPLO='L') -> Tensor", "torch.linalg.eigvalsh", backward=_eigvalsh_bwd,
         save=("A",), tags=L, function=False, method=False, doc="The eigenvalues (ascending) of a symmetric A.")


# ---- lstsq, pinv, matrix_rank ----------------------------------------------------------------------
def _lstsq_kernel(A, B, rcond, driver):
    return torch.linalg.lstsq(A, B, rcond=rcond, driver=driver)


def _lstsq_meta(A, B, rcond, driver):
    raise DataDependentShapeError("tp.linalg_lstsq: the sizes of residuals and singular_values depend on the "
                                  "rank of A")


def _lstsq_bwd(ctx, gx, *_rest):
    a, b = ctx.A, ctx.B
    _real_only("linalg_lstsq", a, b)
    if a.shape[-2] < a.shape[-1]:
        raise NotImplementedError(f"tp.linalg_lstsq: the gradient is implemented for m >= n (full column rank), "
                                  f"got A of shape {list(a.shape)}")
    x = ctx.result[0]
    vec = b.dim() == a.dim() - 1
    if vec:
        gx, x, b = gx.unsqueeze(-1), x.unsqueeze(-1), b.unsqueeze(-1)
    at = _t(a)
    y = _solve(_mm(at, a), gx)
    ay = _mm(a, y)
    n = ctx.needs_input_grad
    ga = sum_to(_mm(b - _mm(a, x), _t(y)) - _mm(ay, _t(x)), a.shape) if n[0] else None
    gb = (ay.squeeze(-1) if vec else ay) if n[1] else None
    return ga, gb


register("linalg_lstsq(Tensor A, Tensor B, float? rcond=None, *, str? driver=None) -> (Tensor solution, "
         "Tensor residuals, Tensor rank, Tensor singular_values)", _lstsq_kernel, backward=_lstsq_bwd,
         save=("A", "B", "result"), tags=L + ("dynamic_shape",), function=False, method=False, meta=_lstsq_meta,
         doc="The least-squares solution X of A X = B (and, per driver, residuals, rank, singular values).")


def _pinv_grad(a, p, g):
    pt, gt = _t(p), _t(g)
    m, n = a.shape[-2], a.shape[-1]
    ap = _mm(a, p)
    pa = _mm(p, a)
    return (-_mm(_mm(pt, g), pt) + _mm(_mm(_eye_like(a, m) - ap, gt), _mm(p, pt))
            + _mm(_mm(pt, p), _mm(gt, _eye_like(a, n) - pa)))


def _pinv_kernel(self, atol, rtol, hermitian):
    return torch.linalg.pinv(self, atol=atol, rtol=rtol, hermitian=hermitian)


register("linalg_pinv(Tensor self, *, float? atol=None, float? rtol=None, bool hermitian=False) -> Tensor",
         _pinv_kernel, backward=lambda ctx, g: (_real_only("linalg_pinv", ctx.self),
                                                _pinv_grad(ctx.self, ctx.result, g))[1],
         save=("self", "result"), tags=L, function=False, method=False,
         doc="The Moore-Penrose pseudo-inverse (singular values below max(atol, rtol * s_max) dropped).")
register("pinverse(Tensor self, float rcond=1e-15) -> Tensor",
         backward=lambda ctx, g: (_real_only("pinverse", ctx.self), _pinv_grad(ctx.self, ctx.result, g))[1],
         save=("self", "result"), tags=L,
         doc="The pseudo-inverse (the older name of linalg.pinv, relative cut-off rcond).")


def _rank_kernel(A, atol, rtol, hermitian):
    return torch.linalg.matrix_rank(A, atol=atol, rtol=rtol, hermitian=hermitian)


register("linalg_matrix_rank(Tensor A, *, float? atol=None, float? rtol=None, bool hermitian=False) -> Tensor",
         _rank_kernel, tags=L + ("nondifferentiable",), function=False, method=False,
         doc="The number of singular values above max(atol, rtol * s_max) (an int64 tensor).")
