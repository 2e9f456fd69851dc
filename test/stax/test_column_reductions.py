"""Reductions over non-trailing dims in *column mode* (docs/stax.md, "Column reductions").

``x.sum(0)`` on a contiguous (R, C) tensor is generated with the vector lanes across the output
columns (plain vector loads of a row, a scalar loop over the reduced rows, one accumulator vector
per block of columns) instead of one row per column with strided gathers.  Every test compares
with eager / float64 under the error model of test_stax_ops.py (``run_native``); the summation
order differs from the row mode, never the result beyond that model.
"""
import re

import pytest
import torch

import tensorplay as tp
from test_stax_ops import run_native

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def rnd(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(shape, generator=g, dtype=torch.float64).float())


def _src(cf):
    return cf._cache[0].artifact.source


def _dim0(x):
    return (x.sum(0), x.mean(0), x.amax(0), x.amin(0), x.prod(0), x.var(0), x.std(0, keepdim=True),
            x.argmax(0), x.argmin(0, keepdim=True), *tp.max(x, 0), x.sum(0, keepdim=True), x.logsumexp(0))


def test_sum0_uses_column_mode_no_gather():
    x = rnd(64, 40)
    _, cf = run_native(lambda x: x.sum(0), x, n_red=64)
    src = _src(cf)
    assert "(columns)" in src and "tp_gather" not in src, src
    assert "tp::Vec<float>::load(arg0" in src and "reduce_add" not in src, src
    # the trailing-reduction fast path is unchanged
    _, cf = run_native(lambda x: x.sum(-1), x, n_red=40)
    assert "(columns)" not in _src(cf) and "reduce_add" in _src(cf)


@pytest.mark.parametrize("shape", [(33, 1), (33, 5), (17, 40), (9, 300)],
                         ids=["C1", "C<VL", "C-not-multiple", "blocks+tail"])
def test_reductions_dim0(shape):
    x = rnd(*shape)
    _, cf = run_native(_dim0, x, n_red=shape[0])
    if shape[1] > 1:
        assert "(columns)" in _src(cf) and "tp_gather" not in _src(cf)


def test_nan_inf_ties_dim0():
    t = rnd(21, 37)._data.clone()
    t[3, 5] = float("nan")
    t[7, 6] = float("inf")
    t[2, 8] = float("-inf")
    t[:, 9] = 1.0               # ties: the first index wins
    t[10, 11] = t[15, 11] = 9.0
    x = tp.from_torch(t)
    run_native(lambda x: (x.amax(0), x.amin(0), x.argmax(0), x.argmin(0), *tp.min(x, 0), x.sum(0)), x, n_red=21)


def test_empty_and_single_row():
    run_native(lambda x: (x.sum(0), x.prod(0), x.mean(0)), rnd(0, 40))
    run_native(lambda x: (x.sum(0), x.amax(0), x.argmax(0), x.var(0, correction=0)), rnd(1, 40))
    run_native(lambda x: (x.sum(0), x.amax(0), x.sum(1)), rnd(6, 0, 3))
    # an empty outer dim in front of the column dim (random program seed 230: a division by the
    # zero count of outer rows while choosing the column unroll)
    run_native(lambda x: (x.permute(1, 3, 0, 2).mean(2), x.permute(1, 3, 0, 2).var((0, 1, 2), keepdim=True)),
               rnd(5, 32, 17, 0))
    run_native(lambda x: x.sum(1), rnd(0, 7, 40))


def test_middle_dims_3d():
    x = rnd(5, 13, 37)
    _, cf = run_native(lambda x: (x.sum(1), x.amax(1), x.var(1), x.argmax(1), x.sum((0, 1)), x.mean(0),
                                  x.sum(1, keepdim=True), x.sum((0, 2)), x.amin(-1)), x, n_red=5 * 13)
    assert "(columns)" in _src(cf) and "tp_gather" not in _src(cf)


def test_softmax_log_softmax_dim0():
    x = rnd(33, 40)
    run_native(lambda x: (x.softmax(0), x.log_softmax(0)), x, n_red=33)
    run_native(lambda x: x.softmax(1), rnd(4, 19, 21), n_red=19)


def test_fused_pointwise_producer():
    x = rnd(45, 70)
    _, cf = run_native(lambda x: ((x * 2 + 1).exp().sum(0), (x.abs() + 1).log().amax(0)), x, n_red=45)
    src = _src(cf)
    assert "(columns)" in src and "tp::exp" in src and "tp_gather" not in src


def test_transposed_and_strided_inputs():
    xt = rnd(40, 33).t()                  # (33, 40) column-major: the trailing mode reads it contiguously
    run_native(lambda x: (x.sum(0), x.softmax(0), x.var(0), x.argmax(0), x.amax(1)), xt, n_red=40)
    xs = rnd(23, 2 * 19)[:, ::2]          # columns with stride 2: row mode
    run_native(lambda x: (x.sum(0), x.amin(0)), xs, n_red=23)


def test_int_and_bool_inputs():
    g = torch.Generator().manual_seed(1)
    i = tp.from_torch(torch.randint(-50, 50, (19, 37), generator=g))
    i32 = tp.from_torch(torch.randint(-50, 50, (19, 37), generator=g, dtype=torch.int32))
    b = tp.from_torch(torch.rand(19, 37, generator=g) > 0.7)
    run_native(lambda i, j, b: (i.sum(0), i.amax(0), i.amin(0), i.argmax(0), i.prod(0), j.sum(0), j.amax(0),
                                b.sum(0), b.any(0), b.all(0), b.float().mean(0)), i, i32, b)


def test_parallel_blocks_of_columns():
    x = rnd(257, 300)                     # enough work for OpenMP: blocks of columns in parallel
    _, cf = run_native(lambda x: (x.sum(0), x.var(0), x.softmax(0)), x, n_red=257,
                       scale=(x._data.double().abs().sum(0), None, None))   # the sum's S is sum|a| (docs/testing.md)
    assert re.search(r"#pragma omp parallel for[^\n]*\n\s*for \(int64_t xm0_b", _src(cf)), _src(cf)
    # few columns, long columns: whichever mode gives more threads; assert the result only
    run_native(lambda x: (x.sum(0), x.argmax(0), x.var(0)), rnd(20000, 3), n_red=20000)


def test_masked_producers_pad_cat():
    import tensorplay.nn.functional as F
    x = rnd(9, 37)
    _, cf = run_native(lambda x: (F.pad(x, (1, 2)).sum(0), tp.cat([x, x * 2], 1).amax(0),
                                  F.pad(x, (0, 0, 2, 1)).argmin(0)), x, n_red=12)
    assert "(columns)" in _src(cf) and "tp_gather" not in _src(cf)
