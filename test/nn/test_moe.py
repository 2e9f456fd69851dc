"""tp.nn.moe (seed 001 §6): the seed's grouping and top-2 return table exactly; the MoE layer against a
dense reference loop (each token's output = Σ over its top-k experts of gate · expert(h)) for the
forward and the gradients of the input, router and expert weights, with and without capacity; the
overflow rule on a constructed case; the auxiliary loss by hand; compiled (strict_native) training
steps against eager; the error messages."""
import math

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.nn import moe
from tensorplay.testing import assert_close


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def T(x, grad=False):
    t = tp.from_torch(x.detach().clone())
    return t.requires_grad_() if grad else t


# ---- the seed's examples ---------------------------------------------------------------------------
def test_seed_grouping_and_restoring_order():
    """a0..a3 routed to experts [1, 0, 1, 1] (top-1, gate 1): grouped [a1 | a0, a2, a3], group sizes
    [1, 3]; the outputs come back as [o0, o1, o2, o3] (integer-valued floats: exact)."""
    a = torch.randint(-5, 6, (4, 3), generator=torch.Generator().manual_seed(1)).double()
    w = torch.randint(-5, 6, (2, 3, 2), generator=torch.Generator().manual_seed(2)).double()
    experts = [1, 0, 1, 1]
    d = moe.dispatch(T(a), tp.tensor([[e] for e in experts]), tp.ones(4, 1, dtype=torch.float64), 2)
    assert torch.equal(d.rows._data, a[[1, 0, 2, 3]])
    assert d.group_sizes.tolist() == [1, 3] and d.token_ids.tolist() == [1, 0, 2, 3]
    assert d.expert_ids.tolist() == [0, 1, 1, 1] and d.dropped.item() == 0 and d.kept.all().item()
    y = moe.expert_mlp(d.rows, d.group_sizes, T(w))
    o = torch.stack([a[i] @ w[e] for i, e in enumerate(experts)])
    assert torch.equal(y._data, o[[1, 0, 2, 3]])                      # [o1, o0, o2, o3]
    assert torch.equal(moe.combine(y, d.token_ids, d.weights, 4)._data, o)


def test_seed_top2_return_table():
    """h0 -> experts 0, 1 with 0.7, 0.3; h1 -> 0.2, 0.8.  Outputs returned shuffled: u = E1(h1),
    v = E0(h0), w = E1(h0), z = E0(h1); out[0] = 0.7v + 0.3w, out[1] = 0.2z + 0.8u."""
    h, W = rand(2, 3, seed=3), rand(2, 3, 4, seed=4)
    E = [lambda x, e=e: x @ W[e] for e in range(2)]
    u, v, w, z = E[1](h[1]), E[0](h[0]), E[1](h[0]), E[0](h[1])
    out = moe.combine(T(torch.stack([u, v, w, z])), tp.tensor([1, 0, 0, 1]),
                      tp.tensor([0.8, 0.7, 0.3, 0.2], dtype=torch.float64), 2)
    assert torch.equal(out._data[0], 0.7 * v + 0.3 * w)
    assert torch.equal(out._data[1], 0.2 * z + 0.8 * u)
    # the same through dispatch: records grouped by expert, merged by token
    gates = tp.tensor([[0.7, 0.3], [0.8, 0.2]], dtype=torch.float64)
    d = moe.dispatch(T(h), tp.tensor([[0, 1], [1, 0]]), gates, 2)
    assert d.token_ids.tolist() == [0, 1, 0, 1] and d.group_sizes.tolist() == [2, 2]
    y = moe.expert_mlp(d.rows, d.group_sizes, T(W))
    assert torch.equal(y._data, torch.stack([v, z, w, u]))
    assert_close(moe.combine(y, d.token_ids, d.weights, 2), torch.stack([0.7 * v + 0.3 * w, 0.2 * z + 0.8 * u]),
                 exact=True)


