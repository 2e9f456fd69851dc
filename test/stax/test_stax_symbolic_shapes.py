"""Dynamic shapes with a counting backend (the chapter, §10.4, example 10.4, experiment 5).

``tp.compile(fn, dynamic=True)``: input sizes other than 0 and 1 are symbols, so one artifact
serves every size its shape guards accept.  A *counting backend* runs the captured graph and counts
how many artifacts were made.  Stax kernels take the sizes as arguments (one artifact too); a graph
Stax cannot compile symbolically is specialised to the sample's sizes with a recorded reason
(test/stax/test_stax_symbolic_kernels.py checks the kernels themselves).
"""
import os
import random
import sys

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler.capture.pytree import tree_flatten

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from dynamic_shapes import Counting  # noqa: E402  (experiment 5's counting backend)


def _check(cf, *args):
    """The first artifact's guard on a call with ``args``: None (a hit) or the reason."""
    leaves, spec = tree_flatten((args, {}))
    return cf._cache[0].check(leaves, [], spec)


def _f_branch(x):
    if x.shape[0] % 8 == 0:          # a shape branch: a shape guard, evaluated on the sample
        return (x * 2).sum(-1)
    return (x + 1).sum(-1)


def test_example_10_4_a_shape_branch_gives_two_artifacts():
    backend = Counting()
    cf = tp.compile(_f_branch, dynamic=True, backend=backend)
    for n in (64, 16, 24, 40, 12, 3, 13, 1000):
        x = tp.randn(n, 5)
        cf(x)
        assert torch.allclose(cf(x)._data, _f_branch(x)._data)
    assert len(backend.graphs) == 2


def test_example_10_4_sizes_zero_one_and_general_give_three_artifacts():
    backend = Counting()
    f = lambda x: (x.exp() + 1).sum(0)     # noqa: E731
    cf = tp.compile(f, dynamic=True, backend=backend)
    for n in (7, 0, 1, 2, 100, 0, 1, 33):
        x = tp.randn(n, 3)
        cf(x)
        got = cf(x)
        assert got.shape == (3,) and torch.allclose(got._data, f(x)._data)
    assert len(backend.graphs) == 3
    reasons = [r for rs in cf.recompile_reasons for r in rs]
    assert any("0 and 1 are specialised" in r for r in reasons)


def test_length_sweep_one_artifact_against_one_per_length():
    """§13.4's sweep: 1000 calls with lengths uniform in 2..512 — one artifact with dynamic=True
    (length 1 would add one: the 0/1 specialisation), one per distinct length without."""
    rng = random.Random(0)
    lengths = [rng.randint(2, 512) for _ in range(1000)]
    f = lambda x, w: (x @ w).relu().sum(0)     # noqa: E731
    w = tp.randn(16, 4)
    dyn, static = Counting(), Counting()
    cf_dyn = tp.compile(f, dynamic=True, backend=dyn)
    cf_static = tp.compile(f, backend=static, dynamic=False, recompile_limit=10_000)
    for i, n in enumerate(lengths):
        x = tp.randn(n, 16)
        out = cf_dyn(x, w)
        if i % 97 == 0:
            assert torch.allclose(out._data, f(x, w)._data, atol=1e-5)
        if i < 200:
            cf_static(x, w)
    assert len(dyn.graphs) == 1
    assert len(static.graphs) == len(set(lengths[:200]))


def test_the_graph_has_no_sample_sizes_and_the_guard_says_where_each_condition_came_from():
    backend = Counting()
    cf = tp.compile(_f_branch, dynamic=True, backend=backend)
    x = tp.randn(48, 7)
    cf(x)
    (gm,) = backend.graphs
    assert "48" not in gm.code and "= x.shape[0]" in gm.code
    src = cf._cache[0].guard.source
    assert ">= 2 (a symbol, hint 48" in src                     # the 0/1 specialisation
    assert "Mod(" in src and "test_stax_symbolic_shapes.py" in src   # the branch, with its line
    assert "stride[0]" in src                                   # the layout, as sizes
    for n, same in ((16, True), (56, True), (12, False)):
        why = _check(cf, tp.randn(n, 7))
        assert (why is None) == same


