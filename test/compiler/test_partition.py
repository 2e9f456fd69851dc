"""Partitioners of the joint graph (chapter §5.3–5.5; tensorplay/compiler/aot/partition.py).

Saved-set tests for the default partitioner (save what the backward reads) and the min-cut
partitioner (Def. 5.1–5.2): example 5.1 -> table 5.1 (save h, recompute erf), exercise 9 (relu),
exercise 10 (a reduction the backward reads is always saved), exercise 46 (backward cost is a
constant multiple of the forward's), the recompute-fanout limit, random ops, the GPT block (min-cut
saves fewer bytes than default).  Every partition is also *run*: forward graph then backward graph
on fresh random inputs must reproduce the joint graph's outputs bit for bit, and the gradients
must match eager autograd.
"""
from __future__ import annotations

import math
import operator
import os
import sys

import networkx as nx
import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.compiler.aot.joint import JointGraph, build_joint
from tensorplay.compiler.aot.partition import (MAX_RECOMPUTE_FANOUT, PARTITIONERS, SavedValue, _Joint,
                                               default_partition, is_cheap, min_cut_partition, remat_network)
from tensorplay.compiler.capture.tracer import capture
from tensorplay.testing import assert_close

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def joint_of(f, *xs):
    low = tp.compile(f, backend="eager").lower(*xs)
    return build_joint(low.graph_module, low.example_inputs), low.example_inputs


def activations(P):
    """Names of the saved values that are not inputs of the region."""
    return [s.name for s in P.saved if not s.is_input]


def node(P, name, which="bw"):
    gm = P.bw_gm if which == "bw" else P.fw_gm
    return next((n for n in gm.graph.nodes if n.name == name), None)


def op_names(gm):
    return [n.target_name for n in gm.graph.nodes if n.op == "call_function"]


def tangents_for(j, outs):
    ts = []
    for o, d in zip(outs[:j.num_fwd_outputs], j.fwd_output_differentiable):
        if d:
            ts.append(tp.from_torch(torch.randn(o.shape, dtype=o.dtype)))
    return ts


def run_partition(P, primals, tangents):
    outs = P.fw_gm(*primals)
    nf = P.num_fwd_outputs
    fwd, saved = outs[:nf], outs[nf:]
    assert len(saved) == len(P.saved)
    for s, v in zip(P.saved, saved):
        assert tuple(v.shape) == s.shape and v.dtype == s.dtype and v.numel() * v._data.element_size() == s.nbytes
    return tuple(fwd) + tuple(P.bw_gm(*saved, *tangents))


def check_partitions(j, primals, *, eager=None):
    """Both partitioners: linted graphs, contract layout, Def. 5.1 (only cheap ops recomputed), and
    forward+backward == joint bit for bit.  ``eager``: a function whose tp autograd gradients the
    joint's must match."""
    primals = [tp.from_torch(p._data.detach().clone()) if isinstance(p, tp.Tensor) else p for p in primals]
    # tangents need the forward outputs' shapes: run the forward part of any partition once
    P0 = default_partition(j)
    fwd_only = P0.fw_gm(*primals)[:j.num_fwd_outputs]
    tangents = tangents_for(j, fwd_only)
    jouts = j.gm(*primals, *tangents)
    n_primals = len(primals)
    joint_nodes = {n.name: n for n in j.gm.graph.nodes}
    result = {}
    for name, part in PARTITIONERS.items():
        P = part(j)
        P.fw_gm.graph.lint()
        P.bw_gm.graph.lint()
        assert [n.name for n in P.fw_gm.graph.placeholders] == [f"primals_{i}" for i in range(n_primals)]
        bw_ph = [n.name for n in P.bw_gm.graph.placeholders]
        assert bw_ph[:len(P.saved)] == P.saved_names
        assert all(p.startswith("tangents") for p in bw_ph[len(P.saved):])
        assert len(P.bw_gm.graph.output_node.args[0]) == n_primals
        for r in P.recomputed:          # Def. 5.1: the backward recomputes cheap ops only
            assert is_cheap(joint_nodes[r]), f"{name}: recomputes {r} ({joint_nodes[r].target_name})"
        assert not any("random" in n.tags for n in P.bw_gm.graph.nodes), f"{name}: random op in the backward"
        if name == "default":
            assert P.recomputed == []
        outs = run_partition(P, primals, tangents)
        assert len(outs) == len(jouts)
        for k, (a, b) in enumerate(zip(outs, jouts)):
            if b is None:
                assert a is None, f"{name}: output {k} should be None"
            else:
                assert_close(a, b, exact=True, msg=f"{name} output {k}")
        result[name] = P
    # the default partition is a finite cut of Def. 5.2's network, so the minimum cut is no larger
    assert result["min_cut"].saved_bytes() <= result["default"].saved_bytes()
    if eager is not None:
        xs = [tp.from_torch(p._data.clone()).requires_grad_(rg) if isinstance(p, tp.Tensor) else p
              for p, rg in zip(primals, j.primals_requiring_grad)]
        ys = eager(*xs)
        ys = ys if isinstance(ys, (tuple, list)) else (ys,)
        tp.autograd.backward([y for y, d in zip(ys, j.fwd_output_differentiable) if d], tangents)
        for x, g, rg in zip(xs, jouts[j.num_fwd_outputs:], j.primals_requiring_grad):
            if rg:
                assert_close(g, x.grad, exact=True, msg="joint gradient vs eager autograd")
    return result


