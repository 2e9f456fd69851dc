"""Independent (batch dims reinterpreted as event dims) and MultivariateNormal.

``Independent(base, n)`` moves the ``n`` rightmost batch dims of ``base`` into its event shape:
``log_prob`` and ``entropy`` sum over them; sampling is the base's.

``MultivariateNormal(loc, covariance_matrix= | precision_matrix= | scale_tril=)`` (exactly one
matrix) keeps the lower Cholesky factor ``scale_tril`` (``L``, with ``Σ = L Lᵀ``); everything is
computed from it with the op table's ``linalg_cholesky`` / ``linalg_solve_triangular`` (so
gradients flow to loc and to whichever matrix was given): ``rsample = loc + L ε``,
``log_prob = -½ (d log 2π + |L⁻¹(x - loc)|²) - Σ log diag L``.  Batch dims of loc and the matrix
broadcast.  Values equal ``torch.distributions.MultivariateNormal`` up to floating-point rounding of
the factorisation.  ``LowRankMultivariateNormal(loc, cov_factor, cov_diag)`` has covariance
``W Wᵀ + diag(d)`` and never forms a D x D factorisation for log_prob, entropy and sampling.
"""
from __future__ import annotations

import math

import torch

import tensorplay as tp

from . import constraints
from .distribution import Distribution
from .utils import lazy_property, sum_rightmost

__all__ = ["Independent", "MultivariateNormal", "LowRankMultivariateNormal"]

_OPS = tp.ops.OPS


class Independent(Distribution):
    arg_constraints: dict = {}

    def __init__(self, base_distribution, reinterpreted_batch_ndims, validate_args=None):
        n = reinterpreted_batch_ndims
        if n > len(base_distribution.batch_shape):
            raise ValueError(f"Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), actual {n} "
                             f"vs {len(base_distribution.batch_shape)}")
        shape = base_distribution.batch_shape + base_distribution.event_shape
        k = len(base_distribution.event_shape) + n
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = n
        super().__init__(shape[:len(shape) - k], shape[len(shape) - k:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Independent, _instance)
        batch_shape = torch.Size(batch_shape)
        n = self.reinterpreted_batch_ndims
        new.base_dist = self.base_dist.expand(batch_shape + self.event_shape[:n])
        new.reinterpreted_batch_ndims = n
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    has_rsample = property(lambda self: self.base_dist.has_rsample)

    @property
    def has_enumerate_support(self):
        return self.reinterpreted_batch_ndims == 0 and self.base_dist.has_enumerate_support

    @constraints.dependent_property
    def support(self):
        s = self.base_dist.support
        return constraints.independent(s, self.reinterpreted_batch_ndims) if self.reinterpreted_batch_ndims else s

    mean = property(lambda self: self.base_dist.mean)
    mode = property(lambda self: self.base_dist.mode)
    variance = property(lambda self: self.base_dist.variance)

    def sample(self, sample_shape=torch.Size()):
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value):
        return sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self):
        return sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand=True):
        if self.reinterpreted_batch_ndims > 0:
            raise NotImplementedError("Enumeration over cartesian product is not implemented")
        return self.base_dist.enumerate_support(expand=expand)

    def __repr__(self):
        return f"Independent({self.base_dist!r}, {self.reinterpreted_batch_ndims})"


def _solve_lower(L, b):
    return _OPS["linalg_solve_triangular"].fn(L, b, upper=False)


def _batch_mahalanobis(L, x):
    """|L⁻¹ x|² over the last dim, L and x broadcast over their batch dims."""
    y = _solve_lower(L, x.unsqueeze(-1)).squeeze(-1)
    return (y * y).sum(-1)


def _precision_to_scale_tril(P):
    # the reversed Cholesky factor of the reversed precision is the inverse transpose of L
    lf = _OPS["linalg_cholesky"].fn(P.flip((-2, -1)))
    l_inv = lf.flip((-2, -1)).mT
    eye = tp.eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return _solve_lower(l_inv, eye)


