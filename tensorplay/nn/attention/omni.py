"""``omni_attention``: attention with a ``score_mod`` and a block mask, tiled by the online-softmax
monoid (the chapter §9.10, Theorem 9.2, experiment 6).

For each (batch, head)::

    S = q kᵀ · scale;   S'_ij = score_mod(S_ij, b, h, i, j);   S'_ij = -inf where not mask_mod(b, h, i, j)
    out = softmax(S') v,   lse_i = log Σ_j exp(S'_ij)

**How it is computed.** Query rows are taken one block (``BLOCK_SIZE`` rows) at a time. For a
block row, the key blocks the ``BlockMask`` marks non-empty for any (batch, head) are selected
(empty tiles are never computed), in chunks of at most ``KV_TILE`` key positions. Each chunk
gives a tile of scores; ``score_mod`` is applied to it with the tile's index tensors, and
``mask_mod`` when a selected block is partial for some (batch, head). Chunks are merged by the
triple ``(m, ℓ, a)`` of the online softmax: with ``m' = max(m₁, m₂)``,
``ℓ = ℓ₁ e^{m₁-m'} + ℓ₂ e^{m₂-m'}`` and ``a = a₁ e^{m₁-m'} + a₂ e^{m₂-m'}`` (associative and
commutative, identity ``(-inf, 0, 0)``; exercise 15); ``out = a / ℓ`` and ``lse = m + log ℓ``.

**Guarantees.** Results equal the materialised reference (``softmax(score_mod(S) masked) v``)
within float rounding; a query row that no key may attend gives output 0 and ``lse = -inf``
(PyTorch's flex_attention convention). Peak memory of the forward grows as
``O(B·H·BLOCK_SIZE·KV_TILE)`` for the tile plus ``O(B·H·L·E)`` for the output -- linear in the
sequence length, where the op-by-op attention's L x S scores grow quadratically (Theorem 9.2).
Half-precision inputs take float32 scores and statistics; the output has the query's dtype.
Gradients (to q, k, v and to any tensor ``score_mod`` reads, e.g. a learnable bias) come from the
tiles' tp ops by autograd; the backward keeps each computed tile's probabilities (the block mask's
sparsity, not a recomputation, bounds that memory).

**Where it runs.** The tiles are tensorplay ops: eagerly, ATen kernels on the CPU or GPU; under
``tp.compile``, the unrolled tiles go through Stax, where ``score_mod``'s and ``mask_mod``'s ops fuse
with the softmax statistics into the tile kernels (their subgraphs inlined into the kernels that
read the scores). There is no single hand-written attention template: a long sequence is many tile
kernels, so ``F.scaled_dot_product_attention`` (ATen's fused flash kernel) stays faster where it
applies (no ``score_mod``, a mask it supports).
"""
from __future__ import annotations

import math

import torch

from ... import ops as _ops
from ..._tensor import Tensor, _wrap
from .block_mask import FULL, EMPTY, BlockMask, eval_mask, full_block_mask, index_grid

__all__ = ["omni_attention", "KV_TILE"]

KV_TILE = 4096   # the most key positions one tile holds (the bound on a tile's memory)


def _check(query, key, value, enable_gqa):
    who = "omni_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{who}: {name} must be a tp.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{who}: expected 4-D (B, H, L, E) tensors, got {name} of shape {list(t.shape)}")
    (B, Hq, L, E), (Bk, Hk, S, Ek), (Bv, Hv, Sv, Ev) = query.shape, key.shape, value.shape
    if not (B == Bk == Bv and Hk == Hv and S == Sv and E == Ek):
        raise ValueError(f"{who}: incompatible shapes query {list(query.shape)}, key {list(key.shape)}, "
                         f"value {list(value.shape)} (batch, key heads, key length and head size must agree)")
    if Hq != Hk and not (enable_gqa and Hq % Hk == 0):
        raise ValueError(f"{who}: query has {Hq} heads and key {Hk}; pass enable_gqa=True with Hq a multiple of "
                         f"Hkv for grouped-query attention")
    return B, Hq, L, S, Hk


