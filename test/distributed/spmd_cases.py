"""The cases of the multi-process tests, shared by the worker (spmd_worker.py runs the distributed
side on every rank) and the tests (they compute the single-process references from the same seeded
inputs).

The mesh is 2x2, axes ("X", "Y"), devices ``[[0, 1], [2, 3]]``: rank ``r`` sits at ``X = r // 2``,
``Y = r % 2``.  :func:`members` is the reference's own statement of who takes part in a collective,
in which order (first axis major) -- written here independently of tensorplay's mesh code.

Collective cases run ``shard_map(body, mesh, P(("X", "Y")), out_spec)`` on a global ``x[8, 4]``:
rank ``r`` sees rows ``2r : 2r + 2``.  ``ref(blocks of the members, my position)`` is the local
result, in torch; the global reference follows from the out spec.  Inputs and cotangents are
small integers in float64, so forward results compare exactly.
"""
from __future__ import annotations

import dataclasses
import itertools

import torch

import tensorplay.distributed as D

WORLD = 4
AXES = ("X", "Y")
SIZES = {"X": 2, "Y": 2}
ROWS = 2                       # rows of x per rank
X_SHAPE = (ROWS * WORLD, 4)
SCENARIOS = ("placement", "permuted_mesh", "collectives", "spec_cases", "no_reduce", "axis_index", "compile",
             "seed_examples", "collective_matmul", "errors")
#: a mesh whose device ids are not in row-major order: rank -> its (X, Y) coordinates
PERMUTED_DEVICES = [[3, 1], [0, 2]]
PERMUTED_COORDS = {3: (0, 0), 1: (0, 1), 0: (1, 0), 2: (1, 1)}


