"""Train a small MLP to separate two interleaved spirals (a synthetic 2-class problem).

Shows the whole TensorPlay training loop: a ``TensorDataset`` + shuffling ``DataLoader``, an
``nn.Sequential`` model, ``nn.CrossEntropyLoss``, ``tp.optim.Adam`` and a cosine learning-rate
schedule; prints the loss as it falls and the final accuracy.

    python examples/train_mlp.py            # 1000 steps, a few seconds
    python examples/train_mlp.py --small    # quick run (used by the tests)

``main(argv)`` returns the list of per-step losses.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.utils.data import DataLoader, TensorDataset


def make_spirals(n: int, noise: float = 0.15, seed: int = 0):
    """``n`` points on two spirals (class 0 and 1), each arm turning 1.75 times, with Gaussian noise."""
    rng = np.random.RandomState(seed)
    k = n // 2
    t = np.sqrt(rng.rand(k)) * 3.5 * math.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], 1) / (3.5 * math.pi)
    x = np.concatenate([arm, -arm]) + noise * rng.randn(2 * k, 2) / 3.0
    y = np.concatenate([np.zeros(k), np.ones(k)]).astype(np.int64)
    return tp.from_numpy(x.astype(np.float32)), tp.from_numpy(y)


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(2, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 2),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 1000, --small: 200)")
    p.add_argument("--small", action="store_true", help="small, fast configuration (for tests)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=None)
    args = p.parse_args(argv)
    steps = args.steps or (200 if args.small else 1000)
    samples = args.samples or (512 if args.small else 2000)
    log_every = args.log_every or max(1, steps // 10)

    tp.manual_seed(args.seed)
    x, y = make_spirals(samples, seed=args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True,
                        seed=args.seed)
    model = build_model(args.hidden)
    loss_fn = nn.CrossEntropyLoss()
    opt = tp.optim.Adam(model.parameters(), lr=args.lr)
    sched = tp.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=args.lr / 20)
    print(f"MLP with {sum(q.numel() for q in model.parameters())} parameters, {samples} points, {steps} steps")

    losses, step, t0 = [], 0, time.time()
    model.train()
    while step < steps:
        for xb, yb in loader:
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if step % log_every == 0 or step == 1:
                print(f"step {step:5d} | loss {losses[-1]:.4f} | lr {sched.get_last_lr()[0]:.5f}")
            if step >= steps:
                break

    model.eval()
    with tp.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"done in {time.time() - t0:.1f}s | final loss {sum(losses[-20:]) / len(losses[-20:]):.4f} | "
          f"train accuracy {acc:.3f}")
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
