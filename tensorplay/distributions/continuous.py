"""Continuous univariate distributions: Normal, Uniform, Laplace, Cauchy, Exponential, Gamma, Chi2,
Beta, Dirichlet, StudentT.

Each follows PyTorch's parameterisation, defaults, ``arg_constraints``/``support`` and formulas for
``log_prob``, ``cdf``/``icdf`` (where PyTorch has them), ``entropy`` and the moments, so their values
equal ``torch.distributions`` on the same parameters.  ``rsample`` is reparameterised and
differentiable through tp autograd: location-scale families from ``tp.randn``/uniform noise; Gamma,
Beta and Dirichlet from the op table's ``_standard_gamma``/``_sample_dirichlet`` with their implicit
gradients.  Noise comes from the global generator (``tp.manual_seed``).
"""
from __future__ import annotations

import math
import numbers

import torch

import tensorplay as tp

from . import constraints
from .distribution import Distribution
from .utils import broadcast_all

__all__ = ["Normal", "Uniform", "Laplace", "Cauchy", "Exponential", "Gamma", "Chi2", "Beta", "Dirichlet", "StudentT"]

_OPS = tp.ops.OPS


def _log(x):
    return math.log(x) if isinstance(x, numbers.Number) else x.log()


def _nan_like(x):
    return tp.full(tuple(x.shape), math.nan, dtype=x.dtype, device=x.device)


def _inf_like(x):
    return tp.full(tuple(x.shape), math.inf, dtype=x.dtype, device=x.device)


