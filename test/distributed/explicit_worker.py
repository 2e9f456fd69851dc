"""Run under ``python -m tensorplay.distributed.launch --nproc 4`` as ``explicit_worker.py OUT``: the
explicit-mode scenarios of test_explicit.py on a 2x2 mesh (X=2, Y=2).  Every rank builds the same
seeded inputs, runs each scenario on ShardedArrays and saves what it saw (local blocks, specs, the
collectives explain() recorded, gradients, error messages) to ``OUT/rank<r>.pt``; rank 0 also saves
the inputs, from which the test computes the single-process references."""
import sys
from pathlib import Path

import torch

import tensorplay as tp
import tensorplay.distributed as D
import tensorplay.nn.functional as F
from tensorplay.distributed import P, NamedSharding


def t(x):
    return x.detach()._data.clone() if isinstance(x, tp.Tensor) else x


def seen(y, e=None):
    """What a rank records of a ShardedArray result (and of the explanation that produced it)."""
    out = {"local": t(y.local()), "spec": tuple(y.spec), "shape": tuple(y.shape),
           "index": y.sharding.index(D.rank(), tuple(y.shape))}
    if e is not None:
        out["collectives"] = [(c["kind"], c["axes"], c["bytes"], c["local"], c["out"]) for c in e.collectives]
        out["text"] = e.text
    return out


