"""The incremental greedy fusion (``Scheduler.fuse``: candidate pairs from the readers' index, a
heap by score, lazy legality) makes the same kernels as the chapter's exhaustive loop
(``Scheduler.fuse_exhaustive``: every pair, every round) -- checked on every graph Stax schedules
while compiling random programs, a GPT training step and the chapter's fused cases -- and its cost
grows near-linearly with the graph."""
import os
import sys
import time

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler.backends.stax import scheduler as S

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from random_programs import build_function, generate, make_inputs  # noqa: E402


def _partition(sched):
    return [tuple(n.name for n in g.nodes) for g in sched.groups]


@pytest.fixture
def compare_fusions(monkeypatch):
    """Every ``fuse`` also runs the exhaustive loop on a fresh scheduler of the same graph; the two
    schedules (groups, their nodes and their order) must be equal."""
    seen = []
    orig = S.Scheduler.fuse

    def checked(self):
        ref = _partition(S.Scheduler(self.graph).fuse_exhaustive())
        out = orig(self)
        assert _partition(out) == ref
        seen.append(len(ref))
        return out
    monkeypatch.setattr(S.Scheduler, "fuse", checked)
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    return seen


@pytest.mark.parametrize("seed", range(4))
def test_incremental_fusion_equals_exhaustive_on_random_programs(compare_fusions, seed):
    prog = generate(1000 + seed)
    f = build_function(prog)
    args = make_inputs(prog)
    cf = tp.compile(f, strict_native=False)
    cf(*args)
    cf(*args)
    assert compare_fusions


def test_incremental_fusion_equals_exhaustive_on_a_gpt_step(compare_fusions):
    from gpt import GPT, GPTConfig
    tp.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx, tgt = tp.randint(0, 64, (2, 16)), tp.randint(0, 64, (2, 16))
    cf = tp.compile(lambda x, y: m(x, y)[1], strict_native=True)
    cf(idx, tgt).backward()
    assert len(compare_fusions) >= 2 and max(compare_fusions) > 20     # forward and backward graphs


def test_incremental_fusion_equals_exhaustive_on_the_chapters_cases(compare_fusions):
    x, w = tp.randn(8, 64), tp.randn(8, 64)
    for f in (lambda x, w: (F.relu(x + w) * 2).sum(-1), lambda x, w: x / x.sum(-1, keepdim=True),
              lambda x, w: (x.exp().sum(-1), x.exp().amax(-1)), lambda x, w: F.gelu(F.layer_norm(x, (64,))) * 0.5,
              lambda x, w: F.softmax(x, -1) @ w.t()):
        cf = tp.compile(f, strict_native=True)
        cf(x, w)
        tp.testing.assert_close(cf(x, w), f(x, w), rtol=1e-5, atol=1e-5)
    assert len(compare_fusions) == 5


def _chain_graph_seconds(n):
    """Seconds of ``Scheduler.fuse`` for a residual chain of ``n`` layer norms (about 10 n buffers)."""
    times = []
    orig = S.Scheduler.fuse

    def timed(self):
        t0 = time.perf_counter()
        out = orig(self)
        times.append(time.perf_counter() - t0)
        return out
    S.Scheduler.fuse = timed
    try:
        ws = [tp.randn(16, 16) * 0.1 for _ in range(n)]

        def f(x, *ws):
            for w in ws:
                x = x + F.gelu(F.layer_norm(x, (16,))) @ w
            return x
        tp.compile(f, strict_native=True)(tp.randn(4, 16), *ws)
    finally:
        S.Scheduler.fuse = orig
    return sum(times)


def test_incremental_fusion_scales_near_linearly(monkeypatch):
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    small, large = _chain_graph_seconds(10), _chain_graph_seconds(40)
    assert large < 4 * 4 * small + 0.5, (small, large)     # 4x the graph: well under the 64x of a cubic loop


def _memory_order_reference(sched):
    """The list schedule of ``Scheduler.memory_order`` as its docstring states it: every step scans
    every waiting group (quadratic; the reference the heap version is compared with)."""
    alloc, readers = sched._live_model()
    writer = {n: g for g in sched.groups for n in g.writes}
    preds = {id(g): {id(writer[n]) for n in g.reads if n in writer and writer[n] is not g} for g in sched.groups}
    remaining = {n: len(rs) for n, rs in readers.items()}
    done, order = set(), []
    pending = sorted(sched.groups, key=lambda g: g.order)
    while pending:
        ready = [g for g in pending if preds[id(g)] <= done]

        def net(g):
            freed = sum(sched.buffer_bytes(n) for n in g.reads
                        if n in writer and remaining.get(n) == 1 and n not in sched.output_names)
            return (alloc[id(g)] - freed, g.order)
        g = min(ready, key=net)
        for n in g.reads:
            if n in remaining:
                remaining[n] -= 1
        order.append(g)
        done.add(id(g))
        pending.remove(g)
    return order


def _benchmark(name):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import compile_time
    return getattr(compile_time, name)


def _synthetic_graph(kind, n):
    return _benchmark("_synthetic")(kind, n)


@pytest.mark.parametrize("case", ["gpt", "diamond", "residual", "chain"])
def test_memory_order_equals_the_scanning_list_schedule(monkeypatch, case):
    """The heap list schedule (lazy entries: a waiting group's net only drops) runs the groups in
    the order of the scan over every waiting group, on a GPT training step and on wide graphs
    with many extern kernels."""
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    checked = []
    orig = S.Scheduler.memory_order

    def both(self):
        out = orig(self)
        assert [id(g) for g in out] == [id(g) for g in _memory_order_reference(self)]
        checked.append(len(out))
        return out
    monkeypatch.setattr(S.Scheduler, "memory_order", both)
    if case == "gpt":
        from gpt import GPT, GPTConfig
        tp.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
        idx, tgt = tp.randint(0, 64, (2, 16)), tp.randint(0, 64, (2, 16))
        tp.compile(lambda x, y: m(x, y)[1], strict_native=True)(idx, tgt).backward()
    else:
        _benchmark("_stax_phases")(_synthetic_graph(case, 400), tp.randn(8, 32))
    assert checked and max(checked) > 20


@pytest.mark.parametrize("kind", ["diamond", "residual"])
def test_incremental_fusion_equals_exhaustive_on_wide_graphs(compare_fusions, kind):
    """Graphs with many extern kernels reading one weight (whose pairs ``fuse`` never scores)."""
    x = tp.randn(8, 32)
    f = _synthetic_graph(kind, 150)
    cf = tp.compile(f, strict_native=True)
    cf(x)
    tp.testing.assert_close(cf(x), f(x), rtol=1e-4, atol=1e-4)
    assert compare_fusions and max(compare_fusions) > 10


def test_scored_pairs_grow_linearly_with_many_externs_of_one_weight(monkeypatch):
    """Every matmul of the diamond graph reads the same weight; a pair of extern kernels can never
    fuse, so ``fuse`` scores a number of pairs linear in the graph (not the externs' square)."""
    from tensorplay.compiler.backends.stax import choices
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    counts = []
    orig = choices.score_fusion

    def counted(*a):
        counts[-1] += 1
        return orig(*a)
    monkeypatch.setattr(choices, "score_fusion", counted)
    x = tp.randn(8, 32)
    for n in (200, 800):
        counts.append(0)
        _benchmark("_stax_phases")(_synthetic_graph("diamond", n), x)     # lowering, fuse, codegen
    assert counts[0] > 0 and counts[1] < 5 * counts[0], counts