def inf_path(G, a, b):
    """Is there a path of infinite-capacity edges from a to b in the network?"""
    H = nx.DiGraph([(u, v) for u, v, d in G.edges(data=True) if "capacity" not in d])
    return a in H and b in H and nx.has_path(H, a, b)


def ex51(x, w):                 # example 5.1: matmul -> gelu -> sum
    return F.gelu(x @ w).sum()


def ex51_decomposed(x, w):      # the same with GELU spelt out as Stax lowers it (erf in the forward)
    h = x @ w
    return (0.5 * h * (1 + (h * (1 / math.sqrt(2))).erf())).sum()


def ex9(x, w):                  # exercise 9: relu instead of gelu
    return tp.relu(x @ w).sum()


def rand(*shape, rg=True):
    return tp.randn(*shape, requires_grad=rg)


# ---------------------------------------------------------------------------------------------
# example 5.1 / table 5.1
# ---------------------------------------------------------------------------------------------
def test_example_5_1_saves_h_and_recomputes_erf():
    x, w = rand(64, 32), rand(32, 48)
    j, ins = joint_of(ex51, x, w)
    parts = check_partitions(j, ins, eager=ex51)
    for name, P in parts.items():
        assert activations(P) == ["matmul"], name        # h = x @ W
        assert [s.name for s in P.saved if s.is_input] == ["primals_0", "primals_1"]
        h = P.saved[-1]
        assert h == SavedValue("matmul", (64, 48), torch.float32, 64 * 48 * 4, False)
        assert "erf" in op_names(P.bw_gm) and "erf" not in op_names(P.fw_gm)
        assert P.saved_bytes(include_inputs=False) == 64 * 48 * 4
        assert "matmul: float32[64, 48], 12288 B" in P.describe()


def test_example_5_1_decomposed_gelu_recompute_erf():
    """With erf in the forward (GELU decomposed), min-cut still saves only h and recomputes the
    whole pointwise chain, erf included; the default partitioner saves the three pointwise values
    the backward reads (3x the bytes)."""
    x, w = rand(64, 32), rand(32, 48)
    j, ins = joint_of(ex51_decomposed, x, w)
    parts = check_partitions(j, ins, eager=ex51_decomposed)
    mc, df = parts["min_cut"], parts["default"]
    assert activations(mc) == ["matmul"]
    assert "erf" in mc.recomputed
    assert "erf" in op_names(mc.fw_gm) and "erf" in op_names(mc.bw_gm)
    assert "matmul" not in activations(df) and len(activations(df)) == 3
    assert df.saved_bytes(False) == 3 * mc.saved_bytes(False)


