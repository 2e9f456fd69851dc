"""tp.nn.functional activations and their modules against torch.nn.functional: forward bit for bit,
meta, gradients vs torch.autograd, gradcheck in float64, non-contiguous and size-0 inputs, bad
arguments; the pointwise entries' decompositions against the eager kernel; a compiled use."""
import pytest
import torch
import torch.nn.functional as TF

import tensorplay as tp
import tensorplay.nn.functional as F
from harness import check_op, layouts, to_tp
from tensorplay.ops.registry import OPS
from tensorplay.testing import assert_close

UNARY = [
    ("selu", lambda x: F.selu(x), lambda x: TF.selu(x)),
    ("celu", lambda x: F.celu(x, 0.7), lambda x: TF.celu(x, 0.7)),
    ("threshold", lambda x: F.threshold(x, 0.1, -2.0), lambda x: TF.threshold(x, 0.1, -2.0)),
    ("hardshrink", lambda x: F.hardshrink(x, 0.4), lambda x: TF.hardshrink(x, 0.4)),
    ("softshrink", lambda x: F.softshrink(x, 0.4), lambda x: TF.softshrink(x, 0.4)),
    ("glu", lambda x: F.glu(x, 0), lambda x: TF.glu(x, 0)),
    ("glu_last", lambda x: F.glu(x), lambda x: TF.glu(x)),
    ("rrelu_eval", lambda x: F.rrelu(x, 0.1, 0.3), lambda x: TF.rrelu(x, 0.1, 0.3)),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid),
    ("softsign", F.softsign, TF.softsign),
    ("tanhshrink", F.tanhshrink, TF.tanhshrink),
    ("mish", F.mish, TF.mish),
    ("hardswish", F.hardswish, TF.hardswish),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid),
]
COMPOSITE = {"logsigmoid", "softsign", "tanhshrink", "mish", "hardswish", "hardsigmoid"}


@pytest.mark.parametrize("name,f,tf", UNARY, ids=[u[0] for u in UNARY])
def test_unary_layouts(name, f, tf):
    for x in layouts((4, 6), torch.float32, seed=1):
        check_op(f, tf, x, exact=name not in COMPOSITE, gradcheck=False)
    check_op(f, tf, torch.randn(4, 2, dtype=torch.float64), exact=name not in COMPOSITE, gradcheck=True)


@pytest.mark.parametrize("name,f,tf", UNARY[:6], ids=[u[0] for u in UNARY[:6]])
def test_unary_size0_and_kinks(name, f, tf):
    check_op(f, tf, torch.empty(0, 4), grad=False)
    x = torch.tensor([[-0.4, 0.4, 0.1, 0.0], [-1.0, 2.0, 0.3, -0.2]])    # the kinks of shrink / threshold
    check_op(f, tf, x, gradcheck=False)


@pytest.mark.parametrize("name", ["selu", "celu", "threshold", "hardshrink", "softshrink"])
def test_decomposition_matches_kernel(name):
    x = tp.from_torch(torch.randn(5, 7, dtype=torch.float64))
    op = OPS[name]
    extra = {"celu": (0.8,), "threshold": (0.2, 3.0), "hardshrink": (0.3,), "softshrink": (0.3,)}.get(name, ())
    assert "pointwise" in op.tags
    assert_close(op.decomp(x, *extra), op.fn(x, *extra), rtol=1e-12, atol=1e-12)


def test_inplace_variants():
    x = torch.randn(3, 5)
    for f, tf in [(lambda t: F.selu(t, inplace=True), lambda t: TF.selu(t, inplace=True)),
                  (lambda t: F.celu_(t, 0.5), lambda t: TF.celu_(t, 0.5)),
                  (lambda t: F.threshold_(t, 0.0, 1.5), lambda t: TF.threshold_(t, 0.0, 1.5))]:
        a = to_tp(x)
        f(a)
        b = x.clone()
        tf(b)
        assert_close(a, b)


