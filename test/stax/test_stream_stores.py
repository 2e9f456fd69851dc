"""Streaming (non-temporal) stores of large outputs (``choices.stream_stores``, docs/stax.md).

Buffers of at least ``choices.STREAM_STORE_MIN_BYTES`` (the last-level cache) are written with
``Vec::store_stream``; every parallel region then fences its threads' streaming stores before its
closing barrier, and the kernel fences once more at its end.  The tests lower the threshold to one
byte so that small tensors take the streaming path, and check every kernel shape of the code
generator (row kernels, reductions with a broadcast phase, the parallel vector loop of purely
elementwise kernels, serial kernels) against eager under the error model and bit for bit against
the same program compiled with plain stores; rows that end inside a 32-byte piece, slices off the
piece grid and column mode keep plain stores.
"""
import re

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler import config
from tensorplay.compiler.backends.stax.cpp import choices   # the CPU heuristics
from test_stax_ops import check_error_model, run_native

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return tp.from_torch(t.to(dtype) if dtype.is_floating_point else (t * 100).to(dtype))


def _src(cf):
    return cf._cache[0].artifact.source


def _plain(f, *args):
    """The result compiled with plain stores (threshold out of reach)."""
    with config.patch({"stax.cpp.stream_min_bytes": 1 << 62}):
        cf = tp.compile(f, strict_native=True)
        cf(*args)           # the first call captures (and runs eagerly)
        out = cf(*args)     # the second runs the artifact
        assert "store_stream" not in _src(cf)
        return out


@pytest.fixture
def stream_all(config_patch):
    config_patch("stax.cpp.stream_min_bytes", 1)


def _check(f, *args, n_red=1, parallel=True, scale=None):
    out, cf = run_native(f, *args, n_red=n_red, scale=scale)
    src = _src(cf)
    assert "store_stream(" in src, src
    # every parallel region fences before its closing barrier; the kernel fences at its end
    regions = src.count("#pragma omp parallel\n")
    assert regions == src.count("#pragma omp for") == src.count("nowait")
    assert "#pragma omp parallel for" not in src
    assert (regions > 0) == parallel, src
    assert src.count("tp::stream_fence();") >= regions + 1
    plain = _plain(f, *args)
    for a, b in zip(out if isinstance(out, tuple) else (out,), plain if isinstance(plain, tuple) else (plain,)):
        assert torch.equal(a._data.nan_to_num(), b._data.nan_to_num()) and torch.equal(a._data.isnan(), b._data.isnan())
    return src


def test_elementwise_parallel_vector_loop(stream_all):
    x = rnd(1 << 16)
    src = _check(lambda x: (x + 1, x.exp() * 2), x)
    assert re.search(r"#pragma omp for[^\n]* nowait\s*\n\s*for \(idx_t rm0_b", src), src


def test_row_kernels(stream_all):
    for shape in [(300, 2048), (7, 64)]:
        x = rnd(*shape)
        par = shape[0] * shape[1] >= choices.PARALLEL_MIN_WORK
        _check(lambda x: (x / x.abs().sum(-1, keepdim=True), F.softmax(x, -1)), x, n_red=shape[1], parallel=par)
        _check(lambda x: F.layer_norm(x, (shape[1],)), x, n_red=shape[1], parallel=par, scale=1.0)


@pytest.mark.parametrize("shape", [(256, 1004), (97, 13)])
def test_rows_ending_mid_piece_keep_plain_stores(stream_all, shape):
    """A row that ends inside a 32-byte piece has a plain tail store sharing a line with the
    following row's head: such stores stay plain (choices.STREAM_PIECE_BYTES, KernelGen._streamable)."""
    x = rnd(*shape)
    _, cf = run_native(lambda x: F.softmax(x, -1), x, n_red=shape[1])
    assert "store_stream" not in _src(cf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_of_whole_pieces_stream_their_tails(stream_all, dtype):
    """Rows of 1000 floats (4000 bytes: whole 32-byte pieces, every other row starting mid-line)
    stream every store, the row's masked tail too (storen_stream), so no line mixes plain and
    streaming stores; results equal the plain-store build bit for bit."""
    cols = 1000 if dtype == torch.float32 else 500
    x = rnd(64, cols, dtype=dtype)
    src = _check(lambda x: F.softmax(x, -1), x, n_red=cols, parallel=64 * cols >= choices.PARALLEL_MIN_WORK)
    if re.search(r"rm0 < %d\)" % cols, src):   # the vector width leaves a tail
        assert ".storen_stream(buf" in src, src
    assert not re.search(r"\.storen\(buf", src), src


def test_piece_rule_of_64_bytes_keeps_mid_line_rows_plain(stream_all, config_patch):
    """TP_STAX_STREAM_PIECE_BYTES=64 (the old rule): rows that start mid-line keep plain stores."""
    config_patch("stax.cpp.stream_piece_bytes", 64)
    _, cf = run_native(lambda x: F.softmax(x, -1), rnd(64, 1000), n_red=1000)
    assert "store_stream" not in _src(cf)


def test_slices_off_the_line_keep_plain_stores(stream_all):
    x = rnd(64, 128)
    _, cf = run_native(lambda x: tp.cat([x[:, :3], x * 2], 1), x)   # rows of 131 elements
    assert "store_stream" not in _src(cf)


def test_strided_and_transposed_inputs(stream_all):
    x = rnd(256, 320).t()
    _check(lambda x: (x * 3).relu().contiguous(), x)   # gathered loads, contiguous streamed stores
    _check(lambda x: x[:, ::2] + 1, rnd(400, 64), parallel=False)


def test_column_mode_keeps_plain_stores(stream_all):
    x = rnd(257, 320)
    _, cf = run_native(lambda x: (x.softmax(0), x.abs().sum(0)), x, n_red=257)
    kernels = _src(cf).split("async_compile.cpp(")[1:]
    col = [k for k in kernels if "(columns)" in k]
    assert col and all("store_stream" not in k for k in col)


def test_serial_kernel_fences_once(stream_all):
    x = rnd(7, 64)
    src = _check(lambda x: x * x - 1, x, parallel=False)
    assert src.count("tp::stream_fence();") == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64])
def test_other_dtypes(stream_all, dtype):
    x = rnd(128, 512, dtype=dtype)
    _check(lambda x: (x * 2 + 1, x.abs().sum(-1, keepdim=True) - x), x, n_red=512)


def test_off_by_default_for_small_buffers():
    x = rnd(64, 64)
    _, cf = run_native(lambda x: x + 1, x)
    assert "store_stream" not in _src(cf) and choices.STREAM_STORE_MIN_BYTES >= 1 << 20


def test_large_output_streams_with_default_threshold():
    """A buffer of the threshold's size streams without any patching (the table13 case)."""
    n = choices.STREAM_STORE_MIN_BYTES // 4
    x = rnd(n // 1024 + 1, 1024)
    cf = tp.compile(lambda x: x * 0.5 + 1, strict_native=True)
    cf(x)
    out = cf(x)
    assert "store_stream(" in _src(cf)
    check_error_model(out, x * 0.5 + 1, x.double() * 0.5 + 1)
