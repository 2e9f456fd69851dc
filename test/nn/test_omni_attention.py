"""omni_attention and block masks (tensorplay/nn/attention; the chapter §9.10, experiment 6) against
the materialised reference ``softmax(score_mod(q kᵀ·scale) masked) v`` in float64, PyTorch's SDPA,
and finite-difference-checked gradients (including a learnable bias read by score_mod)."""
import math

import pytest
import torch

import tensorplay as tp
from tensorplay.nn import attention as A
from tensorplay.testing import assert_close

F = tp.nn.functional


def _qkv(B=2, H=3, L=70, S=70, E=16, Ev=8, Hk=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: tp.from_torch(torch.randn(*s, generator=g, dtype=dtype))  # noqa: E731
    return mk(B, H, L, E), mk(B, Hk or H, S, E), mk(B, Hk or H, S, Ev)


def _reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """The materialised definition in float64 (torch)."""
    q, k, v = (t.torch().double().cpu() for t in (q, k, v))
    B, H, L, E = q.shape
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], 1)
        v = v.repeat_interleave(H // v.shape[1], 1)
    S = k.shape[2]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(E) if scale is None else scale)
    b, h = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1)
    qi, ki = torch.arange(L).view(1, 1, L, 1), torch.arange(S).view(1, 1, 1, S)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand(B, H, L, S), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return p @ v, lse


def sliding(w):
    def mask(b, h, q, kv):
        return (q - kv <= w) & (kv - q <= w)
    return mask


@pytest.mark.parametrize("case", ["none", "causal", "sliding", "alibi", "document"])
@pytest.mark.parametrize("block", [16, (32, 16)])
def test_matches_the_materialised_reference(case, block):
    q, k, v = _qkv()
    L, S = q.shape[2], k.shape[2]
    doc = torch.tensor([0] * 30 + [1] * 25 + [2] * 15)
    mods = {"none": (None, None), "causal": (None, A.causal_mask), "sliding": (None, sliding(9)),
            "alibi": (lambda s, b, h, q, kv: s - (h + 1) * 0.1 * (q - kv).abs(), A.causal_mask),
            "document": (None, lambda b, h, q, kv: _doc(doc, q) == _doc(doc, kv))}
    score_mod, mask_mod = mods[case]
    bm = None if mask_mod is None else A.create_block_mask(mask_mod, None, None, L, S, BLOCK_SIZE=block)
    out, lse = A.omni_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True)
    ref, rlse = _reference(q, k, v, score_mod, mask_mod)
    assert out.shape == (2, 3, L, 8) and out.dtype == tp.float32 and lse.shape == (2, 3, L)
    assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    assert_close(lse, rlse.float(), rtol=1e-5, atol=1e-5)


def _doc(doc, idx):
    """doc[idx] for tp or torch index tensors."""
    if isinstance(idx, tp.Tensor):
        return tp.from_torch(doc)[idx]
    return doc[idx]


