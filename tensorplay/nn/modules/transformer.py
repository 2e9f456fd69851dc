"""Attention and Transformer layers: ``MultiheadAttention``, ``TransformerEncoderLayer``,
``TransformerEncoder``, ``TransformerDecoderLayer``, ``TransformerDecoder`` and ``Transformer``.

``MultiheadAttention(E, H)`` computes, for each head h with ``D = E / H``::

    Q_h = query W_q,hᵀ + b_q,h     K_h = key W_k,hᵀ + b_k,h     V_h = value W_v,hᵀ + b_v,h
    A_h = softmax(Q_h K_hᵀ / √D + mask) V_h
    out = concat_h(A_h) W_oᵀ + b_o

Parameter names follow PyTorch so that state dicts load both ways: ``in_proj_weight`` (3E x E, rows
``[W_q; W_k; W_v]``) and ``in_proj_bias`` (3E), or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``
when ``kdim``/``vdim`` differ from ``E``; ``out_proj`` is a ``Linear``; optional ``bias_k``/``bias_v``.

Masks: ``attn_mask`` of shape ``(L, S)`` or ``(N·H, L, S)`` and ``key_padding_mask`` of shape ``(N, S)``;
a boolean mask marks positions that may **not** be attended (``True`` = masked), a float mask is
added to the scores.  Inputs are ``(L, N, E)`` (sequence first, the default) or ``(N, L, E)`` with
``batch_first=True``, or unbatched ``(L, E)``.  With ``need_weights=True`` the attention
probabilities are returned (averaged over heads unless ``average_attn_weights=False``); otherwise
the fused ``F.scaled_dot_product_attention`` is used and ``None`` is returned in their place.

``TransformerEncoderLayer`` is self-attention + feed-forward, each wrapped in a residual connection
with LayerNorm after (``norm_first=False``, post-norm) or before (``norm_first=True``, pre-norm) it.
``TransformerDecoderLayer`` adds, between the two, attention from the target to the encoder's output
(``memory``), with its own residual and LayerNorm (``norm2``; the feed-forward's is ``norm3``).
``Transformer`` is an encoder stack and a decoder stack, each ending in a LayerNorm, with every
matrix parameter initialised ``xavier_uniform_``; submodule and parameter names, defaults and the
order of random draws at construction follow PyTorch, so a seeded construction gives the same
weights and state dicts load both ways.
"""
from __future__ import annotations

import copy
import math

import torch

from .. import functional as F
from .. import init
from ... import ops as _ops
from ..._tensor import Tensor, _wrap
from ..parameter import Parameter
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear, NonDynamicallyQuantizableLinear
from .module import Module
from .normalization import LayerNorm

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
           "TransformerDecoder", "Transformer"]


