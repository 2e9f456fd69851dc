"""Pointwise op family (tensorplay/ops/pointwise.py) against PyTorch.

Every op goes through ``harness.check_op`` (forward bit-identical to ATen, meta functions, gradients
vs torch.autograd, gradcheck in float64) on: three memory layouts, broadcasting, size-0 / size-1 /
0-d tensors, Python numbers on either side, integer and bool dtypes (tp must raise, naming the op,
exactly where torch raises), the special values ±0, ±inf, NaN (forward, sign of zero included),
in-place twins (result, version bump, autograd through a non-leaf) and bad input.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import tensorplay as tp
from harness import check_op, layouts, to_tp

SPECIAL = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.5, -2.5, 1e-30, 100.0, 0.5, -1.0, 1.0])


def check_or_raises(name, tp_fn, torch_fn, *inputs, **kw):
    """check_op where torch accepts the inputs; otherwise tp must raise an error naming ``tp.<name>``."""
    try:
        torch_fn(*inputs)
    except Exception:
        with pytest.raises(Exception, match=rf"tp\.{name}\b"):
            tp_fn(*[to_tp(x) for x in inputs])
        return None
    return check_op(tp_fn, torch_fn, *inputs, **kw)


def same_signbit(out, ref):
    o, r = out._data, ref
    if o.dtype.is_floating_point:
        ok = (torch.signbit(o) == torch.signbit(r)) | torch.isnan(r)
        assert bool(ok.all()), f"sign of zero differs: {o} vs {r}"


def rnd(shape, dom=None, dtype=torch.float32, seed=0):
    lo, hi = dom if dom is not None else (None, None)
    return layouts(shape, dtype, seed=seed, low=lo, high=hi)[0]


# ---------------------------------------------------------------------------------------------------
# unary ops: (id, tp fn, torch fn, differentiable domain, in-place (tp fn, torch fn) or None)
# ---------------------------------------------------------------------------------------------------
def _m(name, tname=None, **kw):
    tf = getattr(torch, tname or name)
    return (lambda a: getattr(tp, name)(a, **kw)), (lambda a: tf(a, **kw))


def _f(name, **kw):
    tf = getattr(F, name)
    return (lambda a: getattr(tp, name)(a, **kw)), (lambda a: tf(a, **kw))


def _ip(name, tref=None, **kw):
    """In-place twin on a non-leaf: tp ``(a * 1).name_()`` vs torch (``tref`` or the same method)."""
    tp_fn = lambda a: getattr(a * 1, name + "_")(**kw)  # noqa: E731
    torch_fn = tref or (lambda a: getattr(a * 1, name + "_")(**kw))
    return tp_fn, torch_fn


POS = (0.5, 3.0)
UNARY = [
    ("exp", *_m("exp"), (-2, 2), _ip("exp")),
    ("exp2", *_m("exp2"), (-2, 2), _ip("exp2")),
    ("expm1", *_m("expm1"), (-2, 2), _ip("expm1")),
    ("log", *_m("log"), POS, _ip("log")),
    ("log2", *_m("log2"), POS, _ip("log2")),
    ("log10", *_m("log10"), POS, _ip("log10")),
    ("log1p", *_m("log1p"), (-0.5, 2), _ip("log1p")),
    ("sqrt", *_m("sqrt"), POS, _ip("sqrt")),
    ("rsqrt", *_m("rsqrt"), POS, _ip("rsqrt")),
    ("reciprocal", *_m("reciprocal"), POS, _ip("reciprocal")),
    ("neg", *_m("neg"), None, _ip("neg")),
    ("abs", *_m("abs"), None, _ip("abs")),
    ("square", *_m("square"), None, _ip("square")),
    ("sign", *_m("sign"), None, _ip("sign")),
    ("sin", *_m("sin"), None, _ip("sin")),
    ("cos", *_m("cos"), None, _ip("cos")),
    ("tan", *_m("tan"), (-1, 1), _ip("tan")),
    ("asin", *_m("asin"), (-0.9, 0.9), _ip("asin")),
    ("acos", *_m("acos"), (-0.9, 0.9), _ip("acos")),
    ("atan", *_m("atan"), None, _ip("atan")),
    ("sinh", *_m("sinh"), None, _ip("sinh")),
    ("cosh", *_m("cosh"), None, _ip("cosh")),
    ("tanh", *_m("tanh"), None, _ip("tanh")),
    ("sigmoid", *_m("sigmoid"), None, _ip("sigmoid")),
    ("erf", *_m("erf"), None, _ip("erf")),
    ("erfc", *_m("erfc"), None, _ip("erfc")),
    ("floor", *_m("floor"), (-3, 3), _ip("floor")),
    ("ceil", *_m("ceil"), (-3, 3), _ip("ceil")),
    ("trunc", *_m("trunc"), (-3, 3), _ip("trunc")),
    ("frac", *_m("frac"), (-3, 3), _ip("frac")),
    ("round", *_m("round"), (-3, 3), _ip("round")),
    ("round_dec", *_m("round", decimals=1), (-3, 3), _ip("round", decimals=1)),
    ("positive", *_m("positive"), None, None),
    ("nan_to_num", *_m("nan_to_num"), None, _ip("nan_to_num")),
    ("nan_to_num_kw", *_m("nan_to_num", nan=1.0, posinf=2.0, neginf=-3.0), None,
     _ip("nan_to_num", nan=1.0, posinf=2.0, neginf=-3.0)),
    ("relu", *_m("relu"), None, _ip("relu")),
    ("gelu", *_f("gelu"), None, _ip("gelu", lambda a: (a * 1).copy_(F.gelu(a)))),
    ("gelu_tanh", *_f("gelu", approximate="tanh"), None,
     _ip("gelu", lambda a: (a * 1).copy_(F.gelu(a, approximate="tanh")), approximate="tanh")),
    ("silu", *_f("silu"), None, _ip("silu", lambda a: F.silu(a * 1, inplace=True))),
    ("softplus", *_f("softplus"), None, None),
    ("softplus_bt", *_f("softplus", beta=2, threshold=1.0), None, None),
    ("leaky_relu", *_f("leaky_relu"), None, _ip("leaky_relu", lambda a: F.leaky_relu_(a * 1))),
    ("leaky_relu_s", *_f("leaky_relu", negative_slope=0.2), None,
     _ip("leaky_relu", lambda a: F.leaky_relu_(a * 1, 0.2), negative_slope=0.2)),
    ("elu", *_f("elu"), None, _ip("elu", lambda a: F.elu_(a * 1))),
    ("elu_a", *_f("elu", alpha=0.5), None, _ip("elu", lambda a: F.elu_(a * 1, 0.5), alpha=0.5)),
    ("hardtanh", *_f("hardtanh"), (-2, 2), _ip("hardtanh", lambda a: F.hardtanh_(a * 1))),
    ("hardtanh_b", *_f("hardtanh", min_val=-0.5, max_val=0.25), (-1, 1),
     _ip("hardtanh", lambda a: F.hardtanh_(a * 1, -0.5, 0.25), min_val=-0.5, max_val=0.25)),
    ("relu6", *_f("relu6"), (-2, 8), _ip("relu6", lambda a: F.relu6(a * 1, inplace=True))),
    ("logit", *_m("logit"), (0.1, 0.9), _ip("logit")),
    ("logit_eps", *_m("logit", eps=0.2), (0.05, 0.95), _ip("logit", eps=0.2)),
]
UNARY_IDS = [u[0] for u in UNARY]


def _opname(uid):
    return {"round_dec": "round", "nan_to_num_kw": "nan_to_num", "gelu_tanh": "gelu", "softplus_bt": "softplus",
            "leaky_relu_s": "leaky_relu", "elu_a": "elu", "hardtanh_b": "hardtanh", "logit_eps": "logit"}.get(uid, uid)


@pytest.mark.parametrize("uid,f,tf,dom,ip", UNARY, ids=UNARY_IDS)
def test_unary(uid, f, tf, dom, ip):
    lo, hi = dom if dom else (None, None)
    # layouts: contiguous, transposed, strided slice; forward exact, grads vs torch
    for x in layouts((3, 4), low=lo, high=hi, seed=1):
        check_op(f, tf, x, gradcheck=False)
    # size 0, size 1, 0-d
    check_op(f, tf, torch.empty(0, 3))
    check_op(f, tf, rnd((1, 3), dom, seed=2), gradcheck=False)
    check_op(f, tf, rnd((), dom, seed=3), gradcheck=False)
    # gradcheck in float64 on a small input inside the differentiable domain
    check_op(f, tf, rnd((2, 3), dom, dtype=torch.float64, seed=4), gradcheck=True)
    # special values, forward exact including the sign of zero; float64 as well
    for s in (SPECIAL, SPECIAL.double()):
        out = check_op(f, tf, s, grad=False)
        same_signbit(out, tf(s))
    # integer and bool inputs: same result as torch, or an error naming the op where torch refuses
    name = _opname(uid)
    check_or_raises(name, f, tf, torch.tensor([[-3, 0, 2], [5, 1, -1]]))
    check_or_raises(name, f, tf, torch.tensor([3, 0, 7], dtype=torch.int32))
    check_or_raises(name, f, tf, torch.tensor([True, False]))


@pytest.mark.parametrize("uid,f,tf,dom,ip", [u for u in UNARY if u[4] is not None],
                         ids=[u[0] for u in UNARY if u[4] is not None])
def test_unary_inplace(uid, f, tf, dom, ip):
    tpi, tri = ip
    x = rnd((3, 4), dom, seed=5)
    # autograd through the in-place op on a non-leaf, and on a transposed input
    check_op(tpi, tri, x, gradcheck=False)
    check_op(tpi, tri, x.t(), gradcheck=False)
    # result and version bump on a plain tensor; `self` is returned
    a = to_tp(x)
    v = a._version
    name = _opname(uid) + "_"
    kwargs = {"round_dec": {"decimals": 1}, "nan_to_num_kw": {"nan": 1.0, "posinf": 2.0, "neginf": -3.0},
              "gelu_tanh": {"approximate": "tanh"}, "leaky_relu_s": {"negative_slope": 0.2},
              "elu_a": {"alpha": 0.5}, "hardtanh_b": {"min_val": -0.5, "max_val": 0.25},
              "logit_eps": {"eps": 0.2}}.get(uid, {})
    out = getattr(a, name)(**kwargs)
    assert out is a
    assert a._version > v
    assert torch.equal(a._data, tf(x)) or torch.allclose(a._data, tf(x), equal_nan=True, rtol=0, atol=0)
    # in-place on a leaf that requires grad is refused, naming the op
    leaf = to_tp(x, requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"tp\.{name}"):
        getattr(leaf, name)(**kwargs)


def test_inplace_dtype_errors():
    i = tp.tensor([1, 4, 9])
    for name in ("sqrt_", "log_", "exp_", "sigmoid_", "tanh_", "reciprocal_"):
        with pytest.raises(RuntimeError, match=rf"tp\.{name}"):
            getattr(i, name)()
    with pytest.raises(RuntimeError, match=r"tp\.div_"):
        i.div_(2)
    with pytest.raises(RuntimeError, match=r"tp\.pow_"):
        i.pow_(0.5)
    assert torch.equal(i._data, torch.tensor([1, 4, 9]))


def test_activation_names():
    x = tp.randn(4)
    for name in ("relu", "gelu", "silu", "softplus", "leaky_relu", "elu", "hardtanh", "relu6", "sigmoid", "tanh"):
        assert torch.equal(getattr(tp, name)(x)._data, getattr(x, name)()._data)
    with pytest.raises(RuntimeError, match=r"tp\.gelu"):
        tp.gelu(x, approximate="cubic")


# ---------------------------------------------------------------------------------------------------
# binary ops: (id, tp fn, torch fn, domain of self, domain of other, differentiable)
# ---------------------------------------------------------------------------------------------------
def _tt(v, like):
    """torch's view of a Python number operand where torch has no number overload."""
    return torch.tensor(v) if not isinstance(v, torch.Tensor) else v


