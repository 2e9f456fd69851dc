"""Data-dependent (indirect) indices in Stax kernels: gather, index_select, ``x[idx]``, embedding,
take_along_dim, index_fill, over sources that are index maps with masks (cat, pad, roll, flip).

Rules checked (docs/stax.md "Masked and indirect loads"):
* each loaded index is checked in the kernel against its dim; negative values wrap only where
  PyTorch wraps (``x[idx]``, index_fill), and a bad value makes the call raise ``IndexError``
  naming the op, the value and the size -- on a later call too, never an out-of-bounds read;
* bounds.py reads a checked index as a variable over ``[0, size)`` that the load's mask clamps,
  so ``cat([a, b]).gather(0, i)`` (``b[i - 2]`` where ``2 <= i < 5``) is proved in range
  (regression: it was refused under strict_native, "cannot prove access arg1[IndirectIndex(0, 5)
  - 2] in [0, 3)");
* an indirect access bounds.py still cannot prove gets a run-time check of its element offsets
  (``CppHandler._checked_gather``) instead of a refusal.

Every compiled function is called at least twice with in-range indices (the first call is the
eager capture) and compared with eager bit for bit (gathers copy values).
"""
import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler.backends.stax.op_lowerings import view_rules

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py

# sources of 7 rows (dim 0) built from a (4, 6) and a (3, 6) input; every one is an index map
SOURCES = {
    "plain": lambda a, b: tp.cat([a, b]) * 1.0,
    "cat": lambda a, b: tp.cat([a, b]),
    "cat3": lambda a, b: tp.cat([b[:1], a, b[1:]]),
    "pad": lambda a, b: F.pad(a.t(), (1, 2)).t(),
    "roll": lambda a, b: tp.cat([a, b]).roll(3, 0),
    "flip": lambda a, b: tp.cat([a, b]).flip(0),
}
# op -> (f(source, i), wraps negative indices like PyTorch)
OPS = {
    "gather": (lambda s, i: s.gather(0, i[:, None].expand(i.shape[0], 6)), False),
    "index_select": (lambda s, i: s.index_select(0, i), False),
    "index": (lambda s, i: s[i], True),
    "embedding": (lambda s, i: F.embedding(i, s), False),
    "take_along_dim": (lambda s, i: tp.take_along_dim(s, i[:, None].expand(i.shape[0], 6), 0), True),
    "index_fill": (lambda s, i: s.index_fill(0, i, 2.5), True),
}
ROWS = 7


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(4, 6, generator=g)), tp.from_torch(torch.randn(3, 6, generator=g))


def _idx(vals):
    return tp.from_torch(torch.tensor(vals, dtype=torch.int64))


