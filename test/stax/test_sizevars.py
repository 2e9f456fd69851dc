"""sizevars.py: sizes as expressions — static answers equal integer arithmetic, symbolic answers
are proofs over the symbols' ranges, and the loop IR / plans hold sympy expressions."""
import random

import pytest
import sympy
import torch

import tensorplay as tp
from tensorplay.compiler.backends.eager import eager_backend
from tensorplay.compiler.backends.stax import plan_graph, sizevars
from tensorplay.compiler.backends.stax.ir import FixedLayout
from tensorplay.compiler.backends.stax.kernel_plan import _merge
from tensorplay.compiler.backends.stax.sizevars import SizeVarAllocator, SymbolicSizeError


def test_static_answers_are_integer_arithmetic():
    rng = random.Random(0)
    sv = SizeVarAllocator()
    for _ in range(300):
        a, b, m = rng.randint(-50, 50), rng.randint(-50, 50), rng.randint(1, 9)
        A, B = sympy.Integer(a), sympy.Integer(b)
        assert sv.size_hint(A * B + 3) == a * b + 3
        assert sv.evaluate_static_shape(A - B) == a - b
        assert sv.statically_known_equals(A, B) == (a == b)
        assert sv.statically_known_leq(A, B) == (a <= b)
        assert sv.statically_known_lt(A, B) == (a < b)
        assert sv.statically_known_multiple_of(A, m) == (a % m == 0)
        assert sv.statically_known_true(sympy.Le(A, B)) == (a <= b)
        assert sv.statically_known_true(sympy.Ne(A, B)) == (a != b)
    assert sv.contiguous_strides((2, 0, 3)) == (3, 3, 1)      # a size-0 dim counts as 1 (torch)
    assert sv.contiguous_strides((2, 0, 3)) == torch.empty(2, 0, 3).stride()
    assert sizevars.numel(()) == 1 and isinstance(sizevars.numel(()), sympy.Integer)


def test_sympify_rejects_non_integers():
    with pytest.raises(TypeError, match="integer"):
        sizevars.sympify(2.5)
    with pytest.raises(TypeError, match="integer"):
        sizevars.sympify(True)
    assert sizevars.sympify(torch.tensor(3).item()) == 3


def test_symbols_hints_and_proofs():
    sv = SizeVarAllocator()
    s = sv.symbol("s0", 8)
    t = sv.symbol("s1", 5, hi=10)
    assert sv.size_hint(s * t + 1) == 41
    assert sv.size_hints((s, t, 3)) == (8, 5, 3)
    # proofs hold for every value in the ranges (s >= 2, 2 <= t <= 10), not just the hints
    assert sv.statically_known_leq(2, s) and not sv.statically_known_lt(2, s)
    assert sv.statically_known_leq(t, 10) and not sv.statically_known_leq(t, 9)
    assert sv.statically_known_leq(s, s * t) and sv.statically_known_lt(s, 2 * s)
    assert not sv.statically_known_leq(s, t)       # true at the hints? no: 8 > 5; and unproved anyway
    assert not sv.statically_known_leq(t, s)       # true at the hints (5 <= 8) but not for every s
    assert sv.statically_known_equals(s * (t + 1), s * t + s)
    assert not sv.statically_known_equals(s, t)
    assert sv.statically_known_multiple_of(4 * s + 8, 4) and not sv.statically_known_multiple_of(4 * s + 2, 4)
    assert not sv.statically_known_multiple_of(s, 2)     # s = 8 at the hint, but not for every s
    assert sv.is_size_expr(sympy.floor(s / 2) + t) and not sv.is_size_expr(s + sympy.Symbol("x0"))
    assert sv.contiguous_strides((s, t, 3)) == (3 * t, 3, 1)
    with pytest.raises(SymbolicSizeError, match="s0"):
        sv.evaluate_static_shape(s + 1)
    assert sv.evaluate_static_shape(s - s + 4) == 4


def test_symbol_ranges_follow_the_zero_one_specialisation():
    sv = SizeVarAllocator()
    with pytest.raises(ValueError, match="0 and 1"):
        sv.symbol("s0", 3, lo=1)
    with pytest.raises(ValueError, match="outside"):
        sv.symbol("s0", 12, hi=10)
    sv.symbol("s0", 3)
    with pytest.raises(ValueError, match="already"):
        sv.symbol("s0", 4)