class _Params(Distribution):
    """A distribution whose parameters (``_params``) broadcast to its batch shape: the constructor
    and ``expand`` are written once here."""
    _params: tuple = ()

    def _init_params(self, values, validate_args, event_dims=0):
        bt = broadcast_all(*values) if event_dims == 0 else values
        for name, v in zip(self._params, bt):
            setattr(self, name, v)
        if event_dims == 0:
            batch = torch.Size() if all(isinstance(v, numbers.Number) for v in values) else bt[0].shape
            Distribution.__init__(self, batch, validate_args=validate_args)
        else:
            v = bt[0]
            Distribution.__init__(self, v.shape[:v.dim() - event_dims], v.shape[v.dim() - event_dims:],
                                  validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(type(self), _instance)
        batch_shape = torch.Size(batch_shape)
        for name in self._params:
            setattr(new, name, getattr(self, name).expand(batch_shape + self.event_shape))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _noise_like(self, shape, like):
        return tp.empty(tuple(shape), dtype=like.dtype, device=like.device)


class _LocScale(_Params):
    """Location-scale families: ``loc`` real, ``scale`` positive, support the real line."""
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _params = ("loc", "scale")

    def __init__(self, loc, scale, validate_args=None):
        self._init_params((loc, scale), validate_args)

    mode = property(lambda self: self.loc)


class Normal(_LocScale):
    mean = property(lambda self: self.loc)
    stddev = property(lambda self: self.scale)
    variance = property(lambda self: self.stddev.pow(2))

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = tp.randn(tuple(shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - _log(self.scale) - math.log(math.sqrt(2 * math.pi))

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + ((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)).erf())

    def icdf(self, value):
        return self.loc + self.scale * (2 * value - 1).erfinv() * math.sqrt(2)

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()


class Uniform(_Params):
    arg_constraints = {"low": constraints.dependent(is_discrete=False, event_dim=0),
                       "high": constraints.dependent(is_discrete=False, event_dim=0)}
    has_rsample = True
    _params = ("low", "high")

    def __init__(self, low, high, validate_args=None):
        self._init_params((low, high), validate_args)
        if self._validate_args and not bool((self.low < self.high).all()):
            raise ValueError("Uniform is not defined when low>= high")

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.interval(self.low, self.high)

    mean = property(lambda self: (self.high + self.low) / 2)
    mode = property(lambda self: self.high * math.nan)
    stddev = property(lambda self: (self.high - self.low) / 12 ** 0.5)
    variance = property(lambda self: (self.high - self.low).pow(2) / 12)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        rand = tp.rand(tuple(shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + rand * (self.high - self.low)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        lb = (self.low <= value).type_as(self.low)
        ub = (self.high > value).type_as(self.low)
        return (lb * ub).log() - (self.high - self.low).log()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.low) / (self.high - self.low)).clamp(min=0, max=1)

    def icdf(self, value):
        return value * (self.high - self.low) + self.low

    def entropy(self):
        return (self.high - self.low).log()


class Laplace(_LocScale):
    mean = property(lambda self: self.loc)
    variance = property(lambda self: 2 * self.scale.pow(2))
    stddev = property(lambda self: (2 ** 0.5) * self.scale)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.finfo(self.loc.dtype).eps
        u = self._noise_like(shape, self.loc).uniform_(eps - 1, 1)
        return self.loc - self.scale * u.sign() * (-u.abs()).log1p()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -(2 * self.scale).log() - (value - self.loc).abs() / self.scale

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 - 0.5 * (value - self.loc).sign() * (-(value - self.loc).abs() / self.scale).expm1()

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * term.sign() * (-2 * term.abs()).log1p()

    def entropy(self):
        return 1 + (2 * self.scale).log()


class Cauchy(_LocScale):
    mean = property(lambda self: _nan_like(self.loc))
    variance = property(lambda self: _inf_like(self.loc))

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        u = tp.rand(tuple(shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (math.pi * (u - 0.5)).tan() * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -math.log(math.pi) - self.scale.log() - (((value - self.loc) / self.scale) ** 2).log1p()

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.loc) / self.scale).atan() / math.pi + 0.5

    def icdf(self, value):
        return (math.pi * (value - 0.5)).tan() * self.scale + self.loc

    def entropy(self):
        return math.log(4 * math.pi) + self.scale.log()


class Exponential(_Params):
    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _params = ("rate",)

    def __init__(self, rate, validate_args=None):
        self._init_params((rate,), validate_args)

    mean = property(lambda self: self.rate.reciprocal())
    mode = property(lambda self: tp.zeros_like(self.rate))
    stddev = property(lambda self: self.rate.reciprocal())
    variance = property(lambda self: self.rate.pow(-2))

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        return self._noise_like(shape, self.rate).exponential_() / self.rate

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - (-self.rate * value).exp()

    def icdf(self, value):
        return -(-value).log1p() / self.rate

    def entropy(self):
        return 1.0 - self.rate.log()


class Gamma(_Params):
    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _params = ("concentration", "rate")

    def __init__(self, concentration, rate, validate_args=None):
        self._init_params((concentration, rate), validate_args)

    mean = property(lambda self: self.concentration / self.rate)
    mode = property(lambda self: ((self.concentration - 1) / self.rate).clamp(min=0))
    variance = property(lambda self: self.concentration / self.rate.pow(2))

    def rsample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        value = _OPS["_standard_gamma"].fn(self.concentration.expand(shape)) / self.rate.expand(shape)
        # a draw that underflows to 0 is moved to the smallest normal number (its gradient is kept)
        d = value.detach()
        return value + (d.clamp(min=torch.finfo(value.dtype).tiny) - d)

    def log_prob(self, value):
        value = tp.as_tensor(value, dtype=self.rate.dtype, device=self.rate.device)
        if self._validate_args:
            self._validate_sample(value)
        c, r = self.concentration, self.rate
        return tp.xlogy(c, r) + tp.xlogy(c - 1, value) - r * value - tp.lgamma(c)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return tp.special.gammainc(self.concentration, self.rate * value)

    def entropy(self):
        c = self.concentration
        return c - self.rate.log() + tp.lgamma(c) + (1.0 - c) * tp.digamma(c)


class Chi2(Gamma):
    arg_constraints = {"df": constraints.positive}

    def __init__(self, df, validate_args=None):
        df = broadcast_all(df)[0]
        super().__init__(0.5 * df, tp.full_like(df, 0.5), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(Chi2, _instance))

    @property
    def df(self):
        return self.concentration * 2


class Dirichlet(_Params):
    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True
    _params = ("concentration",)

    def __init__(self, concentration, validate_args=None):
        if concentration.dim() < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self._init_params((concentration,), validate_args, event_dims=1)

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, True)

    @property
    def mode(self):
        c = self.concentration
        cm1 = (c - 1).clamp(min=0.0)
        mode = cm1 / cm1.sum(-1, True)
        # every concentration below 1: the mass piles up at the corner of the largest one
        corner = tp.nn.functional.one_hot(c.argmax(-1), c.shape[-1]).to(mode.dtype)
        return tp.where((c < 1).all(-1, keepdim=True), corner, mode)

    @property
    def variance(self):
        c = self.concentration
        c0 = c.sum(-1, True)
        return c * (c0 - c) / (c0.pow(2) * (c0 + 1))

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        return _OPS["_sample_dirichlet"].fn(self.concentration.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        c = self.concentration
        return tp.xlogy(c - 1.0, value).sum(-1) + tp.lgamma(c.sum(-1)) - tp.lgamma(c).sum(-1)

    def entropy(self):
        c = self.concentration
        k = c.shape[-1]
        a0 = c.sum(-1)
        return tp.lgamma(c).sum(-1) - tp.lgamma(a0) - (k - a0) * tp.digamma(a0) - ((c - 1.0) * tp.digamma(c)).sum(-1)


class Beta(Distribution):
    arg_constraints = {"concentration1": constraints.positive, "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        c1, c0 = broadcast_all(concentration1, concentration0)
        self._dirichlet = Dirichlet(tp.stack([c1, c0], -1), validate_args=validate_args)
        super().__init__(self._dirichlet.batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Beta, _instance)
        batch_shape = torch.Size(batch_shape)
        new._dirichlet = self._dirichlet.expand(batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    concentration1 = property(lambda self: self._dirichlet.concentration[..., 0])
    concentration0 = property(lambda self: self._dirichlet.concentration[..., 1])
    mean = property(lambda self: self.concentration1 / (self.concentration1 + self.concentration0))
    mode = property(lambda self: self._dirichlet.mode[..., 0])

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        return self._dirichlet.rsample(sample_shape).select(-1, 0)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._dirichlet.log_prob(tp.stack([value, 1.0 - value], -1))

    def entropy(self):
        return self._dirichlet.entropy()


class StudentT(_Params):
    arg_constraints = {"df": constraints.positive, "loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _params = ("df", "loc", "scale")

    def __init__(self, df, loc=0.0, scale=1.0, validate_args=None):
        self._init_params((df, loc, scale), validate_args)
        self._chi2 = Chi2(self.df)

    def expand(self, batch_shape, _instance=None):
        new = super().expand(batch_shape, self._get_checked_instance(StudentT, _instance))
        new._chi2 = self._chi2.expand(batch_shape)
        return new

    @property
    def mean(self):
        return tp.where(self.df > 1, self.loc, math.nan)

    mode = property(lambda self: self.loc)

    @property
    def variance(self):
        df = self.df
        v = self.scale.pow(2) * df / (df - 2)
        return tp.where(df > 2, v, tp.where(df > 1, math.inf, math.nan))

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        x = tp.randn(tuple(shape), dtype=self.df.dtype, device=self.df.device)
        z = self._chi2.rsample(sample_shape)
        return self.loc + self.scale * (x * (z / self.df).rsqrt())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (self.scale.log() + 0.5 * self.df.log() + 0.5 * math.log(math.pi) + tp.lgamma(0.5 * self.df)
             - tp.lgamma(0.5 * (self.df + 1.0)))
        return -0.5 * (self.df + 1.0) * (y ** 2 / self.df).log1p() - z

    def entropy(self):
        df = self.df
        lbeta = tp.lgamma(0.5 * df) + math.lgamma(0.5) - tp.lgamma(0.5 * (df + 1))
        return (self.scale.log() + 0.5 * (df + 1) * (tp.digamma(0.5 * (df + 1)) - tp.digamma(0.5 * df))
                + 0.5 * df.log() + lbeta)