def _float_mask(mask, dtype, who):
    """Boolean masks -> additive float masks (-inf where True); float masks pass through."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        mask = _wrap(torch.as_tensor(mask))
    if mask.dtype == torch.bool:
        m = mask._data
        return _wrap(torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(m, float("-inf")))
    if not mask.is_floating_point():
        raise TypeError(f"{who}: only bool and floating-point masks are supported, got {mask.dtype}")
    return mask


class MultiheadAttention(Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"nn.MultiheadAttention: embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"nn.MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        fk = dict(device=device, dtype=dtype)
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(torch.empty((embed_dim, embed_dim), **fk))
            self.k_proj_weight = Parameter(torch.empty((embed_dim, self.kdim), **fk))
            self.v_proj_weight = Parameter(torch.empty((embed_dim, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(torch.empty((3 * embed_dim, embed_dim), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(torch.empty(3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = Parameter(torch.empty((1, 1, embed_dim), **fk))
            self.bias_v = Parameter(torch.empty((1, 1, embed_dim), **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def _project(self, query, key, value):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if query is key and key is value:  # self-attention: one matmul, then split
                qkv = F.linear(query, w, b)
                return qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
            return (F.linear(query, w[:E], bq), F.linear(key, w[E:2 * E], bk), F.linear(value, w[2 * E:], bv))
        return (F.linear(query, self.q_proj_weight, bq), F.linear(key, self.k_proj_weight, bk),
                F.linear(value, self.v_proj_weight, bv))

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        who = "nn.MultiheadAttention"
        batched = query.dim() == 3
        if query.dim() not in (2, 3):
            raise ValueError(f"{who}: query should be unbatched 2D or batched 3D, got {query.dim()}D "
                             f"shape {list(query.shape)}")
        if key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(f"{who}: query, key and value must have the same number of dims, got "
                             f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
        if query.shape[-1] != self.embed_dim:
            raise ValueError(f"{who}: expected query with embedding dim {self.embed_dim}, got shape "
                             f"{list(query.shape)}")
        same_kv = key is value
        self_attn = query is key and same_kv
        if not batched:
            query = query.unsqueeze(0)
            key = query if self_attn else key.unsqueeze(0)
            value = key if same_kv else value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query = query.transpose(0, 1)
            key = query if self_attn else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        N, L, E = query.shape
        S = key.shape[1]
        H, D = self.num_heads, self.head_dim
        if key.shape[0] != N or value.shape[0] != N or value.shape[1] != S:
            raise ValueError(f"{who}: key/value batch or sequence sizes do not match: query {list(query.shape)}, "
                             f"key {list(key.shape)}, value {list(value.shape)} (batch-first view)")
        q, k, v = self._project(query, key, value)
        dtype = q.dtype
        attn = _float_mask(attn_mask, dtype, who)
        kpm = _float_mask(key_padding_mask, dtype, who)
        if attn is not None:
            if attn.dim() == 2:
                if tuple(attn.shape) != (L, S):
                    raise RuntimeError(f"{who}: the shape of the 2D attn_mask is {list(attn.shape)}, but should be "
                                       f"{[L, S]}")
                attn = attn.reshape(1, 1, L, S)
            elif attn.dim() == 3:
                if tuple(attn.shape) != (N * H, L, S):
                    raise RuntimeError(f"{who}: the shape of the 3D attn_mask is {list(attn.shape)}, but should be "
                                       f"{[N * H, L, S]}")
                attn = attn.reshape(N, H, L, S)
            else:
                raise RuntimeError(f"{who}: attn_mask's dimension {attn.dim()} is not supported")
        # is_causal without an explicit mask: the fused kernel's flag when nothing else masks,
        # otherwise an explicit lower-triangular mask merged with the others
        causal_flag = is_causal and attn is None and kpm is None and self.bias_k is None and not self.add_zero_attn
        if is_causal and attn is None:
            keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril_()
            causal = _float_mask(_wrap(~keep), dtype, who).reshape(1, 1, L, S)
            if not causal_flag:
                attn = causal
        if kpm is not None and tuple(kpm.shape) != (N, S):
            raise RuntimeError(f"{who}: expected key_padding_mask of shape {[N, S]}, got {list(kpm.shape)}")
        if self.bias_k is not None:
            k = _ops.cat([k, self.bias_k.expand(N, 1, E)], 1)
            v = _ops.cat([v, self.bias_v.expand(N, 1, E)], 1)
            S += 1
            attn = _pad_last(attn, 1)
            kpm = _pad_last(kpm, 1)
        q = q.reshape(N, L, H, D).transpose(1, 2)
        k = k.reshape(N, S, H, D).transpose(1, 2)
        v = v.reshape(N, S, H, D).transpose(1, 2)
        if self.add_zero_attn:
            z = _wrap(torch.zeros((N, H, 1, D), dtype=dtype, device=q.device))
            k = _ops.cat([k, z], 2)
            v = _ops.cat([v, z], 2)
            S += 1
            attn = _pad_last(attn, 1)
            kpm = _pad_last(kpm, 1)
        if kpm is not None:
            kpm = kpm.reshape(N, 1, 1, S)
            attn = kpm if attn is None else attn + kpm
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            mask = causal if causal_flag else attn
            scores = (q * math.sqrt(1.0 / D)).matmul(k.transpose(-2, -1))
            if mask is not None:
                scores = scores + mask
            weights = F.softmax(scores, -1)
            if dropout_p > 0:
                weights = F.dropout(weights, dropout_p, True)
            out = weights.matmul(v)
        else:
            if causal_flag:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, dropout_p=dropout_p)
            weights = None
        # the output projection runs on (L, N, E) rows, as PyTorch's does: the result then has PyTorch's
        # memory layout (a batch_first output is a transposed view), so a following dropout draws its
        # mask in the same element order and seeded training matches PyTorch's
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(L, N, E))
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights


def _pad_last(mask, n):
    """Append ``n`` zero (= attend) columns to an additive mask's last dim."""
    if mask is None:
        return None
    shape = list(mask.shape)
    shape[-1] = n
    return _ops.cat([mask, _wrap(torch.zeros(shape, dtype=mask.dtype, device=mask.device))], -1)


