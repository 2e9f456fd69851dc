"""Collective matmul against all-gather + matmul (seed 001 §5), and the two-projection plans A and
B of seed 001 §3, on N local processes (gloo on CPU; NCCL when each process has a GPU).

Per rank: ``a`` [B, D/N] (the input split along its features), ``w`` [D, F/N] (its output columns).
Variants, timed interleaved in rounds (medians of ``--repeats`` readings, each after a barrier):

* ``all-gather + matmul``: ``all_gather(a, tiled) @ w``; also its parts alone, ``T_AG`` (the
  all-gather) and ``T_local`` (the product of the gathered input);
* ``collective matmul``: ``D.collective_matmul(a, w)`` -- blocks around the ring, the next transfer
  overlapped with the current product; its exposed communication is ``t - T_local``.

Plans of §3 (``--plans``), the two projections ``H = X W1^T``, ``Y = H W2^T`` with one row of X per
rank: A -- every rank multiplies its own row by the full weights; B -- weights sharded, the rows
all-gathered, the partial sums reduce-scattered.  B wins when
``T_local,A - T_local,B > T_AG + T_RS`` (the seed's inequality); printed with the measured terms.

    python benchmarks/collective_matmul.py [--nproc 4] [--B 256] [--D 2048] [--F 2048] [--repeats 15]
                                           [--plans] [--d-model 1024] [--d-ff 4096] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--B", type=int, default=256)
    p.add_argument("--D", type=int, default=2048)
    p.add_argument("--F", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--plans", action="store_true", help="also the two-projection plans A and B of seed 001 §3")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--d-ff", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (CPU; default 1: N processes share the cores)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _timed(fn, barrier):
    barrier()
    t0 = time.perf_counter()
    fn()
    barrier()
    return time.perf_counter() - t0


def worker(a):
    import numpy as np
    import torch

    import tensorplay as tp
    import tensorplay.distributed as D
    torch.set_num_threads(a.threads)
    D.init()
    n, r = D.world_size(), D.rank()
    mesh = D.Mesh(np.arange(n), ("Y",))
    barrier = torch.distributed.barrier
    tp.manual_seed(r)
    al, wl = tp.randn(a.B, a.D // n), tp.randn(a.D, a.F // n)
    gathered = {}

    def keep(name, v):          # a part's result, kept for the next part (and returned to shard_map)
        gathered[name] = v
        return v

    def body(fn):
        return D.shard_map(fn, mesh=mesh, in_specs=D.P(), out_specs=D.P())

    variants = {
        "all-gather + matmul": body(lambda x, y: D.all_gather(x, "Y", axis=1, tiled=True) @ y),
        "T_AG (all-gather alone)": body(lambda x, y: keep("g", D.all_gather(x, "Y", axis=1, tiled=True))),
        "T_local (gathered @ w)": body(lambda x, y: gathered["g"] @ y),
        "collective matmul": body(lambda x, y: D.collective_matmul(x, y, "Y")),
    }
    if a.plans:
        x_row = tp.randn(1, a.d_model)
        w1, w2 = tp.randn(a.d_ff, a.d_model), tp.randn(a.d_model, a.d_ff)
        w1s, w2s = tp.randn(a.d_ff // n, a.d_model), tp.randn(a.d_model, a.d_ff // n)
        variants["plan A (own row, full weights)"] = body(lambda x, y: (x_row @ w1.t()) @ w2.t())
        variants["plan B T_AG"] = body(lambda x, y: keep("rows", D.all_gather(x_row, "Y", axis=0, tiled=True)))
        variants["plan B T_local"] = body(lambda x, y: keep("p", (gathered["rows"] @ w1s.t()) @ w2s.t()))
        variants["plan B T_RS"] = body(lambda x, y: D.psum_scatter(gathered["p"], "Y", scatter_dimension=0, tiled=True))
    times = {k: [] for k in variants}
    for _ in range(2):                  # warm-up
        for f in variants.values():
            f(al, wl)
    for _ in range(a.repeats):
        for k, f in variants.items():
            times[k].append(_timed(lambda f=f: f(al, wl), barrier))
    med = {k: statistics.median(v) for k, v in times.items()}
    if r == 0:
        print(f"{n} processes ({'NCCL' if torch.cuda.is_available() else 'gloo, CPU'}), a [{a.B}, {a.D}/{n}], "
              f"w [{a.D}, {a.F}/{n}] float32; medians of {a.repeats} readings, ms")
        for k, v in med.items():
            print(f"  {k:34s} {v * 1e3:9.3f}")
        exposed = med["collective matmul"] - med["T_local (gathered @ w)"]
        print(f"  collective matmul / (all-gather + matmul) = {med['collective matmul'] / med['all-gather + matmul']:.3f}; "
              f"its exposed communication {exposed * 1e3:.3f} ms against T_AG {med['T_AG (all-gather alone)'] * 1e3:.3f} ms")
        if a.plans:
            lhs = med["plan A (own row, full weights)"] - med["plan B T_local"]
            rhs = med["plan B T_AG"] + med["plan B T_RS"]
            print(f"  plans (d_model {a.d_model}, d_ff {a.d_ff}): T_local,A - T_local,B = {lhs * 1e3:.3f} ms vs "
                  f"T_AG + T_RS = {rhs * 1e3:.3f} ms -> plan {'B' if lhs > rhs else 'A'} wins")
    D.shutdown()


def main(argv=None):
    a = _args(argv)
    if a.worker:
        return worker(a)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(here), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "tensorplay.distributed.launch", "--nproc", str(a.nproc), __file__, "--worker"] + \
        [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--worker"]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
