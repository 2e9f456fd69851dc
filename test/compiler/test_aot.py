"""AOT autograd (chapter §5; docs/aot.md): joint graphs, the runtime, the "aot_eager" backend and the
Stax training path, checked against eager autograd.

``aot_eager`` runs the partitioned forward and backward graphs op by op on the same kernels as eager,
with gradient contributions summed in the engine's order, so it must agree with eager **bit for
bit**.  ``stax`` compiles both graphs to C++ kernels (other summation orders): results are compared
within the error model's tolerance.
"""
import math
import os
import sys

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.compiler.aot import build_joint
from tensorplay.compiler.aot.function import DoubleBackwardError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

RTOL, ATOL = 1e-4, 1e-5          # float32 compiled-vs-eager tolerance (error model: a few ulps * depth)


def _leaves(*ts, grad=None):
    out = []
    for i, t in enumerate(ts):
        rg = t.is_floating_point() if grad is None else grad[i]
        out.append(tp.Tensor(t.clone(), requires_grad=rg) if rg else tp.Tensor(t.clone()))
    return out


def _loss_of(out, weights):
    outs = out if isinstance(out, tuple) else (out,)
    total = None
    for o, w in zip(outs, weights):
        if o is None or not o.requires_grad:
            continue
        term = (o * tp.Tensor(w)).sum() if w is not None else o.sum()
        total = term if total is None else total + term
    return total


def check_grads(fn, *raw, backend="aot_eager", grad=None, exact=None, calls=2, options=None):
    """Run fn eagerly and compiled (``calls`` calls; the first is the capture run), backprop a random
    projection of the outputs, and compare outputs and gradients of the last compiled call."""
    exact = backend == "aot_eager" if exact is None else exact
    e_in = _leaves(*raw, grad=grad)
    ref = fn(*e_in)
    refs = ref if isinstance(ref, tuple) else (ref,)
    weights = [torch.randn(r.shape) if r is not None and r.is_floating_point() else None for r in refs]
    _loss_of(ref, weights).backward()
    cf = tp.compile(fn, backend=backend, options=options)
    for _ in range(calls):
        c_in = _leaves(*raw, grad=grad)
        out = cf(*c_in)
    outs = out if isinstance(out, tuple) else (out,)
    assert any(o.grad_fn is not None and o.grad_fn.name() == "CompiledRegionFunctionBackward" for o in outs), \
        "the compiled call did not run through the AOT runtime"
    _loss_of(out, weights).backward()
    for a, b in list(zip(outs, refs)) + [(c.grad, e.grad) for c, e in zip(c_in, e_in)]:
        if b is None:
            assert a is None
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            assert torch.equal(a._data, b._data), (a, b)
        else:
            torch.testing.assert_close(a._data, b._data, rtol=RTOL, atol=ATOL)
    return cf


# ---------------------------------------------------------------------------------------------
# example 5.1 and exercise 9
# ---------------------------------------------------------------------------------------------
def ex51(x, w):
    return F.gelu(x @ w).sum()


def ex9_relu(x, w):
    return tp.relu(x @ w).sum()


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_example_5_1_gradients_and_saved_set(partitioner):
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    cf = check_grads(ex51, x, w, options={"aot.partitioner": partitioner})
    low = cf._cache[0].lowered
    saved = {s.name for s in low.saved_values if not s.is_input}
    assert saved == {"matmul"}                         # table 5.1: save h = x @ W ...
    bw = low.backward_graph.code
    assert "ops.erf(" in bw and "ops.erf(" not in low.forward_graph.code.replace("gelu", "")  # ... recompute erf


def test_exercise_9_relu_variant_saves_the_mask_not_h():
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    cf = check_grads(ex9_relu, x, w)
    low = cf._cache[0].lowered
    saved = [s for s in low.saved_values if not s.is_input]
    assert "matmul" not in {s.name for s in saved}      # relu's formula reads its output, not h
    assert [s.dtype for s in saved] == [torch.bool]     # min-cut: the 1-byte mask beats the output


