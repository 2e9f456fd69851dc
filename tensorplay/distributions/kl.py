"""``kl_divergence(p, q)`` and ``register_kl``: closed-form KL(p ‖ q) looked up by the pair of types.

``register_kl(TypeP, TypeQ)`` decorates a function ``(p, q) -> KL``; lookup picks, among the registered
pairs that ``(type(p), type(q))`` are subclasses of, the most specific one (PyTorch's rule: the
minimum by subclass order, ambiguity warned about), caching the choice.  A pair without a rule
raises ``NotImplementedError``.  Registered here: Normal, Bernoulli, Categorical, OneHotCategorical,
Beta, Gamma, Exponential, Laplace, Poisson, Uniform, Dirichlet, Geometric, Binomial, Cauchy, Gumbel,
HalfNormal, Pareto, MultivariateNormal, Independent and TransformedDistribution (same transforms)
pairs, with PyTorch's formulas (including ``inf`` where q does not cover p's support).
"""
from __future__ import annotations

import math
import warnings
from functools import total_ordering

import torch

import tensorplay as tp

from .continuous import Beta, Cauchy, Dirichlet, Exponential, Gamma, Laplace, Normal, Uniform
from .derived import _EULER, Gumbel, HalfNormal, Pareto
from .discrete import Bernoulli, Binomial, Categorical, Geometric, OneHotCategorical, Poisson
from .distribution import Distribution
from .multivariate import Independent, MultivariateNormal, _solve_lower
from .transforms import TransformedDistribution
from .utils import sum_rightmost

__all__ = ["kl_divergence", "register_kl"]

_KL_REGISTRY: dict = {}
_KL_MEMOIZE: dict = {}


def register_kl(type_p, type_q):
    if not (isinstance(type_p, type) and issubclass(type_p, Distribution)):
        raise TypeError(f"Expected type_p to be a Distribution subclass but got {type_p}")
    if not (isinstance(type_q, type) and issubclass(type_q, Distribution)):
        raise TypeError(f"Expected type_q to be a Distribution subclass but got {type_q}")

    def decorator(fn):
        _KL_REGISTRY[type_p, type_q] = fn
        _KL_MEMOIZE.clear()
        return fn
    return decorator


@total_ordering
class _Match:
    def __init__(self, *types):
        self.types = types

    def __eq__(self, other):
        return self.types == other.types

    def __le__(self, other):
        return all(issubclass(x, y) for x, y in zip(self.types, other.types))


def _dispatch_kl(type_p, type_q):
    matches = [(p, q) for p, q in _KL_REGISTRY if issubclass(type_p, p) and issubclass(type_q, q)]
    if not matches:
        return NotImplemented
    left_p, left_q = min(_Match(*m) for m in matches).types
    right_q, right_p = min(_Match(*reversed(m)) for m in matches).types
    left, right = _KL_REGISTRY[left_p, left_q], _KL_REGISTRY[right_p, right_q]
    if left is not right:
        warnings.warn(f"Ambiguous kl_divergence({type_p.__name__}, {type_q.__name__}). Please register_kl"
                      f"({left_p.__name__}, {right_q.__name__})", RuntimeWarning, stacklevel=3)
    return left


def kl_divergence(p, q):
    key = (type(p), type(q))
    if key not in _KL_MEMOIZE:
        _KL_MEMOIZE[key] = _dispatch_kl(*key)
    fn = _KL_MEMOIZE[key]
    if fn is NotImplemented:
        raise NotImplementedError(f"No KL(p || q) is implemented for p type {type(p).__name__} and q type "
                                  f"{type(q).__name__}")
    return fn(p, q)


def _inf_like(x):
    return tp.full(tuple(x.shape), math.inf, dtype=x.dtype, device=x.device)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    t1 = p.probs * (tp.nn.functional.softplus(-q.logits) - tp.nn.functional.softplus(-p.logits))
    t1 = tp.where(q.probs == 0, math.inf, t1)
    t1 = tp.where(p.probs == 0, 0.0, t1)
    t2 = (1 - p.probs) * (tp.nn.functional.softplus(q.logits) - tp.nn.functional.softplus(p.logits))
    t2 = tp.where(q.probs == 1, math.inf, t2)
    t2 = tp.where(p.probs == 1, 0.0, t2)
    return t1 + t2


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = tp.where(q.probs == 0, math.inf, t)
    t = tp.where(p.probs == 0, 0.0, t)
    return t.sum(-1)


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehot_onehot(p, q):
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Beta, Beta)
def _kl_beta_beta(p, q):
    sum_p = p.concentration1 + p.concentration0
    sum_q = q.concentration1 + q.concentration0
    t1 = tp.lgamma(q.concentration1) + tp.lgamma(q.concentration0) + tp.lgamma(sum_p)
    t2 = tp.lgamma(p.concentration1) + tp.lgamma(p.concentration0) + tp.lgamma(sum_q)
    t3 = (p.concentration1 - q.concentration1) * tp.digamma(p.concentration1)
    t4 = (p.concentration0 - q.concentration0) * tp.digamma(p.concentration0)
    t5 = (sum_q - sum_p) * tp.digamma(sum_p)
    return t1 - t2 + t3 + t4 + t5