NZ = (0.5, 2.0)
BINARY = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, None, None, True),
    ("add_alpha", lambda a, b: tp.add(a, b, alpha=2), lambda a, b: torch.add(a, b, alpha=2), None, None, True),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, None, None, True),
    ("rsub", lambda a, b: tp.rsub(a, b, alpha=3), lambda a, b: torch.rsub(a, b, alpha=3), None, None, True),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, None, None, True),
    ("div", lambda a, b: a / b, lambda a, b: a / b, None, NZ, True),
    ("div_floor", lambda a, b: tp.div(a, b, rounding_mode="floor"),
     lambda a, b: torch.div(a, b, rounding_mode="floor"), (-3, 3), NZ, True),
    ("floor_divide", lambda a, b: a // b, lambda a, b: a // b, (-3, 3), NZ, False),
    ("remainder", lambda a, b: a % b, lambda a, b: a % b, (-3, 3), NZ, True),
    ("fmod", lambda a, b: tp.fmod(a, b), lambda a, b: torch.fmod(_tt(a, b), b), (-3, 3), NZ, True),
    ("pow", lambda a, b: a ** b, lambda a, b: a ** b, POS, None, True),
    ("float_power", lambda a, b: tp.float_power(a, b), lambda a, b: torch.float_power(a, b), POS, None, True),
    ("atan2", lambda a, b: tp.atan2(a, b), lambda a, b: torch.atan2(a, b), None, None, True),
    ("hypot", lambda a, b: tp.hypot(a, b), lambda a, b: torch.hypot(a, b), None, None, True),
    ("maximum", tp.maximum, torch.maximum, None, None, True),
    ("minimum", tp.minimum, torch.minimum, None, None, True),
    ("fmax", tp.fmax, torch.fmax, None, None, True),
    ("fmin", tp.fmin, torch.fmin, None, None, True),
]
BIN_IDS = [b[0] for b in BINARY]
BIN_NAME = {"add_alpha": "add", "div_floor": "div"}
NO_TORCH_GRAD_NUMBER_LEFT = {"remainder"}   # torch: "derivative for aten::remainder is not implemented"


