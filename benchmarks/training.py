"""Training-step benchmark (issue: AOT autograd — joint graphs, partitioning, compiled training).

Workloads: the GPT example (``examples/gpt.py``, default config, batch 16 x 32 tokens), an MLP
(512 -> 1024 -> 1024 -> 10, GELU, batch 256) and a small CNN (``_cnn_layers``: three conv-batchnorm
(training mode)-relu blocks with max pooling, stride-1 average pooling, 2x nearest upsampling and
global average pooling; 32 x 3 x 32 x 32 images), each trained with AdamW on cross-entropy.  One step is
``zero_grad(); loss = loss_fn(x, y); loss.backward(); opt.step()``.

Per workload, four variants are timed interleaved in one run (§13.1; ``compare`` from
``tensorplay.utils.benchmark``): tp eager, tp compiled (``tp.compile(loss_fn, strict_native=True)``:
forward and backward must be Stax kernels), torch eager and ``torch.compile``.  Every variant has
its own copy of the same initial weights and its own optimizer.  The optimizer step is eager in
every variant (§5.6: only the loss function is compiled).

If a training step cannot be compiled with ``strict_native=True`` — an op of its forward or backward
graph has no Stax lowering — the script says which ops block it and times ``strict_native=False``
instead (the row is marked ``(fallback)``): the numbers then include fallback kernels.

Also reported: the bytes saved for backward under each partitioner (``aot.partitioner`` =
``default`` / ``min_cut``, §5.3–5.5) for the GPT block, the whole GPT step and the MLP step — total
and activations only (without the region's inputs, i.e. the parameters and the batch).

Targets (issue): compiled step faster than tp eager, at most 10% slower than torch.compile; min-cut
saves fewer bytes than the default partitioner on the GPT block.

    python benchmarks/training.py [--repeats 15] [--quick] [--no-torch-compile] [--cases gpt,mlp,cnn]
                                  [--bytes-only]

On a loaded machine (more runnable processes than cores) set ``OMP_NUM_THREADS=1`` for every
variant: an OpenMP region's barrier otherwise waits for a descheduled thread — a scheduler time
slice (~20 ms here) per parallel kernel — which swamps kernels of a few microseconds.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.utils.benchmark import compare, format_table, machine_description

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, Block, GPTConfig  # noqa: E402


# ---------------------------------------------------------------------------------------------
# PyTorch mirrors of the tp models (same parameter names, so weights are copied by name)
# ---------------------------------------------------------------------------------------------
class TorchBlock(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        tn = torch.nn
        self.n_head = cfg.n_head
        self.ln_1 = tn.LayerNorm(cfg.n_embd)
        self.attn = tn.Module()
        self.attn.c_attn = tn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.attn.c_proj = tn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = tn.LayerNorm(cfg.n_embd)
        self.mlp = tn.Module()
        self.mlp.c_fc = tn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.mlp.c_proj = tn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        h = torch.nn.functional.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class TorchGPT(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        tn = torch.nn
        self.wte = tn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = tn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = tn.ModuleList([TorchBlock(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = tn.LayerNorm(cfg.n_embd)
        self.lm_head = tn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def tp_mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, d_out))


def torch_mlp(d_in, hidden, d_out):
    tn = torch.nn
    return tn.Sequential(tn.Linear(d_in, hidden), tn.GELU(), tn.Linear(hidden, hidden), tn.GELU(),
                         tn.Linear(hidden, d_out))


def _cnn_layers(L, width, n_classes):
    """conv-bn-relu blocks with max pooling, a stride-1 average pooling, nearest upsampling and
    global average pooling (``L``: tp.nn or torch.nn; same layer order, so the same names)."""
    c1, c2 = width, 2 * width
    return L.Sequential(L.Conv2d(3, c1, 3, padding=1), L.BatchNorm2d(c1), L.ReLU(), L.MaxPool2d(3, 2, 1),
                        L.Conv2d(c1, c2, 3, padding=1), L.BatchNorm2d(c2), L.ReLU(), L.AvgPool2d(3, 1, 1),
                        L.Upsample(scale_factor=2), L.Conv2d(c2, c2, 3, stride=2, padding=1), L.BatchNorm2d(c2),
                        L.ReLU(), L.AdaptiveAvgPool2d(1), L.Flatten(), L.Linear(c2, n_classes))


class WithLoss(nn.Module):
    """``loss(model, x, y)`` as a module, so that ``tp.compile`` sees the model's parameters as the
    compiled module's (free tensors re-read at every call)."""

    def __init__(self, model, loss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x, y):
        return self.loss(self.model, x, y)


