"""tp.compile front end: capture, specialization keys, guards, data gates, staged API."""
import math
import warnings

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler import CaptureError, GuardError, RecompileLimitError
from tensorplay.compiler.specialize.guards import build_guard
from tensorplay.compiler.specialize.key import specialization_key
from tensorplay.testing import assert_close


def rnd(*shape, dtype=tp.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(*shape, generator=g, dtype=dtype))


def counting_backend():
    calls = []

    def backend(gm, example_inputs, **kw):
        calls.append(gm)
        return gm.forward
    return backend, calls


# ---- seed examples ----------------------------------------------------------------------------------
def test_example_1_1_fused_expression_matches_eager():
    def f(x, w):
        return (tp.relu(x + w) * 2).sum(-1)
    x, w = rnd(64, 128), rnd(64, 128, seed=1)
    cf = tp.compile(f)
    # blocked-summation bound (§6.5): 2·sqrt(n)·u·Σ|a_i| per row
    bound = 2 * 128 ** 0.5 * 2.0 ** -24 * (tp.relu(x + w) * 2).sum(-1)
    for _ in range(3):
        assert bool(((cf(x, w) - f(x, w)).abs() <= bound).all())
    assert cf.counters["captures"] == 1
    ce = tp.compile(f, backend="eager")
    ce(x, w)
    assert_close(ce(x, w), f(x, w), exact=True)   # the op-by-op backend is bit-exact


def test_example_2_1_scalar_specialized_by_value():
    backend, calls = counting_backend()
    cf = tp.compile(lambda x, k: x * k, backend=backend)
    x = rnd(4)
    assert_close(cf(x, 2), x * 2)
    assert_close(cf(x, 2), x * 2)
    assert len(calls) == 1
    assert "ops.mul(x, 2)" in calls[0].code   # k is a constant of the graph
    assert_close(cf(x, 3), x * 3)
    assert len(calls) == 2
    assert cf.recompile_reasons[-1] == ["arg 1 'k': value expected 2, got 3"]


def _branchy(x):
    if x.sum() > 0:
        return x * 2
    return x * 3


def test_example_3_2_data_gate_replayed():
    cf = tp.compile(_branchy)
    pos, neg = rnd(5).abs() + 0.1, -(rnd(5).abs() + 0.1)
    assert_close(cf(pos), pos * 2)
    assert_close(cf(neg), neg * 3)        # the gate fails -> new specialization
    assert_close(cf(pos), pos * 2)        # and the first one is found again by replay
    assert cf.counters["captures"] == 2
    assert any("data gate" in r for rs in cf.recompile_reasons for r in rs)
    assert "gt" in cf._cache[0].replay.as_text()


def test_exercise_4_gate_extraction_after_dce_is_wrong():
    """Prop. 3.1: the gate's condition feeds no output, so DCE removes it; a replay extracted
    afterwards cannot check the branch and the second call silently takes the wrong one."""
    pos, neg = rnd(5).abs() + 0.1, -(rnd(5).abs() + 0.1)
    bad = tp.compile(_branchy, options={"debug.gates_after_dce": True})
    with pytest.warns(RuntimeWarning, match="data gate"):
        bad(pos)
    wrong = bad(neg)
    assert_close(wrong, neg * 2)                      # wrong branch
    assert not bool(((wrong - neg * 3).abs() < 1e-6).all())
    good = tp.compile(_branchy)
    good(pos)
    assert_close(good(neg), neg * 3)


def test_example_4_4_functionalization_and_input_writeback():
    def f(x):
        y = x * 1
        y[0].add_(1)
        y.t()[1].mul_(2)
        x.add_(10)              # mutation of a graph input: written back after the graph runs
        return y
    x = rnd(3, 3)
    xe = x.clone()
    cf = tp.compile(f)
    cf.lower(x.clone())         # capture on a copy; look at the graph
    low = cf.lower(x.clone())
    inplace = [n for n in low.graph_module.graph.nodes if n.op == "call_function" and n.opdef.is_inplace]
    assert all(n.opdef.name == "copy_" for n in inplace) and len(inplace) == 1
    a1, b1 = x.clone(), x.clone()
    cf(a1)                      # first call (capture run)
    assert_close(a1, xe + 10)
    out = cf(b1)                # second call: the compiled artifact
    assert_close(out, f(xe.clone()))
    assert_close(b1, xe + 10)


