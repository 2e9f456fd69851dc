"""Kernel plans (kernel_plan.py, cpp/plan.py): the chapter's examples 1.1, 7.1 and 7.2 are
planned -- loops and their merges, phases, placements, where values live, reduction kinds, every
buffer read and written with its index expression -- without generating any C++ (the printer is
patched to raise), and ``TP_STAX_DEBUG=plan`` prints the plans.
"""
import os
import sys

import pytest
import sympy

import tensorplay as tp
from tensorplay.compiler import config
from tensorplay.compiler.backends.eager import eager_backend
from tensorplay.compiler.backends.stax import plan_graph
from tensorplay.compiler.backends.stax.cpp import kernel as cpp, plan as cpp_plan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from read_generated_code import ex11, ex71, ex72  # noqa: E402  (the chapter's examples, experiment 2)

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


@pytest.fixture(autouse=True)
def no_cpp(request):
    """Planning must not print C++: the printer raises if anything calls it (except in the
    test of TP_STAX_DEBUG=plan, which compiles)."""
    def refuse(*args, **kw):
        raise AssertionError("the C++ printer was called while planning")
    with pytest.MonkeyPatch.context() as mp:
        if request.function.__name__ != "test_debug_plan_prints_every_plan":
            mp.setattr(cpp, "generate_kernel", refuse)
            mp.setattr(cpp.KernelGen, "__init__", refuse)
        yield


def plans_of(fn, *args):
    """The KernelPlans of ``fn``'s graph (captured by tp.compile, planned, run in eager)."""
    got = []

    def backend(gm, example_inputs, **kw):
        got.append(plan_graph(gm, example_inputs)[2])
        return eager_backend(gm, example_inputs)
    tp.compile(fn, backend=backend)(*args)
    (plans,) = got
    return plans


def same(e, expected):
    return sympy.expand(sympy.sympify(e) - expected) == 0


def reads(plan):
    """{(buffer, node): index over the loop variables} of the plan's loads."""
    return {(a.buffer, a.node): plan.translate(a.index) for a in plan.reads}


def test_example_1_1_one_reduction_reads_both_inputs():
    (plan,) = plans_of(ex11, tp.randn(64, 128), tp.randn(64, 128))
    assert plan.iteration == ((64,), (128,))
    (xl,), (rl,) = plan.outer_loops, plan.inner_loops
    (x0,), (r0,) = plan.index_vars
    assert (xl.size, xl.merged, rl.size, rl.merged) == (64, (x0,), 128, (r0,))
    assert [ph.nodes for ph in plan.phases] == [("buf0",)]
    (node,) = plan.nodes.values()
    assert (node.placement, node.phase, node.storage) == ("reduce", 0, "memory")
    assert (node.reduction.kind, node.reduction.leader, str(node.reduction.acc_dtype)) == ("sum", "buf0", "torch.float32")
    r = reads(plan)
    assert set(r) == {("arg0", "buf0"), ("arg1", "buf0")}      # relu(x + w) * 2 is inlined: no buffer
    assert all(same(e, 128 * xl.var + rl.var) for e in r.values())
    (w,) = plan.writes
    assert w.buffer == "buf0" and same(plan.translate(w.index), xl.var)
    assert plan.locals == frozenset() and plan.scratch == () and not plan.column_candidate
    assert str(plan.index_dtype) == "torch.int32" and not plan.checked_loads


def test_example_1_1_merges_the_outer_loops_of_a_contiguous_input():
    """Prop. 6.3: the two outer dims of a (4, 16, 128) input merge into one loop of 64 rows."""
    (plan,) = plans_of(ex11, tp.randn(4, 16, 128), tp.randn(4, 16, 128))
    (x0, x1), (r0,) = plan.index_vars
    (xl,), (rl,) = plan.outer_loops, plan.inner_loops
    assert (xl.size, xl.merged) == (64, (x0, x1)) and (rl.size, rl.merged) == (128, (r0,))
    assert plan.substitution == {x0: 0, x1: xl.var, r0: rl.var}
    assert all(same(e, 128 * xl.var + rl.var) for e in reads(plan).values())


def test_example_1_1_transposed_input_does_not_merge():
    x = tp.randn(16, 4, 128).permute(1, 0, 2)                     # (4, 16, 128) with strides (128, 512, 1)
    (plan,) = plans_of(ex11, x, tp.randn(4, 16, 128))
    assert [lp.size for lp in plan.outer_loops] == [4, 16]
    a, b = (lp.var for lp in plan.outer_loops)
    r = reads(plan)
    assert same(r[("arg0", "buf0")], 128 * a + 512 * b + plan.inner_loops[0].var)
    assert same(r[("arg1", "buf0")], 2048 * a + 128 * b + plan.inner_loops[0].var)