def copy_weights(tp_model, torch_model):
    tparams = dict(torch_model.named_parameters())
    names = [n for n, _ in tp_model.named_parameters()]
    if sorted(names) != sorted(tparams):
        raise RuntimeError(f"parameter names differ: {sorted(set(names) ^ set(tparams))}")
    with torch.no_grad():
        for n, p in tp_model.named_parameters():
            tparams[n].copy_(p._data)


# ---------------------------------------------------------------------------------------------
# workloads: name -> (tp model factory, torch model factory, tp loss, torch loss, batch)
# ---------------------------------------------------------------------------------------------
def workloads(quick):
    g = torch.Generator().manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2) if quick else GPTConfig()
    B = 4 if quick else 16
    idx = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    d_in, hidden, n = (64, 128, 32) if quick else (512, 1024, 256)
    xm = torch.randn(n, d_in, generator=g)
    ym = torch.randint(0, 10, (n,), generator=g)
    nc, width = (4, 8) if quick else (32, 32)
    xc = torch.randn(nc, 3, 32, 32, generator=g)
    yc = torch.randint(0, 10, (nc,), generator=g)
    return {
        "gpt": (lambda: GPT(cfg), lambda: TorchGPT(cfg),
                lambda m, x, y: m(x, y)[1], lambda m, x, y: m(x, y), (idx, tgt)),
        "mlp": (lambda: tp_mlp(d_in, hidden, 10), lambda: torch_mlp(d_in, hidden, 10),
                lambda m, x, y: F.cross_entropy(m(x), y),
                lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (xm, ym)),
        "cnn": (lambda: _cnn_layers(nn, width, 10), lambda: _cnn_layers(torch.nn, width, 10),
                lambda m, x, y: F.cross_entropy(m(x), y),
                lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (xc, yc)),
    }, cfg


# ---------------------------------------------------------------------------------------------
# bytes saved for backward under each partitioner
# ---------------------------------------------------------------------------------------------
def saved_bytes(fn, *args):
    """partitioner -> (number of saved values, total bytes, activation bytes)."""
    from tensorplay.compiler.aot import aot_lower
    from tensorplay.compiler.aot.partition import PARTITIONERS
    low = tp.compile(fn, backend="eager").lower(*args)
    out = {}
    for name in PARTITIONERS:
        part = aot_lower(low.graph_module, low.example_inputs, name).partition
        out[name] = (len(part.saved), part.saved_bytes(), part.saved_bytes(include_inputs=False))
    return out


def bytes_table(table, cfg, quick):
    rows = []
    tp.manual_seed(0)
    blk = Block(cfg)
    x = tp.randn(4 if quick else 16, cfg.block_size, cfg.n_embd, requires_grad=True)
    cases = {"GPT block": (blk, (x,))}
    for name, (mk_tp, _, loss_tp, _, batch) in table.items():
        ins = tuple(tp.from_torch(t.clone()) for t in batch)
        cases[f"{name} step"] = (WithLoss(mk_tp(), loss_tp), ins)
    res = {}
    for case, (fn, args) in cases.items():
        r = saved_bytes(fn, *args)
        res[case] = r
        d, mc = r["default"], r["min_cut"]
        rows.append((case, d[0], _kib(d[1]), _kib(d[2]), mc[0], _kib(mc[1]), _kib(mc[2]),
                     f"{mc[2] / d[2]:.2f}" if d[2] else "-"))
    headers = ["region", "default n", "default KiB", "default act. KiB", "min_cut n", "min_cut KiB",
               "min_cut act. KiB", "act. ratio"]
    return format_table(rows, headers), res


