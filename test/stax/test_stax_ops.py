"""Stax on CPU: every lowered op compiled against eager, fusion structure, fallbacks, the cache.

Tolerance (the error model, docs/testing.md): the compiled float32 result ``c`` is compared with a float64
reference ``r`` and with the float32 eager result ``e``:
    |c - r| <= 8·|e - r| + 8·u·|r| + 2·sqrt(n)·u·S
where u = 2^-24, n is the length of the longest reduction and S the magnitude of the reduced terms
(sum of |terms|, computed in float64) — the blocked-summation bound of §6.5/§13.3.  Integer and
bool results must match exactly; NaN/inf positions must match.
"""
import math
import re

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.testing import assert_close

U32 = 2.0 ** -24


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _t(x):
    return x._data if isinstance(x, tp.Tensor) else x


def _f64(v):
    if isinstance(v, tp.Tensor) and v.is_floating_point():
        return v.double()
    return v


def run_native(f, *args, n_red=1, scale=None):
    """Compile with strict_native (every op a Stax kernel), run twice (capture, then the
    artifact), compare with the error model; returns the compiled result of the 2nd call.
    ``scale``: S of the model (default |r|: right only without cancellation); a tuple gives one
    per output (None: the default)."""
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    out = cf(*args)
    e32 = f(*args)
    r64 = f(*[_f64(a) for a in args])
    outs = out if isinstance(out, tuple) else (out,)
    es = e32 if isinstance(e32, tuple) else (e32,)
    rs = r64 if isinstance(r64, tuple) else (r64,)
    scales = scale if isinstance(scale, tuple) else (scale,) * len(outs)   # one per output, or one for all
    for c, e, r, sc in zip(outs, es, rs, scales):
        check_error_model(c, e, r, n_red=n_red, scale=sc)
    return out, cf


def check_error_model(c, e, r, n_red=1, scale=None):
    """Assert the error model of the module doc for one result ``c`` (eager ``e``, float64 ``r``)."""
    c, e, r = _t(c), _t(e), _t(r)
    assert c.shape == e.shape and c.dtype == e.dtype, (c.shape, e.shape, c.dtype, e.dtype)
    if not c.dtype.is_floating_point:
        assert torch.equal(c, e)
        return
    cd, ed, rd = c.double(), e.double(), r.double().to(c.dtype).double() if r.dtype != c.dtype else r.double()
    fin = torch.isfinite(ed)
    assert torch.equal(torch.isnan(cd), torch.isnan(ed)), "NaN positions differ"
    assert torch.equal(cd[~fin & ~torch.isnan(ed)], ed[~fin & ~torch.isnan(ed)]), "inf values differ"
    u = U32 if c.dtype == torch.float32 else 2.0 ** -53
    S = scale if scale is not None else rd.abs()
    tol = 8 * (ed - rd).abs() + 8 * u * rd.abs() + 2 * math.sqrt(n_red) * u * S + 1e-30
    err = (cd - rd).abs()
    bad = (err > tol) & fin
    assert not bool(bad.any()), f"max excess {(err - tol)[bad].max().item():.3g} at {bad.nonzero()[0].tolist()}"


def rnd(*shape, dtype=tp.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype))


LAYOUTS = {
    "contiguous": lambda s: rnd(*s),
    "transposed": lambda s: rnd(*reversed(s)).t() if len(s) == 2 else rnd(*s),
    "strided": lambda s: rnd(*s[:-1], 2 * s[-1])[..., ::2],
}

UNARY = {
    "exp": lambda a: a.exp(), "log": lambda a: (a.abs() + 0.1).log(), "tanh": lambda a: a.tanh(),
    "sigmoid": lambda a: a.sigmoid(), "erf": lambda a: a.erf(), "sqrt": lambda a: a.abs().sqrt(),
    "rsqrt": lambda a: (a.abs() + 0.5).rsqrt(), "relu": lambda a: tp.relu(a), "gelu": lambda a: F.gelu(a),
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "silu": lambda a: F.silu(a), "abs": lambda a: a.abs(),
    "neg": lambda a: -a, "expm1": lambda a: a.expm1(), "log1p": lambda a: (a.abs()).log1p(),
    "sin": lambda a: a.sin(), "cos": lambda a: a.cos(), "floor": lambda a: (a * 3).floor(),
    "ceil": lambda a: (a * 3).ceil(), "round": lambda a: (a * 3).round(), "trunc": lambda a: (a * 3).trunc(),
    "sign": lambda a: a.sign(), "reciprocal": lambda a: (a.abs() + 1).reciprocal(), "square": lambda a: a.square(),
    "softplus": lambda a: F.softplus(a), "elu": lambda a: F.elu(a), "leaky_relu": lambda a: F.leaky_relu(a, 0.1),
    "hardtanh": lambda a: F.hardtanh(a), "clamp": lambda a: a.clamp(-0.5, 0.7), "pow3": lambda a: a ** 3,
    "pow2": lambda a: a ** 2, "exp2": lambda a: a.exp2(), "log2": lambda a: (a.abs() + 0.1).log2(),
    "isnan": lambda a: a.isnan(), "isinf": lambda a: a.isinf(), "isfinite": lambda a: a.isfinite(),
    "cast_int": lambda a: (a * 10).to(tp.int64), "logical_not": lambda a: (a > 0).logical_not(),
    "relu6": lambda a: F.relu6(a * 8), "nan_to_num": lambda a: (a.log()).nan_to_num(),

}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops(name, layout):
    x = LAYOUTS[layout]((9, 37))
    run_native(UNARY[name], x)


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b.abs() + 0.5), "maximum": lambda a, b: tp.maximum(a, b),
    "minimum": lambda a, b: tp.minimum(a, b), "where": lambda a, b: tp.where(a > b, a, b * 2),
    "lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "alpha": lambda a, b: tp.add(a, b, alpha=2.5),
    "lerp": lambda a, b: tp.lerp(a, b, 0.3), "addcmul": lambda a, b: tp.addcmul(a, a, b, value=0.5),
    "logical_and": lambda a, b: (a > 0) & (b > 0), "scalar_left": lambda a, b: 2 - a * b,
}


@pytest.mark.parametrize("bshape", [(9, 37), (37,), (9, 1), ()])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_broadcasting(name, bshape):
    a, b = rnd(9, 37), rnd(*bshape, seed=1)
    # terms of magnitude |a| + 3|b| may cancel: the rounding bound scales with them, not with |result|
    run_native(BINARY[name], a, b, scale=(a._data.double().abs() + 3 * b._data.double().abs()).expand(9, 37))


@pytest.mark.parametrize("dtype", [tp.int32, tp.int64])
def test_integer_pointwise_and_reductions(dtype):
    g = torch.Generator().manual_seed(3)
    a = tp.from_torch(torch.randint(-50, 50, (6, 19), generator=g, dtype=dtype))
    b = tp.from_torch(torch.randint(1, 9, (19,), generator=g, dtype=dtype))
    run_native(lambda a, b: (a * b - 3, tp.maximum(a, b), a.sum(-1), a.amax(0), a > b, a.abs()), a, b)


def test_special_values_pm0_inf_nan():
    v = tp.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -2.5, 1e-40, 88.8, -104.0] * 3)
    run_native(lambda a: (a * 2, tp.relu(a), a.exp(), a.tanh(), a.sigmoid(), tp.maximum(a, a * 0),
                          a.abs(), -a, a.sign()), v)


@pytest.mark.parametrize("shape,dim", [((9, 37), -1), ((9, 37), 0), ((3, 5, 7), 1), ((3, 5, 7), (0, 2)),
                                        ((64,), 0), ((4, 1, 6), -1), ((0, 5), -1), ((5, 0), -1), ((1, 1), None)])
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "prod", "var", "std", "logsumexp"])
def test_reductions(shape, dim, op):
    if op in ("amax", "amin", "logsumexp") and 0 in shape:
        pytest.skip("eager raises on empty max")
    if op == "logsumexp" and dim is None:
        pytest.skip("logsumexp needs dim")
    if op == "prod" and isinstance(dim, tuple):
        pytest.skip("prod takes one dim")
    x = rnd(*shape)
    n = max(1, math.prod(shape))
    for keepdim in (False, True):
        def f(a):
            if dim is None:
                return getattr(a, op)()
            return getattr(tp, op)(a, dim, keepdim=keepdim) if op == "logsumexp" else getattr(a, op)(dim, keepdim=keepdim)
        run_native(f, x, n_red=n, scale=float(x.abs().sum()) if op in ("sum", "mean") else None)


