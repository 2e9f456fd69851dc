"""The element-wise optimisers (Adadelta, Adagrad, RMSprop, Adamax, NAdam, RAdam, Rprop, ASGD) and LBFGS against
torch.optim: the same gradients give bit-identical parameters over several steps for every option and
with parameter groups; state dicts have torch's layout and a reloaded optimiser continues exactly."""
import copy

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close

SHAPES = [(4, 3), (3,), (2, 5), (5,)]


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=g) for s in SHAPES]
    return [torch.nn.Parameter(t.clone()) for t in ts], [nn.Parameter(tp.from_torch(t.clone())) for t in ts]


def _groups(params, group_opts):
    if group_opts is None:
        return params
    return [dict(params=params[:2], **group_opts[0]), dict(params=params[2:], **group_opts[1])]


def _steps(tparams, pparams, topt, popt, steps, gen):
    for _ in range(steps):
        for i, (a, b) in enumerate(zip(tparams, pparams)):
            if i == 1 and gen.initial_seed() == 7:     # one parameter without a gradient
                a.grad, b.grad = None, None
                continue
            grad = torch.randn(a.shape, generator=gen)
            a.grad = grad.clone()
            b.grad = tp.from_torch(grad.clone())
        topt.step()
        popt.step()
        for a, b in zip(tparams, pparams):
            assert_close(b, a.detach(), exact=True)


CASES = [
    ("Adadelta", {}, None),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True), None),
    ("Adadelta", {}, [dict(rho=0.5), dict(lr=0.1, weight_decay=0.2)]),
    ("Adagrad", {}, None),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.3, eps=1e-8), None),
    ("Adagrad", dict(maximize=True), [dict(lr_decay=0.1), dict(lr=0.2)]),
    ("RMSprop", {}, None),
    ("RMSprop", dict(lr=1e-2, alpha=0.9, centered=True), None),
    ("RMSprop", dict(lr=1e-2, momentum=0.9, weight_decay=0.05, maximize=True), None),
    ("RMSprop", dict(lr=1e-2, momentum=0.5, centered=True, eps=1e-6), [dict(alpha=0.8), dict(momentum=0.0)]),
    ("Adamax", {}, None),
    ("Adamax", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, maximize=True), None),
    ("Adamax", {}, [dict(lr=1e-3), dict(betas=(0.5, 0.9))]),
    ("NAdam", {}, None),
    ("NAdam", dict(lr=1e-2, momentum_decay=1e-2, weight_decay=0.1), None),
    ("NAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True), None),
    ("NAdam", {}, [dict(betas=(0.8, 0.9)), dict(lr=1e-3, eps=1e-6)]),
    ("RAdam", {}, None),
    ("RAdam", dict(lr=1e-2, betas=(0.5, 0.9), weight_decay=0.1), None),   # rho_t > 5 from step 2
    ("RAdam", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, maximize=True), None),
    ("RAdam", {}, [dict(betas=(0.6, 0.8)), dict(lr=1e-2)]),
    ("Rprop", {}, None),
    ("Rprop", dict(lr=0.05, etas=(0.3, 1.5), step_sizes=(1e-3, 0.2), maximize=True), None),
    ("Rprop", {}, [dict(lr=0.1), dict(step_sizes=(1e-4, 1.0))]),
    ("ASGD", {}, None),
    ("ASGD", dict(lr=0.05, lambd=1e-2, alpha=0.5, t0=3, weight_decay=0.1, maximize=True), None),
    ("ASGD", dict(t0=2), [dict(lr=0.1), dict(alpha=0.9)]),
]


