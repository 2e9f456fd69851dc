"""The knobs stax.keep_realized_local and stax.horizontal_fusion (choices.KEEP_REALIZED_LOCAL and
HORIZONTAL_FUSION) on example 7.2 (docs/chapter.md).

Example 7.2 is ``e = x.exp(); (e.sum(-1), e.amax(-1))``.  By default Stax keeps ``e`` in a register:
one kernel computes exp once per element and feeds both accumulators.  With
``KEEP_REALIZED_LOCAL = False`` it follows the chapter's CPU model of §6.6: ``e`` is written to
memory (a kernel of its own) and one kernel reads it back for both reductions.  With horizontal
fusion off as well, the two reductions become two kernels.
"""
import pytest
import torch

import tensorplay as tp

pytestmark = pytest.mark.usefixtures("stax_cache")


def ex72(x):
    return x.exp().sum(-1), x.exp().amax(-1)


def five_op_softmax(x):
    m = x.amax(-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(-1, keepdim=True)


def _compiled(fn, x):
    """(outputs of a compiled call -- the second, the first is the capture run --, kernel count,
    materialised buffers, intermediate bytes)."""
    cf = tp.compile(fn, strict_native=True)
    cf(x)
    out = cf(x)
    art = cf._cache[0].artifact
    return out, art.source.count("async_compile.cpp("), set(art.materialized), art.intermediate_bytes


def _check72(out, x):
    torch.testing.assert_close(out[0]._data, x._data.exp().sum(-1))
    torch.testing.assert_close(out[1]._data, x._data.exp().amax(-1))


@pytest.mark.parametrize("horizontal", [True, False])
def test_default_keeps_exp_in_registers(config_patch, horizontal):
    config_patch("stax.horizontal_fusion", horizontal)
    x = tp.from_torch(torch.randn(64, 128))
    out, kernels, materialized, inter = _compiled(ex72, x)
    _check72(out, x)
    # one kernel either way: both reductions fuse *vertically* with the exp they read
    assert kernels == 1 and inter == 0 and len(materialized) == 2   # just the two row results


def test_chapter_model_writes_exp_to_memory(config_patch):
    config_patch("stax.keep_realized_local", False)
    x = tp.from_torch(torch.randn(64, 128))
    out, kernels, materialized, inter = _compiled(ex72, x)
    _check72(out, x)
    assert kernels == 2 and len(materialized) == 3
    assert inter == 2 * x.numel() * 4                  # e written once and read once: 3N with x
    config_patch("stax.horizontal_fusion", False)
    out, kernels, materialized, inter = _compiled(ex72, x)
    _check72(out, x)
    assert kernels == 3                                # exp, sum, amax: e is read twice


def test_chapter_model_leaves_softmax_alone(config_patch):
    """The rule applies to values whose readers are all reductions: the five-op softmax's e is also
    read by the division, and stays local (one kernel, as in the chapter's table 13.1)."""
    x = tp.from_torch(torch.randn(32, 100))
    ref = torch.softmax(x._data, -1)
    for keep in (True, False):
        config_patch("stax.keep_realized_local", keep)
        out, kernels, _, inter = _compiled(five_op_softmax, x)
        torch.testing.assert_close(out._data, ref)
        assert kernels == 1 and inter == 0


def test_horizontal_switch_matters_without_a_shared_producer(config_patch):
    """x.sum(-1) and x.amax(-1) share only their input: horizontal fusion is the only way to read x
    once, and switching it off gives two kernels."""
    x = tp.from_torch(torch.randn(64, 128))
    f = lambda x: (x.sum(-1), x.amax(-1))      # noqa: E731
    for horizontal, want in ((True, 1), (False, 2)):
        config_patch("stax.horizontal_fusion", horizontal)
        out, kernels, _, _ = _compiled(f, x)
        torch.testing.assert_close(out[0]._data, x._data.sum(-1))
        torch.testing.assert_close(out[1]._data, x._data.amax(-1))
        assert kernels == want
