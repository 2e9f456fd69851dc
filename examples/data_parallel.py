"""Data-parallel linear regression in manual mode (tp.distributed.shard_map), checked against the
same training run in one process.

Every process draws the same global batch (same seed); ``device_put`` keeps each process's rows;
the parameters enter the body replicated (``P()``), the body computes its local loss and averages
it over the ``data`` axis with ``pmean``; ``out_specs=P()`` says the result is the same everywhere.
``loss.backward()`` on every process gives every process the *global* gradient of the parameters
(shard_map sums the parts of a replicated input's gradient), so each takes the same SGD step.

    python -m tensorplay.distributed.launch --nproc 2 examples/data_parallel.py
    torchrun --nproc-per-node 2 examples/data_parallel.py
    python examples/data_parallel.py          # one process: a mesh of one device

Rank 0 prints the sharded batch, the loss every few steps and ``ok`` when the parameters equal the
single-process run's.
"""
from __future__ import annotations

import argparse

import tensorplay as tp
import tensorplay.distributed as D
from tensorplay.distributed import P, NamedSharding


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, default=8, help="rows of the batch per process")
    args = ap.parse_args(argv)

    D.init()
    n, me = D.world_size(), D.rank()
    mesh = D.make_mesh((n,), ("data",))
    tp.manual_seed(0)                                   # the same global batch on every process
    X = tp.randn(args.rows * n, 3)
    Y = X @ tp.tensor([[1.0], [-2.0], [0.5]]) + 0.01 * tp.randn(args.rows * n, 1)
    rows = NamedSharding(mesh, P("data"))
    xs, ys = D.device_put(X, rows), D.device_put(Y, rows)
    if me == 0:
        print(xs)                                       # global [16, 3], spec P('data'), local [8, 3]

    @D.shard_map(mesh=mesh, in_specs=(P("data"), P("data"), P()), out_specs=P())
    def loss_fn(x, y, w):
        local = ((x @ w - y) ** 2).mean()               # this process's rows only
        return D.pmean(local, "data")                   # the mean over the whole batch, on every process

    w = tp.zeros(3, 1, requires_grad=True)
    w_ref = tp.zeros(3, 1, requires_grad=True)          # the same training in one process
    for step in range(args.steps):
        loss = loss_fn(xs, ys, w)
        loss.backward()
        ref = ((X @ w_ref - Y) ** 2).mean()
        ref.backward()
        with tp.no_grad():
            for p in (w, w_ref):
                p -= 0.2 * p.grad
                p.grad = None
        if me == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.local().item():.6f}  (one process: {ref.item():.6f})")
    same = bool((w - w_ref).abs().max() < 1e-5)
    if me == 0:
        print("w =", [round(v, 4) for v in w.detach().reshape(-1).tolist()], "ok" if same else "MISMATCH")
    D.shutdown()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
