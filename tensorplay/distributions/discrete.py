"""Discrete distributions: Bernoulli, Categorical, OneHotCategorical, Binomial, Multinomial, Poisson,
Geometric.

Parameterised by ``probs`` or ``logits`` (exactly one; the other is computed on first use), as in
PyTorch, with the same normalisation (Categorical's probabilities are divided by their sum, its
logits shifted by their logsumexp) and the same ``log_prob``/``entropy``/moment formulas, so values
equal ``torch.distributions``.  Draws come from the op table's samplers (``bernoulli``,
``multinomial``, ``binomial``, ``poisson``) on the global generator; they carry no gradient
(``has_rsample`` is False).
"""
from __future__ import annotations

import math

import torch

import tensorplay as tp
import tensorplay.nn.functional as F

from . import constraints
from .continuous import _Params
from .distribution import Distribution
from .utils import broadcast_all, lazy_property, logits_to_probs, probs_to_logits

__all__ = ["Bernoulli", "Categorical", "OneHotCategorical", "Binomial", "Multinomial", "Poisson", "Geometric"]

_OPS = tp.ops.OPS


def _one_param(probs, logits):
    if (probs is None) == (logits is None):
        raise ValueError("Either `probs` or `logits` must be specified, but not both.")
    return ("probs", probs) if probs is not None else ("logits", logits)


class _BinaryParams:
    """``probs`` and ``logits`` of a binary event, each computed from the other on first use."""

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits, is_binary=True)