def test_related_sizes_share_a_symbol_unrelated_ones_do_not():
    backend = Counting()
    cf = tp.compile(lambda a, b, c: (a + b).sum() + c.sum(), dynamic=True, backend=backend)
    a, b, c = tp.randn(8, 8), tp.randn(8), tp.randn(8)
    cf(a, b, c)
    # b broadcasts against a's last dim (related); c is unrelated: any size of c hits
    assert _check(cf, tp.randn(8, 5), tp.randn(5), tp.randn(3)) is None
    why = _check(cf, tp.randn(8, 5), tp.randn(4), tp.randn(3))
    assert why is not None and "related by the program" in why


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_results_equal_eager_for_every_size(backend):
    def f(x, w):
        y = (x * w).softmax(-1)
        return y.view(-1, x.shape[1] * 2).sum(-1) if x.shape[0] % 2 == 0 else y.sum(-1)
    cf = tp.compile(f, dynamic=True, backend=backend)
    for n, c in ((6, 4), (10, 4), (7, 4), (6, 9), (2, 2), (1, 4), (9, 1)):
        x, w = tp.randn(n, c), tp.randn(c)
        cf(x, w)
        got = cf(x, w)
        ref = f(x, w)
        assert got.shape == ref.shape and torch.allclose(got._data, ref._data, atol=1e-6)
    if any(e.lowered.specialized_reason for e in cf._cache):
        assert cf.counters["captures"] <= 7         # specialised by the backend: one per size
    else:
        assert cf.counters["captures"] <= 4         # even/odd rows, c == 1, n == 1


def test_data_gates_and_symbolic_sizes_together():
    """A data gate's replay graph reads size symbols too (it binds them like the graph)."""
    def f(x):
        y = x.view(-1, x.shape[1] * 2)
        if y.sum() > 0:
            return y.relu()
        return y * 2
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend)
    for n in (4, 6, 8, 10):
        for sign in (1, -1):
            x = tp.randn(n, 3).abs() * sign
            cf(x)
            assert torch.allclose(cf(x)._data, f(x)._data)
    assert len(backend.graphs) == 2          # one per gate outcome, for every size


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_training_a_module_over_batch_sizes(backend):
    import tensorplay.nn as nn
    tp.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))
    ref = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))
    ref.load_state_dict(m.state_dict())
    cm = tp.compile(m, dynamic=True, backend=backend)
    for n in (3, 9, 17, 9):
        x = tp.randn(n, 5)
        out = cm(x)
        out = cm(x)                           # a later call: the compiled artifact
        r = ref(x)
        assert torch.allclose(out._data, r._data, atol=1e-5)
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        out.square().sum().backward()
        r.square().sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p.grad._data, q.grad._data, atol=1e-5)
    assert cm.counters["captures"] == 1


