"""Collectives over named mesh axes, as entries of the op table with derivatives (seed 001 §4-§5).

Inside :func:`~tensorplay.distributed.shard_map` the body sees local blocks, and these functions
communicate between the processes along one axis or a tuple of axes of the bound mesh.  The members
of a collective over ``axes`` are the processes that differ from this one only along ``axes``, in
linear-index order, the first axis major (:class:`~tensorplay.distributed.mesh.AxisGroup`).

=================================  ===========================================================
``psum / pmean / pmax / pmin``     reduce over the members; every member gets the result
``all_gather(x, axes, axis,        the members' blocks stacked at a new dim ``axis`` (or, tiled,
tiled)``                           concatenated along ``axis``), in member order
``psum_scatter(x, axes,            the sum over the members, of which member ``i`` keeps block
scatter_dimension, tiled)``        ``i`` along ``scatter_dimension`` (size n: removed; tiled: /n)
``ppermute(x, axes, perm)``        ``perm = [(source, dest), ...]`` (member positions): dest gets
                                   source's block; a member no pair sends to gets zeros; no sums
``all_to_all(x, axes, split_axis,  member ``j`` gets every member's ``j``-th piece along
concat_axis, tiled)``              ``split_axis``, joined in member order at ``concat_axis`` (size n:
                                   split removed, new dim at concat; tiled: split /n, concat *n)
``all_to_all_v(x, axes,            variable sizes: member ``i`` sends its next ``send_sizes[j]`` rows
send_sizes)``                      (dim 0) to member ``j`` and receives ``(rows, recv_sizes)``, the
                                   members' pieces for it in member order (seed 001 §6: expert
                                   parallelism's dispatch and return)
``axis_index(axes)``               this process's member position (a Python int)
``axis_size(axes)``                the number of members (a Python int)
=================================  ===========================================================

Derivatives.  Autograd inside a body computes the gradient of the *sum over the processes* of what
each one seeds: each cotangent a process holds is its *part* of the global cotangent.  In that
convention every collective's backward is its linear transpose -- psum <-> psum, pmean <-> pmean,
all_gather <-> psum_scatter, ppermute(perm) <-> ppermute(inverse perm), all_to_all(split, concat)
<-> all_to_all(concat, split), all_to_all_v(send, recv) <-> all_to_all_v(recv, send) (the reverse
exchange: the received rows' cotangents go back to their senders, in the order they came);
pmax/pmin route the summed cotangent to the members holding the extreme value, split evenly among
ties.  The identity by which a replicated value enters the body transposes to a psum, done by
shard_map at its boundary, which also turns a global cotangent into parts (shard_map.py) -- the
global gradient then equals the single-process one without tracking which values are replicated.

Compilation.  Each collective is an op-table entry (``dist_psum``, ...) whose non-tensor arguments
are the mesh's number in this process and the axis names, so ``tp.compile`` records it in the graph
like any op; Stax has no lowering for it and runs it as a fallback kernel (a call of the eager
kernel, between fused kernels), the AOT backend differentiates it with the formulas here.  Every
process compiles the same graph, so the collectives run in the same order everywhere.  Kernels
given meta or fake tensors compute shapes only and never communicate.
"""
from __future__ import annotations

import contextlib
import numbers

import torch

from .._tensor import Tensor
from ..ops.registry import OPS, register
from .mesh import Mesh

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all",
           "all_to_all_v", "axis_index", "axis_size", "bound_mesh", "mesh_id", "mesh_of", "participants"]


# ---- meshes by number, and the mesh a body is bound to -----------------------------------------
_MESHES: list = []
_MESH_IDS: dict = {}
_BOUND: list = []


def mesh_id(mesh: Mesh) -> int:
    """The number of ``mesh`` in this process (the op table's argument for it)."""
    i = _MESH_IDS.get(mesh)
    if i is None:
        i = _MESH_IDS[mesh] = len(_MESHES)
        _MESHES.append(mesh)
    return i


def mesh_of(i: int) -> Mesh:
    return _MESHES[i]


@contextlib.contextmanager
def bind(mesh: Mesh):
    """The axis names of ``mesh`` are in scope (shard_map's body)."""
    if _BOUND:
        raise RuntimeError("shard_map inside shard_map is not supported")
    _BOUND.append(mesh)
    try:
        yield mesh
    finally:
        _BOUND.pop()


def bound_mesh(who: str = "collective") -> Mesh:
    if not _BOUND:
        raise RuntimeError(f"{who}: no mesh axis is bound here; collectives run inside shard_map(f, mesh, "
                           f"in_specs, out_specs), where f sees local blocks")
    return _BOUND[-1]