@pytest.mark.parametrize("bid,f,tf,da,db,diff", BINARY, ids=BIN_IDS)
def test_binary(bid, f, tf, da, db, diff):
    name = BIN_NAME.get(bid, bid)
    kw = {} if diff else {"grad": False}
    b_l = rnd((4,), db, seed=7)
    if db == NZ:   # divisors of both signs, away from zero
        b_l = b_l * torch.tensor([1.0, -1.0, 1.0, -1.0])
    # layouts x broadcasting (row vector, column vector)
    for a in layouts((3, 4), low=da and da[0], high=da and da[1], seed=6):
        check_op(f, tf, a, b_l, gradcheck=False, **kw)
        check_op(f, tf, a, b_l[:3].reshape(3, 1).contiguous(), gradcheck=False, **kw)
    a = rnd((2, 1, 3), da, seed=8)
    check_op(f, tf, a, rnd((4, 1), db, seed=9).abs() + 0.5 if db else rnd((4, 1), db, seed=9), gradcheck=False, **kw)
    # 0-d with n-d, size 0, size 1
    check_op(f, tf, rnd((), da, seed=10), b_l, gradcheck=False, **kw)
    check_op(f, tf, rnd((3, 4), da, seed=11), rnd((), db, seed=12).abs() + 0.5, gradcheck=False, **kw)
    check_op(f, tf, torch.empty(0, 4), b_l, **kw)
    check_op(f, tf, rnd((1, 4), da, seed=13), b_l, gradcheck=False, **kw)
    # Python numbers on either side (where torch accepts them; else tp must raise naming the op)
    check_or_raises(name, f, tf, rnd((3, 4), da, seed=14), 1.5, gradcheck=False, **kw)
    check_or_raises(name, f, tf, rnd((3, 4), da, seed=14), 2, gradcheck=False, **kw)
    lkw = {"grad": False} if bid in NO_TORCH_GRAD_NUMBER_LEFT else kw
    check_or_raises(name, f, tf, 1.5, rnd((3, 4), db, seed=15).abs() + 0.5, gradcheck=False, **lkw)
    check_or_raises(name, f, tf, 3, rnd((3, 4), db, seed=15).abs() + 0.5, gradcheck=False, **lkw)
    if bid in NO_TORCH_GRAD_NUMBER_LEFT:   # torch has no derivative here: finite differences only
        assert tp.autograd.gradcheck(lambda b: f(1.5, b), (to_tp(rnd((2, 3), NZ, torch.float64), True),))
    # gradcheck in float64, both operands differentiable, with broadcasting
    if diff:
        ga = rnd((2, 3), da, dtype=torch.float64, seed=16)
        gb = rnd((3,), db, dtype=torch.float64, seed=17)
        check_op(f, tf, ga, gb, gradcheck=True)
    # integer and bool dtypes
    ia = torch.tensor([[7, -3, 0, 5], [2, 9, -8, 1]])
    ib = torch.tensor([2, -3, 4, 1], dtype=torch.int32)
    check_or_raises(name, f, tf, ia, ib)
    check_or_raises(name, f, tf, ia, 3)
    check_or_raises(name, f, tf, ia, rnd((4,), db, seed=18), gradcheck=False, **kw)
    check_or_raises(name, f, tf, torch.tensor([True, False, True]), torch.tensor([True, True, False]))
    # special values: all pairs of ±0, ±inf, NaN, finite
    sa, sb = SPECIAL.reshape(-1, 1), SPECIAL.reshape(1, -1)
    out = check_op(f, tf, sa, sb, grad=False)
    same_signbit(out, tf(sa, sb))
    # bad input: shapes that do not broadcast
    with pytest.raises(RuntimeError, match=rf"tp\.{name}\(self: float32\[3, 4\], \w+: float32\[5\]"):
        f(tp.randn(3, 4), tp.randn(5))