def coords(r):
    return {"X": r // 2, "Y": r % 2}


def axes_of(a):
    return () if a is None else (a,) if isinstance(a, str) else tuple(a)


def members(r, axes):
    axes = axes_of(axes)
    out = []
    for idx in itertools.product(*(range(SIZES[a]) for a in axes)):
        c = dict(coords(r), **dict(zip(axes, idx)))
        out.append(c["X"] * 2 + c["Y"])
    return out


def ints(seed, shape, lo=-4, hi=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, tuple(shape), generator=g).double()


def x_input(case_index, ties=False):
    return ints(1000 + case_index, X_SHAPE, *((0, 3) if ties else (-4, 5)))


def cotangent(case_index, shape, k=0):
    return ints(5000 + 10 * case_index + k, shape)


@dataclasses.dataclass
class Case:
    name: str
    axes: object
    body: object            # local block -> local result (tensorplay.distributed)
    ref: object             # (member blocks, my position) -> local result (torch)
    out: tuple = (("X", "Y"),)   # the out spec's entries
    ties: bool = False


def _n(axes):
    return len(members(0, axes))


def collective_cases():
    cases = []
    for A in ("X", "Y", ("X", "Y"), ("Y", "X")):
        n = _n(A)
        tag = A if isinstance(A, str) else "".join(A)
        d_ns = 0 if n == 2 else 1            # a dimension of the [2, 4] block with exactly n entries
        cases += [
            Case(f"psum_{tag}", A, lambda b, A=A: D.psum(b, A), lambda ms, p: sum(ms)),
            Case(f"pmean_{tag}", A, lambda b, A=A: D.pmean(b, A), lambda ms, p: sum(ms) / len(ms)),
            Case(f"pmax_{tag}", A, lambda b, A=A: D.pmax(b, A), lambda ms, p: torch.stack(ms).amax(0), ties=True),
            Case(f"pmin_{tag}", A, lambda b, A=A: D.pmin(b, A), lambda ms, p: torch.stack(ms).amin(0), ties=True),
            Case(f"all_gather_{tag}", A, lambda b, A=A: D.all_gather(b, A), lambda ms, p: torch.stack(ms, 0)),
            Case(f"all_gather_axis1_{tag}", A, lambda b, A=A: D.all_gather(b, A, axis=1),
                 lambda ms, p: torch.stack(ms, 1)),
            Case(f"all_gather_tiled_{tag}", A, lambda b, A=A: D.all_gather(b, A, axis=1, tiled=True),
                 lambda ms, p: torch.cat(ms, 1)),
            Case(f"psum_scatter_tiled_{tag}", A, lambda b, A=A: D.psum_scatter(b, A, scatter_dimension=1, tiled=True),
                 lambda ms, p, n=n: sum(ms).chunk(n, 1)[p]),
            Case(f"psum_scatter_{tag}", A, lambda b, A=A, d=d_ns: D.psum_scatter(b, A, scatter_dimension=d),
                 lambda ms, p, d=d_ns: sum(ms).unbind(d)[p]),
            Case(f"ppermute_ring_{tag}", A, lambda b, A=A, n=n: D.ppermute(b, A, [(i, (i + 1) % n) for i in range(n)]),
                 lambda ms, p: ms[(p - 1) % len(ms)]),
            Case(f"ppermute_partial_{tag}", A, lambda b, A=A, n=n: D.ppermute(b, A, [(0, n - 1)]),
                 lambda ms, p: ms[0] if p == len(ms) - 1 else torch.zeros_like(ms[0])),
            Case(f"all_to_all_tiled_{tag}", A, lambda b, A=A: D.all_to_all(b, A, 1, 0, tiled=True),
                 lambda ms, p, n=n: torch.cat([m.chunk(n, 1)[p] for m in ms], 0)),
            Case(f"all_to_all_{tag}", A, lambda b, A=A, d=d_ns: D.all_to_all(b, A, d, 1 - d),
                 lambda ms, p, d=d_ns: torch.stack([m.unbind(d)[p] for m in ms], 1 - d)),
        ]
    # out specs that claim replication along some axes: the global cotangent is split over the replicas
    XY = ("X", "Y")
    cases += [
        Case("psum_XY_out_replicated", XY, lambda b: D.psum(b, XY), lambda ms, p: sum(ms), out=()),
        Case("psum_X_out_Y", "X", lambda b: D.psum(b, "X"), lambda ms, p: sum(ms), out=("Y",)),
        Case("pmean_Y_out_X", "Y", lambda b: D.pmean(b, "Y"), lambda ms, p: sum(ms) / 2, out=("X",)),
        Case("pmax_XY_out_replicated", XY, lambda b: D.pmax(b, XY), lambda ms, p: torch.stack(ms).amax(0), out=(),
             ties=True),
        Case("all_gather_XY_out_replicated", XY, lambda b: D.all_gather(b, XY, tiled=True),
             lambda ms, p: torch.cat(ms, 0), out=()),
    ]
    return cases


def reference_collective(case, x):
    """(local results per rank, the global result) of a collective case, in torch."""
    blocks = [x[ROWS * r: ROWS * (r + 1)] for r in range(WORLD)]
    local = []
    for r in range(WORLD):
        ms = members(r, case.axes)
        local.append(case.ref([blocks[m] for m in ms], ms.index(r)))
    spec0 = case.out[0] if case.out else None
    return local, torch.cat([local[r] for r in members(0, spec0)], 0)


# ---- shard_map cases with their own specs: (inputs, in_specs, out_specs, body, global torch reference) ----
def _dp_loss(xd, y, w):
    return ((xd @ w - y) ** 2).mean()


SPEC_CASES = {
    # an input replicated along Y, summed over its two copies
    "replicated_input_psum": dict(
        shapes=[(8, 4)], in_specs=(("X",),), out_specs=("X",),
        body=lambda b: D.psum(b, "Y"), ref=lambda x: 2 * x),
    # the seed's In @ W with In P('X', 'Y'), W P('Y', None): the partial products summed within Y
    "matmul_psum": dict(
        shapes=[(8, 4), (4, 6)], in_specs=(("X", "Y"), ("Y", None)), out_specs=("X", None),
        body=lambda a, w: D.psum(a @ w, "Y"), ref=lambda a, w: a @ w),
    # ... or reduce-scattered, the output features split along Y
    "matmul_psum_scatter": dict(
        shapes=[(8, 4), (4, 6)], in_specs=(("X", "Y"), ("Y", None)), out_specs=("X", "Y"),
        body=lambda a, w: D.psum_scatter(a @ w, "Y", scatter_dimension=1, tiled=True), ref=lambda a, w: a @ w),
    # column-parallel: rows along X (replicated along Y), the weight's columns along Y (replicated along X)
    "column_parallel": dict(
        shapes=[(8, 4), (4, 6)], in_specs=(("X",), (None, "Y")), out_specs=("X", "Y"),
        body=lambda a, w: a @ w, ref=lambda a, w: a @ w),
    # a fully replicated input scaled by the process's X position: out P('X') stacks the two versions
    "replicated_input_axis_index": dict(
        shapes=[(4, 4)], in_specs=((),), out_specs=("X",),
        body=lambda b: b * (D.axis_index("X") + 1), ref=lambda x: torch.cat([x, 2 * x])),
    # two results, one claimed replicated
    "two_outputs": dict(
        shapes=[(8, 4)], in_specs=((("X", "Y"),),), out_specs=[(), (("X", "Y"),)],
        body=lambda b: (D.psum(b, ("X", "Y")), b * 2),
        ref=lambda x: (x.reshape(4, 2, 4).sum(0), 2 * x)),
    # data parallel: replicated parameters, sharded data, the loss averaged with pmean
    "data_parallel_loss": dict(
        shapes=[(8, 4), (8, 1), (4, 1)], in_specs=((("X", "Y"),), (("X", "Y"),), ()), out_specs=(),
        body=lambda xd, y, w: D.pmean(_dp_loss(xd, y, w), ("X", "Y")), ref=_dp_loss),
    # one spec for a list argument: every tensor in it is split alike
    "list_argument": dict(
        shapes=[(8, 4), (8, 4)], in_specs="one list", out_specs=("X",),
        body=lambda ab: ab[0] * ab[1], ref=lambda a, b: a * b),
}


def spec_inputs(k, name):
    return [ints(2000 + 10 * k + i, s) for i, s in enumerate(SPEC_CASES[name]["shapes"])]


def to_spec(entries):
    """P from a tuple of entries; a list of such tuples -> a list of specs."""
    if isinstance(entries, list):
        return [D.P(*e) for e in entries]
    return D.P(*entries)


# ---- placement ---------------------------------------------------------------------------------------
PLACEMENT_SPECS = [(), ("X",), ("Y",), ("X", "Y"), ("Y", "X"), (("X", "Y"),), (("Y", "X"),), (None, "Y"),
                   (None, ("X", "Y")), ("Y", None)]


def expected_block(x, entries, r):
    """The block rank r holds: per dimension, the block numbered by r's linear index over its axes."""
    idx = []
    for d in range(x.dim()):
        axes = axes_of(entries[d] if d < len(entries) else None)
        n = len(members(0, axes))
        pos = members(r, axes).index(r) if axes else 0
        size = x.shape[d] // n
        idx.append(slice(pos * size, (pos + 1) * size))
    return x[tuple(idx)]


# ---- compile -------------------------------------------------------------------------------------------
def compiled_body(b):
    """The local function of the compile scenario (collectives between pointwise ops)."""
    t = (D.psum(b.sin() * 2, "X") + 1).tanh()
    g = D.all_gather(b, "Y", axis=1, tiled=True).exp()
    return t * D.psum_scatter(g, "Y", scatter_dimension=1, tiled=True) + D.axis_index(("X", "Y"))


def compiled_body_ref(x):
    """Its local results per rank, in torch."""
    rows = x.shape[0] // WORLD
    blocks = [x[rows * r: rows * (r + 1)] for r in range(WORLD)]
    out = []
    for r in range(WORLD):
        t = (sum(blocks[m].sin() * 2 for m in members(r, "X")) + 1).tanh()
        g = torch.cat([blocks[m] for m in members(r, "Y")], 1).exp()
        p = members(r, "Y").index(r)
        out.append(t * (2 * g).chunk(2, 1)[p] + r)
    return out
