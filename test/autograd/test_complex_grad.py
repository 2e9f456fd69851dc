"""Gradients of complex inputs against torch.autograd (PyTorch's convention: the conjugate Wirtinger
derivative, ``grad = dL/dx + i dL/dy`` for a real loss L).

The derivative formulas are written as for real inputs; ``mul`` conjugates its saved operands, ops
tagged ``holomorphic`` are conjugated by the table (``conj(formula(conj(g)))``), and the
non-holomorphic ones (abs, l1_loss, norm) use ``sgn(x) = x / |x|``.  Every case draws random complex
inputs (real ones where an op mixes them), a random complex weight ``w`` of the output, and compares
the gradients of ``real(sum(out * w))`` with torch's in float64.  Ops whose complex gradient is not
implemented raise NotImplementedError naming the op, never a silently wrong value.
"""
import warnings

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.ops.registry import OPS
from tensorplay.testing import assert_close


def _c(*shape, seed=0):
    return torch.randn(shape, dtype=torch.complex128, generator=torch.Generator().manual_seed(seed))


def _r(*shape, seed=0):
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _nn(L):
    return F if L is tp else torch.nn.functional


def _grads(f, L, ins, w):
    """Gradients of real(sum(f(L, *ins) * w)) for the library L (tp or torch)."""
    if L is tp:
        xs = [tp.from_torch(x.clone()).requires_grad_() for x in ins]
        out = f(tp, *xs)
        loss = (tp.real(out * tp.from_torch(w)) if out.is_complex() else out * tp.from_torch(w.real)).sum()
        loss.backward()
        return [x.grad._data if x.grad is not None else None for x in xs]
    xs = [x.clone().requires_grad_() for x in ins]
    out = f(torch, *xs)
    loss = ((out * w).real if out.is_complex() else out * w.real).sum()
    return list(torch.autograd.grad(loss, xs, allow_unused=True))


