"""Stax lowerings of the activations and shape ops that used to run as fallback kernels: selu, celu,
threshold, hardshrink, softshrink (pointwise), glu (two loads of one input), pixel_shuffle /
pixel_unshuffle (floor/Mod index maps), and clamp_min / clamp_max with a Python-number bound.

Each compiles under ``strict_native=True`` (no fallback kernel); the second call (the artifact, not
the capture run) is compared with eager and a float64 reference by the error model of
test_stax_ops.py, on inputs that include NaN, infinities and the values at the kinks.  The training
tests compile forward and backward (AOT) and compare the gradient with torch.autograd.
"""
import os
import sys

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.testing import assert_close

sys.path.insert(0, os.path.dirname(__file__))
from test_stax_ops import rnd, run_native  # noqa: E402

pytestmark = pytest.mark.usefixtures("stax_cache")


def _with_specials(shape, seed=0):
    """Random values, with NaN, +-inf, +-0 and the kinks (+-0.5, +-1, 0.1) planted."""
    x = rnd(*shape, seed=seed)._data.clone().view(-1)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 0.1])
    x[:len(specials)] = specials
    return tp.from_torch(x.view(shape))


#: name -> (tp function, torch function): the tp and torch calls of one activation
ACTIVATIONS = {
    "selu": (F.selu, torch.nn.functional.selu),
    "celu": (lambda a: F.celu(a, 0.7), lambda a: torch.nn.functional.celu(a, 0.7)),
    "threshold": (lambda a: F.threshold(a, 0.1, -2.0), lambda a: torch.nn.functional.threshold(a, 0.1, -2.0)),
    "hardshrink": (F.hardshrink, torch.nn.functional.hardshrink),
    "hardshrink_1": (lambda a: F.hardshrink(a, 1.0), lambda a: torch.nn.functional.hardshrink(a, 1.0)),
    "softshrink": (F.softshrink, torch.nn.functional.softshrink),
    "softshrink_1": (lambda a: F.softshrink(a, 1.0), lambda a: torch.nn.functional.softshrink(a, 1.0)),
    "glu_last": (F.glu, torch.nn.functional.glu),
    "glu_dim1": (lambda a: F.glu(a, 1), lambda a: torch.nn.functional.glu(a, 1)),
    "pixel_shuffle": (lambda a: F.pixel_shuffle(a, 2), lambda a: torch.nn.functional.pixel_shuffle(a, 2)),
    "pixel_unshuffle": (lambda a: F.pixel_unshuffle(a, 2), lambda a: torch.nn.functional.pixel_unshuffle(a, 2)),
    # composites of lowered ops (regression guards: these compile natively too)
    "mish": (F.mish, torch.nn.functional.mish),
    "logsigmoid": (F.logsigmoid, torch.nn.functional.logsigmoid),
    "tanhshrink": (F.tanhshrink, torch.nn.functional.tanhshrink),
    "hardsigmoid": (F.hardsigmoid, torch.nn.functional.hardsigmoid),
    "hardswish": (F.hardswish, torch.nn.functional.hardswish),
    "rrelu_eval": (lambda a: F.rrelu(a, training=False), lambda a: torch.nn.functional.rrelu(a, training=False)),
    "softsign": (F.softsign, torch.nn.functional.softsign),
    "clamp_min": (lambda a: a.clamp_min(0.1), lambda a: a.clamp_min(0.1)),
    "clamp_max": (lambda a: a.clamp_max(-0.5), lambda a: a.clamp_max(-0.5)),
    "clamp_min_int_bound": (lambda a: a.clamp_min(0), lambda a: a.clamp_min(0)),
}

SHAPE = (2, 8, 6, 4)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_compiles_native_and_matches_eager(name):
    f, tf = ACTIVATIONS[name]
    x = _with_specials(SHAPE)
    out, _ = run_native(f, x)
    # eager tp is ATen; also judge against torch itself, NaN positions included
    torch.testing.assert_close(out._data, tf(x._data), equal_nan=True)


@pytest.mark.parametrize("name", ["selu", "celu", "softshrink", "threshold"])
def test_activation_of_a_transposed_input_fused_with_its_consumer(name):
    f, _ = ACTIVATIONS[name]
    x = rnd(SHAPE[-1], SHAPE[-2], 3)
    run_native(lambda a: f(a.transpose(0, 2) * 1.5 + 0.25) * 2, x)


def test_pixel_shuffle_round_trip_and_batchless_input():
    x = rnd(12, 5, 3)
    out, _ = run_native(lambda a: F.pixel_unshuffle(F.pixel_shuffle(a, 2) + 1, 2), x)
    assert_close(out, x._data + 1)
    out, _ = run_native(lambda a: F.pixel_shuffle(a, 3), rnd(1, 2, 18, 2, 3))
    assert_close(out, torch.nn.functional.pixel_shuffle(rnd(1, 2, 18, 2, 3)._data, 3))


def test_clamp_with_number_bounds_on_integer_tensors():
    x = tp.from_torch(torch.randint(-10, 10, (5, 7), generator=torch.Generator().manual_seed(3)))
    for f in (lambda a: a.clamp_min(-3), lambda a: a.clamp_max(4), lambda a: a.clamp_min(0.5)):
        out, _ = run_native(f, x)
        ref = f(x._data)
        assert out.dtype == ref.dtype and torch.equal(out._data, ref)


@pytest.mark.parametrize("name", ["selu", "celu", "threshold", "hardshrink", "softshrink", "glu_dim1",
                                  "pixel_shuffle", "pixel_unshuffle", "clamp_min", "clamp_max"])
def test_activation_training_region_is_native_and_grad_matches_torch(name):
    f, tf = ACTIVATIONS[name]
    x0 = rnd(*SHAPE, seed=1)._data.double()
    w0 = torch.randn(tf(x0).shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cf = tp.compile(lambda a, w: (f(a) * w).sum(), strict_native=True)
    for _ in range(2):      # the second call runs the compiled forward and backward
        x = tp.from_torch(x0.clone()).requires_grad_()
        loss = cf(x, tp.from_torch(w0))
        loss.backward()
    assert loss.grad_fn.name() == "CompiledRegionFunctionBackward"
    xt = x0.clone().requires_grad_()
    ref = (tf(xt) * w0).sum()
    ref.backward()
    assert_close(loss, ref)
    assert_close(x.grad, xt.grad)
