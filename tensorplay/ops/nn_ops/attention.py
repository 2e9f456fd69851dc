"""Scaled dot-product attention (chapter §1.2): ATen's fused kernel forward, ATen's fused backward
(``_sdpa_fused_backward``; the scores recomputed with matmul + softmax, ``sdpa_scores``, only for a
float mask that needs its gradient), and ``sdpa_composite``, the same attention written in tp ops
(``tensorplay.nn.functional`` uses it with dropout, so that forward and backward share the mask)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from .._helpers import sum_to
from ...autograd import grad_mode as _gm
from ..registry import OPS, register
from ._common import N


# =================================================================================================
# scaled dot-product attention
# =================================================================================================
def _sdpa_kernel(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError("query, key and value must have at least 2 dims (..., L, E)")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"incompatible shapes: query {list(query.shape)}, key {list(key.shape)}, "
                           f"value {list(value.shape)} (need query[-1] == key[-1] and key[-2] == value[-2])")
    out = TF.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)
    # fused GPU kernels return a (B, L, H, E)-strided result; the op's layout contract is contiguous
    return out.contiguous()


def _expand_kv(t, hq):
    """Repeat each of the H_kv heads of ``t`` (dim -3) hq / H_kv times (grouped-query attention)."""
    hk = t.shape[-3]
    if hk == hq:
        return t
    rep = hq // hk
    shape = list(t.shape)
    return t.unsqueeze(-3).expand(shape[:-2] + [rep] + shape[-2:]).reshape(shape[:-3] + [hq] + shape[-2:])


def _sum_kv(g, hk):
    hq = g.shape[-3]
    if hk == hq:
        return g
    shape = list(g.shape)
    return g.reshape(shape[:-3] + [hk, hq // hk] + shape[-2:]).sum(-3)


def attention_bias(attn_mask, is_causal, L, S, like):
    """The additive score bias (tp tensor or None): causal -inf above the diagonal, a bool mask's False
    entries -inf, a float mask added as is.  Built from tp ops (factories, tril, where)."""
    bias = None
    if is_causal:
        keep = OPS["_ones"].fn([L, S], dtype=torch.bool, device=like.device).tril()
        bias = OPS["where"].fn(keep, 0.0, float("-inf")).to(like.dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            m = OPS["where"].fn(attn_mask, 0.0, float("-inf")).to(like.dtype)
        else:
            m = attn_mask
        bias = m if bias is None else bias + m
    return bias


def sdpa_scores(q, k, attn_mask, is_causal, scale):
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = q.matmul(k.transpose(-2, -1)) * sc
    bias = attention_bias(attn_mask, is_causal, q.shape[-2], k.shape[-2], q)
    return (s if bias is None else s + bias), sc


def _sdpa_fused_backward(grad, query, key, value, attn_mask, is_causal, scale, enable_gqa):
    """(dq, dk, dv) by ATen's fused attention backward (flash / memory-efficient on a GPU, flash on
    the CPU): the forward is recomputed by the fused kernel under torch's autograd -- its softmax
    statistics are not kept by the forward op -- and differentiated; the L x S scores are never
    materialised."""
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        out = TF.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
        return tuple(t.contiguous() for t in torch.autograd.grad(out, (q, k, v), grad))


def _sdpa_fused_backward_meta(grad, query, key, value, attn_mask, is_causal, scale, enable_gqa):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (query, key, value))


register("_sdpa_fused_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
         "bool is_causal, float? scale, bool enable_gqa) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
         _sdpa_fused_backward, meta=_sdpa_fused_backward_meta, tags=N, method=False, function=False,
         doc="The gradients of scaled_dot_product_attention w.r.t. query, key and value by ATen's fused "
             "backward (the forward recomputed by the fused kernel).")


def _sdpa_bwd(ctx, g):
    q, k, v, mask = ctx.query, ctx.key, ctx.value, ctx.attn_mask
    n = ctx.needs_input_grad
    if not _gm._state.enabled and not (n[3] and mask is not None and mask.is_floating_point()):
        # (a backward that records a graph -- create_graph=True, for a double backward -- and a mask
        # that needs its gradient take the recomputed scores below: ATen's fused backward has neither)
        gq, gk, gv = OPS["_sdpa_fused_backward"].fn(g, q, k, v, mask, ctx.is_causal, ctx.scale, ctx.enable_gqa)
        return (gq if n[0] else None), (gk if n[1] else None), (gv if n[2] else None), None
    hq = q.shape[-3] if q.dim() >= 3 else None
    gqa = ctx.enable_gqa and hq is not None and k.shape[-3] != hq
    ke, ve = (_expand_kv(k, hq), _expand_kv(v, hq)) if gqa else (k, v)
    s, sc = sdpa_scores(q, ke, mask, ctx.is_causal, ctx.scale)
    p = OPS["softmax"].fn(s, -1)
    gq = gk = gv = gm = None
    if n[2]:
        gv = p.transpose(-2, -1).matmul(g)
        gv = sum_to(_sum_kv(gv, v.shape[-3]) if gqa else gv, v.shape)
    if n[0] or n[1] or n[3]:
        gp = g.matmul(ve.transpose(-2, -1))
        gs = p * (gp - (gp * p).sum(-1, keepdim=True))
        if n[0]:
            gq = sum_to(gs.matmul(ke) * sc, q.shape)
        if n[1]:
            gk = gs.transpose(-2, -1).matmul(q) * sc
            gk = sum_to(_sum_kv(gk, k.shape[-3]) if gqa else gk, k.shape)
        if n[3] and mask is not None and mask.is_floating_point():
            gm = sum_to(gs, mask.shape)
    return gq, gk, gv, gm


def sdpa_composite(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Attention from tp ops: softmax(q kᵀ * scale + bias) (dropped out) @ v."""
    hq = query.shape[-3] if query.dim() >= 3 else None
    if enable_gqa and hq is not None and key.shape[-3] != hq:
        key, value = _expand_kv(key, hq), _expand_kv(value, hq)
    s, _ = sdpa_scores(query, key, attn_mask, is_causal, scale)
    p = OPS["softmax"].fn(s, -1)
    if dropout_p > 0:
        p = OPS["native_dropout"].fn(p, dropout_p, True)[0]
    return p.matmul(value)


register("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
         "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> Tensor", _sdpa_kernel,
         backward=_sdpa_bwd, save=("query", "key", "value", "attn_mask"), tags=N, method=False, function=False,
         decomp=lambda q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False:
         sdpa_composite(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa),
         doc="softmax(q kᵀ * scale + mask) @ v (scale = 1/sqrt(E) by default; a bool mask keeps True entries; "
             "is_causal masks j > i).  Dropout lives in nn.functional (composite).")