def test_guard_equals_proves_or_records():
    sv = SizeVarAllocator()
    s, t = sv.symbol("s0", 6), sv.symbol("s1", 6)
    assert sv.guard_equals(2 * s, s + s) == 2 * s and sv.guards == []
    sv.guard_equals(s, t)                                 # equal at the hints only: a guard
    assert sv.guards == [sympy.Eq(s, t)]
    with pytest.raises(ValueError, match="differ"):
        sv.guard_equals(s, t + 1)


def test_loop_merge_is_proved_for_symbolic_sizes():
    """Prop. 6.3 with a symbolic size: (4, s) contiguous merges into one loop of 4*s; a padded row
    stride s + 1 does not merge."""
    sv = SizeVarAllocator()
    s = sv.symbol("s0", 7)
    x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    with sizevars.use(sv):
        assert sizevars.current() is sv
        (loop,) = _merge([x0, x1], [4, s], [s * x0 + x1], "xm")
        assert sympy.expand(loop.size - 4 * s) == 0 and loop.merged == (x0, x1)
        loops = _merge([x0, x1], [4, s], [(s + 1) * x0 + x1], "xm")
        assert [lp.size for lp in loops] == [4, s]
    assert sizevars.current() is not sv


def test_ir_layouts_and_plans_hold_expressions():
    got = []

    def backend(gm, example_inputs, **kw):
        got.append(plan_graph(gm, example_inputs))
        return eager_backend(gm, example_inputs)
    x, w = tp.randn(6, 10), tp.randn(10)
    out = tp.compile(lambda a, b: (a + b).relu().sum(-1), backend=backend)(x, w)
    assert torch.allclose(out._data, (x._data + w._data).relu().sum(-1))
    ((g, sched, plans),) = got
    for b in list(g.inputs) + list(g.buffers):
        assert all(isinstance(v, sympy.Expr) for v in b.layout.size + b.layout.stride + (b.layout.offset,))
    assert [tuple(b.layout.size) for b in g.inputs] == [(6, 10), (10,)]
    assert g.sizevars.symbols == frozenset()               # static shapes: no symbols
    (plan,) = plans
    assert all(isinstance(lp.size, sympy.Expr) for lp in plan.outer_loops + plan.inner_loops)
    assert [lp.size for lp in plan.outer_loops] == [6] and [lp.size for lp in plan.inner_loops] == [10]
    assert all(isinstance(f.extent, sympy.Expr) for f in plan.buffers.values())
    assert {k: f.extent for k, f in plan.buffers.items() if k.startswith("arg")} == {"arg0": 60, "arg1": 10}


def test_layout_converts_and_counts():
    lay = FixedLayout(torch.float32, torch.device("cpu"), (3, 0), (1, 3))
    assert all(isinstance(v, sympy.Integer) for v in lay.size + lay.stride) and lay.offset == 0
    assert lay.numel == 0 and lay.storage_extent() == 0
    lay = FixedLayout(torch.float32, torch.device("cpu"), (3, 4), (1, 3), 2)
    assert lay.storage_extent() == torch.empty_strided((3, 4), (1, 3)).untyped_storage().nbytes() // 4 + 2


def test_equality_guards_of_the_capture_are_facts():
    """An equality the capture guarded (here ``a0*a1 == b0*b1``: two flattened inputs an op needs
    equal) proves bounds that the ranges alone cannot; without the guard it is no fact."""
    from tensorplay.compiler.capture.symbolic import SymbolicShapes
    sym = SymbolicShapes()
    a = sym.input_fake(torch.randn(4, 6), "a", 0, "a")
    b = sym.input_fake(torch.randn(3, 8), "b", 1, "b")
    sv = SizeVarAllocator()
    na, nb = sv.from_torch(a.shape[0] * a.shape[1]), sv.from_torch(b.shape[0] * b.shape[1])
    assert not sv.statically_known_leq(nb, na) and sv.equalities() == []
    assert a.shape[0] * a.shape[1] == b.shape[0] * b.shape[1]      # the capture's guard
    assert sv.equalities() and sv.statically_known_leq(nb, na) and sv.statically_known_leq(na - 1, nb - 1)
    assert not sv.statically_known_lt(nb, na)