# ---- the layer against a dense reference ----------------------------------------------------------------
def dense_reference(h, router, w1, w2, k, renormalize, capacity, act=torch.nn.functional.gelu):
    """Plain loop: every token's top-k experts, each applied to the token's row; with a capacity,
    an expert takes the first C records in token order and the others contribute nothing."""
    x = h.reshape(-1, h.shape[-1])
    probs = torch.softmax(x @ router, -1)
    gates, ids = torch.topk(probs, k, -1)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    load = [0] * router.shape[1]
    rows, dropped = [], 0
    for t in range(x.shape[0]):
        acc = torch.zeros(w1.shape[1] if w2 is None else w2.shape[2], dtype=x.dtype)
        for j in range(k):
            e = int(ids[t, j])
            load[e] += 1
            if capacity is not None and load[e] > capacity:
                dropped += 1
                continue
            y = x[t] @ w1[e] if w2 is None else act(x[t] @ w1[e]) @ w2[e]
            acc = acc + gates[t, j] * y
        rows.append(acc)
    counts = torch.tensor(load, dtype=x.dtype)
    aux = router.shape[1] * ((counts / counts.sum()) * probs.mean(0)).sum()
    return torch.stack(rows).reshape(h.shape), aux, dropped


def _pair(k, d_ff, renormalize=False, capacity_factor=None, D=6, E=4, seed=0):
    tp.manual_seed(seed)
    m = nn.MoE(D, E, k=k, d_ff=d_ff, renormalize=renormalize, capacity_factor=capacity_factor, dtype=torch.float64)
    return m, [p._data.detach().clone().requires_grad_() for p in m.parameters()]


@pytest.mark.parametrize("k,d_ff,renormalize,capacity_factor", [
    (1, None, False, None), (2, None, True, None), (2, 5, False, None), (3, 5, True, None),
    (1, 5, False, 1.0), (2, None, False, 0.6), (2, 5, True, 1.25)])
def test_layer_equals_dense_reference_with_gradients(k, d_ff, renormalize, capacity_factor):
    m, ref_params = _pair(k, d_ff, renormalize, capacity_factor)
    h0 = rand(3, 5, 6, seed=5)
    h = T(h0, grad=True)
    out = m(h)
    cap = None if capacity_factor is None else moe.capacity_rows(15, 4, k, capacity_factor)
    hr = h0.clone().requires_grad_()
    router, w1 = ref_params[:2]
    w2 = ref_params[2] if d_ff else None
    ref, aux, dropped = dense_reference(hr, router, w1, w2, k, renormalize, cap)
    assert out.output.shape == (3, 5, 6)
    assert_close(out.output, ref, rtol=1e-12, atol=1e-12, msg="forward")
    assert_close(out.aux_loss, aux, rtol=1e-12, atol=1e-12, msg="aux loss")
    assert out.dropped.item() == dropped
    if capacity_factor is not None and capacity_factor < 1:
        assert dropped > 0
    g = rand(3, 5, 6, seed=6)
    (out.output * T(g)).sum().backward()
    (ref * g).sum().backward()
    assert_close(h.grad, hr.grad, rtol=1e-10, atol=1e-12, msg="grad of the input")
    for (name, p), r in zip(m.named_parameters(), ref_params):
        assert p.grad._data.abs().sum() > 0, name
        assert_close(p.grad, r.grad, rtol=1e-10, atol=1e-12, msg=f"grad of {name}")


def test_aux_loss_gradient_reaches_the_router():
    m, (router, w) = _pair(2, None)
    h0 = rand(8, 6, seed=7)
    m(T(h0)).aux_loss.backward()
    _, aux, _ = dense_reference(h0, router, w, None, 2, False, None)
    aux.backward()
    assert m.weight.grad is None or not m.weight.grad._data.any()
    assert_close(m.router.grad, router.grad, rtol=1e-10, atol=1e-12)