def test_rrelu_training():
    tp.manual_seed(3)
    x = tp.from_torch(torch.randn(200, dtype=torch.float64)).requires_grad_()
    y = F.rrelu(x, 0.1, 0.3, training=True)
    y.sum().backward()
    xd, yd, gd = x.detach().torch(), y.detach().torch(), x.grad.torch()
    pos = xd > 0
    assert torch.equal(yd[pos], xd[pos]) and bool((gd[pos] == 1).all())
    slope = yd[~pos] / xd[~pos]
    assert bool((slope >= 0.1).all()) and bool((slope <= 0.3).all()) and slope.std() > 0.01
    torch.testing.assert_close(gd[~pos], slope)
    m = tp.nn.RReLU(0.1, 0.3).eval()
    torch.testing.assert_close(m(x.detach()).torch(), TF.rrelu(xd, 0.1, 0.3, training=False))


MODULES = [
    ("SELU", (), {}), ("CELU", (0.5,), {}), ("Threshold", (0.1, 20.0), {}), ("Hardshrink", (0.3,), {}),
    ("Softshrink", (0.3,), {}), ("GLU", (1,), {}), ("LogSigmoid", (), {}), ("Softmin", (1,), {}),
    ("Hardswish", (), {}), ("Hardsigmoid", (), {}), ("Softmax2d", (), {}), ("RReLU", (0.2, 0.25), {}),
]


@pytest.mark.parametrize("name,args,kw", MODULES, ids=[m[0] for m in MODULES])
def test_modules_match_torch(name, args, kw):
    x = torch.randn(2, 4, 3, 5)
    m, tm = getattr(tp.nn, name)(*args, **kw).eval(), getattr(torch.nn, name)(*args, **kw).eval()
    assert repr(m) == repr(tm)
    assert_close(m(to_tp(x)), tm(x), exact=False)
    assert m.state_dict().keys() == tm.state_dict().keys()


@pytest.mark.slow
def test_compiled_activations():
    def f(x):
        return F.selu(x) + F.softshrink(x, 0.2) * F.celu(x) + F.glu(x, -1).sum()
    x = torch.randn(6, 8)
    cf = tp.compile(f)
    cf(to_tp(x))
    got = cf(to_tp(x))
    ref = TF.selu(x) + TF.softshrink(x, 0.2) * TF.celu(x) + TF.glu(x, -1).sum()
    torch.testing.assert_close(got.torch(), ref, rtol=1e-5, atol=1e-5)


def test_bad_input():
    with pytest.raises(RuntimeError, match="tp.glu"):
        F.glu(tp.randn(3, 5), 1)
    with pytest.raises(IndexError, match="tp.glu"):
        F.glu(tp.randn(3, 4), 2)
    with pytest.raises(ValueError, match="tp.hardshrink"):
        F.hardshrink(tp.randn(3), -1.0)
    with pytest.raises(ValueError, match="tp.celu"):
        F.celu(tp.randn(3), 0.0)
    with pytest.raises(ValueError, match="tp.rrelu"):
        F.rrelu(tp.randn(3), 0.5, 0.1)
    with pytest.raises(TypeError, match="tp.glu"):
        F.glu(torch.randn(4))


