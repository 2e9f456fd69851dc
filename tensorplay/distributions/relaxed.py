"""Continuous relaxations of the Bernoulli and the one-hot categorical (Concrete / Gumbel-softmax).

``LogitRelaxedBernoulli(temperature, probs= | logits=)`` draws the logit of a relaxed Bernoulli,
``(logit(u) + logits) / temperature`` for uniform ``u``; ``RelaxedBernoulli`` is its sigmoid.
``ExpRelaxedCategorical`` draws log-probabilities ``log_softmax((logits + gumbel) / temperature)``;
``RelaxedOneHotCategorical`` is their exp, a point of the simplex.  All four are reparameterised
(``rsample`` differentiates in the logits/probs and the temperature) and follow PyTorch's formulas
for ``log_prob``, so values equal ``torch.distributions``; uniforms are clamped into
``[eps, 1 - eps]`` as PyTorch does.  ``temperature`` is kept as given (not broadcast).
"""
from __future__ import annotations

import torch

import tensorplay as tp

from . import constraints
from .discrete import _BinaryParams, _one_param, _OverCategorical
from .distribution import Distribution
from .transforms import ExpTransform, SigmoidTransform, TransformedDistribution
from .utils import broadcast_all, clamp_probs

__all__ = ["LogitRelaxedBernoulli", "RelaxedBernoulli", "ExpRelaxedCategorical", "RelaxedOneHotCategorical"]


def _uniform(shape, like):
    return clamp_probs(tp.rand(tuple(shape), dtype=like.dtype, device=like.device))


class LogitRelaxedBernoulli(_BinaryParams, Distribution):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.real
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        self.temperature = temperature
        name, v = _one_param(probs, logits)
        v = broadcast_all(v)[0]
        setattr(self, name, v)
        self._given = name
        super().__init__(v.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LogitRelaxedBernoulli, _instance)
        batch_shape = torch.Size(batch_shape)
        new.temperature, new._given = self.temperature, self._given
        setattr(new, self._given, getattr(self, self._given).expand(batch_shape))
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    param_shape = property(lambda self: getattr(self, self._given).shape)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        probs = clamp_probs(self.probs.expand(tuple(shape)))
        u = _uniform(shape, probs)
        return (u.log() - (-u).log1p() + probs.log() - (-probs).log1p()) / self.temperature

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        diff = logits - value * self.temperature
        return self.temperature.log() + diff - 2 * diff.exp().log1p()


class RelaxedBernoulli(TransformedDistribution):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        base = LogitRelaxedBernoulli(temperature, probs, logits)
        super().__init__(base, SigmoidTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(RelaxedBernoulli, _instance))

    temperature = property(lambda self: self.base_dist.temperature)
    logits = property(lambda self: self.base_dist.logits)
    probs = property(lambda self: self.base_dist.probs)


class ExpRelaxedCategorical(_OverCategorical):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True
    _kept = ("temperature",)

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        self._init_over(probs, logits, validate_args, temperature=temperature)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        u = _uniform(shape, self.logits)
        gumbels = -(-u.log()).log()
        scores = (self.logits + gumbels) / self.temperature
        return scores - scores.logsumexp(-1, keepdim=True)

    def log_prob(self, value):
        k = self._categorical._num_events
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_scale = tp.full_like(self.temperature, float(k)).lgamma() - self.temperature.log() * -(k - 1)
        score = logits - value * self.temperature
        score = (score - score.logsumexp(-1, keepdim=True)).sum(-1)
        return score + log_scale


class RelaxedOneHotCategorical(TransformedDistribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, temperature, probs=None, logits=None, validate_args=None):
        base = ExpRelaxedCategorical(temperature, probs, logits, validate_args=validate_args)
        super().__init__(base, ExpTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(RelaxedOneHotCategorical, _instance))

    temperature = property(lambda self: self.base_dist.temperature)
    logits = property(lambda self: self.base_dist.logits)
    probs = property(lambda self: self.base_dist.probs)
