"""tp.distributions against torch.distributions on the same parameters: log_prob, cdf/icdf, entropy, moments,
shapes, sample statistics (10^5 draws), gradients of log_prob and of rsample losses, kl_divergence, expand,
validation errors."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributions as TD

import tensorplay as tp
import tensorplay.distributions as D
from tensorplay.testing import assert_close
from harness import to_tp


def _g(seed):
    return torch.Generator().manual_seed(seed)


def pos(*shape, seed=0, lo=0.5, hi=3.0):
    return (lo + (hi - lo) * torch.rand(shape, generator=_g(seed), dtype=torch.float64))


def real(*shape, seed=0):
    return torch.randn(shape, generator=_g(seed), dtype=torch.float64)


def unit(*shape, seed=0):
    return 0.05 + 0.9 * torch.rand(shape, generator=_g(seed), dtype=torch.float64)


def spd(n, *batch, seed=0):
    a = torch.randn(batch + (n, n), generator=_g(seed), dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


def simplex(*shape, seed=0):
    p = pos(*shape, seed=seed)
    return p / p.sum(-1, keepdim=True)


# name -> (params as torch tensors, value generator for log_prob (sample shape (4,) + batch), methods)
CASES = {
    "Normal": (lambda: dict(loc=real(3), scale=pos(3, seed=1)), lambda d: real(4, 3, seed=7),
               ("mean", "mode", "variance", "stddev", "entropy", "cdf", "icdf")),
    "Uniform": (lambda: dict(low=real(3), high=real(3) + pos(3, seed=1)), None,
                ("mean", "variance", "stddev", "entropy", "cdf", "icdf")),
    "Laplace": (lambda: dict(loc=real(3), scale=pos(3, seed=1)), lambda d: real(4, 3, seed=7),
                ("mean", "mode", "variance", "stddev", "entropy", "cdf", "icdf")),
    "Cauchy": (lambda: dict(loc=real(3), scale=pos(3, seed=1)), lambda d: real(4, 3, seed=7),
               ("mode", "entropy", "cdf", "icdf")),
    "Exponential": (lambda: dict(rate=pos(3)), lambda d: pos(4, 3, seed=7),
                    ("mean", "mode", "variance", "stddev", "entropy", "cdf", "icdf")),
    "Gamma": (lambda: dict(concentration=pos(3), rate=pos(3, seed=1)), lambda d: pos(4, 3, seed=7),
              ("mean", "mode", "variance", "entropy", "cdf")),
    "Chi2": (lambda: dict(df=pos(3, lo=1.0, hi=5.0)), lambda d: pos(4, 3, seed=7), ("mean", "variance", "entropy")),
    "Beta": (lambda: dict(concentration1=pos(3), concentration0=pos(3, seed=1)), lambda d: unit(4, 3, seed=7),
             ("mean", "mode", "variance", "entropy")),
    "Dirichlet": (lambda: dict(concentration=pos(2, 4)), lambda d: simplex(4, 2, 4, seed=7),
                  ("mean", "mode", "variance", "entropy")),
    "StudentT": (lambda: dict(df=pos(3, lo=2.5, hi=6.0), loc=real(3, seed=1), scale=pos(3, seed=2)),
                 lambda d: real(4, 3, seed=7), ("mean", "mode", "variance", "entropy")),
    "LogNormal": (lambda: dict(loc=real(3), scale=pos(3, seed=1)), lambda d: pos(4, 3, seed=7),
                  ("mean", "mode", "variance", "entropy", "cdf", "icdf")),
    "MultivariateNormal": (lambda: dict(loc=real(2, 3), scale_tril=torch.linalg.cholesky(spd(3, 2))),
                           lambda d: real(4, 2, 3, seed=7), ("mean", "mode", "variance", "entropy")),
    "Bernoulli": (lambda: dict(probs=unit(3)), lambda d: (unit(4, 3, seed=7) > 0.5).double(),
                  ("mean", "mode", "variance", "entropy")),
    "Geometric": (lambda: dict(probs=unit(3)), lambda d: torch.randint(0, 6, (4, 3), generator=_g(7)).double(),
                  ("mean", "mode", "variance", "entropy")),
    "Binomial": (lambda: dict(total_count=torch.full((3,), 7.0, dtype=torch.float64), probs=unit(3)),
                 lambda d: torch.randint(0, 8, (4, 3), generator=_g(7)).double(),
                 ("mean", "mode", "variance", "entropy")),
    "Poisson": (lambda: dict(rate=pos(3)), lambda d: torch.randint(0, 6, (4, 3), generator=_g(7)).double(),
                ("mean", "mode", "variance")),
    "Categorical": (lambda: dict(probs=simplex(2, 5)), lambda d: torch.randint(0, 5, (4, 2), generator=_g(7)),
                    ("entropy", "mode")),
    "OneHotCategorical": (lambda: dict(logits=real(2, 5)),
                          lambda d: torch.nn.functional.one_hot(torch.randint(0, 5, (4, 2), generator=_g(7)),
                                                                5).double(),
                          ("mean", "mode", "variance", "entropy")),
    "HalfNormal": (lambda: dict(scale=pos(3)), lambda d: pos(4, 3, seed=7),
                   ("mean", "mode", "variance", "entropy", "cdf", "icdf")),
    "HalfCauchy": (lambda: dict(scale=pos(3)), lambda d: pos(4, 3, seed=7), ("mode", "entropy", "cdf", "icdf")),
    "Gumbel": (lambda: dict(loc=real(3), scale=pos(3, seed=1)), lambda d: real(4, 3, seed=7),
               ("mean", "mode", "variance", "stddev", "entropy")),
    "Weibull": (lambda: dict(scale=pos(3), concentration=pos(3, seed=1, lo=0.8)), lambda d: pos(4, 3, seed=7),
                ("mean", "mode", "variance", "entropy")),
    "Pareto": (lambda: dict(scale=pos(3), alpha=pos(3, seed=1, lo=4.5, hi=6.0)), lambda d: d.sample((4,)),
               ("mean", "mode", "variance", "entropy")),
    "NegativeBinomial": (lambda: dict(total_count=pos(3, lo=1.0, hi=6.0), probs=unit(3, seed=1) * 0.8),
                         lambda d: torch.randint(0, 8, (4, 3), generator=_g(7)).double(),
                         ("mean", "mode", "variance")),
    "FisherSnedecor": (lambda: dict(df1=pos(3, lo=3.0, hi=8.0), df2=pos(3, seed=1, lo=9.0, hi=12.0)),
                       lambda d: pos(4, 3, seed=7), ("mean", "mode", "variance")),
    "Kumaraswamy": (lambda: dict(concentration1=pos(3, lo=1.2), concentration0=pos(3, seed=1, lo=1.2)),
                    lambda d: unit(4, 3, seed=7), ("mean", "mode", "variance", "entropy")),
    "ContinuousBernoulli": (lambda: dict(probs=torch.tensor([0.1, 0.4995, 0.5, 0.7, 0.95], dtype=torch.float64)),
                            lambda d: unit(4, 5, seed=7), ("mean", "variance", "stddev", "entropy", "cdf")),
    "Multinomial": (lambda: dict(total_count=6, probs=simplex(2, 4)),
                    lambda d: TD.Multinomial(6, probs=simplex(2, 4)).sample((4,)), ("mean", "variance", "entropy")),
}


def _pair(name, params):
    tpp = {k: to_tp(v) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    return getattr(D, name)(**tpp), getattr(TD, name)(**params)


def _values(name, params, td):
    make = CASES[name][1]
    if make is None:
        return td.sample((4,))
    return make(td)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_equal_torch(name):
    params = CASES[name][0]()
    d, td = _pair(name, params)
    assert d.batch_shape == td.batch_shape and d.event_shape == td.event_shape
    v = _values(name, params, td)
    assert_close(d.log_prob(to_tp(v)), td.log_prob(v), rtol=1e-10, atol=1e-10)
    for m in CASES[name][2]:
        if m == "cdf":
            got, want = d.cdf(to_tp(v)), td.cdf(v)
        elif m == "icdf":
            q = unit(4, 3, seed=3)
            got, want = d.icdf(to_tp(q)), td.icdf(q)
        elif m == "entropy":
            got, want = d.entropy(), td.entropy()
        else:
            got, want = getattr(d, m), getattr(td, m)
        assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"{name}.{m}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_shapes_and_expand(name):
    params = CASES[name][0]()
    d, td = _pair(name, params)
    for shape in ((), (5,), (2, 3)):
        s = d.sample(shape)
        assert isinstance(s, tp.Tensor) and tuple(s.shape) == tuple(td.sample(shape).shape)
    big = (4,) + tuple(d.batch_shape)
    e, te = d.expand(big), td.expand(big)
    assert e.batch_shape == te.batch_shape and e.event_shape == te.event_shape
    v = _values(name, params, td)
    assert_close(e.log_prob(to_tp(v)), te.log_prob(v), rtol=1e-10, atol=1e-10)
    assert tuple(e.sample((2,)).shape) == tuple(te.sample((2,)).shape)


STAT_CASES = ["Normal", "Uniform", "Laplace", "Exponential", "Gamma", "Beta", "Dirichlet", "StudentT", "LogNormal",
              "MultivariateNormal", "Bernoulli", "Geometric", "Binomial", "Poisson", "OneHotCategorical", "Multinomial",
              "Chi2", "HalfNormal", "Gumbel", "Weibull", "Pareto", "NegativeBinomial", "FisherSnedecor", "Kumaraswamy",
              "ContinuousBernoulli"]


@pytest.mark.parametrize("name", STAT_CASES)
def test_sample_mean_and_variance_within_standard_errors(name):
    params = CASES[name][0]()
    d, td = _pair(name, params)
    n = 100_000
    tp.manual_seed(1)
    s = d.sample((n,)).double()._data
    mean, var = td.mean, td.variance
    se_mean = (var / n).sqrt()
    assert ((s.mean(0) - mean).abs() <= 5 * se_mean + 1e-12).all(), name
    # heavy tails: the fourth moment is large or infinite
    if name not in ("LogNormal", "StudentT", "Pareto", "FisherSnedecor"):
        m4 = ((s - mean) ** 4).mean(0)
        se_var = ((m4 - var ** 2) / n).sqrt()
        assert ((s.var(0) - var).abs() <= 5 * se_var + 1e-12).all(), name


def test_cauchy_and_categorical_samples_follow_their_cdf():
    d = D.Cauchy(to_tp(real(3)), to_tp(pos(3, seed=1)))
    tp.manual_seed(2)
    s = d.sample((100_000,))
    frac = (s <= d.loc).double().mean(0)._data            # the median is loc
    assert (frac - 0.5).abs().max() < 5 * math.sqrt(0.25 / 100_000)
    probs = simplex(5)
    c = D.Categorical(probs=to_tp(probs))
    s = c.sample((100_000,))._data
    freq = torch.bincount(s, minlength=5).double() / 100_000
    assert ((freq - probs).abs() <= 5 * (probs * (1 - probs) / 100_000).sqrt()).all()


def test_samples_equal_torch_after_the_same_seed():
    """The draws use the global generator the way torch.distributions does: same seed, same numbers."""
    for name in ("Normal", "Uniform", "Laplace", "Exponential", "Gamma", "Beta", "Dirichlet", "StudentT",
                 "MultivariateNormal", "Bernoulli", "Poisson", "Binomial", "Categorical", "HalfNormal", "HalfCauchy",
                 "Gumbel", "Weibull", "Pareto", "NegativeBinomial", "FisherSnedecor", "Kumaraswamy",
                 "ContinuousBernoulli"):
        params = CASES[name][0]()
        d, td = _pair(name, params)
        tp.manual_seed(5)
        got = d.sample((7,))
        torch.manual_seed(5)
        want = td.sample((7,))
        assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)


RSAMPLE = ["Normal", "Uniform", "Laplace", "Exponential", "Gamma", "Beta", "Dirichlet", "StudentT", "LogNormal",
           "MultivariateNormal", "Chi2", "HalfNormal", "Gumbel", "Weibull", "Pareto", "FisherSnedecor", "Kumaraswamy",
           "ContinuousBernoulli"]


@pytest.mark.parametrize("name", RSAMPLE)
def test_rsample_and_log_prob_gradients_equal_torch(name):
    params = CASES[name][0]()
    tparams = {k: v.clone().requires_grad_() for k, v in params.items()}
    pparams = {k: to_tp(v, requires_grad=True) for k, v in params.items()}
    d, td = getattr(D, name)(**pparams), getattr(TD, name)(**tparams)
    assert d.has_rsample
    w = real(*(6,) + tuple(td.batch_shape + td.event_shape), seed=9)
    tp.manual_seed(3)
    x = d.rsample((6,))
    torch.manual_seed(3)
    tx = td.rsample((6,))
    assert_close(x, tx.detach(), rtol=1e-10, atol=1e-10)
    loss = (x * to_tp(w)).sum() + d.log_prob(x.detach()).sum()
    tloss = (tx * w).sum() + td.log_prob(tx.detach()).sum()
    loss.backward()
    tloss.backward()
    for k in params:
        assert_close(pparams[k].grad, tparams[k].grad, rtol=1e-8, atol=1e-10, msg=f"{name} d/d{k}")


def test_log_prob_gradients_of_discrete_and_entropy_gradients():
    for name, key in (("Bernoulli", "probs"), ("Categorical", "probs"), ("Geometric", "probs"), ("Poisson", "rate"),
                      ("Binomial", "probs"), ("OneHotCategorical", "logits"), ("Multinomial", "probs")):
        params = CASES[name][0]()
        v = _values(name, params, getattr(TD, name)(**params))
        tparams = dict(params, **{key: params[key].clone().requires_grad_()})
        pparams = {k: to_tp(p) if isinstance(p, torch.Tensor) else p for k, p in params.items()}
        pparams[key] = to_tp(params[key], requires_grad=True)
        d, td = getattr(D, name)(**pparams), getattr(TD, name)(**tparams)
        d.log_prob(to_tp(v)).sum().backward()
        td.log_prob(v).sum().backward()
        assert_close(pparams[key].grad, tparams[key].grad, rtol=1e-8, atol=1e-10, msg=name)
    loc, scale = real(3), pos(3)
    a, b = to_tp(scale, requires_grad=True), scale.clone().requires_grad_()
    D.StudentT(to_tp(pos(3, lo=3)), to_tp(loc), a).entropy().sum().backward()
    TD.StudentT(pos(3, lo=3), loc, b).entropy().sum().backward()
    assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_multivariate_normal_parameterisations_and_gradients():
    loc, cov = real(2, 3), spd(3, 2)
    prec = torch.linalg.inv(cov)
    v = real(5, 2, 3, seed=4)
    for kw in ("covariance_matrix", "precision_matrix", "scale_tril"):
        m = {"covariance_matrix": cov, "precision_matrix": prec, "scale_tril": torch.linalg.cholesky(cov)}[kw]
        tm = m.clone().requires_grad_()
        pm = to_tp(m, requires_grad=True)
        d = D.MultivariateNormal(to_tp(loc), **{kw: pm})
        td = TD.MultivariateNormal(loc, **{kw: tm})
        lp, tlp = d.log_prob(to_tp(v)), td.log_prob(v)
        assert_close(lp, tlp, rtol=1e-9, atol=1e-9)
        for attr in ("covariance_matrix", "precision_matrix", "scale_tril", "variance"):
            assert_close(getattr(d, attr), getattr(td, attr), rtol=1e-9, atol=1e-9, msg=f"{kw}: {attr}")
        (lp.sum() + d.entropy().sum()).backward()
        (tlp.sum() + td.entropy().sum()).backward()
        assert_close(pm.grad, tm.grad, rtol=1e-7, atol=1e-9, msg=kw)
    # batch dims of loc and the matrix broadcast
    d = D.MultivariateNormal(to_tp(real(4, 1, 3)), covariance_matrix=to_tp(cov))
    td = TD.MultivariateNormal(real(4, 1, 3), covariance_matrix=cov)
    assert d.batch_shape == td.batch_shape == (4, 2)
    assert_close(d.log_prob(to_tp(v[:, None])), td.log_prob(v[:, None]), rtol=1e-9, atol=1e-9)


KL_PAIRS = ["Normal", "Bernoulli", "Categorical", "OneHotCategorical", "Beta", "Gamma", "Exponential", "Laplace",
            "Poisson", "Dirichlet", "Geometric", "MultivariateNormal", "Binomial", "Cauchy", "Gumbel", "HalfNormal",
            "Pareto", "LogNormal"]


@pytest.mark.parametrize("name", KL_PAIRS)
def test_kl_divergence_equals_torch(name):
    p_params = CASES[name][0]()
    q_params = {k: (v.flip(-1) if k != "scale_tril" else torch.linalg.cholesky(spd(3, 2, seed=5)))
                if isinstance(v, torch.Tensor) else v for k, v in p_params.items()}
    (p, tp_), (q, tq) = _pair(name, p_params), _pair(name, q_params)
    assert_close(D.kl_divergence(p, q), TD.kl_divergence(tp_, tq), rtol=1e-9, atol=1e-10)


def test_kl_uniform_independent_and_register_kl():
    p, q = D.Uniform(to_tp(torch.tensor([0.0, 0.0])), to_tp(torch.tensor([1.0, 2.0]))), \
        D.Uniform(to_tp(torch.tensor([-1.0, 0.5])), to_tp(torch.tensor([2.0, 3.0])))
    tp_, tq = TD.Uniform(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 2.0])), \
        TD.Uniform(torch.tensor([-1.0, 0.5]), torch.tensor([2.0, 3.0]))
    assert_close(D.kl_divergence(p, q), TD.kl_divergence(tp_, tq))          # second entry is inf
    loc, s1, s2 = real(2, 3), pos(2, 3), pos(2, 3, seed=4)
    ip = D.Independent(D.Normal(to_tp(loc), to_tp(s1)), 1)
    iq = D.Independent(D.Normal(to_tp(loc), to_tp(s2)), 1)
    want = TD.kl_divergence(TD.Independent(TD.Normal(loc, s1), 1), TD.Independent(TD.Normal(loc, s2), 1))
    assert_close(D.kl_divergence(ip, iq), want)
    assert ip.batch_shape == (2,) and ip.event_shape == (3,)
    assert_close(ip.log_prob(to_tp(loc)), TD.Independent(TD.Normal(loc, s1), 1).log_prob(loc))
    with pytest.raises(NotImplementedError, match="No KL"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Poisson(to_tp(pos(1))))

    class MyNormal(D.Normal):
        pass

    @D.register_kl(MyNormal, D.Normal)
    def _kl(p, q):
        return p.loc * 0 + 42.0
    assert float(D.kl_divergence(MyNormal(to_tp(pos(1)), to_tp(pos(1))), D.Normal(0.0, 1.0))) == 42.0
    assert_close(D.kl_divergence(D.Normal(to_tp(loc), to_tp(s1)), MyNormal(to_tp(loc), to_tp(s2))),
                 TD.kl_divergence(TD.Normal(loc, s1), TD.Normal(loc, s2)))


def test_transformed_distributions_equal_torch():
    loc, scale = real(3), pos(3)
    v = unit(4, 3, seed=2) * 1.8 - 0.9
    cases = [
        (lambda N, T: [T.SigmoidTransform()], unit(4, 3, seed=2)),
        (lambda N, T: [T.TanhTransform()], v),
        (lambda N, T: [T.AffineTransform(2.0, -3.0), T.ExpTransform()], pos(4, 3, seed=2)),
        (lambda N, T: [T.ExpTransform(), T.PowerTransform(2.0)], pos(4, 3, seed=2)),
        (lambda N, T: [T.AffineTransform(to_tp(loc) if T is D.transforms else loc,
                                         to_tp(scale) if T is D.transforms else scale)], real(4, 3, seed=2)),
    ]
    for make, val in cases:
        d = D.TransformedDistribution(D.Normal(to_tp(loc), to_tp(scale)), make(None, D.transforms))
        td = TD.TransformedDistribution(TD.Normal(loc, scale), make(None, TD.transforms))
        assert_close(d.log_prob(to_tp(val)), td.log_prob(val), rtol=1e-9, atol=1e-10)
        assert tuple(d.rsample((5,)).shape) == (5, 3)
    d = D.TransformedDistribution(D.Normal(to_tp(loc), to_tp(scale)), D.transforms.AffineTransform(1.0, -2.0))
    td = TD.TransformedDistribution(TD.Normal(loc, scale), TD.transforms.AffineTransform(1.0, -2.0))
    q = unit(3, seed=8)
    assert_close(d.cdf(to_tp(q)), td.cdf(q), rtol=1e-10, atol=1e-12)
    assert_close(d.icdf(to_tp(q)), td.icdf(q), rtol=1e-10, atol=1e-12)
    # a sample's log_prob and its gradient through the transform (reparameterised)
    a = to_tp(scale, requires_grad=True)
    b = scale.clone().requires_grad_()
    tp.manual_seed(4)
    x = D.TransformedDistribution(D.Normal(to_tp(loc), a), [D.transforms.TanhTransform()]).rsample((3,))
    torch.manual_seed(4)
    tx = TD.TransformedDistribution(TD.Normal(loc, b), [TD.transforms.TanhTransform()]).rsample((3,))
    x.sum().backward()
    tx.sum().backward()
    assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_validation_errors_like_torch():
    with pytest.raises(ValueError, match="Expected parameter scale .* of distribution Normal"):
        D.Normal(to_tp(real(2)), to_tp(-pos(2)))
    with pytest.raises(ValueError, match="Expected parameter probs"):
        D.Bernoulli(probs=to_tp(pos(3) + 1))
    with pytest.raises(ValueError, match="Either `probs` or `logits` must be specified, but not both"):
        D.Categorical(probs=to_tp(simplex(3)), logits=to_tp(real(3)))
    with pytest.raises(ValueError, match="Uniform is not defined when low>= high"):
        D.Uniform(to_tp(torch.tensor([1.0])), to_tp(torch.tensor([0.0])))
    with pytest.raises(ValueError, match="positive_definite|PositiveDefinite"):
        D.MultivariateNormal(to_tp(real(2)), covariance_matrix=to_tp(-torch.eye(2, dtype=torch.float64)))
    with pytest.raises(ValueError, match="Exactly one of covariance_matrix"):
        D.MultivariateNormal(to_tp(real(2)))
    with pytest.raises(ValueError, match="within the support"):
        D.Exponential(to_tp(pos(2))).log_prob(to_tp(-pos(2)))
    with pytest.raises(ValueError, match="within the support"):
        D.Categorical(probs=to_tp(simplex(3))).log_prob(to_tp(torch.tensor(3)))
    with pytest.raises(ValueError, match="The parameter probs has invalid values"):
        D.ContinuousBernoulli(probs=to_tp(pos(2) + 1), validate_args=True)
    with pytest.raises(ValueError, match="broadcastable"):
        D.Normal(to_tp(real(3)), to_tp(pos(3))).log_prob(to_tp(real(2)))
    # validate_args=False skips the checks (and log_prob of an out-of-support value is then computed)
    d = D.Exponential(to_tp(pos(2)), validate_args=False)
    assert_close(d.log_prob(to_tp(-pos(2))), TD.Exponential(pos(2), validate_args=False).log_prob(-pos(2)))
    D.Normal(to_tp(real(2)), to_tp(-pos(2)), validate_args=False)
    try:
        D.Distribution.set_default_validate_args(False)
        D.Normal(0.0, -1.0)
    finally:
        D.Distribution.set_default_validate_args(True)


def test_python_number_parameters_and_float32():
    d, td = D.Normal(0.0, 2.0), TD.Normal(0.0, 2.0)
    assert d.batch_shape == td.batch_shape == ()
    x = torch.randn(5, generator=_g(1))
    assert_close(d.log_prob(to_tp(x)), td.log_prob(x))
    d, td = D.Gamma(to_tp(pos(3).float()), 2.0), TD.Gamma(pos(3).float(), 2.0)
    assert d.rate.dtype == torch.float32
    assert_close(d.log_prob(to_tp(pos(3).float())), td.log_prob(pos(3).float()), rtol=1e-6, atol=1e-6)
    tp.manual_seed(0)
    assert d.rsample((2,)).dtype == torch.float32


def test_enumerate_support_equals_torch():
    for name in ("Bernoulli", "Categorical", "OneHotCategorical", "Binomial"):
        params = CASES[name][0]()
        d, td = _pair(name, params)
        for expand in (True, False):
            assert_close(d.enumerate_support(expand), td.enumerate_support(expand), msg=name)


@pytest.mark.slow
def test_compiled_log_prob_kl_and_gamma_rsample_equal_eager():
    """Distributions inside tp.compile: log_prob, entropy and KL are fused pointwise/reduction code (the
    special functions in them fall back to ATen where Stax has no form); a later call equals eager, and
    so does the gradient."""
    loc, scale, v = real(8), pos(8, seed=1), real(5, 8, seed=2)
    conc = pos(8, seed=3)

    def f(loc, scale, conc, v):
        p, q = D.Normal(loc, scale), D.Normal(loc * 0.5, scale + 1)
        g = D.Gamma(conc, 2.0)
        return (p.log_prob(v).sum() + D.kl_divergence(p, q).sum() + g.log_prob(v.abs() + 0.1).sum()
                + D.Beta(conc, scale).entropy().sum())

    cf = tp.compile(f)
    args = [to_tp(loc, requires_grad=True), to_tp(scale, requires_grad=True), to_tp(conc, requires_grad=True)]
    for _ in range(2):
        for a in args:
            a.grad = None
        out = cf(*args, to_tp(v))
        out.backward()
    ea = [to_tp(x, requires_grad=True) for x in (loc, scale, conc)]
    ref = f(*ea, to_tp(v))
    ref.backward()
    assert_close(out, ref, rtol=1e-9, atol=1e-9)
    for a, e in zip(args, ea):
        assert_close(a.grad, e.grad, rtol=1e-9, atol=1e-9)

    def s(conc):
        return D.Gamma(conc, 2.0).rsample((3,)) * 2 + 1
    cs = tp.compile(s)
    cs(to_tp(conc))
    tp.manual_seed(7)
    got = cs(to_tp(conc))
    tp.manual_seed(7)
    assert_close(got, s(to_tp(conc)))


@pytest.mark.parametrize("name", ["LogitRelaxedBernoulli", "RelaxedBernoulli", "ExpRelaxedCategorical",
                                  "RelaxedOneHotCategorical"])
def test_relaxed_distributions_equal_torch(name):
    cat = "Categorical" in name
    temp = torch.tensor(0.7, dtype=torch.float64)
    par = real(2, 4) if cat else real(3)
    t_t, t_p = temp.clone().requires_grad_(), to_tp(temp, requires_grad=True)
    l_t, l_p = par.clone().requires_grad_(), to_tp(par, requires_grad=True)
    tmod = TD.relaxed_categorical if cat else TD.relaxed_bernoulli
    d, td = getattr(D, name)(t_p, logits=l_p), getattr(tmod, name)(t_t, logits=l_t)
    assert d.batch_shape == td.batch_shape and d.event_shape == td.event_shape
    tp.manual_seed(6)
    x = d.rsample((5,))
    torch.manual_seed(6)
    tx = td.rsample((5,))
    assert_close(x, tx.detach(), rtol=1e-10, atol=1e-12)
    lp, tlp = d.log_prob(x.detach()), td.log_prob(tx.detach())
    assert_close(lp, tlp, rtol=1e-9, atol=1e-10)
    w = real(*tx.shape, seed=3)
    ((x * to_tp(w)).sum() + lp.sum()).backward()
    ((tx * w).sum() + tlp.sum()).backward()
    assert_close(l_p.grad, l_t.grad, rtol=1e-8, atol=1e-10)
    assert_close(t_p.grad, t_t.grad, rtol=1e-8, atol=1e-10)
    e, te = d.expand((3,) + tuple(d.batch_shape)), td.expand((3,) + tuple(td.batch_shape))
    assert e.batch_shape == te.batch_shape and tuple(e.sample().shape) == tuple(te.sample().shape)
    probs = simplex(2, 4) if cat else unit(3)
    assert_close(getattr(D, name)(to_tp(temp), probs=to_tp(probs)).logits,
                 getattr(tmod, name)(temp, probs=probs).logits, rtol=1e-10, atol=1e-12)


def test_torch_module_paths_import_the_same_classes():
    from tensorplay.distributions.normal import Normal
    from tensorplay.distributions.relaxed_bernoulli import LogitRelaxedBernoulli
    import tensorplay.distributions.multivariate_normal as mvn
    assert Normal is D.Normal and LogitRelaxedBernoulli is D.LogitRelaxedBernoulli
    assert mvn.MultivariateNormal is D.MultivariateNormal and D.kl.kl_divergence is D.kl_divergence


@pytest.mark.parametrize("event", [False, True])
def test_mixture_same_family_equals_torch(event):
    logits = real(2, 3)
    loc, scale = (real(2, 3, 4), pos(2, 3, 4, seed=1)) if event else (real(2, 3), pos(2, 3, seed=1))

    def build(M, lib_loc, lib_scale, lib_logits):
        comp = M.Normal(lib_loc, lib_scale)
        comp = M.Independent(comp, 1) if event else comp
        return M.MixtureSameFamily(M.Categorical(logits=lib_logits), comp)
    lg_p, lg_t = to_tp(logits, requires_grad=True), logits.clone().requires_grad_()
    d, td = build(D, to_tp(loc), to_tp(scale), lg_p), build(TD, loc, scale, lg_t)
    assert d.batch_shape == td.batch_shape and d.event_shape == td.event_shape
    v = real(*((5, 2, 4) if event else (5, 2)), seed=3)
    lp, tlp = d.log_prob(to_tp(v)), td.log_prob(v)
    assert_close(lp, tlp, rtol=1e-10, atol=1e-10)
    lp.sum().backward()
    tlp.sum().backward()
    assert_close(lg_p.grad, lg_t.grad, rtol=1e-9, atol=1e-10)
    assert_close(d.mean, td.mean, rtol=1e-10, atol=1e-10)
    assert_close(d.variance, td.variance, rtol=1e-10, atol=1e-10)
    if not event:
        assert_close(d.cdf(to_tp(v)), td.cdf(v), rtol=1e-10, atol=1e-10)
    tp.manual_seed(8)
    s = d.sample((6,))
    torch.manual_seed(8)
    assert_close(s, td.sample((6,)))
    e, te = d.expand((3, 2)), td.expand((3, 2))
    assert e.batch_shape == te.batch_shape and tuple(e.sample((2,)).shape) == tuple(te.sample((2,)).shape)
    with pytest.raises(ValueError, match="does not equal"):
        D.MixtureSameFamily(D.Categorical(logits=to_tp(real(2, 4))), D.Normal(to_tp(real(2, 3)), to_tp(pos(2, 3))))


def test_biject_to_and_transform_to_equal_torch():
    from torch.distributions import constraint_registry as TR
    C, TC = D.constraints, TD.constraints
    x = real(4, 3, seed=11)
    cases = [(C.real, TC.real), (C.positive, TC.positive), (C.greater_than(1.5), TC.greater_than(1.5)),
             (C.less_than(-2.0), TC.less_than(-2.0)), (C.unit_interval, TC.unit_interval),
             (C.interval(-1.0, 3.0), TC.interval(-1.0, 3.0)), (C.simplex, TC.simplex),
             (C.independent(C.positive, 1), TC.independent(TC.positive, 1))]
    for c, tc in cases:
        for reg, treg in ((D.biject_to, TR.biject_to), (D.transform_to, TR.transform_to)):
            t, tt = reg(c), treg(tc)
            y, ty = t(to_tp(x)), tt(x)
            assert_close(y, ty, rtol=1e-10, atol=1e-12, msg=repr(c))
            assert bool(c.check(y).all())
            if reg is D.biject_to:
                assert_close(t.inv(y), x, rtol=1e-7, atol=1e-8, msg=repr(c))
                assert_close(t.log_abs_det_jacobian(to_tp(x), y), tt.log_abs_det_jacobian(x, ty), rtol=1e-10,
                             atol=1e-12, msg=repr(c))
    with pytest.raises(NotImplementedError, match="Cannot transform"):
        D.biject_to(C.boolean)
    # an unconstrained parameter through biject_to, optimised by gradient: the gradient matches torch
    u_p, u_t = to_tp(x, requires_grad=True), x.clone().requires_grad_()
    D.Dirichlet(D.biject_to(C.positive)(u_p)).log_prob(D.transform_to(C.simplex)(u_p.detach())).sum().backward()
    TD.Dirichlet(TR.biject_to(TC.positive)(u_t)).log_prob(TR.transform_to(TC.simplex)(u_t.detach())).sum().backward()
    assert_close(u_p.grad, u_t.grad, rtol=1e-9, atol=1e-11)


def _copy_module(tp_mod, torch_mod):
    tp_mod.load_state_dict({k: tp.from_torch(v.detach().clone()) for k, v in torch_mod.state_dict().items()})


def test_policy_gradient_and_vae_losses_like_pytorch_programs():
    """Two public-program patterns with the same weights: a REINFORCE step (Categorical from a policy
    network's logits, log_prob of sampled actions, entropy bonus) and a VAE loss (Normal rsample, a
    Bernoulli decoder's log_prob, KL to the prior).  Losses and every parameter gradient equal PyTorch's."""
    torch.manual_seed(0)
    t_pol, t_enc, t_dec = torch.nn.Linear(6, 4), torch.nn.Linear(6, 2 * 3), torch.nn.Linear(3, 6)
    p_pol, p_enc, p_dec = tp.nn.Linear(6, 4), tp.nn.Linear(6, 2 * 3), tp.nn.Linear(3, 6)
    for a, b in ((p_pol, t_pol), (p_enc, t_enc), (p_dec, t_dec)):
        _copy_module(a, b)
    obs = torch.randn(8, 6, generator=_g(1))
    returns = torch.randn(8, generator=_g(2))
    x = (torch.rand(8, 6, generator=_g(3)) > 0.5).float()

    def reinforce(M, lib, pol, obs, returns):
        dist = M.Categorical(logits=pol(obs))
        lib.manual_seed(4)
        actions = dist.sample()
        return -(dist.log_prob(actions) * returns).mean() - 0.01 * dist.entropy().mean()

    def vae(M, lib, enc, dec, x):
        h = enc(x)
        mu, log_sigma = h[:, :3], h[:, 3:]
        q = M.Normal(mu, log_sigma.exp())
        lib.manual_seed(5)
        z = q.rsample()
        rec = M.Bernoulli(logits=dec(z)).log_prob(x).sum(-1)
        kl = M.kl_divergence(q, M.Normal(lib.zeros_like(mu), lib.ones_like(mu))).sum(-1)
        return (kl - rec).mean()

    for fn, tmods, pmods, inputs in ((reinforce, (t_pol,), (p_pol,), (obs, returns)),
                                     (vae, (t_enc, t_dec), (p_enc, p_dec), (x,))):
        want = fn(TD, torch, *tmods, *inputs)
        got = fn(D, tp, *pmods, *[to_tp(i) for i in inputs])
        assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
        want.backward()
        got.backward()
        for pm, tm in zip(pmods, tmods):
            for (name, a), (_, b) in zip(pm.named_parameters(), tm.named_parameters()):
                assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=f"{fn.__name__}: {name}")


def test_low_rank_multivariate_normal_equals_torch():
    loc, w, diag = real(2, 4), real(2, 4, 2, seed=1), pos(4, seed=2)
    lw, tw = to_tp(w, requires_grad=True), w.clone().requires_grad_()
    ld, td_ = to_tp(diag, requires_grad=True), diag.clone().requires_grad_()
    d, td = D.LowRankMultivariateNormal(to_tp(loc), lw, ld), TD.LowRankMultivariateNormal(loc, tw, td_)
    assert d.batch_shape == td.batch_shape and d.event_shape == td.event_shape
    v = real(5, 2, 4, seed=3)
    lp, tlp = d.log_prob(to_tp(v)), td.log_prob(v)
    assert_close(lp, tlp, rtol=1e-10, atol=1e-10)
    for attr in ("mean", "variance", "scale_tril", "covariance_matrix", "precision_matrix"):
        assert_close(getattr(d, attr), getattr(td, attr), rtol=1e-9, atol=1e-10, msg=attr)
    assert_close(d.entropy(), td.entropy(), rtol=1e-10, atol=1e-10)
    tp.manual_seed(9)
    x = d.rsample((3,))
    torch.manual_seed(9)
    tx = td.rsample((3,))
    assert_close(x, tx.detach(), rtol=1e-10, atol=1e-10)
    (lp.sum() + d.entropy().sum() + x.sum()).backward()
    (tlp.sum() + td.entropy().sum() + tx.sum()).backward()
    assert_close(lw.grad, tw.grad, rtol=1e-8, atol=1e-10)
    assert_close(ld.grad, td_.grad, rtol=1e-8, atol=1e-10)
    e, te = d.expand((3, 2)), td.expand((3, 2))
    assert_close(e.log_prob(to_tp(v[:3])), te.log_prob(v[:3]), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="cov_diag"):
        D.LowRankMultivariateNormal(to_tp(loc), lw, to_tp(-diag))
