"""Where a GPT training step's device time goes: the kernels of tp.compile's step beside
torch.compile's and torch eager's (seed 001 §1-3: a profile before an optimisation).

Each variant's step (zero_grad, loss, backward, AdamW step; benchmarks/training.py builds the models
from the same weights) runs ``--warmup`` times, then ``--steps`` times under ``torch.profiler`` with
CUDA activity.  Per variant it prints the step's summed kernel time split into classes (attention,
GEMMs, Triton kernels, ATen's own kernels, other), then the ``--top`` kernels by total device time.  A class that
takes more of tp's step than of torch.compile's is where the step loses.  Last, tp.profiler's view
of Stax's own kernels in one step (model bytes and GB/s per kernel, the longest kernels' source).

    python benchmarks/step_profile.py --device cuda [--n-layer 4] [--steps 2] [--top 25]
    python benchmarks/step_profile.py --device cpu --quick     # a smoke test: CPU ops
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

import torch

import tensorplay as tp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import training as T  # noqa: E402  (the GPT workload, its placement and its compile helper)

#: (class, pattern) of kernel names: the first class whose pattern matches a name wins
CLASSES = (("attention", re.compile(r"fmha|flash|attention", re.I)),
           ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas", re.I)),
           ("triton", re.compile(r"^(triton_|kernel\d+)")),          # torch.compile's and Stax's
           ("aten", re.compile(r"at::native|^void at::")),
           ("other", re.compile("")))


def kernel_class(name: str) -> str:
    return next(c for c, pat in CLASSES if pat.search(name))


def profile_step(step, steps, cuda=True):
    from torch.profiler import ProfilerActivity, profile
    T.synchronize("cuda" if cuda else "cpu")
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        T.synchronize("cuda" if cuda else "cpu")
    per = collections.Counter()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for e in prof.events():
        if e.device_type == kind:
            per[e.name] += e.time_range.elapsed_us() / steps
    return per


def report(name, per, top):
    total = sum(per.values())
    by = collections.Counter()
    for k, us in per.items():
        by[kernel_class(k)] += us
    print(f"\n== {name}: {total / 1e3:.2f} ms of kernels per step, {len(per)} distinct kernels; "
          + ", ".join(f"{c} {us / 1e3:.2f} ms" for c, us in by.most_common()))
    for k, us in per.most_common(top):
        print(f"  {us / 1e3:8.3f} ms  {100 * us / total:5.1f}%  {k[:110]}")
    return {"total_ms": total / 1e3, "classes_ms": {c: us / 1e3 for c, us in by.items()}}


def stax_kernels(step, top, source_lines=30):
    """Stax's kernels of one tp step, by device time (tp.profiler: each CUDA kernel bound to the
    Stax kernel that launched it, with its model bytes): time, calls, model bytes, GB/s, the wrapper
    module; then the Triton source of the ``top`` // 3 longest (what to look at first)."""
    from tensorplay.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0, 0])
    for sp in prof.events():
        if sp.cat == "gpu kernel" and "stax_kernel" in sp.args:
            a = agg[(sp.args.get("graph"), sp.args["stax_kernel"])]
            a[0] += sp.dur
            a[1] += sp.args["model_bytes"]
            a[2] += 1
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
    total = sum(v[0] for _, v in rows)
    print(f"\n== Stax kernels of one tp step: {total / 1e6:.2f} ms in {len(rows)} kernels")
    print(f"  {'ms':>7} {'calls':>5} {'model MB':>9} {'GB/s':>7}  wrapper / kernel")
    for (graph, name), (ns, nbytes, calls) in rows[:top]:
        print(f"  {ns / 1e6:7.3f} {calls:5d} {nbytes / 1e6:9.1f} {nbytes / max(ns, 1):7.0f}  {graph} / {name}")
    for (graph, name), _ in rows[:max(top // 3, 1)]:
        fn = getattr(sys.modules.get(graph or ""), "_" + name, None)
        src = getattr(fn, "src", None)
        if src:
            lines = src.splitlines()
            print(f"\n-- {graph} / {name} ({len(lines)} lines):")
            print("\n".join(lines[:source_lines]))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test (CPU ops)")
    p.add_argument("--dtype", default="fp32", choices=sorted(T.DTYPES))
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--quick", action="store_true")
    T.add_size_flags(p)
    a = p.parse_args(argv)
    cfg, B = T.gpt_sizes_of(a)
    table, _ = T.workloads(a.quick, (cfg, B))
    mk_tp, mk_torch, loss_tp, loss_torch, batch = table["gpt"]
    print(T.describe_gpt(cfg, B, a.dtype), "on", T.machine_description(a.device))
    tp.manual_seed(0)
    ref = mk_tp()
    m_tp, m_torch, m_tc = mk_tp(), mk_torch(), mk_torch()
    m_tp.load_state_dict(ref.state_dict())
    T.copy_weights(ref, m_torch)
    T.copy_weights(ref, m_tc)
    for m in (m_tp, m_torch, m_tc):
        T.place(m, a)
    pb = tuple(tp.from_torch(T.place_tensor(t.clone(), a)) for t in batch)
    tb = tuple(T.place_tensor(t.clone(), a) for t in batch)
    cf, note, secs = T.compile_tp(loss_tp, m_tp, pb, device=a.device, strict_first=False)
    print(f"tp.compile{note}: first call + backward {secs:.1f} s")
    tc = torch.compile(lambda x, y: loss_torch(m_tc, x, y))
    steps = {
        "tp.compile" + note: T.train_step(tp.optim.AdamW(m_tp.parameters(), lr=1e-3), cf, pb),
        "torch.compile": T.train_step(torch.optim.AdamW(m_tc.parameters(), lr=1e-3), tc, tb),
        "torch eager": T.train_step(torch.optim.AdamW(m_torch.parameters(), lr=1e-3),
                                    lambda x, y: loss_torch(m_torch, x, y), tb),
    }
    for step in steps.values():
        for _ in range(a.warmup):
            step()
    for name, step in steps.items():
        report(name, profile_step(step, a.steps, a.device == "cuda"), a.top)
    if a.device == "cuda":
        stax_kernels(next(iter(steps.values())), a.top)


if __name__ == "__main__":
    main()