# ---- guards are projections of the key (exercise 3) --------------------------------------------------
@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "requires_grad", "scalar", "scalar_type", "same"])
def test_exercise_3_guard_fails_iff_key_differs(change):
    x = rnd(4, 6)
    base = [x, 2.0]
    variants = {
        "shape": [rnd(5, 6), 2.0], "stride": [rnd(6, 4).t(), 2.0], "dtype": [rnd(4, 6, dtype=tp.float64), 2.0],
        "requires_grad": [rnd(4, 6).requires_grad_(), 2.0], "scalar": [x, 3.0], "scalar_type": [x, 2],
        "same": [rnd(4, 6, seed=9), 2.0],
    }
    k1 = specialization_key(base, ["x", "k"])
    k2 = specialization_key(variants[change], ["x", "k"])
    guard = build_guard(k1)
    why = guard(variants[change], [], [], None)
    assert (why is None) == ([(e.subject, e.field, e.value) for e in k1] == [(e.subject, e.field, e.value) for e in k2])
    assert guard.source.startswith("def guard(L, F, C, M, S=None):")


def test_guard_miss_messages_and_logging(capsys, monkeypatch):
    monkeypatch.setenv("TP_LOG_RECOMPILES", "1")
    cf = tp.compile(lambda x: x + 1)
    cf(rnd(64, 8))
    cf(rnd(128, 8))
    assert cf.recompile_reasons[0] == ["arg 0 'x': size[0] expected 64, got 128"]
    assert "arg 0 'x': size[0] expected 64, got 128" in capsys.readouterr().err
    cf(rnd(64, 8, dtype=tp.float64))
    assert "arg 0 'x': dtype expected torch.float32, got torch.float64" in cf.recompile_reasons[1][0]


def test_recompile_limit_lists_reasons():
    cf = tp.compile(lambda x: x + 1, recompile_limit=2, dynamic=False,
                    options={"compile.error_on_recompile_limit": True})
    cf(rnd(1))
    cf(rnd(2))
    with pytest.raises(RecompileLimitError, match=r"(?s)recompile_limit=2.*entry 0: arg 0 'x': size\[0\] expected 1, got 3"
                       r"(.|\n)*entry 1: arg 0 'x': size\[0\] expected 2, got 3"):
        cf(rnd(3))


def test_first_level_entry_counters_and_version_check():
    cf = tp.compile(lambda x: x * 2 + 1)
    x = rnd(8)
    cf(x)
    for _ in range(5):
        cf(x)
    assert cf.counters["first_level_hits"] == 5 and cf.counters["captures"] == 1
    with tp.no_grad():
        x.add_(1)                       # new version: the first level misses, guards pass
    assert_close(cf(x), x * 2 + 1)
    assert cf.counters["first_level_hits"] == 5 and cf.counters["cache_hits"] == 1
    cf(x)
    assert cf.counters["first_level_hits"] == 6


def test_fast_first_level_entry_checks_identity_version_data_and_grad_mode():
    """The fast first-level closure (api.CompiledFunction._make_fast) must miss exactly when the
    general first-level path would, and return what it returns."""
    cf = tp.compile(lambda x, y: (x * 2 + y, (x - y).sum(-1)), strict_native=True)
    x, y = rnd(4, 8), rnd(4, 8, seed=1)
    cf(x, y)
    assert cf._fast is not None                        # two tensor inputs, a flat tuple of outputs
    for _ in range(3):
        a, b = cf(x, y)
        assert_close(a, x * 2 + y)
        assert_close(b, (x - y).sum(-1))
    assert cf.counters["first_level_hits"] == 3 and cf.counters["calls"] == 4
    x2 = rnd(4, 8, seed=2)                              # another object with the same layout
    assert_close(cf(x2, y)[0], x2 * 2 + y)
    assert cf.counters["cache_hits"] == 1 and cf.counters["first_level_hits"] == 3
    with tp.no_grad():
        y.mul_(3)                                       # a new version of an input: miss, recheck
    assert_close(cf(x2, y)[0], x2 * 2 + y)
    assert cf.counters["cache_hits"] == 2
    hits = cf._fast[1][0]
    x2._data = torch.randn(4, 8)                        # the same tp object, new storage: fast path misses
    assert_close(cf(x2, y)[1], (x2 - y).sum(-1))
    assert cf._fast[1][0] == hits or cf._fast[1][0] == 0
    with tp.no_grad():                                  # another grad mode: not the fast path
        assert_close(cf(x2, y)[0], x2 * 2 + y)
    assert cf(x2, y) is not None and cf.counters["calls"] == 9 and cf.counters["captures"] >= 1
    single = tp.compile(lambda x: x.exp(), strict_native=True)
    single(x)
    out = single(x)
    assert isinstance(out, tp.Tensor) and single._fast is not None and single.counters["first_level_hits"] == 1
    assert_close(out, x.exp())
    tp.compiler.reset()
    assert single.counters["first_level_hits"] == 1 and single._fast is None
    nested = tp.compile(lambda x: {"a": x + 1, "b": (x.max(-1),)})   # dict, namedtuple: general path
    nested(x)
    out = nested(x)
    assert nested._fast is None and nested.counters["first_level_hits"] == 1
    assert_close(out["a"], x + 1)
    assert_close(out["b"][0].values, x.max(-1).values)


