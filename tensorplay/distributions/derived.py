"""Distributions built from the others: HalfNormal, HalfCauchy, Gumbel, Weibull, Pareto, Kumaraswamy
(transforms of a base distribution), FisherSnedecor (a ratio of Gammas), NegativeBinomial (a
Gamma-Poisson mixture), ContinuousBernoulli and MixtureSameFamily.

PyTorch's parameterisations, constraints and formulas: values equal ``torch.distributions``.  The
transformed ones sample by transforming their base's draws (so ``rsample`` is reparameterised) and
score by the change-of-variables formula, except where PyTorch writes ``log_prob`` out (HalfNormal,
HalfCauchy and Gumbel: the same closed forms here).  ``MixtureSameFamily(mixture, components)`` mixes
the components along their rightmost batch dim with a Categorical's weights; ``log_prob`` is a
logsumexp over the components, ``sample`` picks each draw's component (no ``rsample``).
"""
from __future__ import annotations

import math

import torch

import tensorplay as tp

from . import constraints
from .continuous import Cauchy, Exponential, Gamma, Normal, Uniform
from .discrete import Categorical, _ProbsOrLogits
from .distribution import Distribution
from .transforms import AffineTransform, ExpTransform, PowerTransform, Transform, TransformedDistribution
from .utils import broadcast_all, clamp_probs, lazy_property

__all__ = ["AbsTransform", "HalfNormal", "HalfCauchy", "Gumbel", "Weibull", "Pareto", "NegativeBinomial",
           "MixtureSameFamily", "FisherSnedecor", "Kumaraswamy", "ContinuousBernoulli"]

_EULER = 0.57721566490153286060


class AbsTransform(Transform):
    bijective = False
    codomain = constraints.positive

    def _call(self, x):
        return x.abs()

    def _inverse(self, y):
        return y


class _Half(TransformedDistribution):
    """|X| for a base X symmetric about 0: twice the base density on [0, inf)."""
    support = constraints.nonnegative
    has_rsample = True

    def _init_half(self, base, validate_args):
        TransformedDistribution.__init__(self, base, AbsTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(type(self), _instance))

    scale = property(lambda self: self.base_dist.scale)
    mode = property(lambda self: tp.zeros_like(self.scale))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        lp = self.base_dist.log_prob(value) + math.log(2)
        return tp.where(value >= 0, lp, -math.inf)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 2 * self.base_dist.cdf(value) - 1

    def icdf(self, prob):
        return self.base_dist.icdf((prob + 1) / 2)

    def entropy(self):
        return self.base_dist.entropy() - math.log(2)


class HalfNormal(_Half):
    arg_constraints = {"scale": constraints.positive}

    def __init__(self, scale, validate_args=None):
        self._init_half(Normal(0, scale, validate_args=False), validate_args)

    mean = property(lambda self: self.scale * math.sqrt(2 / math.pi))
    variance = property(lambda self: self.scale.pow(2) * (1 - 2 / math.pi))


class HalfCauchy(_Half):
    arg_constraints = {"scale": constraints.positive}

    def __init__(self, scale, validate_args=None):
        self._init_half(Cauchy(0, scale, validate_args=False), validate_args)

    mean = property(lambda self: tp.full(tuple(self._batch_shape), math.inf, dtype=self.scale.dtype))
    variance = mean


class Gumbel(TransformedDistribution):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        fi = torch.finfo(self.loc.dtype)
        base = Uniform(tp.full_like(self.loc, fi.tiny), tp.full_like(self.loc, 1 - fi.eps), validate_args=validate_args)
        transforms = [ExpTransform().inv, AffineTransform(0, -tp.ones_like(self.scale)), ExpTransform().inv,
                      AffineTransform(self.loc, -self.scale)]
        super().__init__(base, transforms, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gumbel, _instance)
        new.loc, new.scale = self.loc.expand(batch_shape), self.scale.expand(batch_shape)
        return super().expand(batch_shape, new)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (self.loc - value) / self.scale
        return (y - y.exp()) - self.scale.log()

    mean = property(lambda self: self.loc + self.scale * _EULER)
    mode = property(lambda self: self.loc)
    stddev = property(lambda self: (math.pi / math.sqrt(6)) * self.scale)
    variance = property(lambda self: self.stddev.pow(2))

    def entropy(self):
        return self.scale.log() + (1 + _EULER)