def test_aux_loss_by_hand():
    """E · Σ f_e P_e with f the fraction of records per expert, P the mean probability."""
    probs = tp.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.7, 0.1, 0.2]], dtype=torch.float64)
    counts = tp.tensor([2, 1, 1])                       # top-1 of the rows: experts 0, 1, 2, 0
    P = [(0.5 + 0.1 + 0.2 + 0.7) / 4, (0.3 + 0.6 + 0.2 + 0.1) / 4, (0.2 + 0.3 + 0.6 + 0.2) / 4]
    f = [2 / 4, 1 / 4, 1 / 4]
    want = 3 * sum(fe * pe for fe, pe in zip(f, P))
    assert math.isclose(moe.load_balancing_loss(probs, counts).item(), want, rel_tol=1e-14)
    uniform = tp.full((6, 3), 1 / 3, dtype=torch.float64)
    assert math.isclose(moe.load_balancing_loss(uniform, tp.tensor([2, 2, 2])).item(), 1.0, rel_tol=1e-14)


# ---- capacity ---------------------------------------------------------------------------------------------
def test_capacity_overflow_rule_on_a_constructed_case():
    """Experts [0, 0, 1, 0, 0, 1], C = 2: expert 0 keeps tokens 0, 1 (token order), drops 3, 4; expert 1
    keeps 2, 5.  Dropped records sit after the groups, weight 0: zero output, zero gradient."""
    h0 = rand(6, 3, seed=8)
    h = T(h0, grad=True)
    W = T(rand(2, 3, 3, seed=9), grad=True)
    gates = T(torch.tensor([[0.9], [0.8], [0.7], [0.6], [0.5], [0.4]], dtype=torch.float64), grad=True)
    d = moe.dispatch(h, tp.tensor([[0], [0], [1], [0], [0], [1]]), gates, 2, capacity=2)
    assert d.token_ids.tolist() == [0, 1, 2, 5, 3, 4]
    assert d.group_sizes.tolist() == [2, 2] and d.counts.tolist() == [4, 2] and d.dropped.item() == 2
    assert d.kept.tolist() == [True] * 4 + [False] * 2
    assert d.weights.tolist() == [0.9, 0.8, 0.7, 0.4, 0.0, 0.0]
    y = moe.expert_mlp(d.rows, d.group_sizes, W)
    assert not y._data[4:].any()
    out = moe.combine(y, d.token_ids, d.weights, 6)
    for t, e, g in [(0, 0, 0.9), (1, 0, 0.8), (2, 1, 0.7), (5, 1, 0.4)]:
        assert_close(out._data[t], g * (h0[t] @ W._data[e]), rtol=1e-14, atol=0)
    assert not out._data[[3, 4]].any()
    out.sum().backward()
    assert not h.grad._data[[3, 4]].any() and h.grad._data[[0, 1, 2, 5]].abs().min() > 0
    assert not gates.grad._data[[3, 4]].any() and gates.grad._data[[0, 1, 2, 5]].abs().min() > 0


def test_expert_ids_out_of_range_are_dropped():
    h = T(rand(4, 3, seed=12))
    d = moe.dispatch(h, tp.tensor([[-1], [0], [2], [1]]), T(rand(4, 1, seed=13)), 2)
    assert d.token_ids.tolist() == [1, 3, 0, 2] and d.group_sizes.tolist() == [1, 1]
    assert d.kept.tolist() == [True, True, False, False] and d.dropped.item() == 2 and d.counts.tolist() == [1, 1]
    assert d.weights._data[2:].tolist() == [0.0, 0.0] and d.weights._data[:2].abs().min() > 0
    d2 = moe.dispatch(h, tp.tensor([[-1], [0], [2], [0]]), T(rand(4, 1, seed=13)), 2, capacity=1)
    assert d2.token_ids.tolist() == [1, 3, 0, 2] and d2.group_sizes.tolist() == [1, 0] and d2.dropped.item() == 3
    assert d2.kept.tolist() == [True, False, False, False]