def test_nested_inputs_outputs_kwargs_and_multiple_outputs():
    def f(pair, d, *, scale=1.0):
        a, b = pair
        s = (a * d["w"]).sum(0) * scale
        return {"s": s, "both": (a + b, [b - a])}, 3
    a, b, w = rnd(2, 3), rnd(2, 3, seed=1), rnd(3, seed=2)
    cf = tp.compile(f)
    for _ in range(2):
        out, three = cf((a, b), {"w": w}, scale=0.5)
        ref, _ = f((a, b), {"w": w}, scale=0.5)
        assert three == 3
        assert_close(out["s"], ref["s"])
        assert_close(out["both"][0], ref["both"][0])
        assert_close(out["both"][1][0], ref["both"][1][0])
    cf((a, b), {"w": w}, scale=2.0)
    assert cf.recompile_reasons[-1] == ["arg 3 'scale': value expected 0.5, got 2.0"]


def test_free_tensors_are_inputs_reread_each_call():
    g = {"w": rnd(3)}
    exec("def f(x):\n    return x + w\n", g)
    cf = tp.compile(g["f"])
    x = rnd(3, seed=4)
    assert_close(cf(x), x + g["w"])
    g["w"] = rnd(3, seed=7)             # rebinding the global: same metadata, new value
    assert_close(cf(x), x + g["w"])
    k = rnd(3, seed=8)

    def h(x):
        return x * k
    ch = tp.compile(h)
    ch(x)
    with tp.no_grad():
        k.mul_(2)                       # in-place change of a closure tensor
    assert_close(ch(x), x * k)
    assert "free_k" in ch._cache[0].lowered.as_text()


def test_side_effects_happen_once_at_capture():
    log = []

    def f(x):
        log.append("traced")
        return x + 1
    cf = tp.compile(f)
    for _ in range(3):
        cf(rnd(2))
    assert log == ["traced"]


def test_module_parameters_updated_between_calls():
    lin = tp.nn.Linear(4, 3)
    cm = tp.compile(lin)
    x = rnd(2, 4)
    assert_close(cm(x), lin(x))
    opt = tp.optim.SGD(lin.parameters(), lr=0.5)
    loss = cm(x).sum()
    loss.backward()
    opt.step()                          # in-place update of the parameters
    assert_close(cm(x), lin(x))
    lin.weight = tp.nn.Parameter(tp.zeros(3, 4))   # a new parameter object: identity guard
    assert_close(cm(x), lin(x))
    lin.eval()
    assert_close(cm(x), lin(x))


def test_autograd_through_compiled_region_matches_eager():
    def f(x, w):
        return ((x @ w).exp() * x.sum(1, keepdim=True)).mean()
    x, w = rnd(3, 4).requires_grad_(), rnd(4, 2, seed=1).requires_grad_()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    cf = tp.compile(f)
    for _ in range(2):
        cf(x, w).backward()
    f(x2, w2).backward()
    f(x2, w2).backward()
    assert_close(x.grad, x2.grad, rtol=1e-6, atol=1e-6)
    assert_close(w.grad, w2.grad, rtol=1e-6, atol=1e-6)


def test_staged_lower_compile_and_rejection():
    def f(x, y):
        return (x * y + 1).sum(-1)
    x, y = rnd(8, 16), rnd(8, 16, seed=1)
    low = tp.compile(f).lower(x, y)
    assert "ops.mul(x, y)" in low.as_text()
    assert "arg 0 'x': size[0] == 8" in low.guards
    comp = low.compile()
    assert_close(comp(x, y), f(x, y))
    with pytest.raises(GuardError, match=r"arg 0 'x': size\[0\] expected 8, got 9"):
        comp(rnd(9, 16), rnd(9, 16))
    cost = comp.cost_analysis()
    n = 8 * 16
    assert cost["bytes_accessed"] >= 4 * (2 * n + 8)
    assert cost["flops"] >= 3 * n
    assert "def " in comp.as_text()


