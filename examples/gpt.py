"""A small GPT (decoder-only Transformer) trained with AdamW on random tokens — the README demo.

The tokens come from a random first-order Markov chain: token ``a`` is followed by ``succ[a]`` (a
fixed random permutation) with probability ``p_follow`` and by a uniformly random token otherwise.
So the data are random, but the next token is predictable from the current one: the loss starts
near ``ln(vocab)`` (uniform guessing) and falls towards the chain's entropy rate, which is printed
as the floor.

Model (GPT-2 layout): token + learned position embeddings; ``n_layer`` pre-norm blocks of causal
self-attention (``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP, each with a
residual connection; a final LayerNorm; an LM head whose weight *is* the token-embedding weight
(weight tying: one Parameter registered in two modules, counted once).

    python examples/gpt.py            # default: finishes in well under a minute on 2 CPU cores
    python examples/gpt.py --small    # tiny and quick (used by the tests)

``main(argv)`` returns the list of per-step losses.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)   # q, k, v projections in one matmul
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.reshape(B, T, H, C // H).transpose(1, 2)        # (B, H, T, D)
        k = k.reshape(B, T, H, C // H).transpose(1, 2)
        v = v.reshape(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight               # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():             # GPT-2: scale residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"GPT: sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = tp.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    @tp.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.cfg.block_size:])
            probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
            idx = tp.cat([idx, tp.multinomial(probs, 1)], 1)
        return idx


class MarkovTokens:
    """Random first-order Markov chain over ``vocab`` tokens (see the module docstring), drawn with
    numpy's generator so the data stream does not depend on the model's random draws."""

    def __init__(self, vocab: int, p_follow: float, seed: int):
        self.rng = np.random.RandomState(seed)
        self.succ = self.rng.permutation(vocab)
        self.vocab, self.p = vocab, p_follow

    def entropy_rate(self) -> float:
        """Nats per token of the chain: the best achievable loss."""
        p, v = self.p, self.vocab
        q_succ = p + (1 - p) / v
        q_other = (1 - p) / v
        return -(q_succ * math.log(q_succ) + (v - 1) * q_other * math.log(q_other))

    def batch(self, batch_size: int, length: int):
        """``(x, y)``, each ``(batch_size, length)`` int64: inputs and next tokens."""
        seq = np.empty((batch_size, length + 1), dtype=np.int64)
        seq[:, 0] = self.rng.randint(self.vocab, size=batch_size)
        follow = self.rng.rand(batch_size, length) < self.p
        rand = self.rng.randint(self.vocab, size=(batch_size, length))
        for t in range(length):
            seq[:, t + 1] = np.where(follow[:, t], self.succ[seq[:, t]], rand[:, t])
        return tp.tensor(seq[:, :-1]), tp.tensor(seq[:, 1:])


def main(argv=None):
    p = argparse.ArgumentParser(description="Train a small GPT on random Markov-chain tokens")
    p.add_argument("--small", action="store_true", help="tiny, quick configuration (for tests)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 100, --small: 40)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-every", type=int, default=None)
    args = p.parse_args(argv)
    if args.small:
        cfg = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=32)
        steps = args.steps or 40
    else:
        cfg = GPTConfig()
        steps = args.steps or 100
    log_every = args.log_every or max(1, steps // 10)

    tp.manual_seed(args.seed)
    data = MarkovTokens(cfg.vocab_size, p_follow=0.8, seed=args.seed)
    model = GPT(cfg).to(args.device)
    n_params = sum(q.numel() for q in model.parameters())
    print(f"GPT: {cfg.n_layer} layers, {cfg.n_head} heads, d={cfg.n_embd}, vocab {cfg.vocab_size}, "
          f"context {cfg.block_size}: {n_params} parameters (LM head tied to the token embedding)")
    print(f"loss at start ~ ln(vocab) = {math.log(cfg.vocab_size):.3f}; floor (entropy rate of the data) = "
          f"{data.entropy_rate():.3f}")

    decay = [q for n, q in model.named_parameters() if q.dim() >= 2]
    no_decay = [q for n, q in model.named_parameters() if q.dim() < 2]
    opt = tp.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                         lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 10)
    sched = tp.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))

    losses, t0 = [], time.time()
    model.train()
    for step in range(1, steps + 1):
        x, y = data.batch(args.batch_size, cfg.block_size)
        x, y = x.to(args.device), y.to(args.device)
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == 1:
            print(f"step {step:4d} | loss {losses[-1]:.4f} | lr {sched.get_last_lr()[0]:.2e} | "
                  f"{time.time() - t0:.1f}s")
    model.eval()
    sample = model.generate(x[:1, :4], max_new_tokens=12)
    print("sample continuation:", sample[0].tolist())
    # compiled inference: Stax fuses the LayerNorm / GELU / residual / softmax work into C++
    # kernels (matmuls and attention stay ATen extern kernels); the logits must match eager
    if args.device == "cpu":
        with tp.no_grad():
            compiled = tp.compile(model)
            ref, _ = model(x)
            compiled(x)                              # capture + compile
            t1 = time.time()
            logits, _ = compiled(x)
            err = (logits - ref).abs().max().item()
        print(f"compiled inference: max |compiled - eager| = {err:.2e} ({(time.time() - t1) * 1e3:.1f} ms per call)")
    print(f"done in {time.time() - t0:.1f}s | loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
