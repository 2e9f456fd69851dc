"""``tp.compile`` of explicit-mode functions called with ShardedArrays (tensorplay/distributed/compiled.py).

One launcher run of compiled_explicit_worker.py per mesh -- 2 processes (X=1, Y=2) and 4 (X=2, Y=2),
each bounded by the launcher's timeout so that a hung collective fails the test.  Every rank's blocks
of the compiled results (judged on the second call; the first is the capture run) are compared with
the eager explicit-mode blocks and with single-process references from the same inputs (exactly where
the inputs are integers), the printed local program with its collectives, and the gradients of a
loss trained through the compiled local program with torch autograd in one process.  A one-device
mesh checks the same in this process."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.distributed as D
import tensorplay.nn.functional as F
from tensorplay.distributed import NamedSharding, P

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spmd import check_blocks, run_launcher  # noqa: E402

MESHES = {2: (1, 2), 4: (2, 2)}


@pytest.fixture(scope="module", params=sorted(MESHES))
def ranks(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"compiled_explicit{world}")
    r = run_launcher(world, HERE / "compiled_explicit_worker.py", out, *MESHES[world], timeout=100)
    assert r.returncode == 0, f"worker failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    saved = [torch.load(out / f"rank{k}.pt", weights_only=False) for k in range(world)]
    return MESHES[world], saved[0]["inputs"], [s["rec"] for s in saved]


def mlp_ref(x, w, bias, gamma, beta):
    h = x @ w + bias
    s = torch.softmax(h.tanh(), -1)
    ln = torch.nn.functional.layer_norm(s, [16], gamma, beta)
    return (ln * ln).mean() + h.amax(0).sum() + (x @ w).sum(1).mean() + h.t().reshape(16, 2, 4).sum(0).sum()


def test_matmul_output_p_x_none_is_all_reduced_over_y(ranks):
    (nx, ny), inp, recs = ranks
    ref = inp["In"] @ inp["W"]
    for name in ("allreduce", "allreduce_eager", "allreduce_staged"):
        check_blocks(recs, name, ref, ("X", None))
    text = recs[0]["allreduce_text"]
    mesh = f"{{'X': {nx}, 'Y': {ny}}}"
    assert f"# arg 0: float32[8, 16] P('X', 'Y') on mesh {mesh} -> local [{8 // nx}, {16 // ny}]" in text
    assert f"# result 0: [8, 12] P('X', None) -> local [{8 // nx}, 12]" in text
    assert f"ops.matmul(blocks, args_1)  # float32[{8 // nx}, 12]" in text
    nbytes = (8 // nx) * 12 * 4
    assert (f"ops.dist_allreduce(matmul, 0, ['Y'])  # float32[{8 // nx}, 12] | dist_allreduce over ['Y']: "
            f"{nbytes} bytes") in text
    assert "dist_psum_scatter" not in text
    assert recs[0]["allreduce_counters"]["captures"] == 1 and recs[0]["allreduce_counters"]["calls"] == 2


def test_matmul_output_split_along_y_is_reduce_scattered(ranks):
    (nx, ny), inp, recs = ranks
    ref = inp["In"] @ inp["W"]
    for name in ("reduce_scatter", "reduce_scatter_eager", "reduce_scatter_staged"):
        check_blocks(recs, name, ref, ("X", "Y"))
    text = recs[0]["reduce_scatter_text"]
    nbytes = (8 // nx) * 12 * 4
    assert f"| dist_psum_scatter over ['Y']: {nbytes} bytes" in text
    assert f"# float32[{8 // nx}, {12 // ny}]" in text and "dist_allreduce" not in text


def test_layer_equals_eager_explicit_mode_and_one_process(ranks):
    _, inp, recs = ranks
    ref = mlp_ref(*(inp[k] for k in ("x", "w", "bias", "gamma", "beta")))
    check_blocks(recs, "mlp", ref, (), exact=False)          # (compiled: the loss of the training test's 2nd call)
    check_blocks(recs, "mlp_eager", ref, (), exact=False)
    for rec in recs:
        torch.testing.assert_close(rec["mlp"]["local"], rec["mlp_eager"]["local"], rtol=1e-6, atol=1e-6)


def test_gradients_through_the_compiled_local_program(ranks):
    _, inp, recs = ranks
    leaves = {k: inp[k].clone().requires_grad_() for k in ("x", "w", "bias", "gamma", "beta")}
    loss = mlp_ref(*leaves.values())
    loss.backward()
    for rec in recs:
        assert rec["grad_counters"]["captures"] == 1 and rec["grad_counters"]["backward_compiles"] == 1
        for step in rec["grad"]:                  # the capture run, then the compiled forward and backward
            torch.testing.assert_close(step["loss"], loss.detach(), rtol=1e-5, atol=1e-5)
            for k, v in leaves.items():
                torch.testing.assert_close(step[k], v.grad, rtol=1e-4, atol=1e-5, msg=k)


def test_compiled_module_data_parallel(ranks):
    _, inp, recs = ranks
    w, b = inp["w"].clone().requires_grad_(), inp["bias"].clone().requires_grad_()
    loss = ((inp["x"] @ w.t() + b) ** 2).mean()
    loss.backward()
    for rec in recs:
        for step in rec["linear"]:
            assert step["spec"] == tuple(P(("X", "Y"), None))
            torch.testing.assert_close(step["loss"], loss.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step["weight"], w.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step["bias"], b.grad, rtol=1e-5, atol=1e-5)


def test_errors_name_the_call(ranks):
    _, _, recs = ranks
    assert "keyword arguments are not supported" in recs[0]["kwargs_error"]
    assert "ShardedArray.gather inside a compiled function" in recs[0]["gather_error"]


# ---- one process: a one-device mesh -------------------------------------------------------------------
def test_one_device_mesh_compiled_training():
    mesh = D.Mesh(np.arange(1).reshape(1, 1), ("X", "Y"))
    g = torch.Generator().manual_seed(1)
    x, w, b = (tp.Tensor(torch.randn(s, generator=g), requires_grad=True) for s in ((8, 16), (16, 16), (16,)))

    def f(a, v, bias):
        h = D.matmul(a, v, out_sharding=P("X", "Y")) + bias
        return F.layer_norm(h.tanh(), [16]).sum() + a.amax(1).mean()

    cf = tp.compile(f)
    for _ in range(2):
        for leaf in (x, w, b):
            leaf.grad = None
        loss = cf(D.device_put(x, NamedSharding(mesh, P("X", "Y"))), D.device_put(w, NamedSharding(mesh, P("Y"))), b)
        loss.backward()
    xt, wt, bt = (v._data.clone().requires_grad_() for v in (x, w, b))
    ref = torch.nn.functional.layer_norm((xt @ wt + bt).tanh(), [16]).sum() + xt.amax(1).mean()
    ref.backward()
    assert isinstance(loss, D.ShardedArray) and loss.spec == P()
    torch.testing.assert_close(loss.local()._data, ref.detach(), rtol=1e-5, atol=1e-5)
    for leaf, r in ((x, xt), (w, wt), (b, bt)):
        torch.testing.assert_close(leaf.grad._data, r.grad, rtol=1e-5, atol=1e-5)
    a = D.device_put(x.detach(), NamedSharding(mesh, P("X", "Y")))
    v = D.device_put(w.detach(), NamedSharding(mesh, P("Y")))
    lowered = cf.lower(a, v, b.detach())
    text = lowered.as_text()
    assert "| dist_psum_scatter over ['Y']: 512 bytes" in text and "# arg 2: float32[16] replicated" in text
    assert lowered.out_shardings[0][0].spec == P() and lowered.compile().as_text() == text
    with pytest.raises(TypeError, match=r"built for arguments laid out as \[8, 16\] P\('X', 'Y'\)"):
        lowered.compile()(D.device_put(x.detach(), NamedSharding(mesh, P("X"))), v, b.detach())
