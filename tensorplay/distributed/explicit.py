"""Explicit mode: ordinary tp ops on global arrays whose shardings propagate (seed 001 §4).

In manual mode (shard_map.py) the function sees local blocks and the user writes the collectives.
In explicit mode the function sees *global* arrays -- :class:`ShardedArray` values -- and calls the
ordinary ops on them (``a @ w``, ``x + b``, ``x.sum(0)``, ``tp.softmax(x, -1)``, ...).  Each op
computes on the local blocks and returns a ShardedArray whose sharding follows from its inputs'
by a *propagation rule*; where the rule needs communication it inserts the collective, and where
the layout of the result is ambiguous it raises and asks for a :func:`with_sharding_constraint`
(or :func:`~tensorplay.distributed.device_put`) instead of guessing.

Dispatch.  A ShardedArray is not a ``tp.Tensor``: when an op of the table receives one (an
operator, a method, a ``tp.`` function, ``tp.nn.functional``), the eager dispatcher hands the call
to :func:`dispatch` (the ``__tp_dispatch__`` hook of ops/registry.py).  :func:`dispatch` picks the
rule: a few named rules (matmul, the reductions with a collective of their own, the row-wise nn
ops, linear, embedding), else by the op's tags -- ``pointwise``, ``view``, ``reduction``; any
other op raises ``NotImplementedError`` (gather first, or use shard_map).  A plain ``tp.Tensor`` next to a
ShardedArray is a replicated global value.

The rules (``A``, ``V``: tuples of mesh axes; ``n``: the number of devices along them).  In-place
ops and collectives on a ShardedArray raise:

==================  =============================================================================
pointwise           operands broadcast as usual; on each output dim the operands' specs must agree,
                    or be unsplit there (a broadcast size-1 dim always is).  An operand unsplit on
                    a dim the output splits is sliced locally (no communication).  Two operands
                    split differently on one dim raise ``ValueError`` naming both specs.
reduction           ``sum`` / ``mean`` / ``amax`` / ``amin`` over a dim split along ``A``: each device
(sum, mean, amax,   reduces its block (a partial result), then one all-reduce over ``A`` (psum /
amin)               psum then ``/n`` / pmax / pmin); the output is replicated on ``A``.  Over unsplit
                    dims: local, no communication.  Other reductions (``var``, ``prod``, ...) first
                    all-gather the reduced dims, then reduce locally.
view                the op on a contiguous meta array of the global shape tells what it is: strides
                    permuted (``transpose``, ``permute``, ``t``, ``movedim``) -> the spec permuted
                    alike; contiguous (``reshape``, ``view``, ``flatten``, ``unsqueeze``, ...) -> the
                    dims are grouped (input dims whose product equals a group of output dims); a
                    split input dim must be the first of its group, and the group's first output
                    dim divisible by ``n``, else ``ValueError`` (reshard first).  Others raise.
matmul (``@``,      ``[..., M, K] @ [K, N]`` (or ``[..., K, N]``, batch specs equal): the output is
``mm``)             ``(batch, M's spec, N's spec)``.  ``K`` split along ``A`` on *both* sides: each
                    local product is a partial sum over ``A`` -- a :class:`PartialSum`, reduced when
                    used: an all-reduce over ``A`` by default, a reduce-scatter when
                    :func:`with_sharding_constraint` (or :func:`matmul` ``out_sharding=``) asks for
                    an output split along axes of ``A``.  Rows of different ``M`` blocks are never
                    added.  ``K`` split on one side only, or along different axes: ``ValueError``
                    (ambiguous: reshard one side).
softmax,            the normalised dims (softmax's ``dim``, layer_norm's trailing
log_softmax,        ``normalized_shape``) are all-gathered if split; then the pointwise rule (its
layer_norm          weight and bias broadcast like operands).
linear              ``x @ weight.t() + bias`` by the matmul, view and pointwise rules (``nn.Linear``).
embedding           (``tp.embedding(weight, ids)``; ``F.embedding`` accepts tp.Tensors only)
                    ids of any spec, weight replicated on the vocabulary dim: a local lookup, the
                    output ``(ids' spec, weight's dim-1 spec)``.  Weight split on the vocabulary
                    along ``V`` (ids not split along ``V``): each device looks up the ids in its
                    rows (zero elsewhere), then an all-reduce over ``V``.
==================  =============================================================================

:func:`with_sharding_constraint` ``(x, sharding)`` is strict: the result has exactly ``sharding``.
Per dimension, from the current axes ``C`` to the target ``T``: ``T`` extends ``C`` -> a local
slice; ``C`` extends ``T`` -> an all-gather over the extra axes; otherwise an all-gather over
``C`` then a slice.  All gathers run before all slices.  A pending :class:`PartialSum` is
reduce-scattered onto the dims whose target adds its axes, and all-reduced over the rest.

Autograd.  The local ops are tp ops and every inserted step is an entry of the op table
(``dist_allreduce``, ``dist_allreduce_extreme``, ``dist_psum_scatter``, ``dist_allgather_blocks``,
``dist_block``, ``dist_broadcast``) whose derivative is in the *global* convention of array.py (each
process holds the whole cotangent of each value it holds): an all-reduce of partial sums
transposes to the identity, a reduce-scatter to an all-gather, an all-gather to taking one's block,
a local slice to an all-gather, and an operand used by devices that hold different blocks of the
output (a replicated weight times sharded data) gets a psum of its cotangent over those axes.
Gradients are the single-process ones; every process runs the backward pass.  Being op-table
entries, the steps are what a capture records, so a compiled explicit-mode function is
differentiated with the same formulas (compiled.py).

:func:`explain` ``(f, *args)`` runs ``f`` once and lists every op with its local shapes and specs
and every inserted collective with its axes and bytes (on an *abstract* mesh too, given local blocks
on the meta device: shape arithmetic without processes).

``tp.compile``.  ``tp.compile(f)(a, b)`` with ShardedArrays compiles ``f``'s *local program* (the
function of the local blocks that runs these rules, :func:`on_blocks`): the captured graph holds
the local ops and the inserted steps; ``tp.compile(f).lower(a, b).as_text()`` (and
:func:`compiled_text`) lists it with each collective's axes and bytes, and training works
(compiled.py).
"""
from __future__ import annotations