def test_equals_sdpa_without_mods_and_with_causal():
    q, k, v = _qkv(L=64, S=64)
    assert_close(A.omni_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
    bm = A.create_block_mask(A.causal_mask, 2, 3, 64, 64, BLOCK_SIZE=16)
    assert_close(A.omni_attention(q, k, v, block_mask=bm), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 rtol=1e-5, atol=1e-6)
    assert_close(A.omni_attention(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=0.3),
                 rtol=1e-5, atol=1e-6)


def test_sliding_window_block_counts_follow_exercise_37():
    """N = 1024, blocks of B = 128, window w = 256 (a multiple of B): per block row the tiles
    |i - j| <= w/B - 1 are full, |i - j| = w/B are partial (the window's edge crosses them), the rest empty."""
    N, Bs, w = 1024, 128, 256
    bm = A.create_block_mask(sliding(w), None, None, N, N, BLOCK_SIZE=Bs)
    n, r = N // Bs, w // Bs
    full = sum(1 for i in range(n) for j in range(n) if abs(i - j) < r)
    partial = sum(1 for i in range(n) for j in range(n) if abs(i - j) == r)
    c = bm.counts()
    assert (c["full"], c["partial"], c["empty"]) == (full, partial, n * n - full - partial) == (22, 12, 30)
    assert bm.sparsity() == pytest.approx(100 * 30 / 64)
    causal = A.create_block_mask(A.causal_mask, None, None, N, N, BLOCK_SIZE=Bs)
    assert causal.counts() == {"empty": 28, "partial": 8, "full": 28} and causal.sparsity() == pytest.approx(43.75)
    assert "sparsity=46.88%" in repr(bm) and bm.to_string().splitlines()[0] == "██░     "
    assert bm.to_dense().shape == (1, 1, 8, 8) and bm.shape == (1, 1, N, N)


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = _qkv(L=40, S=40)
    mask = lambda b, h, q, kv: (q >= 16) & (kv <= q)   # noqa: E731  rows 0..15 attend nothing
    bm = A.create_block_mask(mask, None, None, 40, 40, BLOCK_SIZE=16)
    out, lse = A.omni_attention(q, k, v, block_mask=bm, return_lse=True)
    assert bm.counts()["empty"] >= 3
    assert not out.torch()[:, :, :16].any() and torch.isneginf(lse.torch()[:, :, :16]).all()
    ref, _ = _reference(q, k, v, None, mask)
    assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


def test_empty_sequences():
    q, k, v = _qkv(L=0, S=5)
    out, lse = A.omni_attention(q, k, v, return_lse=True)
    assert out.shape == (2, 3, 0, 8) and lse.shape == (2, 3, 0)
    q, k, v = _qkv(L=6, S=0)
    out, lse = A.omni_attention(q, k, v, return_lse=True)
    assert out.shape == (2, 3, 6, 8) and not out.torch().any() and torch.isneginf(lse.torch()).all()


def test_gqa_and_per_head_masks():
    q, k, v = _qkv(H=4, Hk=2, L=48, S=40)
    head_mask = lambda b, h, q, kv: (kv <= q + h * 4)   # noqa: E731  depends on the head
    bm = A.create_block_mask(head_mask, 2, 4, 48, 40, BLOCK_SIZE=8)
    out = A.omni_attention(q, k, v, block_mask=bm, enable_gqa=True)
    ref, _ = _reference(q, k, v, None, head_mask)
    assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        A.omni_attention(q, k, v)


def test_kv_tiles_merge_by_the_online_monoid(monkeypatch):
    """Long rows split into several key tiles give the one-tile result (the (m, l, a) merge)."""
    from tensorplay.nn.attention import omni
    q, k, v = _qkv(L=32, S=200)
    bm = A.create_block_mask(sliding(60), None, None, 32, 200, BLOCK_SIZE=8)
    one = A.omni_attention(q, k, v, block_mask=bm, score_mod=lambda s, b, h, q, kv: s * 1.5)
    monkeypatch.setattr(omni, "KV_TILE", 16)
    many = A.omni_attention(q, k, v, block_mask=bm, score_mod=lambda s, b, h, q, kv: s * 1.5)
    assert_close(many, one, rtol=1e-5, atol=1e-6)


def test_gradients_reach_q_k_v_and_a_learnable_bias():
    """Experiment 6 (3): a score_mod reading a learnable per-head bias table is differentiated."""
    q, k, v = (t.double().requires_grad_() for t in _qkv(B=1, H=2, L=12, S=12, E=4, Ev=3))
    rel = tp.randn(2, 23, dtype=tp.float64, requires_grad=True)      # a bias per head and distance

    def score_mod(s, b, h, qi, kv):
        return s + rel[h, qi - kv + 11]

    bm = A.create_block_mask(A.causal_mask, None, None, 12, 12, BLOCK_SIZE=4)
    f = lambda q, k, v, rel: A.omni_attention(q, k, v, score_mod=score_mod, block_mask=bm)  # noqa: E731
    assert tp.autograd.gradcheck(f, (q, k, v, rel), eps=1e-6, atol=1e-5)
    out = f(q, k, v, rel)
    out.sum().backward()
    assert rel.grad is not None and rel.grad.abs().sum().item() > 0
    # torch reference for the bias gradient
    tq, tk, tv = (t.detach().torch().requires_grad_() for t in (q, k, v))
    trel = rel.detach().torch().requires_grad_()
    ref, _ = _reference(tp.from_torch(tq.detach()), tp.from_torch(tk.detach()), tp.from_torch(tv.detach()))
    s = tq @ tk.transpose(-2, -1) / 2.0
    i = torch.arange(12)
    s = s + trel[torch.arange(2).view(1, 2, 1, 1), (i.view(1, 1, 12, 1) - i.view(1, 1, 1, 12)) + 11]
    s = s.masked_fill(~(i.view(12, 1) >= i.view(1, 12)), float("-inf"))
    (torch.softmax(s, -1) @ tv).sum().backward()
    assert_close(rel.grad, trel.grad, rtol=1e-10, atol=1e-10)
    assert_close(q.grad, tq.grad, rtol=1e-10, atol=1e-10)


def test_half_precision_takes_float32_statistics():
    q, k, v = _qkv(L=33, S=33, dtype=torch.bfloat16)
    bm = A.create_block_mask(A.causal_mask, None, None, 33, 33, BLOCK_SIZE=16)
    out, lse = A.omni_attention(q, k, v, block_mask=bm, return_lse=True)
    assert out.dtype == tp.bfloat16 and lse.dtype == tp.float32
    ref, _ = _reference(q, k, v, None, A.causal_mask)
    assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_compiled_equals_eager():
    q, k, v = _qkv(L=32, S=32)
    bm = A.create_block_mask(sliding(5), None, None, 32, 32, BLOCK_SIZE=8)
    f = lambda q, k, v: A.omni_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + 0.1 * (qi - kv),  # noqa: E731
                                         block_mask=bm)
    cf = tp.compile(f, strict_native=True)
    cf(q, k, v)
    assert_close(cf(q, k, v), f(q, k, v), rtol=1e-5, atol=1e-5)


