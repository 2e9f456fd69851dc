"""The statistical model of rounding errors in a floating-point sum (chapter §13.3, Theorem 13.1,
Corollary 13.1), and the tolerances it gives tests.

**Theorem 13.1.**  Sequential summation ``ŝ_1 = a_1``, ``ŝ_k = (ŝ_{k-1} + a_k)(1 + δ_k)`` with
independent, zero-mean rounding errors ``δ_k`` of variance ``σ_δ² <= u²`` (u: the unit roundoff,
``2^-24`` for float32) has, to first order, the error ``E = ŝ_n - s_n ≈ Σ_{k>=2} δ_k s_k`` (``s_k``:
the exact partial sums), so ``E[E] = 0`` and ``Var[E] = σ_δ² Σ_{k>=2} s_k²``.  Rounding errors
uniform on ``[-u, u]`` give ``σ_δ² = u²/3`` -- the model used here.  It over-estimates: a value
``v`` in ``[2^e, 2^{e+1})`` is rounded by at most half its ulp, i.e. by at most ``u·2^e/|v| <= u``
relatively; for values spread evenly over the logarithm of their binade that makes
``σ_δ² = u²/3 · 3/(8 ln 2)``, and the measured standard deviation about 0.74 of the prediction
(0.68-0.79 over 200 random sums of 2^11-2^14 uniform, normal and relu terms, W = 1-32; the
chapter's two examples measured about half).

**Corollary 13.1.**  ``W`` ways (a power of two), each adding ``n/W`` terms in sequence, then a
tree over the ``W`` partial sums, of i.i.d. terms of mean μ and variance σ²:

    Var[E] ≈ u²/3 · ( n³μ²/(3W²) + n²σ²/(2W)  +  2n²μ² + nσ² log2 W )
                      (the ways)                 (the tree)

so the standard deviation grows like ``n^{3/2}`` with a mean and like ``n`` without one
(``u·n·σ/sqrt(6W)``).  **Worst case** (§6.5): ``|E| <= (n/W - 1 + log2 W)·u·Σ|a_i|`` to first order.
Both are far apart: for 2048 terms the chapter's bound was 0.020, the model's deviation 1.7e-4.

Functions: ``unit_roundoff``; ``sum_error_std`` (the corollary); ``sum_error_std_of`` (the theorem
for given data, its partial sums exactly); ``blocked_sum`` (the W-way sum in a given dtype, for
measuring); ``sum_error_bound`` (worst case); ``sum_tolerance`` (a test's tolerance: ``k``
predicted deviations, never more than the worst-case bound).  Pure numpy: import-safe anywhere.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["unit_roundoff", "sum_error_std", "sum_error_std_of", "blocked_sum", "sum_error_bound",
           "sum_tolerance"]

_U = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def unit_roundoff(dtype="float32") -> float:
    """u of a floating dtype: a tp/torch/numpy dtype or its name (``"float32"``: ``2^-24``)."""
    try:
        name = np.dtype(dtype).name                   # numpy dtypes, their types and names
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1]           # torch.float32, tp.float32, "bfloat16"
    if name not in _U:
        raise ValueError(f"unit_roundoff: not a floating dtype: {dtype!r} (one of {sorted(_U)})")
    return _U[name]


def _ways(W) -> int:
    if W < 1 or W & (W - 1):
        raise ValueError(f"the number of ways W must be a power of two >= 1, got {W!r}")
    return int(W)


def sum_error_std(n, W=16, mean=0.0, std=1.0, dtype="float32"):
    """Corollary 13.1: the predicted standard deviation of the error of a W-way blocked sum of ``n``
    i.i.d. terms of mean ``mean`` and standard deviation ``std`` against the exact sum, with the
    uniform rounding model (σ_δ² = u²/3).  ``mean``/``std`` may be numpy arrays (one per sum)."""
    W = _ways(W)
    u = unit_roundoff(dtype)
    mu2, s2 = np.square(mean), np.square(std)
    var = u * u / 3 * (n ** 3 * mu2 / (3 * W * W) + n * n * s2 / (2 * W) + n * n * mu2 * (2 * W - 2) / W
                       + n * s2 * math.log2(W))
    return np.sqrt(var) if np.ndim(var) else math.sqrt(var)


def _lanes(a, W):
    """``a`` (..., n) as (..., n/W, W): lane j holds a[..., j::W] (the vector lanes of a kernel);
    zero-padded to a multiple of W (adding an exact zero rounds nothing)."""
    a = np.asarray(a)
    n = a.shape[-1]
    pad = -n % W
    if pad:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,), a.dtype)], axis=-1)
    return a.reshape(a.shape[:-1] + (a.shape[-1] // W, W))


def sum_error_std_of(a, W=16, dtype="float32"):
    """Theorem 13.1 for the given terms ``a`` (last axis summed): ``sqrt(u²/3 · Σ s²)`` over the
    exact partial sums ``s`` that a W-way blocked sum rounds -- every lane's running sums from its
    second term on, and every sum of the tree -- computed in float64."""
    W = _ways(W)
    u = unit_roundoff(dtype)
    lanes = _lanes(np.asarray(a, np.float64), W)
    run = np.cumsum(lanes, axis=-2)[..., 1:, :]          # each lane's partial sums, k >= 2
    total = np.square(run).sum(axis=(-2, -1))
    part = run[..., -1, :] if run.shape[-2] else lanes[..., 0, :]
    while part.shape[-1] > 1:                           # the tree: pairs (j, j + w/2), as blocked_sum
        h = part.shape[-1] // 2
        part = part[..., :h] + part[..., h:]
        total = total + np.square(part).sum(axis=-1)
    return np.sqrt(u * u / 3 * total)


def blocked_sum(a, W=16, dtype=np.float32):
    """The W-way blocked sum of ``a`` over its last axis, computed in ``dtype`` (each operation
    rounded, as a vectorised kernel does it): lane j adds a[..., j::W] in order, then the lanes are
    added in a tree (lane j with lane j + W/2, halving).  For measuring the model against."""
    W = _ways(W)
    lanes = _lanes(np.asarray(a, dtype), W)
    acc = lanes[..., 0, :].copy()
    for k in range(1, lanes.shape[-2]):
        acc += lanes[..., k, :]                          # one rounding per lane and step
    while acc.shape[-1] > 1:
        h = acc.shape[-1] // 2
        acc = acc[..., :h] + acc[..., h:]
    return acc[..., 0]


def sum_error_bound(n, W=16, abs_sum=1.0, dtype="float32"):
    """The worst-case bound (§6.5, first order): ``(ceil(n/W) - 1 + log2 W)·u·Σ|a_i|``; ``abs_sum``
    is ``Σ|a_i|`` (a number or an array)."""
    W = _ways(W)
    return (max(-(-n // W) - 1, 0) + math.log2(W)) * unit_roundoff(dtype) * np.asarray(abs_sum, np.float64)[()]


def sum_tolerance(n, W=16, dtype="float32", scale=1.0, *, mean=None, k=6.0, paired=False):
    """A tolerance for ``|computed sum - exact sum|`` of ``n`` terms summed ``W`` ways in ``dtype``:
    ``k`` standard deviations of Corollary 13.1 (``k = 6``: a false alarm for fewer than one sum in
    10^8 if the errors are normal), never above the worst-case bound.

    ``scale``: the root mean square of the terms (``sqrt(mean(a²))``; an array gives one tolerance
    per sum); ``mean``: their mean, where known -- by default the worst split of ``scale²`` between
    mean² and variance (all of it mean), since the mean's term grows like n^{3/2}.
    ``paired=True``: the two sides are both computed sums with independent errors (compiled vs
    eager), not one against the exact sum: sqrt(2) times as much.  Use a smaller ``W`` than the
    kernel's where unsure: fewer ways never predict less error.  The rounding of the terms
    themselves (each ``a_i`` computed with relative error u) is not included."""
    scale = np.abs(np.asarray(scale, np.float64))
    mu = scale if mean is None else np.minimum(np.abs(np.asarray(mean, np.float64)), scale)
    std = np.sqrt(np.maximum(scale * scale - mu * mu, 0.0))
    tol = k * sum_error_std(n, W, mu, std, dtype) * (math.sqrt(2) if paired else 1.0)
    bound = sum_error_bound(n, W, n * scale, dtype) * (2 if paired else 1)     # sum|a| <= n·rms
    out = np.minimum(tol, bound)
    return float(out) if np.ndim(out) == 0 else out