#: name -> (f(L, *inputs) for L = tp or torch, the inputs)
CASES = {
    "abs_of_mul": (lambda L, z, w: (z * w).abs(), [_c(3, 4), _c(3, 4, seed=1)]),
    "mul": (lambda L, a, b: a * b, [_c(3, 4), _c(3, 4, seed=1)]),
    "mul_broadcast": (lambda L, a, b: a * b, [_c(3, 1), _c(1, 4, seed=1)]),
    "mul_real_by_complex": (lambda L, a, b: a * b, [_r(3, 4), _c(3, 4, seed=1)]),
    "mul_by_complex_number": (lambda L, a: a * (2 - 3j), [_c(3, 4)]),
    "div": (lambda L, a, b: a / b, [_c(3, 4), _c(3, 4, seed=1)]),
    "div_real_by_complex": (lambda L, a, b: a / b, [_r(3, 4), _c(3, 4, seed=1)]),
    "rdiv_number": (lambda L, a: (1 + 2j) / a, [_c(3, 4)]),
    "matmul": (lambda L, a, b: a @ b, [_c(3, 4), _c(4, 5, seed=1)]),
    "matmul_batched_vector": (lambda L, a, b: a @ b, [_c(2, 3, 4), _c(4, seed=1)]),
    "mm": (lambda L, a, b: L.mm(a, b), [_c(3, 4), _c(4, 5, seed=1)]),
    "bmm": (lambda L, a, b: L.bmm(a, b), [_c(2, 3, 4), _c(2, 4, 5, seed=1)]),
    "baddbmm": (lambda L, s, a, b: L.baddbmm(s, a, b, beta=0.5, alpha=2.0),
                [_c(2, 3, 5), _c(2, 3, 4, seed=1), _c(2, 4, 5, seed=2)]),
    "addmm": (lambda L, s, a, b: L.addmm(s, a, b), [_c(3, 5), _c(3, 4, seed=1), _c(4, 5, seed=2)]),
    "linear": (lambda L, x, w, b: _nn(L).linear(x, w, b), [_c(3, 4), _c(5, 4, seed=1), _c(5, seed=2)]),
    "einsum": (lambda L, a, b: L.einsum("ij,jk->ik", a, b), [_c(3, 4), _c(4, 5, seed=1)]),
    "outer_dot": (lambda L, a, b: L.outer(a, b) * L.dot(a, a), [_c(4), _c(4, seed=1)]),
    "kron": (lambda L, a, b: L.kron(a, b), [_c(2, 2), _c(2, 3, seed=1)]),
    "cross": (lambda L, a, b: L.linalg.cross(a, b), [_c(4, 3), _c(4, 3, seed=1)]),
    "pow_int": (lambda L, a: a ** 3, [_c(3, 4)]),
    "pow_complex_exponent": (lambda L, a: a ** (1.5 + 0.5j), [_c(3, 4)]),
    "pow_tensors": (lambda L, a, b: a ** b, [_c(3, 4), _c(3, 4, seed=1)]),
    "rpow": (lambda L, a: 2 ** a, [_c(3, 4)]),
    "exp_log_sqrt": (lambda L, a: a.exp() * a.log() + a.sqrt() - a.rsqrt(), [_c(3, 4)]),
    "trig": (lambda L, a: a.sin() * a.cos() + a.tan() + a.tanh() + a.sigmoid(), [_c(3, 4)]),
    "inverse_trig": (lambda L, a: L.asin(a) + L.acos(a) + L.atan(a) + L.asinh(a) + L.acosh(a) + L.atanh(a),
                     [_c(3, 4)]),
    "square_reciprocal_expm1": (lambda L, a: a.square() + a.reciprocal() + a.expm1() + a.log1p(), [_c(3, 4)]),
    "addcmul_addcdiv_lerp": (lambda L, s, a, b: L.addcmul(s, a, b, value=0.5) + L.addcdiv(s, a, b)
                             + L.lerp(a, b, 0.3), [_c(3, 4), _c(3, 4, seed=1), _c(3, 4, seed=2)]),
    "prod_cumprod": (lambda L, a: L.prod(a, 1).unsqueeze(1) * L.cumprod(a, 1), [_c(3, 4)]),
    "logaddexp": (lambda L, a, b: L.logaddexp(a, b), [_c(3, 4), _c(3, 4, seed=1)]),
    "inv_solve_det": (lambda L, a, b: L.linalg.inv(a) @ L.linalg.solve(a, b) * L.linalg.det(a),
                      [_c(3, 3), _c(3, 2, seed=1)]),
    "solve_triangular": (lambda L, a, b: L.linalg.solve_triangular(a, b, upper=True),
                         [_c(3, 3) + 3 * torch.eye(3), _c(3, 2, seed=1)]),
    "norms": (lambda L, a: L.norm(a) + L.norm(a, 1) + L.linalg.vector_norm(a, 3, dim=1).sum()
              + L.linalg.vector_norm(a, float("inf")), [_c(3, 4)]),
    "l1_loss": (lambda L, a, b: _nn(L).l1_loss(a, b), [_c(3, 4), _c(3, 4, seed=1)]),
    "var_std_mean": (lambda L, a: L.var(a, 1) + L.std(a, 1) + L.mean(a, 1).abs(), [_c(3, 4)]),
    "complex_of_reals": (lambda L, a, b: L.complex(a, b) ** 2, [_r(3, 4), _r(3, 4, seed=1)]),
    "fft": (lambda L, a: L.fft.fft(a * a), [_c(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_complex_gradient_matches_torch(name):
    f, ins = CASES[name]
    out = f(torch, *ins)
    w = _c(*out.shape, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no "casting complex values to real" on the way
        got = _grads(f, tp, ins, w)
    want = _grads(f, torch, ins, w)
    for k, (g, t) in enumerate(zip(got, want)):
        assert g is not None and g.dtype == ins[k].dtype, (k, None if g is None else g.dtype)
        assert_close(g, t, atol=1e-9, rtol=1e-7)


def _tensor_only_call(op, seed):
    """The canonical arguments of ``op`` with every tensor a random complex 3x3 matrix, or None when
    the op needs a non-tensor argument without a default."""
    args = []
    for i, a in enumerate(op.schema.args):
        if a.is_tensor:
            args.append(_c(3, 3, seed=seed + i))
        elif a.has_default:
            args.append(a.default)
        else:
            return None
    return args


HOLOMORPHIC = sorted(n for n, o in OPS.items() if "holomorphic" in o.tags and "inplace" not in o.tags)


@pytest.mark.parametrize("name", HOLOMORPHIC)
def test_every_holomorphic_op_of_the_table_matches_torch(name):
    """The whole ``holomorphic`` family: g * conj(f'(z)) for each tensor argument."""
    op = OPS[name]
    args = _tensor_only_call(op, seed=3)
    if args is None:
        pytest.skip("needs a non-tensor argument (covered by CASES)")
    pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def f(L, *ts):
        full = list(args)
        for i, t in zip(pos, ts):
            full[i] = t
        return (OPS[name] if L is tp else op.eager)(*full)     # (the canonical argument tuple)
    ins = [args[i] for i in pos]
    try:
        out = f(torch, *ins)
    except (RuntimeError, IndexError):
        pytest.skip("the op takes other shapes than 3x3 matrices (covered by CASES)")
    out = out[0] if isinstance(out, tuple) else out
    w = _c(*out.shape, seed=7)
    g = (lambda L, *ts: (lambda o: o[0] if isinstance(o, tuple) else o)(f(L, *ts)))
    for got, want in zip(_grads(g, tp, ins, w), _grads(g, torch, ins, w)):
        assert_close(got, want, atol=1e-9, rtol=1e-7)


def test_holomorphic_ops_stay_real_on_real_inputs():
    """The conjugation runs only on a complex gradient: real formulas are unchanged."""
    x = _r(3, 4) + 2
    got = _grads(lambda L, a: a.exp() * a.log() @ a.t(), tp, [x], _c(3, 3, seed=1))
    want = _grads(lambda L, a: a.exp() * a.log() @ a.t(), torch, [x], _c(3, 3, seed=1))
    assert got[0].dtype == torch.float64
    assert_close(got[0], want[0])


@pytest.mark.parametrize("name, f", [
    ("cholesky", lambda a: tp.cholesky(a @ a.mT.conj_physical() + 3 * tp.eye(3, dtype=a.dtype))),
    ("linalg_cholesky_ex", lambda a: tp.linalg.cholesky_ex(a @ a.mT.conj_physical() + 3 * tp.eye(3, dtype=a.dtype))[0]),
    ("pinverse", lambda a: tp.pinverse(a)),
])
def test_unimplemented_complex_gradients_raise_naming_the_op(name, f):
    a = tp.from_torch(_c(3, 3)).requires_grad_()
    out = f(a)
    with pytest.raises(NotImplementedError, match=f"tp.{name}"):
        tp.real(out).sum().backward()


def test_compiled_complex_training_region_matches_torch():
    z0, w0 = _c(3, 4), _c(3, 4, seed=1)
    cf = tp.compile(lambda z, w: (z * w).abs().sum())
    for _ in range(2):     # the second call runs the compiled region
        z, w = tp.from_torch(z0.clone()).requires_grad_(), tp.from_torch(w0.clone()).requires_grad_()
        cf(z, w).backward()
    zt, wt = z0.clone().requires_grad_(), w0.clone().requires_grad_()
    (zt * wt).abs().sum().backward()
    assert_close(z.grad, zt.grad)
    assert_close(w.grad, wt.grad)
