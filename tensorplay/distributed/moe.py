"""Expert parallelism: a mixture of experts whose experts are sharded over a mesh axis (seed 001 §6).

Used inside :func:`~tensorplay.distributed.shard_map`: with ``n`` members along ``axis_name`` and
``E`` experts, member ``m`` holds experts ``m·E/n ... (m+1)·E/n - 1`` (``E/n`` each; ``E`` must be a
multiple of ``n``), its own tokens, and a replicated router.  One layer is

1. :func:`~tensorplay.nn.moe.route` on the member's own tokens;
2. :func:`~tensorplay.nn.moe.dispatch`: the records sorted by expert -- which, since the experts
   are numbered member-major, is sorted by destination member, then by expert -- with every
   record's token id and gate weight saved on the sending side;
3. :func:`dispatch_to_experts`: one small :func:`all_to_all` of the ``[n, E/n]`` per-expert record
   counts (every member learns how many rows of each of its experts each member will send), then
   :func:`all_to_all_v` of the rows with split sizes ``send[j] = Σ`` counts of member ``j``'s
   experts; the received rows (in source-member order, each source's rows grouped by expert) are
   regrouped by local expert with a stable sort (source order inside an expert);
4. the local experts on their groups with ``tp.ragged_dot`` (:func:`~tensorplay.nn.moe.expert_mlp`);
5. :func:`return_to_tokens`: the inverse regrouping, the reverse exchange (``all_to_all_v`` with
   the two size lists swapped), so every output row lands in the sender's dispatch order, and
   :func:`~tensorplay.nn.moe.combine` by token with the gate weights (``index_add``).

Guarantees.  Each token's output equals the single-process :class:`~tensorplay.nn.MoE`'s with the
same weights (same routing, the same expert product per record, the same combine; only the order
of additions across a token's k records may differ), and so do the gradients of the input, the
router and the expert weights: every step is differentiable and the exchange's derivative is the
reverse exchange (collectives.py).  Uneven loads are the normal case: the split sizes are whatever
the routing produced, including zero.  The counts are read on the host (the shapes of what arrives
depend on them; under ``tp.compile`` those reads would be data gates, specialising the graph to
one routing -- a compiled layer is not tested).

Capacity follows tensorplay/nn/moe.py's rule: each expert keeps its first ``C`` records in token
order.  The global token order is member-major (the tokens are sharded in blocks), and the rows of
one expert arrive in source-member order, each source's in its token order, so after the stable
regrouping they are already in global token order: the receiver keeps the first ``C`` of each
local expert and places the rest after the last group, where ``ragged_dot`` gives zero rows.
Those return zeros (their weight times zero: no contribution, no gradient), exactly like the
single-process layer's dropped records; ``dropped`` is the psum of the members' dropped rows.

Auxiliary loss: computed **globally**, ``E · Σ_e f_e · P_e`` with ``f`` the fraction of *all*
members' records routed to ``e`` (the counts psum'd over the axis) and ``P`` the mean router
probability over all tokens (pmean of the members' means: members hold equally many tokens, as a
sharded batch does).  Every member gets the same value, equal to the single-process loss on the
whole batch, so it can leave the body with ``out_specs=P()``.
"""
from __future__ import annotations

from typing import NamedTuple

from .. import ops as _ops
from .._tensor import Tensor
from ..nn import functional as F
from ..nn import moe as _moe
from .collectives import all_to_all, all_to_all_v, axis_size, pmean, psum

__all__ = ["ExpertDispatch", "dispatch_to_experts", "return_to_tokens", "expert_parallel_moe"]


class ExpertDispatch(NamedTuple):
    rows: Tensor             #: [R, D] rows this member received, grouped by its local expert
    group_sizes: Tensor      #: [E/n] int64 rows of each local expert
    received: Tensor         #: [R, D] the same rows in arrival order (source member, then expert)
    order: Tensor            #: [R] int64 rows = received[order]
    send_sizes: list         #: rows sent to each member (its dispatch order)
    recv_sizes: list         #: rows received from each member
    local: _moe.Dispatch     #: the sending side's dispatch: token ids and gate weights of the records
    axis_name: object        #: the mesh axis of the exchange


def _experts_per_member(num_experts: int, n: int, who: str) -> int:
    if num_experts % n:
        raise ValueError(f"{who}: {num_experts} experts cannot be sharded over the {n} members of the axis "
                         f"(the number of experts must be a multiple of the axis size)")
    return num_experts // n