def test_hand_built_joint_example_5_1():
    """The partitioner on a joint graph written by hand with the graph IR's capture (no joint
    builder): the contract is only the placeholder names and the output layout."""
    def joint(x, w, g):
        h = x @ w
        y = F.gelu(h).sum()
        cdf = 0.5 * (1 + (h * math.sqrt(0.5)).erf())
        pdf = (-0.5 * h * h).exp() * (1 / math.sqrt(2 * math.pi))
        dh = g.expand(h.shape) * (cdf + h * pdf)
        return y, dh @ w.t(), x.t() @ dh
    meta = [tp.from_torch(torch.empty(s, device="meta")) for s in ((16, 8), (8, 12), ())]
    cap = capture(joint, tuple(meta), {}, execute=False, input_names=["primals_0", "primals_1", "tangents_0"])
    j = JointGraph(cap.gm, 1, [True, True], [True])
    x, w = torch.randn(16, 8), torch.randn(8, 12)
    check_partitions(j, [tp.from_torch(x), tp.from_torch(w)])
    for part in PARTITIONERS.values():
        P = part(j)
        assert activations(P) == ["matmul"]
        assert "erf" in op_names(P.bw_gm) and "erf" not in op_names(P.fw_gm)


# ---------------------------------------------------------------------------------------------
# exercise 9: relu, whose backward reads relu's output
# ---------------------------------------------------------------------------------------------
def test_exercise_9_relu_saves_a_bool_mask():
    """Def. 5.2 with relu: the backward reads r = relu(h) only through ``r <= 0``; the minimum cut
    is that bool mask (n bytes) — not h or r (4n bytes each).  The forward writes the n-byte mask
    in addition to h; the saved set shrinks from 4n (table 5.1's h) to n."""
    x, w = rand(64, 32), rand(32, 48)
    n = 64 * 48
    j, ins = joint_of(ex9, x, w)
    parts = check_partitions(j, ins, eager=ex9)
    mc, df = parts["min_cut"], parts["default"]
    assert activations(df) == ["relu"] and df.saved_bytes(False) == 4 * n
    assert activations(mc) == ["le"] and mc.saved[-1].dtype == torch.bool and mc.saved_bytes(False) == n
    assert "le" in op_names(mc.fw_gm) and "relu" in op_names(mc.fw_gm)
    assert "relu" not in op_names(mc.bw_gm)


# ---------------------------------------------------------------------------------------------
# exercise 10: a reduction the backward reads is in every feasible saved set
# ---------------------------------------------------------------------------------------------
def test_exercise_10_reduction_read_by_backward_is_forced():
    x = rand(8, 16)

    def f(x):
        return x / x.sum(-1, keepdim=True)
    j, ins = joint_of(f, x)
    parts = check_partitions(j, ins, eager=f)
    for P in parts.values():
        assert activations(P) == ["sum_"]
    G = remat_network(j)
    # every finite cut cuts sum__in -> sum__out: both ends are joined to source / sink by infinite paths
    assert inf_path(G, "source", "sum__in") and inf_path(G, "sum__out", "sink")
    assert G["sum__in"]["sum__out"]["capacity"] == 8 * 4
    # a cheap value is not tied to the source
    assert not inf_path(G, "source", "div_in")


def test_matmul_read_by_backward_is_forced_even_when_larger():
    """h = x @ W is 8x larger than x, but recomputing a matmul is not allowed: saved."""
    x, w = rand(4, 8), rand(8, 64)

    def f(x, w):
        return (x @ w).sin().sum()
    j, ins = joint_of(f, x, w)
    for P in check_partitions(j, ins, eager=f).values():
        assert activations(P) == ["matmul"]


# ---------------------------------------------------------------------------------------------
# the recompute-fanout limit, ties, multiple outputs, inputs without grad
# ---------------------------------------------------------------------------------------------
def fan(x):
    a = x.sin()
    return (a * a * a * a * a * a * a).sum()