@pytest.mark.parametrize("fn", ["var_mean", "std_mean"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_var_mean(fn, dim):
    x = rnd(9, 37)
    n = x.shape[dim]
    run_native(lambda a: getattr(tp, fn)(a, dim, keepdim=dim == 0), x, n_red=n,
               scale=x._data.double().abs().sum(dim, keepdim=dim == 0) / n)


def test_views_fuse_and_match():
    x = rnd(6, 8)
    run_native(lambda a: (a.t() * 2 + 1, a[1:5, ::3] * 3, a.unsqueeze(1).expand(6, 4, 8).sum(1),
                          a.reshape(8, 6).permute(1, 0) + 1, a.select(1, 2) * 2, a.narrow(0, 1, 3).exp(),
                          a.transpose(0, 1).sum(0)), x)


def test_nn_ops_softmax_layernorm_rmsnorm():
    x = rnd(16, 100)
    w, b = rnd(100, seed=2), rnd(100, seed=3)
    run_native(lambda a: F.softmax(a, -1), x)
    run_native(lambda a: F.log_softmax(a, -1), x)
    ref = F.layer_norm(x.double(), (100,), w.double(), b.double())._data
    bb = b._data.double()
    run_native(lambda a, w, b: F.layer_norm(a, (100,), w, b), x, w, b, n_red=100, scale=(ref - bb).abs() + bb.abs())
    run_native(lambda a, w: F.rms_norm(a, (100,), w, 1e-6), x, w, n_red=100)


def test_extern_matmul_with_fused_epilogue():
    a, b = rnd(10, 7), rnd(7, 5, seed=1)
    out, cf = run_native(lambda a, b: tp.relu(a @ b) * 2 + 1, a, b, n_red=7, scale=None)
    src = cf._cache[0].artifact.source
    assert "extern kernel: matmul" in src
    assert len(_kernels(cf)) == 1   # relu, *2, +1: one kernel


# ---- fusion structure (chapter §7) -----------------------------------------------------------------------
def _kernels(cf):
    """The kernels of a compiled function's artifact: C++ functions, or Triton ones."""
    return kernel_names(cf._cache[0].artifact.source)


def kernel_names(src):
    """The kernels a wrapper source defines (C++ or Triton)."""
    return re.findall(r'extern "C" void (kernel\d+)\(', src) or re.findall(r'@triton.jit(?:\(debug=True\))?\ndef (kernel\d+)\(', src)


def test_example_1_1_is_one_kernel_reading_inputs_once():
    x, w = rnd(64, 128), rnd(64, 128, seed=1)
    out, cf = run_native(lambda x, w: (tp.relu(x + w) * 2).sum(-1), x, w, n_red=128,
                         scale=float((tp.relu(x + w) * 2).abs().sum(-1).max()))
    assert len(_kernels(cf)) == 1
    cost = tp.compile(lambda x, w: (tp.relu(x + w) * 2).sum(-1), strict_native=True).lower(x, w).compile().cost_analysis()
    assert cost["bytes_accessed"] >= 4 * (2 * 64 * 128)


def test_example_7_1_row_fusion_single_kernel():
    x = rnd(32, 100)
    out, cf = run_native(lambda x: x / x.sum(-1, keepdim=True), x, n_red=100, scale=None)
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1
    assert "phase 1" in src                      # the division runs after the row's sum, same kernel
    assert "buf0 = empty_strided" not in src     # the row sums never go to memory


def test_example_7_2_horizontal_reductions_read_x_once():
    x = rnd(32, 100)
    out, cf = run_native(lambda x: (lambda e: (e.sum(-1), e.amax(-1)))(x.exp()), x, n_red=100,
                         scale=float(x.exp().sum(-1).max()))
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1
    # e = exp(x) is computed once per element and feeds both accumulators: one load and one exp
    # per body copy (unrolled x2, main vector loop, tail)
    assert src.count("tp::exp(") == 4 and src.count("(arg0 +") == 4


def test_five_op_softmax_keeps_row_in_scratch():
    def sm(x):
        m = x.amax(-1, keepdim=True)
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)
    out, cf = run_native(sm, rnd(16, 1000))
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1 and "scratch_" in src


def test_horizontal_fusion_can_be_disabled(config_patch):
    config_patch("stax.horizontal_fusion", False)
    x = rnd(8, 40)
    out, cf = run_native(lambda x: (x.sum(-1), x.amax(-1)), x, n_red=40, scale=float(x.abs().sum(-1).max()))
    assert len(_kernels(cf)) == 2


# ---- fallbacks, strictness, debugging ---------------------------------------------------------------------
def test_fallback_kernel_listed_and_strict_error(capsys, monkeypatch):
    monkeypatch.setenv("TP_STAX_LOWER_DEBUG", "1")
    x = rnd(5, 6)

    p = tp.from_torch((torch.rand(5, 6) > 0.5).float())       # probabilities 0 and 1: a deterministic draw

    def f(a, p):   # bernoulli with tensor probabilities: eager's kernel checks them (no lowering)
        return tp.bernoulli(p * a.abs().sign()) * 2 + a
    cf = tp.compile(f)
    cf(x, p)
    assert_close(cf(x, p), f(x, p))
    err = capsys.readouterr().err
    assert "[stax] fallback kernel for bernoulli" in err
    with pytest.raises(tp.compiler.BackendCompilerError, match="bernoulli"):
        tp.compile(f, strict_native=True)(x, p)


def test_sort_like_scan_and_conv_ops_are_extern_kernels_under_strict_native():
    """Sort-like ops, scans, scatter and the convolutions run as library (ATen) kernels: allowed by
    strict_native, and their pointwise consumers fuse into the next Stax kernel."""
    x, v = rnd(2, 3, 6, 6), rnd(4, 10)
    v[0, :3] = v[0, 5]                                  # repeated values: mode, unique
    idx = tp.from_torch(torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]]))
    w3, wt = rnd(4, 2, 1, 3, 3, seed=1), rnd(3, 4, 3, 3, seed=2)

    def f(x, v):
        return (tp.median(v) * 2, tp.median(v, 1)[0] + 1, tp.nanmedian(v, 1)[1], tp.mode(v, 1)[0] * 3,
                tp.kthvalue(v, 2, 1)[0] - 1, tp.cummax(v, 1)[0] * 2, tp.cummin(v, 1)[1],
                tp.unique(v) * 2, tp.masked_select(v * 2, v > 0) + 1, v[v[:, 0] > 0] * 3,
                tp.zeros(4, 10).scatter(1, idx, v[:, :2] * 2),
                F.conv3d(x[None] * 2, w3).relu(), F.conv_transpose2d(x, wt) + 1)
    cf = tp.compile(f, strict_native=True)
    cf(x, v)
    got, want = cf(x, v), f(x, v)
    for g, e in zip(got, want):
        assert_close(g, e, rtol=1e-5, atol=1e-5)
    src = cf._cache[0].artifact.source
    assert [ln for ln in src.splitlines() if "FALLBACK" in ln] == [] and "extern kernel: conv3d" in src


def test_dead_intermediate_buffers_are_kept_for_the_next_call(monkeypatch):
    """A buffer dead at the end of a call (here the matmul operand exp(x)) is stashed and taken again
    by the next call: same memory, no fresh pages.  Outputs are never kept: a result stays valid
    after later calls.  TP_STAX_KEEP_BUFFERS=0 generates plain allocations."""
    w = rnd(64, 32)

    def f(x):
        return (x.exp() @ w).relu() * 2
    cf = tp.compile(f, strict_native=True)
    x1, x2 = rnd(100, 64, seed=1), rnd(100, 64, seed=2)
    cf(x1)
    r1 = cf(x1)
    spare = cf._cache[0].artifact.module.spare
    kept = {n: t.data_ptr() for n, t in spare.items()}
    assert len(kept) == 1
    r2 = cf(x2)
    assert {n: t.data_ptr() for n, t in spare.items()} == kept
    assert r1.data_ptr() != r2.data_ptr() and r1.data_ptr() not in kept.values()
    assert_close(r1, f(x1))
    assert_close(r2, f(x2))
    monkeypatch.setenv("TP_STAX_KEEP_BUFFERS", "0")
    cf0 = tp.compile(f, strict_native=True)
    cf0(x1)
    assert "take(" not in cf0._cache[0].artifact.source and "stash(" not in cf0._cache[0].artifact.source
    assert_close(cf0(x2), f(x2))


