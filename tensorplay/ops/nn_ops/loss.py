"""Losses (chapter §1.2): mse, l1, smooth_l1, huber, nll, cross_entropy, binary cross entropy (with
logits) and kl_div.  ``reduction`` is ``'none' | 'mean' | 'sum'``; the class dimension of a loss
input is 1 (0 for an unbatched input).  Derivatives are tp formulas, except nll_loss's, which is the
table op ``nll_loss_backward``."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .._helpers import sgn, sum_to
from ...autograd import grad_mode as _gm
from ..registry import OPS, register
from ._common import LOSS, _bcast_channel, _reduction_enum, aten


# =================================================================================================
# losses
# =================================================================================================
def _bcast_pair(a, b):
    if a.shape != b.shape:
        a, b = torch.broadcast_tensors(a, b)
    return a, b


def _reduce_grad(g, reduction, numel):
    """The per-element factor of a reduced loss' gradient: g (none/sum) or g / numel (mean)."""
    return g / numel if reduction == "mean" else g


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _pointwise_loss_bwd(dfn):
    """Backward of loss = reduce(f(self - target)) given f' = dfn(diff)."""
    def bwd(ctx, g):
        x, t = ctx.self, ctx.target
        d = x - t
        gd = _reduce_grad(g, ctx.reduction, _numel(torch.broadcast_shapes(x.shape, t.shape))) * dfn(d)
        n = ctx.needs_input_grad
        return (sum_to(gd, x.shape) if n[0] else None, sum_to(-gd, t.shape) if n[1] else None)
    return bwd


def _mse_kernel(self, target, reduction):
    a, b = _bcast_pair(self, target)
    return aten.mse_loss(a, b, _reduction_enum(reduction))


def _l1_kernel(self, target, reduction):
    a, b = _bcast_pair(self, target)
    return aten.l1_loss(a, b, _reduction_enum(reduction))


register("mse_loss(Tensor self, Tensor target, str reduction='mean') -> Tensor", _mse_kernel,
         backward=_pointwise_loss_bwd(lambda d: 2 * d), save=("self", "target"), tags=LOSS, method=False,
         doc="(self - target)^2, reduced.")
register("l1_loss(Tensor self, Tensor target, str reduction='mean') -> Tensor", _l1_kernel,
         backward=_pointwise_loss_bwd(sgn), save=("self", "target"), tags=LOSS, method=False,
         doc="|self - target|, reduced (gradient sign(self - target), 0 at ties; complex: sgn).")


def _smooth_l1_kernel(self, target, reduction, beta):
    a, b = _bcast_pair(self, target)
    return aten.smooth_l1_loss(a, b, _reduction_enum(reduction), beta)


def _smooth_l1_bwd(ctx, g):
    beta = ctx.beta
    if beta == 0:
        return _pointwise_loss_bwd(lambda d: d.sign())(ctx, g)
    return _pointwise_loss_bwd(lambda d: (d / beta).clamp(-1.0, 1.0))(ctx, g)


def _huber_kernel(self, target, reduction, delta):
    a, b = _bcast_pair(self, target)
    return aten.huber_loss(a, b, _reduction_enum(reduction), delta)


register("smooth_l1_loss(Tensor self, Tensor target, str reduction='mean', float beta=1.0) -> Tensor",
         _smooth_l1_kernel, backward=_smooth_l1_bwd, save=("self", "target"), tags=LOSS, method=False,
         doc="0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = self - target), reduced.")
register("huber_loss(Tensor self, Tensor target, str reduction='mean', float delta=1.0) -> Tensor",
         _huber_kernel, backward=lambda ctx, g: _pointwise_loss_bwd(lambda d: d.clamp(-ctx.delta, ctx.delta))(ctx, g),
         save=("self", "target"), tags=LOSS, method=False,
         doc="0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta) (d = self - target), reduced.")


# ---- nll_loss ------------------------------------------------------------------------------------
def _class_dim(ndim):
    return 1 if ndim >= 2 else 0


def _nll_kernel(self, target, weight, reduction, ignore_index):
    return TF.nll_loss(self, target, weight, reduction=reduction, ignore_index=ignore_index)


def _nll_backward_kernel(grad_output, target, weight, input_size, reduction, ignore_index):
    cd = _class_dim(len(input_size))
    valid = target != ignore_index
    t = torch.where(valid, target, torch.zeros((), dtype=target.dtype, device=target.device))
    dtype = grad_output.dtype
    wt = weight.to(dtype)[t] if weight is not None else torch.ones(t.shape, dtype=dtype, device=t.device)
    wt = wt * valid
    if reduction == "mean":
        coef = -(wt / wt.sum()) * grad_output
    else:
        _reduction_enum(reduction)
        coef = -wt * grad_output
    gi = torch.zeros(list(input_size), dtype=dtype, device=target.device)
    return gi.scatter_(cd, t.unsqueeze(cd), coef.unsqueeze(cd).to(device=target.device, dtype=dtype))