def test_joint_graph_layout():
    x = tp.randn(4, 8)
    w = tp.randn(8, 3, requires_grad=True)
    low = tp.compile(ex51, backend="eager").lower(x, w)
    j = build_joint(low.graph_module, low.example_inputs)
    ph = [p.name for p in j.gm.graph.placeholders]
    assert ph == ["primals_0", "primals_1", "tangents_0"]
    outs = j.gm.graph.output_node.args[0]
    assert j.num_fwd_outputs == 1 and len(outs) == 3 and outs[1] is None   # x needs no gradient
    assert j.primals_requiring_grad == [False, True]
    for n in j.gm.graph.nodes:
        if n.op == "call_function":
            assert "val" in n.meta
    # run the joint graph itself against torch
    xt, wt = x._data, w._data.clone().requires_grad_()
    ref = torch.nn.functional.gelu(xt @ wt).sum()
    ref.backward()
    res = j.gm(x, tp.Tensor(w._data), tp.Tensor(torch.tensor(1.0)))
    torch.testing.assert_close(res[0]._data, ref.detach())
    torch.testing.assert_close(res[2]._data, wt.grad, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# blocks
# ---------------------------------------------------------------------------------------------
def layer_norm_block(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax_block(x):
    return F.softmax(x * 2.0, dim=-1)


def cross_entropy_block(logits, target):
    return F.cross_entropy(logits, target)


def attention_block(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


BLOCKS = {
    "layer_norm": (layer_norm_block, lambda: (torch.randn(4, 6, 16), torch.randn(16), torch.randn(16))),
    "softmax": (softmax_block, lambda: (torch.randn(5, 7),)),
    "cross_entropy": (cross_entropy_block, lambda: (torch.randn(12, 10), torch.randint(0, 10, (12,)))),
    "attention": (attention_block, lambda: tuple(torch.randn(2, 2, 8, 4) for _ in range(3))),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_blocks_aot_eager_bit_for_bit(name):
    fn, mk = BLOCKS[name]
    check_grads(fn, *mk())


@pytest.mark.parametrize("n", [0, 1])
def test_edge_sizes(n):
    check_grads(lambda x, w, b: tp.tanh(x @ w + b), torch.randn(n, 5), torch.randn(5, 3), torch.randn(3))


def test_transposed_input_and_broadcasting():
    check_grads(lambda x, w, b: (x @ w).sigmoid() * b, torch.randn(5, 4).t(), torch.randn(5, 3),
                torch.randn(1, 3))


def test_mlp_module_aot_eager_bit_for_bit():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = tp.randn(8, 16), tp.randn(8, 4)
    loss = F.mse_loss(m(x), y)
    loss.backward()
    ref = [p.grad._data.clone() for p in m.parameters()]
    m.zero_grad()
    cm = tp.compile(m, backend="aot_eager")
    cm(x)
    out = cm(x)
    assert out.grad_fn.name() == "CompiledRegionFunctionBackward"
    l2 = F.mse_loss(out, y)
    assert torch.equal(l2._data, loss._data)
    l2.backward()
    for p, r in zip(m.parameters(), ref):
        assert torch.equal(p.grad._data, r)


def _gpt_grads(backend):
    from gpt import GPT, GPTConfig, MarkovTokens
    cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=32)
    tp.manual_seed(0)
    m = GPT(cfg)
    x, y = MarkovTokens(cfg.vocab_size, 0.8, 0).batch(4, cfg.block_size)
    _, loss = m(x, y)
    loss.backward()
    ref = {n: p.grad._data.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    cm = tp.compile(m, backend=backend)
    cm(x, y)
    m.zero_grad()
    _, l2 = cm(x, y)
    assert l2.grad_fn.name() == "CompiledRegionFunctionBackward"
    l2.backward()
    return loss, l2, ref, m


def test_gpt_example_aot_eager_bit_for_bit():
    loss, l2, ref, m = _gpt_grads("aot_eager")
    assert torch.equal(l2._data, loss._data)
    for n, p in m.named_parameters():
        assert torch.equal(p.grad._data, ref[n]), n


# ---------------------------------------------------------------------------------------------
# inputs, outputs and mutation
# ---------------------------------------------------------------------------------------------
def test_mixed_outputs_views_unused_inputs_and_no_grad_inputs():
    def f(x, w, b, unused):
        h = x @ w
        return h + b, h.argmax(-1), w.t(), h * h
    x, w, b, u = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3), torch.randn(2)
    cf = tp.compile(f, backend="aot_eager")
    for _ in range(2):
        ins = _leaves(x, w, b, u, grad=[False, True, True, True])
        out = cf(*ins)
    assert [o.requires_grad for o in out] == [True, False, True, True]
    assert out[1].dtype == torch.int64 and torch.equal(out[1]._data, (x @ w).argmax(-1))
    ref_in = _leaves(x, w, b, u, grad=[False, True, True, True])
    ref = f(*ref_in)
    ws = [torch.randn(o.shape) for o in ref]
    sum((o * tp.Tensor(r)).sum() for o, r, k in zip(ref, ws, range(4)) if k != 1).backward()
    sum((o * tp.Tensor(r)).sum() for o, r, k in zip(out, ws, range(4)) if k != 1).backward()
    for c, e in zip(ins, ref_in):
        if e.grad is None:
            assert c.grad is None
        else:
            assert torch.equal(c.grad._data, e.grad._data)
    assert ins[3].grad is None and ins[0].grad is None


def test_mutated_buffer_is_written_back():
    def f(x, w, buf):
        buf.mul_(0.9).add_(x.sum(0) * 0.1)   # running statistic, no grad
        return (x @ w).tanh().sum()
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    buf_e, buf_c = tp.zeros(8), tp.zeros(8)
    we, wc = _leaves(w, w)
    cf = tp.compile(f, backend="aot_eager")
    for _ in range(3):
        f(tp.Tensor(x), we, buf_e).backward()
        out = cf(tp.Tensor(x), wc, buf_c)
        out.backward()
    assert out.grad_fn is not None
    assert torch.equal(buf_c._data, buf_e._data)
    assert torch.equal(wc.grad._data, we.grad._data)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("stax", marks=pytest.mark.slow)])
def test_mutated_input_that_requires_grad_is_rebased(backend):
    def f(a, w):
        a.mul_(w)                      # a non-leaf input that requires grad, mutated in place
        return (a * a).sum()
    x, w = torch.randn(5), torch.randn(5)
    cf = tp.compile(f, backend=backend)
    for _ in range(2):
        xc, wc = _leaves(x, w)
        a = xc * 2.0
        out = cf(a, wc)
    assert out.grad_fn.name() == "CompiledRegionFunctionBackward"
    assert a.grad_fn.name() == "CompiledRegionFunctionBackward"          # history rebased, as in eager
    (out + (a * 3.0).sum()).backward()
    xe, we = _leaves(x, w)
    ae = xe * 2.0
    oe = f(ae, we)
    (oe + (ae * 3.0).sum()).backward()
    torch.testing.assert_close(a._data, ae._data)
    for c, e in ((xc, xe), (wc, we)):
        torch.testing.assert_close(c.grad._data, e.grad._data, rtol=RTOL, atol=ATOL)


def test_mutating_a_view_that_requires_grad_falls_back_to_eager():
    def f(a):
        a.mul_(3.0)
        return (a * a).sum()
    w = tp.randn(2, 5, requires_grad=True)
    cf = tp.compile(f, backend="aot_eager")
    with pytest.warns(RuntimeWarning, match="mutates input 0 in place"):
        cf((w * 2.0)[0]).backward()                             # the capture run: eager autograd
    expected = torch.zeros(2, 5)
    expected[0] = 72.0 * w._data[0]                             # d/dw (6w)^2 = 72 w
    torch.testing.assert_close(w.grad._data, expected)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_train_mode_running_stats(momentum):
    """Running stats and num_batches_tracked advance as in eager; momentum=None reads the count's
    value (a data gate: a new specialisation per count, never a factor baked at capture)."""
    torch.manual_seed(3)
    m_e = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5, momentum=momentum))
    m_c = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5, momentum=momentum))
    m_c.load_state_dict(m_e.state_dict())
    cm = tp.compile(m_c, backend="aot_eager")
    for _ in range(3):
        x = tp.randn(8, 6)
        m_e(x).pow(2).sum().backward()
        cm(x).pow(2).sum().backward()
    assert int(m_c[1].num_batches_tracked) == 3
    for (n, a), b in zip(m_c.state_dict().items(), m_e.state_dict().values()):
        assert torch.equal(a._data, b._data), n
    for a, b in zip(m_c.parameters(), m_e.parameters()):
        assert torch.equal(a.grad._data, b.grad._data)


