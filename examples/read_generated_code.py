"""Experiment 2 of the chapter: read the code Stax generates (docs/experiments/2-reading-generated-code.md).

Compiles example 1.1, example 7.1, example 7.2 and a function of two matrix products into the
cache folder ``$TP_CACHE_DIR`` (set it to an empty folder first), then for each prints the path of
its wrapper module (``<key[:2]>/<key>/wrapper.py``, the C++ kernels embedded as strings) and its
``call`` function with every line labelled: ``check`` (the specialization's sizes and strides,
``assert_size_stride``), ``alloc`` (``torch.empty_strided``), ``alloc kept`` (a buffer kept from the
last call, ``take``), ``extern`` (an ATen kernel), ``kernel`` (a Stax kernel), ``free`` (``del``
after the last reader), ``keep`` (``stash`` for the next call), ``reuse``.

Part 2 compiles example 7.2 again under ``config.patch({"stax.keep_realized_local": False})`` (the
chapter's CPU materialisation, §6.6) to put the two wrappers side by side.  Part 3 calls example 7.1 on a square
``x`` and on ``x.t()``: two specializations, two wrappers, with different strides in their checks
and different index expressions in their kernels.

    TP_CACHE_DIR=/tmp/tp-exp2 python examples/read_generated_code.py
"""
from __future__ import annotations

import re

import tensorplay as tp
from tensorplay.compiler import config


def ex11(x, w):
    return (tp.relu(x + w) * 2).sum(-1)


def ex71(x):
    return x / x.sum(-1, keepdim=True)


def ex72(x):
    return x.exp().sum(-1), x.exp().amax(-1)


def mine(x, w):
    h = tp.relu(x @ w) * 2          # an extern matmul, then a Stax kernel
    z = h @ w                        # a second matmul reads h
    return z / z.sum(-1, keepdim=True)


_LABELS = [(r"assert_size_stride", "check"), (r"= _empty\(", "alloc"), (r"= take\(", "alloc kept"),
           (r"OPS\[", "extern"), (r"^\s*kernel\d+\(", "kernel"), (r"^\s*del ", "free"),
           (r"stash\(", "keep"), (r"# reuse", "reuse")]


def annotated_call(src: str) -> str:
    body = src[src.index("def call("):]
    out = []
    for line in body.splitlines():
        tag = next((t for pat, t in _LABELS if re.search(pat, line)), "")
        out.append(f"  {tag:>10s} | {line}")
    return "\n".join(out)


def compile_and_show(name, fn, *args):
    cf = tp.compile(fn, strict_native=True)
    cf(*args)
    cf(*args)
    art = cf._cache[-1].artifact
    print(f"== {name}: {art.module.__file__}")
    print(f"   kernels: {art.source.count('async_compile.cpp(')}, buffers in memory: {sorted(art.materialized)}")
    print(annotated_call(art.source))
    return cf


def main():
    print(f"TP_CACHE_DIR = {config.get('stax.cache_dir') or '(unset: the per-user default)'}\n")
    x, w = tp.randn(64, 128), tp.randn(64, 128)
    print("part 1: allocations, kernel calls and frees")
    compile_and_show("example 1.1", ex11, x, w)
    compile_and_show("example 7.1", ex71, x)
    compile_and_show("example 7.2", ex72, x)
    compile_and_show("two matmuls (a function of our own)", mine, tp.randn(128, 64), tp.randn(64, 64))

    print("\npart 2: example 7.2 with the chapter's CPU materialisation (stax.keep_realized_local = False)")
    with config.patch({"stax.keep_realized_local": False}):
        compile_and_show("example 7.2, e in memory", ex72, x)

    print("\npart 3: one square x, called as x and as x.t()")
    sq = tp.randn(256, 256)
    cf = tp.compile(ex71, strict_native=True)
    for arg in (sq, sq.t()):
        cf(arg)
        cf(arg)
    for entry in cf._cache:
        src = entry.artifact.source
        checks = [ln.strip() for ln in src.splitlines() if "assert_size_stride(arg0" in ln]
        # the vector loads of arg0, unrolled copies (xm0_1, rm0_u, ...) folded into one
        loads = sorted({re.sub(r"(\w+?)_(\d+|u)\b", r"\1", m)
                        for m in re.findall(r"::load\(arg0 \+ \((.*)\)\);", src)})
        print(f"== {entry.artifact.module.__file__}")
        print(f"   {checks[0]}")
        print(f"   loads of arg0 at: {loads}")


if __name__ == "__main__":
    main()
