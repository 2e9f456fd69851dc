"""Block masks for ``omni_attention`` (the chapter §9.10: sparsity lifted to the block granularity).

A ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says which (query, key) pairs may attend. Cut the
L x S score matrix of each (batch, head) into ``BLOCK_SIZE`` x ``BLOCK_SIZE`` tiles; a tile is

* **empty** when the mask is False at every position of it: the tile is never computed;
* **full** when it is True at every (in-range) position: computed with no mask;
* **partial** otherwise: computed, and ``mask_mod`` applied position by position.

``create_block_mask`` evaluates ``mask_mod`` once on the index grid -- one block row of query
positions at a time, so its memory is ``B·H·BLOCK_SIZE·S`` booleans, never ``L·S`` -- and keeps
the tile classes as a ``(B, H, ⌈L/BLOCK_SIZE⌉, ⌈S/BLOCK_SIZE⌉)`` int8 tensor (0 empty, 1 partial,
2 full). ``BlockMask.sparsity()`` is the percentage of tiles that are empty: the fraction of the
score matrix's work the block mask saves (exercise 37 computes it for a sliding window).

``mask_mod`` receives broadcastable integer tensors (``b`` of shape (B,1,1,1), ``h`` (1,H,1,1),
``q_idx`` (1,1,Q,1), ``kv_idx`` (1,1,1,S)) and must combine them with tensor operations
(comparisons, ``&``, ``|``, arithmetic, ``tp.where``); a Python ``if`` on them raises, as it does
under PyTorch's vmap.
"""
from __future__ import annotations

import math

import torch

from ..._tensor import Tensor, _wrap

__all__ = ["BlockMask", "create_block_mask", "noop_mask", "causal_mask", "EMPTY", "PARTIAL", "FULL"]

EMPTY, PARTIAL, FULL = 0, 1, 2
DEFAULT_BLOCK_SIZE = 128


def noop_mask(b, h, q_idx, kv_idx):
    """Every pair attends."""
    return q_idx >= 0


def causal_mask(b, h, q_idx, kv_idx):
    """Query i attends to keys j <= i."""
    return q_idx >= kv_idx


def index_grid(B, H, q0, q1, S, device):
    """The broadcastable index tensors ``b, h, q_idx, kv_idx`` of the rows ``q0 <= q < q1``."""
    ar = lambda n, shape, start=0: _wrap(torch.arange(start, start + n, device=device).view(shape))  # noqa: E731
    return (ar(B, (B, 1, 1, 1)), ar(H, (1, H, 1, 1)), ar(q1 - q0, (1, 1, q1 - q0, 1), q0),
            ar(S, (1, 1, 1, S)))


def eval_mask(mask_mod, B, H, q0, q1, kv_idx, device):
    """``mask_mod`` on rows q0..q1 and the key positions ``kv_idx`` (a tp int tensor of shape
    (1,1,1,n)), broadcast to (B, H, q1-q0, n), as a torch bool tensor."""
    b, h, q, _ = index_grid(B, H, q0, q1, 1, device)
    m = mask_mod(b, h, q, kv_idx)
    if not isinstance(m, Tensor) or m.dtype != torch.bool:
        raise TypeError(f"omni_attention: mask_mod must return a bool tensor, got "
                        f"{type(m).__name__ if not isinstance(m, Tensor) else m.dtype}")
    return m._data.expand(B, H, q1 - q0, kv_idx.shape[-1])