def error(f):
    try:
        f()
    except (ValueError, NotImplementedError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def main():
    out = Path(sys.argv[1])
    D.init()
    mesh = D.make_mesh((2, 2), ("X", "Y"))

    def put(x, *spec):
        return D.device_put(x, NamedSharding(mesh, P(*spec)))

    g = torch.Generator().manual_seed(0)
    ints = {k: torch.randint(-5, 6, shape, generator=g).float() for k, shape in
            {"In": (8, 4), "W": (4, 6), "b": (4,), "c": (1, 4), "d": (8, 1), "a3": (4, 4, 2)}.items()}
    ints["ids"] = torch.randint(0, 10, (8, 2), generator=g)
    floats = {k: torch.randn(shape, generator=g) for k, shape in
              {"x": (8, 4), "w": (4, 6), "bias": (6,), "gamma": (6,), "beta": (6,), "E": (10, 4)}.items()}
    rec = {}
    In, W = put(tp.Tensor(ints["In"]), "X", "Y"), put(tp.Tensor(ints["W"]), "Y", None)

    # the seed's In @ W, both ways
    e = D.explain(lambda a, w: (a @ w).reduce(), In, W)
    rec["matmul_allreduce"] = seen(e.result, e)
    e = D.explain(lambda a, w: D.with_sharding_constraint(a @ w, P("X", "Y")), In, W)
    rec["matmul_reduce_scatter"] = seen(e.result, e)
    e = D.explain(lambda a, w: D.matmul(a, w, out_sharding=NamedSharding(mesh, P("X", "Y"))), In, W)
    rec["matmul_out_sharding"] = seen(e.result, e)
    rec["matmul_pending"] = repr(In @ W).startswith("PartialSum(")

    # tp.compile of the local program
    f = lambda a, w: (a @ w).reduce()
    rec["compiled_text"] = D.compiled_text(f, In, W)
    rec["compiled_text_rs"] = D.compiled_text(lambda a, w: D.matmul(a, w, out_sharding=P("X", "Y")), In, W)
    prog = D.on_blocks(f, In, W)
    y = tp.compile(prog)(In.local(), W.local())
    sharding, shape = prog.out_shardings[0]
    rec["compiled_run"] = {"local": t(y), "spec": tuple(sharding.spec), "shape": shape,
                           "index": sharding.index(D.rank(), shape)}

    # pointwise with broadcasting
    b, c, d = tp.Tensor(ints["b"]), put(tp.Tensor(ints["c"]), None, "Y"), put(tp.Tensor(ints["d"]), "X")
    e = D.explain(lambda a: a * b + c - d, In)
    rec["pointwise"] = seen(e.result, e)
    e = D.explain(lambda a, r: a + r * 2, In, put(tp.Tensor(ints["In"]), "X"))
    rec["pointwise_slice"] = seen(e.result, e)
    rec["pointwise_error"] = error(lambda: In + put(tp.Tensor(ints["In"]), "Y"))

    # reductions
    for name, f in {"sum0": lambda a: a.sum(0), "sum1": lambda a: a.sum(1), "sum_all": lambda a: a.sum(),
                    "mean0": lambda a: a.mean(0), "mean_all": lambda a: a.mean(), "amax1": lambda a: a.amax(1),
                    "sum1_keep": lambda a: a.sum(1, keepdim=True), "var0": lambda a: a.var(0)}.items():
        e = D.explain(f, In)
        rec["reduce_" + name] = seen(e.result, e)
    e = D.explain(lambda a: a.sum(1), put(tp.Tensor(ints["In"]), "X"))
    rec["reduce_unsplit"] = seen(e.result, e)

    # views
    a3 = put(tp.Tensor(ints["a3"]), "X", None, "Y")
    for name, (f, x) in {"t": (lambda a: a.t(), In), "T": (lambda a: a.T, In),
                         "transpose": (lambda a: a.transpose(0, 1), In),
                         "permute": (lambda a: a.permute(2, 0, 1), a3),
                         "reshape": (lambda a: a.reshape(4, 2, 4), In),
                         "flatten": (lambda a: a.reshape(16, 2), a3)}.items():
        e = D.explain(f, x)
        rec["view_" + name] = seen(e.result, e)
    rec["view_error"] = error(lambda: put(tp.Tensor(ints["In"]), None, "Y").reshape(32))

    # softmax, layer_norm
    e = D.explain(lambda a: tp.softmax(a, -1), In)
    rec["softmax"] = seen(e.result, e)
    gamma4, beta4 = tp.Tensor(ints["b"]), tp.Tensor(ints["b"] * 0 + 1)
    e = D.explain(lambda a: F.layer_norm(a, [4], gamma4, beta4), In)
    rec["layer_norm"] = seen(e.result, e)

    # embedding: replicated weight, sharded ids; vocabulary-split weight
    E = tp.Tensor(floats["E"].clone())
    e = D.explain(lambda w, i: tp.embedding(w, i), put(E, None, None), put(tp.Tensor(ints["ids"]), "X", "Y"))
    rec["embedding"] = seen(e.result, e)
    e = D.explain(lambda w, i: tp.embedding(w, i).reduce(), put(tp.Tensor(floats["E"][:8].clone()), "Y", None),
                  put(tp.Tensor(ints["ids"] % 8), "X", None))
    rec["embedding_vocab"] = seen(e.result, e)

    # errors
    rec["matmul_one_side"] = error(lambda: In @ put(tp.Tensor(ints["W"]), None, None))
    rec["matmul_two_axes"] = error(lambda: In @ put(tp.Tensor(ints["W"]), "X", None))

    # gradients: every leaf a plain tensor; its .grad is the global gradient on every rank
    leaves = {k: tp.Tensor(v.clone(), requires_grad=True) for k, v in floats.items()}
    x = put(leaves["x"], "X", "Y")
    w = put(leaves["w"], "Y", None)
    h = D.matmul(x, w, out_sharding=P("X", "Y")) + leaves["bias"]
    s = tp.softmax(h.tanh(), -1)
    ln = F.layer_norm(s, [6], leaves["gamma"], leaves["beta"])
    loss = (ln * ln).mean() + h.amax(0).sum() + (x @ w).sum(1).mean() + h.t().reshape(6, 2, 4).sum(0).sum()
    loss.backward()
    rec["grad_loss"] = t(loss.local())
    rec["grad"] = {k: t(leaves[k].grad) for k in ("x", "w", "bias", "gamma", "beta")}
    ids = put(tp.Tensor(ints["ids"]), "X", "Y")
    out_rep = tp.embedding(put(leaves["E"], None, None), ids)
    out_voc = tp.embedding(put(leaves["E"][:8], "Y", None), put(tp.Tensor(ints["ids"] % 8), "X", None))
    ((out_rep * out_rep).sum() + (out_voc * 3).sum()).backward()
    rec["grad_E"] = t(leaves["E"].grad)

    me = D.rank()
    torch.save({"rec": rec, "inputs": {**ints, **floats} if me == 0 else None}, out / f"rank{me}.pt")
    D.shutdown()


if __name__ == "__main__":
    main()
