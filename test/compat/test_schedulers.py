"""The learning-rate schedulers added for PyTorch compatibility against torch.optim.lr_scheduler: the
same rates (and cycled momenta) to the bit over 50 steps on two parameter groups, the same
``state_dict`` keys, resumption from a state dict, composites, and clear errors for bad arguments."""
import copy

import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close

L = tp.optim.lr_scheduler
TL = torch.optim.lr_scheduler


def _opts(kind="SGD"):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(3, generator=g), torch.randn(2, 2, generator=g)]
    tw = [torch.nn.Parameter(w.clone()) for w in ws]
    pw = [nn.Parameter(tp.from_torch(w.clone())) for w in ws]
    kw = dict(momentum=0.9) if kind == "SGD" else {}
    topt = getattr(torch.optim, kind)([dict(params=tw[:1]), dict(params=tw[1:], lr=0.05)], lr=0.1, **kw)
    popt = getattr(tp.optim, kind)([dict(params=pw[:1]), dict(params=pw[1:], lr=0.05)], lr=0.1, **kw)
    return topt, popt


def _hyper(opt):
    return [(g["lr"], g.get("momentum"), g.get("betas")) for g in opt.param_groups]


def _sequence(opt, sched, steps, metrics=None):
    out = [(sched.get_last_lr(), _hyper(opt))]
    for i in range(steps):
        opt.step()
        if metrics is None:
            sched.step()
        else:
            sched.step(metrics[i])
        out.append((list(sched.get_last_lr()), _hyper(opt)))
    return out


def _keys(sched):
    """The state-dict keys but torch's bookkeeping flags of its ``get_lr`` warnings."""
    return sorted(set(sched.state_dict()) - {"_get_lr_called_within_step", "_is_initial"})


class Halve:
    """A picklable callable lr_lambda (its ``__dict__`` goes into the state dict)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, epoch):
        return 0.5 if epoch % self.k == 0 else 1.0


CASES = [
    ("MultiplicativeLR", dict(lr_lambda=lambda e: 0.95), "SGD"),
    ("MultiplicativeLR", dict(lr_lambda=Halve(7)), "SGD"),
    ("ConstantLR", {}, "SGD"),
    ("ConstantLR", dict(factor=0.2, total_iters=13), "SGD"),
    ("PolynomialLR", {}, "SGD"),
    ("PolynomialLR", dict(total_iters=30, power=2.5), "SGD"),
    ("CosineAnnealingWarmRestarts", dict(T_0=7), "SGD"),
    ("CosineAnnealingWarmRestarts", dict(T_0=3, T_mult=2, eta_min=1e-3), "SGD"),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=6), "SGD"),
    ("CyclicLR", dict(base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=4, step_size_down=9, mode="triangular2"),
     "SGD"),
    ("CyclicLR", dict(base_lr=0.001, max_lr=0.01, step_size_up=5, mode="exp_range", gamma=0.97), "Adam"),
    ("CyclicLR", dict(base_lr=0.001, max_lr=0.01, step_size_up=5, scale_fn=lambda x: 0.9 ** x,
                      scale_mode="iterations", cycle_momentum=False), "Adam"),
    ("OneCycleLR", dict(max_lr=0.3, total_steps=50), "SGD"),
    ("OneCycleLR", dict(max_lr=[0.3, 0.2], epochs=5, steps_per_epoch=10, pct_start=0.25, anneal_strategy="linear",
                        three_phase=True), "SGD"),
    ("OneCycleLR", dict(max_lr=0.01, total_steps=60, div_factor=10.0, final_div_factor=100.0), "Adam"),
]


@pytest.mark.parametrize("name,kw,kind", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_torch(name, kw, kind):
    topt, popt = _opts(kind)
    ts, ps = getattr(TL, name)(topt, **kw), getattr(L, name)(popt, **kw)
    assert _sequence(popt, ps, 50) == _sequence(topt, ts, 50)
    assert ps.last_epoch == ts.last_epoch
    assert _keys(ps) == _keys(ts)


@pytest.mark.parametrize("kw", [{}, dict(mode="max", factor=0.5, patience=2, threshold=0.05, cooldown=3),
                                dict(threshold_mode="abs", threshold=0.1, patience=1, min_lr=[0.03, 0.01]),
                                dict(patience=0, eps=0.02)])
def test_reduce_on_plateau_matches_torch(kw):
    g = torch.Generator().manual_seed(1)
    metrics = (1.0 + torch.rand(50, generator=g) - torch.linspace(0, 0.6, 50)).tolist()
    topt, popt = _opts()
    ts, ps = TL.ReduceLROnPlateau(topt, **kw), L.ReduceLROnPlateau(popt, **kw)
    assert _sequence(popt, ps, 50, metrics) == _sequence(topt, ts, 50, metrics)
    assert ps.best == ts.best and ps.num_bad_epochs == ts.num_bad_epochs
    assert _keys(ps) == _keys(ts)


def _composites(mod, opt):
    seq = mod.SequentialLR(opt, [mod.LinearLR(opt, start_factor=0.1, total_iters=5),
                                 mod.CosineAnnealingLR(opt, T_max=20),
                                 mod.StepLR(opt, step_size=4, gamma=0.5)], milestones=[5, 25])
    chained = mod.ChainedScheduler([mod.ConstantLR(opt, factor=0.5, total_iters=8),
                                    mod.ExponentialLR(opt, gamma=0.97)])
    return seq, chained


@pytest.mark.parametrize("which", [0, 1])
def test_composites_match_torch(which):
    topt, popt = _opts()
    ts, ps = _composites(TL, topt)[which], _composites(L, popt)[which]
    assert _sequence(popt, ps, 50) == _sequence(topt, ts, 50)
    assert _keys(ps) == _keys(ts)


def _resume(make, steps=20, more=30, metrics=None):
    """Run ``steps`` steps, save optimiser and scheduler state, rebuild both, load, continue: the
    continuation equals the original's."""
    _, popt = _opts()
    sched = make(popt)
    _sequence(popt, sched, steps, None if metrics is None else metrics[:steps])
    osd, ssd = copy.deepcopy(popt.state_dict()), copy.deepcopy(sched.state_dict())
    _, popt2 = _opts()
    sched2 = make(popt2)
    popt2.load_state_dict(osd)
    sched2.load_state_dict(ssd)
    rest = None if metrics is None else metrics[steps:]
    assert _sequence(popt2, sched2, more, rest) == _sequence(popt, sched, more, rest)