def test_integer_division_by_zero():
    for f in (lambda a, b: a // b, lambda a, b: a % b, tp.fmod):
        with pytest.raises(RuntimeError, match=r"tp\.(floor_divide|remainder|fmod).*ZeroDivision"):
            f(tp.tensor([1, 2]), tp.tensor([1, 0]))
    with pytest.raises(RuntimeError, match=r"tp\.pow.*negative"):
        tp.tensor([2, 3]) ** -1


def test_floor_divide_zero_grad():
    a = tp.randn(3, requires_grad=True)
    b = tp.randn(3).abs() + 1
    y = a // b
    assert y.requires_grad
    y.sum().backward()
    assert torch.equal(a.grad._data, torch.zeros(3))


BIN_INPLACE = [
    ("add_", lambda a, b: a.add_(b), {}), ("sub_", lambda a, b: a.sub_(b, alpha=2), {}),
    ("mul_", lambda a, b: a.mul_(b), {}), ("div_", lambda a, b: a.div_(b), {}),
    ("pow_", lambda a, b: a.pow_(b), {"pos": True}), ("remainder_", lambda a, b: a.remainder_(b), {}),
    ("fmod_", lambda a, b: a.fmod_(b), {}), ("atan2_", lambda a, b: a.atan2_(b), {"nonum": True}),
    ("hypot_", lambda a, b: a.hypot_(b), {"nonum": True}),
    ("floor_divide_", lambda a, b: a.floor_divide_(b), {"nograd": True}),
    ("iadd", lambda a, b: a.__iadd__(b), {}), ("isub", lambda a, b: a.__isub__(b), {}),
    ("imul", lambda a, b: a.__imul__(b), {}), ("itruediv", lambda a, b: a.__itruediv__(b), {}),
    ("ipow", lambda a, b: a.__ipow__(b), {"pos": True}), ("imod", lambda a, b: a.__imod__(b), {}),
    ("ifloordiv", lambda a, b: a.__ifloordiv__(b), {"nograd": True}),
]


@pytest.mark.parametrize("iid,f,opt", BIN_INPLACE, ids=[b[0] for b in BIN_INPLACE])
def test_binary_inplace(iid, f, opt):
    x = rnd((3, 4), POS if opt.get("pos") else None, seed=20)
    y = rnd((4,), NZ, seed=21) * torch.tensor([1.0, -1.0, 1.0, 1.0])
    kw = {"grad": False} if opt.get("nograd") else {}
    check_op(lambda a, b: f(a * 1, b), lambda a, b: f(a * 1, b), x, y, gradcheck=False, **kw)
    if opt.get("nonum"):   # torch takes only tensors here
        with pytest.raises(TypeError, match=rf"tp\.{iid}"):
            f(to_tp(x), 1.5)
    else:
        check_op(lambda a: f(a * 1, 1.5), lambda a: f(a * 1, 1.5), x, gradcheck=False, **kw)
    a = to_tp(x)
    v = a._version
    r = f(a, to_tp(y))
    assert r is a and a._version > v
    assert torch.equal(a._data, f(x.clone(), y))
    # in-place cannot change the shape of self
    with pytest.raises(RuntimeError, match=r"tp\.\w+_"):
        f(tp.randn(4), tp.randn(3, 4))


def test_pow_edge_gradients():
    # zero base with zero / positive / negative exponent, negative base with fractional exponent
    x = torch.tensor([0.0, 0.0, 0.0, 2.0, -1.0, -2.0, 3.0])
    e = torch.tensor([0.0, 2.0, -1.0, 0.0, 0.5, 2.0, 1.5])
    check_op(lambda a, b: a ** b, lambda a, b: a ** b, x, e, gradcheck=False)
    check_op(lambda a: a ** 0, lambda a: a ** 0, x, gradcheck=False)
    check_op(lambda a: a ** 2, lambda a: a ** 2, x, gradcheck=False)
    check_op(lambda a: a ** 0.5, lambda a: a ** 0.5, x, gradcheck=False)
    for base in (0.0, 2.0, -2.0, 0, 3):
        check_op(lambda b: base ** b, lambda b: base ** b, e, gradcheck=False)
    # higher order: d2/dx2 x^3 = 6x, d2/de2 2^e = 2^e ln2^2
    a = tp.tensor([1.5, -2.0], dtype=tp.float64, requires_grad=True)
    (g,) = tp.autograd.grad((a ** 3).sum(), [a], create_graph=True)
    (h,) = tp.autograd.grad(g.sum(), [a])
    assert torch.allclose(h._data, 6 * a._data)
    ex = tp.tensor([0.3, 1.0], dtype=tp.float64, requires_grad=True)
    (g,) = tp.autograd.grad((2 ** ex).sum(), [ex], create_graph=True)
    (h,) = tp.autograd.grad(g.sum(), [ex])
    assert torch.allclose(h._data, 2 ** ex._data * math.log(2) ** 2)


def test_min_max_ties_and_nan():
    a = torch.tensor([1.0, 2.0, 3.0, math.nan, 0.0, 5.0])
    b = torch.tensor([1.0, 0.0, 3.0, 1.0, math.nan, 5.0])
    for f, tf in ((tp.maximum, torch.maximum), (tp.minimum, torch.minimum), (tp.fmax, torch.fmax),
                  (tp.fmin, torch.fmin)):
        check_op(f, tf, a, b, gradcheck=False)
    x = tp.tensor([1.0, 2.0], requires_grad=True)
    y = tp.tensor([1.0, 1.0], requires_grad=True)
    tp.maximum(x, y).sum().backward()
    assert x.grad.tolist() == [0.5, 1.0] and y.grad.tolist() == [0.5, 0.0]


# ---------------------------------------------------------------------------------------------------
# clamp, where, lerp, addcmul/addcdiv
# ---------------------------------------------------------------------------------------------------
CLAMP_BOUNDS = [(-0.5, 0.5), (-0.5, None), (None, 0.5), (0.5, -0.5), (0, 1)]


@pytest.mark.parametrize("lo,hi", CLAMP_BOUNDS)
def test_clamp_scalar_bounds(lo, hi):
    for x in layouts((3, 4), seed=30):
        check_op(lambda a: tp.clamp(a, lo, hi), lambda a: torch.clamp(a, lo, hi), x, gradcheck=False)
        check_op(lambda a: a.clip(lo, hi), lambda a: a.clip(lo, hi), x, gradcheck=False)
        check_op(lambda a: (a * 1).clamp_(lo, hi), lambda a: (a * 1).clamp_(lo, hi), x, gradcheck=False)
    check_op(lambda a: a.clamp(min=lo, max=hi), lambda a: a.clamp(min=lo, max=hi), rnd((2, 3), dtype=torch.float64),
             gradcheck=True)
    check_op(lambda a: a.clamp(lo, hi), lambda a: a.clamp(lo, hi), SPECIAL, grad=False)
    check_op(lambda a: a.clamp(lo, hi), lambda a: a.clamp(lo, hi), torch.tensor([-3, 0, 2, 7]))
    check_op(lambda a: a.clamp(lo, hi), lambda a: a.clamp(lo, hi), torch.empty(0))
    check_op(lambda a: a.clamp(lo, hi), lambda a: a.clamp(lo, hi), torch.tensor(0.25))


def test_clamp_tensor_bounds():
    x = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 3.0])
    lo = torch.tensor([1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 3.0, 3.0])     # ties at the bounds, min > max
    hi = torch.tensor([2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0])
    check_op(lambda a, b, c: tp.clamp(a, b, c), lambda a, b, c: torch.clamp(a, b, c), x, lo, hi, gradcheck=False)
    check_op(lambda a, b: tp.clamp(a, min=b), lambda a, b: torch.clamp(a, min=b), x, lo, gradcheck=False)
    check_op(lambda a, c: tp.clamp(a, max=c), lambda a, c: torch.clamp(a, max=c), x, hi, gradcheck=False)
    check_op(lambda a, b: tp.clamp_min(a, b), lambda a, b: torch.clamp_min(a, b), x, lo, gradcheck=False)
    check_op(lambda a, c: tp.clamp_max(a, c), lambda a, c: torch.clamp_max(a, c), x, hi, gradcheck=False)
    check_op(lambda a: tp.clamp_min(a, 2.0), lambda a: torch.clamp_min(a, 2.0), x, gradcheck=False)
    check_op(lambda a: (a * 1).clamp_max_(2.0), lambda a: (a * 1).clamp_max_(2.0), x, gradcheck=False)
    check_op(lambda a: (a * 1).clamp_min_(2.0), lambda a: (a * 1).clamp_min_(2.0), x, gradcheck=False)
    # broadcast tensor bounds; mixed tensor / number bounds; gradcheck on all three
    a = rnd((3, 4), seed=31)
    check_op(lambda a, b: tp.clamp(a, b, 0.8), lambda a, b: torch.clamp(a, b, torch.tensor(0.8)),
             a, rnd((4,), seed=32) - 0.5,
             gradcheck=False)
    g = [rnd(s, dtype=torch.float64, seed=33 + i) for i, s in enumerate([(2, 3), (3,), (2, 1)])]
    g[2] = g[2] + 2.5
    check_op(lambda a, b, c: tp.clamp(a, b, c), lambda a, b, c: torch.clamp(a, b, c), *g, gradcheck=True)
    with pytest.raises(RuntimeError, match=r"tp\.clamp"):
        tp.clamp(tp.randn(3))
    with pytest.raises(RuntimeError, match=r"tp\.clamp"):
        tp.clamp(tp.randn(3), tp.randn(4))


