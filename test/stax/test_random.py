"""Stax on CPU: random ops as counter-based Philox streams (docs/stax.md "Random numbers").

Element i of random op k of a compiled graph is Philox4x32-10 of (counter = (i, k), key = the seed
the call drew from the global generator).  So the compiled numbers are not eager's, but they are
checked exactly: a reference Philox in numpy (itself checked against Random123's known-answer
vectors) gives every uniform bit for bit, and the normals up to the error model of log, cos and
sqrt.  Statistics (moments, Kolmogorov-Smirnov, chi-square) are tested at levels a correct
generator fails with probability < 1e-4 per test.  Dropout is checked against its own mask: the
output, the mask and the gradient of a training step agree element by element.
"""
import math

import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.ops.registry import OPS

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def philox(counter, key, rounds=10):
    """Reference Philox4x32 (Salmon et al. SC'11) on numpy arrays of uint64 holding 32-bit words:
    counter = (c0, c1, c2, c3), key = (k0, k1); returns the four output words."""
    c = [np.asarray(w, dtype=np.uint64) & MASK32 for w in counter]
    k0, k1 = (np.asarray(w, dtype=np.uint64) & MASK32 for w in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(W0)) & MASK32, (k1 + np.uint64(W1)) & MASK32
        p0, p1 = np.uint64(M0) * c[0], np.uint64(M1) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & MASK32, p1 & MASK32,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & MASK32, p0 & MASK32]
    return c


def test_reference_philox_matches_random123_known_answers():
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        assert [int(w) for w in philox(ctr, key)] == list(want)


def words(seed, stream, n):
    """The four Philox words of elements 0..n-1 of ``stream`` under the int64 ``seed``."""
    off = np.arange(n, dtype=np.uint64)
    s = np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    return philox((off & MASK32, off >> np.uint64(32), np.full(n, stream, np.uint64), np.zeros(n, np.uint64)),
                  (s & MASK32, s >> np.uint64(32)))


def uniform(w, dtype, open0=False):
    """The prelude's unit(): float32 from 24 bits of w0, float64 from 53 bits of (w0, w1)."""
    if dtype == torch.float32:
        m = (w[0] >> np.uint64(8)) + np.uint64(open0)
        return torch.from_numpy((m.astype(np.float64) * 2.0 ** -24).astype(np.float32))
    m = ((w[0] << np.uint64(21)) | (w[1] >> np.uint64(11))) + np.uint64(open0)
    return torch.from_numpy(m.astype(np.float64) * 2.0 ** -53)


def drawn_seed(manual):
    """The seed a compiled graph draws first after ``tp.manual_seed(manual)``."""
    tp.manual_seed(manual)
    return int(OPS["_random_seed"].eager())


def compiled_after_seed(f, *args, manual=1234, **opts):
    """Compile ``f`` (strict native), run it once (capture), then run it after manual_seed: returns
    (outputs, the seed that call drew, the compiled function)."""
    cf = tp.compile(f, strict_native=True, **opts)
    cf(*args)
    seed = drawn_seed(manual)
    tp.manual_seed(manual)
    out = cf(*args)
    return out, seed, cf


def _d(t):
    return t._data if isinstance(t, tp.Tensor) else t


def kernel_source(cf):
    return cf._cache[0].artifact.source


