"""Regressions of the ``tp.compile`` front end (api.py, specialize/, capture/, aot/).

Each test judges a compiled call after the capture run (the first call returns eager values) and
compares it with a torch / float64 reference on random inputs.
"""
import warnings

import pytest
import torch

import tensorplay as tp

pytestmark = pytest.mark.usefixtures("stax_cache")


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tp.from_torch(torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype))


def assert_equal(got, want):
    g = got._data if isinstance(got, tp.Tensor) else got
    w = want._data if isinstance(want, tp.Tensor) else want
    assert g.dtype == w.dtype, (g.dtype, w.dtype)
    torch.testing.assert_close(g, w, rtol=0, atol=0)


# ---- bug 2: metadata changed under the first-level entry (x.data = ...) -----------------------------
@pytest.mark.parametrize("backend", ["stax", "eager"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.float16])
def test_first_level_sees_dtype_change(backend, dtype):
    f = tp.compile(lambda x: x * 2, backend=backend)
    x = rnd(4)
    for _ in range(3):
        assert_equal(f(x), x._data * 2)
    new = torch.randint(-50, 50, (4,)).to(dtype) if not dtype.is_floating_point else \
        torch.randn(4, dtype=torch.float64).to(dtype)
    x.data = tp.from_torch(new)
    for _ in range(3):                       # capture run, then compiled calls
        assert_equal(f(x), new * 2)
    assert f.counters["captures"] == 2


@pytest.mark.parametrize("change", ["transpose", "strided", "offset", "shape_same_numel"])
def test_first_level_sees_layout_change(change):
    f = tp.compile(lambda x: x * 2 + 1)
    base = torch.randn(5, 8, dtype=torch.float64).float()
    x = tp.from_torch(base[:4, :4].contiguous())
    for _ in range(2):
        assert_equal(f(x), x._data * 2 + 1)
    new = {"transpose": base[:4, :4].t(), "strided": base[1:5, 4:8], "offset": base.flatten()[3:19].view(4, 4),
           "shape_same_numel": base.flatten()[:16].reshape(2, 8)}[change]
    x.data = tp.from_torch(new)
    for _ in range(3):
        assert_equal(f(x), new * 2 + 1)


def test_first_level_sees_free_tensor_data_change():
    w = rnd(4, seed=1)

    def f(x):
        return x * w

    cf = tp.compile(f)
    x = rnd(4, seed=2)
    for _ in range(2):
        assert_equal(cf(x), x._data * w._data)
    w.data = tp.from_torch(torch.randn(4, dtype=torch.float64))
    for _ in range(3):
        assert_equal(cf(x), x._data.double() * w._data)


def test_first_level_sees_requires_grad_change():
    f = tp.compile(lambda x: (x * x).sum())
    xt = torch.randn(6)
    x = tp.from_torch(xt.clone())
    for _ in range(2):
        assert not f(x).requires_grad
    x.requires_grad_(True)
    for _ in range(2):                       # capture run, then the compiled training region
        x.grad = None
        y = f(x)
        assert y.requires_grad
        y.backward()
        torch.testing.assert_close(x.grad._data, 2 * xt)

    g = tp.compile(lambda x, w: (x * w).sum())
    w = tp.from_torch(torch.randn(6))
    for _ in range(2):
        g(x, w)
    w.requires_grad_(True)
    for _ in range(2):
        w.grad = None
        g(x, w).backward()
        torch.testing.assert_close(w.grad._data, xt)


# ---- bug 1: aliased inputs ------------------------------------------------------------------------
def _add_then_read(a, b):
    a.add_(1)
    return b * 2


def _run_torch(fn, *ts):
    """The eager reference: ``fn`` on torch tensors (the ops used here exist in both)."""
    return fn(*ts)


