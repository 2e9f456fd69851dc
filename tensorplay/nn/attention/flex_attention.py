"""PyTorch's ``torch.nn.attention.flex_attention`` names over ``omni_attention``: ``flex_attention``
(same arguments: score_mod, block_mask, scale, enable_gqa, return_lse), ``create_block_mask``,
``BlockMask``, ``noop_mask``."""
from __future__ import annotations

from .block_mask import BlockMask, create_block_mask, noop_mask  # noqa: F401
from .omni import omni_attention as flex_attention  # noqa: F401

__all__ = ["flex_attention", "create_block_mask", "BlockMask", "noop_mask"]
