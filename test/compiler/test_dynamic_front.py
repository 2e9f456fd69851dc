"""The front end of dynamic shapes (the chapter, §10.2–§10.3, exercises 28 and 39, Prop. 10.3):
tp.mark_dynamic and declared ranges, dynamic="auto" (the default), buckets with padding, unbacked
(data-dependent) sizes and tp.check.  A counting backend counts artifacts; every later call is
judged against eager."""
import os
import random
import sys
import warnings

import pytest
import sympy
import torch

import tensorplay as tp
from tensorplay.compiler.api import BackendCompilerError
from tensorplay.compiler.capture.proxy import CaptureError
from tensorplay.compiler.capture.tracer import capture
from tensorplay.compiler.specialize.shape_guards import build_input_guard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from dynamic_shapes import Counting  # noqa: E402


class StaticCounting(Counting):
    """A counting backend with static kernels (as Stax's today): it is handed static graphs."""
    dynamic_shapes = False


def _later(cf, f, *args, atol=1e-5):
    """Call twice (the first may be the capture run) and compare the later call with eager."""
    cf(*args)
    got, ref = cf(*args), f(*args)
    assert got.shape == ref.shape and torch.allclose(got._data, ref._data, atol=atol), (got, ref)


def _branch(x):
    if x.shape[0] % 8 == 0:
        return (x * 2).sum(-1)
    return (x + 1).sum(-1)


# ---- tp.mark_dynamic and declared ranges --------------------------------------------------------------
def test_mark_dynamic_range_lives_in_the_shape_env_and_implied_guards_are_dropped():
    def f(x):
        if x.shape[0] >= 2 and x.shape[0] <= 4096:     # both implied by [16, 1024]: no guard
            return x * 2
        return x
    x = tp.randn(64, 3)
    tp.mark_dynamic(x, 0, min=16, max=1024)
    cap = capture(f, (x,), {}, dynamic={}, input_names=["x"])   # dynamic=False/"auto": only the marked dim
    ph = next(n for n in cap.gm.graph.nodes if n.op == "placeholder")
    s0, s1 = ph.meta["val"].shape
    assert isinstance(s0, torch.SymInt) and s1 == 3
    vr = s0.node.shape_env.var_to_range[s0.node.expr]      # what a backend reads (Stax's index width)
    assert (int(vr.lower), int(vr.upper)) == (16, 1024)
    assert cap.symbolic.range_of(s0.node.expr * 2) == (32, 2048)
    assert cap.symbolic.guards() == []
    guard = build_input_guard(cap.symbolic)
    assert "(16 <= L[0]._data.shape[0] <= 1024)" in guard.source and "shape[0] >= 2)" not in guard.source
    assert "4096" not in guard.source
    assert guard([tp.randn(1024, 3)], [], [], []) is None
    why = guard([tp.randn(2000, 3)], [], [], [])
    assert "in [16, 1024]" in why and "tp.mark_dynamic(x, 0, min=16, max=1024)" in why
    assert "size[1]" in guard([tp.randn(64, 4)], [], [], [])      # dim 1 is static


def test_exercise_28_a_branch_no_range_implies_stays_a_runtime_check():
    """Exercise 28: ``if x.shape[0] % 8 == 0`` exported with sample 64 and n declared in [1, 1024]:
    (1) the guard ``Mod(n, 8) == 0`` is implied by no range, so it is a runtime check beside the
    range check (sizes 0 and 1 stay specialised: the range checked is [2, 1024]); (2) compiled for
    concrete shapes, sizes 1..64 give 64 specializations; with buckets (Prop. 10.3) 7 — {1}, {2},
    (2, 4], (4, 8], (8, 16], (16, 32], (32, 64]: ceil(log2 64) - floor(log2 1) + 1."""
    x = tp.randn(64, 5)
    tp.mark_dynamic(x, 0, min=1, max=1024)
    cap = capture(_branch, (x,), {}, dynamic={})
    guard = build_input_guard(cap.symbolic)
    assert "Eq(Mod(s" in guard.source and "% 8" in guard.source and "test_dynamic_front.py" in guard.source
    assert "(2 <= L[0]._data.shape[0] <= 1024)" in guard.source
    assert guard([tp.randn(16, 5)], [], [], []) is None
    assert guard([tp.randn(12, 5)], [], [], []).startswith("shape guard")
    assert "in [2, 1024]" in guard([tp.randn(2048, 5)], [], [], [])
    assert "in [2, 1024]" in guard([tp.randn(1, 5)], [], [], [])

    static, bucketed = Counting(), Counting()
    plain = lambda x: (x * 2).sum(-1)      # noqa: E731  (the branch aside: one version per bucket)
    cf_static = tp.compile(_branch, backend=static, dynamic=False, recompile_limit=100)
    cf_buckets = tp.compile(plain, backend=bucketed, dynamic=True, recompile_limit=100,
                            options={"dynamic.buckets": True})
    for n in range(1, 65):
        x = tp.randn(n, 5)
        _later(cf_static, _branch, x)
        _later(cf_buckets, plain, x)
    assert len(static.graphs) == 64
    assert len(bucketed.graphs) == 7
    # symbolic, with the branch and the declared range: 1, multiples of 8, the rest
    marked = Counting()
    cf = tp.compile(_branch, backend=marked, dynamic=False)
    for n in range(1, 65):
        x = tp.randn(n, 5)
        tp.mark_dynamic(x, 0, min=1, max=1024)
        _later(cf, _branch, x)
    assert len(marked.graphs) == 3


