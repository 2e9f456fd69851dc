"""The cases of the chapter's tables 13.1 (fusion) and 13.2 (single ops), each defined once over a
tensor library ``L`` (``tensorplay`` or ``torch``), with its eager model bytes (§1.1 counting).

Sizes (``SIZES``): on the CPU 8192 x 2048 float32 (64 MiB, twice a 32 MiB L3) and softmax rows of
16384 x 1000; on a GPU 32768 x 2048 (256 MiB) and 65536 x 1000.

    table 13.1: ex 1.1 (relu(x + w) * 2).sum(-1); ex 7.1 x / x.sum(-1, keepdim=True); five-op
                softmax (§9.5); F.softmax; ex 7.2 exp -> sum and amax; LayerNorm -> GELU -> x0.5
    table 13.2: exp, x + 1, relu, row sum, row amax

Eager bytes count every op's inputs read and output written once (e.g. ex 1.1: add 3N, relu 2N,
mul 2N, sum N = 8N elements); the compiled bytes come from the artifact's cost analysis.
"""
from __future__ import annotations

import torch

import tensorplay as tp
import tensorplay.nn.functional as F

__all__ = ["SIZES", "five_op_softmax", "cases", "select", "TABLE_13_2"]

#: (R, C, SR, SC) of ``cases`` on each device: R x C for the table-13.1/13.2 cases, SR x SC softmax rows
SIZES = {"cpu": (8192, 2048, 16384, 1000), "cuda": (32768, 2048, 65536, 1000)}
#: the single-op cases of table 13.2 (rho = 1: nothing to fuse)
TABLE_13_2 = ("exp", "x + 1", "relu", "row sum", "row amax")


def five_op_softmax(x, lib):
    m = x.amax(-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(-1, keepdim=True)


def _F(L):
    return F if L is tp else torch.nn.functional


def cases(R=8192, C=2048, SR=16384, SC=1000):
    """name -> (function of the inputs and a tensor library, input shapes, eager model bytes in elements)."""
    N = R * C
    NS = SR * SC
    return {
        "ex1.1 (relu(x+w)*2).sum(-1)": (lambda x, w, L: (L.relu(x + w) * 2).sum(-1), [(R, C), (R, C)], 8 * N),
        "ex7.1 x/x.sum(-1,keepdim)": (lambda x, L: x / x.sum(-1, keepdim=True), [(R, C)], 3 * N),
        "softmax, five ops": (five_op_softmax, [(SR, SC)], 8 * NS),
        "softmax, F.softmax": (lambda x, L: _F(L).softmax(x, -1), [(SR, SC)], 2 * NS),
        "ex7.2 exp -> sum, amax": (lambda x, L: (x.exp().sum(-1), x.exp().amax(-1)), [(R, C)], 6 * N),
        "LayerNorm -> GELU -> x0.5": (lambda x, L: _F(L).gelu(_F(L).layer_norm(x, (x.shape[-1],))) * 0.5,
                                      [(R, C)], 6 * N),
        "exp": (lambda x, L: x.exp(), [(R, C)], 2 * N),
        "x + 1": (lambda x, L: x + 1, [(R, C)], 2 * N),
        "relu": (lambda x, L: L.relu(x), [(R, C)], 2 * N),
        "row sum": (lambda x, L: x.sum(-1), [(R, C)], N),
        "row amax": (lambda x, L: x.amax(-1), [(R, C)], N),
    }


def select(table: dict, names: str) -> dict:
    """The cases of ``table`` whose name starts with one of the comma-separated ``names`` (all of
    them for an empty string)."""
    if not names:
        return dict(table)
    want = [c.strip() for c in names.split(",")]
    return {k: v for k, v in table.items() if any(k.startswith(w) for w in want)}
