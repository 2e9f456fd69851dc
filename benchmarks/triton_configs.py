"""Launch-configuration sweep of Stax's Triton kernels on a GPU (the data behind the
heuristics of backends/stax/triton/plan.py).

For a few cases of table 13 it forces each (XBLOCK, RBLOCK, num_warps) of a small grid on the
one kernel of the case (plan.plan_triton patched, the compiled-graph cache off), times the compiled
function with ``triton.testing.do_bench`` (CUDA events, median) and prints GB/s of the model bytes::

    python benchmarks/triton_configs.py            # on a CUDA machine
"""
from __future__ import annotations

import dataclasses
import os

import torch

os.environ.setdefault("TP_GRAPH_CACHE", "0")

import tensorplay as tp  # noqa: E402
import tensorplay.nn.functional as F  # noqa: E402
from tensorplay.compiler.api import reset  # noqa: E402
from tensorplay.compiler.backends.stax.triton import plan as tplan  # noqa: E402

R, C = 32768, 2048
CASES = {
    "x + 1": (lambda x: x + 1, 2),
    "row sum": (lambda x: x.sum(-1), 1),
    "ex1.1": (lambda x: (F.relu(x + 1) * 2).sum(-1), 1),
    "LayerNorm -> GELU": (lambda x: F.gelu(F.layer_norm(x, (C,))) * 0.5, 2),
    "softmax": (lambda x: F.softmax(x, -1), 2),
}
GRID = [dict(XBLOCK=x, num_warps=w) for x in (1, 2, 4) for w in (4, 8, 16)]
PW_GRID = [dict(XBLOCK=x, num_warps=w) for x in (512, 1024, 2048, 4096) for w in (2, 4, 8)]


def main(argv=None):
    import argparse
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("triton_configs.py: needs a CUDA device")
    from triton.testing import do_bench
    x = tp.from_torch(torch.randn(R, C, device="cuda"))
    orig = tplan.plan_triton
    for name, (f, passes) in CASES.items():
        rows = []
        base = orig
        for cfg in (PW_GRID if name == "x + 1" else GRID):
            def forced(plan, cfg=cfg):
                p = base(plan)
                return dataclasses.replace(p, **cfg)
            tplan.plan_triton = forced
            reset()
            try:
                cf = tp.compile(f, strict_native=True)
                with tp.no_grad():
                    cf(x)
                    ms = do_bench(lambda: cf(x), warmup=10, rep=50)
                rows.append((ms, cfg))
            except Exception as e:  # noqa: BLE001
                rows.append((float("inf"), {**cfg, "error": type(e).__name__}))
            finally:
                tplan.plan_triton = orig
        reset()
        cf = tp.compile(f, strict_native=True)
        with tp.no_grad():
            cf(x)
            ms0 = do_bench(lambda: cf(x), warmup=10, rep=50)
        nbytes = passes * R * C * 4
        print(f"\n{name}: heuristic {ms0 * 1e3:.1f} us ({nbytes / ms0 / 1e6:.0f} GB/s)")
        for ms, cfg in sorted(rows, key=lambda r: r[0])[:6]:
            print(f"  {cfg}: {ms * 1e3:.1f} us ({nbytes / ms / 1e6:.0f} GB/s)")


if __name__ == "__main__":
    main()