def test_where():
    c = torch.tensor([[True, False, True, False]])
    for x in layouts((3, 4), seed=40):
        y = rnd((3, 1), seed=41)
        check_op(lambda a, b: tp.where(tp.from_torch(c), a, b), lambda a, b: torch.where(c, a, b), x, y,
                 gradcheck=False)
        check_op(lambda a: tp.where(tp.from_torch(c), a, 0.0), lambda a: torch.where(c, a, 0.0), x, gradcheck=False)
        check_op(lambda a: tp.where(a > 0, 1.5, a), lambda a: torch.where(a > 0, 1.5, a), x, gradcheck=False)
        check_op(lambda a, b: a.where(a > 0, b), lambda a, b: a.where(a > 0, b), x, y, gradcheck=False)
    check_op(lambda: tp.where(tp.from_torch(c), 1.0, 0.0), lambda: torch.where(c, 1.0, 0.0))
    check_op(lambda a, b: tp.where(a > b, a, b), lambda a, b: torch.where(a > b, a, b),
             rnd((2, 3), dtype=torch.float64), rnd((3,), dtype=torch.float64, seed=1), gradcheck=True)
    check_op(lambda a, b: tp.where(a > 0, a, b), lambda a, b: torch.where(a > 0, a, b),
             torch.tensor([1, -2, 3]), torch.tensor([0, 0, 0]))
    check_op(lambda a: tp.where(a > 0, a, 0), lambda a: torch.where(a > 0, a, 0), torch.empty(0, 2))
    with pytest.raises(RuntimeError, match=r"tp\.where"):
        tp.where(tp.tensor([1.0, 0.0]), tp.randn(2), tp.randn(2))
    with pytest.raises(RuntimeError, match=r"tp\.where"):
        tp.where(tp.tensor([True, False]), tp.randn(3), tp.randn(2))


