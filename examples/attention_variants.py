"""Experiment 6 of the chapter: attention variants with ``omni_attention`` (the chapter §9.10;
docs/experiments/6-attention-variants.md).

Part 1 -- sliding-window attention (exercise 37) as a ``mask_mod``; ``BlockMask.sparsity()`` and
the counts of full / partial / empty tiles against the exercise's formula for a window ``w`` that is
a multiple of the block size ``B`` (per block row: ``2w/B - 1`` full tiles around the diagonal and
one partial tile at each edge of the window, the rest empty, fewer at the matrix's borders).

Part 2 -- time and peak memory against N for the op-by-op attention (``softmax(q kᵀ/√d) v``, the
N x N scores materialised), ``F.scaled_dot_product_attention`` (ATen's fused kernel) and
``omni_attention`` (tiles of BLOCK_SIZE query rows merged by the (m, ℓ, a) monoid), all causal.
Peak memory above the inputs: ``torch.cuda.max_memory_allocated`` on a GPU, the profiler's memory
timeline on the CPU (tensorplay.profiler). Theorem 9.2's prediction: the op-by-op peak grows as N²
(the scores, 4 N² bytes per head in float32), the tiled ones as N (output and statistics).

Part 3 -- a ``score_mod`` reading a learnable bias (one per head and relative distance): the
backward reaches the bias (its gradient is checked against the materialised attention's), and the
time with and without the score_mod.

    python examples/attention_variants.py                    # CPU: N = 256 ... 2048
    python examples/attention_variants.py --device cuda      # N = 1024 ... 16384, as the chapter asks
    python examples/attention_variants.py --sizes 512,1024 --heads 4 --dim 64 --repeats 5
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

import torch

import tensorplay as tp
from tensorplay.nn.attention import causal_mask, create_block_mask, omni_attention
from tensorplay.utils.benchmark import compare, machine_description

F = tp.nn.functional


def sliding(w):
    def sliding_window(b, h, q, kv):
        return (q - kv <= w) & (kv - q <= w)
    return sliding_window


def part1(N=4096, B=128, w=512):
    bm = create_block_mask(sliding(w), None, None, N, N, BLOCK_SIZE=B)
    n, r = N // B, w // B
    full = sum(1 for i in range(n) for j in range(n) if abs(i - j) < r)
    partial = sum(1 for i in range(n) for j in range(n) if abs(i - j) == r)
    print(f"Part 1: sliding window w={w}, N={N}, BLOCK_SIZE={B}: {bm}")
    print(f"  counted {bm.counts()}; exercise 37: full={full}, partial={partial}, empty={n * n - full - partial} "
          f"-> sparsity {100 * (n * n - full - partial) / (n * n):.2f}%")
    causal = create_block_mask(causal_mask, None, None, N, N, BLOCK_SIZE=B)
    print(f"  causal mask for comparison: {causal.counts()}, sparsity {causal.sparsity():.2f}%")
    print("  the first rows of the tile grid (█ full, ░ partial):")
    for line in bm.to_string().splitlines()[:6]:
        print("   |" + line[:64] + "|")


def op_by_op(q, k, v):
    L = q.shape[-2]
    s = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(~tp.ones(L, L, dtype=tp.bool, device=q.device).tril(), float("-inf"))
    return F.softmax(s, -1).matmul(v)


@contextlib.contextmanager
def _quiet_fds():
    """Silence the C++ profiler's start/stop lines (written to the process's stdout/stderr)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)