import contextlib

import torch

from .._tensor import Tensor
from ..ops.registry import OPS, register
from .array import ShardedArray, device_put
from .compiled import compile_hook, compiled_text, on_blocks  # noqa: F401 (re-exported)
from .collectives import _all_gather_kernel, _all_reduce as _all_reduce_kernel, _real, mesh_id, mesh_of
from .sharding import NamedSharding, PartitionSpec

__all__ = ["with_sharding_constraint", "matmul", "explain", "Explanation", "PartialSum", "dispatch", "on_blocks",
           "compiled_text"]


# ---- the record that explain() reads -------------------------------------------------------------
_LOGS: list = []


def _note(**entry):
    for log in _LOGS:
        log.append(entry)


def _fmt(t) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _nbytes(t) -> int:
    return t.numel() * t._data.element_size()


def _comm(kind, axes, x, y):
    """Record one inserted collective: its input's bytes, its local shapes in and out."""
    _note(what="collective", kind=kind, axes=tuple(axes), bytes=_nbytes(x), local=tuple(x.shape),
          out=tuple(y.shape), dtype=x.dtype)
    return y


def _me(mesh, axes) -> int:
    return mesh.linear_index(mesh.process_index(), axes)


# ---- the inserted steps: op-table entries with global-convention derivatives ---------------------
# (entries of the op table, so that tp.compile captures them as graph nodes and the AOT backend
# differentiates a compiled explicit-mode function with these formulas, not with the part
# convention of shard_map's collectives)
def _block_kernel(x, mid, axes, dim):
    """This member's piece along ``dim`` of a value replicated along ``axes`` (no communication)."""
    mesh, axes = mesh_of(mid), tuple(axes)
    n, d = mesh.axis_size(axes), dim % max(x.dim(), 1)
    if x.dim() == 0 or x.shape[d] % n:
        raise ValueError(f"dist_block: dimension {dim} of {list(x.shape)} is not divisible by the {n} members "
                         f"along {axes}")
    m = x.shape[d] // n
    i = _me(mesh, axes) if _real(x) else 0
    return x.narrow(d, i * m, m).clone(memory_format=torch.contiguous_format)