def test_lerp_addcmul_addcdiv():
    for x in layouts((3, 4), seed=50):
        e, w = rnd((4,), seed=51), rnd((3, 1), seed=52)
        check_op(lambda a, b, c: tp.lerp(a, b, c), lambda a, b, c: torch.lerp(a, b, c), x, e, w, gradcheck=False)
        check_op(lambda a, b: a.lerp(b, 0.3), lambda a, b: a.lerp(b, 0.3), x, e, gradcheck=False)
        check_op(lambda a, b, c: tp.addcmul(a, b, c, value=0.5), lambda a, b, c: torch.addcmul(a, b, c, value=0.5),
                 x, e, w, gradcheck=False)
        check_op(lambda a, b, c: tp.addcdiv(a, b, c, value=-2), lambda a, b, c: torch.addcdiv(a, b, c, value=-2),
                 x, e, w.abs() + 0.5, gradcheck=False)
        for name in ("lerp_", "addcmul_", "addcdiv_"):
            f = (lambda n: lambda a, b, c: getattr(a * 1, n)(b, c.abs() + 0.5))(name)
            check_op(f, f, x, e, w, gradcheck=False)
    g = [rnd(s, dtype=torch.float64, seed=53 + i) for i, s in enumerate([(2, 3), (3,), (2, 1)])]
    check_op(lambda a, b, c: tp.lerp(a, b, c), lambda a, b, c: torch.lerp(a, b, c), *g, gradcheck=True)
    check_op(lambda a, b, c: tp.addcmul(a, b, c, value=3), lambda a, b, c: torch.addcmul(a, b, c, value=3), *g,
             gradcheck=True)
    g[2] = g[2].abs() + 0.5
    check_op(lambda a, b, c: tp.addcdiv(a, b, c, value=3), lambda a, b, c: torch.addcdiv(a, b, c, value=3), *g,
             gradcheck=True)
    ints = [torch.tensor([1, 2, 3]), torch.tensor([2, 2, 2]), torch.tensor([3, 1, 2])]
    check_op(lambda a, b, c: tp.addcmul(a, b, c, value=2), lambda a, b, c: torch.addcmul(a, b, c, value=2), *ints)
    with pytest.raises(RuntimeError, match=r"tp\.addcdiv"):
        tp.addcdiv(*[to_tp(t) for t in ints])
    with pytest.raises(RuntimeError, match=r"tp\.lerp"):
        tp.lerp(tp.randn(3), tp.randn(4), 0.5)


def test_nan_to_num_gradient_mask():
    x = SPECIAL.clone()
    check_op(lambda a: tp.nan_to_num(a, nan=0.5), lambda a: torch.nan_to_num(a, nan=0.5), x)


# ---------------------------------------------------------------------------------------------------
# higher order and forward mode on the formulas with the most structure
# ---------------------------------------------------------------------------------------------------
GG = [
    ("pow", lambda a, b: a ** b, POS), ("gelu", lambda a, b: tp.gelu(a) * b, None),
    ("gelu_tanh", lambda a, b: tp.gelu(a, approximate="tanh") * b, None), ("silu", lambda a, b: tp.silu(a) + b, None),
    ("softplus", lambda a, b: tp.softplus(a * b, beta=2), None), ("tanh", lambda a, b: (a * b).tanh(), None),
    ("sigmoid", lambda a, b: (a + b).sigmoid(), None), ("erf", lambda a, b: tp.erf(a) * b.erfc(), None),
    ("maximum", lambda a, b: tp.maximum(a * a, b), None), ("clamp", lambda a, b: tp.clamp(a * a, b, 1.0), None),
    ("where", lambda a, b: tp.where(a > 0, a * a, b * a), None), ("lerp", lambda a, b: tp.lerp(a, b, a * b), None),
    ("addcdiv", lambda a, b: tp.addcdiv(a, a, b * b + 1), None), ("log", lambda a, b: (a * b).log(), POS),
    ("sqrt", lambda a, b: (a + b).sqrt() * a.rsqrt(), POS), ("elu", lambda a, b: tp.elu(a) * b, None),
    ("remainder", lambda a, b: (a * b) % 0.7, None), ("atan2", lambda a, b: tp.atan2(a, b), None),
]