def test_execute_false_symbolic_capture():
    def f(x):
        return (x.t() @ x).sum(0) * 2
    cf = tp.compile(f, options={"capture.execute": False})
    x = rnd(5, 3)
    assert_close(cf(x), f(x), rtol=1e-6, atol=1e-6)

    def g(x):
        if x.sum() > 0:
            return x
        return -x
    cg = tp.compile(g, options={"capture.execute": False})
    with pytest.raises(CaptureError, match=r"(?s)test_compiler_front.py:\d+: `if x.sum\(\) > 0:`.*execute=False"):
        cg(x)


def test_capture_error_names_source_line():
    def f(x):
        y = x * 2
        return y + tp.randn(7)
    with pytest.raises(CaptureError, match=r"(?s)test_compiler_front.py:\d+: `return y \+ tp.randn\(7\)`.*tp.add"):
        tp.compile(f)(rnd(3))


def test_modes_and_options():
    assert tp.compiler.list_mode_options("max-autotune") == {
        "stax.cudagraphs": True, "stax.max_autotune": True, "stax.coordinate_descent_tuning": True}
    assert tp.compiler.list_mode_options("reduce-overhead") == {"stax.cudagraphs": True}
    cf = tp.compile(lambda x: x, mode="max-autotune", options={"stax.cudagraphs": False})
    assert cf.options["stax.cudagraphs"] is False and cf.options["stax.max_autotune"] is True
    with pytest.raises(ValueError, match="unknown option 'stax.cudagraph'.*did you mean 'stax.cudagraphs'"):
        tp.compile(lambda x: x, options={"stax.cudagraph": True})
    with pytest.raises(TypeError, match="expects bool"):
        tp.compile(lambda x: x, options={"stax.cudagraphs": "yes"})
    with pytest.raises(ValueError, match="unknown mode"):
        tp.compile(lambda x: x, mode="fast")


def test_decorator_forms_backends_and_disable():
    @tp.compile
    def a(x):
        return x + 1

    @tp.compile(backend="eager")
    def b(x):
        return x + 2
    x = rnd(3)
    assert_close(a(x), x + 1) and assert_close(b(x), x + 2)
    assert {"eager", "stax"} <= set(tp.compiler.list_backends())
    backend, calls = counting_backend()
    tp.compiler.register_backend(backend, name="counting_test")
    c = tp.compile(lambda x: x - 1, backend="counting_test")
    c(x)
    assert len(calls) == 1
    d = tp.compile(lambda x: x - 1, disable=True)
    assert_close(d(x), x - 1) and d.counters["calls"] == 0
    with pytest.raises(ValueError, match="unknown backend"):
        tp.compile(lambda x: x, backend="nope")
    tp.compiler.reset()
    assert a._cache == []


def test_backend_failure_falls_back_unless_strict():
    def broken(gm, example_inputs, **kw):
        raise RuntimeError("boom")
    x = rnd(4)
    cf = tp.compile(lambda x: x * 3, backend=broken)
    with pytest.warns(RuntimeWarning, match="boom"):
        cf(x)
    assert_close(cf(x), x * 3)
    strict = tp.compile(lambda x: x * 3, backend=broken, strict_native=True)
    with pytest.raises(tp.compiler.BackendCompilerError, match="boom"):
        strict(x)


def test_explain():
    text = tp.compiler.explain(_branchy, rnd(4).abs())
    assert "guards:" in text and "data gate" in text and "ops.mul" in text


def test_constant_created_and_mutated_inside_function():
    def g(x):
        c = tp.tensor([1.0, 2.0])
        c.add_(x)
        return c
    cg = tp.compile(g)
    for v in ([1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]):
        x = tp.tensor(v)
        assert_close(cg(x), g(x))


def test_gate_on_tensor_mutated_before_the_gate():
    def f(x):
        y = x * 2
        y.add_(1)
        if y.sum() > 0:
            return y
        return -y
    cf = tp.compile(f)
    for v in ([1.0, 1.0], [-0.6, -0.6], [1.0, 1.0], [-0.6, -0.6], [-0.4, -0.4]):
        x = tp.tensor(v)            # -0.6: y = -0.2 < 0 (other branch); -0.4: y = 0.2 > 0
        assert_close(cf(x), f(x))
    assert cf.counters["captures"] == 2


@pytest.mark.parametrize("dtype", [tp.float32, tp.float64, tp.int32, tp.int64, tp.float16, tp.bool])
def test_eager_backend_scalar_hoisting_is_bit_exact(dtype):
    """The raw eager path turns exactly representable Python numbers into 0-d tensors; results
    must equal eager bit for bit for every dtype (including promotion int -> float)."""
    def f(x):
        return ((x * 2 + 1) - 3 * x, x * 0.1, 2 - x, x / 4, x * 2.5, x + (1 << 20))
    if dtype == tp.bool:
        x = tp.tensor([True, False, True])
        f = lambda x: (x * 2, x + 1.5, x & True)  # noqa: E731
    elif dtype.is_floating_point:
        x = rnd(7, dtype=tp.float32).to(dtype)
    else:
        x = tp.randint(-50, 50, (7,), dtype=dtype)
    cf = tp.compile(f)
    cf(x)
    for _ in range(2):
        for a, b in zip(cf(x), f(x)):
            assert_close(a, b, exact=True)