@pytest.mark.parametrize("make", [
    lambda o: L.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=2),
    lambda o: L.CyclicLR(o, 0.01, 0.1, step_size_up=7, mode="triangular2"),
    lambda o: L.OneCycleLR(o, max_lr=0.2, total_steps=60),
    lambda o: L.PolynomialLR(o, total_iters=40, power=0.5),
    lambda o: L.MultiplicativeLR(o, Halve(3)),
    lambda o: _composites(L, o)[0],
    lambda o: _composites(L, o)[1],
], ids=["warm_restarts", "cyclic", "one_cycle", "polynomial", "multiplicative", "sequential", "chained"])
def test_state_dict_resume(make):
    _resume(make)


def test_reduce_on_plateau_resume():
    metrics = [1.0, 0.9, 0.95, 0.97, 0.99, 0.8, 0.85, 0.86, 0.87, 0.7] * 3
    _resume(lambda o: L.ReduceLROnPlateau(o, patience=1, cooldown=1), steps=12, more=18, metrics=metrics)


def test_warm_restarts_fractional_epochs_match_torch():
    topt, popt = _opts()
    ts, ps = TL.CosineAnnealingWarmRestarts(topt, T_0=3, T_mult=2), L.CosineAnnealingWarmRestarts(popt, T_0=3,
                                                                                                  T_mult=2)
    for e in [0.5, 1.25, 3.0, 7.5, 10.0, 20.2]:
        ts.step(e)
        ps.step(e)
        assert ps.get_last_lr() == ts.get_last_lr()