@pytest.mark.parametrize("gid,f,dom", GG, ids=[g[0] for g in GG])
def test_gradgrad_and_forward_ad(gid, f, dom):
    a = to_tp(rnd((3,), dom, dtype=torch.float64, seed=60), requires_grad=True)
    b = to_tp(rnd((3,), dom, dtype=torch.float64, seed=61), requires_grad=True)
    assert tp.autograd.gradgradcheck(f, (a, b))
    assert tp.autograd.gradcheck(f, (a, b), check_forward_ad=True)


# ---------------------------------------------------------------------------------------------------
# comparisons and predicates
# ---------------------------------------------------------------------------------------------------
CMPS = [("eq", "__eq__"), ("ne", "__ne__"), ("lt", "__lt__"), ("le", "__le__"), ("gt", "__gt__"), ("ge", "__ge__")]


@pytest.mark.parametrize("name,dunder", CMPS)
def test_comparisons(name, dunder):
    f, tf = getattr(tp, name), getattr(torch, name)
    op = lambda a, b: getattr(a, dunder)(b)  # noqa: E731
    ints = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1], [0, 2, 2, 5]])
    for x in layouts((3, 4), seed=70):
        y = x.clone().contiguous()
        y[0] = 0.5
        check_op(f, tf, x, y, grad=False)                           # ties included
        check_op(op, op, x, y[1], grad=False)           # broadcasting
        check_op(op, op, x, 0.25, grad=False)
        check_op(lambda a: getattr(a, name)(1), lambda a: getattr(a, name)(1), x, grad=False)
    # number on the left: Python reflects 2 < x to x > 2
    xs = rnd((3, 4), seed=71)
    check_op(lambda a: eval(f"0.1 {_SYM[name]} a"), lambda a: eval(f"0.1 {_SYM[name]} a"), xs, grad=False)
    check_op(lambda a: f(0.1, a), lambda a: tf(torch.tensor(0.1), a), xs, grad=False)
    # ints, bool, mixed int/float, 0-d, size 0, special values (NaN compares unequal)
    check_op(f, tf, ints, ints.t()[:3, :3].reshape(3, 3).repeat(1, 2)[:, :4], grad=False)
    check_op(f, tf, ints, 2, grad=False)
    check_op(f, tf, ints, rnd((4,), seed=72), grad=False)
    check_op(f, tf, torch.tensor([True, False, True]), torch.tensor([True, True, False]), grad=False)
    check_op(f, tf, torch.tensor(1.5), xs, grad=False)
    check_op(f, tf, torch.empty(0, 4), xs[0], grad=False)
    check_op(f, tf, SPECIAL.reshape(-1, 1), SPECIAL.reshape(1, -1), grad=False)
    # results are bool and never require grad
    a = tp.randn(3, requires_grad=True)
    r = getattr(a, dunder)(tp.randn(3))
    assert r.dtype == torch.bool and not r.requires_grad and r.grad_fn is None
    with pytest.raises(RuntimeError, match=rf"tp\.{name}\(self: float32\[3\], other: float32\[4\]\)"):
        f(tp.randn(3), tp.randn(4))


_SYM = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def test_eq_with_non_tensors():
    x = tp.randn(3)
    assert (x == None) is False  # noqa: E711
    assert (x != None) is True  # noqa: E711
    assert (x == "a") is False
    assert x in {x: 1} and hash(x) == id(x)
    assert bool((x == x).all())


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite", "isposinf", "isneginf"])
def test_predicates(name):
    f, tf = getattr(tp, name), getattr(torch, name)
    check_op(f, tf, SPECIAL)
    check_op(f, tf, SPECIAL.double().reshape(3, 4).t())
    check_op(f, tf, torch.tensor([1, -2, 3]))
    check_op(f, tf, torch.tensor(math.nan))
    check_op(f, tf, torch.empty(0))
    a = tp.from_torch(SPECIAL.clone()).requires_grad_()
    assert not getattr(a, name)().requires_grad
    check_op(lambda a, b: tp.isclose(a, b, rtol=0.1, equal_nan=True),
             lambda a, b: torch.isclose(a, b, rtol=0.1, equal_nan=True), SPECIAL, SPECIAL * 1.05)


# ---------------------------------------------------------------------------------------------------
# logic and bitwise
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical(name):
    f, tf = getattr(tp, name), getattr(torch, name)
    bools = torch.tensor([[True, False, True], [False, False, True]])
    for a, b in ((bools, bools[0]), (SPECIAL[:6], SPECIAL[6:]), (torch.tensor([0, 3, -1]), torch.tensor([2, 0, 0])),
                 (bools.t(), torch.tensor([0.0, 1.0])), (torch.empty(0, 3, dtype=torch.bool), bools[1])):
        check_op(f, tf, a, b)
    # Python numbers (torch has no number overload: compare with a 0-d tensor)
    check_op(lambda a: f(a, 1), lambda a: tf(a, torch.tensor(1)), bools)
    check_op(lambda a: f(0.0, a), lambda a: tf(torch.tensor(0.0), a), bools)
    x = to_tp(bools.clone())
    v = x._version
    getattr(x, name + "_")(to_tp(bools[0]))
    assert x._version > v and torch.equal(x._data, getattr(bools.clone(), name + "_")(bools[0]))
    assert not f(tp.randn(3, requires_grad=True), tp.randn(3)).requires_grad
    check_op(tp.logical_not, torch.logical_not, SPECIAL)
    check_op(tp.logical_not, torch.logical_not, torch.tensor([0, 2, -1]))