@pytest.mark.filterwarnings("error::RuntimeWarning")     # a backward run op by op warns: a failure here
@pytest.mark.parametrize("which", ["counting", "stax"])
def test_gpt_forward_and_training_one_artifact_over_batch_and_sequence_lengths(which):
    """GPT's forward and training step over four (batch, length) pairs: one capture; with Stax one
    forward and one backward artifact, not specialised (the cross-entropy's flattened targets need
    the capture's equality ``B_idx * T_idx == B_tgt * T_tgt`` to prove their reads in bounds)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    from gpt import GPT, GPTConfig
    tp.manual_seed(0)
    m, ref = GPT(GPTConfig()), GPT(GPTConfig())
    ref.load_state_dict(m.state_dict())
    backend = Counting() if which == "counting" else "stax"
    cm = tp.compile(m, dynamic=True, backend=backend, strict_native=which == "stax")
    for B, T in ((2, 16), (3, 20), (2, 7), (5, 31)):
        idx, tgt = tp.randint(0, 64, (B, T)), tp.randint(0, 64, (B, T))
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        cm(idx, tgt)
        logits, loss = cm(idx, tgt)
        rl, rloss = ref(idx, tgt)
        assert logits.shape == (B, T, 64) and torch.allclose(logits._data, rl._data, atol=1e-5)
        loss.backward()
        rloss.backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p.grad._data, q.grad._data, atol=1e-5)
    if which == "counting":
        assert len(backend.graphs) == 1
    else:
        assert cm.counters["captures"] == 1 and cm.counters["backward_compiles"] == 1, cm.explain()
        assert cm._compiled_forward._cache[0].lowered.specialized_reason is None


def test_a_data_dependent_size_is_an_unbacked_symbol():
    """``x[x > 0]``: the output size depends on values; under dynamic=True it is an unbacked
    symbol read from the op's output when the graph runs: one artifact for every count."""
    def f(x):
        return x[x > 0].sum() * x.shape[0]
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend)
    x = tp.randn(6, 3)
    for y in (x, tp.randn(9, 3), x):
        cf(y)
        assert torch.allclose(cf(y)._data, f(y)._data)
    assert len(backend.graphs) == 1
    assert "u0 = index.shape[0]" in backend.graphs[0].code


def test_length_sweep_with_buckets_at_most_ten_artifacts():
    """§13.4's sweep with ``dynamic.buckets`` (Prop. 10.3): lengths uniform in 1..512 fall into the
    10 buckets {1}, {2}, (2, 4], ..., (256, 512] — at most 10 artifacts, each result eager's."""
    rng = random.Random(1)
    lengths = [rng.randint(1, 512) for _ in range(1000)]
    f = lambda x, w: (x @ w).relu().sum(0)     # noqa: E731
    w = tp.randn(16, 4)
    backend = Counting()
    cf = tp.compile(f, dynamic=True, backend=backend, recompile_limit=16, options={"dynamic.buckets": True})
    for n in lengths:
        x = tp.randn(n, 16)
        assert torch.allclose(cf(x, w)._data, f(x, w)._data, atol=1e-4)
    assert len(backend.graphs) <= 10
    assert len(backend.graphs) == len({(n - 1).bit_length() for n in lengths})     # one per bucket seen
    src = max((e.guard.source for e in cf._cache), key=lambda t: "bucket (256, 512]" in t)
    assert "bucket (256, 512]" in src and "(257 <= L[0]._data.shape[0] <= 512)" in src   # a range guard


def test_a_kernel_build_failure_is_not_retried_with_static_sizes(monkeypatch):
    """A compiler (or machine) failure while compiling a symbolic graph is reported as such -- the
    graph is not quietly specialised to the sample's sizes, which would hide the failure behind
    one artifact per size."""
    import tensorplay.compiler.backends.stax as stax
    from tensorplay.compiler.api import BackendCompilerError
    from tensorplay.compiler.backends.stax.cpp.build import CppCompileError

    def broken(*a, **k):
        raise CppCompileError("g++ was killed")
    monkeypatch.setattr(stax, "_compiled_graph", broken)
    x = tp.from_torch(torch.randn(7, 5))
    cf = tp.compile(lambda x: (x * 2).sum(-1), dynamic=True, strict_native=True)
    with pytest.raises(BackendCompilerError, match="CppCompileError: g\\+\\+ was killed"):
        cf(x)
    loose = tp.compile(lambda x: (x * 2).sum(-1), dynamic=True)
    with pytest.warns(RuntimeWarning, match="g\\+\\+ was killed"):
        loose(x)
    got = loose(x)
    tp.testing.assert_close(got, (x * 2).sum(-1))
    assert not any("specialised for the backend" in e for e in loose.explain().splitlines())
