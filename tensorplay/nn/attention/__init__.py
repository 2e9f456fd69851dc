"""``tp.nn.attention``: ``omni_attention`` with ``score_mod`` / ``mask_mod`` and block masks (the
chapter §9.10, experiment 6), plus PyTorch's ``sdpa_kernel`` / ``SDPBackend`` names (the backend
choice of ``F.scaled_dot_product_attention``, which runs ATen's kernels) and a ``flex_attention``
submodule under PyTorch's names for programs written against ``torch.nn.attention.flex_attention``.
"""
from __future__ import annotations

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401  (ATen's SDPA backend selection)

from .block_mask import BlockMask, causal_mask, create_block_mask, noop_mask  # noqa: F401
from .omni import omni_attention  # noqa: F401
from . import flex_attention  # noqa: F401,E402

__all__ = ["omni_attention", "create_block_mask", "BlockMask", "noop_mask", "causal_mask", "SDPBackend",
           "sdpa_kernel", "flex_attention"]