# ---- kernels (torch tensors in, torch tensors out) ----------------------------------------------
def _dist():
    import torch.distributed as dist
    return dist


def _real(t) -> bool:
    return t.device.type != "meta" and getattr(t, "fake_mode", None) is None


def _group(mid, axes):
    mesh = _MESHES[mid]
    if _BOUND and _BOUND[-1] != mesh:
        raise RuntimeError(f"a collective over {tuple(axes)} of {mesh} runs inside a shard_map over {_BOUND[-1]}: "
                           f"a compiled local function is specialised to the mesh it was first called under "
                           f"(compile one per mesh)")
    return mesh.group(tuple(axes))


def _size(mid, axes) -> int:
    return _MESHES[mid].axis_size(tuple(axes))


def _dim(d, ndim, who, new=False):
    n = ndim + 1 if new else ndim
    if not -n <= d < n:
        raise IndexError(f"{who}: dimension {d} out of range for a tensor of {ndim} dimensions")
    return d % n


_REDUCE = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _all_reduce(x, mid, axes, how):
    if not _real(x):
        return x.new_empty(x.shape)
    g = _group(mid, axes)
    out = x.contiguous().clone()
    if g.size > 1:
        dist = _dist()
        dist.all_reduce(out, op=getattr(dist.ReduceOp, _REDUCE[how]), group=g.pg)
    return out


def _gather_list(x, g):
    """Every member's ``x`` (contiguous), in member order."""
    x = x.contiguous()
    if g.size == 1:
        return [x]
    parts = [torch.empty_like(x) for _ in range(g.size)]
    _dist().all_gather(parts, x, group=g.pg)
    return [parts[g.group_rank(i)] for i in range(g.size)]


def _all_gather_kernel(x, mid, axes, axis, tiled):
    n = _size(mid, axes)
    d = _dim(axis, x.dim(), "all_gather", new=not tiled)
    if not _real(x):
        shape = list(x.shape)
        if tiled:
            shape[d] = shape[d] * n
        else:
            shape.insert(d, n)
        return x.new_empty(shape)
    parts = _gather_list(x, _group(mid, axes))
    return torch.cat(parts, d) if tiled else torch.stack(parts, d)


def _pieces(x, n, d, tiled, who):
    if tiled:
        if x.shape[d] % n:
            raise ValueError(f"{who}: dimension {d} of size {x.shape[d]} is not divisible by the {n} members "
                             f"(tiled=True)")
        return [c.contiguous() for c in x.chunk(n, d)] if _real(x) else None
    if x.shape[d] != n:
        raise ValueError(f"{who}: dimension {d} has size {x.shape[d]}, but there are {n} members (tiled=False "
                         f"needs exactly one entry per member; tiled=True splits it into {n} blocks)")
    return [c.contiguous() for c in x.unbind(d)] if _real(x) else None


def _psum_scatter_kernel(x, mid, axes, scatter_dimension, tiled):
    n = _size(mid, axes)
    d = _dim(scatter_dimension, x.dim(), "psum_scatter")
    chunks = _pieces(x, n, d, tiled, "psum_scatter")
    if chunks is None:
        shape = list(x.shape)
        if tiled:
            shape[d] = shape[d] // n
        else:
            del shape[d]
        return x.new_empty(shape)
    g = _group(mid, axes)
    if g.size == 1:
        return chunks[0].clone()
    inputs = [None] * g.size
    for i, c in enumerate(chunks):
        inputs[g.group_rank(i)] = c
    out = torch.empty_like(chunks[0])
    _dist().reduce_scatter(out, inputs, group=g.pg)
    return out


def _pairs(perm):
    return list(zip(perm[0::2], perm[1::2]))


def _ppermute_kernel(x, mid, axes, perm):
    if not _real(x):
        return x.new_empty(x.shape)
    g = _group(mid, axes)
    x = x.contiguous()
    out = torch.zeros_like(x)
    dist = _dist()
    ops = []
    for src, dst in _pairs(perm):
        if src == g.index and dst == g.index:
            out.copy_(x)
        elif src == g.index:
            ops.append(dist.P2POp(dist.isend, x, g.ranks[dst], g.pg))
        elif dst == g.index:
            ops.append(dist.P2POp(dist.irecv, out, g.ranks[src], g.pg))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return out