@pytest.mark.parametrize("backend", ["aot_eager", "stax"])
def test_dropout_forward_and_backward_agree_on_the_mask(backend):
    # stax: native_dropout is two Pointwise values of one Philox stream; the forward saves the mask
    def f(x, w):
        return F.dropout(x * 2.0, 0.5, training=True) * w
    x, w = tp.randn(256, requires_grad=True), tp.randn(256, requires_grad=True)
    cf = tp.compile(f, backend=backend)
    cf(x, w)
    x.grad = w.grad = None
    y = cf(x, w)
    assert y.grad_fn.name() == "CompiledRegionFunctionBackward"
    y.sum().backward()
    kept = y._data != 0
    assert 50 < int(kept.sum()) < 206                                 # a real draw, p = 0.5
    torch.testing.assert_close(x.grad._data, torch.where(kept, 4.0 * w._data, torch.zeros(())))
    torch.testing.assert_close(w.grad._data, y._data / w._data)
    low = cf._cache[0].lowered
    assert torch.bool in {s.dtype for s in low.saved_values}          # the mask is a saved forward output


# ---------------------------------------------------------------------------------------------
# the runtime: accumulation, retain_graph, double backward, in-place parameter updates
# ---------------------------------------------------------------------------------------------
def _compiled_51(backend="aot_eager"):
    x = tp.randn(6, 5)
    w = tp.randn(5, 4, requires_grad=True)
    cf = tp.compile(ex51, backend=backend)
    cf(x, w)
    w.grad = None
    return cf, x, w