def dispatch_to_experts(h, expert_ids, gates, num_experts: int, axis_name, capacity: int | None = None
                        ) -> ExpertDispatch:
    """Send every record of ``h: [S, D]`` (routed to ``expert_ids: [S, k]`` with ``gates``) to the
    member that owns its expert, and group what this member receives by its local expert.

    ``capacity=C`` keeps each expert's first ``C`` received rows -- which are its first ``C``
    records in global token order (module doc) -- and moves the others after the last group,
    where ``ragged_dot`` gives zero rows: they return zero outputs and get no gradient."""
    n = axis_size(axis_name)
    per = _experts_per_member(num_experts, n, "dispatch_to_experts")
    d = _moe.dispatch(h, expert_ids, gates, num_experts)
    counts = d.group_sizes.reshape(n, per)                      # [destination, its expert]
    got = all_to_all(counts, axis_name, 0, 0, tiled=True)      # [source, my expert]
    send = counts.sum(1).tolist()
    received, recv = all_to_all_v(d.rows, axis_name, send, recv_sizes=got.sum(1).tolist())
    # the local expert of every received row: its piece's index (source-major) modulo E/n
    ends = _ops.cumsum(got.reshape(-1), 0)
    piece = (_ops.arange(sum(recv), device=h.device).unsqueeze(1) >= ends.unsqueeze(0)).sum(1)
    key = piece % per
    order = _ops.argsort(key, stable=True)
    group_sizes = got.sum(0)
    if capacity is not None:
        key = key.index_select(0, order)
        starts = _ops.cumsum(group_sizes, 0) - group_sizes
        pos = _ops.arange(sum(recv), device=h.device) - starts.index_select(0, key)
        order = order.index_select(0, _ops.argsort(_ops.where(pos < capacity, key, per), stable=True))
        group_sizes = _ops.clamp(group_sizes, max=capacity)
    rows = received.index_select(0, order)
    return ExpertDispatch(rows, group_sizes, received, order, send, recv, d, axis_name)


def return_to_tokens(expert_out, ed: ExpertDispatch, num_tokens: int):
    """The local experts' outputs ``[R, D_out]`` (rows as in ``ed.rows``) back to the members that
    sent them, and combined by token: ``[num_tokens, D_out]``."""
    arrival = _ops.argsort(ed.order)                             # the inverse permutation
    back = expert_out.index_select(0, arrival)
    returned, _ = all_to_all_v(back, ed.axis_name, ed.recv_sizes, recv_sizes=ed.send_sizes)
    return _moe.combine(returned, ed.local.token_ids, ed.local.weights, num_tokens)


def expert_parallel_moe(h, router_weight, w1, w2=None, axis_name=None, k: int = 1, *, renormalize: bool = False,
                        activation=F.gelu, capacity=None) -> _moe.MoEOutput:
    """An expert-parallel MoE layer inside ``shard_map`` (module doc): ``h: [S, D]`` this member's
    tokens, ``router_weight: [D, E]`` replicated, ``w1: [E/n, D, F]`` (and ``w2: [E/n, F, D]``) this
    member's experts -- the global ``[E, ...]`` weights sharded with ``P(axis_name)``.  ``capacity``
    is ``C`` rows per expert for the whole batch (``nn.moe.capacity_rows`` of the global token
    count).  Returns ``MoEOutput(output [S, D], aux_loss, dropped)``, the last two global (the
    same on every member)."""
    if axis_name is None:
        raise TypeError("expert_parallel_moe: axis_name (the mesh axis the experts are sharded over) is required")
    if capacity is not None and capacity < 0:
        raise ValueError(f"expert_parallel_moe: capacity must be >= 0 rows per expert, got {capacity}")
    num_experts = router_weight.shape[1]
    n = axis_size(axis_name)
    per = _experts_per_member(num_experts, n, "expert_parallel_moe")
    if w1.shape[0] != per or (w2 is not None and w2.shape[0] != per):
        raise ValueError(f"expert_parallel_moe: each of the {n} members holds {per} of the {num_experts} experts, "
                         f"but its expert weights have {w1.shape[0]}" + ("" if w2 is None else f" and {w2.shape[0]}")
                         + " (shard them with P(axis_name) on dim 0)")
    r = _moe.route(h, router_weight, k, renormalize)
    ed = dispatch_to_experts(h, r.expert_ids, r.gates, num_experts, axis_name, capacity)
    y = _moe.expert_mlp(ed.rows, ed.group_sizes, w1, w2, activation)
    out = return_to_tokens(y, ed, h.shape[0])
    aux = _moe.load_balancing_loss(pmean(r.probs.mean(0), axis_name).unsqueeze(0), psum(ed.local.counts, axis_name))
    dropped = psum(ed.rows.shape[0] - ed.group_sizes.sum(), axis_name)
    return _moe.MoEOutput(out, aux, dropped)