def test_example_7_1_the_row_sum_stays_in_a_register_and_a_second_phase_reads_it():
    (plan,) = plans_of(ex71, tp.randn(64, 128))
    (xl,), (rl,) = plan.outer_loops, plan.inner_loops
    assert [(ph.inner, ph.reductions, ph.outer) for ph in plan.phases] == [(("buf0",), ("buf0",), ()),
                                                                            (("buf1",), (), ())]
    s, out = plan.nodes["buf0"], plan.nodes["buf1"]
    assert (s.placement, s.phase, s.storage, s.store, s.reduction.kind) == ("reduce", 0, "register", None, "sum")
    assert (out.placement, out.phase, out.storage, out.reduction) == ("inner", 1, "memory", None)
    assert plan.locals == {"buf0"}
    r = reads(plan)
    assert set(r) == {("arg0", "buf0"), ("arg0", "buf1"), ("buf0", "buf1")}
    assert same(r[("arg0", "buf0")], 128 * xl.var + rl.var) and same(r[("arg0", "buf1")], 128 * xl.var + rl.var)
    assert same(r[("buf0", "buf1")], xl.var)                          # a row value, read by row
    assert [w.buffer for w in plan.writes] == ["buf1"] and same(plan.translate(plan.writes[0].index),
                                                                 128 * xl.var + rl.var)
    cpu = cpp_plan.plan_cpp(plan)
    assert not cpu.column and cpu.vector_var == rl.var and cpu.accumulators == {0: config.get("stax.cpp.unroll")}


def test_example_7_2_two_reductions_of_one_local_exp():
    (plan,) = plans_of(ex72, tp.randn(64, 128))
    (xl,), (rl,) = plan.outer_loops, plan.inner_loops
    assert [ph.nodes for ph in plan.phases] == [("buf0", "buf1", "buf2")]       # one pass over x
    e = plan.nodes["buf0"]
    assert (e.placement, e.storage) == ("inner", "register")                  # exp never reaches memory
    kinds = {n: plan.nodes[n].reduction.kind for n in ("buf1", "buf2")}
    assert kinds == {"buf1": "sum", "buf2": "max"}
    assert all(plan.nodes[n].storage == "memory" and plan.nodes[n].reduction.leader == n for n in kinds)
    r = reads(plan)
    assert set(r) == {("arg0", "buf0"), ("buf0", "buf1"), ("buf0", "buf2")}
    assert all(same(v, 128 * xl.var + rl.var) for v in r.values())
    assert {w.buffer for w in plan.writes} == {"buf1", "buf2"}
    assert all(same(plan.translate(w.index), xl.var) for w in plan.writes)


def test_column_sum_and_welford_siblings():
    """``x.var(0)``: a Welford reduction over the strided dim -- one accumulator (mean's) computes
    m2 too; the plan is a column candidate and the CPU takes column mode."""
    (plan,) = plans_of(lambda x: x.var(0), tp.randn(300, 77))
    (xl,), (rl,) = plan.outer_loops, plan.inner_loops
    reds = {n.reduction.output: n for n in plan.nodes.values() if n.reduction}
    assert set(reds) == {"mean", "m2"} and {n.reduction.kind for n in reds.values()} == {"welford"}
    assert reds["m2"].reduction.leader == reds["mean"].name == reds["mean"].reduction.leader
    assert all(same(e, 77 * rl.var + xl.var) for (b, _), e in reads(plan).items() if b == "arg0")
    assert plan.column_candidate
    cpu = cpp_plan.plan_cpp(plan)
    assert cpu.column and cpu.vector_var == xl.var and cpu.column_unroll >= 1 and cpu.column_blocks >= 1


def test_softmax_keeps_the_exp_row_in_scratch():
    (plan,) = plans_of(lambda x: tp.softmax(x, -1), tp.randn(8, 3000))
    assert len(plan.phases) == 3 and plan.scratch and all(plan.nodes[n].storage == "scratch" for n in plan.scratch)
    assert [n.placement for n in plan.nodes.values() if n.storage == "memory"] == ["inner"]


def test_debug_plan_prints_every_plan(monkeypatch, capfd):
    monkeypatch.setenv("TP_STAX_DEBUG", "plan")
    tp.compile(ex71, strict_native=True)(tp.randn(8, 16))
    err = capfd.readouterr().err
    assert "===== [stax] plan =====" in err and "[stax] code" not in err
    assert "loops: outer xm0 < 8 (x0); inner rm0 < 16 (r0)" in err
    assert "buf0     reduce float32  register sum acc float32" in err
    assert "read  buf0[xm0] (local) by buf1" in err and "device: cpu row mode, vector loop rm0" in err
