"""Transforms (bijections with a log-Jacobian) and ``TransformedDistribution``; ``LogNormal``.

A :class:`Transform` maps ``x`` to ``y = T(x)``; ``inv`` is its inverse (``T.inv(y)``),
``log_abs_det_jacobian(x, y)`` is ``log |dy/dx|`` elementwise, ``domain``/``codomain`` are
constraints.  Provided: ``ExpTransform``, ``AffineTransform(loc, scale)``, ``SigmoidTransform``,
``TanhTransform``, ``PowerTransform``, ``ComposeTransform``; two transforms are equal when they
are of one type with equal parameters.  ``TransformedDistribution(base,
transforms)`` samples ``T(base sample)`` (``rsample`` reparameterised when the base is) and scores
``log_prob(y) = base.log_prob(T⁻¹ y) - log|det J(T⁻¹ y)|``, summing the Jacobian over event dims, the
same as PyTorch.  ``cache_size=1`` remembers the last ``(x, y)`` pair, so ``log_prob`` of a value
just sampled uses the exact ``x`` it came from (PyTorch's behaviour).
"""
from __future__ import annotations

import math
import numbers

import torch

import tensorplay as tp
import tensorplay.nn.functional as F

from . import constraints
from .continuous import Normal
from .distribution import Distribution
from .utils import sum_rightmost

__all__ = ["Transform", "ExpTransform", "AffineTransform", "SigmoidTransform", "TanhTransform", "PowerTransform",
           "ComposeTransform", "TransformedDistribution", "LogNormal"]


class Transform:
    bijective = True
    domain = constraints.real
    codomain = constraints.real
    sign = 1

    def __init__(self, cache_size=0):
        if cache_size not in (0, 1):
            raise ValueError("cache_size must be 0 or 1")
        self._cache_size = cache_size
        self._cached_x_y = (None, None)

    @property
    def event_dim(self):
        return self.domain.event_dim

    @property
    def inv(self):
        return _InverseTransform(self)

    def __call__(self, x):
        if self._cache_size == 0:
            return self._call(x)
        x_old, y_old = self._cached_x_y
        if x is x_old:
            return y_old
        y = self._call(x)
        self._cached_x_y = (x, y)
        return y

    def _inv_call(self, y):
        if self._cache_size == 0:
            return self._inverse(y)
        x_old, y_old = self._cached_x_y
        if y is y_old:
            return x_old
        x = self._inverse(y)
        self._cached_x_y = (x, y)
        return x

    def _call(self, x):
        raise NotImplementedError

    def _inverse(self, y):
        raise NotImplementedError

    def log_abs_det_jacobian(self, x, y):
        raise NotImplementedError

    def forward_shape(self, shape):
        return shape

    def inverse_shape(self, shape):
        return shape

    def __repr__(self):
        return f"{type(self).__name__}()"

    def _key(self):
        """What makes two transforms of this type equal (the parameter-free ones: nothing)."""
        return ()

    def __eq__(self, other):
        if type(self) is not type(other):
            return False
        return all(_same(a, b) for a, b in zip(self._key(), other._key()))

    __hash__ = object.__hash__


def _same(a, b):
    if isinstance(a, tp.Tensor) or isinstance(b, tp.Tensor):
        return a is b or (isinstance(a, tp.Tensor) and isinstance(b, tp.Tensor) and a.shape == b.shape
                          and bool((a == b).all()))
    return a == b


class _InverseTransform(Transform):
    def __init__(self, transform):
        super().__init__(cache_size=transform._cache_size)
        self._inv = transform

    domain = property(lambda self: self._inv.codomain)
    codomain = property(lambda self: self._inv.domain)
    sign = property(lambda self: self._inv.sign)
    inv = property(lambda self: self._inv)

    def __call__(self, x):
        return self._inv._inv_call(x)

    def _key(self):
        return (self._inv,)

    def log_abs_det_jacobian(self, x, y):
        return -self._inv.log_abs_det_jacobian(y, x)


class ExpTransform(Transform):
    codomain = constraints.positive

    def _call(self, x):
        return x.exp()

    def _inverse(self, y):
        return y.log()

    def log_abs_det_jacobian(self, x, y):
        return x


class SigmoidTransform(Transform):
    codomain = constraints.unit_interval

    def _call(self, x):
        fi = torch.finfo(x.dtype)
        return x.sigmoid().clamp(min=fi.tiny, max=1.0 - fi.eps)

    def _inverse(self, y):
        fi = torch.finfo(y.dtype)
        y = y.clamp(min=fi.tiny, max=1.0 - fi.eps)
        return y.log() - (-y).log1p()

    def log_abs_det_jacobian(self, x, y):
        return -F.softplus(-x) - F.softplus(x)


class TanhTransform(Transform):
    codomain = constraints.interval(-1.0, 1.0)

    def _call(self, x):
        return x.tanh()

    def _inverse(self, y):
        return y.atanh()

    def log_abs_det_jacobian(self, x, y):
        # log(1 - tanh(x)^2) = 2 (log 2 - x - softplus(-2x)), stable for large |x|
        return 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))