def test_gradient_accumulation_over_two_backward_calls():
    cf, x, w = _compiled_51()
    cf(x, w).backward()
    g1 = w.grad._data.clone()
    cf(x, w).backward()
    ref = w._data.clone().requires_grad_()
    torch.nn.functional.gelu(x._data @ ref).sum().backward()
    torch.testing.assert_close(g1, ref.grad)
    assert torch.equal(w.grad._data, g1 + g1)


def test_retain_graph_and_freed_saved_tensors():
    cf, x, w = _compiled_51()
    y = cf(x, w)
    y.backward(retain_graph=True)
    g1 = w.grad._data.clone()
    y.backward()                                   # saved values still there
    assert torch.equal(w.grad._data, g1 + g1)
    assert y.grad_fn.ctx._saved == ()              # ... and freed after a backward without retain_graph
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_double_backward_raises_clearly():
    cf, x, w = _compiled_51()
    y = cf(x, w)
    with pytest.raises(DoubleBackwardError, match="double backward"):
        tp.autograd.grad(y, w, create_graph=True)


def test_backward_compiled_lazily():
    cf, x, w = _compiled_51()
    rt = cf._cache[0].artifact.aot
    assert rt._bw is None
    cf(x, w).backward()
    assert rt._bw is not None


def test_saved_value_modified_in_place_raises():
    cf, x, w = _compiled_51()
    y = cf(x, w)
    assert "primals_0" in {s.name for s in cf._cache[0].lowered.saved_values}
    x.mul_(2.0)                                    # x is saved: dW = x^T (g * gelu'(h))
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def train_side_by_side(make, steps, opt, lr, x, y, backend):
    """Train an eager and a compiled copy of ``make()`` in lock step (eager optimizer steps, in-place
    parameter updates between compiled calls); returns both models, the compiled one and both
    loss curves."""
    m_e = make()
    m_c = make()
    m_c.load_state_dict(m_e.state_dict())
    cm = tp.compile(m_c, backend=backend)
    pairs = ((m_e, opt(m_e.parameters(), lr=lr), []), (cm, opt(m_c.parameters(), lr=lr), []))
    for _ in range(steps):
        for m, o, curve in pairs:
            o.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            o.step()
            curve.append(loss.item())
    assert cm._compiled_forward.counters["captures"] == 1
    return m_e, m_c, pairs[0][2], pairs[1][2]


