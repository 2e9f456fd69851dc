"""mode="reduce-overhead": CUDA graphs and the output-lifetime rule (stax/triton/cudagraphs.py; the
chapter, §9.9 and exercise 27).

On CPU the capture and replay are a stand-in (:class:`FakeGraph`: the capture runs the function
once to learn its outputs, a replay runs it again and writes the results into those same tensors,
as a graph writes the same memory each time), and everything else is the real code: warm-up, static
inputs copied each call, the fallback for other shapes, inputs returned or written by the graph,
the wrapper's kept buffers (runtime.take/stash), and the poisoning of stale outputs -- with a
hand-written ``call``, with a Stax wrapper compiled for the CPU, and through ``tp.compile`` with
the device check widened to the CPU.  The tests marked ``gpu`` run the same on real CUDA graphs
(``pytest -m gpu``; skipped without a CUDA device).
"""
import warnings

import numpy as np
import pytest
import torch

import tensorplay as tp
from tensorplay.compiler import config
from tensorplay.compiler.backends import stax
from tensorplay.compiler.backends.stax import device
from tensorplay.compiler.backends.stax.triton import cudagraphs
from tensorplay.compiler.backends.stax.triton.cudagraphs import (STALE_MESSAGE, OutputLifetimes, StaleOutput,
                                                                 cudagraphify)

pytestmark = pytest.mark.usefixtures("stax_cache")

STALE = r"tp.compile\(mode='reduce-overhead'\): this output of call {n} was overwritten by call {m} " \
        r"\(CUDA graph replay, §9.9\); clone\(\) it to keep it"


class FakeGraph:
    """The CPU's stand-in for ``cudagraphs.CUDAGraph`` (same three methods).  A real capture runs
    no kernel: here the capture runs the call once to learn its outputs and then puts back what it
    wrote into the inputs (without bumping their versions, which the capture does bump); a replay
    runs it again on the same inputs and writes the results into the captured outputs."""
    made = []

    def __init__(self, dev):
        self.device = dev
        self.warmups = self.captures = self.replays = 0
        self.fn = self.outs = None
        FakeGraph.made.append(self)

    def warmup(self, fn):
        self.warmups += 1
        return fn()

    def capture(self, call, inputs):
        self.captures += 1
        self.fn = lambda: call(list(inputs))
        before = [(t._version, t.clone()) for t in inputs]
        self.outs = tuple(self.fn())
        for t, (v, b) in zip(inputs, before):
            if t._version != v:
                t.data.copy_(b)
        return self.outs

    def replay(self):
        self.replays += 1
        for o, n in zip(self.outs, self.fn()):
            if o is not n:
                o.copy_(n)


