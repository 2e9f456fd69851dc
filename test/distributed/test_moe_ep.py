"""Expert-parallel MoE (tp.distributed.moe) on 2 and 4 processes against the single-process layer.

moe_ep_worker.py runs once per world size (through the launcher, with a timeout) and every rank
records its global outputs and gradients; the references here are nn.MoE with the same weights
(float64).  The seed's 2-device example (seed 001 §6) is exact: integer inputs, routing [1, 0, 0, 1]."""
import numpy as np
import pytest
import torch

import moe_ep_worker as W
import tensorplay as tp
import tensorplay.distributed as D
from spmd import run_launcher
from tensorplay import nn

WORLDS = (2, 4)


@pytest.fixture(scope="module")
def ep(tmp_path_factory):
    runs = {}
    for n in WORLDS:
        out = tmp_path_factory.mktemp(f"moe_ep{n}")
        r = run_launcher(n, W.__file__, out, timeout=120)
        assert r.returncode == 0, f"moe_ep_worker.py on {n} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
        runs[n] = [torch.load(out / f"rank{k}.pt", weights_only=False) for k in range(n)]
    return runs


def _case(ep, n, name):
    recs = [rec[name] for rec in ep[n]]
    for k, rec in enumerate(recs):
        assert "error" not in rec, f"rank {k} of {n}, {name}:\n{rec['error']}"
    return recs


def reference(n, k, capacity_factor=None):
    """nn.MoE on one process with the worker's weights: output, aux loss, gradients, expert loads
    (and, with a capacity factor, the number of dropped records)."""
    h, r, w1, w2, c = W.inputs(n, k)
    m = nn.MoE(W.D_MODEL, 2 * n, k, d_ff=W.D_FF, dtype=torch.float64, capacity_factor=capacity_factor)
    for p, v in ((m.router, r), (m.w1, w1), (m.w2, w2)):
        p._data.copy_(v)
    x = tp.from_torch(h.clone()).requires_grad_()
    o = m(x)
    ((o.output * tp.from_torch(c)).sum() + W.AUX_COEF * o.aux_loss).backward()
    loads = nn.moe.route(x.detach(), m.router.detach(), k).expert_ids._data.reshape(-1).bincount(minlength=2 * n)
    grads = [g._data for g in (x.grad, m.router.grad, m.w1.grad, m.w2.grad)]
    if capacity_factor is not None:
        return o.output._data.detach(), o.aux_loss._data.detach(), grads, loads, int(o.dropped.item())
    return o.output._data.detach(), o.aux_loss._data.detach(), grads, loads


def test_seed_example_two_devices(ep):
    """Device m holds h_{2m}, h_{2m+1} and expert m; routing [1, 0, 0, 1] sends h0 to device 1 and
    h2 to device 0, the rest stay; the outputs come back to their positions."""
    r0, r1 = _case(ep, 2, "seed")
    h, w = W.SEED_H, W.SEED_W
    assert torch.equal(r0["received"], torch.stack([h[1], h[2]]))     # its own h1, then h2 from device 1
    assert torch.equal(r1["received"], torch.stack([h[0], h[3]]))     # h0 from device 0, then its own h3
    assert r0["send"] == r0["recv"] == r1["send"] == r1["recv"] == [1, 1]
    hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    want = torch.stack([hr[t] @ wr[e] for t, e in enumerate(W.SEED_ROUTE)])
    (want * W.SEED_C).sum().backward()
    assert want.abs().sum() > 0
    for rec in (r0, r1):
        assert torch.equal(rec["out"], want.detach())
        assert torch.equal(rec["grad_h"], hr.grad) and torch.equal(rec["grad_w"], wr.grad)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("n", WORLDS)
def test_layer_equals_single_process(ep, n, k):
    out, aux, grads, loads = reference(n, k)
    per_member = loads.reshape(n, 2).sum(1)
    assert (loads > 0).all() and len(set(per_member.tolist())) > 1      # every expert used, uneven splits
    assert out.abs().min() > 0 and all(g.abs().sum() > 0 for g in grads)
    _same_as_reference(_case(ep, n, f"k{k}"), out, aux, grads)