@pytest.mark.parametrize("src", sorted(SOURCES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_indirect_op_in_range_and_out_of_range(op, src):
    fn, wraps = OPS[op]
    sf = SOURCES[src]

    def f(a, b, i):
        return fn(sf(a, b), i)
    cf = tp.compile(f, strict_native=True)
    gen = torch.Generator().manual_seed(1)
    for seed in range(3):
        a, b = _inputs(seed)
        vals = torch.randint(-ROWS if wraps else 0, ROWS, (5,), generator=gen).tolist()
        vals[0], vals[1] = ROWS - 1, 0        # both ends of the range
        i = _idx(vals)
        assert torch.equal(cf(a, b, i)._data, f(a, b, i)._data), (op, src, vals)
    a, b = _inputs(9)
    bad_values = [ROWS, ROWS + 5, -ROWS - 1] + ([] if wraps else [-1])
    for bad in bad_values:
        i = _idx([0, 1, bad, 2, 3])        # same shape: the compiled artifact runs, no re-capture
        with pytest.raises(IndexError, match=rf"tp\.{op}: index {bad} is out of (bounds|range)"):
            cf(a, b, i)
        with pytest.raises(IndexError, match=rf"index {bad} is out of (bounds|range)"):
            f(a, b, i)
    assert cf.counters["captures"] == 1


def test_gather_from_cat_is_native():
    # the reproducer (refused under strict_native before)
    f = lambda a, b, i: tp.cat([a, b]).gather(0, i)
    cf = tp.compile(f, strict_native=True)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        a, b = tp.from_torch(torch.randn(2, generator=g)), tp.from_torch(torch.randn(3, generator=g))
        i = _idx([0, 4, 2] if seed == 0 else torch.randint(0, 5, (3,), generator=g).tolist())
        assert torch.equal(cf(a, b, i)._data, torch.cat([a._data, b._data]).gather(0, i._data))
    with pytest.raises(IndexError, match=r"tp\.gather: index 5 is out of bounds for dimension 0 with size 5"):
        cf(a, b, _idx([0, 5, 2]))
    with pytest.raises(IndexError, match=r"tp\.gather: index -1 is out of bounds for dimension 0 with size 5"):
        cf(a, b, _idx([0, -1, 2]))


def test_gather_along_dim1_from_cat_and_nested_gathers():
    a0, c0 = torch.randn(4, 6), torch.randn(4, 5)

    def f(a, c, i):
        s = tp.cat([a, c], 1)                                 # 11 columns
        return s.gather(1, i), tp.cat([a[0], c[0]]).gather(0, tp.cat([i[0], i[1]]).gather(0, i[0] % 6))
    cf = tp.compile(f, strict_native=True)
    a, c = tp.from_torch(a0), tp.from_torch(c0)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        i = tp.from_torch(torch.randint(0, 11, (4, 3), generator=g))
        for got, want in zip(cf(a, c, i), f(a, c, i)):
            assert torch.equal(got._data, want._data)
    i = torch.randint(0, 11, (4, 3), generator=g)
    i[2, 1] = 11
    with pytest.raises(IndexError, match=r"tp\.gather: index 11 is out of bounds for dimension 1 with size 11"):
        cf(a, c, tp.from_torch(i))


def test_unproved_indirect_access_gets_a_runtime_offset_check(monkeypatch):
    """A lowering whose check is too weak (here: gather checked against size + 3) leaves an access
    bounds.py cannot prove: the kernel checks the element offsets at run time instead of being
    refused, in-range results stay right, and an index past the buffer raises IndexError instead
    of reading out of bounds."""
    orig = view_rules._checked

    def weak(value, size, op, dim, wrap=False, message=None):
        return orig(value, size + 3, op, dim, wrap, message)
    monkeypatch.setattr(view_rules, "_checked", weak)
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")     # compile this graph afresh, and do not keep it
    f = lambda x, i: x.gather(0, i) * 2          # noqa: E731
    cf = tp.compile(f, strict_native=True)
    x = tp.from_torch(torch.randn(5, generator=torch.Generator().manual_seed(4)))
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        i = tp.from_torch(torch.randint(0, 5, (19,), generator=g))
        assert torch.equal(cf(x, i)._data, x._data.gather(0, i._data) * 2)
    for pos, bad in ((0, 6), (17, 7), (18, 5)):
        vals = [1] * 19
        vals[pos] = bad
        with pytest.raises(IndexError, match=rf"tp\.gather: element offset {bad} is out of bounds for arg0 of 5 "):
            cf(x, _idx(vals))
    vals = [1] * 19
    vals[3] = 8          # fails the (weak) index check itself
    with pytest.raises(IndexError, match=r"tp\.gather: index 8 is out of bounds"):
        cf(x, _idx(vals))


@pytest.mark.parametrize("name", ["scatter_add", "index_add"])
def test_scatter_like_externs_raise_for_bad_indices(name):
    """scatter/index_add are extern kernels (ATen), which check their indices: a bad index on a
    later call raises, it does not crash."""
    def f(x, i, v):
        if name == "scatter_add":
            return (x * 2).scatter_add(0, i, v) + 1
        return (x * 2).index_add(0, i, v) + 1
    cf = tp.compile(f, strict_native=True)
    x, v = tp.randn(5), tp.randn(3)
    for _ in range(2):
        i = _idx([0, 4, 2])
        assert torch.allclose(cf(x, i, v)._data, f(x, i, v)._data)
    with pytest.raises((IndexError, RuntimeError), match=r"out of (bounds|range)"):
        cf(x, _idx([0, 5, 2]), v)