def _extreme_bwd(ctx, g):
    """max / min of partial results: the cotangent to the members holding the extreme, split evenly."""
    mask = (ctx.self == ctx.result).to(g.dtype)
    return g * mask / OPS["dist_psum"].fn(mask, ctx.mesh, ctx.axes)


_STEP = dict(method=False, function=False)
if "dist_allreduce" not in OPS:          # (a reload of this module must not register them twice)
    register("dist_allreduce(Tensor self, int mesh, str[] axes) -> Tensor",
             lambda self, mesh, axes: _all_reduce_kernel(self, mesh, axes, "sum"),
             backward=lambda ctx, g: g, save=(), tags=("collective",), **_STEP,
             doc="explicit mode: the sum of partial results over mesh axes; derivative: the cotangent as is")
    register("dist_allreduce_extreme(Tensor self, int mesh, str[] axes, str how) -> Tensor", _all_reduce_kernel,
             backward=_extreme_bwd, save=("self", "result"), tags=("collective",), **_STEP,
             doc="explicit mode: the max / min of partial results over mesh axes")
    register("dist_allgather_blocks(Tensor self, int mesh, str[] axes, int dim) -> Tensor",
             lambda self, mesh, axes, dim: _all_gather_kernel(self, mesh, axes, dim, True),
             backward=lambda ctx, g: OPS["dist_block"].fn(g, ctx.mesh, ctx.axes, ctx.dim), save=(),
             tags=("collective",), **_STEP,
             doc="explicit mode: blocks along dim concatenated over mesh axes; derivative: this member's block")
    register("dist_block(Tensor self, int mesh, str[] axes, int dim) -> Tensor", _block_kernel,
             backward=lambda ctx, g: OPS["dist_allgather_blocks"].fn(g, ctx.mesh, ctx.axes, ctx.dim), save=(),
             tags=("per_process",), **_STEP,
             doc="explicit mode: this member's piece along dim (local); derivative: all-gather")
    register("dist_broadcast(Tensor self, int mesh, str[] axes) -> Tensor", lambda self, mesh, axes: self.clone(),
             backward=lambda ctx, g: OPS["dist_psum"].fn(g, ctx.mesh, ctx.axes), save=(), **_STEP,
             doc="explicit mode: a value used for different blocks along mesh axes; derivative: psum")


def _all_reduce(x, mesh, axes, how):
    """Partial results -> their reduction over ``axes`` (backward: sum -> the cotangent as is;
    max / min -> to the members holding the extreme)."""
    mid, axes = mesh_id(mesh), list(axes)
    y = OPS["dist_allreduce"].fn(x, mid, axes) if how == "sum" else OPS["dist_allreduce_extreme"].fn(x, mid, axes, how)
    return _comm(f"all-reduce({how})", axes, x, y)


def _reduce_scatter(x, mesh, axes, dim):
    """Partial sums -> this member's block of their sum along ``dim`` (backward: all-gather)."""
    return _comm("reduce-scatter", axes, x, OPS["dist_psum_scatter"].fn(x, mesh_id(mesh), list(axes), dim, True))


def _all_gather(x, mesh, axes, dim):
    """Blocks along ``dim`` -> their concatenation (backward: this member's block of the cotangent)."""
    return _comm("all-gather", axes, x, OPS["dist_allgather_blocks"].fn(x, mesh_id(mesh), list(axes), dim))


def _slice(x, mesh, axes, dim):
    """A block replicated along ``axes`` -> this member's piece along ``dim`` (no communication;
    backward: all-gather of the pieces' cotangents)."""
    _note(what="slice", axes=tuple(axes), dim=dim, local=tuple(x.shape))
    return OPS["dist_block"].fn(x, mesh_id(mesh), list(axes), dim)


def _broadcast(x, mesh, axes):
    """A value used by the devices along ``axes`` for different blocks of a result: identity
    (backward: the sum of their cotangents, a psum over ``axes``)."""
    return OPS["dist_broadcast"].fn(x, mesh_id(mesh), list(axes))