@pytest.mark.parametrize("backend", ["stax", "eager", "aot_eager"])
def test_same_tensor_twice_sees_the_write(backend):
    cg = tp.compile(_add_then_read, backend=backend)
    xt = torch.randn(5)
    x = tp.from_torch(xt.clone())
    for _ in range(4):                       # capture, then the first-level entry
        want = _run_torch(_add_then_read, xt, xt)
        assert_equal(cg(x, x), want)
        assert_equal(x, xt)
    for _ in range(3):                       # fresh tensors: the guard path
        yt = torch.randn(5)
        y = tp.from_torch(yt.clone())
        assert_equal(cg(y, y), _run_torch(_add_then_read, yt, yt))
        assert_equal(y, yt)
    assert cg.counters["captures"] == 1
    assert cg._cache[0].eager is None        # compiled, with the two inputs merged into one


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_partial_overlap_runs_eagerly_and_right(backend):
    cg = tp.compile(_add_then_read, backend=backend)
    with pytest.warns(RuntimeWarning, match="overlap in memory"):
        for _ in range(3):
            bt = torch.randn(4)
            base = tp.from_torch(bt.clone())
            got = cg(base[0:2], base[1:3])
            want = _run_torch(_add_then_read, bt[0:2], bt[1:3])
            assert_equal(got, want)
            assert_equal(base, bt)
    assert cg.counters["captures"] == 1
    assert "runs eagerly: inputs 'a', 'b' overlap in memory and the region writes 'a' in place" in cg.explain()
    # interleaved views share a span but no element: treated as overlapping (conservative), right
    bt = torch.randn(6)
    base = tp.from_torch(bt.clone())
    with pytest.warns(RuntimeWarning, match="overlap in memory"):
        for _ in range(2):
            assert_equal(cg(base[::2], base[1::2]), _run_torch(_add_then_read, bt[::2], bt[1::2]))