def test_module_in_closure_parameters_are_free_inputs_not_constants():
    # regression: a module reached through a closure had its parameters frozen as constants, so
    # later calls lost autograd and missed in-place updates
    m = tp.nn.Linear(8, 4)
    cf = tp.compile(lambda x: m(x).sum(), backend="eager")
    x = tp.randn(3, 8)
    for _ in range(3):
        cf(x).backward()
    assert torch.allclose(m.weight.grad._data, 3 * x._data.sum(0).expand(4, 8), rtol=1e-5)
    with tp.no_grad():
        m.weight.mul_(0.5)
    assert torch.allclose(cf(x)._data, (x._data @ m.weight._data.t() + m.bias._data).sum(), rtol=1e-5)
    hidden = [tp.randn(4, requires_grad=True)]           # reachable only through a list
    cg = tp.compile(lambda x: (x * hidden[0]).sum(), backend="eager")
    for _ in range(2):
        cg(x[:, :4]).backward()
    assert torch.allclose(hidden[0].grad._data, 2 * x._data[:, :4].sum(0), rtol=1e-5)


def test_python_read_of_a_free_tensor_value_is_a_data_gate():
    """float()/int()/item()/bool() of a free tensor (a closure's or a module buffer) inside a compiled
    function is gated like a proxy's: when the value changes, the function recompiles instead of
    reusing the value baked at capture."""
    scale = tp.tensor(2.0)
    x = tp.randn(5)
    cf = tp.compile(lambda x: x * float(scale) + (1 if bool(scale > 1) else 0), backend="eager")
    assert_close(cf(x), x * 2.0 + 1)
    scale._data.fill_(0.5)
    assert_close(cf(x), x * 0.5)
    scale._data.fill_(3.0)
    assert_close(cf(x), x * 3.0 + 1)


def test_free_tensor_value_read_without_execution_is_a_capture_error():
    """capture.execute=False has no values: reading a free tensor's value raises, as for a proxy,
    instead of baking the value it happens to hold."""
    scale = tp.tensor(2.0)
    cf = tp.compile(lambda x: x * float(scale), backend="eager", options={"capture.execute": False})
    with pytest.raises(CaptureError, match="execute=False"):
        cf(tp.randn(3))


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_data_dependent_output_shapes_are_data_gates(backend):
    """masked_select, a bool-mask index, unique and one_hot(num_classes=-1) have output shapes that
    depend on values: the graph is specialised to the captured shapes, each recorded as a data gate
    (kind ``shape``).  A call whose shapes differ recompiles instead of failing in the artifact
    (it crashed on the second call); a call with the same shapes reuses the artifact."""
    F = tp.nn.functional

    def f(v):
        return (v.masked_select(v > 0) * 2, tp.unique(v.round()), v[v < 0].sum(),
                F.one_hot((v.abs() * 2).long().flatten()).sum(0))

    def ref(t):
        return (t[t > 0] * 2, torch.unique(t.round()), t[t < 0].sum(),
                torch.nn.functional.one_hot((t.abs() * 2).long().flatten()).sum(0))
    cf = tp.compile(f, backend=backend)
    g = torch.Generator().manual_seed(0)
    vs = [torch.randn(4, 10, generator=g) for _ in range(3)]
    vs.append(vs[0] * 1.0001)          # same signs, rounding and classes as the first: same shapes
    for t in vs:
        out = cf(tp.from_torch(t.clone()))
        for o, r in zip(out, ref(t)):
            assert tuple(o.shape) == tuple(r.shape)
            assert_close(o, tp.from_torch(r))
    shapes = {tuple(tuple(r.shape) for r in ref(t)) for t in vs}
    assert len(shapes) > 1                              # the sizes did change between calls
    assert cf.counters["captures"] == len(shapes)       # one capture per distinct set of shapes
    assert any("shape(" in r for reasons in cf.recompile_reasons for r in reasons)


def test_data_dependent_output_shape_without_execution_is_a_capture_error():
    cf = tp.compile(lambda v: v.masked_select(v > 0), backend="eager", options={"capture.execute": False})
    with pytest.raises(CaptureError, match="masked_select.*data-dependent shape"):
        cf(tp.randn(3, 4))