def _repeat_heads(t, hq):
    hk = t.shape[1]
    if hk == hq:
        return t
    B, _, S, E = t.shape
    return t.unsqueeze(2).expand(B, hk, hq // hk, S, E).reshape(B, hq, S, E)


def _chunks(cols, limit_blocks):
    """Split the sorted selected key-block indices into chunks of at most ``limit_blocks`` blocks."""
    return [cols[i:i + limit_blocks] for i in range(0, len(cols), limit_blocks)]


def _positions(blocks, bk, S, device):
    """The key positions of the given key blocks (the last block cut at S) as a torch int64 tensor,
    and whether they are one contiguous range."""
    lo, hi = blocks[0] * bk, min((blocks[-1] + 1) * bk, S)
    contiguous = blocks == list(range(blocks[0], blocks[-1] + 1))
    if contiguous:
        return torch.arange(lo, hi, device=device), True
    return torch.cat([torch.arange(j * bk, min((j + 1) * bk, S), device=device) for j in blocks]), False


def omni_attention(query, key, value, score_mod=None, block_mask: BlockMask | None = None, scale=None,
                   enable_gqa: bool = False, return_lse: bool = False):
    """Attention with ``score_mod(score, b, h, q_idx, kv_idx)`` applied to every score and the
    ``block_mask``'s ``mask_mod`` (module docstring). q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev)
    -> (B, Hq, L, Ev), and the (B, Hq, L) float32 logsumexp with ``return_lse=True``."""
    B, H, L, S, Hk = _check(query, key, value, enable_gqa)
    device = query.device
    if block_mask is None:
        block_mask = full_block_mask(1, 1, L, S, device)
    if block_mask.seq_lengths != (L, S):
        raise ValueError(f"omni_attention: the block mask is for (Q_LEN, KV_LEN) = {block_mask.seq_lengths}, the "
                         f"inputs have ({L}, {S})")
    mb, mh = block_mask.states.shape[:2]
    if mb not in (1, B) or mh not in (1, H):
        raise ValueError(f"omni_attention: the block mask's (B, H) = ({mb}, {mh}) does not broadcast to ({B}, {H})")
    k, v = _repeat_heads(key, H), _repeat_heads(value, H)
    sc = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    acc_dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    bq, bk = block_mask.BLOCK_SIZE
    states = block_mask.states.to("cpu")
    mask_mod = block_mask.mask_mod
    outs, lses = [], []
    for i in range(states.shape[2]):
        q0, q1 = i * bq, min((i + 1) * bq, L)
        row = states[:, :, i].reshape(mb * mh, states.shape[3])        # (mb*mh, nk)
        cols = [j for j in range(row.shape[1]) if bool((row[:, j] != EMPTY).any())]
        if not cols:     # no key may be attended by these rows: output 0, lse -inf
            outs.append(_wrap(torch.zeros((B, H, q1 - q0, v.shape[-1]), dtype=query.dtype, device=device)))
            lses.append(_wrap(torch.full((B, H, q1 - q0), float("-inf"), dtype=acc_dtype, device=device)))
            continue
        qi = query[:, :, q0:q1]
        b_i, h_i, q_i, _ = index_grid(B, H, q0, q1, 1, device)    # score_mod's indices of these rows
        m_run = l_run = a_run = None
        for blocks in _chunks(cols, max(1, KV_TILE // bk)):
            pos, contiguous = _positions(blocks, bk, S, device)
            if contiguous:
                ks, vs = k[:, :, int(pos[0]):int(pos[-1]) + 1], v[:, :, int(pos[0]):int(pos[-1]) + 1]
            else:
                idx = _wrap(pos)
                ks, vs = k.index_select(2, idx), v.index_select(2, idx)
            s = qi.matmul(ks.transpose(-2, -1)).to(acc_dtype) * sc
            kv_idx = _wrap(pos.view(1, 1, 1, -1))
            if score_mod is not None:
                s = score_mod(s, b_i, h_i, q_i, kv_idx)
            if bool((row[:, blocks] != FULL).any()):     # a partial block (for some batch / head): mask it
                keep = eval_mask(mask_mod, mb, mh, q0, q1, kv_idx, device)
                s = _ops.where(_wrap(keep), s, float("-inf"))
            m = s.amax(-1, keepdim=True)
            m_safe = _ops.where(m == float("-inf"), 0.0, m)               # a fully masked row: no NaN
            p = (s - m_safe).exp()
            l_c = p.sum(-1, keepdim=True)
            a_c = p.to(vs.dtype).matmul(vs).to(acc_dtype)
            if m_run is None:
                m_run, l_run, a_run = m_safe, l_c, a_c
            else:    # merge (m, l, a) triples: the online-softmax monoid
                m_new = _ops.maximum(m_run, m_safe)
                f_old, f_new = (m_run - m_new).exp(), (m_safe - m_new).exp()
                m_run, l_run, a_run = m_new, l_run * f_old + l_c * f_new, a_run * f_old + a_c * f_new
        empty_row = l_run == 0
        outs.append((a_run / _ops.where(empty_row, 1.0, l_run)).to(query.dtype))
        lses.append(_ops.where(empty_row, float("-inf"), m_run + l_run.log()).squeeze(-1))
    if not outs:     # no queries (L = 0)
        outs.append(_wrap(torch.zeros((B, H, 0, v.shape[-1]), dtype=query.dtype, device=device)))
        lses.append(_wrap(torch.zeros((B, H, 0), dtype=acc_dtype, device=device)))
    out = outs[0] if len(outs) == 1 else _ops.cat(outs, 2)
    if not return_lse:
        return out
    return out, (lses[0] if len(lses) == 1 else _ops.cat(lses, 2))
