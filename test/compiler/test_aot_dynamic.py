"""AOT autograd on symbolic sizes (the chapter, §10 with §5; docs/aot.md "Symbolic sizes").

With ``dynamic=True`` the joint graph is traced on the capture's symbolic fakes, so one forward and
one backward graph serve every batch size: a counting forward/backward compiler sees each once,
saved values have symbolic shapes, and values and gradients equal eager (bit for bit with
``aot_eager``: the same kernels in the same order) and PyTorch for every size.  The first call of a
compiled function is the capture run: every check judges later calls.
"""
import os
import sys

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.compiler.aot import aot_backend
from tensorplay.compiler.backends.eager import aot_eager_backend, raw_function

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


class CountingAOT:
    """A training backend that records every graph its forward and backward compilers get (with
    the example inputs) and runs them op by op, as ``aot_eager`` does."""

    dynamic_shapes = True

    def __init__(self):
        self.fw, self.bw = [], []

    def __call__(self, gm, example_inputs, **kw):
        from tensorplay.compiler.aot import is_training_region
        from tensorplay.compiler.backends.eager import eager_backend
        if not is_training_region(example_inputs):
            return eager_backend(gm, example_inputs)

        def compiler(store):
            def comp(g, ex):
                store.append((g, list(ex)))
                return raw_function(g)
            return comp
        return aot_backend(gm, example_inputs, fw_compiler=compiler(self.fw), bw_compiler=compiler(self.bw),
                           bw_fallback=raw_function, options=kw.get("options"))


def _is_symbolic(t) -> bool:
    return any(isinstance(s, torch.SymInt) for s in t.shape)


def _pair(make, seed=0):
    """A module and a copy with the same parameters (the eager reference)."""
    tp.manual_seed(seed)
    m, ref = make(), make()
    ref.load_state_dict(m.state_dict())
    return m, ref


def _mlp_pair(seed=0):
    return _pair(lambda: nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)),
                 seed)


def _torch_mlp(m):
    """The same MLP in PyTorch, with m's current parameters (leaves requiring grad)."""
    ps = [torch.tensor(p._data.clone().numpy(), requires_grad=True) for p in m.parameters()]

    def run(x):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, ps[0], ps[1]))
        h = torch.tanh(torch.nn.functional.linear(h, ps[2], ps[3]))
        return torch.nn.functional.linear(h, ps[4], ps[5])
    return run, ps


def _train_and_compare(cm, m, ref, batches, exact=True, seed=None, check=None):
    """For each inputs tuple: the capture/compiled call and eager on ``ref`` (same parameters), the
    outputs and the parameters' gradients of a random projection compared (bit for bit when
    ``exact``); ``seed(inputs)`` reseeds before each call (dropout); ``check(inputs, out)``
    compares more."""
    g = torch.Generator().manual_seed(1)

    def call(mod, inputs, first=False):
        if seed is not None:
            tp.manual_seed(seed(inputs) + (1000 if first else 0))
        out = mod(*inputs)
        return out if isinstance(out, tuple) else (out,)
    same = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5))
    for inputs in batches:
        call(cm, inputs, first=True)                      # (the first call is the capture run)
        call(ref, inputs, first=True)
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        out, r = call(cm, inputs), call(ref, inputs)
        assert out[0].grad_fn.name() == "CompiledRegionFunctionBackward"
        ws = [tp.Tensor(torch.randn(o.shape, generator=g)) for o in r]
        for o, e in zip(out, r):
            assert same(o._data, e._data), [tuple(t.shape) for t in inputs]
        sum((o * w).sum() for o, w in zip(out, ws)).backward()
        sum((e * w).sum() for e, w in zip(r, ws)).backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            assert same(p.grad._data, q.grad._data), [tuple(t.shape) for t in inputs]
        for a, b in zip(m.buffers(), ref.buffers()):
            assert torch.equal(a._data, b._data)          # buffers written back (running statistics)
        if check is not None:
            check(inputs, out, ws)


def test_mlp_trained_over_batch_sizes_compiles_one_forward_and_one_backward():
    m, ref = _mlp_pair()
    backend = CountingAOT()
    cm = tp.compile(m, dynamic=True, backend=backend)

    def against_torch(inputs, out, ws):
        run, ps = _torch_mlp(m)
        t_out = run(torch.tensor(inputs[0]._data.numpy()))
        (t_out * ws[0]._data).sum().backward()
        assert torch.allclose(out[0]._data, t_out.detach(), rtol=1e-4, atol=1e-5)
        for p, q in zip(m.parameters(), ps):
            assert torch.allclose(p.grad._data, q.grad, rtol=1e-4, atol=1e-5)
    sizes = list(range(3, 41)) + [7, 40, 3]
    _train_and_compare(cm, m, ref, [(tp.randn(n, 6),) for n in sizes], check=against_torch)
    assert len(backend.fw) == 1 and len(backend.bw) == 1
    assert cm.counters["captures"] == 1 and cm.counters["backward_compiles"] == 1