class FailingGraph(FakeGraph):
    def capture(self, call, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture(autouse=True)
def _fresh_fakes():
    FakeGraph.made = []
    yield


def affine(args):
    """A wrapper-like ``call``: (x * 2 + y, (x * y).sum(0))."""
    x, y = args
    args.clear()
    return (x * 2 + y, (x * y).sum(0))


def graphed(call=affine, **kw):
    return cudagraphify(call, graph_factory=FakeGraph, **kw)


def pair(seed, shape=(4, 3)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


# ---- cudagraphify: warm-up, capture, replay ---------------------------------------------------------

def test_warmup_then_capture_then_replays_with_inputs_copied_each_call():
    g = graphed()
    results = []
    for k in range(5):
        x, y = pair(k)
        args = [x, y]
        outs = g(args)
        assert args == []                              # the contract of call(args): the list is cleared
        ref = affine([x, y])
        torch.testing.assert_close(outs[0], ref[0])
        torch.testing.assert_close(outs[1], ref[1])
        if k >= 1:                                     # the static inputs hold this call's arguments
            assert torch.equal(g.static_inputs[0], x) and torch.equal(g.static_inputs[1], y)
            assert g.static_inputs[0] is not x
        results.append(outs)
    assert g.calls == 5
    assert g.counters == {"warmups": 1, "captures": 1, "replays": 4, "direct": 0}
    fake, = FakeGraph.made
    assert (fake.warmups, fake.captures, fake.replays) == (1, 1, 4)
    assert results[0][0] is not g.static_outputs[0]    # the warm-up's outputs are its own
    assert all(r[0] is g.static_outputs[0] for r in results[1:])   # every replay: the same memory
    assert g.pooled == (0, 1) and g.mutated == ()


def test_more_warmups_and_warmup_must_be_positive():
    g = graphed(warmup=3)
    for k in range(4):
        g(list(pair(k)))
    assert g.counters == {"warmups": 3, "captures": 1, "replays": 1, "direct": 0}
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        cudagraphify(affine, warmup=0)


def test_an_argument_that_is_the_static_input_is_not_copied():
    g = graphed()
    g(list(pair(0)))
    g(list(pair(1)))
    s0, s1 = g.static_inputs
    v0, v1 = s0._version, s1._version
    x, y = pair(2)
    s0.copy_(x)                                        # the caller fills the static input itself
    v0 = s0._version
    outs = g([s0, y])
    assert s0._version == v0 and s1._version > v1      # copied: y only
    torch.testing.assert_close(outs[0], x * 2 + y)


def test_static_argnums_are_used_in_place_and_another_tensor_runs_directly():
    w = torch.randn(4, 3)

    def call(args):
        x, w_ = args
        args.clear()
        return (x + w_,)
    g = graphed(call, static_argnums=[1])
    g([torch.ones(4, 3), w])
    g([torch.ones(4, 3), w])
    assert g.static_inputs[1] is w                     # never copied
    w.add_(1)                                          # its memory is read at every replay
    outs = g([torch.zeros(4, 3), w])
    torch.testing.assert_close(outs[0], w)
    other = torch.randn(4, 3)
    outs = g([torch.zeros(4, 3), other])               # not the captured tensor: call runs directly
    torch.testing.assert_close(outs[0], other)
    assert not g.last_replayed and g.counters["direct"] == 1 and g.counters["replays"] == 2


def test_other_shapes_strides_or_dtypes_run_directly_without_touching_the_pool():
    g = graphed()
    g(list(pair(0)))
    kept = g(list(pair(1)))[0]
    before = kept.clone()
    for x, y in [pair(2, (5, 3)), (pair(3)[0].t().contiguous().t(), pair(3)[1]),
                 tuple(t.double() for t in pair(4))]:
        outs = g([x, y])
        torch.testing.assert_close(outs[0], x * 2 + y)
        assert not g.last_replayed and outs[0] is not g.static_outputs[0]
    assert torch.equal(kept, before)                   # no replay: the pool was not written
    assert g.counters == {"warmups": 1, "captures": 1, "replays": 1, "direct": 3}
    outs = g(list(pair(5)))                            # the captured layout replays again
    assert g.last_replayed and outs[0] is g.static_outputs[0]


def test_broadcast_inputs_are_copied_once_per_element_in_memory():
    g = graphed()
    b = torch.randn(3).expand(4, 3)                    # stride 0 along dim 0
    for k in range(3):
        b = torch.randn(3).expand(4, 3)
        x = torch.randn(4, 3)
        outs = g([b, x])
        torch.testing.assert_close(outs[0], b * 2 + x)
    assert g.counters["replays"] == 2 and g.static_inputs[0].stride() == (0, 1)


def test_inputs_returned_as_outputs_are_the_callers_tensors():
    def call(args):
        x, = args
        args.clear()
        return (x, x[1:], x + 1)
    g = graphed(call)
    g([torch.zeros(4, 3)])
    for k in range(3):
        x = torch.full((4, 3), float(k))
        outs = g([x])
        assert outs[0] is x                            # the caller's tensor, not the static copy
        assert outs[1].data_ptr() == x[1:].data_ptr() and outs[1].shape == (3, 3)
        torch.testing.assert_close(outs[2], x + 1)
    assert g.pooled == (2,)


def test_inputs_the_graph_writes_are_written_back():
    def call(args):
        x, y = args
        args.clear()
        out = x + y
        x.copy_(x * 10)                               # (the wrapper's write-back of a mutated input)
        return (out,)
    g = graphed(call)
    for k in range(4):
        x, y = pair(k)
        x0 = x.clone()
        outs = g([x, y])
        torch.testing.assert_close(outs[0], x0 + y)
        torch.testing.assert_close(x, x0 * 10)       # as eager: the caller's tensor was written
    assert g.mutated == (0,)


def test_a_capture_that_fails_warns_once_and_runs_directly():
    g = cudagraphify(affine, graph_factory=FailingGraph)
    g(list(pair(0)))
    with pytest.warns(RuntimeWarning, match="no CUDA graph for this graph .the capture failed: RuntimeError: "
                                            "operation not permitted"):
        outs = g(list(pair(1)))
    x, y = pair(1)
    torch.testing.assert_close(outs[0], x * 2 + y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g(list(pair(2)))
    assert g.counters == {"warmups": 1, "captures": 0, "replays": 0, "direct": 2}


# ---- the output-lifetime rule -------------------------------------------------------------------------

def test_stale_outputs_raise_on_every_use_and_clones_survive():
    run = OutputLifetimes(graphed())
    x, y = pair(0)
    warm = run([x, y])[0]                              # call 1: warm-up, an ordinary tensor
    first = run(list(pair(1)))                         # call 2: capture + replay
    kept = first[0].clone()
    second = run(list(pair(2)))                        # call 3: a replay overwrites call 2's outputs
    for stale in first:
        assert isinstance(stale._data, StaleOutput)
    uses = [lambda t: t.sum(), lambda t: t.numpy(), lambda t: print(t), lambda t: repr(t), lambda t: str(t),
            lambda t: t + 1, lambda t: 1 + t, lambda t: t.shape, lambda t: t[0], lambda t: tp.relu(t),
            lambda t: t.clone(), lambda t: np.asarray(t), lambda t: t.tolist(), lambda t: t.item(),
            lambda t: float(t), lambda t: t.torch() + 1, lambda t: torch.add(t.torch(), 1),
            lambda t: t.data.sum()]
    for use in uses:
        for stale in first:
            with pytest.raises(RuntimeError, match=STALE.format(n=2, m=3)):
                use(stale)
    x1, y1 = pair(1)
    torch.testing.assert_close(kept._data, x1 * 2 + y1)        # the clone kept call 2's values
    x2, y2 = pair(2)
    torch.testing.assert_close(second[0]._data, x2 * 2 + y2)   # the latest output is correct
    torch.testing.assert_close(second[1]._data, (x2 * y2).sum(0))
    torch.testing.assert_close(warm._data, x * 2 + y)          # a warm-up's output is not stale
    third = run(list(pair(3)))
    with pytest.raises(RuntimeError, match=STALE.format(n=3, m=4)):
        second[0].sum()
    assert third[0]._data is run.graphed.static_outputs[0]


def test_the_message_is_the_documented_one():
    assert STALE_MESSAGE.format(n=1, m=2) == ("tp.compile(mode='reduce-overhead'): this output of call 1 was "
                                              "overwritten by call 2 (CUDA graph replay, §9.9); clone() it to "
                                              "keep it")


def test_a_list_of_outputs_exercise_27():
    """Exercise 27: the loop that appends every step's output.  Without the rule, every entry would
    show the last step (one memory); with it, every entry but the last raises."""
    run = OutputLifetimes(graphed())
    outs = [run(list(pair(k)))[1] for k in range(5)]
    for k, o in enumerate(outs[1:-1], start=1):        # calls 2..4 were replays overwritten later
        with pytest.raises(RuntimeError, match=STALE.format(n=k + 1, m=k + 2)):
            o.numpy()
    x, y = pair(4)
    torch.testing.assert_close(outs[-1]._data, (x * y).sum(0))
    torch.testing.assert_close(outs[0]._data, (pair(0)[0] * pair(0)[1]).sum(0))   # the warm-up's
    losses = [run(list(pair(k)))[1].clone() for k in range(5, 8)]                   # the fix: clone()
    for k, o in zip(range(5, 8), losses):
        x, y = pair(k)
        torch.testing.assert_close(o._data, (x * y).sum(0))


def test_a_direct_call_does_not_make_the_last_replay_stale():
    run = OutputLifetimes(graphed())
    run(list(pair(0)))
    out = run(list(pair(1)))[0]
    other = run(list(pair(2, (2, 3))))[0]               # another shape: direct, the pool untouched
    x, y = pair(1)
    torch.testing.assert_close(out._data, x * 2 + y)
    x, y = pair(2, (2, 3))
    torch.testing.assert_close(other._data, x * 2 + y)
    run(list(pair(3)))
    with pytest.raises(RuntimeError, match=STALE.format(n=2, m=4)):
        out.sum()
    torch.testing.assert_close(other._data, x * 2 + y)


def test_inputs_returned_as_outputs_and_reassigned_outputs_are_not_stale():
    def call(args):
        x, = args
        args.clear()
        return (x, x + 1)
    run = OutputLifetimes(graphed(call))
    run([torch.zeros(2)])
    x = torch.ones(2)
    same, plus = run([x])
    plus.data = tp.zeros(2)                            # the user's tensor holds other memory now
    run([torch.ones(2) * 3])
    assert same._data is x and torch.equal(same._data, torch.ones(2))
    assert torch.equal(plus._data, torch.zeros(2))


def test_an_output_fed_back_as_the_next_input():
    run = OutputLifetimes(graphed())
    y0 = tp.from_torch(torch.ones(4, 3))
    a = tp.from_torch(torch.randn(4, 3))
    run([a._data, y0._data])
    h = run([a._data, y0._data])[0]
    h2 = run([a._data, h._data])[0]                    # the input is copied before the replay
    torch.testing.assert_close(h2._data, a._data * 2 + (a._data * 2 + y0._data))
    with pytest.raises(RuntimeError, match=STALE.format(n=2, m=3)):
        h.sum()


def test_poisoning_costs_one_pass_over_the_outputs():
    """O(#outputs) per replay: what is kept between replays is one weak reference per output of
    the latest replay -- nothing accumulates over calls."""
    run = OutputLifetimes(graphed())
    for k in range(50):
        run(list(pair(k)))
    assert len(run._live) == 2


# ---- a Stax wrapper on the stand-in: the kept buffers ---------------------------------------------------

def test_a_stax_wrapper_keeps_only_buffers_of_its_own_capture(config_patch):
    """runtime.take/stash under capture: the warm-up's kept buffers are dropped before the capture
    (they are outside the pool); those the capture kept are reused by every replay."""
    config_patch("stax.graph_cache", False)
    w = tp.randn(3, 5)
    cf = tp.compile(lambda x: ((x.exp() + 1) @ w).relu() * 2)
    x0 = tp.randn(6, 3)
    cf(x0)
    art = cf._cache[0].artifact
    mod = art.module
    assert "stash(spare" in art.source
    mod.spare.clear()
    g = cudagraphify(mod.call, spare=mod.spare, fixed=mod.constants, graph_factory=FakeGraph)
    run = OutputLifetimes(g)
    x = tp.randn(6, 3)
    ref = ((x.exp() + 1) @ w).relu() * 2
    torch.testing.assert_close(run([x._data, w._data])[0]._data, ref._data)
    warm = list(mod.spare.values())
    assert warm                                        # the warm-up kept its intermediate
    for k in range(4):
        x = tp.randn(6, 3)
        out = run([x._data, w._data])[0]
        torch.testing.assert_close(out._data, (((x.exp() + 1) @ w).relu() * 2)._data, rtol=1e-5, atol=1e-5)
        if k == 0:
            kept = list(mod.spare.values())
            assert kept and not any(t is u for t in kept for u in warm)
    assert g.counters["replays"] == 4


# ---- through tp.compile (the device check widened to the CPU) ---------------------------------------------

@pytest.fixture
def graphs_on_cpu(monkeypatch, config_patch):
    """``stax.cudagraphs`` acting on CPU tensors, with the stand-in for the graph."""
    config_patch("stax.graph_cache", False)
    from tensorplay.compiler.backends.stax.cpp.backend import CppBackend
    from tensorplay.compiler.backends.stax.triton.backend import TritonBackend
    # the CPU's backend replays graphs as the CUDA one does (DeviceBackend.graph_runner)
    monkeypatch.setattr(CppBackend, "graph_runner", lambda self, *a: TritonBackend().graph_runner(*a))
    monkeypatch.setattr(cudagraphs, "CUDAGraph", FakeGraph)


def _compile(fn, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)    # (no effect on CPU yet: said once per process)
        return tp.compile(fn, mode="reduce-overhead", **kw)


def test_tp_compile_reduce_overhead_replays_and_poisons(graphs_on_cpu):
    w = tp.randn(3, 4)

    def fn(x):
        return (x @ w).relu() + x.sum(-1, keepdim=True)
    cf = _compile(fn)
    x = tp.randn(5, 3)
    outs = []
    for k in range(6):
        x.copy_(tp.randn(5, 3))                        # new values in the same tensor
        out = cf(x)
        torch.testing.assert_close(out._data, fn(x)._data, rtol=1e-5, atol=1e-5)
        outs.append((out, out.clone()))
    art = cf._cache[0].artifact
    g = art.cudagraph
    assert not hasattr(art, "direct")                  # the fast path goes through run: poisoning
    # call 1 is the capture run (api), call 2 of the artifact is the warm-up, then captures/replays
    assert g.counters == {"warmups": 1, "captures": 1, "replays": 4, "direct": 0}
    assert g.static_argnums == {1}                     # the free tensor w: used in place
    for k, (out, clone) in enumerate(outs[2:-1]):
        with pytest.raises(RuntimeError, match=STALE.format(n=k + 2, m=k + 3)):
            out.sum()
        assert np.isfinite(clone.numpy()).all()
    assert outs[-1][0].sum().item() == pytest.approx(outs[-1][1].sum().item())
    for out, clone in outs[:2]:                        # the capture run's and the warm-up's outputs
        torch.testing.assert_close(out._data, clone._data)


def test_tp_compile_first_level_fast_path_also_poisons(graphs_on_cpu):
    cf = _compile(lambda x: x * 3)
    x = tp.randn(8)
    a = [cf(x) for _ in range(4)]                      # same tensor, same version: the fast path
    assert cf.counters["first_level_hits"] >= 2
    with pytest.raises(RuntimeError, match=STALE.format(n=2, m=3)):
        a[2].sum()
    torch.testing.assert_close(a[3]._data, x._data * 3)


def test_training_regions_are_not_graphed(graphs_on_cpu):
    w = tp.randn(3, 2, requires_grad=True)
    cf = _compile(lambda x: (x @ w).tanh().sum())
    for _ in range(4):
        loss = cf(tp.randn(4, 3))
        loss.backward()
    assert FakeGraph.made == []
    with tp.no_grad():                                 # inference with the same weights: graphed
        outs = [cf(tp.randn(4, 3)) for _ in range(4)]
    assert len(FakeGraph.made) == 1
    with pytest.raises(RuntimeError, match="was overwritten by call"):
        outs[-2].item()


def test_on_cpu_the_option_has_no_effect_and_says_so(monkeypatch):
    from tensorplay.compiler import api
    monkeypatch.setattr(api, "_WARNED_NO_EFFECT", set())
    with pytest.warns(UserWarning, match=r"no effect on CPU yet: stax.cudagraphs=True .* does take effect on "
                                         r"CUDA tensors"):
        cf = tp.compile(lambda x: x + 1, mode="reduce-overhead")
    x = tp.randn(4)
    a = [cf(x) for _ in range(4)]
    art = cf._cache[0].artifact
    assert not hasattr(art, "cudagraph") and hasattr(art, "direct")
    for t in a:                                        # every output its own memory
        torch.testing.assert_close(t._data, x._data + 1)


# ---- on a GPU ------------------------------------------------------------------------------------------------

def _mlp(args):
    x, w = args
    args.clear()
    h = torch.relu(x @ w)
    return (h, h.sum(1), torch.tanh(h) * 2 - 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_cudagraphify_matches_eager_and_replays():
    g = cudagraphify(_mlp)
    w = torch.randn(64, 32, device="cuda")
    for k in range(6):
        x = torch.randn(128, 64, device="cuda")
        outs = g([x, w])
        ref = _mlp([x, w])
        for o, r in zip(outs, ref):
            torch.testing.assert_close(o, r)
    assert g.counters == {"warmups": 1, "captures": 1, "replays": 5, "direct": 0}
    assert isinstance(g._graph, cudagraphs.CUDAGraph)
    outs = g([torch.randn(7, 64, device="cuda"), w])    # another shape: no replay
    assert not g.last_replayed and outs[0].shape == (7, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_stale_outputs_raise_and_inputs_are_handled():
    def call(args):
        x, y = args
        args.clear()
        out = x * y
        y.copy_(y + 1)                                 # an input the graph writes
        return (out, x)                                # an input returned
    run = OutputLifetimes(cudagraphify(call))
    outs = []
    for k in range(4):
        x = torch.randn(1000, device="cuda")
        y = torch.randn(1000, device="cuda")
        y0 = y.clone()
        out, same = run([x, y])
        torch.testing.assert_close(out._data, x * y0)
        torch.testing.assert_close(y, y0 + 1)
        assert same._data is x
        outs.append(out)
    with pytest.raises(RuntimeError, match=STALE.format(n=3, m=4)):
        outs[2].sum()
    assert torch.isfinite(outs[0].sum()._data)          # the warm-up's output is its own


class _ExternOnly(device.DeviceBackend):
    """A CUDA device backend for graphs of extern kernels only (matmul): no kernel of its own."""
    name = "extern-only"

    def render(self, plan, name):
        raise NotImplementedError("extern-only stub: no kernels")


@pytest.fixture
def cuda_backend(config_patch):
    """The Stax backend for CUDA tensors: the registered one (the Triton backend), else the stub."""
    config_patch("stax.graph_cache", False)
    if "cuda" in device.registered_devices():
        yield device.device_backend("cuda")
        return
    stub = _ExternOnly()
    device.register_device_backend("cuda", stub)
    try:
        yield stub
    finally:
        device.unregister_device_backend("cuda", stub.name)


def _check_reduce_overhead_on_cuda(fn, make_args, calls=6):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cf = tp.compile(fn, mode="reduce-overhead", strict_native=True)
    outs = []
    for k in range(calls):
        args = make_args(k)
        out = cf(*args)
        ref = fn(*args)
        torch.testing.assert_close(out._data, ref._data, rtol=1e-4, atol=1e-4)
        outs.append(out)
    g = cf._cache[0].artifact.cudagraph
    assert g.counters["captures"] == 1 and g.counters["replays"] == calls - 2
    with pytest.raises(RuntimeError, match=STALE.format(n=calls - 2, m=calls - 1)):
        outs[-2].sum()
    torch.testing.assert_close(outs[-1].clone()._data, outs[-1]._data)
    return cf


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_tp_compile_reduce_overhead_extern_graph(cuda_backend):
    w = tp.randn(64, 48, device="cuda")
    _check_reduce_overhead_on_cuda(lambda x: x @ w, lambda k: (tp.randn(32, 64, device="cuda"),))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_tp_compile_reduce_overhead_fused_kernels(cuda_backend):
    if isinstance(cuda_backend, _ExternOnly):
        pytest.skip("no Stax kernel backend for CUDA in this checkout (the Triton backend)")
    w = tp.randn(64, 48, device="cuda")
    _check_reduce_overhead_on_cuda(lambda x: ((x @ w).relu() * 2 + 1).softmax(-1),
                                   lambda k: (tp.randn(32, 64, device="cuda"),))