def test_marked_size_outside_its_range_is_an_error_unmarked_one_recompiles():
    backend = Counting()
    f = lambda x: x.exp().sum(-1)      # noqa: E731
    cf = tp.compile(f, backend=backend, dynamic=False)
    x = tp.randn(32, 4)
    tp.mark_dynamic(x, 0, min=16, max=64)
    _later(cf, f, x)
    _later(cf, f, tp.randn(48, 4))            # in the range: the same artifact
    assert len(backend.graphs) == 1
    _later(cf, f, tp.randn(100, 4))           # unmarked, outside: a miss that names the range
    assert len(backend.graphs) == 2
    assert "in [16, 64]" in cf.recompile_reasons[0][0]
    y = tp.randn(100, 4)
    tp.mark_dynamic(y, 0, min=16, max=64)
    with pytest.raises(ValueError, match=r"y.shape\[0\] is 100, outside the declared range \[16, 64\]"):
        capture(lambda y: y * 2, (y,), {}, dynamic={}, input_names=["y"])


def test_mark_dynamic_that_the_program_specialises_is_an_error():
    def f(x):
        return x * len(list(range(x.shape[0])))
    x = tp.randn(5, 2)
    tp.mark_dynamic(x, 0)
    with pytest.raises(CaptureError, match=r"marked dynamic .* specialised it to 5"):
        tp.compile(f, backend="eager")(x)


def test_mark_dynamic_bad_arguments():
    x = tp.randn(4, 3)
    with pytest.raises(IndexError):
        tp.mark_dynamic(x, 2)
    with pytest.raises(ValueError, match="min=9 > max=3"):
        tp.mark_dynamic(x, 0, min=9, max=3)
    with pytest.raises(TypeError):
        tp.mark_dynamic(torch.randn(3), 0)


# ---- dynamic="auto" ---------------------------------------------------------------------------------
def test_auto_is_the_default_static_first_then_the_dims_that_changed():
    backend = Counting()
    f = lambda x, w: (x @ w).relu() + x.shape[1]       # noqa: E731
    cf = tp.compile(f, backend=backend)
    assert cf.dynamic == "auto"
    w = tp.randn(6, 3)
    _later(cf, f, tp.randn(4, 6), w)
    assert backend.graphs[0].graph.size_symbols == {}                 # the first compile is static
    _later(cf, f, tp.randn(9, 6), w)                                  # dim 0 changed: now a symbol
    syms = backend.graphs[1].graph.size_symbols
    assert [(s.name, s.dim) for s in syms.values()] == [("x", 0)]     # only the dim that changed
    for n in (2, 17, 40):
        _later(cf, f, tp.randn(n, 6), w)
    assert len(backend.graphs) == 2
    reasons = cf.recompile_reasons[0][0]
    assert "size[0] expected 4, got 9" in reasons
    # dynamic=False keeps one specialization per size
    backend2 = Counting()
    cf2 = tp.compile(f, backend=backend2, dynamic=False)
    for n in (4, 9, 2, 17):
        _later(cf2, f, tp.randn(n, 6), w)
    assert len(backend2.graphs) == 4


def test_auto_on_a_method_is_kept():
    import tensorplay.nn as nn
    m = nn.Linear(3, 2)
    backend = Counting()
    cm = tp.compile(m, backend=backend)
    for n in (2, 5, 7, 11):
        x = tp.randn(n, 3)
        _later(cm, m, x)
    assert len(backend.graphs) == 2


def test_invalid_dynamic_value():
    with pytest.raises(ValueError, match="'auto'"):
        tp.compile(lambda x: x, dynamic="sometimes")


# ---- buckets (Prop. 10.3, §13 Prop. 13.5) -------------------------------------------------------------
# (the 1000-call sweep with buckets is test/stax/test_stax_symbolic_shapes.py's, the book's file)


def test_bucket_padding_for_a_static_backend_where_rows_are_independent():
    """A static-kernel backend compiles once per bucket when the program is row-independent along
    the bucketed dim (padded to the bucket's top, sliced back); otherwise once per size."""
    w = tp.randn(8)
    rows = lambda x: (x * w).relu() / x.exp().sum(-1, keepdim=True)        # noqa: E731
    cols = lambda x: (x * w).softmax(0)                                    # noqa: E731  (mixes the rows)
    opts = {"dynamic.buckets": True}
    for fn, padded in ((rows, True), (cols, False)):
        backend = StaticCounting()
        cf = tp.compile(fn, dynamic=True, backend=backend, recompile_limit=64, options=opts)
        sizes = [3, 4, 5, 7, 8, 9, 13, 16, 33, 60]
        for n in sizes:
            _later(cf, fn, tp.randn(n, 8))
        for g in backend.graphs:
            assert g.graph.size_symbols == {}                  # static graphs
        if padded:
            assert len(backend.graphs) == 4                    # (2, 4], (4, 8], (8, 16], (32, 64]
            tops = sorted(g.graph.placeholders[0].meta["val"].shape[0] for g in backend.graphs)
            assert tops == [4, 8, 16, 64]
        else:
            assert len(backend.graphs) == len(sizes)