@register_kl(Dirichlet, Dirichlet)
def _kl_dirichlet_dirichlet(p, q):
    sum_p = p.concentration.sum(-1)
    sum_q = q.concentration.sum(-1)
    t1 = tp.lgamma(sum_p) - tp.lgamma(sum_q)
    t2 = (tp.lgamma(p.concentration) - tp.lgamma(q.concentration)).sum(-1)
    t3 = p.concentration - q.concentration
    t4 = tp.digamma(p.concentration) - tp.digamma(sum_p).unsqueeze(-1)
    return t1 - t2 + (t3 * t4).sum(-1)


@register_kl(Gamma, Gamma)
def _kl_gamma_gamma(p, q):
    t1 = q.concentration * (p.rate / q.rate).log()
    t2 = tp.lgamma(q.concentration) - tp.lgamma(p.concentration)
    t3 = (p.concentration - q.concentration) * tp.digamma(p.concentration)
    t4 = (q.rate - p.rate) * (p.concentration / p.rate)
    return t1 + t2 + t3 + t4


@register_kl(Exponential, Exponential)
def _kl_exponential_exponential(p, q):
    rate_ratio = q.rate / p.rate
    return rate_ratio - 1 - rate_ratio.log()


@register_kl(Laplace, Laplace)
def _kl_laplace_laplace(p, q):
    scale_ratio = p.scale / q.scale
    loc_abs_diff = (p.loc - q.loc).abs()
    t1 = -scale_ratio.log()
    t2 = loc_abs_diff / q.scale
    t3 = scale_ratio * (-loc_abs_diff / p.scale).exp()
    return t1 + t2 + t3 - 1


@register_kl(Poisson, Poisson)
def _kl_poisson_poisson(p, q):
    return p.rate * (p.rate.log() - q.rate.log()) - (p.rate - q.rate)


@register_kl(Geometric, Geometric)
def _kl_geometric_geometric(p, q):
    return -p.entropy() - (-q.probs).log1p() / p.probs - q.logits


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return tp.where((q.low > p.low) | (q.high < p.high), math.inf, result)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_mvn_mvn(p, q):
    if p.event_shape != q.event_shape:
        raise ValueError("KL-divergence between two Multivariate Normals with different event shapes cannot be "
                         "computed")
    lp, lq = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    half_term1 = lq.diagonal(0, -2, -1).log().sum(-1) - lp.diagonal(0, -2, -1).log().sum(-1)
    n = p.event_shape[0]
    # trace(Σq⁻¹ Σp) = |Lq⁻¹ Lp|²_F, Mahalanobis term |Lq⁻¹ (μq - μp)|²
    batch = tuple(p.batch_shape if len(p.batch_shape) >= len(q.batch_shape) else q.batch_shape)
    shape = tuple(torch.broadcast_shapes(lq.shape[:-2], lp.shape[:-2])) + (n, n)
    m = _solve_lower(lq.expand(shape), lp.expand(shape))
    term2 = (m * m).sum((-2, -1))
    y = _solve_lower(lq, (q.loc - p.loc).unsqueeze(-1)).squeeze(-1)
    term3 = (y * y).sum(-1)
    out = half_term1 + 0.5 * (term2 + term3 - n)
    return out.expand(batch) if len(batch) else out


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError
    return sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@register_kl(Binomial, Binomial)
def _kl_binomial_binomial(p, q):
    if bool((p.total_count < q.total_count).any()):
        raise NotImplementedError("KL between Binomials where q.total_count > p.total_count is not implemented")
    kl = p.total_count * (p.probs * (p.logits - q.logits) + (-p.probs).log1p() - (-q.probs).log1p())
    return tp.where(p.total_count > q.total_count, math.inf, kl)


@register_kl(Cauchy, Cauchy)
def _kl_cauchy_cauchy(p, q):
    t1 = ((p.scale + q.scale).pow(2) + (p.loc - q.loc).pow(2)).log()
    return t1 - (4 * p.scale * q.scale).log()


@register_kl(Gumbel, Gumbel)
def _kl_gumbel_gumbel(p, q):
    ct1, ct2, ct3 = p.scale / q.scale, q.loc / q.scale, p.loc / q.scale
    t1 = -ct1.log() - ct2 + ct3
    t2 = ct1 * _EULER
    t3 = (ct2 + tp.lgamma(1 + ct1) - ct3).exp()
    return t1 + t2 + t3 - (1 + _EULER)


@register_kl(HalfNormal, HalfNormal)
def _kl_halfnormal_halfnormal(p, q):
    return _kl_normal_normal(p.base_dist, q.base_dist)


@register_kl(Pareto, Pareto)
def _kl_pareto_pareto(p, q):
    alpha_ratio = q.alpha / p.alpha
    result = q.alpha * (p.scale / q.scale).log() - alpha_ratio.log() + alpha_ratio - 1
    return tp.where(p.scale < q.scale, math.inf, result)


@register_kl(TransformedDistribution, TransformedDistribution)
def _kl_transformed_transformed(p, q):
    if p.transforms != q.transforms or p.event_shape != q.event_shape:
        raise NotImplementedError
    return kl_divergence(p.base_dist, q.base_dist)
