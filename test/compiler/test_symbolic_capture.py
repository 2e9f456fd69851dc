"""dynamic=True capture (capture/symbolic.py, specialize/shape_guards.py): input sizes become
symbols with the sample as hint, Python reads symbolic sizes, branches on them become shape
guards, the captured graph runs for other sizes, and the guard names what a call violates."""
import pytest
import sympy
import torch

import tensorplay as tp
from tensorplay.compiler.capture.tracer import capture
from tensorplay.compiler.specialize.shape_guards import build_input_guard


def _guard(cap):
    return build_input_guard(cap.symbolic)


def test_sizes_are_symbols_except_zero_and_one():
    seen = {}

    def f(x, y):
        seen["shape"] = x.shape
        return x.sum(0) + y.sum()
    x, y = tp.randn(64, 1, 8), tp.randn(64)
    cap = capture(f, (x, y), {}, dynamic=True)
    a0, a1 = [n for n in cap.gm.graph.nodes if n.op == "placeholder"]
    s = [cap.symbolic.expr(v) for v in a0.meta["sym"].shape]
    assert isinstance(s[0], sympy.Symbol) and s[1] == 1 and isinstance(s[2], sympy.Symbol)
    (t,) = [cap.symbolic.expr(v) for v in a1.meta["sym"].shape]
    assert isinstance(t, sympy.Symbol) and t != s[0]         # equal in the sample, but unrelated
    assert all(isinstance(v, torch.SymInt) for v in (seen["shape"][0], seen["shape"][2]))
    assert seen["shape"][1] == 1 and not isinstance(seen["shape"][1], torch.SymInt)
    assert [cap.symbolic.hint(v) for v in (s[0], s[2], t)] == [64, 8, 64]
    # the capture run returned eager's values, and the concrete metadata is untouched
    assert torch.allclose(cap.result._data, x._data.sum(0) + y._data.sum())
    assert tuple(a0.meta["val"].shape) == (64, 1, 8)


def test_broadcast_relates_sizes_and_the_graph_runs_for_other_sizes():
    def f(x, w):
        return (x + w).relu().view(-1, x.shape[1] * 2).sum(-1)
    x, w = tp.randn(64, 8), tp.randn(8)
    cap = capture(f, (x, w), {}, dynamic=True)
    a0, a1 = [n for n in cap.gm.graph.nodes if n.op == "placeholder"]
    assert cap.symbolic.expr(a1.meta["sym"].shape[0]) == cap.symbolic.expr(a0.meta["sym"].shape[1])
    code = cap.gm.code
    assert "= arg0.shape[0]" in code and "= arg0.shape[1]" in code
    view = next(n for n in cap.gm.graph.nodes if n.op == "call_function" and n.opdef.name == "view")
    assert not any(isinstance(a, int) and a == 16 for a in view.args[1])       # no sample size baked in
    guard = _guard(cap)
    for n, c in ((32, 8), (6, 5), (2, 3)):
        x2, w2 = tp.randn(n, c), tp.randn(c)
        assert guard([x2, w2], [], [], []) is None
        (out,) = cap.gm(x2, w2)
        ref = (x2._data + w2._data).relu().view(-1, c * 2).sum(-1)
        assert out.shape == ref.shape and torch.allclose(out._data, ref)
    why = guard([tp.randn(32, 8), tp.randn(5)], [], [], [])
    assert "arg 1" in why and "related by the program" in why


def test_shape_branch_is_a_guard_with_its_source_line():
    def f(x):
        if x.shape[0] % 8 == 0:
            return x * 2
        return x + 1
    cap = capture(f, (tp.randn(64, 3),), {}, dynamic=True)
    guard = _guard(cap)
    assert "Mod(" in guard.source and "test_symbolic_capture.py" in guard.source
    assert "% 8" in guard.source
    assert guard([tp.randn(16, 3)], [], [], []) is None
    why = guard([tp.randn(12, 3)], [], [], [])
    assert why.startswith("shape guard") and "expected True, got False" in why
    # a size of 1 breaks the 0/1 specialisation: named
    why = guard([tp.randn(1, 3)], [], [], [])
    assert "size[0]" in why and ">= 2" in why
    x = tp.randn(24, 3)
    (out,) = cap.gm(x)
    assert torch.allclose(out._data, x._data * 2)


def test_strides_are_expressions_of_the_sizes():
    def f(x):
        return x.exp()
    cap = capture(f, (tp.randn(6, 4),), {}, dynamic=True)
    guard = _guard(cap)
    assert guard([tp.randn(10, 7)], [], [], []) is None
    why = guard([tp.randn(7, 10).t()], [], [], [])          # same sizes, column-major: another layout
    assert "stride" in why


def test_static_capture_is_unchanged():
    cap = capture(lambda x: x.view(-1, x.shape[1] * 2), (tp.randn(4, 3),), {})
    assert cap.symbolic is None and cap.gm.graph.size_symbols == {}
    assert all("sym" not in n.meta for n in cap.gm.graph.nodes)
    assert "(-1, 6)" in cap.gm.code


@pytest.mark.parametrize("n", [5, 17])
def test_symbolic_sizes_behave_like_ints(n):
    got = {}

    def f(x):
        k = x.shape[0]
        got["arith"] = (k * 3 + 1) // 2
        got["cmp"] = bool(k > 3)      # decided on the hint: a guard k > 3
        return x[: k - 1].reshape(k - 1, -1)
    x = tp.randn(n, 2)
    cap = capture(f, (x,), {}, dynamic=True)
    assert isinstance(got["arith"], torch.SymInt) and got["cmp"] is True
    assert cap.symbolic.hint(cap.symbolic.expr(got["arith"])) == (n * 3 + 1) // 2   # (reading it adds no guard)
    guard = _guard(cap)
    assert guard([tp.randn(9, 2)], [], [], []) is None
    assert "shape guard" in guard([tp.randn(3, 2)], [], [], [])
    y = tp.randn(9, 2)
    (out,) = cap.gm(y)
    assert torch.equal(out._data, y._data[:8].reshape(8, -1))


def test_range_over_a_size_specialises_it():
    """``range(k)`` needs a concrete int: the size is specialised to its sample value by a guard
    (what PyTorch does too); the guard names it."""
    def f(x):
        return x * len(list(range(x.shape[0])))
    cap = capture(f, (tp.randn(5, 2),), {}, dynamic=True)
    guard = _guard(cap)
    assert guard([tp.randn(5, 2)], [], [], []) is None
    why = guard([tp.randn(9, 2)], [], [], [])
    assert why is not None and "5" in why