class Weibull(TransformedDistribution):
    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, scale, concentration, validate_args=None):
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self.concentration_reciprocal = self.concentration.reciprocal()
        base = Exponential(tp.ones_like(self.scale), validate_args=validate_args)
        transforms = [PowerTransform(exponent=self.concentration_reciprocal), AffineTransform(loc=0, scale=self.scale)]
        super().__init__(base, transforms, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Weibull, _instance)
        new.scale, new.concentration = self.scale.expand(batch_shape), self.concentration.expand(batch_shape)
        new.concentration_reciprocal = new.concentration.reciprocal()
        base = self.base_dist.expand(batch_shape)
        transforms = [PowerTransform(exponent=new.concentration_reciprocal), AffineTransform(loc=0, scale=new.scale)]
        TransformedDistribution.__init__(new, base, transforms, validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: self.scale * tp.lgamma(1 + self.concentration_reciprocal).exp())

    @property
    def mode(self):
        c = self.concentration
        return self.scale * ((c - 1) / c) ** c.reciprocal()

    @property
    def variance(self):
        r = self.concentration_reciprocal
        return self.scale.pow(2) * (tp.lgamma(1 + 2 * r).exp() - (2 * tp.lgamma(1 + r)).exp())

    def entropy(self):
        return _EULER * (1 - self.concentration_reciprocal) + (self.scale * self.concentration_reciprocal).log() + 1


