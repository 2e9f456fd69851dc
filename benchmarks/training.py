"""Training-step benchmark (issue: AOT autograd — joint graphs, partitioning, compiled training).

Workloads: the GPT example (``examples/gpt.py``, default config, batch 16 x 32 tokens), an MLP
(512 -> 1024 -> 1024 -> 10, GELU, batch 256) and a small CNN (``_cnn_layers``: three conv-batchnorm
(training mode)-relu blocks with max pooling, stride-1 average pooling, 2x nearest upsampling and
global average pooling; 32 x 3 x 32 x 32 images) and an LSTM language model (``lstm``: embedding 128, a
2-layer ``nn.LSTM`` of width 256 over 16 tokens, a linear head over a 1000-word vocabulary, batch 16;
``--quick``: 1 layer of width 32 over 6 tokens), each trained with AdamW on cross-entropy.  One step is
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

    python benchmarks/training.py [--repeats 15] [--quick] [--no-torch-compile] [--cases gpt,mlp,cnn,lstm]
                                  [--bytes-only] [--inference]
                                  [--device cpu|cuda] [--dtype fp32|bf16] [--tf32] [--json PATH]
                                  [--n-layer N] [--n-embd D] [--n-head H] [--block-size T] [--batch B] [--vocab V]

**On a GPU** (``--device cuda``; default case ``gpt``) the GPT case runs at GPT-2-small size: 12
layers, d_model 768, 12 heads, T = 1024 tokens, batch 8, vocab 50304 (the size flags above change
each; on the CPU they default to the sizes above, so the CPU run is unchanged), float32 by default
(``--dtype bf16``: parameters, activations and both optimizers in bfloat16 -- tp eager supports it end to
end, and Stax's Triton backend computes bfloat16 in float32 registers, the norms' statistics
included; ``--tf32``: ``torch.set_float32_matmul_precision("high")`` for every variant, whose matmuls
are all ATen's).  Models, optimizer states and batches live on the device; every variant is the
same step as on the CPU, and every reading includes the device's work (``compare(device="cuda")``:
CUDA events on the current stream after a synchronisation).  The compiled region is the model's forward
and the cross-entropy loss (``WithLoss``): its forward graph and, through AOT autograd, its backward
graph are Stax kernels (Triton) plus ATen extern kernels (matmuls, the fused attention forward,
embedding backward); ``opt.zero_grad()``, ``opt.step()`` (tp's AdamW: one tensor at a time; torch's
AdamW: its default, ``foreach`` on CUDA) and the autograd engine's bookkeeping are eager.  The bytes
table and the strict-blocker listing are CPU-only (they lower the models on the CPU); on the device
``compile_tp`` compiles with ``strict_native=False`` at once and lists the ops that fell back to eager
(``fallback_ops``; the row is ``(fallback)`` if there are any).
Targets on the GPU (issue): t(torch.compile) / t(tp compiled) >= 1.0 and t(tp eager) / t(tp compiled)
>= 1.5, read on the paired per-round ratios (``paired_ratio``), printed with their 95% CIs.

**Inference** (``--inference``; on by default with ``--device cuda``, ``--no-inference`` turns it off):
the GPT forward without targets under ``no_grad`` (eval mode), six variants interleaved: tp eager,
``tp.compile(model)``, ``tp.compile(model, mode="reduce-overhead")`` (the wrapper replayed as one CUDA
graph on the GPU; no effect on the CPU), torch eager, ``torch.compile(model)`` and
``torch.compile(model, mode="reduce-overhead")`` (cudagraph trees; ``cudagraph_mark_step_begin()``
before each call), each reported with paired ratios against the tp variant of the same mode.

Run time on the GPU is compilation, above all tp.compile's cold compile of the training step: Stax's
fusion loop (scheduler.fuse, Python on the host) grows super-linearly with the graph.  Measured for
this step on a 2-core Xeon VM (Stax's Triton backend, ``stax.compile_graph`` of the forward and
backward graphs only; 2026-12, a shared machine): 1 / 2 / 4 / 8 layers 0.9 / 3.6 / 24 / 247 s, so
12 layers ~ 15 min by extrapolation (with ``TP_STAX_HORIZONTAL_FUSION=0``: 4 / 8 / 12 layers
2.3 / 28 / 130 s, measured).  At
the default 12 layers a cold run therefore exceeds a 10-minute budget; with ``TP_CACHE_DIR`` filled by
``compile_cold.py --keep-tp-cache DIR`` the graphs come from the cache (the strict check is skipped on
the GPU: ``compile_tp(strict_first=False)``).  ``--n-layer 4`` should keep it near a minute.  The
timed part is short: 4 training variants x (3 + 15) steps of ~0.1-0.3 s at GPT-2 small in float32,
6 inference variants x 18 calls of ~0.05 s; ``--repeats 5 --warmup 2`` or ``--no-inference`` cut it.

On a loaded machine (more runnable processes than cores) set ``OMP_NUM_THREADS=1`` for every
variant: an OpenMP region's barrier otherwise waits for a descheduled thread — a scheduler time
slice (~20 ms here) per parallel kernel — which swamps kernels of a few microseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.utils.benchmark import (compare, format_table, is_cuda, machine_description, paired_ratio,
                                        synchronize)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, Block, GPTConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_cold import SIZE_FLAGS, add_size_flags  # noqa: E402  (the GPT size flags; stdlib only)


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

    def forward(self, idx, targets=None):
        """The loss (as tp's ``GPT(idx, targets)[1]``); without targets the logits."""
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
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


class LSTMLM:
    """The LSTM language model for ``L`` = tp.nn or torch.nn (same attribute names, so the same
    parameter names): embedding -> ``L.LSTM(batch_first=True)`` -> linear head over the vocabulary."""

    @staticmethod
    def make(L, vocab, emb, hidden, layers):
        m = L.Module()
        m.emb, m.lstm, m.head = L.Embedding(vocab, emb), L.LSTM(emb, hidden, layers, batch_first=True), \
            L.Linear(hidden, vocab)
        return m

    @staticmethod
    def loss(cross_entropy):
        def f(m, x, y):
            out, _ = m.lstm(m.emb(x))
            logits = m.head(out)
            return cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return f


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
_D = GPTConfig()
#: the GPT case's sizes per device (and ``--quick``); T = block_size tokens per sequence
GPT_SIZES = {
    "cpu": dict(n_layer=_D.n_layer, n_embd=_D.n_embd, n_head=_D.n_head, block_size=_D.block_size, batch=16,
                vocab=_D.vocab_size),
    "cpu quick": dict(n_layer=1, n_embd=32, n_head=2, block_size=_D.block_size, batch=4, vocab=_D.vocab_size),
    "cuda": dict(n_layer=12, n_embd=768, n_head=12, block_size=1024, batch=8, vocab=50304),   # GPT-2 small
    "cuda quick": dict(n_layer=2, n_embd=256, n_head=4, block_size=256, batch=4, vocab=4096),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gpt_sizes(device="cpu", quick=False, **overrides):
    """(GPTConfig, batch) of the GPT case: ``GPT_SIZES`` of the device, then the given sizes (None:
    the default)."""
    sizes = dict(GPT_SIZES[device + (" quick" if quick else "")])
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    cfg = GPTConfig(vocab_size=sizes["vocab"], block_size=sizes["block_size"], n_layer=sizes["n_layer"],
                    n_head=sizes["n_head"], n_embd=sizes["n_embd"])
    return cfg, sizes["batch"]


def gpt_sizes_of(a):
    """``gpt_sizes`` from parsed arguments (``--device``, ``--quick`` and the size flags)."""
    return gpt_sizes(a.device, a.quick, **{k: getattr(a, k) for k in SIZE_FLAGS})


def describe_gpt(cfg, B, dtype="fp32") -> str:
    return (f"GPT {cfg.n_layer} layers, d_model {cfg.n_embd}, {cfg.n_head} heads, T {cfg.block_size}, batch {B}, "
            f"vocab {cfg.vocab_size}, {dtype}")


def place(m, a):
    """Module ``m`` (tp or torch) on the run's device and dtype (the CPU's float32: untouched)."""
    if a.device != "cpu" or a.dtype != "fp32":
        m.to(device=a.device, dtype=DTYPES[a.dtype])
    return m


def place_tensor(t, a):
    """A batch tensor on the run's device; floating-point ones in the run's dtype."""
    if a.device == "cpu" and a.dtype == "fp32":
        return t
    return t.to(device=a.device, dtype=DTYPES[a.dtype] if t.is_floating_point() else None)


def workloads(quick, gpt=None):
    """name -> (tp model factory, torch model factory, tp loss, torch loss, batch), and the GPT config.
    ``gpt``: (GPTConfig, batch) of the GPT case (default: the CPU's, ``gpt_sizes``)."""
    g = torch.Generator().manual_seed(0)
    cfg, B = gpt if gpt is not None else gpt_sizes("cpu", quick)
    idx = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    tgt = torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=g)
    d_in, hidden, n = (64, 128, 32) if quick else (512, 1024, 256)
    xm = torch.randn(n, d_in, generator=g)
    ym = torch.randint(0, 10, (n,), generator=g)
    nc, width = (4, 8) if quick else (32, 32)
    xc = torch.randn(nc, 3, 32, 32, generator=g)
    yc = torch.randint(0, 10, (nc,), generator=g)
    vocab, emb, hid, layers, T, bl = (50, 16, 32, 1, 6, 4) if quick else (1000, 128, 256, 2, 16, 16)
    xl = torch.randint(0, vocab, (bl, T), generator=g)
    yl = torch.randint(0, vocab, (bl, T), generator=g)
    return {
        "gpt": (lambda: GPT(cfg), lambda: TorchGPT(cfg),
                lambda m, x, y: m(x, y)[1], lambda m, x, y: m(x, y), (idx, tgt)),
        "mlp": (lambda: tp_mlp(d_in, hidden, 10), lambda: torch_mlp(d_in, hidden, 10),
                lambda m, x, y: F.cross_entropy(m(x), y),
                lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (xm, ym)),
        "cnn": (lambda: _cnn_layers(nn, width, 10), lambda: _cnn_layers(torch.nn, width, 10),
                lambda m, x, y: F.cross_entropy(m(x), y),
                lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), (xc, yc)),
        "lstm": (lambda: LSTMLM.make(nn, vocab, emb, hid, layers),
                 lambda: LSTMLM.make(torch.nn, vocab, emb, hid, layers),
                 LSTMLM.loss(F.cross_entropy), LSTMLM.loss(torch.nn.functional.cross_entropy), (xl, yl)),
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


def compile_tp(loss, model, batch, partitioner="min_cut", device=None, strict_first=True):
    """tp.compile the loss with strict_native=True; on failure report the blocking ops and compile
    without it.  Returns (compiled fn, note, compile seconds: the first call and its backward, on a
    CUDA ``device`` until the device is done).

    ``strict_first=False`` (the GPU run) compiles with strict_native=False at once -- the strict check
    lowers and schedules the backward graph once more, outside the graph cache -- and reads the ops
    that fell back from the compiled graphs (``fallback_ops``): note ``(fallback)`` if there are any."""
    from tensorplay.compiler.api import BackendCompilerError
    fn = WithLoss(model, loss)
    for strict in ((True, False) if strict_first else (False,)):
        cf = tp.compile(fn, strict_native=strict, options={"aot.partitioner": partitioner})
        t0 = time.perf_counter()
        try:
            out = cf(*batch)
            out.backward()                      # the backward graph compiles at the first backward()
            synchronize(device)
        except BackendCompilerError as e:
            ops = blocking_ops(e)
            print(f"  strict_native=True failed; ops without a Stax kernel: {', '.join(ops) or str(e)[:300]}")
            continue
        secs = time.perf_counter() - t0
        model.zero_grad() if hasattr(model, "zero_grad") else None
        if strict_first:
            return cf, ("" if strict else " (fallback)"), secs
        fb = fallback_ops(cf)
        if fb is None:
            return cf, " (strict_native=False)", secs
        if fb["forward"] or fb["backward"]:
            print(f"  ops without a Stax kernel (eager fallbacks): forward {', '.join(fb['forward']) or '-'}; "
                  f"backward {', '.join(fb['backward']) or '-'}")
            return cf, " (fallback)", secs
        print("  every op of the forward and backward graphs is a Stax kernel (strict_native=True would hold)")
        return cf, "", secs
    raise RuntimeError("unreachable")


def fallback_ops(cf):
    """{"forward": [...], "backward": [...]}: the op names that run as eager fallbacks in the compiled
    training region's two graphs (Stax's ``run.fallbacks``), or None where they cannot be read (not an
    AOT region, or the backward not compiled yet)."""
    try:
        rt = getattr(cf, "_compiled_forward", cf)._cache[0].artifact.aot
        return {"forward": sorted({n for n, _ in rt.fw.fallbacks}),
                "backward": sorted({n for n, _ in rt._bw.fallbacks})}
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


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


def first_losses(fns: dict) -> str:
    """``name loss`` of each loss callable (tp or torch), called once without backward: a check that
    every variant starts from the same weights and computes the same loss."""
    return ", ".join(f"{k} {float(f().item()):.5f}" for k, f in fns.items())


def time_workload(name, spec, a):
    mk_tp, mk_torch, loss_tp, loss_torch, batch = spec
    tp.manual_seed(0)
    m_ref = mk_tp()
    models = {}
    compiled = ["tp compiled"] + (["tp compiled [default]"] if a.both_partitioners else [])
    for v in ["tp eager"] + compiled:
        m = mk_tp()
        m.load_state_dict(m_ref.state_dict())
        models[v] = place(m, a)              # (weights copied on the CPU, then moved)
    tm = {}
    for v in ("torch eager",) + (() if a.no_torch_compile else ("torch.compile",)):
        m = mk_torch()
        copy_weights(m_ref, m)
        tm[v] = place(m, a)
    del m_ref
    tbatch = tuple(place_tensor(t.clone(), a) for t in batch)
    pbatch = tuple(tp.from_torch(place_tensor(t.clone(), a)) for t in batch)
    opts = {v: tp.optim.AdamW(m.parameters(), lr=1e-3) for v, m in models.items()}
    topts = {v: torch.optim.AdamW(m.parameters(), lr=1e-3) for v, m in tm.items()}

    variants = {"tp eager": train_step(opts["tp eager"], lambda x, y: loss_tp(models["tp eager"], x, y), pbatch)}
    losses = {"tp eager": lambda: loss_tp(models["tp eager"], *pbatch)}
    for v in compiled:
        part = "default" if v.endswith("[default]") else "min_cut"
        cf, note, compile_s = compile_tp(loss_tp, models[v], pbatch, part, device=a.device,
                                         strict_first=not is_cuda(a.device))
        print(f"  {name}: {v} path: {aot_path(cf)}{note}; first call + backward {compile_s:.1f} s")
        variants[v.replace("tp compiled", "tp compiled" + note)] = train_step(opts[v], cf, pbatch)
        losses[v] = (lambda cf: lambda: cf(*pbatch))(cf)
    variants["torch eager"] = train_step(topts["torch eager"], lambda x, y: loss_torch(tm["torch eager"], x, y),
                                         tbatch)
    losses["torch eager"] = lambda: loss_torch(tm["torch eager"], *tbatch)
    if not a.no_torch_compile:
        torch._dynamo.reset()
        tc = torch.compile(lambda x, y: loss_torch(tm["torch.compile"], x, y))
        t0 = time.perf_counter()
        tc(*tbatch).backward()
        synchronize(a.device)
        tm["torch.compile"].zero_grad()
        print(f"  {name}: torch.compile first call + backward {time.perf_counter() - t0:.1f} s")
        variants["torch.compile"] = train_step(topts["torch.compile"], tc, tbatch)
        losses["torch.compile"] = lambda: tc(*tbatch)
    print(f"  {name}: loss at the initial weights: {first_losses(losses)}")
    del losses
    if is_cuda(a.device):
        torch.cuda.reset_peak_memory_stats()
    r = compare(variants, repeats=a.repeats, warmup=a.warmup, device=a.device)
    if is_cuda(a.device):
        peak = torch.cuda.max_memory_allocated() / 2 ** 30
        print(f"  {name}: peak CUDA memory allocated while timing: {peak:.1f} GiB (all variants' models and "
              f"optimizer states included)")
    return r, note


# ---------------------------------------------------------------------------------------------
# inference forward (no grad): default and reduce-overhead modes
# ---------------------------------------------------------------------------------------------
MODES = {"": None, " [reduce-overhead]": "reduce-overhead"}


def cudagraph_counters(cf):
    """The CUDA-graph counters (warmups, captures, replays, direct) of a ``tp.compile(mode=
    "reduce-overhead")`` module's first specialisation, or None (no graph: not CUDA, or not replayed)."""
    try:
        g = getattr(cf, "_compiled_forward", cf)._cache[0].artifact.cudagraph
        return dict(g.counters)
    except (AttributeError, IndexError, KeyError, TypeError):
        return None


def time_inference(cfg, idx, a):
    """The GPT forward without targets under no_grad, in eval mode, six variants interleaved (see the
    module docstring).  Returns the ``compare`` result."""
    import warnings
    tp.manual_seed(0)
    m = GPT(cfg)
    torch_names = ["torch eager"] + ([] if a.no_torch_compile else [f"torch.compile{s}" for s in MODES])
    tms = {}
    for v in torch_names:
        t = TorchGPT(cfg)
        copy_weights(m, t)
        tms[v] = place(t.eval(), a)
    place(m.eval(), a)
    x = tp.from_torch(place_tensor(idx.clone(), a))
    tx = place_tensor(idx.clone(), a)

    def tp_fwd(f):
        def run():
            with tp.no_grad():
                return f(x)[0]
        return run

    def torch_fwd(f, mark=False):
        def run():
            with torch.no_grad():
                if mark:            # a new step of cudagraph trees: the last step's outputs are dead
                    torch.compiler.cudagraph_mark_step_begin()
                return f(tx)
        return run

    with tp.no_grad():
        ref = m(x)[0]._data.float()
    scale = float(ref.abs().max())

    def check(name, f, compiled):
        """First call (compile: its seconds until the device is done), two more (a CUDA-graph
        capture and a replay), then the largest difference of the last one's logits from tp eager's."""
        t0 = time.perf_counter()
        f()
        synchronize(a.device)
        first = time.perf_counter() - t0
        f()
        out = f()
        d = out._data if isinstance(out, tp.Tensor) else out
        err = float((d.float() - ref).abs().max())
        print(f"  {name}: " + (f"first call {first:.1f} s; " if compiled else "")
              + f"max |logits - tp eager| = {err:.2e} (max |logits| {scale:.2f})")
        del out, d

    variants = {"tp eager": tp_fwd(m)}
    cfs = {}
    for suffix, mode in MODES.items():
        with warnings.catch_warnings():     # (reduce-overhead on the CPU: "no effect on CPU yet")
            warnings.simplefilter("ignore", UserWarning)
            cfs[suffix] = cf = tp.compile(m, mode=mode)
        variants[f"tp.compile{suffix}"] = tp_fwd(cf)
        check(f"tp.compile{suffix}", variants[f"tp.compile{suffix}"], True)
    variants["torch eager"] = torch_fwd(tms["torch eager"])
    check("torch eager", variants["torch eager"], False)
    if not a.no_torch_compile:
        torch._dynamo.reset()
        for suffix, mode in MODES.items():
            tc = torch.compile(tms[f"torch.compile{suffix}"], mode=mode)
            variants[f"torch.compile{suffix}"] = torch_fwd(tc, mark=mode == "reduce-overhead")
            check(f"torch.compile{suffix}", variants[f"torch.compile{suffix}"], True)
    r = compare(variants, repeats=a.repeats, warmup=a.warmup, device=a.device)
    c = cudagraph_counters(cfs[" [reduce-overhead]"])
    print("  tp.compile [reduce-overhead]: " + (f"CUDA graph counters {c}" if c else
                                                "no CUDA graph (runs as mode='default' here)"))
    return r


def inference_report(r):
    """The inference table (one row per variant) and the paired ratios against tp compiled."""
    rows = [(k, s.ms(), f"{s.min * 1e3:.2f}") for k, s in r.items()]
    lines = [format_table(rows, ["variant", "ms, median [95% CI]", "min"]),
             "paired per-round ratios t(X) / t(tp.compile of the same mode), median [95% CI] (> 1: tp is faster):"]
    ratios = {}
    for suffix in MODES:
        base = f"tp.compile{suffix}"
        for k in ("tp eager", "torch eager", f"torch.compile{suffix}"):
            if k in r:
                m, lo, hi = paired_ratio(r, k, base)
                ratios[f"{k} / {base}"] = [m, lo, hi]
                lines.append(f"  t({k}) / t({base}) = {m:.2f} [{lo:.2f}, {hi:.2f}]")
    if "torch eager" in r:
        m, lo, hi = paired_ratio(r, "tp eager", "torch eager")
        ratios["tp eager / torch eager"] = [m, lo, hi]
        lines.append(f"  t(tp eager) / t(torch eager) = {m:.2f} [{lo:.2f}, {hi:.2f}]")
    return "\n".join(lines), ratios


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small models (smoke test)")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--cases", default=None, help="comma-separated of gpt, mlp, cnn, lstm (default: all on the CPU, "
                                                 "gpt on cuda; 'none': no training step)")
    p.add_argument("--bytes-only", action="store_true", help="only the saved-bytes table (CPU)")
    p.add_argument("--both-partitioners", action="store_true",
                   help="also time tp compiled with aot.partitioner='default'")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where models, optimizer states and batches live (cuda: GPT-2-small sizes, CUDA-event "
                        "timing, the inference forward too)")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES),
                   help="parameters, activations and optimizer states (bf16: the compiled step falls back for "
                        "layer_norm)")
    p.add_argument("--tf32", action="store_true",
                   help="torch.set_float32_matmul_precision('high') (TF32 matmuls, every variant; for cuda)")
    p.add_argument("--inference", action="store_true", default=None,
                   help="also time the GPT inference forward (default: on with --device cuda)")
    p.add_argument("--no-inference", dest="inference", action="store_false")
    p.add_argument("--json", default=None, help="write the readings and ratios here")
    add_size_flags(p)
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False")
    if cuda and a.bytes_only:
        p.error("--bytes-only lowers the models on the CPU: not with --device cuda")
    if a.cases is None:
        a.cases = "gpt" if cuda else "gpt,mlp,cnn,lstm"
    if a.inference is None:
        a.inference = cuda
    if a.tf32:
        torch.set_float32_matmul_precision("high")
    gpt = gpt_sizes_of(a)
    table, cfg = workloads(a.quick, gpt)
    want = [c.strip() for c in a.cases.split(",") if c.strip()]
    table = {k: v for k, v in table.items() if k in want}
    print(f"machine: {machine_description(a.device)}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"load average {os.getloadavg()[0]:.1f}")
    if a.quick:
        print("--quick: small models, numbers are a smoke test only")
    print(f"{describe_gpt(cfg, gpt[1], a.dtype)} on {a.device}"
          + (f"; float32 matmul precision {torch.get_float32_matmul_precision()!r}" if cuda else ""))
    doc = {"machine": machine_description(a.device), "args": vars(a), "gpt": describe_gpt(cfg, gpt[1], a.dtype),
           "training": {}, "inference": None}

    res = None
    if not cuda:
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

    rows = []
    if table:
        print(f"\nStep times: {a.repeats} interleaved readings after {a.warmup} warm-up steps; ms, median [95% CI]"
              + ("; each reading CUDA events around one step, after a synchronisation" if cuda else ""))
        if cuda:
            print("tp compiled = tp.compile(WithLoss(model, loss), strict_native=False): the forward + cross-entropy "
                  "and, through AOT, its backward are compiled; zero_grad, AdamW's step (tp: per tensor; torch: "
                  "foreach) and autograd's bookkeeping are eager in every variant")
        paired = []
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
            pr = {k: paired_ratio(r, k, comp) for k in ("tp eager", "torch eager", "torch.compile") if k in r}
            paired.append((name, comp, pr))
            doc["training"][name] = {"compiled": comp, "readings_ms": {k: s.as_dict() for k, s in r.items()},
                                     "paired": {f"{k} / {comp}": list(v) for k, v in pr.items()}}
        headers = ["workload", "tp eager", "tp compiled", "torch eager", "torch.compile", "S vs tp eager",
                   "vs torch eager", "vs torch.compile"]
        if a.both_partitioners:
            headers += ["tp compiled, default partitioner", "default vs min_cut"]
        print(format_table(rows, headers))
        print("\nS = t(tp eager)/t(tp compiled); 'vs X' = t(X)/t(tp compiled) (> 1: tp compiled is faster), on "
              "medians / on minima. Targets: S > 1 and 'vs torch.compile' >= 0.91.")
        print("Paired per-round ratios t(X) / t(tp compiled), median [95% CI]:")
        for name, comp, pr in paired:
            print(f"  {name}: " + "; ".join(f"{k} {m:.2f} [{lo:.2f}, {hi:.2f}]" for k, (m, lo, hi) in pr.items()))
            if cuda:
                for k, want_r in (("torch.compile", 1.0), ("tp eager", 1.5)):
                    if k in pr:
                        m = pr[k][0]
                        print(f"  {name}: target (GPU) t({k}) / t({comp}) >= {want_r}: {m:.2f} -> "
                              f"{'met' if m >= want_r else 'NOT met'}")

    if a.inference:
        if cuda:            # the training variants' models, optimizer states and graphs: gone first
            import gc
            gc.collect()
            torch.cuda.empty_cache()
        cfg_i, B = gpt
        print(f"\nInference forward (no grad, eval mode; {describe_gpt(cfg_i, B, a.dtype)}): {a.repeats} interleaved "
              f"readings after {a.warmup} warm-up calls; ms")
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, cfg_i.vocab_size, (B, cfg_i.block_size), generator=g)
        r = time_inference(cfg_i, idx, a)
        text, ratios = inference_report(r)
        print(text)
        doc["inference"] = {"readings_ms": {k: s.as_dict() for k, s in r.items()}, "paired": ratios}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"\nwrote {a.json}")
    return res, rows


if __name__ == "__main__":
    main()
