"""The distributed side of the tests: run under ``python -m tensorplay.distributed.launch --nproc 4``
as ``spmd_worker.py OUT scenario...``; every rank runs every scenario of spmd_cases.py and saves
what it saw to ``OUT/rank<r>.pt`` (``{scenario: {...}}``; a scenario that raised records
``{"error": traceback}``).  The tests compare it with their single-process references."""
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

import spmd_cases as C
import tensorplay as tp
import tensorplay.distributed as D


def t(x):
    """A tp.Tensor (or None) as a detached torch tensor."""
    return None if x is None else x._data.detach().clone()


MESH = D.Mesh(np.arange(4).reshape(2, 2), ("X", "Y"))


def placement():
    out = {}
    for entries in C.PLACEMENT_SPECS:
        x = tp.from_torch(C.ints(7, (8, 4)))
        a = D.device_put(x, D.NamedSharding(MESH, D.P(*entries)))
        shard = a.addressable_shards[0]
        rec = {"local": t(a.local()), "gathered": t(a.gather()), "repr": repr(a), "shape": list(a.shape),
               "index": [(s.start, s.stop) for s in shard.index], "replica_id": shard.replica_id,
               "n_global_shards": len(a.global_shards)}
        # gradients: through device_put then gather, and of a sharded leaf
        xg = tp.from_torch(C.ints(7, (8, 4))).requires_grad_()
        c = tp.from_torch(C.ints(8, (8, 4)))
        (D.device_put(xg, D.NamedSharding(MESH, D.P(*entries))).gather() * c).sum().backward()
        rec["grad_through"] = t(xg.grad)
        leaf = D.device_put(x, D.NamedSharding(MESH, D.P(*entries))).requires_grad_()
        (leaf.gather() * c).sum().backward()
        rec["leaf_grad_local"], rec["leaf_grad_gathered"] = t(leaf.grad.local()), t(leaf.grad.gather())
        out[str(entries)] = rec
    # resharding a sharded array to another spec
    x = tp.from_torch(C.ints(7, (8, 4)))
    a = D.device_put(D.device_put(x, D.NamedSharding(MESH, D.P("X", "Y"))), D.NamedSharding(MESH, D.P(("Y", "X"))))
    out["resharded"] = {"local": t(a.local()), "spec": repr(a.spec)}
    return out


def permuted_mesh():
    """Blocks and member order follow the mesh coordinates, not the ranks."""
    mesh = D.Mesh(np.array(C.PERMUTED_DEVICES), ("X", "Y"))
    x = tp.from_torch(C.ints(9, (8, 4)))
    a = D.device_put(x, D.NamedSharding(mesh, D.P(("X", "Y"))))
    seen = {}

    def body(b):
        seen["index"] = (D.axis_index("X"), D.axis_index("Y"), D.axis_index(("X", "Y")))
        return D.all_gather(b, ("X", "Y"), tiled=True), D.psum(b, "Y")
    full, ysum = D.shard_map(body, mesh, D.P(("X", "Y")), (D.P(), D.P("X")))(a)
    return {"local": t(a.local()), "gathered": t(a.gather()), "all_gather": t(full.local()),
            "psum_Y": t(ysum.gather()), **seen}


def collectives():
    out = {}
    for k, case in enumerate(C.collective_cases()):
        try:
            x = tp.from_torch(C.x_input(k, case.ties)).requires_grad_()
            f = D.shard_map(case.body, MESH, D.P(("X", "Y")), D.P(*case.out))
            y = f(x)
            y.backward(tp.from_torch(C.cotangent(k, y.shape)))
            out[case.name] = {"local": t(y.local()), "global": t(y.gather()), "shape": list(y.shape),
                              "grad": t(x.grad)}
        except Exception:
            out[case.name] = {"error": traceback.format_exc()}
    return out


def spec_cases():
    out = {}
    for k, (name, c) in enumerate(C.SPEC_CASES.items()):
        try:
            xs = [tp.from_torch(v).requires_grad_() for v in C.spec_inputs(k, name)]
            if c["in_specs"] == "one list":
                f = D.shard_map(c["body"], MESH, D.P("X"), C.to_spec(c["out_specs"]))
                ys = f(xs)
            else:
                f = D.shard_map(c["body"], MESH, tuple(C.to_spec(s) for s in c["in_specs"]), C.to_spec(c["out_specs"]))
                ys = f(*xs)
            ys = list(ys) if isinstance(ys, (tuple, list)) else [ys]
            for j, y in enumerate(ys):
                y.backward(tp.from_torch(C.cotangent(k, y.shape, j)), retain_graph=True)
            out[name] = {"globals": [t(y.gather()) for y in ys], "grads": [t(v.grad) for v in xs],
                         "reprs": [repr(y) for y in ys]}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
    return out


def no_reduce():
    x = tp.from_torch(C.x_input(0))
    y = D.shard_map(lambda b: b * 1, MESH, D.P(("X", "Y")), D.P())(x)
    return {"local": t(y.local()), "shape": list(y.shape), "gathered": t(y.gather())}


def axis_index():
    seen = {}

    def body(b):
        for a in ("X", "Y", ("X", "Y"), ("Y", "X")):
            seen[str(a)] = (D.axis_index(a), D.axis_size(a))
        return b
    D.shard_map(body, MESH, D.P(), D.P())(tp.zeros(1))
    return seen