def test_stash_refuses_buffers_something_else_can_see():
    from tensorplay.compiler.backends.stax.runtime import allocator, stash, take
    spare = {}
    a = torch.randn(10)
    stash(spare, "a", a)
    assert spare.pop("a") is a
    b = torch.randn(10)
    view = b[2:]                                      # a view shares the storage
    stash(spare, "b", b)
    c = torch.randn(10)
    alias = c                                         # another variable holds the tensor
    stash(spare, "c", c)
    assert spare == {} and view.shape == (8,) and alias is c
    t = take(spare, "d", allocator("cpu"), (2, 3), (1, 2), torch.float64)
    assert t.shape == (2, 3) and t.stride() == (1, 2) and t.dtype == torch.float64
    kept = torch.randn(2, 3)
    spare["e"] = kept                                 # a stashed buffer of the same layout is reused
    assert take(spare, "e", allocator("cpu"), (2, 3), (3, 1), torch.float32) is kept


def test_cache_dir_holds_readable_wrappers_experiment_2(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    x = rnd(12, 12)
    cf = tp.compile(lambda a: (a * 2).sum(-1), strict_native=True)
    cf(x)
    cf(x.t())                                           # a second specialization: another wrapper
    wrappers = list(tmp_path.glob("*/*/wrapper.py"))
    assert len(wrappers) == 2
    texts = [w.read_text() for w in wrappers]
    assert all(kernel_names(t)[:1] == ["kernel0"] and "assert_size_stride" in t for t in texts)
    strides = sorted(re.search(r"assert_size_stride\(arg0, \(12, 12, \), \((\d+), (\d+), \)", t).groups() for t in texts)
    assert strides == [("1", "12"), ("12", "1")]


def test_batch_norm_eval_and_batch_statistics_are_native():
    """batch_norm with running statistics in eval mode is a per-channel affine map fused with its
    neighbours (conv extern -> batch_norm -> relu in one Stax kernel); without running statistics it
    uses the batch's (Welford over every dim but 1).  Training mode with running statistics
    updates them in place: write-backs of the graph inputs, matching eager's."""
    x = tp.from_torch(torch.randn(4, 8, 10, 10, generator=torch.Generator().manual_seed(0)) * 3 + 1)
    w, b, rm = rnd(8, seed=1), rnd(8, seed=2), rnd(8, seed=3)
    rv = tp.from_torch(torch.rand(8, generator=torch.Generator().manual_seed(4)) + 0.5)
    cw = rnd(8, 8, 3, 3, seed=5)
    out, cf = run_native(lambda x, cw, m, v, w, b: F.relu(F.batch_norm(F.conv2d(x, cw, padding=1), m, v, w, b,
                                                                       training=False)),
                         x, cw, rm, rv, w, b, n_red=72, scale=float(F.conv2d(x, cw, padding=1).abs().max()) * 8)
    assert len(_kernels(cf)) == 1                       # conv is an extern kernel; bn + relu fuse
    run_native(lambda x, m, v: F.batch_norm(x, m, v, training=False), x, rm, rv)
    run_native(lambda x, m, v, w, b: F.batch_norm(x[:, :, 0, 0], m, v, w, b, training=False) * 2, x, rm, rv, w, b)
    run_native(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b, n_red=400, scale=8.0)
    # (x - m) cancels: the rounding error is relative to |x| * rstd, not to the result
    run_native(lambda x, m, v: F.batch_norm(x, m, v, training=False), x.double(), rm.double(), rv.double(),
               n_red=4, scale=float((x.abs().max() + rm.abs().max()) * rv.rsqrt().max()))
    # training with running statistics: native, the in-place update of the inputs as eager's
    rm1, rv1, rm2, rv2 = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    f = lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True, momentum=0.3).relu()   # noqa: E731
    cf = tp.compile(f, strict_native=True)
    for _ in range(3):
        r64 = f(x.double(), rm2.double(), rv2.double(), w.double(), b.double())
        check_error_model(cf(x, rm1, rv1, w, b), f(x, rm2, rv2, w, b), r64, n_red=400, scale=8.0)
        assert_close(rm1, rm2, rtol=1e-6, atol=1e-6)
        assert_close(rv1, rv2, rtol=1e-6, atol=1e-6)
    assert not torch.equal(rm1._data, rm._data)
    # running statistics the graph reads again: the fallback kernel keeps eager's order
    g = lambda x, m, v: F.batch_norm(x, m, v, training=True, momentum=0.5) + m.sum()   # noqa: E731
    rm3, rm4 = rm.clone(), rm.clone()
    assert_close(tp.compile(g)(x, rm3, rv.clone()), g(x, rm4, rv.clone()), rtol=1e-5, atol=1e-5)
    assert_close(rm3, rm4)
    with pytest.raises(tp.compiler.BackendCompilerError, match="batch_norm"):
        tp.compile(g, strict_native=True)(x, rm.clone(), rv.clone())


@pytest.mark.parametrize("shape,groups", [((4, 8, 10, 10), 4), ((4, 8, 10, 10), 1), ((4, 8, 10, 10), 8),
                                          ((6, 8), 2), ((3, 6, 7), 3)])
def test_group_norm_is_native(shape, groups):
    """group_norm: Welford statistics of each (sample, group) through an index map of x (no copy),
    then one pointwise kernel reading them at floor(channel / (C/G)); fuses with a consumer."""
    x = tp.from_torch(torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3 + 1)
    c = shape[1]
    w, b = rnd(c, seed=1), rnd(c, seed=2)
    n_red = math.prod(shape[1:]) // groups
    run_native(lambda x, w, b: F.group_norm(x, groups, w, b).relu(), x, w, b, n_red=n_red, scale=8.0)
    run_native(lambda x: F.group_norm(x * 2, groups), x, n_red=n_red, scale=8.0)


@pytest.mark.parametrize("k,s,p,ceil,cip,div", [(2, None, 0, False, True, None), (3, 2, 1, True, True, None),
                                                 (3, 2, 1, True, False, None), ((3, 2), (1, 2), (1, 0), False, False, None),
                                                 (2, 2, 1, True, True, 5), (3, 3, 1, True, False, None)])
def test_avg_pool2d_is_native(k, s, p, ceil, cip, div):
    """avg_pool2d: a sum over the window of an index map with masked loads (padding, ceil_mode's
    partial windows: bounds.py proves the masked accesses in range through the window's mask), then
    eager's divisor from the output position; the relu consumer fuses."""
    x = rnd(2, 3, 11, 9)
    kk = (k, k) if isinstance(k, int) else k
    run_native(lambda x: F.avg_pool2d(x, k, s, p, ceil, cip, div).relu(), x, n_red=kk[0] * kk[1], scale=4.0)
    run_native(lambda x: F.avg_pool2d(x[0] * 2, k, s, p, ceil, cip, div), x, n_red=kk[0] * kk[1], scale=8.0)