def _all_to_all_kernel(x, mid, axes, split_axis, concat_axis, tiled):
    n = _size(mid, axes)
    s = _dim(split_axis, x.dim(), "all_to_all")
    c = _dim(concat_axis, x.dim() if tiled else x.dim() - 1, "all_to_all", new=not tiled)
    chunks = _pieces(x, n, s, tiled, "all_to_all")
    if chunks is None:
        shape = list(x.shape)
        if tiled:
            shape[s] //= n
            shape[c] *= n
        else:
            del shape[s]
            shape.insert(c, n)
        return x.new_empty(shape)
    g = _group(mid, axes)
    if g.size == 1:
        got = [chunks[0]]
    else:
        inputs, outputs = [None] * g.size, [None] * g.size
        for j, ch in enumerate(chunks):
            inputs[g.group_rank(j)] = ch
            outputs[g.group_rank(j)] = torch.empty_like(ch)
        _dist().all_to_all(outputs, inputs, group=g.pg)
        got = [outputs[g.group_rank(i)] for i in range(g.size)]
    return torch.cat(got, c) if tiled else torch.stack(got, c)


def _all_to_all_v_kernel(x, mid, axes, send_sizes, recv_sizes):
    """Rows ``[sum(send_sizes), ...]`` out, ``[sum(recv_sizes), ...]`` in; both lists in member order.
    The receive sizes come from the caller (:func:`all_to_all_v` exchanges them first), so the
    output shape is known without communicating (meta and fake tensors)."""
    n = _size(mid, axes)
    for what, sizes in (("send_sizes", send_sizes), ("recv_sizes", recv_sizes)):
        if len(sizes) != n or any(v < 0 for v in sizes):
            raise ValueError(f"all_to_all_v: {what} must be {n} non-negative row counts (one per member), "
                             f"got {list(sizes)}")
    if x.dim() < 1 or x.shape[0] != sum(send_sizes):
        raise ValueError(f"all_to_all_v: the input has {list(x.shape)[:1] or 'no'} rows, but send_sizes "
                         f"{list(send_sizes)} sum to {sum(send_sizes)}")
    shape = [sum(recv_sizes), *x.shape[1:]]
    if not _real(x):
        return x.new_empty(shape)
    g = _group(mid, axes)
    if g.size == 1:
        return x.contiguous().clone()
    # all_to_all_single orders its pieces by group rank; the members' order may differ
    by_rank = [g.group_rank(j) for j in range(n)]
    member = sorted(range(n), key=lambda j: by_rank[j])
    send = list(x.contiguous().split(list(send_sizes), 0))
    inp = torch.cat([send[j] for j in member], 0)
    out = x.new_empty(shape)
    parts = list(out.split(list(recv_sizes), 0))               # views in member order
    buf = x.new_empty(shape)
    _dist().all_to_all_single(buf, inp, output_split_sizes=[recv_sizes[j] for j in member],
                              input_split_sizes=[send_sizes[j] for j in member], group=g.pg)
    for j, piece in zip(member, buf.split([recv_sizes[j] for j in member], 0)):
        parts[j].copy_(piece)
    return out


# ---- the op table's entries ----------------------------------------------------------------------
def _op(name):
    return OPS[name].fn


def _pext_bwd(ctx, g):
    """pmax / pmin: the summed cotangent goes to the members holding the extreme, split evenly."""
    mask = (ctx.self == ctx.result).to(g.dtype)
    count = _op("dist_psum")(mask, ctx.mesh, ctx.axes)
    return _op("dist_psum")(g, ctx.mesh, ctx.axes) * mask / count


def _inverse(perm):
    return [v for s, d in _pairs(perm) for v in (d, s)]