# ---- values bit for bit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1,), (37,), (5, 33), (2, 3, 17)])
def test_rand_is_the_philox_uniform_of_each_element(shape, dtype):
    out, seed, _ = compiled_after_seed(lambda: tp.rand(*shape, dtype=dtype))
    n = math.prod(shape)
    want = uniform(words(seed, 0, n), dtype).reshape(shape)
    assert _d(out).dtype == dtype and torch.equal(_d(out), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_randn_is_box_muller_of_the_philox_words_within_the_error_model(dtype):
    """z = sqrt(-2 log u1) cos(2 pi u2) from the same words, evaluated in float64 with numpy.  The
    kernel's log and cos are within 1 ulp, sqrt and * correctly rounded; the angle 2 pi u2 is
    rounded once in the kernel's dtype, so the error is a few ulps of r = sqrt(-2 log u1) (not of
    z, which can be near 0)."""
    n = 4099
    out, seed, _ = compiled_after_seed(lambda: tp.randn(n, dtype=dtype))
    w = words(seed, 0, n)
    u1, u2 = uniform(w[:2], dtype, open0=True).double(), uniform(w[2:], dtype).double()
    r = torch.sqrt(-2 * torch.log(u1))
    z = r * torch.cos(2 * math.pi * u2)
    eps = torch.finfo(dtype).eps
    err = (_d(out).double() - z).abs()
    assert bool((err <= 8 * eps * (r + 1)).all()), float((err / (r + 1)).max() / eps)


def test_randint_is_the_multiply_shift_of_one_word_and_casts_to_the_dtype():
    out, seed, _ = compiled_after_seed(lambda: (tp.randint(-3, 7, (4, 9)), tp.randint(0, 5, (50,), dtype=torch.float32)))
    w0 = words(seed, 0, 36)[0]
    want = torch.from_numpy(((w0 * np.uint64(10)) >> np.uint64(32)).astype(np.int64) - 3).reshape(4, 9)
    assert _d(out[0]).dtype == torch.int64 and torch.equal(_d(out[0]), want)
    w0 = words(seed, 1, 50)[0]                                       # the second random op: stream 1
    want = torch.from_numpy(((w0 * np.uint64(5)) >> np.uint64(32)).astype(np.float32))
    assert _d(out[1]).dtype == torch.float32 and torch.equal(_d(out[1]), want)


def test_randint_wider_than_32_bits_uses_64_bits_modulo_the_range():
    lo, hi = -2**40, 2**41 + 12345
    out, seed, _ = compiled_after_seed(lambda: tp.randint(lo, hi, (300,)))
    w = words(seed, 0, 300)
    bits = [(int(a) << 32) | int(b) for a, b in zip(w[0], w[1])]
    assert _d(out).tolist() == [lo + b % (hi - lo) for b in bits]


def test_random_op_fuses_into_its_consumer_and_the_numbers_are_the_same():
    x = tp.from_torch(torch.randn(6, 35).t())                     # non-contiguous input
    out, seed, cf = compiled_after_seed(lambda a: a * 2 + tp.rand_like(a), x)
    want = _d(x) * 2 + uniform(words(seed, 0, 35 * 6), torch.float32).reshape(35, 6)
    assert torch.equal(_d(out), want)
    assert kernel_source(cf).count("async_compile.cpp(") == 1 and "philox_rand<float>" in kernel_source(cf)


def test_size_zero_and_calls_draw_new_numbers_under_one_seed():
    cf = tp.compile(lambda: (tp.rand(0, 3), tp.rand(64)), strict_native=True)
    cf()
    a, b = cf(), cf()
    assert _d(a[0]).shape == (0, 3)
    assert not torch.equal(_d(a[1]), _d(b[1]))
    tp.manual_seed(7)
    c = cf()
    tp.manual_seed(7)
    assert torch.equal(_d(c[1]), _d(cf()[1]))                       # manual_seed repeats a run


def test_same_stream_read_twice_is_recomputed_consistently_and_streams_differ():
    """A random value inlined into two readers is computed twice from (seed, stream, offset): the
    same numbers.  Two random ops of one graph are different streams."""
    def f():
        r = tp.rand(4096)
        return r * 2, r * 4, tp.rand(4096)
    cf = tp.compile(f, strict_native=True)
    cf()
    a, b, c = (_d(t) for t in cf())
    assert torch.equal(b, 2 * a)
    corr = torch.corrcoef(torch.stack([a.double(), c.double()]))[0, 1]
    assert abs(float(corr)) < 5 / math.sqrt(4096)


# ---- statistics -------------------------------------------------------------------------------------------
N = 1 << 18


def ks_distance(sample, cdf):
    s = np.sort(sample.double().numpy())
    f = cdf(s)
    i = np.arange(1, len(s) + 1)
    return max((i / len(s) - f).max(), (f - (i - 1) / len(s)).max())


KS_1E4 = 2.15   # sqrt(n) * D exceeds this with probability 1e-4 (Kolmogorov distribution)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniform_and_normal_statistics(dtype):
    cf = tp.compile(lambda: (tp.rand(N, dtype=dtype), tp.randn(N, dtype=dtype)), strict_native=True)
    cf()
    u, z = (_d(t) for t in cf())
    assert float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.double().mean()) - 0.5) < 4.5 * math.sqrt(1 / 12 / N)
    assert math.sqrt(N) * ks_distance(u, lambda s: s) < KS_1E4
    assert abs(float(z.double().mean())) < 4.5 / math.sqrt(N)
    assert abs(float(z.double().var()) - 1) < 4.5 * math.sqrt(2 / N)
    phi = np.vectorize(lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2))))
    assert math.sqrt(N) * ks_distance(z, phi) < KS_1E4
    assert bool(torch.isfinite(z).all())


def test_randint_counts_pass_chi_square():
    cf = tp.compile(lambda: tp.randint(3, 13, (N,)), strict_native=True)
    cf()
    v = _d(cf())
    assert int(v.min()) >= 3 and int(v.max()) <= 12
    counts = torch.bincount(v - 3, minlength=10).double()
    chi2 = float(((counts - N / 10) ** 2 / (N / 10)).sum())
    assert chi2 < 33.7                           # chi-square, 9 degrees of freedom: P(> 33.7) = 1e-4