class Pareto(TransformedDistribution):
    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}

    def __init__(self, scale, alpha, validate_args=None):
        self.scale, self.alpha = broadcast_all(scale, alpha)
        base = Exponential(self.alpha, validate_args=validate_args)
        super().__init__(base, [ExpTransform(), AffineTransform(loc=0, scale=self.scale)], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Pareto, _instance)
        new.scale, new.alpha = self.scale.expand(batch_shape), self.alpha.expand(batch_shape)
        base = self.base_dist.expand(batch_shape)
        TransformedDistribution.__init__(new, base, [ExpTransform(), AffineTransform(loc=0, scale=new.scale)],
                                         validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.greater_than_eq(self.scale)

    @property
    def mean(self):
        a = self.alpha.clamp(min=1)
        return a * self.scale / (a - 1)

    mode = property(lambda self: self.scale)

    @property
    def variance(self):
        a = self.alpha.clamp(min=2)
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    def entropy(self):
        return (self.scale / self.alpha).log() + (1 + self.alpha.reciprocal())


class NegativeBinomial(_ProbsOrLogits):
    arg_constraints = {"total_count": constraints.greater_than_eq(0), "probs": constraints.half_open_interval(0.0, 1.0),
                       "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, total_count, probs=None, logits=None, validate_args=None):
        self._init_pl(probs, logits, {"total_count": total_count}, validate_args)
        self.total_count = self.total_count.type_as(getattr(self, self._given))

    mean = property(lambda self: self.total_count * self.logits.exp())
    mode = property(lambda self: ((self.total_count - 1) * self.logits.exp()).floor().clamp(min=0.0))
    variance = property(lambda self: self.mean / (-self.logits).sigmoid())

    def sample(self, sample_shape=torch.Size()):
        with tp.no_grad():
            rate = Gamma(self.total_count, (-self.logits).exp(), validate_args=False).sample(sample_shape)
            return tp.ops.OPS["poisson"].fn(rate)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logsig = tp.nn.functional.logsigmoid
        n = self.total_count
        log_unnormalized = n * logsig(-self.logits) + value * logsig(self.logits)
        log_norm = -tp.lgamma(n + value) + tp.lgamma(1.0 + value) + tp.lgamma(n)
        log_norm = tp.where(n + value == 0.0, 0.0, log_norm)
        return log_unnormalized - log_norm


class MixtureSameFamily(Distribution):
    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, mixture_distribution, component_distribution, validate_args=None):
        if not isinstance(mixture_distribution, Categorical):
            raise ValueError(" The Mixture distribution needs to be an instance of torch.distributions.Categorical")
        if not isinstance(component_distribution, Distribution):
            raise ValueError("The Component distribution need to be an instance of torch.distributions.Distribution")
        mbs, cbs = mixture_distribution.batch_shape, component_distribution.batch_shape[:-1]
        for a, b in zip(reversed(mbs), reversed(cbs)):
            if a != 1 and b != 1 and a != b:
                raise ValueError(f"`mixture_distribution.batch_shape` ({mbs}) is not compatible with "
                                 f"`component_distribution.batch_shape`({cbs})")
        k = mixture_distribution.logits.shape[-1]
        if k != component_distribution.batch_shape[-1]:
            raise ValueError(f"`mixture_distribution component` ({k}) does not equal `component_distribution."
                             f"batch_shape[-1]` ({component_distribution.batch_shape[-1]})")
        self._mixture_distribution = mixture_distribution
        self._component_distribution = component_distribution
        self._num_component = k
        self._event_ndims = len(component_distribution.event_shape)
        super().__init__(cbs, component_distribution.event_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        comp = self._component_distribution.expand(batch_shape + (self._num_component,))
        mix = self._mixture_distribution.expand(batch_shape)
        new = self._get_checked_instance(MixtureSameFamily, _instance)
        MixtureSameFamily.__init__(new, mix, comp, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property
    def support(self):
        return self._component_distribution.support

    mixture_distribution = property(lambda self: self._mixture_distribution)
    component_distribution = property(lambda self: self._component_distribution)

    def _pad_mixture_dims(self, x):
        dist_batch_ndims = len(self.batch_shape)
        cat_batch_ndims = len(self._mixture_distribution.batch_shape)
        pad = 0 if cat_batch_ndims == 1 else dist_batch_ndims - cat_batch_ndims
        shape = tuple(x.shape)
        return x.reshape(shape[:-1] + (1,) * pad + shape[-1:] + (1,) * self._event_ndims)

    def _pad(self, x):
        return x.unsqueeze(-1 - self._event_ndims)

    @property
    def mean(self):
        probs = self._pad_mixture_dims(self._mixture_distribution.probs)
        return (probs * self._component_distribution.mean).sum(-1 - self._event_ndims)

    @property
    def variance(self):
        probs = self._pad_mixture_dims(self._mixture_distribution.probs)
        d = -1 - self._event_ndims
        mean_cond_var = (probs * self._component_distribution.variance).sum(d)
        var_cond_mean = (probs * (self._component_distribution.mean - self._pad(self.mean)).pow(2.0)).sum(d)
        return mean_cond_var + var_cond_mean

    def cdf(self, x):
        x = self._pad(x)
        cdf_x = self._component_distribution.cdf(x)
        return (cdf_x * self._mixture_distribution.probs).sum(-1)

    def log_prob(self, x):
        if self._validate_args:
            self._validate_sample(x)
        x = self._pad(x)
        log_prob_x = self._component_distribution.log_prob(x)
        log_mix_prob = self._mixture_distribution.logits.log_softmax(-1)
        return (log_prob_x + log_mix_prob).logsumexp(-1)

    def sample(self, sample_shape=torch.Size()):
        sample_shape = torch.Size(sample_shape)
        n, b, es = len(sample_shape), tuple(self.batch_shape), tuple(self.event_shape)
        with tp.no_grad():
            mix_sample = self._mixture_distribution.sample(sample_shape)
            comp_samples = self._component_distribution.sample(sample_shape)
            # each draw's component index, broadcast over the batch and event dims, picks its sample
            pad = len(b) - len(self._mixture_distribution.batch_shape)
            ms = tuple(mix_sample.shape)
            idx = mix_sample.reshape(ms[:n] + (1,) * pad + ms[n:] + (1,) * (1 + len(es)))
            idx = idx.expand(tuple(sample_shape) + b + (1,) + es)
            return comp_samples.gather(n + len(b), idx).squeeze(n + len(b))


class FisherSnedecor(Distribution):
    """F(df1, df2): the ratio of two scaled Gamma draws (reparameterised through both)."""
    arg_constraints = {"df1": constraints.positive, "df2": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, df1, df2, validate_args=None):
        self.df1, self.df2 = broadcast_all(df1, df2)
        self._gamma1 = Gamma(self.df1 * 0.5, self.df1)
        self._gamma2 = Gamma(self.df2 * 0.5, self.df2)
        super().__init__(self.df1.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(FisherSnedecor, _instance)
        batch_shape = torch.Size(batch_shape)
        new.df1, new.df2 = self.df1.expand(batch_shape), self.df2.expand(batch_shape)
        new._gamma1, new._gamma2 = self._gamma1.expand(batch_shape), self._gamma2.expand(batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        df2 = tp.where(self.df2 <= 2, math.nan, self.df2)
        return df2 / (df2 - 2)

    @property
    def mode(self):
        m = (self.df1 - 2) / self.df1 * self.df2 / (self.df2 + 2)
        return tp.where(self.df1 <= 2, math.nan, m)

    @property
    def variance(self):
        df2 = tp.where(self.df2 <= 4, math.nan, self.df2)
        return 2 * df2.pow(2) * (self.df1 + df2 - 2) / (self.df1 * (df2 - 2).pow(2) * (df2 - 4))

    def rsample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        tiny = torch.finfo(self.df1.dtype).tiny
        x1 = self._gamma1.rsample(sample_shape).reshape(shape)
        x2 = self._gamma2.rsample(sample_shape).reshape(shape).clamp(min=tiny)
        return (x1 / x2).clamp(min=tiny)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        ct1, ct2 = self.df1 * 0.5, self.df2 * 0.5
        ct3 = self.df1 / self.df2
        t1 = tp.lgamma(ct1 + ct2) - tp.lgamma(ct1) - tp.lgamma(ct2)
        t2 = ct1 * ct3.log() + (ct1 - 1) * value.log()
        t3 = (ct1 + ct2) * (ct3 * value).log1p()
        return t1 + t2 - t3


def _kumaraswamy_moment(a, b, n):
    arg1 = 1 + n / a
    return b * (tp.lgamma(arg1) + tp.lgamma(b) - tp.lgamma(arg1 + b)).exp()


class Kumaraswamy(TransformedDistribution):
    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        base = Uniform(tp.zeros_like(self.concentration0), tp.ones_like(self.concentration0),
                       validate_args=validate_args)
        transforms = [PowerTransform(exponent=self.concentration0.reciprocal()), AffineTransform(loc=1.0, scale=-1.0),
                      PowerTransform(exponent=self.concentration1.reciprocal())]
        super().__init__(base, transforms, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Kumaraswamy, _instance)
        new.concentration1 = self.concentration1.expand(batch_shape)
        new.concentration0 = self.concentration0.expand(batch_shape)
        return super().expand(batch_shape, new)

    mean = property(lambda self: _kumaraswamy_moment(self.concentration1, self.concentration0, 1))

    @property
    def mode(self):
        c1, c0 = self.concentration1, self.concentration0
        log_mode = c0.reciprocal() * (-c0).log1p() - (-c0 * c1).log1p()
        return tp.where((c0 < 1) | (c1 < 1), math.nan, log_mode).exp()

    @property
    def variance(self):
        return _kumaraswamy_moment(self.concentration1, self.concentration0, 2) - self.mean.pow(2)

    def entropy(self):
        c1, c0 = self.concentration1, self.concentration0
        h0 = tp.digamma(c0 + 1) + _EULER
        return (1 - c0.reciprocal()) + (1 - c1.reciprocal()) * h0 - c1.log() - c0.log()


class ContinuousBernoulli(_ProbsOrLogits):
    """The continuous Bernoulli on [0, 1] (density ∝ p^x (1-p)^(1-x)); near p = 1/2, where the closed
    forms cancel, the normaliser and moments use PyTorch's Taylor expansions (``lims``)."""
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    has_rsample = True
    _lims = (0.499, 0.501)

    def __init__(self, probs=None, logits=None, lims=(0.499, 0.501), validate_args=None):
        if probs is not None:
            probs = broadcast_all(probs)[0]
            # (PyTorch checks here whenever validate_args is given, then clamps into [eps, 1 - eps])
            if validate_args is not None and not bool(constraints.unit_interval.check(probs).all()):
                raise ValueError("The parameter probs has invalid values")
            probs = clamp_probs(probs)
        self._init_pl(probs, logits, {}, validate_args)
        self._lims = lims

    def expand(self, batch_shape, _instance=None):
        new = super().expand(batch_shape, self._get_checked_instance(ContinuousBernoulli, _instance))
        new._lims = self._lims
        return new

    @lazy_property
    def probs(self):
        return clamp_probs(self.logits.sigmoid())

    def _outside_unstable_region(self):
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self):
        return tp.where(self._outside_unstable_region(), self.probs, self._lims[0] * tp.ones_like(self.probs))

    def _cont_bern_log_norm(self):
        cut = self._cut_probs()
        below = tp.where(cut <= 0.5, cut, tp.zeros_like(cut))
        above = tp.where(cut >= 0.5, cut, tp.ones_like(cut))
        log_norm = ((-cut).log1p() - cut.log()).abs().log() - tp.where(cut <= 0.5, (-2.0 * below).log1p(),
                                                                        (2.0 * above - 1.0).log())
        x = (self.probs - 0.5).pow(2)
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return tp.where(self._outside_unstable_region(), log_norm, taylor)

    @property
    def mean(self):
        cut = self._cut_probs()
        mus = cut / (2.0 * cut - 1.0) + 1.0 / ((-cut).log1p() - cut.log())
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x.pow(2)) * x
        return tp.where(self._outside_unstable_region(), mus, taylor)

    @property
    def variance(self):
        cut = self._cut_probs()
        v = cut * (cut - 1.0) / (1.0 - 2.0 * cut).pow(2) + 1.0 / ((-cut).log1p() - cut.log()).pow(2)
        x = (self.probs - 0.5).pow(2)
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return tp.where(self._outside_unstable_region(), v, taylor)

    stddev = property(lambda self: self.variance.sqrt())
    def sample(self, sample_shape=torch.Size()):
        with tp.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        return self.icdf(tp.rand(shape, dtype=self.probs.dtype, device=self.probs.device))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -tp.nn.functional.binary_cross_entropy_with_logits(logits, value, reduction="none") + \
            self._cont_bern_log_norm()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        cut = self._cut_probs()
        cdfs = (cut.pow(value) * (1.0 - cut).pow(1.0 - value) + cut - 1.0) / (2.0 * cut - 1.0)
        unbounded = tp.where(self._outside_unstable_region(), cdfs, value)
        return tp.where(value <= 0.0, tp.zeros_like(value), tp.where(value >= 1.0, tp.ones_like(value), unbounded))

    def icdf(self, value):
        cut = self._cut_probs()
        x = ((-cut + value * (2.0 * cut - 1.0)).log1p() - (-cut).log1p()) / (cut.log() - (-cut).log1p())
        return tp.where(self._outside_unstable_region(), x, value)

    def entropy(self):
        log_p0, log_p1 = (-self.probs).log1p(), self.probs.log()
        return self.mean * (log_p0 - log_p1) - self._cont_bern_log_norm() - log_p0