class AffineTransform(Transform):
    def __init__(self, loc, scale, event_dim=0, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.loc, self.scale, self._event_dim = loc, scale, event_dim

    @property
    def event_dim(self):
        return self._event_dim

    def _key(self):
        return (self.loc, self.scale, self._event_dim)

    @property
    def domain(self):
        return constraints.independent(constraints.real, self._event_dim) if self._event_dim else constraints.real

    codomain = domain

    @property
    def sign(self):
        s = self.scale
        return (1 if s > 0 else -1 if s < 0 else 0) if isinstance(s, numbers.Number) else s.sign()

    def _call(self, x):
        return self.loc + self.scale * x

    def _inverse(self, y):
        return (y - self.loc) / self.scale

    def log_abs_det_jacobian(self, x, y):
        s = self.scale
        if isinstance(s, numbers.Number):
            r = tp.full(tuple(x.shape), math.log(abs(s)), dtype=x.dtype, device=x.device)
        else:
            r = s.abs().log()
        if self._event_dim:
            shape = tuple(r.shape[:r.dim() - self._event_dim]) + (-1,)
            r = r.reshape(shape).sum(-1)
        return r


class PowerTransform(Transform):
    domain = constraints.positive
    codomain = constraints.positive

    def __init__(self, exponent, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.exponent = exponent

    def _key(self):
        return (self.exponent,)

    def _call(self, x):
        return x.pow(self.exponent)

    def _inverse(self, y):
        return y.pow(1 / self.exponent)

    def log_abs_det_jacobian(self, x, y):
        e = self.exponent
        return ((e * y) / x).abs().log()


class ComposeTransform(Transform):
    def __init__(self, parts, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.parts = list(parts)

    @property
    def event_dim(self):
        return max((p.event_dim for p in self.parts), default=0)

    def _key(self):
        return (len(self.parts),) + tuple(self.parts)

    domain = property(lambda self: self.parts[0].domain if self.parts else constraints.real)
    codomain = property(lambda self: self.parts[-1].codomain if self.parts else constraints.real)

    def _call(self, x):
        for p in self.parts:
            x = p(x)
        return x

    def _inverse(self, y):
        for p in reversed(self.parts):
            y = p.inv(y)
        return y

    def log_abs_det_jacobian(self, x, y):
        if not self.parts:
            return tp.zeros_like(x)
        total, ev = 0, self.event_dim
        for p in self.parts:
            y = p(x)
            total = total + sum_rightmost(p.log_abs_det_jacobian(x, y), ev - p.event_dim)
            x = y
        return total


class TransformedDistribution(Distribution):
    arg_constraints: dict = {}

    def __init__(self, base_distribution, transforms, validate_args=None):
        if isinstance(transforms, Transform):
            transforms = [transforms]
        if not all(isinstance(t, Transform) for t in transforms):
            raise ValueError(f"transforms must be a Transform or a list of Transforms, but was {transforms}")
        self.transforms = list(transforms)
        self.base_dist = base_distribution
        shape = base_distribution.batch_shape + base_distribution.event_shape
        ev = max([len(base_distribution.event_shape)] + [t.event_dim for t in self.transforms])
        super().__init__(shape[:len(shape) - ev], shape[len(shape) - ev:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(TransformedDistribution, _instance)
        batch_shape = torch.Size(batch_shape)
        extra = len(self.event_shape) - len(self.base_dist.event_shape)
        base_batch = batch_shape + self.event_shape[:extra]
        new.base_dist = self.base_dist.expand(base_batch)
        new.transforms = self.transforms
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    has_rsample = property(lambda self: self.base_dist.has_rsample)

    @constraints.dependent_property(is_discrete=False)
    def support(self):
        return self.transforms[-1].codomain if self.transforms else self.base_dist.support

    def sample(self, sample_shape=torch.Size()):
        with tp.no_grad():
            x = self.base_dist.sample(sample_shape)
            for t in self.transforms:
                x = t(x)
            return x

    def rsample(self, sample_shape=torch.Size()):
        x = self.base_dist.rsample(sample_shape)
        for t in self.transforms:
            x = t(x)
        return x

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        ev = len(self.event_shape)
        lp, y = 0.0, value
        for t in reversed(self.transforms):
            x = t.inv(y)
            ev += t.domain.event_dim - t.codomain.event_dim
            lp = lp - sum_rightmost(t.log_abs_det_jacobian(x, y), ev - t.domain.event_dim)
            y = x
        return lp + sum_rightmost(self.base_dist.log_prob(y), ev - len(self.base_dist.event_shape))

    def _monotone_cdf_value(self, value):
        sign = 1
        for t in self.transforms:
            sign = sign * t.sign
        if isinstance(sign, numbers.Number) and sign == 1:
            return value
        return sign * (value - 0.5) + 0.5

    def cdf(self, value):
        for t in reversed(self.transforms):
            value = t.inv(value)
        if self._validate_args:
            self.base_dist._validate_sample(value)
        return self._monotone_cdf_value(self.base_dist.cdf(value))

    def icdf(self, value):
        value = self.base_dist.icdf(self._monotone_cdf_value(value))
        for t in self.transforms:
            value = t(value)
        return value


class LogNormal(TransformedDistribution):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.positive
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        super().__init__(Normal(loc, scale, validate_args=validate_args), ExpTransform(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return super().expand(batch_shape, self._get_checked_instance(LogNormal, _instance))

    loc = property(lambda self: self.base_dist.loc)
    scale = property(lambda self: self.base_dist.scale)
    mean = property(lambda self: (self.loc + self.scale.pow(2) / 2).exp())
    mode = property(lambda self: (self.loc - self.scale.square()).exp())
    variance = property(lambda self: self.scale.pow(2).expm1() * (2 * self.loc + self.scale.pow(2)).exp())

    def entropy(self):
        return self.base_dist.entropy() + self.loc