# ---- dropout and bernoulli ------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_native_dropout_output_is_input_times_its_mask_times_the_scale(p):
    x = torch.randn(64, 130)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    x = tp.from_torch(x)
    (out, mask), seed, cf = compiled_after_seed(lambda a: OPS["native_dropout"].fn(a, p, True), x)
    out, mask = _d(out), _d(mask)
    u = uniform(words(seed, 0, 64 * 130), torch.float32).double().reshape(64, 130)
    assert mask.dtype == torch.bool and torch.equal(mask, u < 1 - p)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    want = _d(x) * mask.float() * torch.tensor(scale, dtype=torch.float32)   # eager's order: inf * 0 = NaN
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    assert "FALLBACK" not in kernel_source(cf)


def test_native_dropout_keeps_1_minus_p_and_eval_mode_is_the_identity():
    x = tp.randn(N)
    cf = tp.compile(lambda a: OPS["native_dropout"].fn(a, 0.25, True), strict_native=True)
    cf(x)
    kept = float(_d(cf(x)[1]).double().mean())
    assert abs(kept - 0.75) < 4.5 * math.sqrt(0.75 * 0.25 / N)
    ev = tp.compile(lambda a: OPS["native_dropout"].fn(a, 0.25, False), strict_native=True)
    out, mask = ev(x)
    assert torch.equal(_d(out), _d(x)) and bool(_d(mask).all())


def test_dropout_training_step_uses_one_mask_in_forward_and_backward():
    """F.dropout in a compiled training region: the forward kernel computes the mask from the
    stream and saves it; the gradient is g * mask / (1 - p) exactly where the output kept x."""
    w = tp.randn(64, 100)

    def f(x):
        return (F.dropout(x, 0.4, True) * w).sum()
    cf = tp.compile(f, strict_native=True)
    x = tp.randn(64, 100, requires_grad=True)
    cf(x)
    x.grad = None
    y = cf(x)
    y.backward()
    g = _d(x.grad)
    keep = g != 0
    assert abs(float(keep.double().mean()) - 0.6) < 4.5 * math.sqrt(0.24 / 6400)
    torch.testing.assert_close(g[keep], (_d(w) * torch.tensor(1 / 0.6, dtype=torch.float32))[keep], rtol=0, atol=0)
    # the forward value was computed with the same mask: a float32 sum of 6400 terms against its
    # float64 value, within the error model's tolerance (Corollary 13.1; W = 8 ways, the fewest a
    # vectorised kernel uses: 4 SSE lanes x 2 accumulators), plus the terms' own rounding (dropout's
    # scale and the product: at most 2u each, independent: 6 deviations of their sum) and the
    # reference's rounding to float32
    terms = _d(x).double() * g.double()
    ref = terms.sum()
    u = 2.0 ** -24
    tol = tp.testing.sum_tolerance(6400, 8, tp.float32, float(terms.pow(2).mean().sqrt()), mean=float(terms.mean())) \
        + 6 * 2 * u * float(terms.pow(2).sum().sqrt()) + u * float(ref.abs())
    assert abs(float(_d(y).double()) - float(ref)) <= tol


def test_dropout_in_a_module_compiles_natively_and_trains():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
    cm = tp.compile(m, strict_native=True)
    x = tp.randn(8, 16)
    for _ in range(2):
        cm(x).pow(2).sum().backward()
    assert bool(torch.isfinite(_d(m[0].weight.grad)).all()) and float(_d(m[0].weight.grad).abs().sum()) > 0
    m.eval()
    torch.testing.assert_close(_d(cm(x)), _d(m(x)), rtol=1e-5, atol=1e-6)      # eval: no dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bernoulli_with_scalar_p(dtype):
    x = tp.zeros(N, dtype=dtype)
    cf = tp.compile(lambda a: tp.bernoulli(a, 0.3), strict_native=True)
    cf(x)
    v = _d(cf(x))
    assert v.dtype == dtype and set(v.unique().tolist()) <= {0.0, 1.0}
    assert abs(float(v.double().mean()) - 0.3) < 4.5 * math.sqrt(0.21 / N)


def test_bernoulli_with_tensor_probabilities_is_eagers_kernel():
    """Tensor probabilities are checked in [0, 1] by eager's kernel: a fallback (not native)."""
    p = tp.rand(100)
    cf = tp.compile(lambda a: tp.bernoulli(a) * 2)
    cf(p)
    assert set(_d(cf(p)).unique().tolist()) <= {0.0, 2.0}
    with pytest.raises(tp.compiler.BackendCompilerError, match="bernoulli"):
        tp.compile(lambda a: tp.bernoulli(a) * 2, strict_native=True)(p)