def test_sgd_steps_with_in_place_parameter_updates_match_eager():
    torch.manual_seed(2)
    m_e, m_c, _, _ = train_side_by_side(lambda: nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)),
                                        4, tp.optim.SGD, 0.1, tp.randn(16, 8), tp.randn(16, 1), "aot_eager")
    for a, b in zip(m_c.parameters(), m_e.parameters()):
        assert torch.equal(a._data, b._data)


# ---------------------------------------------------------------------------------------------
# API surface: Lowered, options, backends
# ---------------------------------------------------------------------------------------------
def test_lowered_exposes_forward_backward_and_saved_values():
    x = tp.randn(6, 5)
    w = tp.randn(5, 4, requires_grad=True)
    low = tp.compile(ex51).lower(x, w)
    assert low.is_training
    assert "ops.gelu(" in low.forward_graph.code
    assert "tangents_0" in low.backward_graph.code
    (s,) = [s for s in low.saved_values if not s.is_input]
    assert (s.name, tuple(s.shape), s.dtype, s.nbytes) == ("matmul", (6, 4), torch.float32, 6 * 4 * 4)
    with tp.no_grad():
        low2 = tp.compile(ex51).lower(x, w)
    assert not low2.is_training and low2.backward_graph is None and low2.saved_values == []


def test_partitioner_option_validated():
    x, w = tp.randn(3, 4), tp.randn(4, 2, requires_grad=True)
    with pytest.raises(ValueError, match="aot.partitioner"):
        tp.compile(ex51, options={"aot.partitioner": "nope"}).lower(x, w).saved_values
    with pytest.raises(TypeError):
        tp.compile(ex51, options={"aot.partitioner": 3})


def test_aot_eager_registered_and_in_locate_error_prefixes():
    from tensorplay.compiler.backends.debugging import PREFIXES, locate_error
    assert PREFIXES == ("eager", "aot_eager", "stax")
    assert "aot_eager" in tp.compiler.list_backends()
    x, w = tp.randn(3, 4), tp.randn(4, 2, requires_grad=True)
    r = locate_error(ex51, x, w, prefixes=("eager", "aot_eager"))
    assert r.first_bad is None, str(r)


def test_inference_region_unchanged():
    x, w = tp.randn(3, 4), tp.randn(4, 2)
    cf = tp.compile(ex51, backend="aot_eager")
    cf(x, w)
    out = cf(x, w)
    assert out.grad_fn is None
    assert not hasattr(cf._cache[0].artifact, "aot")
    torch.testing.assert_close(out._data, torch.nn.functional.gelu(x._data @ w._data).sum())


# ---------------------------------------------------------------------------------------------
# Stax
# ---------------------------------------------------------------------------------------------
def test_stax_example_5_1_gradients():
    # (the MLP under Stax: test_stax_50_step_training_loop_tracks_eager_loss_curve)
    check_grads(ex51, torch.randn(16, 32), torch.randn(32, 8), backend="stax")


