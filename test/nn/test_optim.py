"""tp.optim against torch.optim: the same gradients give the same parameters over several steps (with
parameter groups), state_dict layout and round trips, and learning-rate schedules."""
import math

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close

SHAPES = [(4, 3), (3,), (2, 5), (5,)]


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=g) for s in SHAPES]
    tparams = [torch.nn.Parameter(t.clone()) for t in ts]
    pparams = [nn.Parameter(tp.from_torch(t.clone())) for t in ts]
    return tparams, pparams


def _groups(params, group_opts):
    if group_opts is None:
        return params
    return [dict(params=params[:2], **group_opts[0]), dict(params=params[2:], **group_opts[1])]


def _run(tparams, pparams, topt, popt, steps, seed=1, closure=False):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for tpar, ppar in zip(tparams, pparams):
            grad = torch.randn(tpar.shape, generator=g)
            tpar.grad = grad.clone()
            ppar.grad = tp.from_torch(grad.clone())
        topt.step()
        popt.step()
        for tpar, ppar in zip(tparams, pparams):
            assert_close(ppar, tpar.detach(), exact=True)


CASES = [
    ("SGD", dict(lr=0.1), None),
    ("SGD", dict(lr=0.1, momentum=0.9), None),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01), None),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1, maximize=True), None),
    ("SGD", dict(lr=0.1), [dict(momentum=0.9), dict(lr=0.01, nesterov=True, momentum=0.5)]),
    ("Adam", dict(lr=1e-2), None),
    ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), None),
    ("Adam", dict(lr=1e-2, amsgrad=True, maximize=True), None),
    ("Adam", dict(lr=1e-2), [dict(weight_decay=0.05), dict(lr=1e-3, amsgrad=True, betas=(0.5, 0.9))]),
    ("AdamW", dict(lr=1e-2), None),
    ("AdamW", dict(lr=1e-2, weight_decay=0.3, amsgrad=True), None),
    ("AdamW", dict(lr=1e-2), [dict(weight_decay=0.1), dict(weight_decay=0.0, lr=3e-3)]),
]


@pytest.mark.parametrize("name,kw,groups", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_torch(name, kw, groups):
    tparams, pparams = _params()
    topt = getattr(torch.optim, name)(_groups(tparams, groups), **kw)
    popt = getattr(tp.optim, name)(_groups(pparams, groups), **kw)
    _run(tparams, pparams, topt, popt, steps=6)
    # state dict: same layout and values as torch's
    tsd, psd = topt.state_dict(), popt.state_dict()
    assert tsd["param_groups"] == psd["param_groups"]
    assert list(tsd["state"]) == list(psd["state"])
    for i in tsd["state"]:
        assert list(tsd["state"][i]) == list(psd["state"][i])
        for k in tsd["state"][i]:
            assert_close(psd["state"][i][k], tsd["state"][i][k], rtol=1e-6, atol=1e-7, msg=f"{i}.{k}")


@pytest.mark.parametrize("name,kw", [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=1e-2, amsgrad=True)),
                                     ("AdamW", dict(lr=1e-2))])
def test_state_dict_resume(name, kw):
    """Resume from a state dict (ours, or torch's) and continue exactly like the original."""
    tparams, pparams = _params()
    topt = getattr(torch.optim, name)(tparams, **kw)
    popt = getattr(tp.optim, name)(pparams, **kw)
    _run(tparams, pparams, topt, popt, steps=3)
    # a fresh tp optimizer over the same parameters, restored from popt's state dict
    popt2 = getattr(tp.optim, name)(pparams, **kw)
    popt2.load_state_dict(popt.state_dict())
    _run(tparams, pparams, topt, popt2, steps=3, seed=5)
    # ... and one restored from torch's own state dict
    popt3 = getattr(tp.optim, name)(pparams, **kw)
    popt3.load_state_dict(topt.state_dict())
    _run(tparams, pparams, topt, popt3, steps=2, seed=7)
    # the loaded state does not alias the source
    sd = popt3.state_dict()
    k = next(iter(sd["state"][0]))
    assert sd["state"][0][k].data_ptr() != topt.state_dict()["state"][0][k].data_ptr()


def test_load_state_dict_validation():
    _, pparams = _params()
    opt = tp.optim.SGD(pparams, lr=0.1)
    other = tp.optim.SGD([dict(params=pparams[:2]), dict(params=pparams[2:])], lr=0.1)
    with pytest.raises(ValueError, match="number of parameter groups"):
        opt.load_state_dict(other.state_dict())
    small = tp.optim.SGD(pparams[:3], lr=0.1)
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict(small.state_dict())