def test_randperm_and_multinomial_are_library_kernels():
    probs = tp.from_torch(torch.tensor([0.1, 0.2, 0.7]))
    cf = tp.compile(lambda pr: (tp.randperm(50) * 2, tp.multinomial(pr, 4, replacement=True)), strict_native=True)
    cf(probs)
    perm, draws = (_d(t) for t in cf(probs))
    assert sorted(perm.tolist()) == list(range(0, 100, 2))
    assert draws.shape == (4,) and set(draws.tolist()) <= {0, 1, 2}


def test_fallback_random_env_gives_eagers_numbers(monkeypatch):
    """TP_STAX_FALLBACK_RANDOM=1: random ops call eager's kernels, so a compiled program gives
    eager's numbers after the same manual_seed."""
    monkeypatch.setenv("TP_STAX_FALLBACK_RANDOM", "1")
    x = tp.randn(40, 50)

    def f(a):
        return F.dropout(a, 0.5, True) + tp.randn(40, 50) * tp.rand(50)
    cf = tp.compile(f, strict_native=True)
    cf(x)
    assert "philox" not in kernel_source(cf)
    tp.manual_seed(5)
    want = f(x)
    tp.manual_seed(5)
    assert torch.equal(_d(cf(x)), _d(want))


def test_cpp_wrapper_draws_the_seed_too():
    out, seed, _ = compiled_after_seed(lambda: tp.rand(100) + 1, options={"stax.cpp_wrapper": True})
    assert torch.equal(_d(out), uniform(words(seed, 0, 100), torch.float32) + 1)


# ---- in-place fills (functionalised onto a private clone) --------------------------------------------------
def test_in_place_fills_are_native_with_their_distributions():
    def f(x):
        return (tp.empty(N).uniform_(-2, 3), tp.empty(N, dtype=torch.float64).normal_(1.5, 2.0),
                tp.empty(N).exponential_(2.0), tp.empty(N, dtype=torch.int32).random_(-4, 9), x.clone().random_(10))
    x = tp.randn(1000)
    cf = tp.compile(f, strict_native=True)
    cf(x)
    u, z, e, i, r = (_d(t) for t in cf(x))
    assert float(u.min()) >= -2 and float(u.max()) < 3
    assert math.sqrt(N) * ks_distance(u, lambda s: (s + 2) / 5) < KS_1E4
    assert z.dtype == torch.float64
    assert abs(float(z.mean()) - 1.5) < 4.5 * 2 / math.sqrt(N) and abs(float(z.std()) / 2 - 1) < 4.5 / math.sqrt(2 * N)
    assert float(e.min()) >= 0 and math.sqrt(N) * ks_distance(e, lambda s: 1 - np.exp(-2 * s)) < KS_1E4
    assert i.dtype == torch.int32 and int(i.min()) == -4 and int(i.max()) == 8
    assert r.dtype == torch.float32 and set(r.unique().tolist()) == set(map(float, range(10)))


def test_drop_path_with_bernoulli_fill_is_one_kernel():
    """timm's drop_path: ``x.new_empty((B, 1, 1)).bernoulli_(keep).div_(keep)`` times x."""
    def drop_path(x, keep=0.8):
        r = x.new_empty((x.shape[0], 1, 1)).bernoulli_(keep)
        r.div_(keep)
        return x * r
    x = tp.randn(4096, 3, 5)
    cf = tp.compile(drop_path, strict_native=True)
    cf(x)
    y = _d(cf(x))
    kept = (y.reshape(4096, -1) != 0).all(1)
    assert bool(((y.reshape(4096, -1) == 0).all(1) | kept).all())            # whole samples dropped or kept
    assert abs(float(kept.double().mean()) - 0.8) < 4.5 * math.sqrt(0.16 / 4096)
    torch.testing.assert_close(y[kept], _d(x)[kept] * (torch.tensor(1.0) / 0.8), rtol=0, atol=0)   # eager: (1 / keep) * x
    assert kernel_source(cf).count("async_compile.cpp(") == 1


def test_fallback_random_fills_a_private_buffer_never_reused(monkeypatch):
    """With TP_STAX_FALLBACK_RANDOM=1 an in-place fill is eager's kernel on the clone's buffer; that
    buffer is the fill's result, so it is never handed to a later kernel of the same layout."""
    monkeypatch.setenv("TP_STAX_FALLBACK_RANDOM", "1")

    def f(x):
        u = tp.empty(x.shape).uniform_(-1, 1)
        a = (x * 2).exp()
        return u + 1, a @ a.t(), (a.sin() + u) * 3, u * 2
    x = tp.randn(24, 24)
    cf = tp.compile(f, strict_native=True)
    cf(x)
    tp.manual_seed(9)
    want = f(x)
    tp.manual_seed(9)
    got = cf(x)
    assert torch.equal(_d(got[0]), _d(want[0])) and torch.equal(_d(got[3]), _d(want[3]))   # eager's numbers
    for g, w in zip(got[1:3], want[1:3]):
        torch.testing.assert_close(_d(g), _d(w), rtol=1e-4, atol=1e-4)