def test_stax_incoming_gradients_with_other_layouts():
    # the gradient of out.t() is transposed, that of a sum is an expanded scalar (stride 0): both are
    # copied to the layout the compiled backward was built for
    x, w = tp.randn(6, 5), tp.randn(5, 4, requires_grad=True)
    cf = tp.compile(lambda x, w: (x @ w).exp())
    r = torch.randn(4, 6)
    for _ in range(2):
        w.grad = None
        out = cf(x, w)
        ((out.t() * tp.Tensor(r)).sum() + out.sum()).backward()
    ref = w._data.clone().requires_grad_()
    o = (x._data @ ref).exp()
    ((o.t() * r).sum() + o.sum()).backward()
    torch.testing.assert_close(w.grad._data, ref.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["cross_entropy", "layer_norm", "softmax",
                                  pytest.param("attention", marks=pytest.mark.slow)])   # ~15 s cold
def test_stax_blocks(name):
    fn, mk = BLOCKS[name]
    check_grads(fn, *mk(), backend="stax")


@pytest.mark.slow            # ~10 s warm, ~70 s with a cold kernel cache (2 cores)
def test_stax_gpt_example_gradients():
    loss, l2, ref, m = _gpt_grads("stax")
    torch.testing.assert_close(l2._data, loss._data, rtol=RTOL, atol=ATOL)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad._data, ref[n], rtol=1e-3, atol=1e-5, msg=n)


def test_stax_50_step_training_loop_tracks_eager_loss_curve():
    torch.manual_seed(4)
    x = tp.randn(64, 16)
    _, _, e, c = train_side_by_side(
        lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)),
        50, tp.optim.Adam, 1e-2, x, (x[:, :1] * 2).sin(), "stax")
    assert e[-1] < 0.5 * e[0]                                  # it trains
    # error model: per-step rounding ~ depth * u, amplified by Adam over 50 steps (measured 2e-6)
    for a, b in zip(c, e):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), (a, b)


# ---------------------------------------------------------------------------------------------
# backend-chosen decompositions (Stax: small attention is differentiated through its decomposition)
# ---------------------------------------------------------------------------------------------
def _attn_loss(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True) * 3.0).square().sum()


def _assert_grads_match_eager(ins):
    got = [t.grad._data.clone() for t in ins]
    for t in ins:
        t.grad = None
    _attn_loss(*ins).backward()
    # eager's gradients come from ATen's fused backward, the compiled ones from the decomposition:
    # two float32 summation orders of rows of E = 16 terms, whose rounding is relative to the largest
    # gradient (a gradient that is 0 exactly on one side, e.g. dq of a row with one key, is ~u·max on
    # the other): 16 u of the largest
    for a, t in zip(got, ins):
        ref = t.grad._data
        torch.testing.assert_close(a, ref, rtol=1e-4, atol=16 * torch.finfo(torch.float32).eps * float(ref.abs().max()))


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tp.from_torch(torch.randn(2, 3, 8, 16, generator=g)).requires_grad_() for _ in range(3)]


def test_stax_small_attention_saves_probabilities(monkeypatch):
    """Stax's choices.aot_decompose expands a small sdpa before AOT differentiates it: the forward
    computes and saves the probabilities P, the backward reads P (no recomputed q kᵀ) and the
    gradients match eager's fused-op formula."""
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    ins = _qkv()
    cf = tp.compile(_attn_loss, strict_native=True)
    cf(*ins).backward()
    _assert_grads_match_eager(ins)
    low = cf.lower(*ins)
    fw_ops = [n.target_name for n in low.forward_graph.graph.nodes if n.op == "call_function"]
    assert "scaled_dot_product_attention" not in fw_ops and "softmax" in fw_ops
    saved = {tuple(s.shape) for s in low.saved_values}
    assert (2, 3, 8, 8) in saved                      # P, the (L, S) probabilities
    bw_ops = [n.target_name for n in low.backward_graph.graph.nodes if n.op == "call_function"]
    assert "softmax" not in bw_ops and bw_ops.count("matmul") == 4   # dV, dP, dQ, dK only