def _nll_bwd(ctx, g):
    return (OPS["nll_loss_backward"].fn(g, ctx.target, ctx.weight, list(ctx.self.shape), ctx.reduction,
                                        ctx.ignore_index), None, None)


register("nll_loss(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean', int ignore_index=-100) "
         "-> Tensor", _nll_kernel, backward=_nll_bwd, save=("target", "weight"), tags=LOSS, method=False,
         doc="-weight[t] * self[t] over samples (class dim 1), ignoring target == ignore_index; 'mean' divides by "
             "the total weight of the counted samples.")
register("nll_loss_backward(Tensor grad_output, Tensor target, Tensor? weight, int[] input_size, str reduction, "
         "int ignore_index) -> Tensor", _nll_backward_kernel,
         backward=lambda ctx, gg: (OPS["nll_loss"].fn(gg, ctx.target, ctx.weight, ctx.reduction, ctx.ignore_index),
                                   None, None),
         save=("target", "weight"), tags=LOSS, method=False, function=False,
         doc="Gradient of nll_loss w.r.t. its input (nll_loss is linear, so its derivative w.r.t. grad_output "
             "is nll_loss again).")


# ---- cross_entropy -------------------------------------------------------------------------------
def _ce_kernel(self, target, weight, reduction, ignore_index, label_smoothing):
    loss = TF.cross_entropy(self, target, weight, reduction=reduction, ignore_index=ignore_index,
                            label_smoothing=label_smoothing)
    # the row statistics, kept for the backward (an integer input raises in cross_entropy above)
    return loss, torch.logsumexp(self, _class_dim(self.dim()), keepdim=True)