class _ProbsOrLogits(_BinaryParams, _Params):
    """Binary-parameter families (Bernoulli, Geometric, Binomial): ``probs`` or ``logits`` broadcast
    with the other parameters; the missing one is a lazy property."""
    _binary = True

    def _init_pl(self, probs, logits, others, validate_args):
        name, v = _one_param(probs, logits)
        self._given = name
        self._params = tuple(others) + (name,)
        self._init_params(tuple(others.values()) + (v,), validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(type(self), _instance)
        new._given, new._params = self._given, self._params
        return super().expand(batch_shape, new)

    @property
    def param_shape(self):
        return self.batch_shape


class Bernoulli(_ProbsOrLogits):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        self._init_pl(probs, logits, {}, validate_args)

    mean = property(lambda self: self.probs)
    variance = property(lambda self: self.probs * (1 - self.probs))

    @property
    def mode(self):
        m = (self.probs >= 0.5).to(self.probs.dtype)
        return tp.where(self.probs == 0.5, math.nan, m)

    def sample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        with tp.no_grad():
            return tp.bernoulli(self.probs.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -F.binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand=True):
        values = tp.arange(2, dtype=self._param().dtype, device=self._param().device)
        values = values.reshape((-1,) + (1,) * len(self.batch_shape))
        return values.expand((-1,) + tuple(self.batch_shape)) if expand else values

    def _param(self):
        return getattr(self, self._given)


class Geometric(_ProbsOrLogits):
    arg_constraints = {"probs": constraints.interval(0.0, 1.0), "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, probs=None, logits=None, validate_args=None):
        self._init_pl(probs, logits, {}, validate_args)
        if self._validate_args and probs is not None and not bool((self.probs > 0).all()):
            raise ValueError(f"Expected parameter probs of distribution {self!r} to be positive (the interval "
                             f"(0, 1]), but found invalid values:\n{self.probs}")

    mean = property(lambda self: 1.0 / self.probs - 1.0)
    mode = property(lambda self: tp.zeros_like(self.probs))
    variance = property(lambda self: (1.0 / self.probs - 1.0) / self.probs)

    def sample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        tiny = torch.finfo(self.probs.dtype).tiny
        with tp.no_grad():
            u = tp.rand(shape, dtype=self.probs.dtype, device=self.probs.device).clamp(min=tiny)
            return (u.log() / (-self.probs).log1p()).floor()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value, probs = broadcast_all(value, self.probs)
        probs = tp.where((probs == 1) & (value == 0), 0.0, probs)
        return value * (-probs).log1p() + self.probs.log()

    def entropy(self):
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none") / self.probs


class Binomial(_ProbsOrLogits):
    arg_constraints = {"total_count": constraints.nonnegative_integer, "probs": constraints.unit_interval,
                       "logits": constraints.real}
    has_enumerate_support = True

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None):
        self._init_pl(probs, logits, {"total_count": total_count}, validate_args)
        self.total_count = self.total_count.type_as(getattr(self, self._given))

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.total_count)

    mean = property(lambda self: self.total_count * self.probs)
    mode = property(lambda self: ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count))
    variance = property(lambda self: self.total_count * self.probs * (1 - self.probs))

    def sample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        with tp.no_grad():
            return _OPS["binomial"].fn(self.total_count.expand(shape), self.probs.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        n, lg = self.total_count, self.logits
        log_fact_n, log_fact_k, log_fact_nmk = tp.lgamma(n + 1), tp.lgamma(value + 1), tp.lgamma(n - value + 1)
        # n * log(1 + exp(logits)), written to stay finite for large |logits|
        clamp0 = (lg.clamp(min=0) + lg - lg.clamp(max=0)) / 2
        normalize = n * clamp0 + n * (-lg.abs()).exp().log1p() - log_fact_n
        return value * lg - log_fact_k - log_fact_nmk - normalize

    def entropy(self):
        n = int(self.total_count.max())
        if not bool((self.total_count == n).all()):
            raise NotImplementedError("Inhomogeneous total count not supported by `entropy`.")
        lp = self.log_prob(self.enumerate_support(False))
        return -(lp.exp() * lp).sum(0)

    def enumerate_support(self, expand=True):
        n = int(self.total_count.max())
        if not bool((self.total_count == n).all()):
            raise NotImplementedError("Inhomogeneous total count not supported by `enumerate_support`.")
        values = tp.arange(1 + n, dtype=self.total_count.dtype, device=self.total_count.device)
        values = values.reshape((-1,) + (1,) * len(self.batch_shape))
        return values.expand((-1,) + tuple(self.batch_shape)) if expand else values


class Poisson(_Params):
    arg_constraints = {"rate": constraints.nonnegative}
    support = constraints.nonnegative_integer
    _params = ("rate",)

    def __init__(self, rate, validate_args=None):
        self._init_params((rate,), validate_args)

    mean = property(lambda self: self.rate)
    mode = property(lambda self: self.rate.floor())
    variance = property(lambda self: self.rate)

    def sample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        with tp.no_grad():
            return _OPS["poisson"].fn(self.rate.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        rate, value = broadcast_all(self.rate, value)
        return tp.xlogy(value, rate) - rate - tp.lgamma(value + 1)


class Categorical(Distribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        name, v = _one_param(probs, logits)
        if v.dim() < 1:
            raise ValueError(f"`{name}` parameter must be at least one-dimensional.")
        if name == "probs":
            self.probs = v / v.sum(-1, keepdim=True)
        else:
            self.logits = v - v.logsumexp(-1, keepdim=True)
        self._given = name
        self._param = getattr(self, name)
        self._num_events = self._param.shape[-1]
        super().__init__(self._param.shape[:-1], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Categorical, _instance)
        batch_shape = torch.Size(batch_shape)
        shape = tuple(batch_shape) + (self._num_events,)
        new._given = self._given
        setattr(new, self._given, getattr(self, self._given).expand(shape))
        new._param = getattr(new, self._given)
        new._num_events = self._num_events
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self._num_events - 1)

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits)

    param_shape = property(lambda self: self._param.shape)
    mean = property(lambda self: tp.full(tuple(self.batch_shape), math.nan, dtype=self.probs.dtype))
    variance = mean
    mode = property(lambda self: self.probs.argmax(-1))

    def sample(self, sample_shape=torch.Size()):
        if not isinstance(sample_shape, torch.Size):
            sample_shape = torch.Size(sample_shape)
        probs_2d = self.probs.reshape(-1, self._num_events)
        with tp.no_grad():
            draws = tp.multinomial(probs_2d, sample_shape.numel(), True).t()
        return draws.reshape(tuple(self._extended_shape(sample_shape)))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        shape = torch.broadcast_shapes(value.shape, self.logits.shape)
        value = value.expand(tuple(shape[:-1]) + (1,))
        log_pmf = self.logits.expand(tuple(shape))
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self):
        logits = self.logits.clamp(min=torch.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand=True):
        values = tp.arange(self._num_events, dtype=torch.int64, device=self._param.device)
        values = values.reshape((-1,) + (1,) * len(self.batch_shape))
        return values.expand((-1,) + tuple(self.batch_shape)) if expand else values