def test_recompute_fanout_limit():
    j, ins = joint_of(fan, rand(8, 4))
    sin = next(n for n in j.gm.graph.nodes if n.name == "sin")
    assert len(_Joint(j).bw_users(sin)) > MAX_RECOMPUTE_FANOUT
    check_partitions(j, ins, eager=fan)
    limited = min_cut_partition(j)
    free = min_cut_partition(j, max_recompute_fanout=None)
    assert activations(limited) == ["sin"]                  # read by > 4 backward nodes: saved
    assert activations(free) == [] and "sin" in free.recomputed   # recomputed from the saved input
    assert free.saved_bytes() < limited.saved_bytes()


def test_multiple_outputs_and_forward_output_reused():
    x = rand(8, 4)

    def f(x):
        return x.exp(), x.sin() * 2
    j, ins = joint_of(f, x)
    parts = check_partitions(j, ins, eager=f)
    assert activations(parts["default"]) == ["exp"]
    # exp(x) costs as much as x, which the backward needs anyway (cos x): recomputed
    assert activations(parts["min_cut"]) == [] and parts["min_cut"].recomputed == ["exp"]


def test_input_without_grad_and_integer_input():
    x, w = rand(8, 4), rand(4, 6, rg=False)
    tgt = tp.randint(0, 6, (8,))

    def f(x, w, t):
        return F.cross_entropy((x @ w).tanh(), t)
    j, ins = joint_of(f, x, w, tgt)
    assert j.primals_requiring_grad == [True, False, False]
    parts = check_partitions(j, ins, eager=f)
    for P in parts.values():
        assert P.bw_gm.graph.output_node.args[0][1:] == (None, None)


@pytest.mark.parametrize("f", [lambda x: (x > 0).sum(), lambda x: x.reshape(-1), lambda x: (x, x * 2),
                               lambda x: (x.argmax(), x.exp())],
                         ids=["bool-output", "view", "input-output", "int-output"])
def test_outputs_without_gradient_views_and_inputs(f):
    j, ins = joint_of(f, rand(4, 3))
    parts = check_partitions(j, ins, eager=f)
    assert parts["min_cut"].saved_bytes(include_inputs=False) == 0


def test_size_zero_and_one():
    for shape in ((0, 4), (1, 1)):
        x, w = rand(*shape), rand(shape[1], 3)
        j, ins = joint_of(ex51, x, w)
        parts = check_partitions(j, ins, eager=ex51)
        assert activations(parts["min_cut"]) == ["matmul"]


def test_transposed_input():
    x = tp.from_torch(torch.randn(32, 64).t()).requires_grad_()      # non-contiguous primal
    w = rand(32, 16)
    j, ins = joint_of(ex51_decomposed, x, w)
    assert activations(check_partitions(j, ins, eager=ex51_decomposed)["min_cut"]) == ["matmul"]


# ---------------------------------------------------------------------------------------------
# random ops: the mask is drawn once, in the forward, and saved
# ---------------------------------------------------------------------------------------------
def test_dropout_mask_is_saved_never_recomputed():
    def joint(x, g):            # hand-built: out = dropout(sin x); grad = g * mask * 2 * cos x
        out, mask = tp.ops.OPS["native_dropout"].fn(x.sin(), 0.5, True)
        return out, g * mask * 2.0 * x.cos()
    meta = [tp.from_torch(torch.empty(8, 8, device="meta")) for _ in range(2)]
    cap = capture(joint, tuple(meta), {}, execute=False, input_names=["primals_0", "tangents_0"])
    j = JointGraph(cap.gm, 1, [True], [True])
    for part in PARTITIONERS.values():
        P = part(j)
        assert any("random" in n.tags for n in P.fw_gm.graph.nodes)
        assert not any("random" in n.tags for n in P.bw_gm.graph.nodes)
        saved = activations(P)
        assert len(saved) == 1 and P.saved[-1].dtype == torch.bool   # the mask projection, 1 B/element
        assert node(P, saved[0], "fw").target is operator.getitem
        # forward and backward agree on the mask: grad == g * 2 * cos(x) exactly where out != 0
        x, g = torch.randn(8, 8), torch.randn(8, 8)
        out, grad = run_partition(P, [tp.from_torch(x)], [tp.from_torch(g)])
        keep = out._data != 0
        assert 0 < int(keep.sum()) < 64
        assert_close(grad._data[keep], (g * 1.0 * 2.0 * x.cos())[keep], exact=True)
        assert bool((grad._data[~keep] == 0).all())


