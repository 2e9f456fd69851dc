"""Stax on CPU: every lowered op compiled against eager, fusion structure, fallbacks, the cache.

Tolerance (SPEC §5, error model): the compiled float32 result ``c`` is compared with a float64
reference ``r`` and with the float32 eager result ``e``:
    |c - r| <= 8·|e - r| + 8·u·|r| + 2·sqrt(n)·u·S
where u = 2^-24, n is the length of the longest reduction and S the magnitude of the reduced terms
(sum of |terms|, computed in float64) — the blocked-summation bound of §6.5/§13.3.  Integer and
bool results must match exactly; NaN/inf positions must match.
"""
import math
import os
import re

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler.backends.stax import StaxStrictError
from tensorplay.testing import assert_close

U32 = 2.0 ** -24


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    d = os.environ.get("TP_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "tp_cache")
    monkeypatch.setenv("TP_CACHE_DIR", d)
    yield


def _t(x):
    return x._data if isinstance(x, tp.Tensor) else x


def _f64(v):
    if isinstance(v, tp.Tensor) and v.is_floating_point():
        return v.double()
    return v


def run_native(f, *args, n_red=1, scale=None):
    """Compile with strict_native (every op a Stax kernel), run twice (capture, then the
    artifact), compare with the error model; returns the compiled result of the 2nd call."""
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    out = cf(*args)
    e32 = f(*args)
    r64 = f(*[_f64(a) for a in args])
    outs = out if isinstance(out, tuple) else (out,)
    es = e32 if isinstance(e32, tuple) else (e32,)
    rs = r64 if isinstance(r64, tuple) else (r64,)
    for c, e, r in zip(outs, es, rs):
        c, e, r = _t(c), _t(e), _t(r)
        assert c.shape == e.shape and c.dtype == e.dtype, (c.shape, e.shape, c.dtype, e.dtype)
        if not c.dtype.is_floating_point:
            assert torch.equal(c, e)
            continue
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
    return out, cf


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
    assert len(re.findall(r"extern \"C\" void kernel\d+", src)) == 1   # relu, *2, +1: one kernel


# ---- fusion structure (chapter §7) -----------------------------------------------------------------------
def _kernels(cf):
    return re.findall(r'extern "C" void (kernel\d+)', cf._cache[0].artifact.source)


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


def test_horizontal_fusion_can_be_disabled(monkeypatch):
    from tensorplay.compiler.backends.stax import choices
    monkeypatch.setattr(choices, "HORIZONTAL_FUSION", False)
    x = rnd(8, 40)
    out, cf = run_native(lambda x: (x.sum(-1), x.amax(-1)), x, n_red=40, scale=float(x.abs().sum(-1).max()))
    assert len(_kernels(cf)) == 2


# ---- fallbacks, strictness, debugging ---------------------------------------------------------------------
def test_fallback_kernel_listed_and_strict_error(capsys, monkeypatch):
    monkeypatch.setenv("TP_STAX_LOWER_DEBUG", "1")
    x = rnd(5, 6)

    def f(a):
        return tp.cumsum(a * 2, 1).argmax(-1) + 1      # argmax: no native lowering
    cf = tp.compile(f)
    cf(x)
    assert_close(cf(x), f(x))
    err = capsys.readouterr().err
    assert "[stax] fallback kernel for argmax" in err
    with pytest.raises(tp.compiler.BackendCompilerError, match="argmax"):
        tp.compile(f, strict_native=True)(x)


def test_cache_dir_holds_readable_wrappers_experiment_2(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    x = rnd(12, 12)
    cf = tp.compile(lambda a: (a * 2).sum(-1), strict_native=True)
    cf(x)
    cf(x.t())                                           # a second specialization: another wrapper
    wrappers = list(tmp_path.glob("*/*/wrapper.py"))
    assert len(wrappers) == 2
    texts = [w.read_text() for w in wrappers]
    assert all('extern "C" void kernel0' in t and "assert_size_stride" in t for t in texts)
    strides = sorted(re.search(r"assert_size_stride\(arg0, \(12, 12, \), \((\d+), (\d+), \)", t).groups() for t in texts)
    assert strides == [("1", "12"), ("12", "1")]


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


def test_stax_backend_runs_training_regions_op_by_op():
    w = rnd(4).requires_grad_()
    x = rnd(3, 4)
    cf = tp.compile(lambda x, w: (x * w).sum())
    cf(x, w).backward()
    assert_close(w.grad, x.sum(0))
    with pytest.raises(tp.compiler.BackendCompilerError, match="autograd"):
        tp.compile(lambda x, w: (x * w).sum(), strict_native=True)(x, w)


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