@pytest.mark.parametrize("out", [1, (2, 3), (11, 9), (1, 9)])
def test_adaptive_avg_pool2d_with_equal_bins_is_native(out):
    x = rnd(2, 3, 22, 9)
    oh, ow = (out, out) if isinstance(out, int) else out
    n_red = (22 // oh) * (9 // ow)
    run_native(lambda x: F.adaptive_avg_pool2d(x, out) * 2, x, n_red=n_red, scale=8.0)
    run_native(lambda x: F.adaptive_avg_pool2d(x[0], out), x, n_red=n_red, scale=4.0)


def test_size_zero_and_scalars():
    run_native(lambda a: (F.softmax(a, -1), F.log_softmax(a, 0)), rnd(3, 0))
    run_native(lambda a: (a * 2 + 1).sum(-1), rnd(0, 7))
    run_native(lambda a: a.sum(0), rnd(0, 7))
    run_native(lambda a: a * 2 + 1, tp.tensor(3.0))
    run_native(lambda a: a.exp().sum(), rnd(1))


def test_non_contiguous_input_guard_and_recompile():
    x = rnd(8, 16)
    cf = tp.compile(lambda a: a * 2, strict_native=True)
    cf(x)
    cf(x)
    y = rnd(16, 8).t()
    assert_close(cf(y), y * 2)
    assert cf.counters["captures"] == 2


def test_stax_backend_compiles_training_regions_through_aot():
    # training regions go through AOT autograd (docs/aot.md): both graphs native under strict_native
    w = rnd(4).requires_grad_()
    x = rnd(3, 4)
    cf = tp.compile(lambda x, w: (x * w).sum(), strict_native=True)
    for _ in range(2):
        w.grad = None
        out = cf(x, w)
        out.backward()
        assert_close(w.grad, x.sum(0))
    assert out.grad_fn.name() == "CompiledRegionFunctionBackward"


def test_locate_error_names_the_broken_layer():
    def broken(gm, example_inputs, **kw):
        def run(*a):
            return tuple(o * 1.01 for o in gm(*a))   # a wrong backend
        return run
    tp.compiler.register_backend(broken, name="broken_test")
    x = rnd(4, 5)
    res = tp.compiler.locate_error(lambda a: (a * 2).sum(-1), x, prefixes=("eager", "stax", "broken_test"))
    assert res.first_bad == "broken_test"
    assert res.details["eager"] == "ok" and res.details["stax"] == "ok"
    assert "max abs difference" in res.details["broken_test"]


def test_bounds_interval_analysis():
    import sympy
    from tensorplay.compiler.backends.stax.bounds import Interval, bound, check_access, index_type
    from tensorplay.compiler.backends.stax.ir import Unsupported
    x, r = sympy.symbols("x r", integer=True)
    ranges = {x: (0, 63), r: (0, 127)}
    assert bound(128 * x + r, ranges) == Interval(0, 8191)
    assert bound(3 - 2 * r, ranges) == Interval(-251, 3)
    check_access("buf", 128 * x + r, ranges, 8192)            # proved in range
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("buf", 128 * x + r + 1, ranges, 8192)    # one past the end
    assert index_type([bound(128 * x + r, ranges)]) == "int32_t"
    big = {x: (0, 2 ** 20), r: (0, 2 ** 12)}
    assert index_type([bound(4096 * x + r, big)]) == "int64_t"
    # the generated kernel declares the width it proved
    cf = tp.compile(lambda a: a * 2, strict_native=True)
    cf(rnd(8, 8))
    assert "using idx_t = int32_t;" in cf._cache[0].artifact.source


def test_flip_and_bitwise_not_and_input_storage_offset():
    x = rnd(6, 9)
    run_native(lambda a: tp.flip(a * 2, (0, 1)) + 1, x)
    g = torch.Generator().manual_seed(5)
    i = tp.from_torch(torch.randint(-9, 9, (5, 7), generator=g, dtype=torch.int32))
    run_native(lambda a: (~a, ~(a > 0)), i)
    # an input whose first element is not at the start of its storage (data_ptr includes the offset)
    base = rnd(10, 8)
    run_native(lambda a: (a + 1, a.t() * 2), base[3:, 2:6])


# ---- full pointwise coverage: rounding divisions, powers, inverse trig, predicates, factories -------
def _int_tensor(*shape, lo=-50, hi=50, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randint(lo, hi, shape, generator=g, dtype=dtype))


def _new_float_ops(a, b, u, p):
    # u in (-1, 1) (asin, acos), p in (0, 1) (logit): inputs, not computed in the graph, so that an
    # ulp of difference in tanh/sigmoid is not amplified by the steep inverse functions
    return (a // b, a % b, tp.fmod(a, b), tp.float_power(a.abs(), b), tp.rsub(a, b), b - 3 * a,
            tp.fmax(a, b), tp.fmin(a, b), u.asin(), u.acos(), a.atan(), a.sinh(), a.cosh(), (a * 3).frac(),
            tp.atan2(a, b), tp.hypot(a, b), p.logit(), p.logit(eps=0.2), a.isposinf(),
            a.isneginf(), tp.isclose(a, b + a * 1e-6), a.abs() ** b, tp.div(a, b, rounding_mode="floor"))


@pytest.mark.parametrize("layout,dtype", [("contiguous", tp.float32), ("strided", tp.float64),
                                          pytest.param("transposed", tp.float32, marks=pytest.mark.slow),
                                          pytest.param("strided", tp.float32, marks=pytest.mark.slow)])
def test_new_pointwise_ops_layouts(layout, dtype):
    x = LAYOUTS[layout]((9, 37)).to(dtype)
    y = LAYOUTS[layout]((9, 37)).to(dtype) * 2 + 0.25
    u = tp.from_torch(_t(x).tanh())
    p = tp.from_torch(_t(y).sigmoid())
    run_native(_new_float_ops, x, y, u, p)


@pytest.mark.parametrize("bshape", [(37,), (), pytest.param((9, 1), marks=pytest.mark.slow)])
def test_new_binary_ops_broadcasting_and_scalars(bshape):
    a, b = rnd(9, 37), rnd(*bshape, seed=1) + 0.3
    run_native(lambda a, b: (a // b, a % b, tp.fmod(a, b), tp.atan2(a, b), tp.hypot(a, b), tp.fmax(a, b),
                             tp.fmin(b, a), tp.isclose(a, b), tp.rsub(a, b), tp.float_power(b.abs(), a)), a, b)
    run_native(lambda a: (a // 0.7, 2.5 // a, a % -1.5, 3 % a, tp.fmod(a, 0.4), tp.rsub(a, 2.0), 2 ** a,
                          a ** -1, a ** -0.5 if False else a.abs() ** -0.5, a ** 3, a ** 1.7, tp.float_power(a, 2)), a)


@pytest.mark.parametrize("dtype", [tp.int64, pytest.param(tp.int32, marks=pytest.mark.slow)])
def test_new_ops_integer_semantics(dtype):
    a, b = _int_tensor(6, 19, dtype=dtype), _int_tensor(19, lo=1, hi=9, dtype=dtype, seed=1)
    nb = -b                                         # negative divisors: floor vs trunc differ
    run_native(lambda a, b, nb: (a // b, a // nb, a % b, a % nb, tp.fmod(a, nb), tp.div(a, nb, rounding_mode="trunc"),
                                 tp.div(a, b, rounding_mode="floor"), tp.rsub(a, b, alpha=3), tp.fmax(a, b),
                                 tp.fmin(a, nb), tp.isclose(a, b), tp.isclose(a, b, rtol=0.5, atol=2),
                                 a.isposinf(), a.isneginf(), a.asin(), a.atan(), a.sinh(), tp.atan2(a, b),
                                 tp.float_power(a, 2), a // 3, a % -4, 7 // b), a, b, nb)
    # shift counts outside [0, bits) give 0 (<<) or the sign fill (>>), as in torch
    bits = 32 if dtype == tp.int32 else 64
    cnt = tp.from_torch(torch.tensor([0, 1, 3, bits - 1, bits, bits + 5, -1, -bits, 2], dtype=dtype.torch_dtype
                                     if hasattr(dtype, "torch_dtype") else dtype))
    val = tp.from_torch(torch.tensor([5, -5, 123456, -1, 7, -7, 9, -9, torch.iinfo(dtype).min], dtype=cnt.dtype))
    run_native(lambda v, c: (v << c, v >> c, v << 2, v >> 1, 1 << c.abs()), val, cnt)
    # integer pow: negative exponents give 1, +-1 or 0 (torch), large ones wrap
    base = tp.from_torch(torch.tensor([0, 1, -1, 2, -2, 3, 7, -3, 2, 10, 3], dtype=cnt.dtype))
    ex = tp.from_torch(torch.tensor([0, -3, -3, -1, 5, 4, 2, 3, bits + 1, 25, 40], dtype=cnt.dtype))
    run_native(lambda x, e: (x ** e, x ** 2, x ** 3, 2 ** e.abs(), x * 1000003 * 1000003 * 1000003), base, ex)


def test_new_ops_bool_and_mixed_dtype_promotion():
    g = torch.Generator().manual_seed(2)
    p = tp.from_torch(torch.rand(7, 5, generator=g) > 0.5)
    q = tp.from_torch(torch.rand(7, 5, generator=g) > 0.5)
    i = _int_tensor(7, 5, lo=1, hi=9, dtype=torch.int32)
    x = rnd(7, 5, dtype=tp.float64)
    run_native(lambda p, q, i, x: (tp.isclose(p, q), p.asin(), p.sinh(), tp.atan2(p, q), tp.fmax(i, x),
                                   i // x, i % x, tp.fmod(x, i), x ** i, i ** 2.5, tp.hypot(x, i.double()),
                                   tp.isclose(i, i + 1, atol=1), i << i.long(), p.isposinf()), p, q, i, x)


def test_new_ops_special_values_bitwise():
    """+-0, +-inf, NaN: same bits as eager (signed zeros included)."""
    vals = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0, 2.5, -3.75, 1e-30, 0.5, 1.0000001]
    a = tp.tensor([v for v in vals for _ in vals])
    b = tp.tensor([v for _ in vals for v in vals])

    def f(a, b):
        return (a // b, a % b, tp.fmod(a, b), tp.fmax(a, b), tp.fmin(a, b), tp.atan2(a, b), tp.hypot(a, b),
                a.asin(), a.acos(), a.atan(), a.sinh(), a.cosh(), a.frac(), a.logit(), a.logit(eps=0.25),
                a.isposinf(), a.isneginf(), tp.isclose(a, b), tp.isclose(a, b, equal_nan=True), tp.rsub(a, b),
                tp.float_power(a, b), a ** b)
    out, _ = run_native(f, a, b)
    for k, (c, e) in enumerate(zip(out, f(a, b))):
        c, e = _t(c), _t(e)
        if c.dtype.is_floating_point:   # values with one right answer: same bits (the sign of a NaN is free)
            exact = ((e == e.trunc()) | e.isinf()) & ~e.isnan()
            bad = (torch.signbit(c) != torch.signbit(e)) | (c != e)
            assert not (exact & bad).any(), (k, _t(a)[exact & bad], _t(b)[exact & bad], c[exact & bad], e[exact & bad])


def test_integer_division_by_zero_raises_like_eager():
    a = _int_tensor(37, lo=-9, hi=9)
    ok = _int_tensor(37, lo=1, hi=9, seed=1)
    for name, f in [("floor_divide", lambda a, b: a // b + 1), ("remainder", lambda a, b: a % b),
                    ("fmod", lambda a, b: tp.fmod(a, b)), ("div", lambda a, b: tp.div(a, b, rounding_mode="trunc"))]:
        cf = tp.compile(f, strict_native=True)
        cf(a, ok)
        for pos in (0, 36):                          # a vector lane and a tail lane (masked loads give 0)
            bad = tp.from_torch(ok._data.clone())
            bad._data[pos] = 0
            with pytest.raises(RuntimeError, match=f"tp.{name}.*ZeroDivisionError"):
                f(a, bad)
            with pytest.raises(ZeroDivisionError, match=f"tp.{name}: ZeroDivisionError"):
                cf(a, bad)
        assert torch.equal(_t(cf(a, ok)), _t(f(a, ok)))    # the error does not stick
        assert cf.counters["captures"] == 1
    # a scalar zero divisor fails at capture, in eager, exactly as without compile
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        tp.compile(lambda a: a // 0, strict_native=True)(a)


def test_new_ops_size_zero_and_one():
    for shape in [(3, 0), ()]:
        run_native(lambda a, i: (a // 0.5 + a.sinh() + tp.atan2(a, a + 1) + tp.hypot(a, a) + a.frac(),
                                 a.isposinf() | tp.isclose(a, a), i // 3 + i % 3 + (i << 1)), rnd(*shape), _int_tensor(*shape))


def test_factories_fuse_into_their_consumers():
    x = rnd(5, 7)
    f = (lambda a: (tp.zeros(5, 7) + a + tp.full((5, 7), 2.5) * a + tp.arange(7) + tp.linspace(0, 1, 7) * a
                    + tp.eye(5, 7) + tp.arange(1, 8, dtype=tp.float64),
                    tp.ones(5, 7, dtype=tp.int64) * 2 + tp.arange(-3, 25, 4) + tp.linspace(-3, 10, 7, dtype=tp.int64)
                    + tp.eye(5, 7, dtype=tp.int32) + tp.arange(0.5, 7, 1.5, dtype=tp.int64)[:5, None],
                    (tp.full((7,), True, dtype=tp.bool) & (a > 0)) | tp.eye(5, 7, dtype=tp.bool),
                    tp.arange(0.5, 4.0, 0.3) + tp.linspace(-2.5, 7.25, 12) + tp.linspace(2, 5, 1)))
    _, cf = run_native(f, x)
    assert "FALLBACK" not in cf._cache[0].artifact.source
    # a factory read by one consumer is computed inside the consumer's loop, not stored
    _, cf = run_native(lambda a: (tp.arange(7) * a + tp.ones(5, 7)).sum(-1), x)
    assert len(_kernels(cf)) == 1
    # _empty: the right shape and dtype (values unspecified); size 0
    cf = tp.compile(lambda a: (tp.empty(2, 3, dtype=tp.int32), tp.zeros(0, 3) + a[:0, :3], tp.arange(0)),
                    strict_native=True)
    cf(x)
    r = cf(x)
    assert [(tuple(t.shape), t.dtype) for t in r] == [((2, 3), tp.int32), ((0, 3), tp.float32), ((0,), tp.int64)]


# ---- shape ops and indexing: masked loads, floor/Mod index maps, checked indirect loads -------------------
def _index_ints(*shape, lo=-9, hi=9, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randint(lo, hi, shape, generator=g, dtype=dtype))


def test_pad_cat_stack_roll_tile_tri():
    x, y = rnd(6, 9), rnd(6, 9, seed=1)
    run_native(lambda a, b: (F.pad(a, (2, 3)) * 2, F.pad(a, (1, 2, 3, 0), value=-1.5), F.pad(a, (-1, 2, 0, -2)),
                             F.pad(a.unsqueeze(0), (2, 3, 1, 2), mode="reflect"),
                             F.pad(a.unsqueeze(0), (3, 1, 0, 2), mode="replicate"),
                             F.pad(a.unsqueeze(0), (4, 9, 2, 1), mode="circular"),
                             tp.cat([a, b * 2, a[:2]], 0), tp.stack([a, b], 1) + 1, a.roll((-2, 11), (0, 1)),
                             a.roll(5), a.repeat(2, 1, 1), a.tile((2,)), a.triu(2), a.tril(-1) * b), x, y)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_shape_ops_and_gathers_read_any_layout(layout):
    x = LAYOUTS[layout]((6, 9))
    i = tp.from_torch(torch.tensor([3, -1, 5]))
    run_native(lambda a, i: (F.pad(a, (2, 3, 1, 0)), tp.cat([a.exp(), a[:, :1], a], 1), a.roll(3, 1), a.repeat(2, 3),
                             a.tril(), a.index_select(0, i % 6), a[:, i]), x, i)


def test_shape_ops_int_bool_sizes_0_1_and_reductions():
    i, b = _index_ints(5, 1, dtype=torch.int32), _index_ints(4, 3, lo=0, hi=2).bool()
    e, one = rnd(0, 3), rnd(1, 1)
    run_native(lambda i, b: (F.pad(i, (1, 2), value=7), tp.cat([b, b.logical_not()], 1), F.pad(b, (1, 0)),
                             i.roll(2, 0), i.repeat(1, 3), b.tril(), tp.stack([i, i * 2]), b.repeat(2, 1)), i, b)
    run_native(lambda e, o: (tp.cat([e, e * 2], 0), tp.cat([e, o.expand(2, 3)], 0), F.pad(e, (1, 1)),
                             F.pad(o, (2, 1, 1, 0)), o.repeat(3, 2), e.roll(1, 0), tp.cat([o, o], 1).sum(-1)), e, one)
    x = rnd(7, 30)
    run_native(lambda a: (F.pad(a, (2, 2)).sum(-1), tp.cat([a, a.exp()], -1).amax(-1), a.repeat(1, 3).sum(-1)), x,
               n_red=90, scale=float(x.exp().abs().sum()) * 3)


def test_pad_and_cat_of_three_each_compile_to_one_kernel():
    x, y, z = rnd(16, 40), rnd(16, 40, seed=1), rnd(16, 13, seed=2)
    out, cf = run_native(lambda a: F.pad(a, (3, 5, 1, 1)).exp() * 2 + 1, x)
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1 and "tp_masked_load<float>" in src
    out, cf = run_native(lambda a, b, c: tp.cat([a * 2, b.exp(), c + 1], 1), x, y, z)
    assert len(_kernels(cf)) == 1 and "FALLBACK" not in cf._cache[0].artifact.source


def test_gather_family_and_negative_indices():
    x = rnd(6, 9)
    i = tp.from_torch(torch.tensor([3, 0, 5, 5, 1]))
    n = tp.from_torch(torch.tensor([-1, 0, 2, -6], dtype=torch.int32))       # in range: wrap like eager
    g = _index_ints(6, 7, lo=0, hi=9, seed=1)
    run_native(lambda a, i, n, g: (a.index_select(0, i) * 2, a.index_select(1, i), a.gather(1, g),
                                   a.gather(0, g[:, :5] % 6), tp.take_along_dim(a, g, 1), tp.take_along_dim(a, g),
                                   a[n], a[:, n] + 1, a[n, 1:8:2], a[2, n], a[n.unsqueeze(1), i], a[n, None, n],
                                   a.index_fill(1, n.long(), -3.0)), x, i, n, g)


def test_indexing_int_bool_dtypes_broadcasting_and_sizes_0_1():
    w = rnd(16, 10).t()                                                   # a transposed embedding table
    e = _index_ints(3, 4, lo=0, hi=10, seed=2)
    run_native(lambda w, e: (F.embedding(e, w) * 2, F.embedding(e[0], w)), w, e)
    b, k = _index_ints(5, 4, lo=0, hi=2, seed=3).bool(), _index_ints(5, 4, lo=-50, hi=50, dtype=torch.int32, seed=4)
    j = tp.from_torch(torch.tensor([4, -5, 0]))
    g = _index_ints(5, 1, lo=0, hi=4, seed=5)
    run_native(lambda b, k, j, g: (b[j], k[j, 1:], k.index_select(1, j % 4), b.gather(1, g), tp.take_along_dim(k, g, 1),
                                   k.index_fill(0, j, 7), b.index_fill(1, j[:1] % 4, True)), b, k, j, g)
    z, one = tp.from_torch(torch.zeros(0, dtype=torch.int64)), tp.from_torch(torch.tensor([0]))
    x = rnd(3, 4)
    run_native(lambda a, z, o: (a.index_select(0, z), a[z], a.index_select(1, o), a[o, o], a.index_fill(0, z, 1.0),
                                F.one_hot(o, 3), F.one_hot(z, 2)), x, z, one)
    c = _index_ints(4, 5, lo=0, hi=6, seed=6)
    run_native(lambda c: F.one_hot(c, 6) * 2, c)


@pytest.mark.parametrize("case", ["index_select", "gather", "take_along_dim", "embedding", "index", "index_fill",
                                  "one_hot"])
def test_out_of_range_index_raises_naming_op_value_size(case):
    x = rnd(6, 9)
    f, good, bad, err, msg = {
        "index_select": (lambda a, i: a.index_select(1, i) * 2, [1, 8], [1, 9], IndexError, r"index 9 .*size 9"),
        "gather": (lambda a, i: a.gather(0, i.view(1, 2)), [1, 5], [-1, 5], IndexError, r"index -1 .*size 6"),
        "take_along_dim": (lambda a, i: tp.take_along_dim(a, i.view(1, 2), 1), [0, 3], [0, 12], IndexError,
                           r"index 12 .*size 9"),
        "embedding": (lambda a, i: F.embedding(i, a), [0, 5], [6, 0], IndexError, r"index 6 .*6 rows"),
        "index": (lambda a, i: a[:, i] + 1, [-9, 8], [2, -10], IndexError, r"index -10 .*size 9"),
        "index_fill": (lambda a, i: a.index_fill(0, i, 0.5), [-6, 5], [7, 5], IndexError, r"index 7 .*size 6"),
        "one_hot": (lambda a, i: F.one_hot(i, 4) + a.shape[0], [0, 3], [4, 1], RuntimeError, r"class value 4"),
    }[case]
    cf = tp.compile(f, strict_native=True)
    gi, bi = tp.from_torch(torch.tensor(good)), tp.from_torch(torch.tensor(bad))
    assert_close(cf(x, gi), f(x, gi))
    with pytest.raises(err, match=rf"tp\.{case}: {msg}"):
        cf(x, bi)
    assert_close(cf(x, gi), f(x, gi))          # the error slot was cleared: the next call is fine


def test_index_computed_from_loop_variables_is_a_direct_load():
    """An index built by arithmetic on loop variables (``embedding(arange(T), wpe)``, as in GPT) is
    proved in range (bounds.py) and read as an ordinary affine load: no run-time check, no gather.
    (Out-of-range arange indices fail at capture, in eager.)"""
    w = rnd(32, 64)
    _, cf = run_native(lambda w: F.embedding(tp.arange(32), w) * 2 + F.embedding(tp.arange(31, -1, -1), w), w)
    src = cf._cache[0].artifact.source
    assert "tp_check_index" not in src and "tp_gather" not in src, src
    # integer division is not tracked symbolically: the run-time check stays
    _, cf = run_native(lambda w: F.embedding(tp.arange(64) // 2, w) + 1, w)
    assert "tp_check_index" in cf._cache[0].artifact.source


def test_bounds_masks_mod_floor_and_indirect():
    import sympy
    from tensorplay.compiler.backends.stax.bounds import Interval, IndirectIndex, bound, check_access, refine
    from tensorplay.compiler.backends.stax.ir import Unsupported
    x, r = sympy.symbols("x r", integer=True)
    ranges = {x: (0, 9), r: (0, 4)}
    assert refine(ranges, sympy.And(x >= 2, 3 * x < 20)) == {x: (2, 6), r: (0, 4)}
    assert refine(ranges, sympy.And(x >= 2, r < x)) == {x: (2, 9), r: (0, 4)}        # 2 variables: ignored
    check_access("b", x - 2, ranges, 8, cond=sympy.And(x >= 2, x < 10))             # pad: [0, 7] where it holds
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("b", x - 2, ranges, 8)                                          # unmasked: -2 is possible
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("b", x - 2, ranges, 7, cond=x >= 2)                             # 7 is past the end
    assert bound(sympy.Mod(x + 3, 5) * 2 + 10 * IndirectIndex(0, 7), ranges) == Interval(0, 68)
    assert bound(sympy.floor((x + 10) / 3), ranges) == Interval(3, 6)
    with pytest.raises(Unsupported, match="non-negative"):
        bound(sympy.Mod(x - r, 5), ranges)                                           # C % differs for a < 0
    # a mask on a combination of variables (a pooling window: h = 2*o + k, 0 <= h < 11), used when the
    # access holds a multiple of it: 9*h + w with w in [0, 8]
    o, k, w = sympy.symbols("o k w", integer=True)
    win = {o: (0, 5), k: (0, 1), w: (0, 8)}
    h = 2 * o + k
    check_access("x", 9 * h + w, win, 99, cond=sympy.And(h >= 0, h < 11))
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", 9 * h + w, win, 99)                                        # h = 11 without the mask
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", 9 * h + w, win, 98, cond=sympy.And(h >= 0, h < 11))         # 98 is past the end
    with pytest.raises(Unsupported, match="cannot prove"):
        check_access("x", 18 * o + 18 * k + w, win, 99, cond=sympy.And(h >= 0, h < 11))  # not a multiple of h
    check_access("x", 9 * h + w, win, 1, cond=sympy.And(h >= 3, h < 2))              # never holds: nothing read


# ---- reductions: argmax/argmin, values + indices, Welford var/mean, nan-reductions, norms ------------------
def _ints(*shape, lo=-3, hi=3, dtype=torch.float32, seed=0):
    """Few distinct values: many ties (the first index must win)."""
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randint(lo, hi, shape, generator=g).to(dtype))


def _special_rows():
    """Rows with NaN (several per row: the first wins), all -inf, +-0 ties, +inf ties, NaN first."""
    t = torch.randn(6, 21, generator=torch.Generator().manual_seed(4))
    nan, inf = float("nan"), float("inf")
    t[0, 5] = t[0, 12] = nan
    t[1] = -inf
    t[2] = 0.0
    t[2, ::3] = -0.0
    t[3, 3] = t[3, 7] = inf
    t[3, 9] = t[3, 15] = -inf
    t[4, 0] = nan
    t[5, 20] = nan
    return tp.from_torch(t)


def _argfns(a):
    return (a.argmax(), a.argmin(), a.argmax(-1), a.argmin(-1, keepdim=True), a.argmax(0), a.argmin(0),
            a.argmax(dim=None, keepdim=True))


def test_argmax_argmin_max_dim_aminmax():
    """Default-suite cut (few kernels; the _matrix tests below cover layouts/dtypes/dims): NaN (first
    NaN wins), +-inf, +-0 and value ties (first index wins), long rows (unrolled accumulators, tail),
    dim=None (flattened), keepdim, non-trailing dim of a transposed input, int64 and bool inputs."""
    def f(s, t, i, b):
        return (*_argfns(s)[:4], *tp.max(s, 1), *tp.min(s, -1, keepdim=True), *tp.aminmax(s, dim=1),
                t.argmax(-1), *tp.min(t, -1),                                  # long rows of ties
                t.t().argmin(0), *tp.max(t.t(), 0, keepdim=True),              # non-trailing dim
                i.argmax(-1), *tp.max(i, 1), *tp.aminmax(i, dim=-1), *tp.max(b, 1))
    run_native(f, _special_rows(), _ints(3, 1000, lo=-40, hi=40),
               _ints(5, 37, lo=-2**40, hi=2**40, dtype=torch.int64), _ints(5, 37, lo=0, hi=2, dtype=torch.bool))


@pytest.mark.slow
def test_argmax_argmin_matrix():
    """Layouts, ties (first index wins), int32/int64, NaN (first NaN wins), +-inf, +-0, long rows
    (unrolled accumulators + tail), dim=None (flattened), keepdim: all in one compiled program."""
    xs = [LAYOUTS[k]((9, 37)) for k in sorted(LAYOUTS)] + [
        _ints(9, 37), _ints(9, 37, lo=-5, hi=5, dtype=torch.int32), _ints(9, 37, lo=-2**40, hi=2**40, dtype=torch.int64),
        _special_rows(), _ints(3, 1000, lo=-40, hi=40)]
    run_native(lambda *xs: tuple(r for a in xs for r in _argfns(a)), *xs)


@pytest.mark.slow
def test_argmax_shapes_and_edge_sizes_matrix():
    run_native(lambda a, b, c, d, e: (a.argmax(1), a.argmin(2, keepdim=True), a.argmax(), a.argmin(0),
                                      b.argmax(1), b.argmin(0), b.argmax(),          # size-1 dims
                                      c.argmax(), c.argmin(0),                        # 0-d
                                      d.argmax(), d.argmin(0), e.argmax(1)),          # (1,), no rows
               _ints(3, 5, 7), rnd(4, 1, 6), tp.tensor(2.5), rnd(1), rnd(0, 5))


@pytest.mark.parametrize("f", [lambda a: a.argmax(1), lambda a: a.argmax(), lambda a: tp.max(a, 1),
                               lambda a: tp.aminmax(a)], ids=["argmax_dim", "argmax_all", "max_dim", "aminmax"])
def test_empty_reductions_raise_like_eager(f):
    x = rnd(3, 0)
    with pytest.raises((IndexError, RuntimeError)) as eager:
        f(x)
    with pytest.raises(Exception) as compiled:
        tp.compile(f, strict_native=True)(x)
    assert str(eager.value).split(": ", 1)[1] in str(compiled.value)


@pytest.mark.slow
def test_max_min_dim_values_and_indices_aminmax_matrix():
    xs = [LAYOUTS["transposed"]((9, 37)), _special_rows(), _ints(9, 37), _ints(9, 37, lo=-4, hi=4, dtype=torch.int32)]

    def f(*xs):
        out = []
        for a in xs + (xs[-1] > 0,):                                   # and a bool input
            out += [*tp.max(a, 1), *tp.min(a, 0, keepdim=True), *tp.max(a, -1, keepdim=True), *tp.min(a, 1)]
        for a in xs:
            out += [*tp.aminmax(a), *tp.aminmax(a, dim=1), *tp.aminmax(a, dim=0, keepdim=True)]
        return tuple(out)
    run_native(f, *xs)


def test_max_dim_one_kernel_one_accumulator_aminmax_fused():
    from tensorplay.compiler import config
    out, cf = run_native(lambda a: (*tp.max(a, -1), *tp.aminmax(a, dim=-1)), rnd(16, 100))
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1                                   # one pass over a for all four
    assert src.count("tp::ArgAcc<float> acc_") == config.get("stax.cpp.unroll")   # values and indices: one accumulator


def _big_mean(*shape, seed=0):
    return tp.from_torch(1e4 + torch.randn(shape, generator=torch.Generator().manual_seed(seed)))


def test_welford_var_std_var_mean():
    """var/std/var_mean/std_mean, correction 0/1/2.5, keepdim, a trailing dim and a non-trailing dim
    list of a transposed input, mean 1e4: within the error model (float64 Welford state for float32
    rows, as accurate as eager) -- and the naive float32 E[x^2] - E[x]^2 is not."""
    def f(x, y):
        out = []
        for a, dim in ((x, -1), (y, (0, 2))):
            out += [a.var(dim, correction=2.5), a.std(dim, keepdim=True), *tp.var_mean(a, dim, correction=0),
                    *tp.std_mean(a, dim, correction=1, keepdim=True)]
        return tuple(out)
    x, y = _big_mean(8, 500), _big_mean(6, 33, 5).transpose(0, 1)
    out, cf = run_native(f, x, y, n_red=500)
    assert "tp::welford_update" in cf._cache[0].artifact.source
    naive = (x * x).mean(-1) - x.mean(-1) * x.mean(-1)
    with pytest.raises(AssertionError):
        check_error_model(naive, x.var(-1, correction=0), x.double().var(-1, correction=0), n_red=500)
    # n = 1 (NaN with correction 1, 0 without) and NaN / inf / +-0 rows
    v = tp.tensor([[1.0, float("nan"), 2.0, 3.0], [float("inf"), 1.0, 2.0, 3.0], [0.0, -0.0, 0.0, -0.0]])
    run_native(lambda a, b: (a.var(-1), *tp.var_mean(a, -1, correction=0), b.var(-1), b.std(-1)), rnd(4, 1), v)


@pytest.mark.slow
def test_welford_var_std_var_mean_matrix():
    """correction 0/1/2.5, dim -1/0/None/(0, 2) (non-trailing, non-contiguous), keepdim, large mean.
    The float64 Welford state of a float32 row makes it as accurate as eager (double accumulation)."""
    def f(x, y):
        out = []
        for a, dim in ((x, -1), (x, 0), (x, None), (y, (0, 2))):
            for c in (0, 1, 2.5):
                for keepdim in (False, True):
                    kw = dict(correction=c, keepdim=keepdim)
                    out += [a.var(dim, **kw), a.std(dim, **kw), *tp.var_mean(a, dim, **kw), *tp.std_mean(a, dim, **kw)]
        return tuple(out)
    run_native(f, _big_mean(9, 37), _big_mean(6, 33, 5).transpose(0, 1), n_red=9 * 37)


@pytest.mark.slow
def test_welford_edge_cases_matrix():
    v = tp.tensor([[1.0, float("nan"), 2.0, 3.0], [float("inf"), 1.0, 2.0, 3.0], [0.0, -0.0, 0.0, -0.0]])
    run_native(lambda a, b, c, d: (a.var(-1), a.var(-1, correction=0), *tp.var_mean(a, -1),   # n = 1: NaN, 0
                                   b.var(-1), *tp.var_mean(b, -1), b.std(0),                  # empty rows: NaN
                                   c.var(-1), c.std(-1),                                      # NaN, inf, +-0
                                   d.var(-1), tp.var_mean(d, 0)[0]),                          # float64
               rnd(4, 1), rnd(3, 0), v, rnd(5, 300, dtype=tp.float64), n_red=300)


def test_layer_norm_reads_row_once_same_kernel_count():
    x = _big_mean(16, 300)
    w, b = rnd(300, seed=2), rnd(300, seed=3)
    xd, bd = x._data.double(), b._data.double()
    rstd = 1 / (xd.var(-1, correction=0, keepdim=True) + 1e-5).sqrt()
    # the terms are x * rstd (~1e4 here): a float32 mean of them is exact to ~u * 1e4 only (eager too)
    scale = xd.abs() * rstd * w._data.double().abs() + bd.abs()
    out, cf = run_native(lambda a, w, b: F.layer_norm(a, (300,), w, b), x, w, b, n_red=300, scale=scale)
    src = cf._cache[0].artifact.source
    assert len(_kernels(cf)) == 1                          # as before Welford
    assert src.count("// phase") == 2                      # statistics (one read), then the output
    assert "tp::welford_update" in src


def _with_nans(*shape, seed=0):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    t[torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1)) < 0.2] = float("nan")
    t[0] = float("nan")                                    # an all-NaN row
    return tp.from_torch(t)


_DIMS = [-1, 0, None, (0, 1)]


def test_nansum_nanmean_count_nonzero_norm():
    """NaN-ignoring sums/means (an all-NaN row: NaN mean), count_nonzero (NaN counts), every vector
    p-norm of the op table, over a row and over everything (the _matrix tests: dims, keepdim, dtypes)."""
    ps = ["fro", 1, 2, float("inf"), -float("inf"), 0, 3, 0.5]
    x = _with_nans(7, 41)
    run_native(lambda a: (tp.nansum(a, -1), tp.nanmean(a, -1, keepdim=True), tp.nansum(a), tp.nanmean(a),
                          tp.count_nonzero(a, -1), tp.count_nonzero(a)), x, n_red=287,
               scale=float(x.nan_to_num().abs().sum()))
    z = LAYOUTS["transposed"]((9, 37))
    z = z * tp.where(z.abs() < 0.3, tp.tensor(0.0), tp.tensor(1.0))        # exact zeros (p = 0, 0.5)
    run_native(lambda a: tuple(r for p in ps for r in (tp.norm(a, p), tp.norm(a, p, -1, keepdim=True))), z, n_red=333)


@pytest.mark.slow
def test_nansum_nanmean_matrix():
    x = _with_nans(7, 41)
    run_native(lambda a: tuple(r for d in _DIMS for k in (False, True)
                               for r in (tp.nansum(a, d, keepdim=k), tp.nanmean(a, d, keepdim=k))),
               x, n_red=287, scale=float(x.nan_to_num().abs().sum()))
    run_native(lambda a: tuple(tp.nansum(b, d) for d in _DIMS for b in (a, a.t())),
               _ints(7, 41, lo=-9, hi=9, dtype=torch.int32))


@pytest.mark.slow
def test_count_nonzero_matrix():
    x = _ints(7, 41, lo=-1, hi=2)
    x = x * tp.where(x == 1, tp.tensor(float("nan")), tp.tensor(1.0))      # NaN counts as non-zero
    run_native(lambda a, i, b: tuple(tp.count_nonzero(t, d) for d in _DIMS for t in (a, a.t(), i, b)),
               x, _ints(7, 41, lo=-1, hi=2, dtype=torch.int64), _ints(7, 41, lo=0, hi=2, dtype=torch.bool))


@pytest.mark.slow
def test_norm_matrix():
    """p = 'fro'/2, 1, inf, -inf, 0, 3, 0.5 over all elements, a dim, keepdim, a dim list."""
    x = LAYOUTS["transposed"]((9, 37))
    x = x * tp.where(x.abs() < 0.3, tp.tensor(0.0), tp.tensor(1.0))        # exact zeros (p = 0, 0.5)
    ps = ["fro", 1, 2, float("inf"), -float("inf"), 0, 3, 0.5]
    run_native(lambda a: tuple(r for p in ps for r in (tp.norm(a, p), tp.norm(a, p, -1), tp.norm(a, p, 0, keepdim=True),
                                                       tp.norm(a, p, (0, 1)))), x, n_red=333)


@pytest.mark.parametrize("size,idx", [((5, 7), (slice(1, 4), slice(None, None, 2))), ((5, 7), (2,)),
                                      ((5, 7), (Ellipsis, 3)), ((4, 6, 8), (None, slice(None), 1, slice(2, 8, 3))),
                                      ((6, 9), (slice(-4, None), slice(1, -1, 4))), ((4, 4), (-1, slice(None, None, 3)))])
def test_getitem_backward_is_a_masked_index_map(size, idx):
    """The gradient of basic indexing (ints, slices with steps, None, Ellipsis): zeros with the
    gradient on the view's lattice, one Stax kernel; training through slicing is native."""
    from tensorplay.ops.registry import OPS
    x = torch.randn(*size, requires_grad=True, generator=torch.Generator().manual_seed(0))
    y = x[idx]
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    want, = torch.autograd.grad(y, x, g)
    cf = tp.compile(lambda gg: OPS["_getitem_backward"].fn(gg, list(size), idx) * 2, strict_native=True)
    assert torch.equal(_t(cf(tp.from_torch(g))), want * 2)
    w = tp.from_torch(x.detach().double().clone()).requires_grad_()
    loss = tp.compile(lambda w: (w[idx] * 3).sum() + (w ** 2).sum(), strict_native=True)(w)
    loss.backward()
    xd = x.detach().double().requires_grad_()
    assert_close(w.grad, torch.autograd.grad((xd[idx] * 3).sum() + (xd ** 2).sum(), xd)[0])


@pytest.mark.parametrize("size,off,d1,d2", [((5, 7), 0, 0, 1), ((5, 7), 2, 0, 1), ((5, 7), -3, 0, 1),
                                            ((3, 4, 5), 1, 2, 0), ((3, 4, 5), -1, -1, 1), ((4, 4), 5, 0, 1)])
def test_diagonal_backward_is_a_masked_index_map(size, off, d1, d2):
    from tensorplay.ops.registry import OPS
    x = torch.randn(*size, requires_grad=True, generator=torch.Generator().manual_seed(0))
    y = x.diagonal(off, d1, d2)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    want, = torch.autograd.grad(y, x, g)
    cf = tp.compile(lambda gg: OPS["_diagonal_backward"].fn(gg, list(size), off, d1, d2) + 1, strict_native=True)
    assert torch.equal(_t(cf(tp.from_torch(g))), want + 1)


def test_training_through_advanced_indexing_diagonal_and_as_strided_is_native():
    """The backward of x[idx] and of as_strided are scatter-adds (extern kernels, like index_put),
    of diagonal a masked index map: the training region compiles under strict_native.  (AOT used
    to fail on as_strided: its formula reads the saved input's layout through the ctx.)"""
    w0 = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor([0, 2, 2, 5])
    w = tp.from_torch(w0.clone()).requires_grad_()

    def f(w, i, L):
        return (w[i] * 2).sum() + w.diagonal(1).sum() * 3 + (w.as_strided((3, 2), (5, 2), 1) ** 2).sum()
    loss = tp.compile(lambda w, i: f(w, i, tp), strict_native=True)(w, tp.from_torch(idx))
    loss.backward()
    wt = w0.clone().requires_grad_()
    f(wt, idx, torch).backward()
    assert_close(w.grad, wt.grad)


@pytest.mark.parametrize("n", [1, 3, 4, 7, 12, 19])
def test_layer_norm_of_rows_shorter_than_a_vector(n):
    """Rows of fewer elements than one SIMD vector (only the masked tail runs, its length known at
    compile time): compiled layer_norm equals eager (wrong on GCC 12.2 / AVX-512 before iota was
    made opaque to the optimiser)."""
    x, w, b = tp.randn(6, n), tp.randn(n), tp.randn(n)
    f = lambda x: tp.nn.functional.layer_norm(x, (n,), w, b)  # noqa: E731
    cf = tp.compile(f, strict_native=True)
    cf(x)
    assert (cf(x) - f(x)).abs().max().item() <= 1e-5
