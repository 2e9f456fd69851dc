"""tensorplay.utils.error_model: the statistical model of summation errors (chapter §13.3,
Theorem 13.1 and Corollary 13.1) against measured errors, and tp.testing.sum_tolerance."""
import math

import numpy as np
import pytest
import torch

import tensorplay as tp
from tensorplay.utils.error_model import (blocked_sum, sum_error_bound, sum_error_std, sum_error_std_of,
                                          sum_tolerance, unit_roundoff)

SUMS = 200


def _measured(a32, W):
    exact = a32.astype(np.float64).sum(-1)               # float64: exact enough for float32 terms
    return blocked_sum(a32, W).astype(np.float64) - exact


@pytest.mark.parametrize("dist,n,W", [("uniform", 4096, 16), ("normal", 4096, 16), ("uniform", 2048, 1),
                                      ("normal", 8192, 32)])
def test_predicted_std_matches_measured_errors(dist, n, W):
    """Over 200 random sums the measured standard deviation of the error lies below the prediction
    (the uniform rounding model over-estimates: about 0.74 of it) and above half of it; the mean
    error is zero within the sampling error (E[E] = 0)."""
    rng = np.random.default_rng(n + W)
    if dist == "uniform":
        a, mu, sd = rng.random((SUMS, n)), 0.5, math.sqrt(1 / 12)
    else:
        a, mu, sd = rng.standard_normal((SUMS, n)), 0.0, 1.0
    a32 = a.astype(np.float32)
    err = _measured(a32, W)
    assert np.count_nonzero(err) > SUMS // 2              # real rounding, not exact sums
    pred = sum_error_std(n, W, mu, sd)
    ratio = err.std() / pred
    assert 0.5 < ratio < 1.0, ratio
    assert abs(err.mean()) < 4 * pred / math.sqrt(SUMS)
    # Theorem 13.1 on the data's own partial sums says the same
    data_pred = math.sqrt(np.mean(sum_error_std_of(a32, W) ** 2))
    assert 0.5 < err.std() / data_pred < 1.0
    assert data_pred == pytest.approx(pred, rel=0.15)


def test_std_grows_like_n_to_the_three_halves_with_a_mean_and_like_n_without():
    r_mean = sum_error_std(1 << 20, 16, 1.0, 0.0) / sum_error_std(1 << 18, 16, 1.0, 0.0)
    r_zero = sum_error_std(1 << 20, 16, 0.0, 1.0) / sum_error_std(1 << 18, 16, 0.0, 1.0)
    assert r_mean == pytest.approx(4 ** 1.5, rel=0.05) and r_zero == pytest.approx(4, rel=0.05)
    # more ways, less error; the chapter's u n sigma / sqrt(6 W) for mean 0
    assert sum_error_std(4096, 32, 0.5, 0.3) < sum_error_std(4096, 16, 0.5, 0.3) < sum_error_std(4096, 1, 0.5, 0.3)
    assert sum_error_std(2048, 16, 0.0, 1.0) == pytest.approx(2 ** -24 * 2048 / math.sqrt(96), rel=0.05)


def test_blocked_sum_is_the_w_way_float32_sum():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 1000)).astype(np.float32)
    seq = np.cumsum(a, axis=-1, dtype=np.float32)[:, -1]      # in order, one rounding per step
    assert np.array_equal(blocked_sum(a, 1), seq)
    lanes = [np.cumsum(a[:, j::4], axis=-1, dtype=np.float32)[:, -1] for j in range(4)]
    assert np.array_equal(blocked_sum(a, 4), (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]))
    assert blocked_sum(a, 16).dtype == np.float32
    with pytest.raises(ValueError, match="power of two"):
        blocked_sum(a, 3)


def test_tolerance_covers_the_errors_and_is_far_below_the_worst_case():
    rng = np.random.default_rng(2)
    n, W = 2048, 16
    z = rng.normal(0.0, math.sqrt(2), (SUMS, n))
    a32 = (2 * np.maximum(z, 0)).astype(np.float32)          # example 1.1's terms
    err = np.abs(_measured(a32, W))
    rms = np.sqrt(np.mean(a32.astype(np.float64) ** 2, axis=-1))
    tol = sum_tolerance(n, W, "float32", rms)                 # per sum; the mean unknown: worst split
    assert tol.shape == (SUMS,) and np.all(err <= tol)
    bound = sum_error_bound(n, W, np.abs(a32.astype(np.float64)).sum(-1))
    assert np.all(err <= bound) and np.all(tol < bound / 5)   # statistics vs worst case (§13.3)
    known = sum_tolerance(n, W, "float32", rms, mean=a32.mean(-1))
    assert np.all(err <= known) and np.all(known <= tol)
    one = sum_tolerance(n, W, "float32", 1.0)
    assert sum_tolerance(n, W, "float32", 1.0, paired=True) == pytest.approx(math.sqrt(2) * one)


def test_unit_roundoff_of_every_spelling():
    assert unit_roundoff("float32") == unit_roundoff(np.float32) == unit_roundoff(torch.float32) == 2.0 ** -24
    assert unit_roundoff(tp.float64) == 2.0 ** -53 and unit_roundoff(torch.bfloat16) == 2.0 ** -8
    with pytest.raises(ValueError, match="not a floating dtype"):
        unit_roundoff(torch.int32)


def test_compiled_row_sums_stay_within_the_tolerance():
    """A Stax row sum (tp.compile, strict_native) against the float64 sum of the same float32 terms:
    within ``tp.testing.sum_tolerance`` of W = 16 ways, and its errors are real (not all zero)."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(256, 4096, generator=g) + 0.5              # mean 1: the n^{3/2} regime
    cf = tp.compile(lambda t: t.sum(-1), strict_native=True)
    got = cf(tp.from_torch(x))._data.double()
    exact = x.double().sum(-1)
    err = (got - exact).abs().numpy()
    rms = x.double().pow(2).mean(-1).sqrt().numpy()
    tol = tp.testing.sum_tolerance(4096, 16, tp.float32, rms, mean=x.double().mean(-1).numpy())
    assert np.count_nonzero(err) > 0 and np.all(err <= tol)
    assert err.std() < sum_error_std(4096, 16, 1.0, math.sqrt(1 / 12))
