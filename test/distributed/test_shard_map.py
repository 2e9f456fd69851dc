"""Sharded arrays and shard_map on 4 processes (a 2x2 mesh), against single-process references:
device_put / local / gather for every kind of spec, printing, gradients through the placement;
shard_map with its own in/out specs (replicated inputs and outputs, several arguments and results,
a data-parallel loss), out_specs P() keeping each rank's value, a tp.compile'd local function, the
seed's examples, and the mesh-size error."""
import pytest
import torch

import spmd_cases as C


def _scenario(spmd, rank, name):
    rec = spmd[rank][name]
    assert "error" not in rec, rec["error"]
    return rec


# ---- placement -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entries", C.PLACEMENT_SPECS, ids=str)
def test_device_put_local_gather_round_trip(spmd, entries):
    x = C.ints(7, (8, 4))
    c = C.ints(8, (8, 4))
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "placement")[str(entries)]
        want = C.expected_block(x, entries, r)
        assert torch.equal(rec["local"], want), (entries, r)
        assert torch.equal(rec["gathered"], x)
        assert rec["shape"] == [8, 4] and rec["n_global_shards"] == 4
        # the shard's slices are the block's
        assert torch.equal(x[tuple(slice(a, b) for a, b in rec["index"])], want)
        # printing: global shape, spec, local shape
        spec = "P(" + ", ".join(repr(e) for e in entries) + ")"
        assert rec["repr"].startswith(f"ShardedArray(global=[8, 4], spec={spec}, local={list(want.shape)}, "
                                      f"mesh={{'X': 2, 'Y': 2}}, float64"), rec["repr"]
        # gradients in the global convention: every rank holds the whole gradient
        assert torch.equal(rec["grad_through"], c)
        assert torch.equal(rec["leaf_grad_local"], C.expected_block(c, entries, r))
        assert torch.equal(rec["leaf_grad_gathered"], c)


def test_replica_ids(spmd):
    # P('Y', None) is replicated along X: ranks 0, 1 (X = 0) are replica 0, ranks 2, 3 replica 1
    assert [_scenario(spmd, r, "placement")["('Y', None)"]["replica_id"] for r in range(4)] == [0, 0, 1, 1]
    assert [_scenario(spmd, r, "placement")["()"]["replica_id"] for r in range(4)] == [0, 1, 2, 3]


def test_mesh_with_permuted_device_ids(spmd):
    x = C.ints(9, (8, 4))
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "permuted_mesh")
        cx, cy = C.PERMUTED_COORDS[r]
        assert rec["index"] == (cx, cy, 2 * cx + cy)
        assert torch.equal(rec["local"], x[2 * (2 * cx + cy): 2 * (2 * cx + cy) + 2])
        assert torch.equal(rec["gathered"], x) and torch.equal(rec["all_gather"], x)
        assert torch.equal(rec["psum_Y"], x.reshape(2, 2, 2, 4).sum(1).reshape(4, 4))


def test_resharding(spmd):
    x = C.ints(7, (8, 4))
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "placement")["resharded"]
        assert rec["spec"] == "P(('Y', 'X'))" and torch.equal(rec["local"], C.expected_block(x, (("Y", "X"),), r))


# ---- shard_map with its own specs ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(C.SPEC_CASES))
def test_shard_map_matches_global_function(spmd, name):
    k = list(C.SPEC_CASES).index(name)
    case = C.SPEC_CASES[name]
    xs = [v.requires_grad_() for v in C.spec_inputs(k, name)]
    ys = case["ref"](*xs)
    ys = list(ys) if isinstance(ys, (tuple, list)) else [ys]
    for j, y in enumerate(ys):
        y.backward(C.cotangent(k, y.shape, j), retain_graph=True)
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "spec_cases")[name]
        assert "error" not in rec, rec["error"]
        for j, y in enumerate(ys):
            torch.testing.assert_close(rec["globals"][j], y.detach(), rtol=1e-12, atol=1e-12)
        for j, v in enumerate(xs):
            torch.testing.assert_close(rec["grads"][j], v.grad, rtol=1e-12, atol=1e-12, msg=f"{name}: grad {j}")


def test_matmul_psum_prints_global_and_local(spmd):
    rec = _scenario(spmd, 0, "spec_cases")["matmul_psum"]
    assert rec["reprs"][0].startswith("ShardedArray(global=[8, 6], spec=P('X', None), local=[4, 6]")


def test_out_spec_replicated_does_not_reduce(spmd):
    """out_specs=P() claims replication; it does not sum: every rank keeps its own block."""
    x = C.x_input(0)
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "no_reduce")
        own = x[C.ROWS * r: C.ROWS * (r + 1)]
        assert rec["shape"] == [C.ROWS, 4]
        assert torch.equal(rec["local"], own) and torch.equal(rec["gathered"], own)


# ---- tp.compile of the local function ----------------------------------------------------------------------
def test_compiled_local_function(spmd):
    ref = {k: C.compiled_body_ref(C.x_input(100 + k)) for k in range(3)}
    xg = C.x_input(102).requires_grad_()
    local = C.compiled_body_ref(xg)
    torch.cat(local).backward(C.cotangent(102, (8, 4)))
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "compile")
        for k in range(2):
            torch.testing.assert_close(rec[f"call{k}"], ref[k][r])
        torch.testing.assert_close(rec["decorated"], ref[1][r])
        torch.testing.assert_close(rec["call_bigger"], C.compiled_body_ref(C.ints(103, (16, 4)))[r])
        torch.testing.assert_close(rec["train_local"], ref[2][r])
        torch.testing.assert_close(rec["train_grad"], xg.grad)
        # one capture for inference, one for training; the second call ran the compiled graph
        assert rec["counters"]["cache_hits"] >= 1 and rec["counters"]["backward_compiles"] == 1
        assert rec["counters"]["over_limit_calls"] == 0
        # the collectives are ops of the captured graph, around the fused pointwise ops
        assert {"dist_psum", "dist_all_gather", "dist_psum_scatter", "sin", "tanh"} <= set(rec["graph_ops"])


# ---- the seed's examples and errors ------------------------------------------------------------------------
def test_seed_local_work_and_ring_matmul(spmd):
    a = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    w = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "seed_examples")
        # 256 entries, 64 per device, x[:4] of each: 16 entries
        assert rec["local_work_shape"] == [4]
        assert torch.equal(rec["local_work"], torch.cat([torch.arange(64 * i, 64 * i + 4) for i in range(4)]))
        assert rec["ring_local_shape"] == [2, 2] and torch.equal(rec["ring"], a @ w)


def test_seed_collective_matmul_exact_and_its_gradients(spmd):
    a = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    w = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    ag, wg = (C.ints(s, shape).requires_grad_() for s, shape in ((31, (3, 8)), (32, (8, 12))))
    ((ag @ wg) * C.ints(33, (3, 12))).sum().backward()
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "collective_matmul")
        assert rec["out_local_shape"] == [2, 2] and torch.equal(rec["out"], a @ w)
        assert torch.equal(rec["grad_a"], ag.grad) and torch.equal(rec["grad_w"], wg.grad)


def test_mesh_size_must_equal_world_size(spmd):
    for r in range(C.WORLD):
        rec = _scenario(spmd, r, "errors")
        assert "a mesh of 8 devices {'X': 4, 'Y': 2} needs a process group of 8 processes, but the world size is 4" \
            in rec["mesh8"]
        assert "needs a process group of 2 processes, but the world size is 4" in rec["mesh2"]
        assert rec["mesh8_shard_shape"] == (2,) and rec["mesh2_shard_shape"] == (4,)