# ---- partial sums ------------------------------------------------------------------------------
class PartialSum(ShardedArray):
    """A ShardedArray whose local blocks still have to be summed over ``partial_axes`` (a matmul
    with a split contraction).  Used as an array (``.local()``, ``.gather()``, any op) it is
    all-reduced first, once; :func:`with_sharding_constraint` may reduce-scatter it instead.
    ``sharding`` is that of the reduced value (replicated on ``partial_axes``)."""

    __slots__ = ("_parts", "partial_axes", "_sum")

    def __init__(self, parts: Tensor, sharding: NamedSharding, shape, partial_axes):
        self._parts, self.partial_axes, self._sum = parts, tuple(partial_axes), None
        self.sharding, self.shape = sharding, torch.Size(shape)

    @property
    def pending(self) -> bool:
        return self._sum is None

    @property
    def _local(self):            # (shadows ShardedArray's slot: every method sees the sum)
        if self._sum is None:
            self._sum = _all_reduce(self._parts, self.mesh, self.partial_axes, "sum")
        return self._sum

    def reduce(self) -> ShardedArray:
        """The all-reduced value, as a plain ShardedArray."""
        return ShardedArray(self._local, self.sharding, self.shape)

    def __repr__(self):
        if self._sum is not None:
            return super().__repr__()
        return (f"PartialSum(global={list(self.shape)}, spec={self.spec}, local={list(self._parts.shape)}, "
                f"pending sum over {self.partial_axes}, mesh={self.mesh.shape}, "
                f"{str(self._parts.dtype).replace('torch.', '')})")


# ---- helpers for the rules ---------------------------------------------------------------------
def _spec(entries) -> PartitionSpec:
    return PartitionSpec(*[None if not a else a[0] if len(a) == 1 else tuple(a) for a in entries])


def _axes(x, d) -> tuple:
    return x.spec.axes_of(d) if isinstance(x, ShardedArray) else ()


def _mesh_of(op, arrays):
    meshes = {a.mesh for a in arrays if isinstance(a, ShardedArray)}
    if len(meshes) != 1:
        raise ValueError(f"tp.{op.name}: its arguments live on different meshes {sorted(map(str, meshes))}; "
                         f"device_put them onto one")
    return meshes.pop()


def _local(x):
    return x.local() if isinstance(x, ShardedArray) else x


def _consume(local, mesh, have: set, out_axes: set):
    """An operand holding blocks along ``have`` that feeds an output split (or summed) along
    ``out_axes``: the devices along the others use it for different blocks (backward: psum)."""
    extra = tuple(a for a in mesh.axis_names if a in out_axes and a not in have)
    if extra and isinstance(local, Tensor) and local.requires_grad:
        return _broadcast(local, mesh, extra)
    return local


def _result(op, out, mesh, entries, partial=()):
    """Wrap the local result(s) of a rule as ShardedArrays of spec ``entries``."""
    spec = _spec(entries)
    try:
        sharding = NamedSharding(mesh, spec)
    except ValueError as e:
        raise ValueError(f"tp.{op.name}: the propagated output sharding {spec} is not valid ({e}); "
                         f"reshard an operand with with_sharding_constraint first") from None
    if isinstance(out, (tuple, list)):
        return type(out)(_result(op, o, mesh, entries, partial) for o in out)
    if not isinstance(out, Tensor):
        return out
    shape = [n * (mesh.axis_size(a) if a else 1) for n, a in zip(out.shape, entries)]
    if partial:
        r = PartialSum(out, sharding, shape, partial)
    else:
        r = ShardedArray(out, sharding, shape)
    _note(what="op", op=op.name, out=f"{_fmt(out)} {spec}" + (f" (partial over {tuple(partial)})" if partial else ""))
    return r


def _note_inputs(op, args):
    s = op.schema
    ins = [f"{_fmt(_local_shape(args[i]))} {args[i].spec if isinstance(args[i], ShardedArray) else 'plain'}"
           for i in s.tensor_pos if isinstance(args[i], (Tensor, ShardedArray))]
    _note(what="call", op=op.name, ins=ins)


def _local_shape(x):
    if isinstance(x, PartialSum) and x.pending:
        return x._parts
    return x.local() if isinstance(x, ShardedArray) else x