def peak_bytes(fn, device):
    """Peak memory above what was allocated before the call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with _quiet_fds(), tp.profiler.profile(profile_memory=True) as prof:
        fn()
    mt = prof.memory_timeline()
    return mt.peak()[0] - mt.persistent


def part2(sizes, H, D, device, repeats):
    print(f"\nPart 2: causal attention, batch 1, {H} heads, head size {D}, float32, {device}; ms (median) and peak "
          f"MiB above the inputs")
    print(f"{'N':>6} | {'op-by-op ms':>11} {'SDPA ms':>8} {'omni ms':>8} | {'op-by-op MiB':>12} {'SDPA MiB':>8} "
          f"{'omni MiB':>8} | {'4·H·N² MiB':>10}")
    for N in sizes:
        q, k, v = (tp.randn(1, H, N, D, device=device) for _ in range(3))
        bm = create_block_mask(causal_mask, None, None, N, N, device=device)
        fns = {"op": lambda: op_by_op(q, k, v),
               "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               "omni": lambda: omni_attention(q, k, v, block_mask=bm)}
        with tp.no_grad():
            err = (fns["omni"]() - fns["sdpa"]()).abs().max().item()
            res = compare(fns, repeats=repeats, warmup=1, device=device)
            mem = {name: peak_bytes(f, device) / 2 ** 20 for name, f in fns.items()}
        ms = {name: res[name].median * 1e3 for name in fns}
        print(f"{N:>6} | {ms['op']:>11.2f} {ms['sdpa']:>8.2f} {ms['omni']:>8.2f} | {mem['op']:>12.1f} "
              f"{mem['sdpa']:>8.1f} {mem['omni']:>8.1f} | {4 * H * N * N / 2 ** 20:>10.1f}   (omni vs SDPA max "
              f"diff {err:.1e})")


def part3(N, H, D, device, repeats):
    print(f"\nPart 3: a learnable relative-position bias in score_mod (N={N}, {H} heads, head size {D})")
    q, k, v = (tp.randn(1, H, N, D, device=device, requires_grad=True) for _ in range(3))
    bias = tp.zeros(H, 2 * N - 1, device=device, requires_grad=True)
    with tp.no_grad():
        bias.copy_(tp.randn(H, 2 * N - 1, device=device) * 0.1)

    def rel_bias(s, b, h, qi, kv):
        return s + bias[h, qi - kv + (N - 1)]

    bm = create_block_mask(causal_mask, None, None, N, N, device=device)
    out = omni_attention(q, k, v, score_mod=rel_bias, block_mask=bm)
    out.square().sum().backward()
    # the materialised reference for the bias gradient
    tb = bias.detach().torch().clone().requires_grad_()
    i = torch.arange(N, device=tb.device)
    s = q.detach().torch() @ k.detach().torch().transpose(-2, -1) / math.sqrt(D)
    s = s + tb[torch.arange(H, device=tb.device).view(1, H, 1, 1), (i.view(N, 1) - i.view(1, N)) + N - 1]
    s = s.masked_fill(~(i.view(N, 1) >= i.view(1, N)), float("-inf"))
    (torch.softmax(s, -1) @ v.detach().torch()).square().sum().backward()
    err = (bias.grad.torch() - tb.grad).abs().max().item()
    print(f"  d loss / d bias reached the bias: |grad| sum {bias.grad.abs().sum().item():.3f}, max difference from "
          f"the materialised attention's gradient {err:.2e}")

    def step(mod):
        def run():
            for t in (q, k, v, bias):
                t.grad = None
            omni_attention(q, k, v, score_mod=mod, block_mask=bm).square().sum().backward()
        return run
    res = compare({"with score_mod": step(rel_bias), "without": step(None)}, repeats=repeats, warmup=1, device=device)
    a, b = res["with score_mod"].median * 1e3, res["without"].median * 1e3
    print(f"  forward + backward: with score_mod {a:.2f} ms, without {b:.2f} ms ({a / b:.2f}x)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", default=None, help="comma-separated N (default CPU 256..2048, CUDA 1024..16384)")
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else (
        [1024, 2048, 4096, 8192, 16384] if cuda else [256, 512, 1024, 2048])
    H = a.heads or (8 if cuda else 2)
    print(machine_description(device if cuda else None))
    part1()
    part2(sizes, H, a.dim, device, a.repeats)
    part3(1024 if cuda else 256, H, a.dim, device, a.repeats)


if __name__ == "__main__":
    main()