def strict_blockers(fn, *args) -> dict:
    """Ops of the min-cut forward / backward graph that Stax cannot lower (they would run as
    fallback kernels and make strict_native=True fail): {"forward": [...], "backward": [...]}."""
    from tensorplay.compiler.aot import aot_lower
    from tensorplay.compiler.aot.function import compact_outputs
    from tensorplay.compiler.backends.stax.lowering import GraphLowering
    from tensorplay.compiler.backends.stax.op_lowerings import V
    low = tp.compile(fn, backend="eager").lower(*args)
    part = aot_lower(low.graph_module, low.example_inputs, "min_cut").partition
    out = {}
    for which, gm in (("forward", part.fw_gm), ("backward", compact_outputs(part.bw_gm)[0])):
        ex = [tp.from_torch(torch.zeros(p.meta["val"].shape, dtype=p.meta["val"].dtype))
              for p in gm.graph.placeholders]
        graph, prev = GraphLowering(gm, ex), V.graph
        V.graph = graph
        try:
            graph.run()
        finally:
            V.graph = prev
        out[which] = sorted({name for name, _ in graph.fallbacks})
    return out


def _kib(b):
    return f"{b / 1024:.1f}"


# ---------------------------------------------------------------------------------------------
# step timing
# ---------------------------------------------------------------------------------------------
def blocking_ops(err: BaseException) -> list:
    """Op names a strict_native failure lists (``  name: no lowering registered``)."""
    return sorted(set(re.findall(r"^\s+([\w.]+): ", str(err), flags=re.M)))


def compile_tp(loss, model, batch, partitioner="min_cut"):
    """tp.compile the loss with strict_native=True; on failure report the blocking ops and compile
    without it.  Returns (compiled fn, note, compile seconds)."""
    from tensorplay.compiler.api import BackendCompilerError
    fn = WithLoss(model, loss)
    for strict in (True, False):
        cf = tp.compile(fn, strict_native=strict, options={"aot.partitioner": partitioner})
        t0 = time.perf_counter()
        try:
            out = cf(*batch)
            out.backward()                      # the backward graph compiles at the first backward()
        except BackendCompilerError as e:
            ops = blocking_ops(e)
            print(f"  strict_native=True failed; ops without a Stax kernel: {', '.join(ops) or str(e)[:300]}")
            continue
        model.zero_grad() if hasattr(model, "zero_grad") else None
        return cf, ("" if strict else " (fallback)"), time.perf_counter() - t0
    raise RuntimeError("unreachable")


def aot_path(cf) -> str:
    """How the compiled loss runs: through AOT (with its saved bytes) or not."""
    try:
        cf = getattr(cf, "_compiled_forward", cf)
        e = cf._cache[0]
        low = e.lowered
        if getattr(low, "is_training", False):
            sv = low.saved_values
            return f"AOT, {len(sv)} saved values, {sum(s.nbytes for s in sv) / 1024:.0f} KiB"
    except Exception:
        pass
    return "not AOT"


def train_step(opt, loss_fn, batch):
    """One optimizer step (tp or torch: the same code): zero_grad, loss, backward, step."""
    def run():
        opt.zero_grad()
        loss = loss_fn(*batch)
        loss.backward()
        opt.step()
        return loss
    return run