def test_bucket_padding_with_stax_one_kernel_per_bucket():
    w = tp.randn(8)
    f = lambda x: (x * w).relu() * 2          # noqa: E731
    cf = tp.compile(f, dynamic=True, backend="stax", options={"dynamic.buckets": True})
    for n in (5, 6, 7, 8, 9, 12):
        _later(cf, f, tp.randn(n, 8))
    assert cf.counters["captures"] == 2


# ---- data-dependent sizes: unbacked symbols, exercise 39, tp.check ---------------------------------------
def _masked(x, w):
    y = x[x > 0]
    return (y * 2).sum() + (x.masked_select(x < 0).exp().sum()), y.shape[0]


@pytest.mark.parametrize("program", ["index_sum", "masked_select", "unique", "matmul", "size_only"])
def test_downstream_of_an_unbacked_size_compiles_once_and_equals_eager(program):
    def index_sum(x):
        y = x[x > 0]
        return (y * 2).sum() + y.shape[0]

    def masked_select(x):
        return x.masked_select(x < 0).exp().sum() * 3

    def unique(x):
        u = (x * 2).round().unique()
        return u.sum() + u.shape[0]

    def matmul(x):
        r = x[x.sum(-1) > 0]                  # rows with a positive sum: (u0, 4)
        return (r @ tp.ones(4, 3)).sum(0)
    def size_only(x):                         # only the count is used: DCE keeps the op that makes it
        return x * x[x > 0].shape[0]
    f = locals()[program]
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend)
    tp.manual_seed(1)
    for n in (6, 9, 6, 13):
        _later(cf, f, tp.randn(n, 4))
    assert len(backend.graphs) == 1
    assert any(s.index is None for s in backend.graphs[0].graph.size_symbols.values())   # an unbacked one


def test_exercise_39_a_branch_on_an_unbacked_size_says_how_to_rewrite():
    def f(x):
        idx = x[x > 0]
        if idx.shape[0] > 0:
            return idx.sum()
        return x.sum()
    with pytest.raises(CaptureError) as e:
        tp.compile(f, dynamic=True, backend="eager")(tp.randn(5))
    msg = str(e.value)
    assert "data-dependent size" in msg and "output of index" in msg and "tp.check(n > 0)" in msg
    assert "if idx.shape[0] > 0" in msg and "shape guard" in msg


def test_tp_check_records_the_fact_and_is_checked_on_every_call():
    def f(x):
        idx = x[x > 0]
        tp.check(idx.shape[0] > 0, "no positive element")
        if idx.shape[0] > 0:
            return idx.mean()
        return x.sum()
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend)
    for n in (5, 7, 9):
        _later(cf, f, tp.randn(n).abs() + 0.1)
    assert len(backend.graphs) == 1
    neg = -(tp.randn(5).abs() + 0.1)
    with pytest.raises(AssertionError, match="no positive element"):
        f(neg)                                 # eager: a plain assert
    with pytest.raises(AssertionError, match="no positive element"):
        cf(neg)                                # compiled: the fact's gate misses, the capture run asserts
    tp.check(True)
    with pytest.raises(AssertionError):
        tp.check(False)


def test_tp_check_of_input_sizes_is_a_shape_guard():
    def f(x):
        tp.check(x.shape[0] % 2 == 0)
        return x.view(-1, 2, x.shape[1]).sum(1)
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend)
    for n in (4, 8, 10):
        _later(cf, f, tp.randn(n, 3))
    assert len(backend.graphs) == 1
    assert "Mod(" in cf._cache[0].guard.source


def test_a_static_backend_with_unbacked_sizes_falls_back_with_the_reason():
    def f(x):
        return x[x > 0].exp().sum()
    cf = tp.compile(f, dynamic=True, backend=StaticCounting())
    with pytest.warns(RuntimeWarning, match=r"compiles static sizes only.*data-dependent sizes \(u\d+ \(dim 0 of "
                                            r"the output of index"):
        cf(tp.randn(6, 3))
    for n in (6, 11):
        _later(cf, f, tp.randn(n, 3))
    cf = tp.compile(f, dynamic=True, backend=StaticCounting(), strict_native=True)
    with pytest.raises(BackendCompilerError, match="data-dependent"):
        cf(tp.randn(6, 3))


def test_auto_keeps_data_dependent_sizes_as_shape_gates():
    """Unbacked symbols only with dynamic=True: under "auto" a branch on x[mask]'s size still
    works (the sample's size, checked by the shape gate), as with static shapes."""
    def f(x):
        idx = x[x > 0]
        if idx.shape[0] > 0:
            return idx.sum()
        return x.sum()
    cf = tp.compile(f, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (5, 8, 12):
            _later(cf, f, tp.randn(n))
