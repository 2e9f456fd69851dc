"""``Embedding``: a lookup table, ``weight[idx]`` for integer indices of any shape.

``weight`` has shape ``(num_embeddings, embedding_dim)`` and is initialised N(0, 1); the row
``padding_idx`` (if given) is zero and receives no gradient, so it stays zero during training.
``max_norm`` renormalises looked-up rows in place to at most that norm (as PyTorch does).
"""
from __future__ import annotations

import torch

from .. import functional as F
from .. import init
from ..._tensor import Tensor
from ...autograd.grad_mode import no_grad
from ..parameter import Parameter
from .module import Module

__all__ = ["Embedding"]


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, _freeze: bool = False, device=None, dtype=None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"nn.Embedding: padding_idx ({padding_idx}) must be within num_embeddings "
                                 f"({num_embeddings})")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"nn.Embedding: _weight has shape {list(_weight.shape)}, expected "
                                 f"[{num_embeddings}, {embedding_dim}]")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self):
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self):
        if self.padding_idx is not None:
            with no_grad():
                self.weight._data[self.padding_idx].fill_(0)

    def forward(self, input):
        kw = {}
        if self.padding_idx is not None:
            kw["padding_idx"] = self.padding_idx
        if self.max_norm is not None:
            kw["max_norm"] = self.max_norm
            kw["norm_type"] = self.norm_type
        if self.scale_grad_by_freq:
            kw["scale_grad_by_freq"] = True
        return F.embedding(input, self.weight, **kw)

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            s += ", scale_grad_by_freq=True"
        if self.sparse:
            s += ", sparse=True"
        return s

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is (a view of the storage of) ``embeddings``, a 2-D tensor."""
        if not isinstance(embeddings, (Tensor, torch.Tensor)) or embeddings.dim() != 2:
            raise ValueError("Embedding.from_pretrained: embeddings must be a 2-D Tensor")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings,
                   _freeze=freeze)
