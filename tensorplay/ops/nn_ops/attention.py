"""Scaled dot-product attention (chapter §1.2): ATen's fused kernel forward, which also returns the
softmax statistics (the natural-log logsumexp of each query row of scaled, masked scores), and
ATen's fused backward reading them (``_sdpa_backward``: flash on the CPU and for half dtypes on a GPU,
memory-efficient for float32 on a GPU),
so the backward never recomputes the forward.  Cases the fused kernels with statistics do not take
(an attention mask, grouped-query heads, fewer than 4 dims, an empty sequence) return an empty
statistics tensor and take ``_sdpa_fused_backward`` (the forward recomputed by the fused kernel);
a backward that records a graph (double backward) or a float mask that needs its gradient take the
scores recomputed with matmul + softmax (``sdpa_scores``).  ``sdpa_composite`` is the same attention
written in tp ops (``tensorplay.nn.functional`` uses it with dropout, so that forward and backward
share the mask).

**Layout contract.** A 4-D attention output (B, H, L, E) is laid out as (B, L, H, E) in memory
(strides of ``empty(B, L, H, E).transpose(1, 2)``): what the fused kernels write, and what the
model's next step (``y.transpose(1, 2).reshape(B, L, H·E)``) reads as a view.  A gradient of
query, key or value has its input's strides when that input is dense with unit last stride (the
usual q / k / v: views of one projection), contiguous otherwise.  Kernels whose result has other
strides are copied to the contract, so a meta value predicts the strides of every device.
"""
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
def _check_sdpa(query, key, value):
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError("query, key and value must have at least 2 dims (..., L, E)")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"incompatible shapes: query {list(query.shape)}, key {list(key.shape)}, "
                           f"value {list(value.shape)} (need query[-1] == key[-1] and key[-2] == value[-2])")


def keeps_stats(query, key, value, attn_mask) -> bool:
    """Does the forward return the softmax statistics (and the backward read them)?  For 4-D
    (B, H, L, E) operands of one floating dtype and one head size, no mask, as many key/value heads
    as query heads and non-empty sequences -- a rule on shapes and dtypes only, so a meta value answers as the device
    does."""
    return (attn_mask is None and query.dim() == 4 and key.dim() == 4 and value.dim() == 4
            and query.shape[1] == key.shape[1] == value.shape[1] and query.shape[0] == key.shape[0] == value.shape[0]
            and query.dtype in _STATS_DTYPES and key.dtype == value.dtype == query.dtype
            and query.shape[3] == value.shape[3] and query.shape[2] > 0 and key.shape[2] > 0 and query.shape[3] > 0)


_STATS_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _stats_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gpu_kernel(query):
    """The GPU kernel that keeps the statistics: flash attention for float16/bfloat16 (head dims a
    multiple of 8 up to 256), memory-efficient attention for float32 (a multiple of 8 up to 128),
    none otherwise (float64: the statistics by a math pass, the backward recomputing the forward)."""
    e = query.shape[-1]
    if query.dtype in (torch.float16, torch.bfloat16) and e % 8 == 0 and e <= 256:
        return "flash"
    if query.dtype == torch.float32 and e % 8 == 0 and e <= 128:
        return "efficient"
    return None


def _no_rng(device):
    """The (seed, offset) tensors of a dropout-free fused attention call (read only with dropout)."""
    return torch.zeros(2, dtype=torch.uint64, device=device), torch.zeros((), dtype=torch.uint64, device=device)


def _math_stats(query, key, is_causal, scale):
    sc = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    s = torch.matmul(query, key.transpose(-2, -1)).to(_stats_dtype(query.dtype)) * sc
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(s, -1)


def _blhe(out):
    """``out`` (B, H, L, E) in the (B, L, H, E) memory layout of the contract (a copy only when a
    kernel returned another layout); other ranks contiguous."""
    if out.dim() != 4:
        return out.contiguous()
    B, H, L, E = out.shape
    want = (L * H * E, E, H * E, 1)
    if all(a == b or n <= 1 for a, b, n in zip(out.stride(), want, out.shape)):
        return out
    return torch.empty((B, L, H, E), dtype=out.dtype, device=out.device).transpose(1, 2).copy_(out)


def _like_input(g, x):
    """A gradient ``g`` laid out like its input ``x`` (the contract's rule for dq / dk / dv): ``x``'s
    strides when ``x`` is dense; for a 4-D ``x`` that is a (B, L, H, E) view of a larger buffer (q, k,
    v split from one projection) the dense (B, L, H, E) layout; contiguous otherwise."""
    if x.dim() == 4 and x.stride(-1) == 1 and x.stride(1) < x.stride(2) and not _dense(x):
        return _blhe(g)
    want = x.stride() if _dense(x) else torch.empty(x.shape, device="meta").stride()
    if g.stride() == want:
        return g
    return torch.empty_strided(x.shape, want, dtype=x.dtype, device=x.device).copy_(g)


def _dense(x) -> bool:
    """Non-overlapping and dense (its elements fill its storage span exactly), unit last stride."""
    if not x.dim() or x.stride(-1) != 1:
        return x.is_contiguous()
    dims = sorted((st, n) for st, n in zip(x.stride(), x.shape) if n > 1)
    expect = 1
    for st, n in dims:
        if st != expect:
            return False
        expect *= n
    return True


