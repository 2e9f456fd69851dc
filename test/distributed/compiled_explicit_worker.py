"""Run under ``python -m tensorplay.distributed.launch --nproc N`` as ``compiled_explicit_worker.py OUT X Y``:
``tp.compile`` of explicit-mode functions called with ShardedArrays, on an X x Y mesh.  Every rank
builds the same seeded inputs, calls each compiled function twice (the first call is the capture
run), runs the same function eagerly in explicit mode, and saves what it saw to ``OUT/rank<r>.pt``;
rank 0 also saves the inputs, from which test_compiled_explicit.py computes single-process references."""
import sys
from pathlib import Path

import torch

import tensorplay as tp
import tensorplay.distributed as D
import tensorplay.nn.functional as F
from tensorplay.distributed import P, NamedSharding
from tensorplay.distributed.compiled import _PROGRAMS


def t(x):
    return x.detach()._data.clone() if isinstance(x, tp.Tensor) else x


def seen(y):
    return {"local": t(y.local()), "spec": tuple(y.spec), "shape": tuple(y.shape),
            "index": y.sharding.index(D.rank(), tuple(y.shape))}


def counters(cf):
    (_, inner), = _PROGRAMS[cf].values()
    return inner.counters


def mlp(x, w, bias, gamma, beta):
    h = D.matmul(x, w, out_sharding=P("X", "Y")) + bias
    s = tp.softmax(h.tanh(), -1)
    ln = F.layer_norm(s, [s.shape[-1]], gamma, beta)
    return (ln * ln).mean() + h.amax(0).sum() + (x @ w).sum(1).mean() + h.t().reshape(16, 2, 4).sum(0).sum()


def main():
    out, nx, ny = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    D.init()
    mesh = D.make_mesh((nx, ny), ("X", "Y"))

    def put(x, *spec):
        return D.device_put(x, NamedSharding(mesh, P(*spec)))

    g = torch.Generator().manual_seed(0)
    ints = {k: torch.randint(-5, 6, shape, generator=g).float() for k, shape in {"In": (8, 16), "W": (16, 12)}.items()}
    floats = {k: torch.randn(shape, generator=g) for k, shape in
              {"x": (8, 16), "w": (16, 16), "bias": (16,), "gamma": (16,), "beta": (16,)}.items()}
    rec = {}
    In, W = put(tp.Tensor(ints["In"]), "X", "Y"), put(tp.Tensor(ints["W"]), "Y", None)

    # the seed's In @ W: an output P('X', None) all-reduces over Y, one split along Y reduce-scatters
    for name, f in {"allreduce": lambda a, w: a @ w,
                    "reduce_scatter": lambda a, w: D.matmul(a, w, out_sharding=P("X", "Y"))}.items():
        cf = tp.compile(f)
        cf(In, W)                                   # the capture run
        rec[name] = seen(cf(In, W))
        rec[name + "_eager"] = seen(f(In, W))
        rec[name + "_counters"] = counters(cf)
        lowered = cf.lower(In, W)                   # (every process lowers: the capture communicates)
        rec[name + "_text"] = lowered.as_text()
        rec[name + "_staged"] = seen(lowered.compile()(In, W))

    # a layer (pointwise, softmax, layer_norm, reductions, views), eagerly
    leaves = {k: tp.Tensor(v.clone(), requires_grad=True) for k, v in floats.items()}
    with tp.no_grad():
        rec["mlp_eager"] = seen(mlp(put(leaves["x"], "X", "Y"), put(leaves["w"], "Y", None), leaves["bias"],
                                    leaves["gamma"], leaves["beta"]))

    # training: the loss's gradients through the compiled local program, twice (capture run, compiled)
    cf = tp.compile(mlp)
    rec["grad"] = []
    for step in range(2):
        for v in leaves.values():
            v.grad = None
        x, w = put(leaves["x"], "X", "Y"), put(leaves["w"], "Y", None)
        loss = cf(x, w, leaves["bias"], leaves["gamma"], leaves["beta"])
        loss.backward()
        rec["grad"].append({"loss": t(loss.local()), **{k: t(v.grad) for k, v in leaves.items()}})
    rec["mlp"] = seen(loss)
    rec["grad_counters"] = counters(cf)

    # a compiled nn.Linear, data parallel: rows split over every device, the parameters replicated
    lin = tp.nn.Linear(16, 16)
    with tp.no_grad():
        lin.weight.copy_(tp.Tensor(floats["w"]))
        lin.bias.copy_(tp.Tensor(floats["bias"]))
    cm = tp.compile(lin)
    rec["linear"] = []
    for step in range(2):
        lin.zero_grad()
        y = cm(put(tp.Tensor(floats["x"]), ("X", "Y"), None))
        loss = (y * y).mean()
        loss.backward()
        rec["linear"].append({"spec": tuple(y.spec), "loss": t(loss.local()), "weight": t(lin.weight.grad),
                              "bias": t(lin.bias.grad)})

    # errors
    try:
        tp.compile(lambda a: a.sum())(a=In)
    except TypeError as e:
        rec["kwargs_error"] = str(e)
    try:
        xg = put(leaves["x"], "X", "Y")
        tp.compile(lambda a: a.gather().sum())(xg)
    except Exception as e:          # (the capture reports it as a CaptureError naming the line)
        rec["gather_error"] = f"{type(e).__name__}: {e}"

    me = D.rank()
    torch.save({"rec": rec, "inputs": {**ints, **floats} if me == 0 else None}, out / f"rank{me}.pt")
    D.shutdown()


if __name__ == "__main__":
    main()