def test_aot_eager_is_shape_polymorphic_and_counts_one_artifact():
    assert aot_eager_backend.dynamic_shapes is True
    m, ref = _mlp_pair(seed=3)
    cm = tp.compile(m, dynamic=True, backend="aot_eager")
    _train_and_compare(cm, m, ref, [(tp.randn(n, 6),) for n in (3, 11, 7, 40, 2, 25)])
    assert cm.counters["captures"] == 1 and cm.counters["backward_compiles"] == 1


def test_graphs_carry_symbolic_meta_and_examples_are_at_the_hint_sizes():
    """The contract a training backend relies on: every node of both graphs has a symbolic
    ``meta["val"]`` of the capture's ShapeEnv; the example tensors are real, at the sample's sizes;
    the backward is compiled when the forward is (before the key is built), saved values' shapes
    are symbolic."""
    m, _ = _mlp_pair()
    backend = CountingAOT()
    cm = tp.compile(m, dynamic=True, backend=backend)
    x = tp.randn(9, 6)
    cm(x)
    assert len(backend.fw) == 1 and len(backend.bw) == 1     # both compiled at the first call
    (fw, fw_ex), (bw, bw_ex) = backend.fw[0], backend.bw[0]
    envs = set()
    for g in (fw, bw):
        for n in g.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                assert v.fake_mode is not None and v.fake_mode.shape_env is not None, n.name
                envs.add(id(v.fake_mode.shape_env))
    assert len(envs) == 1
    assert _is_symbolic(fw.graph.placeholders[0].meta["val"])
    assert any(_is_symbolic(p.meta["val"]) for p in bw.graph.placeholders)
    for g, ex in ((fw, fw_ex), (bw, bw_ex)):
        assert len(ex) == len(g.graph.placeholders)
        for p, t in zip(g.graph.placeholders, ex):
            v = p.meta["val"]
            assert type(t._data) is torch.Tensor and t._data.device.type == "cpu"
            assert tuple(t.shape) == tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else s for s in v.shape)
    assert fw_ex[0].shape == (9, 6)
    assert bw.graph.size_symbols           # the backward reads its sizes from its own inputs
    low = cm._compiled_forward._cache[0].artifact.aot.lowered
    saved = low.saved_values
    assert any(not isinstance(d, int) for s in saved for d in s.shape)
    assert all(isinstance(s.nbytes, int) for s in saved)


def test_tracing_adds_no_shape_guard_for_an_mlp():
    m, _ = _mlp_pair()
    cm = tp.compile(m, dynamic=True, backend="aot_eager")
    cm(tp.randn(5, 6))
    low = cm._compiled_forward._cache[0].lowered
    assert not [g for g in low.guards if g.startswith("shape guard")]
    assert any("size[0] = s" in g for g in low.guards)       # the batch size stays a symbol


def test_a_shape_guard_recorded_while_tracing_the_joint_graph_reaches_the_key(monkeypatch):
    """A derivative formula that branches on a size records a shape guard during AOT tracing; it
    must be in the key (``Lowered.add_shape_guards`` runs after the backend), so a size on the
    other side of the branch recompiles instead of reusing a wrong backward."""
    from tensorplay.ops.registry import OPS
    op = OPS["tanh"]
    orig = op.backward

    def branching(ctx, g):
        r = orig(ctx, g)
        return r * 2 if ctx.result.shape[0] % 2 == 0 else r    # a size branch inside a formula
    monkeypatch.setattr(op, "backward", branching)

    def f(x, w):
        return (x @ w).tanh()
    cf = tp.compile(f, dynamic=True, backend="aot_eager")
    tp.manual_seed(0)
    w = tp.Tensor(torch.randn(4, 3), requires_grad=True)
    grads = {}
    for n in (4, 6, 5, 7):
        x = tp.Tensor(torch.randn(n, 4), requires_grad=True)
        cf(x, w)
        w.grad = None
        cf(x, w).sum().backward()
        grads[n] = w.grad._data.clone()
        w.grad = None
        f(x, w).sum().backward()                         # eager, with the same (patched) formula
        assert torch.equal(grads[n], w.grad._data), n
    guards = [g for g in cf._cache[0].lowered.guards if g.startswith("shape guard")]
    assert any("Mod" in g for g in guards), guards
    assert cf.counters["captures"] == 2                  # one per side of the branch