def test_capacity_rows_and_a_token_keeps_its_residual():
    assert moe.capacity_rows(16, 4, 2, 1.0) == 8 and moe.capacity_rows(16, 4, 2, 1.25) == 10
    assert moe.capacity_rows(3, 8, 1, 0.5) == 1
    # capacity 0 drops everything: the layer adds nothing, a residual block returns its input
    h = T(rand(5, 4, seed=10))
    d = moe.dispatch(h, tp.tensor([[1], [0], [1], [1], [0]]), tp.ones(5, 1, dtype=torch.float64), 2, capacity=0)
    assert d.dropped.item() == 5 and d.group_sizes.tolist() == [0, 0]
    y = moe.expert_mlp(d.rows, d.group_sizes, T(rand(2, 4, 4, seed=11)))
    assert torch.equal((h + moe.combine(y, d.token_ids, d.weights, 5))._data, h._data)


# ---- in a model, compiled ----------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.moe = nn.MoE(8, 4, **kw)

    def forward(self, x):
        h = self.inp(x).tanh()
        r = self.moe(h)
        return (h + r.output).pow(2).mean() + 0.01 * r.aux_loss, r.dropped


@pytest.mark.parametrize("kw", [dict(k=2, d_ff=16, capacity_factor=0.75), dict(k=1)])
def test_compiled_training_step_equals_eager(kw):
    tp.manual_seed(1)
    m = Block(**kw)
    x = tp.randn(4, 5, 6)
    loss, dropped = m(x)
    loss.backward()
    ref = {n: p.grad._data.clone() for n, p in m.named_parameters()}
    cm = tp.compile(m, strict_native=True)
    cm(x)                                              # the capture run
    m.zero_grad()
    loss2, dropped2 = cm(x)
    assert loss2.grad_fn.name() == "CompiledRegionFunctionBackward"
    assert_close(loss2, loss, rtol=1e-6, atol=1e-7)
    assert dropped2.item() == dropped.item() and (dropped.item() > 0) == ("capacity_factor" in kw)
    loss2.backward()
    for n, p in m.named_parameters():
        assert ref[n].abs().sum() > 0, n
        assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-6, msg=n)


# ---- errors ------------------------------------------------------------------------------------------------
def test_errors():
    h = tp.randn(4, 6)
    with pytest.raises(ValueError, match=r"moe.route: k must be in \[1, 3\]"):
        moe.route(h, tp.randn(6, 3), k=4)
    with pytest.raises(ValueError, match=r"moe.route: h must be \[S, D\] and router_weight \[D, E\], got \[4, 6\] and \[5, 3\]"):
        moe.route(h, tp.randn(5, 3))
    with pytest.raises(ValueError, match=r"expert_ids and gates must both be \[S=4, k\], got \[4, 2\] and \[4, 1\]"):
        moe.dispatch(h, tp.tensor([[0, 1]] * 4), tp.ones(4, 1), 2)
    with pytest.raises(TypeError, match="expert_ids must be int64, got int32"):
        moe.dispatch(h, tp.tensor([[0]] * 4, dtype=torch.int32), tp.ones(4, 1), 2)
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        moe.dispatch(h, tp.tensor([[0]] * 4), tp.ones(4, 1), 2, capacity=-1)
    with pytest.raises(ValueError, match=r"moe.combine: expert_out must be \[R, D\]"):
        moe.combine(h, tp.tensor([0, 1, 2]), tp.ones(3), 4)
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        moe.capacity_rows(4, 2, 1, 0.0)
    with pytest.raises(ValueError, match=r"MoE: k must be in \[1, num_experts=2\]"):
        nn.MoE(6, 2, k=3)
    with pytest.raises(ValueError, match=r"MoE: the input's last dim must be d_model=6, got \[2, 5\]"):
        nn.MoE(6, 2)(tp.randn(2, 5))