@pytest.mark.parametrize("name,kw,groups", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_torch(name, kw, groups):
    tparams, pparams = _params()
    topt = getattr(torch.optim, name)(_groups(tparams, groups), **kw)
    popt = getattr(tp.optim, name)(_groups(pparams, groups), **kw)
    _steps(tparams, pparams, topt, popt, 8, torch.Generator().manual_seed(7))
    tsd, psd = topt.state_dict(), popt.state_dict()
    assert tsd["param_groups"] == psd["param_groups"]
    assert sorted(tsd["state"]) == sorted(psd["state"])
    for i in tsd["state"]:
        assert sorted(tsd["state"][i]) == sorted(psd["state"][i])
        for k in tsd["state"][i]:
            assert_close(psd["state"][i][k], tsd["state"][i][k], exact=True, msg=f"{i}.{k}")


@pytest.mark.parametrize("name,kw", [("Adadelta", dict(weight_decay=0.1)), ("Adagrad", dict(lr_decay=0.1)),
                                     ("RMSprop", dict(momentum=0.9, centered=True)), ("Adamax", {}),
                                     ("NAdam", {}), ("RAdam", dict(betas=(0.5, 0.9))), ("Rprop", {}),
                                     ("ASGD", dict(t0=2))])
@pytest.mark.parametrize("source", ["tp", "torch"])
def test_state_dict_resume(name, kw, source):
    """After 4 steps, an optimiser loaded from a state dict (ours or torch's, through a deep copy)
    continues exactly as the original does."""
    tparams, pparams = _params()
    topt = getattr(torch.optim, name)(tparams, **kw)
    popt = getattr(tp.optim, name)(pparams, **kw)
    gen = torch.Generator().manual_seed(3)
    _steps(tparams, pparams, topt, popt, 4, gen)
    sd = copy.deepcopy((popt if source == "tp" else topt).state_dict())
    fresh = [nn.Parameter(tp.from_torch(p.detach().clone())) for p in tparams]
    resumed = getattr(tp.optim, name)(fresh, **kw)
    resumed.load_state_dict(sd)
    for params, opt in ((pparams, popt), (fresh, resumed)):
        gen = torch.Generator().manual_seed(5)
        for _ in range(3):
            for p in params:
                p.grad = tp.from_torch(torch.randn(p.shape, generator=gen))
            opt.step()
    for a, b in zip(pparams, fresh):
        assert_close(b, a.detach(), exact=True)


@pytest.mark.parametrize("name", ["Adadelta", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD"])
def test_bad_hyperparameters_and_sparse(name):
    p = nn.Parameter(tp.randn(3))
    with pytest.raises(ValueError, match=f"tp.optim.{name}"):
        getattr(tp.optim, name)([p], lr=-1.0)
    opt = getattr(tp.optim, name)([p])
    p.grad = tp.from_torch(torch.randn(3).to_sparse())
    with pytest.raises(RuntimeError, match=f"tp.optim.{name}"):
        opt.step()


def _problem(seed=0):
    """A small non-linear least-squares fit: tp and torch copies of the same weights and data.  The tp
    closure takes its loss and gradients from torch's autograd on tp's current weights, so that both
    optimisers see the same numbers and any difference is the optimiser's."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(20, 4, generator=g), torch.randn(20, 2, generator=g)
    w, b = torch.randn(4, 2, generator=g), torch.randn(2, generator=g)
    tw, tb = torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())
    pw, pb = nn.Parameter(tp.from_torch(w.clone())), nn.Parameter(tp.from_torch(b.clone()))

    def f(w, b):
        return (torch.tanh(x @ w + b) - y).pow(2).mean()

    def tclosure(opt):
        def c():
            opt.zero_grad()
            loss = f(tw, tb)
            loss.backward()
            return loss
        return c

    def pclosure(opt):
        def c():
            opt.zero_grad()
            ws = [p._data.detach().clone().requires_grad_() for p in (pw, pb)]
            loss = f(*ws)
            loss.backward()
            for p, v in zip((pw, pb), ws):
                p.grad = tp.from_torch(v.grad)
            return tp.from_torch(loss.detach())
        return c
    return (tw, tb), (pw, pb), tclosure, pclosure


@pytest.mark.parametrize("kw", [{}, dict(line_search_fn="strong_wolfe"), dict(history_size=2, max_iter=7),
                                dict(lr=0.5, history_size=3, line_search_fn="strong_wolfe", max_eval=9)])
def test_lbfgs_matches_torch(kw):
    tps, pps, tclosure, pclosure = _problem()
    topt, popt = torch.optim.LBFGS(tps, **kw), tp.optim.LBFGS(pps, **kw)
    for _ in range(3):
        tl = topt.step(tclosure(topt))
        pl = popt.step(pclosure(popt))
        assert_close(pl, tl.detach(), exact=True)
        for a, b in zip(tps, pps):
            assert_close(b, a.detach(), exact=True)
    ts, ps = topt.state[tps[0]], popt.state[pps[0]]
    assert ts["n_iter"] == ps["n_iter"] and ts["func_evals"] == ps["func_evals"]
    assert len(ts["old_dirs"]) == len(ps["old_dirs"])


def test_lbfgs_state_dict_resume_and_errors():
    _, pps, _, pclosure = _problem(1)
    opt = tp.optim.LBFGS(pps, history_size=4, max_iter=5)
    opt.step(pclosure(opt))
    sd = copy.deepcopy(opt.state_dict())
    _, fresh, _, fresh_closure = _problem(1)
    for a, b in zip(fresh, pps):
        a._data.copy_(b._data)
    resumed = tp.optim.LBFGS(fresh, history_size=4, max_iter=5)
    resumed.load_state_dict(sd)
    for _ in range(2):
        opt.step(pclosure(opt))
        resumed.step(fresh_closure(resumed))
    for a, b in zip(pps, fresh):
        assert_close(b, a.detach(), exact=True)
    with pytest.raises(ValueError, match="tp.optim.LBFGS"):
        tp.optim.LBFGS([dict(params=[pps[0]]), dict(params=[pps[1]])])
    with pytest.raises(ValueError, match="tp.optim.LBFGS"):
        tp.optim.LBFGS(pps, line_search_fn="armijo")


def test_lbfgs_with_tp_autograd_converges_like_torch():
    """End to end with tp's own autograd (gradients equal torch's to rounding): the same minimum."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(30, 3, generator=g), torch.randn(30, generator=g)
    tw = torch.nn.Parameter(torch.zeros(3) + 0.1)
    pw = nn.Parameter(tp.from_torch(tw.detach().clone()))
    topt = torch.optim.LBFGS([tw], line_search_fn="strong_wolfe")
    popt = tp.optim.LBFGS([pw], line_search_fn="strong_wolfe")
    px, py = tp.from_torch(x), tp.from_torch(y)

    def tc():
        topt.zero_grad()
        loss = ((x @ tw - y) ** 2).mean()
        loss.backward()
        return loss

    def pc():
        popt.zero_grad()
        loss = ((px @ pw - py) ** 2).mean()
        loss.backward()
        return loss
    for _ in range(2):
        topt.step(tc)
        popt.step(pc)
    assert_close(pw, tw.detach(), rtol=1e-5, atol=1e-6)