def _activation(name):
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {name}")


class _TransformerLayer(Module):
    """What encoder and decoder layers share: self-attention, (for a decoder) attention to the
    memory, the feed-forward block, ``n`` LayerNorms and residual dropouts, registered in PyTorch's
    order (so state dict keys and seeded initial weights match)."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                 bias, device, dtype, cross):
        super().__init__()
        fk = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **fk)
        if cross:
            self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                     batch_first=batch_first, **fk)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.norm_first = norm_first
        self._blocks = 3 if cross else 2
        for i in range(1, self._blocks + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        for i in range(1, self._blocks + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation) if isinstance(activation, str) else activation

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        last = getattr(self, f"dropout{self._blocks}")
        return last(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                         bias, device, dtype, cross=False)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x


class TransformerEncoder(Module):
    """``num_layers`` independent copies of ``encoder_layer`` applied in turn, then ``norm``."""

    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor: bool = True,
                 mask_check: bool = True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        if self.norm is not None:
            x = self.norm(x)
        return x


class TransformerDecoderLayer(_TransformerLayer):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first,
                         bias, device, dtype, cross=True)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x


class TransformerDecoder(Module):
    """``num_layers`` independent copies of ``decoder_layer`` applied in turn to the target (each
    attending to the same ``memory``), then ``norm``."""

    def __init__(self, decoder_layer, num_layers: int, norm=None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                      memory_is_causal=memory_is_causal)
        if self.norm is not None:
            x = self.norm(x)
        return x


class Transformer(Module):
    """The encoder-decoder model of "Attention Is All You Need", with PyTorch's signature and defaults
    (``d_model=512, nhead=8``, six layers each side, ``dim_feedforward=2048``, post-norm)."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        fk = dict(device=device, dtype=dtype)
        common = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                      layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias, **fk)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, **common)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, **common)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def _reset_parameters(self):
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        batched = src.dim() == 3
        bdim = 0 if self.batch_first else 1
        if batched and src.shape[bdim] != tgt.shape[bdim]:
            raise RuntimeError(f"nn.Transformer: the batch number of src and tgt must be equal, got src "
                               f"{list(src.shape)} and tgt {list(tgt.shape)} (batch_first={self.batch_first})")
        if not batched and src.dim() != tgt.dim():
            raise RuntimeError(f"nn.Transformer: src and tgt must both be batched (3-D) or unbatched (2-D), got "
                               f"{list(src.shape)} and {list(tgt.shape)}")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(f"nn.Transformer: the feature number of src and tgt must be equal to d_model "
                               f"({self.d_model}), got {list(src.shape)} and {list(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None):
        """The additive causal mask of size ``sz``: ``-inf`` above the diagonal, ``0`` on and below it."""
        dtype = torch.float32 if dtype is None else dtype
        return _wrap(torch.triu(torch.full((sz, sz), float("-inf"), dtype=dtype, device=device), diagonal=1))