BITWISE = [("bitwise_and", "&"), ("bitwise_or", "|"), ("bitwise_xor", "^"),
           ("bitwise_left_shift", "<<"), ("bitwise_right_shift", ">>")]


@pytest.mark.parametrize("name,sym", BITWISE)
def test_bitwise(name, sym):
    f, tf = getattr(tp, name), getattr(torch, name)
    op = eval(f"lambda a, b: a {sym} b")
    ia = torch.tensor([[5, 12, -7, 0], [1, 255, 3, 64]])
    ib = torch.tensor([1, 3, 2, 0], dtype=torch.int32)
    for a in (ia, ia.t().contiguous().t(), ia[:, ::2]):
        check_op(op, op, a, ib[: a.shape[1]])
        check_op(f, tf, a, ib[: a.shape[1]])
    check_op(lambda a: op(a, 2), lambda a: op(a, 2), ia)
    check_op(lambda a: op(3, a), lambda a: op(3, a), ib.abs())
    check_op(op, op, torch.tensor(6), ib)
    check_op(op, op, torch.empty(0, 4, dtype=torch.int64), ib)
    check_op(op, op, torch.tensor([7, 1], dtype=torch.uint8), torch.tensor([2, 1], dtype=torch.uint8))
    bools = (torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False]))
    check_or_raises(name, op, op, *bools)
    if "shift" not in name:
        check_op(lambda a: op(True, a), lambda a: op(True, a), bools[0])
    # in-place (method and operator), with version bump
    x = to_tp(ia.clone())
    v = x._version
    getattr(x, name + "_")(to_tp(ib))
    assert x._version > v and torch.equal(x._data, getattr(ia.clone(), name + "_")(ib))
    y = to_tp(ia.clone())
    y0 = y
    y = eval(f"lambda a, b: a.__i{op_dunder(sym)}__(b)")(y, 2)
    assert y is y0 and torch.equal(y._data, op(ia, 2))
    # floats give a clear error, naming the op
    with pytest.raises(TypeError, match=rf"tp\.{name}\(.*only defined for integer and bool operands, got float32"):
        op(tp.randn(3), tp.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=rf"tp\.{name}.*got float"):
        op(tp.tensor([1, 2, 3]), 1.5)
    with pytest.raises(TypeError, match=rf"tp\.{name}_"):
        getattr(tp.randn(3), name + "_")(tp.tensor([1, 2, 3]))


def op_dunder(sym):
    return {"&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift"}[sym]


def test_bitwise_not():
    for a in (torch.tensor([[0, 5, -3], [7, 1, 2]]), torch.tensor([True, False]), torch.tensor([7], dtype=torch.uint8)):
        check_op(lambda x: ~x, lambda x: ~x, a)
        check_op(tp.bitwise_not, torch.bitwise_not, a)
    x = tp.tensor([1, 2])
    v = x._version
    x.bitwise_not_()
    assert x._version > v and x.tolist() == [-2, -3]
    with pytest.raises(TypeError, match=r"tp\.bitwise_not\(self: float32\[3\]\)"):
        ~tp.randn(3)
    b = tp.tensor([True, False])
    assert (b & ~b).tolist() == [False, False] and (b | ~b).tolist() == [True, True]


# ---------------------------------------------------------------------------------------------------
# op-table metadata
# ---------------------------------------------------------------------------------------------------
def test_table_entries():
    from tensorplay.ops import OPS
    for name in ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite"):
        assert {"pointwise", "comparison"} <= OPS[name].tags and not OPS[name].differentiable
    for name in ("pow", "clamp", "relu", "gelu", "where", "maximum", "lerp", "addcdiv", "log", "floor"):
        op = OPS[name]
        assert "pointwise" in op.tags and op.differentiable and op.save is not None
    for name in ("clamp_", "pow_", "exp_", "log_", "sqrt_", "relu_", "sigmoid_", "tanh_", "abs_", "neg_", "floor_"):
        assert OPS[name].is_inplace and "inplace" in OPS[name].tags
    # saved tensors are version-checked: modifying a saved input in place raises, naming the op
    a = tp.randn(3, requires_grad=True)
    b = a * 1
    y = b.sin()
    b.add_(1)
    with pytest.raises(RuntimeError, match=r"tp\.sin backward"):
        y.sum().backward()


def test_unary_operators_and_method_forms():
    x = torch.tensor([[-1.5, 0.0, 2.0], [3.0, -0.0, -4.0]])
    for f in (lambda a: +a, lambda a: -a, abs, lambda a: a.abs().sqrt(), lambda a: a.square(), lambda a: a.relu()):
        check_op(f, f, x, gradcheck=False)
    a = to_tp(x)
    a **= 2
    assert torch.equal(a._data, x ** 2)
    a //= 3
    assert torch.equal(a._data, (x ** 2) // 3)
    a %= 2
    assert torch.equal(a._data, ((x ** 2) // 3) % 2)