# ---------------------------------------------------------------------------------------------
# blocks: LayerNorm, softmax, attention; the GPT block
# ---------------------------------------------------------------------------------------------
def test_layernorm_softmax_attention_blocks():
    x, w, b = rand(4, 8, 16), rand(16), rand(16)

    def ln_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (16,), w, b)) * 0.5
    j, ins = joint_of(ln_gelu, x, w, b)
    for P in check_partitions(j, ins, eager=ln_gelu).values():
        assert activations(P) == ["layer_norm"]           # gelu's input; mean/rstd recomputed in the backward

    def soft(x):
        return F.softmax(x * 3, -1)
    j, ins = joint_of(soft, x)
    for P in check_partitions(j, ins, eager=soft).values():
        assert activations(P) == ["softmax"]              # an nn op read by its own formula: forced

    q, k, v = rand(2, 2, 8, 4), rand(2, 2, 8, 4), rand(2, 2, 8, 4)

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    j, ins = joint_of(attn, q, k, v)
    parts = check_partitions(j, ins, eager=attn)
    # the probabilities (T x T) are recomputed in the backward, never saved
    assert all(s.shape[-2:] != (8, 8) for s in parts["min_cut"].saved)


def test_cross_entropy_saves_the_logits_and_row_statistics():
    """The logits (a matmul's output, in memory anyway) and the (N, 1) logsumexp are saved, not the
    (N, C) log-probabilities x - lse, smaller by one row of statistics (CHEAP_SAVE_PENALTY: C > 64)."""
    h, w, t = rand(6, 8), rand(8, 200), tp.from_torch(torch.randint(0, 200, (6,)))

    def loss(h, w, t):
        return F.cross_entropy(h @ w, t)
    j, ins = joint_of(loss, h, w, t)
    P = check_partitions(j, ins, eager=loss)["min_cut"]
    shapes = sorted(tuple(s.shape) for s in P.saved if not s.is_input)
    assert shapes == [(6, 1), (6, 200)], shapes
    assert "sub" not in op_names(P.fw_gm)


def test_gpt_block_min_cut_saves_fewer_bytes():
    from gpt import Block, GPTConfig
    tp.manual_seed(0)
    blk = Block(GPTConfig(n_embd=32, n_head=2))
    x = rand(2, 8, 32)
    low = tp.compile(blk, backend="eager").lower(x)
    j = build_joint(low.graph_module, low.example_inputs)
    parts = check_partitions(j, low.example_inputs)
    mc, df = parts["min_cut"], parts["default"]
    assert mc.saved_bytes() < df.saved_bytes()
    assert mc.saved_bytes(False) < df.saved_bytes(False)
    assert "gelu" in mc.recomputed and "gelu" in activations(df)


# ---------------------------------------------------------------------------------------------
# exercise 46 (Theorem 5.1): the backward costs a constant multiple of the forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [4, 16])
def test_exercise_46_product_backward_is_linear(n):
    def prod(*xs):
        p = xs[0]
        for x in xs[1:]:
            p = p * x
        return p
    xs = [rand(3) for _ in range(n)]
    j, ins = joint_of(prod, *xs)
    P = min_cut_partition(j)
    fw_ops = sum(1 for t in op_names(P.fw_gm) if t == "mul")
    bw_ops = sum(1 for t in op_names(P.bw_gm) if t == "mul")
    assert fw_ops == n - 1
    assert bw_ops <= 2 * (n - 1) + (n - 1)      # <= 3x: two partial products per mul, plus recomputation
    check_partitions(j, ins, eager=prod)