def time_workload(name, spec, a):
    mk_tp, mk_torch, loss_tp, loss_torch, batch = spec
    tp.manual_seed(0)
    m_ref = mk_tp()
    models = {}
    compiled = ["tp compiled"] + (["tp compiled [default]"] if a.both_partitioners else [])
    for v in ["tp eager"] + compiled:
        m = mk_tp()
        m.load_state_dict(m_ref.state_dict())
        models[v] = m
    tm = {}
    for v in ("torch eager", "torch.compile"):
        m = mk_torch()
        copy_weights(m_ref, m)
        tm[v] = m
    tbatch = tuple(t.clone() for t in batch)
    pbatch = tuple(tp.from_torch(t.clone()) for t in batch)
    opts = {v: tp.optim.AdamW(m.parameters(), lr=1e-3) for v, m in models.items()}
    topts = {v: torch.optim.AdamW(m.parameters(), lr=1e-3) for v, m in tm.items()}

    variants = {"tp eager": train_step(opts["tp eager"], lambda x, y: loss_tp(models["tp eager"], x, y), pbatch)}
    for v in compiled:
        part = "default" if v.endswith("[default]") else "min_cut"
        cf, note, compile_s = compile_tp(loss_tp, models[v], pbatch, part)
        print(f"  {name}: {v} path: {aot_path(cf)}{note}; first call + backward {compile_s:.1f} s")
        variants[v.replace("tp compiled", "tp compiled" + note)] = train_step(opts[v], cf, pbatch)
    variants["torch eager"] = train_step(topts["torch eager"], lambda x, y: loss_torch(tm["torch eager"], x, y),
                                         tbatch)
    if not a.no_torch_compile:
        torch._dynamo.reset()
        tc = torch.compile(lambda x, y: loss_torch(tm["torch.compile"], x, y))
        t0 = time.perf_counter()
        tc(*tbatch).backward()
        tm["torch.compile"].zero_grad()
        print(f"  {name}: torch.compile first call + backward {time.perf_counter() - t0:.1f} s")
        variants["torch.compile"] = train_step(topts["torch.compile"], tc, tbatch)
    r = compare(variants, repeats=a.repeats, warmup=a.warmup)
    return r, note


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small models (smoke test)")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--cases", default="gpt,mlp,cnn")
    p.add_argument("--bytes-only", action="store_true", help="only the saved-bytes table")
    p.add_argument("--both-partitioners", action="store_true",
                   help="also time tp compiled with aot.partitioner='default'")
    a = p.parse_args(argv)
    table, cfg = workloads(a.quick)
    want = [c.strip() for c in a.cases.split(",") if c.strip()]
    table = {k: v for k, v in table.items() if k in want}
    print(f"machine: {machine_description()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"load average {os.getloadavg()[0]:.1f}")
    if a.quick:
        print("--quick: small models, numbers are a smoke test only")

    print("\nBytes saved for backward per partitioner (act. = without the region's inputs):")
    text, res = bytes_table(table, cfg, a.quick)
    print(text)
    blk = res["GPT block"]
    print(f"target min_cut < default on the GPT block: {blk['min_cut'][1]} B < {blk['default'][1]} B -> "
          f"{'met' if blk['min_cut'][1] < blk['default'][1] else 'NOT met'}")
    print("\nOps without a Stax lowering in the min-cut graphs (they block strict_native=True):")
    for name, (mk_tp, _, loss_tp, _, batch) in table.items():
        tp.manual_seed(0)
        b = strict_blockers(WithLoss(mk_tp(), loss_tp), *(tp.from_torch(t.clone()) for t in batch))
        print(f"  {name}: forward {', '.join(b['forward']) or '-'}; backward {', '.join(b['backward']) or '-'}")
    if a.bytes_only:
        return res, []

    print(f"\nStep times: {a.repeats} interleaved readings after {a.warmup} warm-up steps; ms, median [95% CI]")
    rows = []
    for name, spec in table.items():
        r, note = time_workload(name, spec, a)
        comp = "tp compiled" + note

        def fmt(k):
            s = r[k]
            lo, hi, _ = s.ci
            return f"{s.median * 1e3:.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}] min {s.min * 1e3:.1f}"

        def ratio(k):       # t(k) / t(tp compiled), on medians and on minima
            if k not in r:
                return "-"
            return f"{r[k].median / r[comp].median:.2f} / {r[k].min / r[comp].min:.2f}"
        dflt = comp + " [default]"
        rows.append((name, fmt("tp eager"), fmt(comp), fmt("torch eager"),
                     fmt("torch.compile") if "torch.compile" in r else "-",
                     ratio("tp eager"), ratio("torch eager"), ratio("torch.compile"))
                    + ((fmt(dflt), ratio(dflt)) if a.both_partitioners else ()))
    headers = ["workload", "tp eager", "tp compiled", "torch eager", "torch.compile", "S vs tp eager",
               "vs torch eager", "vs torch.compile"]
    if a.both_partitioners:
        headers += ["tp compiled, default partitioner", "default vs min_cut"]
    print(format_table(rows, headers))
    print("\nS = t(tp eager)/t(tp compiled); 'vs X' = t(X)/t(tp compiled) (> 1: tp compiled is faster), on "
          "medians / on minima. Targets: S > 1 and 'vs torch.compile' >= 0.91.")
    return res, rows


if __name__ == "__main__":
    main()
