"""Explicit mode (tensorplay/distributed/explicit.py): ops on ShardedArrays propagate shardings and
insert collectives.  One launcher run of explicit_worker.py on 4 processes (a 2x2 mesh, X=2, Y=2);
each rank's local blocks are compared with the blocks of a single-process reference computed here
from the same inputs -- exactly where the inputs are integers -- and the collectives explain()
recorded are checked.  The seed's 4x2 mesh (8 devices) is checked for shapes and bytes in one process,
on an abstract mesh with meta blocks."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.distributed as D
from tensorplay._tensor import _wrap
from tensorplay.distributed import NamedSharding, P

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spmd import check_blocks, run_launcher  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("explicit")
    r = run_launcher(WORLD, HERE / "explicit_worker.py", out, timeout=120)
    assert r.returncode == 0, f"explicit_worker.py failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    saved = [torch.load(out / f"rank{k}.pt", weights_only=False) for k in range(WORLD)]
    return saved[0]["inputs"], [s["rec"] for s in saved]


def kinds(recs, name):
    return [c[:3] for c in recs[0][name]["collectives"]]


# ---- the seed's In @ W -------------------------------------------------------------------------------
def test_matmul_contraction_split_on_y_is_all_reduced_over_y(ranks):
    inp, recs = ranks
    ref = inp["In"] @ inp["W"]
    check_blocks(recs, "matmul_allreduce", ref, ("X", None))
    assert kinds(recs, "matmul_allreduce") == [("all-reduce(sum)", ("Y",), 4 * 6 * 4)]
    # rows of different X blocks are never added: rank (x, y) holds exactly rows 4x..4x+3 of the product
    assert [r["matmul_allreduce"]["index"][0] for r in recs] == [slice(0, 4)] * 2 + [slice(4, 8)] * 2
    assert recs[0]["matmul_pending"]
    assert "all-reduce(sum) over ('Y',): float32[4, 6] -> [4, 6], 96 bytes" in recs[0]["matmul_allreduce"]["text"]


@pytest.mark.parametrize("name", ["matmul_reduce_scatter", "matmul_out_sharding"])
def test_matmul_output_split_on_y_is_reduce_scattered(ranks, name):
    inp, recs = ranks
    check_blocks(recs, name, inp["In"] @ inp["W"], ("X", "Y"))
    assert [c for c in recs[0][name]["collectives"]] == [("reduce-scatter", ("Y",), 96, (4, 6), (4, 3))]


def test_compiled_local_program_lists_shapes_and_collectives(ranks):
    inp, recs = ranks
    text = recs[0]["compiled_text"]
    assert "ops.matmul(blocks, args_1)  # float32[4, 6]" in text
    assert "# arg 0: float32[8, 4] P('X', 'Y') on mesh {'X': 2, 'Y': 2} -> local [4, 2]" in text
    assert "# result 0: [8, 6] P('X', None) -> local [4, 6]" in text
    assert "ops.dist_allreduce(matmul, 0, ['Y'])  # float32[4, 6] | dist_allreduce over ['Y']: 96 bytes" in text
    assert "dist_psum_scatter over ['Y']: 96 bytes" in recs[0]["compiled_text_rs"]
    assert "# float32[4, 3]" in recs[0]["compiled_text_rs"]
    check_blocks(recs, "compiled_run", inp["In"] @ inp["W"], ("X", None))


def test_seed_example_on_the_abstract_4x2_mesh():
    mesh = D.Mesh(np.arange(8).reshape(4, 2), ("X", "Y"))
    a = D.ShardedArray(_wrap(torch.empty(2, 1024, device="meta")), NamedSharding(mesh, P("X", "Y")), (8, 2048))
    w = D.ShardedArray(_wrap(torch.empty(1024, 8192, device="meta")), NamedSharding(mesh, P("Y", None)),
                       (2048, 8192))
    e = D.explain(lambda a, w: (a @ w).reduce(), a, w)
    assert e.result.spec == P("X", None) and tuple(e.result.local_shape) == (2, 8192)
    assert [(c["kind"], c["axes"], c["bytes"]) for c in e.collectives] == [("all-reduce(sum)", ("Y",), 2 * 8192 * 4)]
    assert "matmul(float32[2, 1024] P('X', 'Y'), float32[1024, 8192] P('Y', None))" in e.text
    e = D.explain(lambda a, w: D.matmul(a, w, out_sharding=P("X", "Y")), a, w)
    assert tuple(e.result.local_shape) == (2, 4096)
    assert [(c["kind"], c["out"]) for c in e.collectives] == [("reduce-scatter", (2, 4096))]
    assert str(e).endswith("1 collectives, 65536 bytes")


# ---- pointwise, reductions, views ---------------------------------------------------------------------
def test_pointwise_broadcasting(ranks):
    inp, recs = ranks
    In = inp["In"]
    check_blocks(recs, "pointwise", In * inp["b"] + inp["c"] - inp["d"], ("X", "Y"))
    assert kinds(recs, "pointwise") == []
    check_blocks(recs, "pointwise_slice", In + In * 2, ("X", "Y"))     # P('X') operand sliced locally
    assert kinds(recs, "pointwise_slice") == []
    msg = recs[0]["pointwise_error"]
    assert msg.startswith("ValueError") and "with_sharding_constraint" in msg and "P('Y')" in msg


@pytest.mark.parametrize("name, ref, spec, coll", [
    ("sum0", lambda x: x.sum(0), ("Y",), [("all-reduce(sum)", ("X",))]),
    ("sum1", lambda x: x.sum(1), ("X",), [("all-reduce(sum)", ("Y",))]),
    ("sum_all", lambda x: x.sum(), (), [("all-reduce(sum)", ("X", "Y"))]),
    ("mean0", lambda x: x.mean(0), ("Y",), [("all-reduce(sum)", ("X",))]),
    ("mean_all", lambda x: x.mean(), (), [("all-reduce(sum)", ("X", "Y"))]),
    ("amax1", lambda x: x.amax(1), ("X",), [("all-reduce(max)", ("Y",))]),
    ("sum1_keep", lambda x: x.sum(1, keepdim=True), ("X", None), [("all-reduce(sum)", ("Y",))]),
    ("var0", lambda x: x.var(0), ("Y",), [("all-gather", ("X",))]),
    ("unsplit", lambda x: x.sum(1), ("X",), []),
])
def test_reductions(ranks, name, ref, spec, coll):
    inp, recs = ranks
    check_blocks(recs, "reduce_" + name, ref(inp["In"]), spec, exact=name.startswith("sum") or name == "unsplit")
    assert [c[:2] for c in kinds(recs, "reduce_" + name)] == coll


@pytest.mark.parametrize("name, ref, spec", [
    ("t", lambda i: i["In"].t(), ("Y", "X")),
    ("T", lambda i: i["In"].T, ("Y", "X")),
    ("transpose", lambda i: i["In"].transpose(0, 1), ("Y", "X")),
    ("permute", lambda i: i["a3"].permute(2, 0, 1), ("Y", "X", None)),
    ("reshape", lambda i: i["In"].reshape(4, 2, 4), ("X", None, "Y")),
    ("flatten", lambda i: i["a3"].reshape(16, 2), ("X", "Y")),
])
def test_views(ranks, name, ref, spec):
    inp, recs = ranks
    check_blocks(recs, "view_" + name, ref(inp).contiguous(), spec)
    assert kinds(recs, "view_" + name) == []


def test_reshape_that_cuts_a_split_dim_raises(ranks):
    msg = ranks[1][0]["view_error"]
    assert msg.startswith("ValueError") and "[8, 4] -> [32]" in msg and "reshard" in msg


# ---- softmax, layer_norm, embedding --------------------------------------------------------------------
def test_softmax_and_layer_norm_gather_the_last_dim(ranks):
    inp, recs = ranks
    x = inp["In"]
    check_blocks(recs, "softmax", torch.softmax(x, -1), ("X", None), exact=False)
    assert kinds(recs, "softmax") == [("all-gather", ("Y",), 4 * 2 * 4)]
    ref = torch.nn.functional.layer_norm(x, [4], inp["b"], inp["b"] * 0 + 1)
    check_blocks(recs, "layer_norm", ref, ("X", None), exact=False)
    assert [c[:2] for c in kinds(recs, "layer_norm")] == [("all-gather", ("Y",))]


def test_embedding(ranks):
    inp, recs = ranks
    check_blocks(recs, "embedding", inp["E"][inp["ids"]], ("X", "Y", None))
    assert kinds(recs, "embedding") == []
    check_blocks(recs, "embedding_vocab", inp["E"][:8][inp["ids"] % 8], ("X", None, None), exact=False)
    assert [c[:2] for c in kinds(recs, "embedding_vocab")] == [("all-reduce(sum)", ("Y",))]


# ---- errors, gradients ---------------------------------------------------------------------------
def test_ambiguous_contractions_raise(ranks):
    recs = ranks[1]
    one = recs[0]["matmul_one_side"]
    assert one.startswith("ValueError") and "ambiguous" in one and "('Y',) on the left" in one \
        and "no axis on the right" in one
    two = recs[0]["matmul_two_axes"]
    assert two.startswith("ValueError") and "('X',) on the right" in two


def test_gradients_equal_the_single_process_ones(ranks):
    inp, recs = ranks
    leaves = {k: inp[k].clone().requires_grad_() for k in ("x", "w", "bias", "gamma", "beta", "E")}
    x, w = leaves["x"], leaves["w"]
    h = x @ w + leaves["bias"]
    s = torch.softmax(h.tanh(), -1)
    ln = torch.nn.functional.layer_norm(s, [6], leaves["gamma"], leaves["beta"])
    loss = (ln * ln).mean() + h.amax(0).sum() + (x @ w).sum(1).mean() + h.t().reshape(6, 2, 4).sum(0).sum()
    loss.backward()
    ids = inp["ids"]
    E = leaves["E"]
    ((E[ids] * E[ids]).sum() + (E[:8][ids % 8] * 3).sum()).backward()
    for rec in recs:                 # every rank holds the whole gradient of every plain leaf
        torch.testing.assert_close(rec["grad_loss"], loss.detach(), rtol=1e-5, atol=1e-5)
        for k, g in rec["grad"].items():
            torch.testing.assert_close(g, leaves[k].grad, rtol=1e-4, atol=1e-5, msg=k)
        torch.testing.assert_close(rec["grad_E"], E.grad, rtol=1e-5, atol=1e-5)


def test_one_device_mesh_runs_in_one_process():
    mesh = D.Mesh(np.arange(1).reshape(1, 1), ("X", "Y"))
    a = D.device_put(tp.arange(32.).reshape(8, 4), NamedSharding(mesh, P("X", "Y")))
    e = D.explain(lambda a: D.with_sharding_constraint(a.t() @ D.with_sharding_constraint(a, P("X", None)),
                                                       P(None, "X")), a)
    assert e.result.spec == P(None, "X")
    assert [c["kind"] for c in e.collectives] == ["all-gather", "reduce-scatter", "all-gather"]
    ref = torch.arange(32.).reshape(8, 4)
    assert torch.equal(e.result.local()._data, ref.t() @ ref)
    with pytest.raises(ValueError, match=r"output sharding P\('Y', 'Y'\) is not valid"):
        a.t() @ a
    with pytest.raises(NotImplementedError, match="no sharding rule"):
        a.cumsum(0)
    with pytest.raises(NotImplementedError, match="in-place"):
        a.add_(1)
    prog = D.on_blocks(lambda a: a.sum(0), a)
    assert torch.equal(prog(a.local())._data, ref.sum(0)) and prog.out_shardings[0][0].spec == P("Y")
    leaf = tp.Tensor(ref.clone(), requires_grad=True)          # blocks that require grad train (global convention)
    (prog(leaf) * 2).sum().backward()
    assert torch.equal(leaf.grad._data, torch.full((8, 4), 2.0))
