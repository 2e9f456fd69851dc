"""``torch.compile(model, backend=tensorplay.compiler.torch_backend)``: a small GPT and two CNNs
written in torch give torch eager's outputs (and gradients), with their graphs compiled by Stax,
and the report says what ran where."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tensorplay.compiler import torch_backend as tb


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.h, d // self.h).transpose(1, 2)
        k = k.view(b, t, self.h, d // self.h).transpose(1, 2)
        v = v.view(b, t, self.h, d // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=31, d=32, h=4, layers=2, block=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 6, 3), nn.Conv2d(6, 8, 3)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 5 * 5, 10)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return F.log_softmax(self.fc(self.drop(torch.flatten(x, 1))), dim=1)


class ResBlock(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1, self.b2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.down = nn.Conv2d(c, 2 * c, 1, stride=2)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        y = F.relu(y + x)
        return F.adaptive_avg_pool2d(self.down(y), 1).flatten(1)


def _clone(model):
    other = type(model)()
    other.load_state_dict(model.state_dict())
    return other


def _close(a, b, n):
    """Tolerance of a float32 result reassociated over ~n terms (§5's error model, blocked sums)."""
    torch.testing.assert_close(a, b, rtol=4 * math.sqrt(n) * 2 ** -24 * 8, atol=1e-5 * math.sqrt(n))


def _segments_on_stax(rec):
    return [s for s in rec["segments"] if s["status"] == "compiled by Stax"]


def _gpt_pair(layers):
    torch.manual_seed(0)
    ref = GPT(layers=layers)
    mine = GPT(layers=layers)
    mine.load_state_dict(ref.state_dict())
    return ref, mine, torch.randint(0, 31, (2, 16)), torch.randint(0, 31, (2, 16))


def test_gpt_inference_matches_torch():
    ref, mine, idx, tgt = _gpt_pair(layers=1)
    tb.reset_report()
    cm = torch.compile(mine, backend=tb.torch_backend)
    with torch.no_grad():
        want_logits, want_loss = ref(idx, tgt)
        cm(idx, tgt)                               # capture run
        logits, loss = cm(idx, tgt)                # the judged call
    _close(logits, want_logits, 128)
    _close(loss, want_loss, 128)
    recs = tb.reports()
    assert recs and all(_segments_on_stax(r) for r in recs)
    text = tb.report()
    assert "compiled by Stax" in text and "linear" in text and "softmax" in text


@pytest.mark.slow
def test_gpt_training_gradients_match_torch():
    ref, mine, idx, tgt = _gpt_pair(layers=2)
    tb.reset_report()
    cm = torch.compile(mine, backend=tb.torch_backend)
    with torch.no_grad():
        want_loss = ref(idx, tgt)[1]
    for _ in range(2):                             # the second call is the compiled training region
        for p in list(ref.parameters()) + list(mine.parameters()):
            p.grad = None
        ref(idx, tgt)[1].backward()
        loss = cm(idx, tgt)[1]
        loss.backward()
    _close(loss.detach(), want_loss, 128)
    for (name, p), q in zip(ref.named_parameters(), mine.parameters()):
        assert q.grad is not None, name
        _close(q.grad, p.grad, 512)
    assert all(_segments_on_stax(r) for r in tb.reports())


@pytest.mark.parametrize("cls,shape", [(SmallCNN, (3, 1, 14, 14)), (ResBlock, (2, 8, 8, 8))])
def test_cnns_match_torch_eager(cls, shape):
    torch.manual_seed(1)
    ref = cls().eval()
    mine = _clone(ref).eval()
    x = torch.randn(*shape)
    tb.reset_report()
    cm = torch.compile(mine, backend=tb.torch_backend)
    with torch.no_grad():
        want = ref(x)
        cm(x)
        got = cm(x)
    _close(got, want, 72)
    rec = tb.reports()[-1]
    assert _segments_on_stax(rec), tb.report()
    ops = set().union(*(s["tp_ops"] for s in rec["segments"]))
    assert "conv2d" in ops
    assert rec["torch_fallback"] == []


@pytest.mark.slow
def test_resblock_training_updates_batchnorm_and_gradients():
    torch.manual_seed(2)
    ref = ResBlock().train()
    mine = _clone(ref).train()
    x = torch.randn(2, 8, 8, 8)
    cm = torch.compile(mine, backend=tb.torch_backend)
    for _ in range(2):
        for p in list(ref.parameters()) + list(mine.parameters()):
            p.grad = None
        ref(x).square().sum().backward()
        cm(x).square().sum().backward()
    for (name, p), q in zip(ref.named_parameters(), mine.parameters()):
        _close(q.grad, p.grad, 1024)
    _close(mine.b1.running_mean, ref.b1.running_mean, 128)
    _close(mine.b2.running_var, ref.b2.running_var, 128)
    assert int(mine.b1.num_batches_tracked) == int(ref.b1.num_batches_tracked) == 2


def test_unmapped_node_runs_with_torch_and_is_reported():
    def f(x):
        return torch.sin(x) + torch.special.chebyshev_polynomial_t(x, 3).cumsum(0)
    x = torch.randn(7, 3)
    tb.reset_report()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cf = torch.compile(f, backend=tb.torch_backend)
        cf(x)
        got = cf(x)
    _close(got, f(x), 7)
    rec = tb.reports()[-1]
    names = [n for n, _ in rec["torch_fallback"]]
    assert any("chebyshev_polynomial_t" in n for n in names), rec
    assert any("chebyshev_polynomial_t" in str(m.message) for m in w)
    assert "torch fallback" in tb.report()


def test_mlp_training_steps_match_torch():
    torch.manual_seed(4)
    ref = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    mine = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    mine.load_state_dict(ref.state_dict())
    x, y = torch.randn(10, 6), torch.randn(10, 3)
    cm = torch.compile(mine, backend=tb.torch_backend)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_m = torch.optim.SGD(mine.parameters(), lr=0.1)
    losses = {id(ref): [], id(cm): []}
    for _ in range(3):                 # the first call captures; the later ones run Stax's kernels
        for model, opt in ((ref, opt_r), (cm, opt_m)):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses[id(model)].append(loss.detach())
    _close(torch.stack(losses[id(cm)]), torch.stack(losses[id(ref)]), 30)
    for p, q in zip(ref.parameters(), mine.parameters()):
        _close(q.detach(), p.detach(), 60)