def test_param_groups_api():
    _, pparams = _params()
    opt = tp.optim.Adam(pparams[:2], lr=0.1)
    opt.add_param_group({"params": pparams[2:], "lr": 0.01})
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [pparams[0]]})
    with pytest.raises(ValueError, match="empty parameter list"):
        tp.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable"):
        tp.optim.SGD(pparams[0], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        tp.optim.Adam(pparams, lr=-1)
    with pytest.raises(ValueError, match="Nesterov"):
        tp.optim.SGD(pparams, lr=0.1, nesterov=True)
    assert "Parameter Group 1" in repr(opt) and "lr: 0.01" in repr(opt)


def test_zero_grad_and_skip_params_without_grad():
    _, pparams = _params()
    opt = tp.optim.SGD(pparams, lr=0.1, momentum=0.9)
    pparams[0].grad = tp.ones(*SHAPES[0])
    before = [p.torch().clone() for p in pparams]
    opt.step()
    assert not torch.equal(pparams[0].torch(), before[0])
    assert all(torch.equal(p.torch(), b) for p, b in zip(pparams[1:], before[1:]))
    assert len(opt.state) == 1
    opt.zero_grad(set_to_none=False)
    assert pparams[0].grad is not None and not pparams[0].grad.torch().any()
    opt.zero_grad()
    assert pparams[0].grad is None


def test_training_loop_matches_torch():
    """End to end: model, loss, backward, Adam steps; tp and torch stay together."""
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    pm = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    pm.load_state_dict(tm.state_dict())
    topt = torch.optim.Adam(tm.parameters(), lr=0.01)
    popt = tp.optim.Adam(pm.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    px, py = tp.from_torch(x), tp.from_torch(y)
    for _ in range(5):
        tl = torch.nn.functional.cross_entropy(tm(x), y)
        topt.zero_grad()
        tl.backward()
        topt.step()

        def closure():
            popt.zero_grad()
            loss = nn.functional.cross_entropy(pm(px), py)
            loss.backward()
            return loss
        pl = popt.step(closure)
        assert_close(pl, tl, rtol=1e-5, atol=1e-6)
    for (n, a), b in zip(pm.named_parameters(), tm.parameters()):
        assert_close(a, b.detach(), rtol=1e-5, atol=1e-6, msg=n)


def test_optimizer_survives_module_to():
    m = nn.Linear(3, 2)
    opt = tp.optim.SGD(m.parameters(), lr=0.5)
    m.double()
    m(tp.randn(4, 3, dtype=tp.float64)).sum().backward()
    w = m.weight.torch().clone()
    opt.step()
    assert m.weight.dtype == tp.float64
    assert_close(m.weight.torch(), w - 0.5 * m.weight.grad.torch())


# ---------------------------------------------------------------------------------------------
# learning-rate schedulers
# ---------------------------------------------------------------------------------------------
SCHEDS = [
    ("StepLR", dict(step_size=3, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[2, 5, 5, 9], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=7, eta_min=0.001)),
    ("CosineAnnealingLR", dict(T_max=10)),
    ("LambdaLR", dict(lr_lambda=lambda e: 1.0 / (1 + e))),
    ("LinearLR", dict(start_factor=0.25, total_iters=4)),
]


@pytest.mark.parametrize("name,kw", SCHEDS, ids=[s[0] + str(i) for i, s in enumerate(SCHEDS)])
def test_scheduler_matches_torch(name, kw):
    tparams, pparams = _params()
    topt = torch.optim.SGD([dict(params=tparams[:2]), dict(params=tparams[2:], lr=0.05)], lr=0.1)
    popt = tp.optim.SGD([dict(params=pparams[:2]), dict(params=pparams[2:], lr=0.05)], lr=0.1)
    ts = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
    ps = getattr(tp.optim.lr_scheduler, name)(popt, **kw)
    seq_t, seq_p = [ts.get_last_lr()], [ps.get_last_lr()]
    for _ in range(25):
        topt.step()
        popt.step()
        ts.step()
        ps.step()
        seq_t.append(ts.get_last_lr())
        seq_p.append(ps.get_last_lr())
    for a, b in zip(seq_p, seq_t):
        assert a == b  # same recurrences as PyTorch: the same floats
    assert [g["lr"] for g in popt.param_groups] == seq_p[-1]
    assert ps.last_epoch == ts.last_epoch == 25


def test_scheduler_state_dict_and_resume():
    _, pparams = _params()
    opt = tp.optim.SGD(pparams, lr=0.1)
    s = tp.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        s.step()
    sd = s.state_dict()
    assert sd["last_epoch"] == 4 and "optimizer" not in sd
    opt2 = tp.optim.SGD(pparams, lr=0.1)
    s2 = tp.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=10)
    s2.load_state_dict(sd)
    opt2.param_groups[0]["lr"] = opt.param_groups[0]["lr"]
    s.step()
    s2.step()
    assert s.get_last_lr() == pytest.approx(s2.get_last_lr())
    expected = 0.1 * (1 + math.cos(math.pi * 5 / 10)) / 2
    assert s.get_last_lr()[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"amsgrad": True, "maximize": True, "weight_decay": 0.05}])
def test_adam_foreach_matches_torch_foreach_bitwise(name, kw):
    """``foreach=True`` (the default on a GPU) takes torch's multi-tensor path: the same results as
    torch's foreach Adam to the bit, over mixed dtypes and a parameter without a gradient at a step."""
    torch.manual_seed(0)
    ws = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2, dtype=torch.float64)]
    ours = [tp.from_torch(w.clone()).requires_grad_() for w in ws]
    ref = [w.clone().requires_grad_() for w in ws]
    o1 = getattr(tp.optim, name)(ours, lr=1e-2, foreach=True, **kw)
    o2 = getattr(torch.optim, name)(ref, lr=1e-2, foreach=True, **kw)
    for it in range(5):
        for k, (a, b) in enumerate(zip(ours, ref)):
            g = torch.randn_like(b)
            a.grad, b.grad = (None, None) if it == 2 and k == 1 else (tp.from_torch(g.clone()), g.clone())
        o1.step()
        o2.step()
    for a, b in zip(ours, ref):
        assert torch.equal(a.torch().detach(), b.detach())
    assert float(o1.state[ours[1]]["step"].item()) == 4.0