def _same_as_reference(recs, out, aux, grads):
    for rank, rec in enumerate(recs):
        torch.testing.assert_close(rec["out"], out, rtol=1e-10, atol=1e-12, msg=f"output, rank {rank}")
        torch.testing.assert_close(rec["aux"], aux, rtol=1e-10, atol=1e-12, msg=f"aux loss, rank {rank}")
        for name, got, want in zip(("input", "router", "w1", "w2"), rec["grads"], grads):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=f"grad of {name}, rank {rank}")


@pytest.mark.parametrize("n", WORLDS)
def test_layer_with_capacity_equals_single_process(ep, n):
    """Capacity C = capacity_rows(S, E, 2, 0.75) for the whole batch: each expert keeps its first C
    records in global token order, like the one-process layer; the same records are dropped."""
    out, aux, grads, loads, dropped = reference(n, 2, W.CAPACITY_FACTOR)
    cap = W.capacity(n, 2)
    assert dropped == int((loads - cap).clamp(min=0).sum()) > 0
    recs = _case(ep, n, "capacity")
    assert [rec["dropped"] for rec in recs] == [dropped] * n
    assert (out.abs().sum(1) == 0).sum() < len(out) and all(g.abs().sum() > 0 for g in grads)
    _same_as_reference(recs, out, aux, grads)


def _exchange_reference(n, x, c):
    """Member j receives every member i's j-th piece, in member order; the cotangent goes back."""
    rows = len(x) // n
    y, gx = torch.empty_like(x), torch.empty_like(x)
    pieces = [list(torch.arange(i * rows, (i + 1) * rows).split(W.exchange_sizes(n, i))) for i in range(n)]
    at = 0
    for j in range(n):
        for i in range(n):
            idx = pieces[i][j]
            y[at:at + len(idx)] = (x[idx] * 2 + 1) * 3
            gx[idx] = c[at:at + len(idx)] * 6
            at += len(idx)
    return y, gx


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("n", WORLDS)
def test_all_to_all_v_uneven_sizes(ep, n, compiled):
    x, c = W.exchange_inputs(n)
    want, grad = _exchange_reference(n, x, c)
    want2, _ = _exchange_reference(n, x + 1, c)
    assert want.abs().sum() > 0 and grad.abs().sum() > 0
    for j, rec in enumerate(_case(ep, n, "exchange_compiled" if compiled else "exchange")):
        assert rec["recv"] == [(j + i) % n + 1 for i in range(n)]
        assert torch.equal(rec["out"], want) and torch.equal(rec["out2"], want2) and torch.equal(rec["grad"], grad)


def test_errors(ep):
    for rec in _case(ep, 2, "errors"):
        assert rec["indivisible"].startswith("ValueError: expert_parallel_moe: 5 experts cannot be sharded over the 2")
        assert rec["capacity"] == "ValueError: expert_parallel_moe: capacity must be >= 0 rows per expert, got -1"


def test_one_device_mesh_is_the_single_process_layer():
    """On a one-device mesh (no process group) every exchange is the identity."""
    out, aux, grads, _ = reference(1, 2)
    mesh = D.Mesh(np.arange(1), ("E",))
    f = D.shard_map(lambda *a: tuple(D.expert_parallel_moe(*a, "E", 2))[:2], mesh,
                    (D.P("E"), D.P(), D.P("E"), D.P("E")), (D.P("E"), D.P()))
    *xs, c = W.inputs(1, 2)
    xs = [tp.from_torch(v.clone()).requires_grad_() for v in xs]
    o, a = f(*xs)
    ((o.gather() * tp.from_torch(c)).sum() + W.AUX_COEF * a.gather()).backward()
    torch.testing.assert_close(o.gather()._data, out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.gather()._data, aux, rtol=1e-10, atol=1e-12)
    for x, g in zip(xs, grads):
        torch.testing.assert_close(x.grad._data, g, rtol=1e-9, atol=1e-12)
