"""One rank of the 2-process gloo run of test_modules_compat.py's DDP test (started with spawn):
builds a rank-dependent model, wraps it in DistributedDataParallel (which broadcasts rank 0's
weights and buffers), runs a synchronised backward on its half of a fixed batch and a
no_sync + synchronised pair of micro-batches, and saves what it saw to ``OUT/rank<r>.pt``."""
import torch
import torch.distributed as dist

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F


def model(seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    m.register_buffer("marker", tp.full((3,), float(seed)))
    return m


def batch():
    g = torch.Generator().manual_seed(123)
    return tp.from_torch(torch.randn(8, 4, generator=g)), tp.from_torch(torch.randn(8, 2, generator=g))


def grads(m):
    return [p.grad._data.clone() for p in m.parameters()]


def run(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        m = model(seed=10 + rank)
        ddp = nn.parallel.DistributedDataParallel(m)
        rec = {"params": [p._data.clone() for p in m.parameters()], "marker": m.marker._data.clone(),
               "keys": list(ddp.state_dict())}
        x, y = batch()
        xs, ys = x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]
        F.mse_loss(ddp(xs), ys).backward()
        rec["sync"] = grads(m)
        ddp.zero_grad()
        with ddp.no_sync():
            F.mse_loss(ddp(xs[:2]), ys[:2]).backward()
        rec["local_only"] = grads(m)
        F.mse_loss(ddp(xs[2:]), ys[2:]).backward()
        rec["accumulated"] = grads(m)
        torch.save(rec, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