def _ce_bwd(ctx, g, g_lse):
    # (the statistics output is internal -- nn.functional returns the loss alone -- and its
    # gradient, zeros, is not read)
    x, target, w = ctx.self, ctx.target, ctx.weight
    cd = _class_dim(x.dim())
    nclass = x.shape[cd]
    eps = ctx.label_smoothing
    red = ctx.reduction
    n = ctx.needs_input_grad
    # log_softmax as x - logsumexp(x): the forward's row statistics (one pass over x for dx), or,
    # in a backward that records a graph (create_graph, for a double backward), recomputed from x
    # so that the graph differentiates through them (the statistics output's own gradient stays zero)
    lsm = x - (OPS["logsumexp"].fn(x, [cd], True) if _gm._state.enabled else ctx.result[1])
    gs = g.unsqueeze(cd) if red == "none" else g   # per-sample gradient, broadcast along the class dim
    wb = _bcast_channel(w, x.dim(), cd) if w is not None else None
    gt = None
    if target.is_floating_point():  # class probabilities
        if red == "mean":
            gs = gs / (_numel(x.shape) // max(nclass, 1))
        tt = target * (1 - eps) + eps / nclass if eps > 0 else target
        g_lsm = -(tt * wb if wb is not None else tt) * gs
        if n[1]:
            gt = -(lsm * wb if wb is not None else lsm) * gs
            if eps > 0:
                gt = gt * (1 - eps)
    else:
        g_lsm = OPS["nll_loss_backward"].fn(g, target, w, list(x.shape), red, ctx.ignore_index)
        if eps > 0:
            g_lsm = g_lsm * (1 - eps)
            # smooth term: -(eps / C) * sum_c w_c lsm_c per counted sample, reduced like nll_loss
            # counted_i = 1 for target_i != ignore_index (nll_loss of -1 with no weight), 'mean' divides
            # by the total weight of the counted samples (nll_loss of -1 with the weight, summed)
            minus_one = x.new_full(list(x.shape), -1.0)
            counted = OPS["nll_loss"].fn(minus_one, target, None, "none", ctx.ignore_index)
            coef = counted.unsqueeze(cd) * gs
            if red == "mean":
                coef = coef / OPS["nll_loss"].fn(minus_one, target, w, "sum", ctx.ignore_index)
            g_lsm = g_lsm - (eps / nclass) * (coef * wb if wb is not None else coef)
    gx = g_lsm - lsm.exp() * g_lsm.sum(cd, keepdim=True) if n[0] else None
    return gx, gt, None


register("cross_entropy(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean', "
         "int ignore_index=-100, float label_smoothing=0.0) -> (Tensor output, Tensor logsumexp)", _ce_kernel,
         backward=_ce_bwd, save=("self", "target", "weight", "result"), tags=LOSS, method=False, function=False,
         decomp=lambda self, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0:
         (_ce_decomp(self, target, weight, reduction, ignore_index, label_smoothing),
          OPS["logsumexp"].fn(self, [_class_dim(self.dim())], True)),
         doc="log_softmax over the class dim (1) followed by nll_loss (class-index target) or by "
             "-sum(weight * target * log_softmax) (class-probability target); label_smoothing mixes the "
             "target with the uniform distribution.  Also returns the logsumexp of each row over the class "
             "dim (keepdim), which the backward reads.")


def _ce_decomp(x, target, weight, reduction, ignore_index, label_smoothing):
    cd = _class_dim(x.dim())
    nclass = x.shape[cd]
    lsm = OPS["log_softmax"].fn(x, cd)
    wb = _bcast_channel(weight, x.dim(), cd) if weight is not None else None
    if target.is_floating_point():
        tt = target * (1 - label_smoothing) + label_smoothing / nclass if label_smoothing > 0 else target
        per = -((lsm * tt * wb) if wb is not None else lsm * tt).sum(cd)
        if reduction == "none":
            return per
        return per.sum() / (_numel(x.shape) // nclass) if reduction == "mean" else per.sum()
    nll = OPS["nll_loss"].fn(lsm, target, weight, reduction, ignore_index)
    if label_smoothing <= 0:
        return nll
    minus_one = x.new_full(list(x.shape), -1.0)
    smooth = -(lsm * wb if wb is not None else lsm).sum(cd) * OPS["nll_loss"].fn(minus_one, target, None, "none",
                                                                               ignore_index)
    if reduction == "mean":
        smooth = smooth.sum() / OPS["nll_loss"].fn(minus_one, target, weight, "sum", ignore_index)
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / nclass)


# ---- binary cross entropy ------------------------------------------------------------------------
def _bce_kernel(self, target, weight, reduction):
    return TF.binary_cross_entropy(self, target, weight, reduction=reduction)


def _bce_bwd(ctx, g):
    x, t, w = ctx.self, ctx.target, ctx.weight
    n = ctx.needs_input_grad
    gs = _reduce_grad(g, ctx.reduction, _numel(x.shape))
    if w is not None:
        gs = gs * w
    gx = gt = None
    if n[0]:
        gx = sum_to(gs * (x - t) / ((1 - x) * x).clamp_min(1e-12), x.shape)
    if n[1]:
        gt = sum_to(gs * ((1 - x).log().clamp_min(-100.0) - x.log().clamp_min(-100.0)), t.shape)
    return gx, gt, None


register("binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, str reduction='mean') -> Tensor",
         _bce_kernel, backward=_bce_bwd, save=("self", "target", "weight"), tags=LOSS, method=False,
         doc="-weight * (t log x + (1 - t) log(1 - x)) with the logs clamped at -100, reduced.")


def _bce_logits_kernel(self, target, weight, pos_weight, reduction):
    return TF.binary_cross_entropy_with_logits(self, target, weight, reduction=reduction, pos_weight=pos_weight)


def _bce_logits_bwd(ctx, g):
    x, t, w, pw = ctx.self, ctx.target, ctx.weight, ctx.pos_weight
    n = ctx.needs_input_grad
    shape = torch.broadcast_shapes(x.shape, t.shape)
    gs = _reduce_grad(g, ctx.reduction, _numel(shape))
    if w is not None:
        gs = gs * w
    gx = gt = None
    if n[0]:
        s = x.sigmoid()
        d = s * (pw * t + 1 - t) - pw * t if pw is not None else s - t
        gx = sum_to(gs * d, x.shape)
    if n[1]:
        # d/dt = -[(pw - 1) log sigmoid(x) + x];  log sigmoid(x) = -softplus(-x)
        d = x if pw is None else x - (pw - 1) * (-x).softplus()
        gt = sum_to(-gs * d, t.shape)
    return gx, gt, None, None


register("binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None, Tensor? pos_weight=None, "
         "str reduction='mean') -> Tensor", _bce_logits_kernel, backward=_bce_logits_bwd,
         save=("self", "target", "weight", "pos_weight"), tags=LOSS, method=False,
         doc="binary_cross_entropy(sigmoid(self), target) computed stably; pos_weight weighs the positive term.")


def _kl_div_kernel(self, target, reduction, log_target):
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")
    return TF.kl_div(self, target, reduction=reduction, log_target=log_target)


def _kl_div_bwd(ctx, g):
    x, t = ctx.self, ctx.target
    red = ctx.reduction
    shape = torch.broadcast_shapes(x.shape, t.shape)
    if red == "batchmean":
        gs = g / (x.shape[0] if x.dim() else 1)
    else:
        gs = _reduce_grad(g, red, _numel(shape))
    n = ctx.needs_input_grad
    gx = gt = None
    if ctx.log_target:
        et = t.exp()
        if n[0]:
            gx = sum_to(-gs * et, x.shape)
        if n[1]:
            gt = sum_to(gs * et * (t + 1 - x), t.shape)
    else:
        if n[0]:
            gx = sum_to(-gs * t, x.shape)
        if n[1]:
            pos = t > 0
            safe = OPS["where"].fn(pos, t, 1.0)
            gt = sum_to(OPS["where"].fn(pos, gs * (safe.log() + 1 - x), 0.0), t.shape)
    return gx, gt


register("kl_div(Tensor self, Tensor target, str reduction='mean', bool log_target=False) -> Tensor",
         _kl_div_kernel, backward=_kl_div_bwd, save=("self", "target"), tags=LOSS, method=False,
         doc="target * (log target - self) pointwise (self holds log-probabilities), reduced; 'batchmean' "
             "divides the sum by the batch size.")
