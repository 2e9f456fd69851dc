"""Run under ``python -m tensorplay.distributed.launch --nproc N`` as ``moe_ep_worker.py OUT``: every
rank runs expert-parallel MoE (tp.distributed.moe) on a 1-D mesh of N members and saves what it saw
to ``OUT/rank<r>.pt``; test_moe_ep.py compares it with the single-process layer.  ``inputs`` is
shared with the test (the same seeded weights on both sides)."""
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

import tensorplay as tp
import tensorplay.distributed as D
from tensorplay.distributed import P
from tensorplay.nn import moe

D_MODEL, D_FF, TOKENS_PER_MEMBER = 6, 5, 6
SEED_H = torch.arange(1.0, 13.0).reshape(4, 3)                  # h0..h3, integer-valued
SEED_W = torch.tensor([[[1., 0, 2], [0, 1, 0], [1, 1, 1]],      # expert 0 (device 0)
                       [[2., 1, 0], [0, 0, 1], [1, 0, 3]]])     # expert 1 (device 1)
SEED_ROUTE = [1, 0, 0, 1]
SEED_C = torch.tensor([[1., 2, 3], [-1, 0, 2], [3, 1, -2], [2, 2, 1]])
AUX_COEF = 0.5
SEED = 33          # (chosen so that every expert gets records and the members' loads differ)


def inputs(n, k):
    """h [S, D], router [D, E], w1 [E, D, F], w2 [E, F, D] and a cotangent [S, D] (float64, E = 2n)."""
    g = torch.Generator().manual_seed(SEED + 1000 * n + k)
    e, s = 2 * n, TOKENS_PER_MEMBER * n

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return r(s, D_MODEL), r(D_MODEL, e), r(e, D_MODEL, D_FF, scale=0.5), r(e, D_FF, D_MODEL, scale=0.5), \
        r(s, D_MODEL)




def t(x):
    return None if x is None else x._data.detach().clone()


def seed_example(mesh):
    """Seed 001 §6: device m holds h_{2m}, h_{2m+1} and expert m; routing [1, 0, 0, 1]."""
    seen = {}

    def body(h, w):
        m = D.axis_index("E")
        ids = tp.from_torch(torch.tensor(SEED_ROUTE[2 * m:2 * m + 2]).reshape(2, 1))
        ed = D.dispatch_to_experts(h, ids, tp.ones(2, 1, dtype=h.dtype), 2, "E")
        seen.update(received=t(ed.received), send=ed.send_sizes, recv=ed.recv_sizes)
        return D.return_to_tokens(moe.expert_mlp(ed.rows, ed.group_sizes, w), ed, h.shape[0])
    f = D.shard_map(body, mesh, (P("E"), P("E")), P("E"))
    h, w = tp.from_torch(SEED_H.clone()).requires_grad_(), tp.from_torch(SEED_W.clone()).requires_grad_()
    out = f(h, w)
    (out.gather() * tp.from_torch(SEED_C)).sum().backward()
    return {**seen, "out": t(out.gather()), "grad_h": t(h.grad), "grad_w": t(w.grad)}


CAPACITY_FACTOR = 0.75                 # (the capacity case: k = 2, some records dropped)


def capacity(n, k):
    return moe.capacity_rows(TOKENS_PER_MEMBER * n, 2 * n, k, CAPACITY_FACTOR)


def layer(mesh, n, k, cap=None):
    def body(h, r, w1, w2):
        o = D.expert_parallel_moe(h, r, w1, w2, "E", k, capacity=cap)
        return o.output, o.aux_loss, o.dropped
    f = D.shard_map(body, mesh, (P("E"), P(), P("E"), P("E")), (P("E"), P(), P()))
    *xs, c = inputs(n, k)
    xs = [tp.from_torch(v.clone()).requires_grad_() for v in xs]
    out, aux, dropped = f(*xs)
    ((out.gather() * tp.from_torch(c)).sum() + AUX_COEF * aux.gather()).backward()
    return {"out": t(out.gather()), "aux": t(aux.gather()), "grads": [t(v.grad) for v in xs],
            "dropped": int(dropped.local().item())}


def exchange_sizes(n, m):
    """Rows member ``m`` sends to each member in the bare all_to_all_v case: ``(j + m) % n + 1``."""
    return [(j + m) % n + 1 for j in range(n)]


def exchange_inputs(n):
    rows = n * sum(exchange_sizes(n, 0))
    return (torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) - 5,
            torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3).flip(0) % 7 - 3)


def exchange(mesh, n, compiled):
    """D.all_to_all_v alone, uneven sizes, eager or inside a compiled body; integer-valued (exact)."""
    seen = {}

    def body(x):
        y, recv = D.all_to_all_v(x * 2 + 1, "E", exchange_sizes(n, D.axis_index("E")))
        seen["recv"] = recv
        return y * 3
    f = D.shard_map(tp.compile(body) if compiled else body, mesh, P("E"), P("E"))
    x0, c = exchange_inputs(n)
    x = tp.from_torch(x0).requires_grad_()
    y = f(x)
    (y.gather() * tp.from_torch(c)).sum().backward()
    y2 = f(tp.from_torch(x0 + 1))               # a second call (compiled: the cached graph)
    return {"out": t(y.gather()), "out2": t(y2.gather()), "grad": t(x.grad), "recv": seen["recv"]}


def errors(mesh, n):
    """5 experts over 2 members (indivisible), and a negative capacity."""
    def call(num_experts, shard_experts, **kw):
        body = lambda h, r, w: D.expert_parallel_moe(h, r, w, None, "E", **kw).output   # noqa: E731
        specs = (P("E"), P(), P("E") if shard_experts else P())
        D.shard_map(body, mesh, specs, P("E"))(tp.ones(TOKENS_PER_MEMBER * n, 2), tp.ones(2, num_experts),
                                               tp.ones(num_experts, 2, 2))
    out = {}
    for name, fn in (("indivisible", lambda: call(2 * n + 1, False)),
                     ("capacity", lambda: call(2 * n, True, capacity=-1))):
        try:
            fn()
            out[name] = "no error"
        except Exception as e:        # noqa: BLE001 -- the test checks the type and message
            out[name] = f"{type(e).__name__}: {e}"
    return out


def main():
    out_dir = Path(sys.argv[1])
    D.init()
    n = D.world_size()
    mesh = D.Mesh(np.arange(n), ("E",))
    cases = {"k1": lambda: layer(mesh, n, 1), "k2": lambda: layer(mesh, n, 2),
             "capacity": lambda: layer(mesh, n, 2, capacity(n, 2)), "errors": lambda: errors(mesh, n),
             "exchange": lambda: exchange(mesh, n, False), "exchange_compiled": lambda: exchange(mesh, n, True)}
    if n == 2:
        cases["seed"] = lambda: seed_example(mesh)
    rec = {}
    for name, fn in cases.items():
        try:
            rec[name] = fn()
        except Exception:             # noqa: BLE001 -- recorded for the test to show
            rec[name] = {"error": traceback.format_exc()}
    torch.save(rec, out_dir / f"rank{D.rank()}.pt")
    D.shutdown()


if __name__ == "__main__":
    main()
