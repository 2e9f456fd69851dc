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
