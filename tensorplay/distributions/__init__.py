"""``tp.distributions``: probability distributions with PyTorch's ``torch.distributions`` interface.

Families: Normal, LogNormal, Uniform, Laplace, Cauchy, Exponential, Gamma, Chi2, Beta, Dirichlet,
StudentT, MultivariateNormal, LowRankMultivariateNormal, HalfNormal, HalfCauchy, Gumbel, Weibull,
Pareto, Kumaraswamy, FisherSnedecor (continuous); Bernoulli, Categorical, OneHotCategorical,
Binomial, Multinomial, Poisson, Geometric, NegativeBinomial (discrete); ContinuousBernoulli; the relaxed (Concrete)
Bernoulli and one-hot categorical; MixtureSameFamily, Independent and TransformedDistribution (with
Exp, Affine, Sigmoid, Tanh, Power, Abs and composed transforms) as combinators;
``kl_divergence``/``register_kl``; ``biject_to``/``transform_to``.
Guarantees: values (log_prob, cdf/icdf, entropy, moments, KL) equal PyTorch's on the same parameters;
shapes follow ``sample_shape + batch_shape + event_shape``; ``rsample`` is differentiable through tp
autograd; draws use the global generator seeded by ``tp.manual_seed``; parameters and values are
validated like PyTorch's (``validate_args``, on by default).  PyTorch's per-family module paths
(``torch.distributions.normal``, ``.relaxed_bernoulli``, ...) import the same classes.  See
docs/distributions.md.
"""
from __future__ import annotations

import sys

from . import constraints, transforms  # noqa: F401
from .constraint_registry import biject_to, transform_to
from .continuous import Beta, Cauchy, Chi2, Dirichlet, Exponential, Gamma, Laplace, Normal, StudentT, Uniform
from .discrete import Bernoulli, Binomial, Categorical, Geometric, Multinomial, OneHotCategorical, Poisson
from .derived import (AbsTransform, ContinuousBernoulli, FisherSnedecor, Gumbel, HalfCauchy, HalfNormal, Kumaraswamy,
                      MixtureSameFamily, NegativeBinomial, Pareto, Weibull)
from .distribution import Distribution
from .kl import kl_divergence, register_kl
from .multivariate import Independent, LowRankMultivariateNormal, MultivariateNormal
from .relaxed import ExpRelaxedCategorical, LogitRelaxedBernoulli, RelaxedBernoulli, RelaxedOneHotCategorical
from .transforms import (AffineTransform, ComposeTransform, ExpTransform, LogNormal, PowerTransform, SigmoidTransform,
                         TanhTransform, Transform, TransformedDistribution)

__all__ = ["Distribution", "Normal", "LogNormal", "Uniform", "Laplace", "Cauchy", "Exponential", "Gamma", "Chi2",
           "Beta", "Dirichlet", "StudentT", "MultivariateNormal", "LowRankMultivariateNormal", "HalfNormal",
           "HalfCauchy", "Gumbel", "Weibull", "Pareto", "Kumaraswamy", "FisherSnedecor", "Bernoulli", "Categorical",
           "OneHotCategorical", "ContinuousBernoulli", "Binomial", "Multinomial", "Poisson", "Geometric",
           "NegativeBinomial",
           "LogitRelaxedBernoulli", "RelaxedBernoulli", "ExpRelaxedCategorical", "RelaxedOneHotCategorical",
           "MixtureSameFamily", "Independent", "TransformedDistribution", "Transform", "ExpTransform",
           "AffineTransform", "SigmoidTransform", "TanhTransform", "PowerTransform", "AbsTransform",
           "ComposeTransform", "biject_to", "transform_to", "kl_divergence", "register_kl", "constraints",
           "transforms"]

# PyTorch's module per family (``from torch.distributions.normal import Normal``): the same classes
_TORCH_MODULES = {"continuous": ("normal", "uniform", "laplace", "cauchy", "exponential", "gamma", "chi2",
                                 "beta", "dirichlet", "studentT"),
                  "discrete": ("bernoulli", "categorical", "one_hot_categorical", "binomial", "multinomial",
                               "poisson", "geometric"),
                  "multivariate": ("multivariate_normal", "independent",
                                   "lowrank_multivariate_normal"),
                  "transforms": ("transformed_distribution", "log_normal"),
                  "relaxed": ("relaxed_bernoulli", "relaxed_categorical"),
                  "derived": ("half_normal", "half_cauchy", "gumbel", "weibull", "pareto", "negative_binomial",
                              "mixture_same_family", "fishersnedecor", "kumaraswamy",
                              "continuous_bernoulli"),
                  "kl": (), "utils": (), "distribution": (), "constraint_registry": ()}
for _mod, _aliases in _TORCH_MODULES.items():
    for _alias in _aliases:
        sys.modules[f"{__name__}.{_alias}"] = sys.modules[f"{__name__}.{_mod}"]
        globals()[_alias] = sys.modules[f"{__name__}.{_mod}"]