def _sdpa_kernel(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    _check_sdpa(query, key, value)
    if not keeps_stats(query, key, value, attn_mask):
        out = TF.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _blhe(out), query.new_empty((0,), dtype=_stats_dtype(query.dtype))
    L = query.shape[2]
    if query.device.type == "meta":     # (shapes only: no guard on the GPU kernel's row padding)
        return (_blhe(torch.empty(query.shape, dtype=query.dtype, device="meta")),
                torch.empty(query.shape[:-1], dtype=_stats_dtype(query.dtype), device="meta"))
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                             scale=scale)
    elif _gpu_kernel(query) == "flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal, False,
                                                                      scale=scale)[:2]
    elif _gpu_kernel(query) == "efficient":
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, True, 0.0,
                                                                                is_causal, scale=scale)
        lse = lse[..., :L]          # (the kernel pads the rows to a multiple of 32)
    else:
        out = TF.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=scale)
        lse = _math_stats(query, key, is_causal, scale)
    return _blhe(out), lse.contiguous()


def _sdpa_backward(grad, query, key, value, output, logsumexp, is_causal, scale):
    """(dq, dk, dv) from the forward's output and statistics by ATen's fused backward."""
    if query.device.type == "cpu":
        gs = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, query, key, value, output, logsumexp, 0.0, is_causal, scale=scale)
    elif _gpu_kernel(query) == "flash":
        gs = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad.contiguous(), query, key, value, output, logsumexp, None, None, query.shape[2], key.shape[2], 0.0,
            is_causal, *_no_rng(query.device), scale=scale)
    elif _gpu_kernel(query) == "efficient":
        B, H, L = logsumexp.shape
        lse = logsumexp.new_full((B, H, -(-L // 32) * 32), float("inf"))
        lse[..., :L] = logsumexp
        zero = torch.zeros((), dtype=torch.int64, device=query.device)
        gs = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad.contiguous(), query, key, value, None, output, lse, zero, zero, 0.0, [True, True, True, False],
            is_causal, scale=scale)[:3]
    else:
        return _sdpa_fused_backward(grad, query, key, value, None, is_causal, scale, False)
    return tuple(_like_input(g, x) for g, x in zip(gs, (query, key, value)))


def _grads_meta(grad, query, key, value, *rest):
    """Meta of the two backward ops: (dq, dk, dv) shaped and strided as (query, key, value) by the
    layout contract."""
    return tuple(_like_input(torch.empty(t.shape, dtype=t.dtype, device="meta"), t) for t in (query, key, value))


register("_sdpa_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor output, Tensor logsumexp, "
         "bool is_causal, float? scale) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
         _sdpa_backward, meta=_grads_meta, tags=N, method=False, function=False,
         doc="The gradients of scaled_dot_product_attention w.r.t. query, key and value from the forward's "
             "output and softmax statistics, by ATen's fused backward.")


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
        return tuple(_like_input(g, x) for g, x in zip(torch.autograd.grad(out, (q, k, v), grad), (query, key, value)))


register("_sdpa_fused_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
         "bool is_causal, float? scale, bool enable_gqa) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
         _sdpa_fused_backward, meta=_grads_meta, tags=N, method=False, function=False,
         doc="The gradients of scaled_dot_product_attention w.r.t. query, key and value by ATen's fused "
             "backward (the forward recomputed by the fused kernel).")


def _sdpa_bwd(ctx, g, g_lse):
    # (the statistics output is internal -- nn.functional returns the attention alone -- and its
    # gradient, zeros, is not read)
    q, k, v, mask = ctx.query, ctx.key, ctx.value, ctx.attn_mask
    n = ctx.needs_input_grad
    if not _gm._state.enabled and not (n[3] and mask is not None and mask.is_floating_point()):
        # (a backward that records a graph -- create_graph=True, for a double backward -- and a mask
        # that needs its gradient take the recomputed scores below: ATen's fused backward has neither)
        out, lse = ctx.result
        if lse.numel():
            gq, gk, gv = OPS["_sdpa_backward"].fn(g, q, k, v, out, lse, ctx.is_causal, ctx.scale)
        else:
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


def _sdpa_decomp(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    out = sdpa_composite(q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)
    if not keeps_stats(q, k, v, attn_mask):
        return out, OPS["_empty"].fn([0], dtype=_stats_dtype(q.dtype), device=q.device)
    s, _ = sdpa_scores(q, k, None, is_causal, scale)
    return out, s.to(_stats_dtype(q.dtype)).logsumexp(-1)


register("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
         "bool is_causal=False, float? scale=None, bool enable_gqa=False) -> (Tensor output, Tensor logsumexp)",
         _sdpa_kernel, backward=_sdpa_bwd, save=("query", "key", "value", "attn_mask", "result"),
         tags=N, method=False, function=False, decomp=_sdpa_decomp,
         doc="softmax(q kᵀ * scale + mask) @ v (scale = 1/sqrt(E) by default; a bool mask keeps True entries; "
             "is_causal masks j > i), and the logsumexp of each row of the scaled scores when the fused kernel "
             "keeps it (empty otherwise: keeps_stats).  Dropout lives in nn.functional (composite).")