_KW = dict(method=False, function=False, tags=("collective",))
if "dist_psum" not in OPS:          # (a reload of this module must not register them twice)
    register("dist_psum(Tensor self, int mesh, str[] axes) -> Tensor",
             lambda self, mesh, axes: _all_reduce(self, mesh, axes, "sum"),
             backward=lambda ctx, g: _op("dist_psum")(g, ctx.mesh, ctx.axes), save=(), **_KW,
             doc="psum over mesh axes (tensorplay.distributed.psum)")
    for _how in ("max", "min"):
        register(f"dist_p{_how}(Tensor self, int mesh, str[] axes) -> Tensor",
                 (lambda how: lambda self, mesh, axes: _all_reduce(self, mesh, axes, how))(_how),
                 backward=_pext_bwd, save=("self", "result"), **_KW,
                 doc=f"p{_how} over mesh axes (tensorplay.distributed.p{_how})")
    register("dist_all_gather(Tensor self, int mesh, str[] axes, int axis, bool tiled) -> Tensor",
             _all_gather_kernel, save=(), **_KW,
             backward=lambda ctx, g: _op("dist_psum_scatter")(g, ctx.mesh, ctx.axes, ctx.axis, ctx.tiled),
             doc="all_gather over mesh axes (tensorplay.distributed.all_gather)")
    register("dist_psum_scatter(Tensor self, int mesh, str[] axes, int scatter_dimension, bool tiled) -> Tensor",
             _psum_scatter_kernel, save=(), **_KW,
             backward=lambda ctx, g: _op("dist_all_gather")(g, ctx.mesh, ctx.axes, ctx.scatter_dimension, ctx.tiled),
             doc="psum_scatter over mesh axes (tensorplay.distributed.psum_scatter)")
    register("dist_ppermute(Tensor self, int mesh, str[] axes, int[] perm) -> Tensor",
             _ppermute_kernel, save=(), **_KW,
             backward=lambda ctx, g: _op("dist_ppermute")(g, ctx.mesh, ctx.axes, _inverse(ctx.perm)),
             doc="ppermute over mesh axes (tensorplay.distributed.ppermute); perm flattened (src, dst) pairs")
    register("dist_all_to_all(Tensor self, int mesh, str[] axes, int split_axis, int concat_axis, bool tiled) -> Tensor",
             _all_to_all_kernel, save=(), **_KW,
             backward=lambda ctx, g: _op("dist_all_to_all")(g, ctx.mesh, ctx.axes, ctx.concat_axis, ctx.split_axis,
                                                           ctx.tiled),
             doc="all_to_all over mesh axes (tensorplay.distributed.all_to_all)")
if "dist_all_to_all_v" not in OPS:
    register("dist_all_to_all_v(Tensor self, int mesh, str[] axes, int[] send_sizes, int[] recv_sizes) -> Tensor",
             _all_to_all_v_kernel, save=(), **_KW,
             backward=lambda ctx, g: _op("dist_all_to_all_v")(g, ctx.mesh, ctx.axes, ctx.recv_sizes, ctx.send_sizes),
             doc="all_to_all with per-member row counts over mesh axes (tensorplay.distributed.all_to_all_v)")


# ---- the public functions --------------------------------------------------------------------------
def _resolve(axis_name, who):
    mesh = bound_mesh(who)
    return mesh, mesh_id(mesh), list(mesh.axes(axis_name))


def _map(x, f, who):
    if isinstance(x, (tuple, list)):
        return type(x)(_map(v, f, who) for v in x)
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: expected a tp.Tensor (a local block inside shard_map), got {type(x).__name__}")
    return f(x)


def psum(x, axis_name):
    """Sum of ``x`` over the members along ``axis_name`` (a name or a tuple of names); every member
    gets the sum.  A Python number ``x`` is multiplied by the number of members."""
    mesh, mid, axes = _resolve(axis_name, "psum")
    if isinstance(x, numbers.Number):
        return x * mesh.axis_size(axes)
    return _map(x, lambda t: _op("dist_psum")(t, mid, axes), "psum")


def pmean(x, axis_name):
    """Mean of ``x`` over the members along ``axis_name``."""
    mesh, _, axes = _resolve(axis_name, "pmean")
    n = mesh.axis_size(axes)
    return _map(psum(x, axis_name), lambda t: t / n, "pmean")


def pmax(x, axis_name):
    """Elementwise maximum over the members along ``axis_name``."""
    _, mid, axes = _resolve(axis_name, "pmax")
    return _map(x, lambda t: _op("dist_pmax")(t, mid, axes), "pmax")


def pmin(x, axis_name):
    """Elementwise minimum over the members along ``axis_name``."""
    _, mid, axes = _resolve(axis_name, "pmin")
    return _map(x, lambda t: _op("dist_pmin")(t, mid, axes), "pmin")


def all_gather(x, axis_name, *, axis=0, tiled=False):
    """The members' ``x``, stacked at a new dimension ``axis`` (tiled: concatenated along ``axis``)."""
    _, mid, axes = _resolve(axis_name, "all_gather")
    return _map(x, lambda t: _op("dist_all_gather")(t, mid, axes, int(axis), bool(tiled)), "all_gather")


def psum_scatter(x, axis_name, *, scatter_dimension=0, tiled=False):
    """The sum over the members, scattered: member ``i`` keeps block ``i`` along ``scatter_dimension``."""
    _, mid, axes = _resolve(axis_name, "psum_scatter")
    return _map(x, lambda t: _op("dist_psum_scatter")(t, mid, axes, int(scatter_dimension), bool(tiled)),
                "psum_scatter")