def test_disjoint_views_of_one_base_stay_compiled():
    cg = tp.compile(_add_then_read)
    bt = torch.randn(4)
    base = tp.from_torch(bt.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(3):
            assert_equal(cg(base[0:2], base[2:4]), _run_torch(_add_then_read, bt[0:2], bt[2:4]))
            assert_equal(base, bt)
    e = cg._cache[0]
    assert e.eager is None and cg.counters["captures"] == 1
    assert "inputs: aliasing == ()" in e.lowered.guards
    # the same function on one tensor twice is another specialization, and the miss says why
    x = tp.from_torch(torch.randn(2))
    cg(x, x)
    assert "inputs: aliasing expected no two share memory, got 'a', 'b' are the same tensor" \
        in cg.recompile_reasons[-1]


def test_aliasing_not_in_key_of_a_region_that_writes_no_input():
    cf = tp.compile(lambda a, b: a * b + a)
    x, y = rnd(5, seed=1), rnd(5, seed=2)
    for _ in range(2):
        assert_equal(cf(x, y), x._data * y._data + x._data)
    for _ in range(2):
        assert_equal(cf(x, x), x._data * x._data + x._data)
    assert cf.counters["captures"] == 1


W_ALIAS = tp.from_torch(torch.randn(3))


def _writes_arg_reads_global(a):
    a.mul_(3)
    return W_ALIAS + 1


def test_input_aliasing_a_free_tensor():
    cf = tp.compile(_writes_arg_reads_global)
    wt = W_ALIAS._data.clone()
    for _ in range(3):
        wt.mul_(3)
        assert_equal(cf(W_ALIAS), wt + 1)
        assert_equal(W_ALIAS, wt)


def _flip_then_branch(a, b):
    a.mul_(-1)
    if b.sum() > 0:
        return b * 2
    return b * 3


def test_data_gate_after_a_write_through_an_alias():
    cf = tp.compile(_flip_then_branch)
    for s in (1.0, -1.0, 1.0, -1.0, -1.0, 1.0):
        xt = (torch.rand(4) + 0.5) * s
        x = tp.from_torch(xt.clone())
        assert_equal(cf(x, x), _flip_then_branch(xt, xt))
    assert cf.counters["captures"] == 2


def test_strict_native_refuses_a_written_partial_overlap():
    from tensorplay.compiler import BackendCompilerError
    cg = tp.compile(_add_then_read, strict_native=True)
    base = tp.from_torch(torch.randn(4))
    with pytest.raises(BackendCompilerError, match="'a', 'b' overlap in memory"):
        cg(base[0:2], base[1:3])


# ---- bug 3: arguments the function cannot take ------------------------------------------------------
def _python_error(fn, *args, **kwargs):
    with pytest.raises(TypeError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def _two(x, y):
    return x - y


def _defaults(x, k=2, *, scale=1.0):
    return x * k * scale


def _star(*xs, s=1):
    out = xs[0]
    for t in xs[1:]:
        out = out + t
    return out * s


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("fn, good, bad", [
    (lambda x: x * 2, (1, {}), [(2, {}), (0, {}), (1, {"y": 1}), (0, {"y": 1})]),
    (_two, (2, {}), [(3, {}), (1, {}), (1, {"x": 1}), (2, {"z": 1})]),
    (_defaults, (1, {"scale": 3.0}), [(4, {}), (1, {"k": 3, "j": 1}), (0, {"k": 2})]),
    (_star, (3, {"s": 2}), [(2, {"x": 1}), (1, {"s": 2, "t": 1})]),
], ids=["lambda", "two", "defaults", "star"])
def test_bad_arguments_raise_what_python_raises(fn, good, bad, warm):
    cf = tp.compile(fn)
    xs = [rnd(3, seed=i) for i in range(4)]
    (n_good, kw_good) = good
    if warm:
        for _ in range(2):
            cf(*xs[:n_good], **kw_good)
    captures = cf.counters["captures"]
    for n, kw in bad:
        kw = {k: (xs[0] if v == 1 else v) for k, v in kw.items()}
        want = _python_error(fn, *xs[:n], **kw)
        with pytest.raises(TypeError) as info:
            cf(*xs[:n], **kw)
        assert str(info.value) == want
    assert cf.counters["captures"] == captures      # refused before any capture
    with pytest.raises(TypeError, match=r"takes|missing|unexpected"):
        cf.lower(*xs[:4], bogus=1)


def test_keyword_order_and_defaults_are_part_of_the_key():
    cf = tp.compile(_two)
    a, b = rnd(4, seed=1), rnd(4, seed=2)
    for _ in range(2):
        assert_equal(cf(a, b), a._data - b._data)
    for _ in range(2):                               # same leaves, other binding: y=a, x=b
        assert_equal(cf(y=a, x=b), b._data - a._data)
    assert cf.recompile_reasons[0][0] == "call: structure expected (*, *), got (y=*, x=*)"
    cd = tp.compile(_defaults)
    for _ in range(2):
        assert_equal(cd(a), a._data * 2)
        assert_equal(cd(a, 3), a._data * 3)
        assert_equal(cd(a, k=3, scale=0.5), a._data * 1.5)
    cs = tp.compile(_star)
    for _ in range(2):
        assert_equal(cs(a, b), a._data + b._data)
        assert_equal(cs((a, b)[0], s=3), a._data * 3)


# ---- friction 4: torch.Tensor arguments --------------------------------------------------------------
@pytest.mark.parametrize("strict", [False, True])
def test_torch_tensor_arguments_are_taken_zero_copy(strict):
    f = tp.compile(lambda x: tp.relu(x) * 2, strict_native=strict)
    g = tp.compile(lambda x, y: x * y + 1, strict_native=strict)
    x, y = torch.randn(6), torch.randn(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no fallback: native code
        for _ in range(3):
            x.add_(0.5)                                      # in place, between calls: seen
            out = f(x)
            assert isinstance(out, tp.Tensor)
            torch.testing.assert_close(out.torch(), torch.relu(x) * 2, rtol=0, atol=0)
            torch.testing.assert_close(g(x, y).torch(), x * y + 1, rtol=0, atol=0)
            torch.testing.assert_close(g(tp.from_torch(x), [y][0]).torch(), x * y + 1, rtol=0, atol=0)
    assert f.counters["captures"] == 1 and g.counters["captures"] == 1


def test_torch_tensor_that_requires_grad_is_refused():
    g = tp.compile(lambda x, y: x * y + 1)
    with pytest.raises(TypeError, match="argument 'y' is a torch.Tensor that requires grad"):
        g(tp.from_torch(torch.randn(3)), torch.randn(3, requires_grad=True))


# ---- friction 5: recompile_limit warns once, then runs misses eagerly -------------------------------
def test_recompile_limit_warns_once_then_runs_eagerly():
    cf = tp.compile(lambda x: x * 3 - 1, recompile_limit=2, dynamic=False)   # static: every size recompiles
    for n in (1, 2):
        cf(rnd(n))
    with pytest.warns(UserWarning, match=r"(?s)recompile_limit=2 reached.*entry 0: arg 0 'x': size\[0\] expected 1, "
                                         r"got 3.*run eagerly.*dynamic=True.*recompile_limit=N"):
        x = rnd(3, seed=5)
        assert_equal(cf(x), x._data * 3 - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (4, 5, 4):
            x = rnd(n, seed=n)
            assert_equal(cf(x), x._data * 3 - 1)
        for _ in range(2):                       # the cached specializations still run compiled
            x = rnd(2, seed=7)
            assert_equal(cf(x), x._data * 3 - 1)
    c = cf.counters
    assert c["captures"] == 2 and c["over_limit_calls"] == 4 and c["cache_hits"] + c["first_level_hits"] == 2


@pytest.mark.parametrize("how", ["strict_native", "option"])
def test_recompile_limit_raises_when_asked(how):
    from tensorplay.compiler import RecompileLimitError
    kw = {"strict_native": True} if how == "strict_native" else {"options": {"compile.error_on_recompile_limit": True}}
    cf = tp.compile(lambda x: x + 1, recompile_limit=1, **kw)
    cf(rnd(2))
    with pytest.raises(RecompileLimitError, match="entry 0: arg 0 'x': size"):
        cf(rnd(3))


# ---- friction 6: repr and counters -----------------------------------------------------------------
def test_repr_and_module_counters():
    def f(x):
        return x + 1
    cf = tp.compile(f, backend="eager", mode="default")
    x = rnd(3)
    cf(x)
    assert repr(cf) == "CompiledFunction(test_repr_and_module_counters.<locals>.f, backend='eager', " \
                       "mode='default', specializations=1, strict_native=False)"
    lin = tp.nn.Linear(3, 2)
    cm = tp.compile(lin, strict_native=True)
    assert repr(cm) == "CompiledModule(Linear, backend='stax', mode=None, specializations=0, strict_native=True)"
    with tp.no_grad():
        for _ in range(3):
            torch.testing.assert_close(cm(x).torch(), lin(x).torch(), rtol=1e-6, atol=1e-6)
        cm(rnd(4, 3))
    assert cm.counters == {"calls": 4, "first_level_hits": 2, "cache_hits": 0, "captures": 2, "over_limit_calls": 0,
                           "sparse_eager_calls": 0, "backward_compiles": 0}
    assert cm.recompile_reasons == [["arg 0 'input': dim expected 1, got 2"]]
    assert "specializations=2" in repr(cm)


# ---- friction 7: options that do nothing yet warn; unknown options raise ----------------------------
@pytest.mark.parametrize("mode, expect", [
    ("max-autotune", {"stax.cudagraphs", "stax.max_autotune", "stax.coordinate_descent_tuning"}),
    ("reduce-overhead", {"stax.cudagraphs"}),
    ("max-autotune-no-cudagraphs", {"stax.max_autotune", "stax.coordinate_descent_tuning"}),
])
def test_modes_without_effect_warn_once_per_process_and_option(monkeypatch, mode, expect):
    from tensorplay.compiler import api
    monkeypatch.setattr(api, "_WARNED_NO_EFFECT", set())
    with pytest.warns(UserWarning) as rec:
        cf = tp.compile(lambda x: x * 2, mode=mode)
    assert len(rec) == 1 and "no effect on CPU yet" in str(rec[0].message)      # one warning per call
    named = {k for k in api.NO_EFFECT_YET if f"{k}=True (set by mode={mode!r}" in str(rec[0].message)}
    assert named == expect
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tp.compile(lambda x: x * 2, mode=mode)                  # once per process and option
        tp.compile(lambda x: x * 2)                             # default mode: nothing to say
        x = rnd(4)
        for _ in range(2):
            assert_equal(cf(x), x._data * 2)


def test_option_without_effect_warns_and_unknown_option_raises(monkeypatch):
    from tensorplay.compiler import api
    monkeypatch.setattr(api, "_WARNED_NO_EFFECT", set())
    with pytest.warns(UserWarning, match=r"no effect on CPU yet: stax.max_autotune=True \(set by "
                                         r"options\['stax.max_autotune'\]"):
        tp.compile(lambda x: x, options={"stax.max_autotune": True})
    with pytest.raises(ValueError, match="unknown option 'stax.autotune'"):
        tp.compile(lambda x: x, options={"stax.autotune": True})
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        tp.compile(lambda x: x, mode="fast")


# ---- friction 8: the first training step's backward is the compiled one -----------------------------
@pytest.mark.parametrize("backend", ["stax", "aot_eager"])
def test_first_backward_uses_the_compiled_backward(backend):
    torch.manual_seed(3)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    m = tp.nn.Sequential(tp.nn.Linear(8, 16), tp.nn.Tanh(), tp.nn.Linear(16, 1))
    with torch.no_grad():
        for p, q in zip(m.parameters(), ref.parameters()):
            p._data.copy_(q)
    cm = tp.compile(m, backend=backend)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    for step in (1, 2, 3):
        out = cm(tp.from_torch(x))
        assert out.grad_fn.name() == "CompiledRegionFunctionBackward", step
        loss = tp.nn.functional.mse_loss(out, tp.from_torch(y))
        loss.backward()
        assert cm.counters["backward_compiles"] == 1, step       # built at the first backward()
        ref.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad._data, q.grad, rtol=1e-4, atol=1e-6)
        with torch.no_grad():                                    # SGD, in place on both
            for p, q in zip(m.parameters(), ref.parameters()):
                p._data.sub_(0.1 * p.grad._data)
                q.sub_(0.1 * q.grad)
                p.grad = None
    assert cm.counters["captures"] == 1


def test_first_call_of_a_region_that_writes_a_buffer_keeps_the_capture_run():
    bn = tp.nn.BatchNorm1d(4)
    cm = tp.compile(tp.nn.Sequential(tp.nn.Linear(3, 4), bn))
    x = rnd(8, 3)
    cm(x).sum().backward()                                       # eager first backward (docs/aot.md)
    assert cm.counters["backward_compiles"] == 0
    torch.testing.assert_close(bn.num_batches_tracked._data, torch.tensor(1))   # written once, not twice
    cm(x).sum().backward()
    assert cm.counters["backward_compiles"] == 1


# ---- friction 9: data gates and writes that bypass the version counter ------------------------------
def test_numpy_write_and_data_gates():
    from test_compiler_front import _branchy      # if x.sum() > 0: x * 2, else x * 3
    cf = tp.compile(_branchy)
    xt = torch.rand(5) + 0.5
    x = tp.from_torch(xt)
    for _ in range(2):
        assert_equal(cf(x), xt * 2)
    x.numpy()[:] = -(torch.rand(5) + 0.5).numpy()             # no version bump: the documented hole —
    assert_equal(cf(x), xt * 2)                              # the first-level entry keeps the old branch
    x.add_(0)                                                # bump the version: gates are replayed
    for _ in range(2):
        assert_equal(cf(x), xt * 3)
    x.torch().mul_(-1)                                       # a torch op on the shared tensor bumps it too
    for _ in range(2):
        assert_equal(cf(x), xt * 2)
    x.numpy()[:] = -x.numpy()                                # ... or a new tensor object for the same memory
    for _ in range(2):
        assert_equal(cf(tp.from_numpy(x.numpy())), xt * 3)
    assert cf.counters["captures"] == 2


# ---- training flags of submodules and of modules reached through closures ----------------------------
MODEL_G = tp.nn.Sequential(tp.nn.Linear(4, 4), tp.nn.Dropout(0.5))


def _through_global(x):
    return MODEL_G(x)


@pytest.mark.parametrize("how", ["compiled module, submodule.eval()", "global module", "closure module"])
def test_eval_of_a_submodule_or_closure_module_is_seen(how):
    m = MODEL_G if how == "global module" else tp.nn.Sequential(tp.nn.Linear(4, 4), tp.nn.Dropout(0.5))
    m.train()
    if how.startswith("compiled"):
        cf = tp.compile(m)
    elif how == "global module":
        cf = tp.compile(_through_global)
    else:
        cf = tp.compile(lambda x: m(x) * 1)
    x = rnd(64, 4)
    with tp.no_grad():
        for _ in range(2):
            cf(x)
        (m[1] if how.startswith("compiled") else m).eval()
        for _ in range(2):
            torch.testing.assert_close(cf(x).torch(), m(x).torch(), rtol=1e-6, atol=1e-6)
            y = rnd(64, 4, seed=3)                            # the guarded path too
            torch.testing.assert_close(cf(y).torch(), m(y).torch(), rtol=1e-6, atol=1e-6)
    assert cf.counters["captures"] == 2
    assert "training flags expected (True, True, True), got (" in str(cf.recompile_reasons)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "stax"])
def test_detach_of_an_input_is_read_on_every_call(backend):
    """x.detach() inside a compiled function is an op of the graph: later calls see their own x
    (it was frozen at the capture run's value), and no gradient flows through it."""
    f = tp.compile(lambda x: x.detach().mean(0) * 2 + x.sum(), backend=backend)
    for _ in range(3):
        xt = torch.randn(4, 3)
        x = tp.from_torch(xt.clone()).requires_grad_()
        y = f(x)
        torch.testing.assert_close(y.torch(), xt.mean(0) * 2 + xt.sum())
    y.sum().backward()
    torch.testing.assert_close(x.grad.torch(), torch.full((4, 3), 3.0))


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_compiled_training_through_a_non_constant_pad(mode):
    """pad's backward builds its source index with tp ops, so an AOT backward has it in its graph
    (it was a meta constant: "Cannot copy out of meta tensor")."""
    import tensorplay.nn.functional as F
    w = tp.from_torch(torch.randn(1, 2, 5, 6)).requires_grad_()
    loss = lambda w: (F.pad(F.interpolate(w, scale_factor=2), (2, 1, 1, 2), mode=mode) ** 2).sum()  # noqa: E731
    f = tp.compile(loss, strict_native=True)
    for _ in range(2):
        w.grad = None
        f(w).backward()
    got = w.grad.torch().clone()
    wt = w.torch().clone().requires_grad_()
    (torch.nn.functional.pad(torch.nn.functional.interpolate(wt, scale_factor=2), (2, 1, 1, 2), mode=mode) ** 2
     ).sum().backward()
    torch.testing.assert_close(got, wt.grad)
