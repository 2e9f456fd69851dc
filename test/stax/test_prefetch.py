"""Block prefetch and split loads of a cheap loop's read streams from memory
(``cpp/choices.py``: ``prefetch_chunk``, ``split_loads``).

With split loads on (the default), a cheap loop reading from memory loads its streams with
``Vec::load_split`` (each 64-byte chunk as two 32-byte loads) and gets no block prefetch; with
``TP_STAX_SPLIT_LOADS=0`` it gets the block prefetch instead.  Both only change how memory is
read, never a value: results are compared bit for bit with the program compiled without them.

A vector loop that reads one or two streams of buffers at least the last-level cache, stores to no
large buffer and computes little per element (a row sum or max, ex 1.1) asks for the next chunk of
each stream at the start of every chunk (``tp::prefetch_block``).  The tests lower the "from
memory" size to one byte so that small tensors qualify, check which loops get the prefetch, and
check the results against eager under the error model and bit for bit against the same program
compiled without it (a prefetch is a hint: it never changes a value).  Also the other choice for
memory-bound kernels: the schedule clause of their parallel loops (``cpp/choices.py``: ``omp_schedule``).
"""
import re

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler import config
from tensorplay.compiler.backends.stax.cpp import choices   # the CPU heuristics
from test_stax_ops import run_native

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def rnd(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return tp.from_torch(t.to(dtype) if dtype.is_floating_point else (t * 100).to(dtype))


@pytest.fixture
def all_from_memory(config_patch):
    """Every buffer counts as read from memory; split loads off (the block prefetch path)."""
    config_patch("stax.cpp.stream_min_bytes", 1)
    config_patch("stax.cpp.split_loads", False)


@pytest.fixture
def split_from_memory(config_patch):
    config_patch("stax.cpp.stream_min_bytes", 1)
    config_patch("stax.cpp.split_loads", True)


def _without_split(f, *args):
    return _compiled_without("stax.cpp.split_loads", False, "load_split", f, *args)


def _src(cf):
    return cf._cache[0].artifact.source


def _compiled_without(knob, off, absent, f, *args):
    """``f(*args)`` compiled with the knob ``knob`` = ``off``; its source has no ``absent``."""
    with config.patch({knob: off}):
        cf = tp.compile(f, strict_native=True)
        cf(*args)
        out = cf(*args)
        assert absent not in _src(cf)
        return out


def _without_prefetch(f, *args):
    return _compiled_without("stax.cpp.prefetch_bytes", 0, "prefetch_block", f, *args)


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for u, v in zip(a, b):
        assert torch.equal(u.torch(), v.torch())


@pytest.mark.parametrize("case", ["sum", "amax", "argmax", "int64 sum", "mean of a slice", "any"])
def test_cheap_row_reductions_prefetch_their_stream(all_from_memory, case):
    x = rnd(24, 3000)          # several chunks of 1024 elements per row, and a tail
    fns = {"sum": (lambda x: x.sum(-1), x, 3000),
           "amax": (lambda x: x.amax(-1), x, 1),
           "argmax": (lambda x: x.argmax(-1), x, 1),
           "int64 sum": (lambda x: x.sum(-1), rnd(24, 3000, dtype=torch.int64), 1),
           "mean of a slice": (lambda x: x[:, 5:2900].mean(-1), x, 2895),
           "any": (lambda x: (x > 2.5).any(-1), x, 1)}
    f, a, n_red = fns[case]
    out, cf = run_native(f, a, n_red=n_red, scale=float(a.torch().abs().double().sum(-1).max()))
    src = _src(cf)
    calls = re.findall(r"if \(\((rm\d+) & (\d+)\) == 0\) \{ (tp::prefetch_block\([^}]*)\}", src)
    assert len(calls) == 1, src
    _, mask, call = calls[0]
    chunk = int(mask) + 1
    assert chunk == choices.prefetch_chunk(1, False, []) and chunk & (chunk - 1) == 0 and chunk >= 256
    # one stream, the whole chunk in bytes of its dtype
    assert call.count("prefetch_block") == 1
    assert call.strip().endswith(f", {chunk * a.torch().element_size()});")
    _same(out, _without_prefetch(f, a))


@pytest.mark.parametrize("case", ["three streams", "exp in the loop", "store beside the read", "welford",
                                  "small input"])
def test_other_loops_do_not_prefetch(all_from_memory, config_patch, case):
    x, y = rnd(24, 3000), rnd(24, 3000, seed=1)
    fns = {"three streams": (lambda x, y: (x * y * x.flip(0)).sum(-1), (x, y), 3000),
           "exp in the loop": (lambda x: x.exp().sum(-1), (x,), 3000),
           "store beside the read": (lambda x: x + 1, (x,), 1),
           "welford": (lambda x: x.var(-1), (x,), 3000),
           "small input": (lambda x: x.sum(-1), (x,), 3000)}
    f, a, n_red = fns[case]
    if case == "small input":
        config_patch("stax.cpp.stream_min_bytes", x.torch().nbytes + 1)
    scale = float(sum(t.torch().abs().double().exp().sum() for t in a))
    out, cf = run_native(f, *a, n_red=n_red, scale=scale)
    assert "prefetch_block" not in _src(cf)


def test_two_streams_share_the_block(all_from_memory):
    """ex 1.1: two read streams, each prefetched half the bytes at the same chunk boundaries."""
    x, w = rnd(24, 3000), rnd(24, 3000, seed=1)

    def f(x, w):
        return ((x + w).relu() * 2).sum(-1)
    out, cf = run_native(f, x, w, n_red=3000, scale=float((x.torch().abs() + w.torch().abs()).double().sum(-1).max() * 2))
    calls = re.findall(r"tp::prefetch_block\((arg\d) \+ [^,]*, (\d+)\)", _src(cf))
    chunk = choices.prefetch_chunk(2, False, [])
    assert sorted(calls) == [("arg0", str(chunk * 4)), ("arg1", str(chunk * 4))]
    assert chunk * 4 * 2 == max(1024, choices.PREFETCH_BYTES // 2) * 2
    _same(out, _without_prefetch(f, x, w))


def test_softmax_prefetches_only_its_first_pass(all_from_memory):
    """The max pass reads the row from memory; the later passes find it in cache (and store)."""
    import tensorplay.nn.functional as F
    x = rnd(16, 1000)
    out, cf = run_native(lambda x: F.softmax(x, -1), x)
    src = _src(cf)
    assert src.count("prefetch_block") == 1
    first = src.index("// phase 0")
    assert first < src.index("prefetch_block") < src.index("// phase 1")
    _same(out, _without_prefetch(lambda x: F.softmax(x, -1), x))


def test_prefetch_of_a_flat_parallel_reduction_and_size_zero(all_from_memory):
    x = rnd(50000)
    out, cf = run_native(lambda x: x.sum(), x, n_red=50000, scale=float(x.torch().abs().double().sum()))
    _same(out, _without_prefetch(lambda x: x.sum(), x))
    z = rnd(0, 3000)
    out, cf = run_native(lambda x: x.sum(-1), z, n_red=3000, scale=1.0)
    assert tuple(out.shape) == (0,)


def test_parallel_loops_over_memory_are_guided_unless_stored_plainly(config_patch):
    """choices.omp_schedule: static by default (no clause); with ``TP_STAX_OMP_SCHEDULE="guided,
    16"``, parallel loops of a kernel with buffers from memory get ``schedule(guided, 16)`` (a slow
    thread takes less work), while a kernel that writes such a buffer with plain stores, and one
    whose buffers all fit in cache, keep the static split.  The schedule only decides which thread
    computes a row: results are bit for bit the same."""
    import tensorplay.nn.functional as F
    x = rnd(64, 1024)
    config_patch("stax.cpp.stream_min_bytes", 1)
    cf = tp.compile(lambda x: x.sum(-1), strict_native=True)
    cf(x)
    assert "schedule(" not in _src(cf) and "#pragma omp parallel for" in _src(cf)   # the default
    config_patch("stax.cpp.omp_schedule", "guided, 16")

    def compiled(f, *args):
        cf = tp.compile(f, strict_native=True)
        cf(*args)
        return cf(*args), _src(cf)
    plain = lambda x: F.softmax(x, -1)         # noqa: E731  rows of 1001: off the 32-byte piece grid, no streaming
    for f, a, guided in ((lambda x: x.sum(-1), x, True), (lambda x: x + 1, x, True),
                         (lambda x: x / x.sum(-1, keepdim=True), x, True), (plain, rnd(64, 1001), False)):
        config_patch("stax.cpp.stream_min_bytes", 1)       # every buffer "from memory"
        out, src = compiled(f, a)
        pragmas = re.findall(r"#pragma omp (?:parallel )?for[^\n]*", src)
        assert pragmas and all(("schedule(guided, 16)" in p) == guided for p in pragmas), (pragmas, guided)
        config_patch("stax.cpp.omp_schedule", "static")
        static, src2 = compiled(f, a)
        assert "schedule(" not in src2
        _same(out, static)
        config_patch("stax.cpp.omp_schedule", "guided, 16")
    # buffers that fit in the last-level cache: static (small kernels between ATen calls)
    config_patch("stax.cpp.stream_min_bytes", 1 << 62)
    out, src = compiled(lambda x: x.sum(-1), x)
    assert "#pragma omp parallel for\n" in src and "schedule(" not in src


_CHEAP = {"sum": (lambda x: x.sum(-1), 3000), "amax": (lambda x: x.amax(-1), 1),
          "argmax": (lambda x: x.argmax(-1), 1), "mean of a slice": (lambda x: x[:, 5:2900].mean(-1), 2895),
          "any": (lambda x: (x > 2.5).any(-1), 1)}


@pytest.mark.parametrize("case", [*_CHEAP, "int64 sum", "float64 sum"])
def test_cheap_row_reductions_split_their_stream_loads(split_from_memory, case):
    """Every unit-stride load of the stream in the main vector loop (unrolled copies included) is
    a load_split; no block prefetch; the same bits as 64-byte loads."""
    x = rnd(24, 3000)
    if case in _CHEAP:
        (f, n_red), a = _CHEAP[case], x
    else:
        f, n_red, a = (lambda x: x.sum(-1)), 1, rnd(24, 3000, dtype=torch.int64 if "int" in case else torch.float64)
    out, cf = run_native(f, a, n_red=n_red, scale=float(a.torch().abs().double().sum(-1).max()))
    src = _src(cf)
    assert "prefetch_block" not in src
    start = src.index("for (; rm0 + ")                                    # the main (unrolled) loop
    main = src[start:src.index("for (; rm0 + VL", start + 1)] if "for (; rm0 + VL" in src[start + 1:] \
        else src[start:src.index("if (rm0 <")]
    assert main.count("load_split(arg0") >= 1 and "::load(arg0" not in main, main
    _same(out, _without_split(f, a))


def test_two_streams_split_and_softmax_splits_only_its_first_pass(split_from_memory):
    import tensorplay.nn.functional as F
    x, w = rnd(24, 3000), rnd(24, 3000, seed=1)

    def f(x, w):
        return ((x + w).relu() * 2).sum(-1)
    out, cf = run_native(f, x, w, n_red=3000, scale=float((x.torch().abs() + w.torch().abs()).double().sum(-1).max() * 2))
    src = _src(cf)
    assert "load_split(arg0" in src and "load_split(arg1" in src and "prefetch_block" not in src
    _same(out, _without_split(f, x, w))
    s = rnd(16, 1000)
    out, cf = run_native(lambda x: F.softmax(x, -1), s)
    src = _src(cf)
    assert "load_split(" in src and src.index("// phase 0") < src.index("load_split(") < src.index("// phase 1")
    assert "load_split(" not in src[src.index("// phase 1"):]           # later passes read from cache
    _same(out, _without_split(lambda x: F.softmax(x, -1), s))


@pytest.mark.parametrize("case", ["three streams", "exp in the loop", "store beside the read", "welford"])
def test_other_loops_do_not_split(split_from_memory, case):
    x, y = rnd(24, 3000), rnd(24, 3000, seed=1)
    fns = {"three streams": (lambda x, y: (x * y * x.flip(0)).sum(-1), (x, y), 3000),
           "exp in the loop": (lambda x: x.exp().sum(-1), (x,), 3000),
           "store beside the read": (lambda x: x + 1, (x,), 1),
           "welford": (lambda x: x.var(-1), (x,), 3000)}
    f, a, n_red = fns[case]
    scale = float(sum(t.torch().abs().double().exp().sum() for t in a))
    out, cf = run_native(f, *a, n_red=n_red, scale=scale)
    assert "load_split" not in _src(cf)