def compile_():
    cf = tp.compile(C.compiled_body)
    f = D.shard_map(cf, MESH, D.P(("X", "Y")), D.P(("X", "Y")))
    out = {}
    for k in range(2):                              # the capture run, then the compiled graph
        out[f"call{k}"] = t(f(tp.from_torch(C.x_input(100 + k))).local())
    out["call_bigger"] = t(f(tp.from_torch(C.ints(103, (16, 4)))).local())    # another size: recompiled
    xg = tp.from_torch(C.x_input(102)).requires_grad_()   # a training call: forward and backward compiled
    y = f(xg)
    y.backward(tp.from_torch(C.cotangent(102, y.shape)))
    out["train_local"], out["train_grad"] = t(y.local()), t(xg.grad)
    out["counters"] = dict(cf.counters)
    graph = cf._cache[0].lowered.graph_module.graph if cf._cache else None
    out["graph_ops"] = sorted({n.opdef.name for n in graph.nodes if n.op == "call_function" and n.opdef is not None}) \
        if graph is not None else []

    @D.shard_map(mesh=MESH, in_specs=D.P(("X", "Y")), out_specs=D.P(("X", "Y")))
    @tp.compile
    def decorated(b):
        return C.compiled_body(b)
    out["decorated"] = t(decorated(tp.from_torch(C.x_input(101))).local())
    return out


def seed_examples():
    """Seed 001 §4 (local_work: x[:4] of each 64-entry block) and §5's ring matmul on 4 devices."""
    mesh = D.Mesh(np.arange(4), ("Y",))
    x = tp.arange(256)
    local_work = D.shard_map(lambda v: v[:4], mesh=mesh, in_specs=D.P("Y"), out_specs=D.P("Y"))(x)

    @D.shard_map(mesh=mesh, in_specs=(D.P(None, "Y"), D.P(None, "Y")), out_specs=D.P(None, "Y"))
    def ring_matmul(a, w):
        idx = D.axis_index("Y")
        width = a.shape[1]
        current, result = a, None
        perm = [(0, 3), (1, 0), (2, 1), (3, 2)]
        for step in range(4):
            source = (idx + step) % 4
            update = current @ w[source * width:(source + 1) * width]
            result = update if step == 0 else result + update
            if step < 3:
                current = D.ppermute(current, "Y", perm)
        return result
    a = tp.arange(16, dtype=tp.float32).reshape(2, 8)
    w = tp.arange(64, dtype=tp.float32).reshape(8, 8)
    placement = D.NamedSharding(mesh, D.P(None, "Y"))
    ring = ring_matmul(D.device_put(a, placement), D.device_put(w, placement))
    return {"local_work": t(local_work.gather()), "local_work_shape": list(local_work.local().shape),
            "ring": t(ring.gather()), "ring_local_shape": list(ring.local().shape)}


def errors():
    out = {}
    for name, mesh in (("mesh8", D.make_mesh((4, 2), ("X", "Y"))), ("mesh2", D.make_mesh((2,), ("X",)))):
        try:
            D.device_put(tp.zeros(8), D.NamedSharding(mesh, D.P("X")))
            out[name] = "no error"
        except RuntimeError as e:
            out[name] = str(e)
        # shape arithmetic on the abstract mesh still works in this process
        out[name + "_shard_shape"] = D.NamedSharding(mesh, D.P("X")).shard_shape((8,))
    return out


def collective_matmul():
    """Seed 001 §5's 4-device example through D.collective_matmul (exact), and its gradients."""
    mesh = D.Mesh(np.arange(4), ("Y",))
    placement = D.NamedSharding(mesh, D.P(None, "Y"))
    f = D.shard_map(lambda a, w: D.collective_matmul(a, w, "Y"), mesh=mesh,
                    in_specs=(D.P(None, "Y"), D.P(None, "Y")), out_specs=D.P(None, "Y"))
    a = tp.arange(16, dtype=tp.float32).reshape(2, 8)
    w = tp.arange(64, dtype=tp.float32).reshape(8, 8)
    out = f(D.device_put(a, placement), D.device_put(w, placement))
    ag, wg = (tp.from_torch(C.ints(s, shape)).requires_grad_() for s, shape in ((31, (3, 8)), (32, (8, 12))))
    c = tp.from_torch(C.ints(33, (3, 12)))
    (f(D.device_put(ag, placement), D.device_put(wg, placement)).gather() * c).sum().backward()
    return {"out": t(out.gather()), "out_local_shape": list(out.local().shape), "grad_a": t(ag.grad),
            "grad_w": t(wg.grad)}


SCENARIOS = {"collective_matmul": collective_matmul, "placement": placement, "permuted_mesh": permuted_mesh, "collectives": collectives,
             "spec_cases": spec_cases, "no_reduce": no_reduce, "axis_index": axis_index, "compile": compile_,
             "seed_examples": seed_examples, "errors": errors}


def main():
    out_dir, names = Path(sys.argv[1]), sys.argv[2:]
    D.init()
    results = {}
    for name in names:
        try:
            results[name] = SCENARIOS[name]()
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    torch.save(results, out_dir / f"rank{D.rank()}.pt")
    D.shutdown()


if __name__ == "__main__":
    main()
