"""A GEMM with a fused epilogue on a GPU: Stax's Triton template against cuBLAS, torch eager and
torch.compile (backends/stax/triton/matmul.py; the chapter §9.8, exercise 25 (3)).

``C = gelu(A @ B + bias)``, A ``[M, K]``, B ``[K, N]`` bfloat16, bias ``[N]``, C bfloat16 (default
4096^3).  Every row is timed by ``triton.testing.do_bench`` (CUDA events, the L2 flushed before each
run, the median); the table gives ms, TFLOP/s (2 M N K / t), the time over cuBLAS's bare GEMM and
over torch eager's matmul + bias + GELU, and the largest difference from a float32 reference::

    python benchmarks/matmul_epilogue.py                 # 4096^3; rows with torch.compile too
    python benchmarks/matmul_epilogue.py --size 8192 --no-compile
    python benchmarks/matmul_epilogue.py --no-max-autotune   # skip torch.compile's max-autotune row

Rows: cuBLAS alone (``torch.matmul``); the template with no epilogue (its deficit to cuBLAS, the
``TEMPLATE_DEFICIT`` of the choice rule); torch eager ``gelu(a @ b + bias)`` (three kernels) and
``gelu(addmm(bias, a, b))`` (cuBLASLt's bias epilogue, then GELU); cuBLAS followed by Stax's one
fused epilogue kernel (the extern path); the template with bias + GELU fused at its default config
and at the best of ``candidate_configs``; ``torch.compile`` of the eager function (default mode and
``max-autotune-no-cudagraphs``).  The last lines print what ``matmul.choose`` decides, by the rule
and by measurement.  Without CUDA it says so and exits.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096, help="M = N = K (default 4096)")
    p.add_argument("--m", type=int), p.add_argument("--n", type=int), p.add_argument("--k", type=int)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--no-max-autotune", action="store_true", help="skip torch.compile max-autotune-no-cudagraphs")
    p.add_argument("--rep", type=int, default=200, help="do_bench's rep (ms of timed runs a row)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("matmul_epilogue.py: needs a CUDA device (the template runs on CPU tensors only in Triton's "
              "interpreter, which says nothing about speed); nothing measured")
        return 0

    import torch.nn.functional as F
    from triton.testing import do_bench

    from tensorplay.compiler.backends.stax.triton import matmul as mm

    M, N, K = args.m or args.size, args.n or args.size, args.k or args.size
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=dt, generator=g) / K ** 0.5
    bias = torch.randn(N, device="cuda", dtype=dt, generator=g)
    ref = F.gelu(a.float() @ b.float() + bias.float())
    steps = [mm.bias("bias0"), mm.activation("gelu")]
    fused = mm.MatmulKernel(dt, dt, dt, steps)
    plain = mm.MatmulKernel(dt, dt, dt, [])
    epi = mm.EpilogueKernel(steps, dt)
    out = torch.empty(M, N, device="cuda", dtype=dt)

    def eager(a, b, bias):
        return F.gelu(a @ b + bias)

    def bench(fn):
        fn()
        torch.cuda.synchronize()
        return do_bench(fn, warmup=25, rep=args.rep, return_mode="median")

    rows = []    # (label, ms, max error or None)

    def row(label, fn, check=True):
        t0 = time.perf_counter()
        try:
            ms = bench(fn)
        except Exception as e:  # noqa: BLE001 -- a row that cannot run is reported, not fatal
            print(f"  {label}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
            return None
        err = float((fn().float() - ref).abs().max()) if check else None
        rows.append((label, ms, err))
        print(f"  {label}: {ms:.3f} ms ({time.perf_counter() - t0:.1f} s)", flush=True)
        return ms

    print(f"C = gelu(A @ B + bias), {M} x {N} x {K} bf16 on {torch.cuda.get_device_name()}", flush=True)
    row("cuBLAS alone: torch.matmul", lambda: torch.matmul(a, b), check=False)
    default = mm.default_config(M, N, K, dt)
    row(f"template, no epilogue, default {_short(default)}", lambda: plain(a, b, out=out), check=False)
    row("torch eager: gelu(a @ b + bias)", lambda: eager(a, b, bias))
    row("torch eager: gelu(addmm(bias, a, b))", lambda: F.gelu(torch.addmm(bias, a, b)))
    row("cuBLAS + Stax epilogue kernel (extern path)", lambda: epi(torch.matmul(a, b), bias, out=out))
    row(f"template + bias + gelu, default {_short(default)}", lambda: fused(a, b, bias, out=out))
    best = None
    for c in mm.candidate_configs(M, N, K, dt):
        try:
            ms = bench(lambda c=c: fused(a, b, bias, out=out, config=c))
        except Exception as e:  # noqa: BLE001 -- out of resources: skipped
            print(f"    candidate {_short(c)}: failed ({type(e).__name__})", flush=True)
            continue
        print(f"    candidate {_short(c)}: {ms:.3f} ms", flush=True)
        if best is None or ms < best[0]:
            best = (ms, c)
    if best is not None:
        row(f"template + bias + gelu, best {_short(best[1])}", lambda: fused(a, b, bias, out=out, config=best[1]))
    # tp.compile of the same function: Stax fuses the product and its epilogue into the template
    # (stax.triton.templates 'always') or keeps cuBLAS plus one epilogue kernel ('never'); 'rule' is
    # the default choice
    import tensorplay as tp
    from tensorplay.compiler import config as tp_config
    ta, tb, tbias = (tp.from_torch(t) for t in (a, b, bias))
    for mode in ("always", "never", "rule"):
        with tp_config.patch({"stax.triton.templates": mode}):
            cf = tp.compile(lambda a, b, bias: tp.nn.functional.gelu(a @ b + bias), strict_native=True)
            cf(ta, tb, tbias)
            cf(ta, tb, tbias)
        row(f"tp.compile, templates={mode}", lambda cf=cf: cf(ta, tb, tbias)._data)
    if not args.no_compile:
        from torch import _dynamo
        _dynamo.reset()
        compiled = torch.compile(eager)
        row("torch.compile (default)", lambda: compiled(a, b, bias))
        if not args.no_max_autotune:
            _dynamo.reset()
            compiled_ma = torch.compile(eager, mode="max-autotune-no-cudagraphs")
            row("torch.compile max-autotune-no-cudagraphs", lambda: compiled_ma(a, b, bias))

    t_blas = rows[0][1]
    t_eager = next(ms for label, ms, _ in rows if label.startswith("torch eager: gelu(a @ b"))
    flops = 2 * M * N * K
    w = max(len(r[0]) for r in rows)
    print(f"\n{'':{w}}  {'ms':>8}  {'TFLOP/s':>8}  {'/cuBLAS':>8}  {'/eager':>8}  {'max err':>8}")
    for label, ms, err in rows:
        e = f"{err:.2e}" if err is not None else "-"
        print(f"{label:{w}}  {ms:8.3f}  {flops / ms / 1e9:8.1f}  {ms / t_blas:8.3f}  {ms / t_eager:8.3f}  {e:>8}")
    name = torch.cuda.get_device_name()
    machine = "H200" if "H200" in name else "H100"
    terms = mm.choice_terms(M, N, K, dt, steps, machine=machine)
    print(f"\nchoose (rule, {machine} figures): {terms['choice']}  (tiles {terms['tiles']}, t_saved "
          f"{terms['t_saved'] * 1e6:.1f} us vs {terms['deficit']:.0%} of t_gemm {terms['t_gemm'] * 1e6:.1f} us; "
          f"K <= {terms['k_max']:.0f})")
    tuned = mm.tune(M, N, K, dt, steps, device="cuda",
                    measure=lambda fn: do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3,
                    configs=[best[1]] if best else None)
    ext = next(t for label, _, t in tuned["times"] if label == "extern")
    tem = min(t for label, _, t in tuned["times"] if label == "template")
    print(f"choose (measured): {tuned['choice']}  (template {tem * 1e3:.3f} ms, extern {ext * 1e3:.3f} ms)")
    return 0


def _short(c) -> str:
    return f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} w{c['num_warps']} s{c['num_stages']}"


if __name__ == "__main__":
    sys.exit(main())