def _dims(op, args, ndim, name="dim"):
    """The dims an op reduces over (all for None or [])."""
    i = op._argidx.get(name)
    d = None if i is None else args[i]
    if d is None or (isinstance(d, (list, tuple)) and len(d) == 0):
        return list(range(ndim))
    d = [d] if isinstance(d, int) else list(d)
    return sorted(x % ndim for x in d)


def _unsplit(x, dims):
    """``x`` resharded so that ``dims`` are not split (all-gathers)."""
    if not isinstance(x, ShardedArray) or not any(x.spec.axes_of(d) for d in dims):
        return x
    entries = [() if d in dims else x.spec.axes_of(d) for d in range(x.ndim)]
    return with_sharding_constraint(x, NamedSharding(x.mesh, _spec(entries)))


# ---- the rules --------------------------------------------------------------------------------
def _pointwise(op, args):
    s = op.schema
    pos = [i for i in s.tensor_pos if isinstance(args[i], (Tensor, ShardedArray))]
    mesh = _mesh_of(op, [args[i] for i in pos])
    shapes = [tuple(args[i].shape) for i in pos]
    nd = len(torch.broadcast_shapes(*shapes))
    out = [()] * nd
    for i in pos:
        x = args[i]
        for d in range(x.ndim):
            a, od = _axes(x, d), nd - x.ndim + d
            if not a:
                continue
            if out[od] and out[od] != a:
                specs = ", ".join(str(args[j].spec) for j in pos if isinstance(args[j], ShardedArray))
                raise ValueError(f"tp.{op.name}: operands split output dim {od} differently ({specs}); bring them "
                                 f"to one sharding with with_sharding_constraint or device_put")
            out[od] = a
    _note_inputs(op, args)
    new = list(args)
    all_out = {a for e in out for a in e}
    for i in pos:
        x = args[i]
        loc = _local(x)
        have = set(x.spec.mentioned) if isinstance(x, ShardedArray) else set()
        for d in range(x.ndim):
            od = nd - x.ndim + d
            if out[od] and not _axes(x, d) and x.shape[d] != 1:
                loc = _slice(loc, mesh, out[od], d)
                have |= set(out[od])
        new[i] = _consume(loc, mesh, have, all_out)
    return _result(op, op(*new), mesh, out)


_COMBINE = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}


def _reduction(op, args):
    x = args[0]
    if not isinstance(x, ShardedArray):
        raise TypeError(f"tp.{op.name}: expected a ShardedArray as its first argument")
    dims = _dims(op, args, x.ndim)
    keep = args[op._argidx["keepdim"]] if "keepdim" in op._argidx else False
    how = _COMBINE.get(op.name)
    if how is None:                       # no collective of its own: gather the reduced dims
        x = _unsplit(x, dims)
    red = tuple(a for d in dims for a in x.spec.axes_of(d))
    _note_inputs(op, (x, *args[1:]))
    loc = op(x.local(), *args[1:])
    if red:
        loc = _all_reduce(loc, x.mesh, red, how)
        if op.name == "mean":
            loc = loc / x.mesh.axis_size(red)
    out = [() if d in dims else x.spec.axes_of(d) for d in range(x.ndim) if keep or d not in dims]
    return _result(op, loc, x.mesh, out)