def test_stax_large_attention_keeps_the_fused_op(monkeypatch, config_patch):
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    config_patch("stax.sdpa_decompose_max_scores", 2 * 3 * 8 * 8 - 1)
    ins = _qkv(1)
    cf = tp.compile(_attn_loss, strict_native=True)
    cf(*ins).backward()
    low = cf.lower(*ins)
    assert "scaled_dot_product_attention" in [n.target_name for n in low.forward_graph.graph.nodes]
    bw_ops = [n.target_name for n in low.backward_graph.graph.nodes if n.op == "call_function"]
    assert "_sdpa_backward" in bw_ops and "softmax" not in bw_ops   # ATen's fused backward: no L x S scores
    _assert_grads_match_eager(ins)


def test_aot_eager_does_not_decompose_attention():
    """aot_eager stays bit-exact with eager: only Stax asks for the decomposition."""
    ins = _qkv(2)
    low = tp.compile(_attn_loss, backend="aot_eager").lower(*ins)
    assert "scaled_dot_product_attention" in [n.target_name for n in low.forward_graph.graph.nodes]


def test_conv_training_backward_computes_both_gradients_in_one_call():
    """A convolution whose input and weight both need gradients is differentiated by the one op
    ``convolution_backward`` (one ATen call, an extern kernel under Stax), not by the two
    single-gradient ops; the first conv of a network (input without grad) keeps the weight-only op."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 3, stride=2, padding=1))
    x = tp.randn(2, 3, 9, 9)
    cf = tp.compile(lambda a: net(a).pow(2).sum(), strict_native=True)
    cf(x).backward()
    got = [p.grad._data.clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = None
    net(x).pow(2).sum().backward()
    for a, p in zip(got, net.parameters()):
        torch.testing.assert_close(a, p.grad._data, rtol=1e-4, atol=1e-5)
    bw_ops = [n.target_name for n in cf.lower(x).backward_graph.graph.nodes if n.op == "call_function"]
    assert bw_ops.count("convolution_backward") == 1 and bw_ops.count("convolution_backward_weight") == 1
    assert "convolution_backward_input" not in bw_ops


def test_training_through_a_bool_mask_index_and_masked_select(recwarn):
    """A loss over the selected rows (``logits[mask]``) and a masked_select: the joint graph is
    retraced with the output shapes the capture recorded (data gates), so the region compiles (no
    fallback to eager; under Stax both are library kernels, so strict_native accepts it); a call
    with another mask count recompiles.  Gradients match eager."""
    torch.manual_seed(0)
    w = tp.randn(16, 10, requires_grad=True)

    def loss_fn(x, y, mask):
        logits = x @ w
        return F.cross_entropy(logits[mask], y[mask]) + tp.masked_select(logits, mask[:, None]).pow(2).mean()
    cf = tp.compile(loss_fn, strict_native=True)
    counts = []
    for k in range(4):
        x, y = tp.randn(32, 16), tp.from_torch(torch.randint(0, 10, (32,)))
        mask = tp.from_torch(torch.rand(32) > (0.3 if k % 2 else 0.6))
        counts.append(int(mask._data.sum()))
        w.grad = None
        loss = cf(x, y, mask)
        loss.backward()
        got = w.grad._data.clone()
        w.grad = None
        want = loss_fn(x, y, mask)
        want.backward()
        torch.testing.assert_close(loss._data, want._data, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, w.grad._data, rtol=1e-5, atol=1e-6)
    assert not [w_ for w_ in recwarn if "running the captured graph op by op" in str(w_.message)]
    assert len(cf._cache) == len(set(counts)) and cf._cache[0].lowered.backward_graph is not None