def test_flex_names_and_bad_inputs():
    from tensorplay.nn.attention.flex_attention import flex_attention, create_block_mask
    q, k, v = _qkv(L=16, S=16)
    bm = create_block_mask(A.causal_mask, None, None, 16, 16, BLOCK_SIZE=8)
    assert_close(flex_attention(q, k, v, block_mask=bm), A.omni_attention(q, k, v, block_mask=bm), exact=True)
    with pytest.raises(ValueError, match="omni_attention: expected 4-D"):
        A.omni_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"block mask is for \(Q_LEN, KV_LEN\) = \(8, 16\)"):
        A.omni_attention(q, k, v, block_mask=create_block_mask(A.causal_mask, None, None, 8, 16, BLOCK_SIZE=8))
    with pytest.raises(TypeError, match="mask_mod must return a bool tensor"):
        create_block_mask(lambda b, h, q, kv: q - kv, None, None, 16, 16)
    with pytest.raises(ValueError, match="create_block_mask: B, H and BLOCK_SIZE must be positive"):
        create_block_mask(A.causal_mask, None, None, 16, 16, BLOCK_SIZE=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_against_sdpa_and_the_reference(dtype):
    q, k, v = (t.to("cuda") for t in _qkv(L=300, S=300, E=64, Ev=64, dtype=dtype))
    bm = A.create_block_mask(A.causal_mask, None, None, 300, 300, device="cuda")
    out = A.omni_attention(q, k, v, block_mask=bm)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert out.device.type == "cuda" and out.dtype == dtype
    assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    mods = lambda s, b, h, qi, kv: s - 0.05 * (qi - kv).abs()   # noqa: E731
    bm = A.create_block_mask(sliding(40), None, None, 300, 300, device="cuda", BLOCK_SIZE=64)
    out = A.omni_attention(q, k, v, score_mod=mods, block_mask=bm)
    r, _ = _reference(q, k, v, mods, sliding(40))
    assert_close(out.float(), r.float().to("cuda"), rtol=tol, atol=tol)
