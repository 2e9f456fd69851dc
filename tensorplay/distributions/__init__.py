"""``tp.distributions``: probability distributions with PyTorch's ``torch.distributions`` interface.

Families: Normal, LogNormal, Uniform, Laplace, Cauchy, Exponential, Gamma, Chi2, Beta, Dirichlet,
StudentT, MultivariateNormal (continuous); Bernoulli, Categorical, OneHotCategorical, Binomial,
Multinomial, Poisson, Geometric (discrete); Independent and TransformedDistribution (with Exp, Affine,
Sigmoid, Tanh, Power and composed transforms) as combinators; ``kl_divergence``/``register_kl``.
Guarantees: values (log_prob, cdf/icdf, entropy, moments, KL) equal PyTorch's on the same parameters;
shapes follow ``sample_shape + batch_shape + event_shape``; ``rsample`` is differentiable through tp
autograd; draws use the global generator seeded by ``tp.manual_seed``; parameters and values are
validated like PyTorch's (``validate_args``, on by default).  See docs/distributions.md.
"""
from __future__ import annotations

from . import constraints, transforms  # noqa: F401
from .continuous import Beta, Cauchy, Chi2, Dirichlet, Exponential, Gamma, Laplace, Normal, StudentT, Uniform
from .discrete import Bernoulli, Binomial, Categorical, Geometric, Multinomial, OneHotCategorical, Poisson
from .distribution import Distribution
from .kl import kl_divergence, register_kl
from .multivariate import Independent, MultivariateNormal
from .transforms import (AffineTransform, ComposeTransform, ExpTransform, LogNormal, PowerTransform, SigmoidTransform,
                         TanhTransform, Transform, TransformedDistribution)

__all__ = ["Distribution", "Normal", "LogNormal", "Uniform", "Laplace", "Cauchy", "Exponential", "Gamma", "Chi2",
           "Beta", "Dirichlet", "StudentT", "MultivariateNormal", "Bernoulli", "Categorical", "OneHotCategorical",
           "Binomial", "Multinomial", "Poisson", "Geometric", "Independent", "TransformedDistribution", "Transform",
           "ExpTransform", "AffineTransform", "SigmoidTransform", "TanhTransform", "PowerTransform",
           "ComposeTransform", "kl_divergence", "register_kl", "constraints", "transforms"]