# ---- interpolate -----------------------------------------------------------------------------------
INTERP = [
    ("nearest", (1, 2, 3, 4, 5), dict(scale_factor=1.6)),
    ("nearest-exact", (2, 3, 5), dict(size=8)),
    ("nearest-exact", (1, 2, 5, 4), dict(scale_factor=(0.6, 1.7))),
    ("nearest-exact", (1, 2, 3, 4, 2), dict(size=(2, 5, 3))),
    ("bicubic", (2, 2, 4, 5), dict(size=(7, 3))),
    ("bicubic", (2, 2, 4, 5), dict(scale_factor=1.5, align_corners=True)),
    ("trilinear", (1, 2, 3, 4, 2), dict(scale_factor=1.5)),
    ("trilinear", (1, 2, 3, 4, 2), dict(size=(2, 5, 3), align_corners=True)),
    ("area", (2, 3, 7), dict(size=3)),
    ("area", (2, 3, 7, 5), dict(scale_factor=0.5)),
    ("area", (1, 2, 4, 6, 5), dict(size=(2, 3, 2))),
    ("bilinear", (1, 2, 9, 8), dict(size=(4, 3), antialias=True)),
    ("bicubic", (1, 2, 9, 8), dict(scale_factor=0.4, antialias=True, align_corners=True)),
    ("bilinear", (2, 2, 5, 5), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ("trilinear", (1, 1, 3, 3, 3), dict(scale_factor=2.3, recompute_scale_factor=False)),
]


@pytest.mark.parametrize("mode,shape,kw", INTERP, ids=[f"{m}-{len(s)}d-{sorted(k)}" for m, s, k in INTERP])
def test_interpolate_modes(mode, shape, kw):
    x = torch.randn(shape)
    check_op(lambda a: F.interpolate(a, mode=mode, **kw), lambda a: TF.interpolate(a, mode=mode, **kw), x,
             gradcheck=False)
    small = torch.randn((1, 1) + tuple(min(s, 3) for s in shape[2:]), dtype=torch.float64)
    kw_small = dict(kw, size=tuple(2 for _ in shape[2:])) if "size" in kw else kw
    check_op(lambda a: F.interpolate(a, mode=mode, **kw_small), lambda a: TF.interpolate(a, mode=mode, **kw_small),
             small, gradcheck=True)


def test_interpolate_noncontiguous_and_double_backward():
    x = torch.randn(2, 5, 4, 3).transpose(1, 3)
    check_op(lambda a: F.interpolate(a, size=(6, 7), mode="bicubic"),
             lambda a: TF.interpolate(a, size=(6, 7), mode="bicubic"), x, gradcheck=False)
    s = tp.from_torch(torch.randn(1, 1, 2, 3, 2, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: F.interpolate(a, scale_factor=2, mode="trilinear") ** 2, (s,))


def test_interpolate_errors():
    with pytest.raises(NotImplementedError, match="tp.interpolate.*'trilinear'"):
        F.interpolate(tp.randn(1, 1, 4, 4), size=3, mode="trilinear")
    with pytest.raises(NotImplementedError, match="tp.interpolate.*'cubic'"):
        F.interpolate(tp.randn(1, 1, 4, 4), size=3, mode="cubic")
    with pytest.raises(ValueError, match="tp.interpolate.*antialias"):
        F.interpolate(tp.randn(1, 1, 4, 4), size=3, mode="nearest", antialias=True)
    with pytest.raises(ValueError, match="tp.interpolate.*recompute_scale_factor"):
        F.interpolate(tp.randn(1, 1, 4, 4), size=3, recompute_scale_factor=True)
    with pytest.raises(ValueError, match="align_corners"):
        F.interpolate(tp.randn(1, 1, 4), size=3, mode="area", align_corners=False)


@pytest.mark.parametrize("cls,kw", [("Upsample", dict(scale_factor=2, mode="bicubic", align_corners=False)),
                                    ("Upsample", dict(size=(3, 7), mode="nearest-exact")),
                                    ("Upsample", dict(scale_factor=0.5, mode="area")),
                                    ("UpsamplingNearest2d", dict(scale_factor=3)),
                                    ("UpsamplingBilinear2d", dict(size=(7, 5)))])
def test_upsample_modules(cls, kw):
    x = torch.randn(2, 3, 4, 6)
    m, tm = getattr(tp.nn, cls)(**kw), getattr(torch.nn, cls)(**kw)
    assert repr(m) == repr(tm)
    assert_close(m(to_tp(x)), tm(x))


# ---- instance norm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3, 5), (3, 2, 4, 3), (2, 2, 3, 2, 3)])
def test_instance_norm_functional(shape):
    x = torch.randn(shape)
    c = shape[1]
    w, b = torch.randn(c), torch.randn(c)
    check_op(lambda a, w, b: F.instance_norm(a, weight=w, bias=b), lambda a, w, b: TF.instance_norm(a, weight=w, bias=b),
             x, w, b, exact=False, rtol=1e-5, atol=1e-6, gradcheck=False)
    xd = torch.randn((2, 2) + tuple(shape[2:]), dtype=torch.float64)
    check_op(lambda a: F.instance_norm(a), lambda a: TF.instance_norm(a), xd, exact=False, gradcheck=True)
    rm, rv = torch.randn(c), torch.rand(c) + 0.5
    trm, trv, prm, prv = rm.clone(), rv.clone(), to_tp(rm), to_tp(rv)
    out = F.instance_norm(to_tp(x), prm, prv, momentum=0.3)
    ref = TF.instance_norm(x, trm, trv, momentum=0.3)
    assert_close(out, ref, exact=False, rtol=1e-5, atol=1e-6)
    assert_close(prm, trm, exact=False, rtol=1e-6, atol=1e-7)
    assert_close(prv, trv, exact=False, rtol=1e-6, atol=1e-7)
    check_op(lambda a: F.instance_norm(a, prm, prv, use_input_stats=False),       # eval with the running stats
             lambda a: TF.instance_norm(a, trm, trv, use_input_stats=False), x, exact=False, rtol=1e-5, atol=1e-6,
             gradcheck=False)


@pytest.mark.parametrize("cls,shape", [("InstanceNorm1d", (2, 4, 6)), ("InstanceNorm2d", (2, 4, 3, 5)),
                                       ("InstanceNorm3d", (2, 4, 3, 2, 3)), ("InstanceNorm2d", (4, 3, 5))])
@pytest.mark.parametrize("affine,track", [(False, False), (True, True), (False, True)])
def test_instance_norm_modules(cls, shape, affine, track):
    m, tm = getattr(tp.nn, cls)(4, affine=affine, track_running_stats=track, momentum=0.2), \
        getattr(torch.nn, cls)(4, affine=affine, track_running_stats=track, momentum=0.2)
    assert repr(m) == repr(tm)
    assert m.state_dict().keys() == tm.state_dict().keys()
    if affine:
        with torch.no_grad():
            tm.weight.copy_(torch.randn(4))
            tm.bias.copy_(torch.randn(4))
    m.load_state_dict({k: to_tp(v) for k, v in tm.state_dict().items()})
    for _ in range(2):
        x = torch.randn(shape)
        assert_close(m(to_tp(x)), tm(x), exact=False, rtol=1e-5, atol=1e-5)
    for k, v in tm.state_dict().items():
        assert_close(m.state_dict()[k], v, exact=False, rtol=1e-6, atol=1e-6)
    m.eval()
    tm.eval()
    x = torch.randn(shape)
    assert_close(m(to_tp(x)), tm(x), exact=False, rtol=1e-5, atol=1e-5)


def test_instance_norm_errors():
    with pytest.raises(ValueError, match="tp.instance_norm"):
        F.instance_norm(tp.randn(2, 3, 1))
    with pytest.raises(ValueError, match="InstanceNorm2d"):
        tp.nn.InstanceNorm2d(3)(tp.randn(2, 3))
    with pytest.raises(ValueError, match="InstanceNorm1d"):
        tp.nn.InstanceNorm1d(3, affine=True)(tp.randn(2, 4, 5))


@pytest.mark.slow
def test_compiled_instance_norm_updates_running_stats():
    m = tp.nn.InstanceNorm2d(2, affine=True, track_running_stats=True)
    tm = torch.nn.InstanceNorm2d(2, affine=True, track_running_stats=True)
    cm = tp.compile(m)
    for _ in range(3):
        x = torch.randn(3, 2, 4, 4)
        assert_close(cm(to_tp(x)), tm(x), exact=False, rtol=1e-5, atol=1e-5)
        assert_close(m.running_mean, tm.running_mean, exact=False, rtol=1e-6, atol=1e-6)
        assert_close(m.running_var, tm.running_var, exact=False, rtol=1e-6, atol=1e-6)
    cf = tp.compile(lambda a: F.interpolate(a * 2, scale_factor=1.5, mode="bicubic"))
    cf(to_tp(torch.randn(1, 2, 8, 8)))      # the capture run
    y = torch.randn(1, 2, 8, 8)
    assert_close(cf(to_tp(y)), TF.interpolate(y * 2, scale_factor=1.5, mode="bicubic"))