def test_bad_arguments():
    _, popt = _opts()
    with pytest.raises(ValueError, match="ConstantLR"):
        L.ConstantLR(popt, factor=1.5)
    with pytest.raises(ValueError, match="CosineAnnealingWarmRestarts"):
        L.CosineAnnealingWarmRestarts(popt, T_0=0)
    with pytest.raises(ValueError, match="OneCycleLR"):
        L.OneCycleLR(popt, max_lr=0.1)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        L.ReduceLROnPlateau(popt, factor=2.0)
    with pytest.raises(ValueError, match="SequentialLR"):
        L.SequentialLR(popt, [L.ConstantLR(popt)], milestones=[3])
    with pytest.raises(ValueError, match="ChainedScheduler"):
        L.ChainedScheduler([L.ReduceLROnPlateau(popt)])
    s = L.OneCycleLR(popt, max_lr=0.1, total_steps=3)
    for _ in range(3):
        s.step()
    with pytest.raises(ValueError, match="OneCycleLR"):
        s.step()


# ---- swa_utils ----------------------------------------------------------------------------------------
SW = tp.optim.swa_utils
TSW = torch.optim.swa_utils


@pytest.mark.parametrize("kw", [dict(swa_lr=0.01), dict(swa_lr=[0.02, 0.005], anneal_epochs=4,
                                                         anneal_strategy="linear"), dict(swa_lr=0.03, anneal_epochs=0)])
def test_swalr_matches_torch(kw):
    topt, popt = _opts()
    ts, ps = TSW.SWALR(topt, **kw), SW.SWALR(popt, **kw)
    assert _sequence(popt, ps, 30) == _sequence(topt, ts, 30)
    assert _keys(ps) == sorted(set(_keys(ts)) - {"anneal_func"})
    with pytest.raises(ValueError, match="SWALR"):
        SW.SWALR(popt, 0.1, anneal_strategy="step")


def _pair_models():
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    p = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    p.load_state_dict({k: tp.from_torch(v.clone()) for k, v in t.state_dict().items()})
    return t, p


def _perturb(t, p, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (a, b) in zip(list(t.parameters()) + list(t.buffers()), list(p.parameters()) + list(p.buffers())):
            if a.is_floating_point():
                delta = torch.randn(a.shape, generator=g)
                a.add_(delta)
                b._data.add_(delta)
            else:
                a.add_(1)
                b._data.add_(1)


@pytest.mark.parametrize("how", ["swa", "ema_multi", "ema_fn", "swa_fn", "buffers"])
def test_averaged_model_matches_torch(how):
    t, p = _pair_models()
    kw = {"ema_multi": lambda m: dict(multi_avg_fn=m.get_ema_multi_avg_fn(0.9)),
          "ema_fn": lambda m: dict(avg_fn=m.get_ema_avg_fn(0.8)),
          "swa_fn": lambda m: dict(avg_fn=m.get_swa_avg_fn()),
          "buffers": lambda m: dict(use_buffers=True), "swa": lambda m: {}}[how]
    ta, pa = TSW.AveragedModel(t, **kw(TSW)), SW.AveragedModel(p, **kw(SW))
    for k in range(5):
        _perturb(t, p, k)
        ta.update_parameters(t)
        pa.update_parameters(p)
    tsd, psd = ta.state_dict(), pa.state_dict()
    assert list(tsd) == list(psd)
    for k in tsd:
        assert_close(psd[k], tsd[k], exact=True, msg=k)
    x = torch.randn(6, 3)
    ta.eval()
    pa.eval()
    assert_close(pa(tp.from_torch(x)), ta(x).detach(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="AveragedModel"):
        SW.AveragedModel(p, avg_fn=SW.get_swa_avg_fn(), multi_avg_fn=SW.get_swa_multi_avg_fn())
    with pytest.raises(ValueError, match="decay"):
        SW.get_ema_avg_fn(1.5)


def test_update_bn_matches_torch():
    t, p = _pair_models()
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(5, 3, generator=g) for _ in range(4)]
    TSW.update_bn([(x, 0) for x in xs], t)
    SW.update_bn([(tp.from_torch(x), 0) for x in xs], p)
    for k, v in t.state_dict().items():
        assert_close(p.state_dict()[k], v, rtol=1e-6, atol=1e-7, msg=k)
    assert p[1].momentum == t[1].momentum == 0.1 and p.training
