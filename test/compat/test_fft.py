"""tp.fft against torch.fft: forward bit for bit (n / s padding and truncation, dims, every norm, real
and complex input), meta, gradients vs torch.autograd (PyTorch's complex convention), gradcheck in
float64 through real views, the complex helper ops, frequencies and shifts, bad input, compiled."""
import pytest
import torch

import tensorplay as tp
from harness import check_op, to_tp
from tensorplay.testing import assert_close

g = torch.Generator().manual_seed(0)
NORMS = [None, "ortho", "forward"]


def rn(*s, dtype=torch.float64):
    return torch.randn(*s, generator=g, dtype=dtype)


def cx(*s):
    return torch.complex(rn(*s), rn(*s))


def _as_real(t):
    return t if not t.is_complex() else (tp.view_as_real(t) if isinstance(t, tp.Tensor) else torch.view_as_real(t.resolve_conj()))


def _check(name, x, *args, gradcheck=True, **kw):
    """Forward, meta and gradients of tp.fft.<name> vs torch.fft.<name>; gradcheck through real views."""
    f = lambda a: _as_real(getattr(tp.fft, name)(a, *args, **kw))             # noqa: E731
    tf = lambda a: _as_real(getattr(torch.fft, name)(a, *args, **kw))         # noqa: E731
    if x.is_complex():
        check_op(lambda a: _as_real(getattr(tp.fft, name)(tp.view_as_complex(a), *args, **kw)),
                 lambda a: _as_real(getattr(torch.fft, name)(torch.view_as_complex(a), *args, **kw)),
                 torch.view_as_real(x).clone(), gradcheck=gradcheck)
    else:
        check_op(f, tf, x, gradcheck=gradcheck)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", ["fft", "ifft"])
@pytest.mark.parametrize("complex_in", [False, True])
def test_c2c_1d(name, norm, complex_in):
    x = cx(3, 5) if complex_in else rn(3, 5)
    gc = norm is None                         # gradcheck once per transform (the norm is a constant factor)
    _check(name, x, norm=norm, gradcheck=gc)
    _check(name, x, 7, 0, norm=norm, gradcheck=False)          # padded along dim 0
    _check(name, x, 3, norm=norm, gradcheck=gc)                # truncated


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", ["rfft", "ihfft"])
def test_r2c_1d(name, norm):
    x = rn(3, 6)
    gc = norm is None
    _check(name, x, norm=norm, gradcheck=gc)
    _check(name, x, 5, 0, norm=norm, gradcheck=False)
    _check(name, x.t(), 4, norm=norm, gradcheck=gc)            # transposed input


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", ["irfft", "hfft"])
def test_c2r_1d(name, norm):
    z = cx(3, 4)
    gc = norm is None
    _check(name, z, norm=norm, gradcheck=gc)                   # n = 2 (m - 1) = 6
    _check(name, z, 7, norm=norm, gradcheck=gc)                # odd output length
    _check(name, z, 3, 0, norm=norm, gradcheck=False)
    check_op(lambda a: getattr(tp.fft, name)(a, norm=norm), lambda a: getattr(torch.fft, name)(a, norm=norm),
             rn(2, 5))                         # a real input is promoted


@pytest.mark.parametrize("norm", NORMS)
def test_nd(norm):
    z, x = cx(2, 3, 4), rn(2, 3, 4)
    for name, t, kw in [("fft2", z, {}), ("ifft2", x, {}), ("fftn", z, dict(s=(4, 2))), ("ifftn", z, dict(dim=(0, 2))),
                        ("fftn", x, {}), ("rfft2", x, {}), ("rfftn", x, dict(s=(3, 5))),
                        ("irfft2", z, {}), ("irfftn", z, dict(s=(2, 5), dim=(0, 2))), ("irfftn", z, {})]:
        _check(name, t, norm=norm, gradcheck=norm is None and name in ("fft2", "rfftn", "irfft2"), **kw)


