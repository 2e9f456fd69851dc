"""Experiment 4 of the chapter: change the fusion score, switch horizontal fusion off
(docs/experiments/4-fusion-scoring.md).

Part 1 -- a choice between two legal fusions.  In

    b = v.sum(-1)                  # v: (R, C, K) -> rows (R, C) x inner K
    a = x.sum(-1, keepdim=True)    # x: (R, C)    -> rows R x inner C
    out = b + a                    # (R, C)

``out`` can join b's kernel (as a value per row of (R, C), after b's reduction) or a's kernel (one
value per element of a's rows), not both: the two reductions have different iteration spaces
(Def. 7.2).  Algorithm 7.1 takes the legal pair with the best ``choices.score_fusion``.  The
default score is (shared bytes, -distance): out+b shares the R*C*4 bytes of b, out+a the R*4 of a,
so out joins b and b never reaches memory.  Reversing the tuple (distance first) picks the nearer
pair, out+a, and b's R*C floats are written and read back.  The script compiles ``f`` both ways
(the replaced ``score_fusion`` is part of the compiled-graph key: docs/cache.md), prints each
schedule -- groups, which values stay local, the modelled peak of live bytes (§7.5) and the bytes
written and read back -- and times the two interleaved.

Part 2 -- example 7.2, ``(x.exp().sum(-1), x.exp().amax(-1))``, with horizontal fusion (the knob
``stax.horizontal_fusion``) on and off, under the default materialisation (``e`` in registers) and
under the chapter's CPU model (``stax.keep_realized_local`` False: ``e`` written to memory, §6.6),
each set with ``config.patch`` (tensorplay/compiler/config.py).

    python examples/fusion_scoring.py [--rows 256 --cols 512 --k 16] [--x-rows 8192 --x-cols 2048] [--repeats 11]
"""
from __future__ import annotations

import argparse

import torch

import tensorplay as tp
from tensorplay.compiler import config
from tensorplay.compiler.backends.stax import choices, compile_graph
from tensorplay.utils.benchmark import compare, machine_description, paired_ratio


def f(x, v):
    b = v.sum(-1)
    a = x.sum(-1, keepdim=True)
    return b + a


def ex72(x):
    return x.exp().sum(-1), x.exp().amax(-1)


def distance_first(sched, g1, g2):
    """The default score with its two keys swapped: nearest pair first, bytes only break ties."""
    shared, neg_distance = _DEFAULT_SCORE(sched, g1, g2)
    return (neg_distance, shared)


_DEFAULT_SCORE = choices.score_fusion


def schedule_summary(fn, *args):
    """Lower ``fn`` on ``args`` and run Stax's pipeline once more (no C++ build) to read its schedule:
    (text, modelled peak bytes, bytes written and read back)."""
    low = tp.compile(fn).lower(*args)
    _, graph, sched, materialized = compile_graph(low.graph_module, low.example_inputs)
    outs = {getattr(o, "name", None) for o in graph.outputs}
    inter = sum(2 * b.layout.numel * b.layout.dtype.itemsize for b in graph.buffers
                if b.name in materialized and b.name not in outs)
    lines = []
    for i, g in enumerate(g for g in sched.groups if not g.is_extern):
        local = sched.local_buffers(g)
        sig = sched.kernel_sig(g)
        nodes = ", ".join(f"{n.name} {'local' if n.name in local else 'memory'}" for n in g.nodes)
        lines.append(f"    kernel{i}: rows {list(sig[0])} x inner {list(sig[1])}: {nodes}")
    return "\n".join(lines), sched.peak_bytes(), inter


def compiled(fn, *args):
    cf = tp.compile(fn, strict_native=True)
    cf(*args)                         # the capture run
    return cf


def kernel_count(cf):
    return cf._cache[0].artifact.source.count("async_compile.cpp(")


def part1(a):
    torch.manual_seed(0)
    x, v = tp.randn(a.rows, a.cols), tp.randn(a.rows, a.cols, a.k)
    ref = v._data.sum(-1) + x._data.sum(-1, keepdim=True)
    fns = {}
    for name, score in (("bytes first (default)", _DEFAULT_SCORE), ("distance first", distance_first)):
        choices.score_fusion = score
        try:
            text, peak, inter = schedule_summary(f, x, v)
            cf = compiled(f, x, v)
        finally:
            choices.score_fusion = _DEFAULT_SCORE
        torch.testing.assert_close(cf(x, v)._data, ref, rtol=1e-5, atol=1e-4)   # sums reassociated (§6.5)
        print(f"  {name}: {kernel_count(cf)} kernels, modelled peak {peak} bytes, written and read back {inter} bytes")
        print(text)
        fns[name] = cf
    r = compare({k: (lambda c=c: c(x, v)) for k, c in fns.items()}, repeats=a.repeats, warmup=2)
    m, lo, hi = paired_ratio(r, "distance first", "bytes first (default)")
    for k, s in r.items():
        print(f"  {k:22s} {s.ms()} ms")
    print(f"  t(distance first) / t(bytes first) = {m:.2f} [{lo:.2f}, {hi:.2f}]")


def part2(a):
    torch.manual_seed(0)
    x = tp.randn(a.x_rows, a.x_cols)
    ref = (x._data.exp().sum(-1), x._data.exp().amax(-1))
    fns = {}
    for keep in (True, False):
        for horizontal in (True, False):
            with config.patch({"stax.keep_realized_local": keep, "stax.horizontal_fusion": horizontal}):
                cf = compiled(ex72, x)
            out = cf(x)
            torch.testing.assert_close(out[0]._data, ref[0], rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(out[1]._data, ref[1])
            name = f"{'e in registers' if keep else 'e in memory'}, horizontal {'on' if horizontal else 'off'}"
            art = cf._cache[0].artifact
            print(f"  {name:34s} {kernel_count(cf)} kernel(s), written and read back {art.intermediate_bytes} bytes")
            fns[name] = cf
    r = compare({k: (lambda c=c: c(x)) for k, c in fns.items()}, repeats=a.repeats, warmup=2)
    base = "e in registers, horizontal on"
    for k, s in r.items():
        m, lo, hi = paired_ratio(r, k, base)
        print(f"  {k:34s} {s.ms()} ms   t / t(default) = {m:.2f} [{lo:.2f}, {hi:.2f}]")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--cols", type=int, default=512)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--x-rows", type=int, default=8192)
    p.add_argument("--x-cols", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--part", type=int, choices=(1, 2), default=None, help="run one part only")
    a = p.parse_args(argv)
    print(f"machine: {machine_description()}; ms, median [95% CI] of shuffled interleaved rounds")
    if a.part in (None, 1):
        print(f"part 1: b = v.sum(-1), a = x.sum(-1, keepdim=True), b + a; x ({a.rows}, {a.cols}), "
              f"v ({a.rows}, {a.cols}, {a.k})")
        part1(a)
    if a.part in (None, 2):
        print(f"part 2: example 7.2 on ({a.x_rows}, {a.x_cols}) float32")
        part2(a)


if __name__ == "__main__":
    main()