class BlockMask:
    """Tile classes of a mask (module docstring). ``states[b, h, i, j]`` is EMPTY, PARTIAL or FULL;
    ``mask_mod`` is kept to mask the partial tiles when attention runs."""

    def __init__(self, states: torch.Tensor, seq_lengths, block_size, mask_mod):
        self.states = states
        self.seq_lengths = tuple(seq_lengths)
        self.BLOCK_SIZE = tuple(block_size)
        self.mask_mod = mask_mod

    @property
    def shape(self):
        B, H = self.states.shape[:2]
        return (B, H) + self.seq_lengths

    def numel(self) -> int:
        return math.prod(self.shape)

    def sparsity(self) -> float:
        """Percentage of tiles that are empty (never computed)."""
        n = self.states.numel()
        return 100.0 * float((self.states == EMPTY).sum()) / n if n else 0.0

    def counts(self) -> dict:
        """Number of empty, partial and full tiles (over every batch and head)."""
        return {name: int((self.states == v).sum()) for name, v in (("empty", EMPTY), ("partial", PARTIAL),
                                                                     ("full", FULL))}

    def to_dense(self) -> Tensor:
        """The (B, H, ⌈L/BLOCK⌉, ⌈S/BLOCK⌉) int8 tile classes (0 empty, 1 partial, 2 full)."""
        return _wrap(self.states.clone())

    def to_string(self, b: int = 0, h: int = 0) -> str:
        """The tile grid of one batch and head: '█' full, '░' partial, ' ' empty."""
        glyph = {EMPTY: " ", PARTIAL: "░", FULL: "█"}
        return "\n".join("".join(glyph[int(v)] for v in row) for row in self.states[b, h])

    def __repr__(self):
        c = self.counts()
        return (f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, sparsity={self.sparsity():.2f}%, "
                f"full={c['full']}, partial={c['partial']}, empty={c['empty']}, "
                f"mask_mod={getattr(self.mask_mod, '__name__', self.mask_mod)})")


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=DEFAULT_BLOCK_SIZE, _compile=False):
    """The ``BlockMask`` of ``mask_mod`` for B batches (None: 1, broadcast over the batch), H heads
    (None: 1), Q_LEN queries and KV_LEN keys; BLOCK_SIZE is an int or (q block, kv block)."""
    B, H = B or 1, H or 1
    bq, bk = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    if min(B, H, bq, bk) <= 0 or Q_LEN < 0 or KV_LEN < 0:
        raise ValueError(f"create_block_mask: B, H and BLOCK_SIZE must be positive and lengths non-negative, got "
                         f"B={B}, H={H}, Q_LEN={Q_LEN}, KV_LEN={KV_LEN}, BLOCK_SIZE={BLOCK_SIZE}")
    device = torch.device(device)
    nq, nk = -(-Q_LEN // bq), -(-KV_LEN // bk)
    states = torch.empty((B, H, nq, nk), dtype=torch.int8, device=device)
    kv = _wrap(torch.arange(KV_LEN, device=device).view(1, 1, 1, KV_LEN))
    pad = nk * bk - KV_LEN
    valid = torch.ones(nk, bk, dtype=torch.bool, device=device)     # in-range key positions per block
    if pad:
        valid[-1, bk - pad:] = False
    for i in range(nq):
        q0, q1 = i * bq, min((i + 1) * bq, Q_LEN)
        m = eval_mask(mask_mod, B, H, q0, q1, kv, device)
        if pad:   # out-of-range key positions: neither attend nor keep a tile from being full
            m = torch.cat([m, m.new_zeros(B, H, q1 - q0, pad)], -1)
        tiles = m.reshape(B, H, q1 - q0, nk, bk)
        any_ = tiles.any(-1).any(2)
        all_ = (tiles | ~valid).all(-1).all(2)
        states[:, :, i] = torch.where(all_, FULL, torch.where(any_, PARTIAL, EMPTY)).to(torch.int8)
    return BlockMask(states, (Q_LEN, KV_LEN), (bq, bk), mask_mod)


def full_block_mask(B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE=DEFAULT_BLOCK_SIZE):
    """Every tile full (no mask)."""
    bq, bk = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    states = torch.full((B, H, -(-Q_LEN // bq), -(-KV_LEN // bk)), FULL, dtype=torch.int8, device=device)
    return BlockMask(states, (Q_LEN, KV_LEN), (bq, bk), noop_mask)