def test_integer_and_size_errors():
    xi = torch.randint(-5, 5, (2, 6))
    check_op(lambda a: tp.view_as_real(tp.fft.fft(a)), lambda a: torch.view_as_real(torch.fft.fft(a)), xi)
    check_op(lambda a: tp.fft.rfft(a), lambda a: torch.fft.rfft(a), xi, grad=False)
    with pytest.raises(ValueError, match="tp.fft.fft"):
        tp.fft.fft(tp.randn(4), norm="sideways")
    with pytest.raises(ValueError, match="tp.fft.fft"):
        tp.fft.fft(tp.randn(4), n=0)
    with pytest.raises(IndexError, match="tp.fft.rfft"):
        tp.fft.rfft(tp.randn(4), dim=2)
    with pytest.raises(RuntimeError, match="tp.fft.rfft"):
        tp.fft.rfft(to_tp(cx(4)))
    with pytest.raises(RuntimeError, match="tp.fft.fftn"):
        tp.fft.fftn(tp.randn(4, 4), s=(3, 3), dim=(0,))
    with pytest.raises(RuntimeError, match="tp.fft.irfft"):
        tp.fft.irfft(to_tp(cx(1)))


def test_freq_and_shift():
    for n, d in [(8, 1.0), (7, 0.1)]:
        assert_close(tp.fft.fftfreq(n, d), torch.fft.fftfreq(n, d))
        assert_close(tp.fft.rfftfreq(n, d, dtype=torch.float64), torch.fft.rfftfreq(n, d, dtype=torch.float64))
    x = rn(4, 5)
    for dim in (None, 0, (0, 1), -1):
        check_op(lambda a: tp.fft.fftshift(a, dim), lambda a: torch.fft.fftshift(a, dim), x)
        check_op(lambda a: tp.fft.ifftshift(a, dim), lambda a: torch.fft.ifftshift(a, dim), x)
    y = to_tp(x)
    assert_close(tp.fft.ifftshift(tp.fft.fftshift(y)), x)


def test_complex_helpers():
    z = cx(3, 4)
    check_op(lambda a: tp.real(tp.view_as_complex(a)), lambda a: torch.view_as_complex(a).real.clone(),
             torch.view_as_real(z).clone())
    check_op(lambda a: tp.imag(tp.view_as_complex(a)), lambda a: torch.view_as_complex(a).imag.clone(),
             torch.view_as_real(z).clone())
    check_op(lambda a: tp.view_as_real(tp.conj_physical(tp.view_as_complex(a))),
             lambda a: torch.view_as_real(torch.conj_physical(torch.view_as_complex(a))), torch.view_as_real(z).clone())
    check_op(lambda a, b: tp.view_as_real(tp.complex(a, b)), lambda a, b: torch.view_as_real(torch.complex(a, b)),
             rn(3), rn(3))
    # complex leaves: gradients as PyTorch defines them
    for f, tf in [(lambda a: tp.real(a * 2).sum() + tp.imag(a).sum(), lambda a: (a * 2).real.sum() + a.imag.sum()),
                  (lambda a: tp.view_as_real(tp.fft.fft(a)).pow(2).sum(),
                   lambda a: torch.view_as_real(torch.fft.fft(a)).pow(2).sum())]:
        a = to_tp(z, requires_grad=True)
        f(a).backward()
        ta = z.clone().requires_grad_()
        tf(ta).backward()
        assert_close(a.grad, ta.grad, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="tp.imag"):
        tp.imag(tp.randn(3))
    with pytest.raises(RuntimeError, match="tp.view_as_complex"):
        tp.view_as_complex(tp.randn(3, 3))


def test_double_backward():
    x = to_tp(rn(6), requires_grad=True)
    assert tp.autograd.gradgradcheck(lambda a: tp.fft.irfft(tp.fft.rfft(a * a) * 3.0, n=6) ** 2, (x,))


@pytest.mark.slow
def test_compiled():
    def f(x):
        spec = tp.fft.rfft(x * 2)
        return tp.fft.irfft(spec * spec, n=x.shape[-1]) + x
    x = rn(3, 8).float()
    cf = tp.compile(f)
    cf(to_tp(x))
    got = cf(to_tp(x))
    s = torch.fft.rfft(x * 2)
    assert_close(got, torch.fft.irfft(s * s, n=8) + x, exact=False, rtol=1e-5, atol=1e-5)
