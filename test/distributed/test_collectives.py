"""Every collective over one axis and over two axes (both orders) of a 2x2 mesh, on 4 processes,
against the single-process reference of spmd_cases.py: each rank's local result and the gathered
global result exactly (integer inputs), and the gradient of the global function -- through the
collective's transpose and shard_map's boundary -- equal to torch autograd on the reference."""
import pytest
import torch

import spmd_cases as C

CASES = C.collective_cases()


def _result(spmd, rank, name):
    rec = spmd[rank]["collectives"]
    assert "error" not in rec, rec["error"]
    rec = rec[name]
    assert "error" not in rec, rec["error"]
    return rec


@pytest.mark.parametrize("k", range(len(CASES)), ids=[c.name for c in CASES])
def test_collective_matches_single_process_reference(spmd, k):
    case = CASES[k]
    x = C.x_input(k, case.ties).requires_grad_()
    local, glob = C.reference_collective(case, x)
    c = C.cotangent(k, glob.shape)
    glob.backward(c)
    for r in range(C.WORLD):
        rec = _result(spmd, r, case.name)
        assert torch.equal(rec["local"], local[r].detach()), (case.name, r)
        assert rec["shape"] == list(glob.shape)
        assert torch.equal(rec["global"], glob.detach()), (case.name, r)
        torch.testing.assert_close(rec["grad"], x.grad, rtol=1e-12, atol=1e-12, msg=f"{case.name}: rank {r} grad")


def test_axis_index_and_size(spmd):
    for r in range(C.WORLD):
        seen = spmd[r]["axis_index"]
        x, y = C.coords(r)["X"], C.coords(r)["Y"]
        assert seen == {"X": (x, 2), "Y": (y, 2), "('X', 'Y')": (2 * x + y, 4), "('Y', 'X')": (2 * y + x, 4)}