def _reshape_groups(src, dst):
    """Pairs (input dims, output dims) of equal products, size-1 dims on their own."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        ins, outs, pi, pj = [i], [j], src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                ins.append(i)
                pi *= src[i]
            else:
                j += 1
                outs.append(j)
                pj *= dst[j]
        groups.append((ins, outs))
        i, j = i + 1, j + 1
    return groups


def _view(op, args):
    x = args[0]
    if not isinstance(x, ShardedArray):
        raise TypeError(f"tp.{op.name}: expected a ShardedArray as its first argument")
    meta = op.run_meta(torch.empty(tuple(x.shape), device="meta"), *args[1:])
    if not isinstance(meta, torch.Tensor) or meta.numel() != x.shape.numel():
        raise NotImplementedError(f"tp.{op.name} on a ShardedArray: only views that keep every element "
                                  f"(permutations, reshapes) propagate shardings; gather first")
    src, dst = tuple(x.shape), tuple(meta.shape)
    _note_inputs(op, args)
    if meta.is_contiguous():              # a reshape
        out = [()] * len(dst)
        for ins, outs in _reshape_groups(src, dst):
            split = [d for d in ins if x.spec.axes_of(d)]
            if not split:
                continue
            a = x.spec.axes_of(split[0])
            if split != [ins[0]] or not outs or dst[outs[0]] % x.mesh.axis_size(a):
                raise ValueError(f"tp.{op.name}: {list(src)} -> {list(dst)} does not keep the split dims of "
                                 f"{x.spec} whole (a split dim must lead its group of merged / split dims and "
                                 f"the first resulting dim divide by its devices); reshard first")
            out[outs[0]] = a
        local = [n // (x.mesh.axis_size(a) if a else 1) for n, a in zip(dst, out)]
        return _result(op, OPS["reshape"].fn(x.local(), local), x.mesh, out)
    stride_in = torch.empty(src, device="meta").stride()
    out = []
    for n, st in zip(dst, meta.stride()):
        src_d = [d for d in range(len(src)) if stride_in[d] == st and src[d] == n and n != 1]
        if n != 1 and len(src_d) != 1:
            raise NotImplementedError(f"tp.{op.name} on a ShardedArray: not a permutation of dims; gather first")
        out.append(x.spec.axes_of(src_d[0]) if src_d else ())
    return _result(op, op(x.local(), *args[1:]), x.mesh, out)


def _matmul(op, args):
    a, b = args[0], args[1]
    if a.ndim < 2 or b.ndim < 2 or (b.ndim > 2 and b.ndim != a.ndim):
        raise NotImplementedError(f"tp.{op.name} on ShardedArrays: [..., M, K] @ [K, N] or equal batch dims "
                                  f"(got {list(a.shape)} @ {list(b.shape)})")
    mesh = _mesh_of(op, (a, b))
    ka, kb = _axes(a, a.ndim - 1), _axes(b, b.ndim - 2)
    if ka != kb:
        sa = a.spec if isinstance(a, ShardedArray) else "plain"
        sb = b.spec if isinstance(b, ShardedArray) else "plain"
        raise ValueError(f"tp.{op.name}: the contraction dim (size {a.shape[-1]}) is split along {ka or 'no axis'} "
                         f"on the left ({sa}) and {kb or 'no axis'} on the right ({sb}): ambiguous -- gather one "
                         f"side or split both alike (with_sharding_constraint / device_put)")
    batch = [_axes(a, d) for d in range(a.ndim - 2)]
    if b.ndim > 2 and any(_axes(b, d) != batch[d] for d in range(b.ndim - 2)):
        raise ValueError(f"tp.{op.name}: the batch dims are split differently ({a.spec} @ {b.spec}); reshard one")
    out = batch + [_axes(a, a.ndim - 2), _axes(b, b.ndim - 1)]
    _note_inputs(op, args)
    reach = {x for e in out for x in e} | set(ka)
    la = _consume(_local(a), mesh, set(_spec_mentioned(a)), reach)
    lb = _consume(_local(b), mesh, set(_spec_mentioned(b)), reach)
    return _result(op, op(la, lb), mesh, out, partial=ka)


def _spec_mentioned(x):
    return x.spec.mentioned if isinstance(x, ShardedArray) else ()


def _rowwise(which):
    def rule(op, args):
        x = args[0]
        dims = which(op, args, x.ndim)
        new = list(args)
        for i in op.schema.tensor_pos:
            y = args[i]
            if isinstance(y, ShardedArray):    # (weight / bias: the trailing dims of the input)
                new[i] = _unsplit(y, [d - (x.ndim - y.ndim) for d in dims if d - (x.ndim - y.ndim) >= 0])
        return _pointwise(op, tuple(new))
    return rule


def _embedding(op, args):
    w, ids = args[0], args[1]
    mesh = _mesh_of(op, (w, ids))
    v, h = _axes(w, 0), _axes(w, 1)
    id_axes = set(_spec_mentioned(ids))
    if v and id_axes & set(v):
        raise ValueError(f"tp.embedding: the weight's vocabulary is split along {v} and the ids too ({ids.spec}); "
                         f"replicate the ids along {v}")
    out = [_axes(ids, d) for d in range(ids.ndim)] + [h]
    _note_inputs(op, args)
    lw = _consume(_local(w), mesh, set(_spec_mentioned(w)), {a for e in out for a in e} | set(v))
    li = _local(ids)
    if not v:
        return _result(op, op(lw, li, *args[2:]), mesh, out)
    if args[2] != -1:
        raise NotImplementedError("tp.embedding: padding_idx with a vocabulary-split weight")
    rows = lw.shape[0]
    lo = _me(mesh, v) * rows
    mine = (li >= lo) & (li < lo + rows)
    part = op(lw, (li - lo) * mine.to(li.dtype), *args[2:]) * mine.unsqueeze(-1).to(lw.dtype)
    return _result(op, part, mesh, out, partial=v)


def _linear(op, args):
    """``x @ weight.t() + bias``: the matmul, view and pointwise rules (nn.Linear on ShardedArrays)."""
    y = OPS["matmul"].fn(args[0], OPS["t"].fn(args[1]))
    return y if len(args) < 3 or args[2] is None else OPS["add"].fn(y, args[2])


#: the named rules; every other op goes by its tags (dispatch)
RULES = {"matmul": _matmul, "mm": _matmul,
         "sum": _reduction, "mean": _reduction, "amax": _reduction, "amin": _reduction,
         "softmax": _rowwise(lambda op, args, n: [args[op._argidx["dim"]] % n]),
         "log_softmax": _rowwise(lambda op, args, n: [args[op._argidx["dim"]] % n]),
         "layer_norm": _rowwise(lambda op, args, n: list(range(n - len(args[1]), n))),
         "embedding": _embedding, "linear": _linear}
#: tag -> rule, in this order of preference
TAG_RULES = (("pointwise", _pointwise), ("view", _view), ("reduction", _reduction))


def dispatch(op, args):
    """Run op-table entry ``op`` on canonical ``args`` of which some are ShardedArrays (module doc)."""
    if "inplace" in op.tags or "collective" in op.tags:
        raise NotImplementedError(f"tp.{op.name} on a ShardedArray: " + (
            "in-place ops are not propagated (use the out-of-place op)" if "inplace" in op.tags else
            "collectives take local blocks, inside shard_map"))
    rule = RULES.get(op.name)
    if rule is None:
        rule = next((r for tag, r in TAG_RULES if tag in op.tags), None)
    if rule is None:
        raise NotImplementedError(f"tp.{op.name} (tags {sorted(op.tags)}) has no sharding rule in explicit mode; "
                                  f"gather() the array, or write the local code with shard_map")
    return rule(op, tuple(args))


# ---- resharding ------------------------------------------------------------------------------------
def with_sharding_constraint(x, sharding):
    """``x`` with exactly ``sharding`` (a NamedSharding, or a PartitionSpec on ``x``'s mesh),
    communicating as needed (module doc); a plain tensor is placed by :func:`device_put`."""
    if isinstance(sharding, PartitionSpec):
        if not isinstance(x, ShardedArray):
            raise TypeError("with_sharding_constraint: a PartitionSpec needs a ShardedArray (its mesh); pass a "
                            "NamedSharding")
        sharding = NamedSharding(x.mesh, sharding)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"with_sharding_constraint: expected a NamedSharding, got {type(sharding).__name__}")
    if not isinstance(x, ShardedArray):
        return device_put(x, sharding)
    if x.mesh != sharding.mesh:
        raise ValueError(f"with_sharding_constraint: {x!r} lives on {x.mesh}, the sharding on {sharding.mesh}")
    mesh, shape = x.mesh, tuple(x.shape)
    sharding.shard_shape(shape)
    want = [sharding.spec.axes_of(d) for d in range(x.ndim)]
    cur = [x.spec.axes_of(d) for d in range(x.ndim)]
    if isinstance(x, PartialSum) and x.pending:
        local, pending = x._parts, list(x.partial_axes)
        for d in range(x.ndim):
            extra = want[d][len(cur[d]):]
            if want[d][:len(cur[d])] == cur[d] and extra and all(a in pending for a in extra):
                local = _reduce_scatter(local, mesh, extra, d)
                cur[d] = want[d]
                pending = [a for a in pending if a not in extra]
        if pending:
            local = _all_reduce(local, mesh, tuple(pending), "sum")
    else:
        local = x.local()
    for d in range(x.ndim):                   # gathers first ...
        if cur[d] != want[d] and want[d][:len(cur[d])] != cur[d]:
            keep = len(want[d]) if cur[d][:len(want[d])] == want[d] else 0
            local = _all_gather(local, mesh, cur[d][keep:], d)
            cur[d] = cur[d][:keep]
    for d in range(x.ndim):                   # ... then slices
        if cur[d] != want[d]:
            local = _slice(local, mesh, want[d][len(cur[d]):], d)
    return ShardedArray(local, sharding, shape)


def matmul(a, b, *, out_sharding=None):
    """``a @ b`` on ShardedArrays; ``out_sharding`` (a NamedSharding or PartitionSpec) constrains the
    result -- a split contraction is then reduce-scattered onto it rather than all-reduced."""
    y = OPS["matmul"].fn(a, b)
    return y if out_sharding is None else with_sharding_constraint(y, out_sharding)


# ---- explain -------------------------------------------------------------------------------------
class Explanation:
    """What one run of a function did in explicit mode: ``entries`` (dicts, in order), ``text``,
    ``collectives`` (the communication entries), ``result``."""

    def __init__(self, entries, result):
        self.entries, self.result = entries, result

    @property
    def collectives(self) -> list:
        return [e for e in self.entries if e["what"] == "collective"]

    @property
    def text(self) -> str:
        lines = []
        for e in self.entries:
            if e["what"] == "call":
                lines.append(f"{e['op']}({', '.join(e['ins'])})")
            elif e["what"] == "op":
                lines.append(f"  -> {e['out']}")
            elif e["what"] == "slice":
                lines.append(f"  slice dim {e['dim']} of {list(e['local'])} along {e['axes']} (local, no bytes)")
            else:
                lines.append(f"  {e['kind']} over {e['axes']}: {str(e['dtype']).replace('torch.', '')}"
                             f"{list(e['local'])} -> {list(e['out'])}, {e['bytes']} bytes")
        total = sum(e["bytes"] for e in self.collectives)
        lines.append(f"{len(self.collectives)} collectives, {total} bytes")
        return "\n".join(lines)

    __str__ = text.fget

    def __repr__(self):
        return self.text


@contextlib.contextmanager
def recording():
    """``with recording() as entries:`` collects what explicit-mode ops do (explain's record)."""
    log: list = []
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


def explain(f, *args, **kwargs) -> Explanation:
    """Run ``f(*args, **kwargs)`` once; the ops it ran on ShardedArrays with their local shapes and
    propagated specs, and every inserted collective with its axes and bytes (a pending PartialSum
    result stays pending: its reduction is not part of the run)."""
    with recording() as log:
        out = f(*args, **kwargs)
    return Explanation(log, out)


# ---- ShardedArray's operators and methods ------------------------------------------------------------
def _install():
    def method(op):
        return lambda self, *a, **k: op.fn(self, *a, **k)

    def rmethod(op):
        return lambda self, other: op.fn(other, self)

    for op in list(OPS.values()):
        for d in op.dunders:
            if d not in ShardedArray.__dict__ and "inplace" not in op.tags:
                setattr(ShardedArray, d, method(op))
        for d in op.rdunders:
            if d not in ShardedArray.__dict__:
                setattr(ShardedArray, d, rmethod(op))
    by_method = {op.method: op for op in OPS.values() if op.method}

    def __getattr__(self, name):
        op = by_method.get(name)
        if op is None:
            raise AttributeError(f"'ShardedArray' object has no attribute {name!r}")
        return method(op).__get__(self)

    ShardedArray.__getattr__ = __getattr__
    ShardedArray.__tp_dispatch__ = staticmethod(dispatch)
    ShardedArray.__tp_compile__ = staticmethod(compile_hook)
    ShardedArray.dim = lambda self: len(self.shape)
    ShardedArray.size = lambda self, d=None: self.shape if d is None else self.shape[d]
    ShardedArray.T = property(lambda self: OPS["permute"].fn(self, list(range(self.ndim))[::-1]))


_install()