class MultivariateNormal(Distribution):
    arg_constraints = {"loc": constraints.real_vector, "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite, "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [(n, m) for n, m in (("covariance_matrix", covariance_matrix), ("precision_matrix", precision_matrix),
                                     ("scale_tril", scale_tril)) if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        name, m = given[0]
        if m.dim() < 2:
            raise ValueError(f"{name} matrix must be at least two-dimensional, with optional leading batch dimensions")
        batch = torch.broadcast_shapes(m.shape[:-2], loc.shape[:-1])
        d = loc.shape[-1]
        setattr(self, name, m.expand(tuple(batch) + (d, d)))
        self.loc = loc.expand(tuple(batch) + (d,))
        self._given = name
        super().__init__(batch, (d,), validate_args=validate_args)
        if name == "scale_tril":
            self._unbroadcasted_scale_tril = scale_tril
        elif name == "covariance_matrix":
            self._unbroadcasted_scale_tril = _OPS["linalg_cholesky"].fn(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        d = self.event_shape[0]
        new.loc = self.loc.expand(tuple(batch_shape) + (d,))
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        new._given = self._given
        setattr(new, self._given, getattr(self, self._given).expand(tuple(batch_shape) + (d, d)))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _bshape(self, *tail):
        return tuple(self._batch_shape) + tuple(tail)

    @lazy_property
    def scale_tril(self):
        d = self.event_shape[0]
        return self._unbroadcasted_scale_tril.expand(self._bshape(d, d))

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        d = self.event_shape[0]
        return (L @ L.mT).expand(self._bshape(d, d))

    @lazy_property
    def precision_matrix(self):
        L = self._unbroadcasted_scale_tril
        d = self.event_shape[0]
        eye = tp.eye(d, dtype=L.dtype, device=L.device)
        l_inv = _solve_lower(L, eye)
        return (l_inv.mT @ l_inv).expand(self._bshape(d, d))

    mean = property(lambda self: self.loc)
    mode = property(lambda self: self.loc)

    @property
    def variance(self):
        L = self._unbroadcasted_scale_tril
        return (L * L).sum(-1).expand(self._bshape(self.event_shape[0]))

    def rsample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        eps = tp.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def _half_log_det(self):
        return self._unbroadcasted_scale_tril.diagonal(0, -2, -1).log().sum(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        m = _batch_mahalanobis(self._unbroadcasted_scale_tril, diff)
        return -0.5 * (self.event_shape[0] * math.log(2 * math.pi) + m) - self._half_log_det()

    def entropy(self):
        h = 0.5 * self.event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return h.expand(tuple(self._batch_shape)) if len(self._batch_shape) else h


def _eye_like(n, like):
    return tp.eye(n, dtype=like.dtype, device=like.device)


class LowRankMultivariateNormal(Distribution):
    """Normal with covariance ``W Wᵀ + diag(d)`` (``cov_factor`` W of rank R, ``cov_diag`` d): log_prob
    and entropy by the Woodbury identity and the determinant lemma through the R x R Cholesky factor
    of the capacitance ``I + Wᵀ D⁻¹ W``."""
    arg_constraints = {"loc": constraints.real_vector,
                       "cov_factor": constraints.independent(constraints.real, 2),
                       "cov_diag": constraints.independent(constraints.positive, 1)}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, cov_factor, cov_diag, validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        d = loc.shape[-1]
        if cov_factor.dim() < 2:
            raise ValueError("cov_factor must be at least two-dimensional, with optional leading batch dimensions")
        if tuple(cov_factor.shape[-2:-1]) != (d,):
            raise ValueError(f"cov_factor must be a batch of matrices with shape {d} x m")
        if tuple(cov_diag.shape[-1:]) != (d,):
            raise ValueError(f"cov_diag must be a batch of vectors with shape {tuple(loc.shape[-1:])}")
        batch = tuple(torch.broadcast_shapes(loc.shape[:-1], cov_factor.shape[:-2], cov_diag.shape[:-1]))
        r = cov_factor.shape[-1]
        self.loc = loc.expand(batch + (d,))
        self.cov_factor = cov_factor.expand(batch + (d, r))
        self.cov_diag = cov_diag.expand(batch + (d,))
        self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag = cov_factor, cov_diag
        super().__init__(batch, (d,), validate_args=validate_args)      # (validated before the factorisation)
        self._capacitance_tril = self._capacitance(cov_factor, cov_diag)

    @staticmethod
    def _capacitance(w, diag):
        wt_dinv = w.mT / diag.unsqueeze(-2)
        k = wt_dinv @ w + _eye_like(w.shape[-1], w)
        return _OPS["linalg_cholesky"].fn(k)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        b = tuple(batch_shape)
        d, r = self.event_shape[0], self.cov_factor.shape[-1]
        new.loc, new.cov_factor = self.loc.expand(b + (d,)), self.cov_factor.expand(b + (d, r))
        new.cov_diag = self.cov_diag.expand(b + (d,))
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        Distribution.__init__(new, torch.Size(b), self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    mean = property(lambda self: self.loc)
    mode = property(lambda self: self.loc)

    def _bshape(self, *tail):
        return tuple(self._batch_shape) + tuple(tail)

    @property
    def variance(self):
        w = self._unbroadcasted_cov_factor
        return ((w * w).sum(-1) + self._unbroadcasted_cov_diag).expand(self._bshape(self.event_shape[0]))

    @lazy_property
    def scale_tril(self):
        n = self.event_shape[0]
        sq = self._unbroadcasted_cov_diag.sqrt().unsqueeze(-1)
        dw = self._unbroadcasted_cov_factor / sq
        k = dw @ dw.mT + _eye_like(n, dw)
        return (sq * _OPS["linalg_cholesky"].fn(k)).expand(self._bshape(n, n))

    @lazy_property
    def covariance_matrix(self):
        n = self.event_shape[0]
        w, diag = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        return (w @ w.mT + diag.unsqueeze(-1) * _eye_like(n, w)).expand(self._bshape(n, n))

    @lazy_property
    def precision_matrix(self):
        n = self.event_shape[0]
        w, diag = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        a = _solve_lower(self._capacitance_tril, w.mT / diag.unsqueeze(-2))
        return (diag.reciprocal().unsqueeze(-1) * _eye_like(n, w) - a.mT @ a).expand(self._bshape(n, n))

    def rsample(self, sample_shape=torch.Size()):
        shape = tuple(self._extended_shape(sample_shape))
        w = self._unbroadcasted_cov_factor
        eps_w = tp.randn(shape[:-1] + tuple(w.shape[-1:]), dtype=self.loc.dtype, device=self.loc.device)
        eps_d = tp.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (w @ eps_w.unsqueeze(-1)).squeeze(-1) + self._unbroadcasted_cov_diag.sqrt() * eps_d

    def _logdet(self):
        return (2 * self._capacitance_tril.diagonal(0, -2, -1).log().sum(-1)
                + self._unbroadcasted_cov_diag.log().sum(-1))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        x = value - self.loc
        w, diag = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        wt_dinv_x = ((w.mT / diag.unsqueeze(-2)) @ x.unsqueeze(-1)).squeeze(-1)
        m = (x.pow(2) / diag).sum(-1) - _batch_mahalanobis(self._capacitance_tril, wt_dinv_x)
        return -0.5 * (self.event_shape[0] * math.log(2 * math.pi) + self._logdet() + m)

    def entropy(self):
        h = 0.5 * (self.event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._logdet())
        return h.expand(tuple(self._batch_shape)) if len(self._batch_shape) else h