def ppermute(x, axis_name, perm):
    """Send ``x`` from member ``source`` to member ``dest`` for every ``(source, dest)`` of ``perm``
    (one exchange, not a sequence); a member that no pair sends to gets zeros."""
    mesh, mid, axes = _resolve(axis_name, "ppermute")
    n = mesh.axis_size(axes)
    pairs = [(int(s), int(d)) for s, d in perm]
    for s, d in pairs:
        if not (0 <= s < n and 0 <= d < n):
            raise ValueError(f"ppermute: pair {(s, d)} out of range for {n} members along {tuple(axes)}")
    for what, vals in (("source", [s for s, _ in pairs]), ("destination", [d for _, d in pairs])):
        if len(set(vals)) != len(vals):
            raise ValueError(f"ppermute: a {what} appears twice in {pairs}")
    flat = [v for p in pairs for v in p]
    return _map(x, lambda t: _op("dist_ppermute")(t, mid, axes, flat), "ppermute")


def all_to_all(x, axis_name, split_axis, concat_axis, *, tiled=False):
    """Member ``j`` receives every member's ``j``-th piece along ``split_axis``, joined in member
    order at ``concat_axis`` (module doc for the shapes)."""
    _, mid, axes = _resolve(axis_name, "all_to_all")
    return _map(x, lambda t: _op("dist_all_to_all")(t, mid, axes, int(split_axis), int(concat_axis), bool(tiled)),
                "all_to_all")


def all_to_all_v(x, axis_name, send_sizes, *, recv_sizes=None):
    """Variable-size all-to-all along dim 0: this member sends its rows in consecutive pieces,
    ``send_sizes[j]`` rows to member ``j`` (a list of ints or a 1-D integer tensor, one entry per
    member, summing to ``x.shape[0]``), and returns ``(rows, recv_sizes)``: the pieces the members
    sent it, concatenated in member order, and their row counts (a list of ints).

    Two exchanges: the counts first (an :func:`all_to_all` of the count vector, read on the host:
    the output's size depends on them), then the rows (``all_to_all_single`` with input and output
    split sizes).  Differentiable: the backward is the reverse exchange, ``all_to_all_v`` of the
    cotangent with the two size lists swapped, so every sent row gets the cotangent of the row it
    became.  A piece may be empty; the trailing dimensions must agree across members.  Given
    ``recv_sizes`` (known from an earlier exchange, e.g. the reverse of one), the counts are not
    exchanged again."""
    mesh, mid, axes = _resolve(axis_name, "all_to_all_v")
    if not isinstance(x, Tensor):
        raise TypeError(f"all_to_all_v: expected a tp.Tensor (a local block inside shard_map), got {type(x).__name__}")
    n = mesh.axis_size(axes)
    if isinstance(send_sizes, Tensor):
        if send_sizes.dim() != 1 or send_sizes.dtype.is_floating_point:
            raise ValueError(f"all_to_all_v: send_sizes must be a 1-D integer tensor, got {send_sizes.dtype} "
                             f"of shape {list(send_sizes.shape)}")
        send_sizes = send_sizes.tolist()          # (under tp.compile: a data gate)
    send = [int(v) for v in send_sizes]
    if len(send) != n:
        raise ValueError(f"all_to_all_v: send_sizes must have one entry per member along {tuple(axes)} ({n}), "
                         f"got {send}")
    if recv_sizes is None:
        counts = Tensor(torch.tensor(send, dtype=torch.int64, device=x._data.device))   # (NCCL: device tensors)
        recv_sizes = _op("dist_all_to_all")(counts, mid, axes, 0, 0, True).tolist()
    recv = [int(v) for v in recv_sizes]
    return _op("dist_all_to_all_v")(x, mid, axes, send, recv), recv


def axis_index(axis_name) -> int:
    """This process's position along ``axis_name`` (a tuple of axes: the linear index, first major)."""
    mesh, _, axes = _resolve(axis_name, "axis_index")
    return mesh.linear_index(mesh.process_index(), axes)


def participants(op, raw) -> tuple:
    """The ranks that take part in one call of collective ``op`` (its canonical arguments ``raw``):
    the profiler's key for matching the call across the ranks' traces."""
    names = op.schema.arg_names
    g = _group(raw[names.index("mesh")], list(raw[names.index("axes")]))
    return tuple(g.ranks)


def axis_size(axis_name) -> int:
    """The number of members along ``axis_name``."""
    mesh, _, axes = _resolve(axis_name, "axis_size")
    return mesh.axis_size(axes)