def test_backward_that_needs_only_a_size_saves_an_input_carrying_it():
    """``x.sum() * w``: x's gradient is ``g * w`` expanded to x's shape, so the backward needs x's
    size but none of x's values; the min cut saves no tensor of that size, so the partitioner
    saves x itself (the backward reads s0 from it)."""
    def f(x, w):
        return x.sum() * w
    cf = tp.compile(f, dynamic=True, backend="aot_eager")
    for n in (3, 8, 5):
        x = tp.Tensor(torch.randn(n, 2), requires_grad=True)
        w = tp.Tensor(torch.randn(()), requires_grad=True)
        cf(x, w)
        out = cf(x, w)
        out.backward()
        xe = tp.Tensor(x._data.clone(), requires_grad=True)
        we = tp.Tensor(w._data.clone(), requires_grad=True)
        f(xe, we).backward()
        assert torch.equal(out._data, f(xe, we)._data)
        x2 = x.grad._data
        assert x2.shape == (n, 2) and torch.equal(x2, xe.grad._data)
    assert cf.counters["captures"] == 1 and cf.counters["backward_compiles"] == 1
    rt = cf._cache[0].artifact.aot
    assert "primals_0" in rt.lowered.partition.saved_names
    assert {src.input for src in rt.bw_gm.graph.size_symbols.values()} == {"primals_0"}


@pytest.mark.parametrize("case", ["mean_softmax", "layer_norm", "cross_entropy", "flatten_view", "two_sizes"])
def test_ops_with_size_arguments_train_over_sizes(case):
    tp.manual_seed(1)
    w = tp.Tensor(torch.randn(4, 4), requires_grad=True)

    def f(x, y):
        h = x @ w
        if case == "mean_softmax":
            return h.softmax(-1).mean()
        if case == "layer_norm":
            return F.layer_norm(h, (4,)).square().mean(0)
        if case == "cross_entropy":
            return F.cross_entropy(h, y)
        if case == "flatten_view":
            return (h.reshape(-1) * 2).view(x.shape[0], 2, 2).sum(1).tanh()
        return (h.sum(0, keepdim=True) + h[: x.shape[0] // 2].mean(0)).exp()
    cf = tp.compile(f, dynamic=True, backend="aot_eager")
    for n in (4, 9, 6, 13):
        x = tp.Tensor(torch.randn(n, 4), requires_grad=True)
        y = tp.Tensor(torch.randint(0, 4, (n,)))
        cf(x, y)
        w.grad = None
        out = cf(x, y)
        out.sum().backward()
        gx, gw = x.grad._data.clone(), w.grad._data.clone()
        x.grad = None
        w.grad = None
        r = f(x, y)
        r.sum().backward()
        assert torch.equal(out._data, r._data), (case, n)
        assert torch.equal(gx, x.grad._data) and torch.equal(gw, w.grad._data), (case, n)
    expected = 1
    assert cf.counters["captures"] == expected, cf.recompile_reasons


def test_batchnorm_and_dropout_train_over_batch_sizes():
    m, ref = _pair(lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.25),
                                         nn.Linear(8, 2)))
    cm = tp.compile(m, dynamic=True, backend="aot_eager")
    _train_and_compare(cm, m, ref, [(tp.randn(n, 6),) for n in (5, 12, 7)], seed=lambda inputs: inputs[0].shape[0])
    assert cm.counters["captures"] == 1


def test_gpt_training_over_batch_and_sequence_lengths_aot_eager():
    from gpt import GPT, GPTConfig
    m, ref = _pair(lambda: GPT(GPTConfig()))
    backend = CountingAOT()
    cm = tp.compile(m, dynamic=True, backend=backend)
    batches = [(tp.randint(0, 64, (B, T)), tp.randint(0, 64, (B, T))) for B, T in ((2, 16), (3, 20), (2, 7), (5, 31))]
    _train_and_compare(cm, m, ref, batches, exact=False)
    assert len(backend.fw) == 1 and len(backend.bw) == 1


def test_static_capture_keeps_static_graphs_and_lazy_backward():
    m, _ = _mlp_pair()
    backend = CountingAOT()
    cm = tp.compile(m, backend=backend)
    x = tp.randn(4, 6)
    cm(x)
    out = cm(x)
    assert len(backend.bw) == 0                          # static: the backward is built at the first backward()
    out.sum().backward()
    assert len(backend.bw) == 1
    for g, _ in backend.fw + backend.bw:
        for n in g.graph.nodes:
            v = n.meta.get("val")
            assert not isinstance(v, torch.Tensor) or not _is_symbolic(v)