def pair_of(x):                 # a non-op-table node with a tuple value: neither saveable nor recomputable
    return (x * 2, x * 3)


def first_times(pair, g):
    return pair[0] * g


def test_unsaveable_value_needed_by_backward_is_a_clear_error():
    from tensorplay.compiler.graph import Graph, GraphModule
    g = Graph()
    x, t = g.placeholder("primals_0"), g.placeholder("tangents_0")
    pair = g.call_function(pair_of, (x,))
    y = g.call_function(operator.getitem, (pair, 0))
    gx = g.call_function(first_times, (pair, t))
    g.output((y, gx))
    v = torch.empty(3, device="meta")
    for n in (x, t, y, gx):
        n.meta["val"] = v
    pair.meta["val"] = (v, v)
    j = JointGraph(GraphModule(g), 1, [True], [True])
    with pytest.raises(RuntimeError, match="no finite cut.*pair_of"):
        min_cut_partition(j)
    with pytest.raises(RuntimeError, match="cannot save pair_of"):
        default_partition(j)


def test_bad_joint_is_refused():
    j, _ = joint_of(ex51, rand(4, 4), rand(4, 4))
    bad = JointGraph(j.gm, 2, j.primals_requiring_grad)     # wrong count of forward outputs
    with pytest.raises(ValueError, match="gradients"):
        min_cut_partition(bad)


# ---------------------------------------------------------------------------------------------
# exercise 51 (Theorem 5.4): binomial checkpointing of a chain under a storage limit
# ---------------------------------------------------------------------------------------------
def simulate(schedule, length, s, t):
    """Run a schedule on the chain x_{i+1} = x_i * 1.5 + i; check slots, repetitions, the state each
    reverse sees, and the order of the reverses.  Returns (max slots used, max evaluations)."""
    step = lambda i, x: x * 1.5 + i  # noqa: E731
    true = [0.25]
    for i in range(length):
        true.append(step(i, true[-1]))
    cur_i, cur = 0, true[0]
    slots, evals, reversed_ = {}, [0] * length, []
    peak = 0
    for act, i in schedule:
        if act == "advance":
            assert i == cur_i
            cur, cur_i = step(i, cur), i + 1
            evals[i] += 1
        elif act == "store":
            assert i == cur_i and i not in slots
            slots[i] = cur
            peak = max(peak, len(slots))
        elif act == "free":
            del slots[i]
        elif act == "restore":
            cur, cur_i = (true[0] if i == 0 else slots[i]), i
        elif act == "reverse":
            assert i == cur_i and cur == true[i], f"reverse {i} sees x_{cur_i}"
            reversed_.append(i)
    assert reversed_ == list(range(length - 1, -1, -1))
    assert peak <= s and max(evals, default=0) <= t
    return peak, max(evals, default=0)


def test_exercise_51_binomial_checkpointing():
    from tensorplay.compiler.aot.partition import beta, checkpoint_schedule, min_slots
    assert beta(3, 3) == 20
    sched = checkpoint_schedule(6, 3, 2)                    # (1): length 6, s = 3, t = 2
    assert simulate(sched, 6, 3, 2) == (3, 2)
    # (2): l = 1000
    assert [min_slots(1000, t) for t in (2, 3, 4)] == [44, 17, 10]
    for t in (2, 3, 4):
        s = min_slots(1000, t)
        assert beta(s, t) >= 1000 > beta(s - 1, t)
    # (3): uniform segmentation stores about 2 sqrt(l) = 63 states, each step computed at most twice;
    # binomial with t = 2 needs 44 slots
    assert min_slots(1000, 2) < 2 * math.sqrt(1000)
    # every length up to beta(s, t) is reversible within the limits; one more is refused
    for s, t in ((1, 1), (2, 2), (3, 2), (2, 4)):
        for n in range(1, beta(s, t) + 1):
            simulate(checkpoint_schedule(n, s, t), n, s, t)
        with pytest.raises(ValueError, match="beta"):
            checkpoint_schedule(beta(s, t) + 1, s, t)
