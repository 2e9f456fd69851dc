"""Stax on CPU: index widths from values computed in masked-out lanes (bounds.lane_bound).

A padded region reads its input under a mask, but the index arithmetic runs in every lane: reflect
padding of a nearest-upsampled tensor computes ``floor((i - 1) / 2)`` at ``i = 0``, where the mask
drops the lane.  The access proof uses the mask; the index width bounds the truncating ``/`` and
``%`` the kernel really computes there.  These kernels used to be rejected ("cannot prove the
argument of floor(...) non-negative"); each case here is compiled with strict_native=True and
compared bitwise with eager on random inputs.  The padded regions that read a falling argument
(``floor((1 - i)/2)``, ``Mod(4 - i, 5)``) are rewritten to rising ones (``ir.rising_floors``, an
identity on the integers, checked here point by point).
"""
import math

import pytest
import sympy
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler.backends.stax.bounds import Interval, bound, lane_bound
from tensorplay.compiler.backends.stax.ir import Unsupported, rising_floors

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _compiled(f, *args):
    cf = tp.compile(f, strict_native=True)
    cf(*args)            # the capture run (eager values)
    return cf(*args)     # the compiled kernels


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", [((2, 3, 5, 6), (1, 1, 1, 1)), ((1, 2, 7, 20), (3, 2, 0, 5)),
                                       ((2, 1, 4, 9), (0, 4, 2, 0))])
def test_pad_after_nearest_upsample(mode, shape, pad):
    g = torch.Generator().manual_seed(sum(shape) + sum(pad))
    xt = torch.randn(*shape, generator=g)

    def f(x):
        return F.pad(F.interpolate(x, scale_factor=2, mode="nearest"), pad, mode=mode)
    out = _compiled(f, tp.from_torch(xt))
    ref = torch.nn.functional.pad(torch.nn.functional.interpolate(xt, scale_factor=2, mode="nearest"), pad, mode=mode)
    assert torch.equal(out._data, ref)


def test_pad_after_nearest_upsample_1d_scale3_noncontiguous():
    g = torch.Generator().manual_seed(3)
    xt = torch.randn(4, 19, 3, generator=g).transpose(1, 2)     # (4, 3, 19), non-contiguous

    def f(x):
        return F.pad(F.interpolate(x, scale_factor=3, mode="nearest") * 2, (5, 7), mode="reflect")
    out = _compiled(f, tp.from_torch(xt))
    ref = torch.nn.functional.pad(torch.nn.functional.interpolate(xt, scale_factor=3, mode="nearest") * 2,
                                  (5, 7), mode="reflect")
    assert torch.equal(out._data, ref)


@pytest.mark.parametrize("mode", ["reflect", "circular"])
def test_pad_after_repeat(mode):
    """repeat is a Mod index map; the reflected region reads ``Mod(c - i, n)`` (rising_floors)."""
    g = torch.Generator().manual_seed(11)
    xt = torch.randn(2, 3, 4, 5, generator=g)

    def f(x):
        return F.pad(x.repeat(1, 1, 2, 3)[..., :14] + 1, (2, 4, 3, 1), mode=mode)
    out = _compiled(f, tp.from_torch(xt))
    ref = torch.nn.functional.pad(xt.repeat(1, 1, 2, 3)[..., :14] + 1, (2, 4, 3, 1), mode=mode)
    assert torch.equal(out._data, ref)


def test_rising_floors_is_an_identity():
    i, j = sympy.symbols("i j", integer=True)
    for e in (sympy.floor((1 - i) / 2), sympy.floor((5 - 3 * i - j) / 4), sympy.Mod(4 - i, 5),
              7 * sympy.floor((2 - i) / 3) + sympy.Mod(3 - 2 * i - j, 4) + i):
        r = rising_floors(e)
        assert r != e
        for a in range(-9, 10):
            for b in range(-3, 4):
                assert r.subs({i: a, j: b}) == e.subs({i: a, j: b}), (e, r, a, b)
        for f in r.atoms(sympy.floor, sympy.Mod):     # the new arguments rise in every variable
            arg = f.args[0] if isinstance(f, sympy.Mod) else sympy.fraction(sympy.together(f.args[0]))[0]
            assert all(sympy.expand(arg).coeff(v) >= 0 for v in (i, j))
    rising = sympy.floor((i + 1) / 2) + sympy.Mod(i + j, 3)
    assert rising_floors(rising) is rising


def test_lane_bound_truncates_where_bound_refuses():
    i = sympy.Symbol("i", integer=True)
    ranges = {i: (0, 12)}
    e = sympy.floor((i - 1) / 2)
    with pytest.raises(Unsupported, match="non-negative"):
        bound(e, ranges)
    # C++ computes (i - 1) / 2 truncated: 0 at i = 0 (floor would give -1), 5 at i = 12
    assert lane_bound(e, ranges) == Interval(0, 5)
    want = [int((k - 1) / 2) for k in range(13)]
    assert lane_bound(e, ranges).lo <= min(want) and max(want) <= lane_bound(e, ranges).hi
    m = sympy.Mod(3 - i, 4)      # printed (3 - i) % 4: truncating, negative for i > 3
    got = lane_bound(m, ranges)
    vals = [int(math.fmod(3 - k, 4)) for k in range(13)]
    assert got.lo <= min(vals) and max(vals) <= got.hi
    # non-negative arguments: the same interval as bound
    assert lane_bound(sympy.floor((i + 3) / 2), ranges) == bound(sympy.floor((i + 3) / 2), ranges) == Interval(1, 7)