class _OverCategorical(Distribution):
    """Distributions over the events of a Categorical (one-hot, counts, relaxed): batch shape that of
    the Categorical, event shape its number of events; ``_kept`` names the attributes ``expand``
    carries over unchanged (total_count, temperature)."""
    _kept: tuple = ()

    def _init_over(self, probs, logits, validate_args, **kept):
        for k, v in kept.items():
            setattr(self, k, v)
        self._categorical = Categorical(probs=probs, logits=logits)
        Distribution.__init__(self, self._categorical.batch_shape, self._categorical.param_shape[-1:],
                              validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(type(self), _instance)
        for k in self._kept:
            setattr(new, k, getattr(self, k))
        new._categorical = self._categorical.expand(batch_shape)
        Distribution.__init__(new, torch.Size(batch_shape), self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    probs = property(lambda self: self._categorical.probs)
    logits = property(lambda self: self._categorical.logits)
    param_shape = property(lambda self: self._categorical.param_shape)


class OneHotCategorical(_OverCategorical):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    support = constraints.one_hot
    has_enumerate_support = True

    def __init__(self, probs=None, logits=None, validate_args=None):
        self._init_over(probs, logits, validate_args)

    mean = property(lambda self: self._categorical.probs)
    variance = property(lambda self: self._categorical.probs * (1 - self._categorical.probs))

    @property
    def mode(self):
        return F.one_hot(self.probs.argmax(-1), self.event_shape[-1]).to(self.probs.dtype)

    def sample(self, sample_shape=torch.Size()):
        idx = self._categorical.sample(sample_shape)
        return F.one_hot(idx, self.event_shape[-1]).to(self.probs.dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._categorical.log_prob(value.argmax(-1))

    def entropy(self):
        return self._categorical.entropy()

    def enumerate_support(self, expand=True):
        n = self.event_shape[0]
        values = tp.eye(n, dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape((n,) + (1,) * len(self.batch_shape) + (n,))
        return values.expand((n,) + tuple(self.batch_shape) + (n,)) if expand else values


class Multinomial(_OverCategorical):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.independent(constraints.real, 1)}
    _kept = ("total_count",)

    def __init__(self, total_count=1, probs=None, logits=None, validate_args=None):
        if not isinstance(total_count, int):
            raise NotImplementedError("inhomogeneous total_count is not supported")
        self._init_over(probs, logits, validate_args, total_count=total_count)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.multinomial(self.total_count)

    mean = property(lambda self: self.probs * self.total_count)
    variance = property(lambda self: self.total_count * self.probs * (1 - self.probs))

    def sample(self, sample_shape=torch.Size()):
        sample_shape = torch.Size(sample_shape)
        draws = self._categorical.sample(torch.Size((self.total_count,)) + sample_shape)
        # (total_count, *sample, *batch) -> (*sample, *batch, total_count)
        draws = draws.permute(tuple(range(1, draws.dim())) + (0,))
        counts = tp.zeros(tuple(self._extended_shape(sample_shape)), dtype=self.probs.dtype,
                          device=self.probs.device)
        return counts.scatter_add(-1, draws, tp.ones(tuple(draws.shape), dtype=counts.dtype, device=counts.device))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_fact_n = tp.lgamma(value.sum(-1) + 1)
        log_fact_xs = tp.lgamma(value + 1).sum(-1)
        logits = tp.where((value == 0) & (logits == -math.inf), 0.0, logits)
        return (logits * value).sum(-1) + log_fact_n - log_fact_xs

    def entropy(self):
        n = tp.tensor(self.total_count)      # int64, as in PyTorch (its lgamma(n + 1) is float32)
        cat_entropy = self._categorical.entropy()
        support = Binomial(n, self.probs).enumerate_support(False)[1:]
        binomial_probs = Binomial(n, self.probs).log_prob(support).exp()
        weights = tp.lgamma(support + 1)
        return n * cat_entropy - tp.lgamma(n + 1) + (binomial_probs * weights).sum([0, -1])
