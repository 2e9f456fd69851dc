"""Mixture of experts: route, group by expert, ragged expert products, combine by token (seed 001 §6).

The pipeline, each step a function so that expert parallelism (tensorplay/distributed/moe.py) puts
an all-to-all between :func:`dispatch` and the experts and another between the experts and
:func:`combine`:

1. :func:`route` -- the router ``z = h R`` (``R: [D, E]``), ``p = softmax(z)``, top-k of ``p``.
   The gate weights are the selected ``p_e`` themselves (Switch Transformers' top-1 rule: the
   prediction loss reaches the router through ``p_e``); ``renormalize=True`` divides the k weights
   by their sum (they then add up to 1 per token; for k = 1 every gate becomes exactly 1 and the
   router learns only through the auxiliary loss).
2. :func:`dispatch` -- the ``S·k`` (token, expert) records, in token order ``r = t·k + j``, are
   stably sorted by expert: ``rows`` are the input rows grouped contiguously by expert,
   ``group_sizes[e]`` the rows of expert ``e``, ``token_ids`` the saved original position of every
   grouped row, ``weights`` its gate weight.
3. Experts -- :func:`expert_mlp` runs every expert on its group with ``tp.ragged_dot``
   (no padding to a fixed ``[E, C, D]`` batch).
4. :func:`combine` -- ``out = zeros.index_add(0, token_ids, weights[:, None] * expert_out)``
   (JAX's ``out.at[token_ids].add(...)``): records merge by *token*, never by expert.

Capacity (``capacity=C`` rows per expert; :func:`capacity_rows` turns a capacity factor into C).
Overflow rule: for each expert the first C records **in token order** are kept; the later ones
are *dropped*: they are placed after the last group (``sum(group_sizes) < S·k``), where
``ragged_dot`` yields zero rows, and their weight is zero, so they contribute nothing to the output
and receive no gradient.  A token whose every record is dropped gets a zero MoE output (in a
residual block it keeps its residual).  ``Dispatch.dropped`` counts the dropped records.  Records
whose expert id is outside ``[0, E)`` are dropped the same way (no host-side check).

Auxiliary load-balancing loss (Switch Transformers): ``E · Σ_e f_e · P_e`` with ``f_e`` the fraction
of the ``S·k`` records routed to expert ``e`` (before capacity; for k = 1 the fraction of tokens)
and ``P_e`` the mean router probability of expert ``e``.  It equals 1 for a perfectly uniform
router; ``f`` carries no gradient, ``P`` does.  Scale it by a coefficient (Switch uses 0.01).

:class:`MoE` is the layer.  Every shape is static (capacity is a Python int), there is no host read
and no data-dependent shape, so ``tp.compile`` captures one graph, forward and backward:
the softmax, counts, positions, gathers and the pointwise parts compile natively; matmuls, top-k
(and its backward scatter), the stable argsorts, cumulative sums, ``index_add`` and ``ragged_dot``
are extern (ATen) kernels inside the compiled graph (docs/moe.md).  Under ``dynamic=True`` the
layer without capacity is one graph for every token count; a capacity is computed from the token
count, which specialises the graph on it.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import ops as _ops
from .._tensor import Tensor
from . import functional as F
from . import init
from .modules.module import Module
from .parameter import Parameter

__all__ = ["Routing", "Dispatch", "MoEOutput", "route", "dispatch", "combine", "capacity_rows",
           "load_balancing_loss", "expert_mlp", "MoE"]


class Routing(NamedTuple):
    logits: Tensor       #: [S, E] router scores z = h R
    probs: Tensor        #: [S, E] p = softmax(z)
    expert_ids: Tensor   #: [S, k] int64, each token's experts by descending probability
    gates: Tensor        #: [S, k] gate weights (p_e, or p_e / Σ_topk p when renormalised)


class Dispatch(NamedTuple):
    rows: Tensor         #: [S·k, D] input rows grouped by expert; dropped records last
    group_sizes: Tensor  #: [E] int64 kept rows of each expert (sum = S·k - dropped)
    token_ids: Tensor    #: [S·k] int64 original token of every grouped row
    expert_ids: Tensor   #: [S·k] int64 expert of every grouped row (the routed one if dropped)
    weights: Tensor      #: [S·k] gate weight of every grouped row, 0 for dropped ones
    kept: Tensor         #: [S·k] bool, False for the dropped rows
    counts: Tensor       #: [E] int64 records routed to each expert, before capacity
    dropped: Tensor      #: () int64 number of dropped records


class MoEOutput(NamedTuple):
    output: Tensor       #: the layer's output, the input's shape
    aux_loss: Tensor     #: () the load-balancing loss E · Σ f_e P_e (unscaled)
    dropped: Tensor      #: () int64 records dropped by capacity


def route(h, router_weight, k: int = 1, renormalize: bool = False) -> Routing:
    """Top-k routing of the rows of ``h: [S, D]`` with ``router_weight: [D, E]``."""
    if h.dim() != 2 or router_weight.dim() != 2 or h.shape[1] != router_weight.shape[0]:
        raise ValueError(f"moe.route: h must be [S, D] and router_weight [D, E], got {list(h.shape)} "
                         f"and {list(router_weight.shape)}")
    num_experts = router_weight.shape[1]
    if not 1 <= k <= num_experts:
        raise ValueError(f"moe.route: k must be in [1, {num_experts}] (the number of experts), got {k}")
    logits = h @ router_weight
    probs = F.softmax(logits, dim=-1)
    gates, expert_ids = _ops.topk(probs, k, dim=-1)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    return Routing(logits, probs, expert_ids, gates)


def capacity_rows(num_tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """``C = ceil(capacity_factor · S · k / E)`` rows per expert (at least 1); factor 1 is the mean load."""
    if not capacity_factor > 0:
        raise ValueError(f"moe.capacity_rows: capacity_factor must be positive, got {capacity_factor}")
    return max(1, math.ceil(capacity_factor * num_tokens * k / num_experts))


def _check_ids(expert_ids, gates, num_tokens):
    if expert_ids.dim() != 2 or expert_ids.shape[0] != num_tokens or tuple(gates.shape) != tuple(expert_ids.shape):
        raise ValueError(f"moe.dispatch: expert_ids and gates must both be [S={num_tokens}, k], got "
                         f"{list(expert_ids.shape)} and {list(gates.shape)}")
    if expert_ids.dtype != torch.int64:
        raise TypeError(f"moe.dispatch: expert_ids must be int64, got {str(expert_ids.dtype).replace('torch.', '')}")


def dispatch(h, expert_ids, gates, num_experts: int, capacity: int | None = None) -> Dispatch:
    """Group the records of ``h: [S, D]`` routed to ``expert_ids: [S, k]`` with ``gates: [S, k]`` by
    expert (stable: token order within an expert); ``capacity`` keeps at most that many rows per
    expert (the module docstring's overflow rule).  A record whose expert id lies outside
    ``[0, num_experts)`` is dropped like an overflowing one (checking it would need a host read,
    which a compiled graph avoids); ``dropped`` counts it and ``counts`` leaves it out."""
    if h.dim() != 2:
        raise ValueError(f"moe.dispatch: h must be [S, D], got {list(h.shape)}")
    s = h.shape[0]
    _check_ids(expert_ids, gates, s)
    if capacity is not None and capacity < 0:
        raise ValueError(f"moe.dispatch: capacity must be >= 0 rows per expert, got {capacity}")
    k = expert_ids.shape[1]
    n = s * k
    dev = h.device
    e_flat = expert_ids.reshape(-1)                                   # record r = t·k + j
    valid = (e_flat >= 0) & (e_flat < num_experts)
    key = _ops.where(valid, e_flat, num_experts)                      # key E: after every group
    counts = (key.unsqueeze(1) == _ops.arange(num_experts, device=dev)).sum(0)
    order = _ops.argsort(key, stable=True)                            # grouped by expert, token order inside
    key = key.index_select(0, order)
    group_sizes = counts
    if capacity is not None:
        starts = _ops.cumsum(counts, 0) - counts                       # first row of every group
        pos = _ops.arange(n, device=dev) - starts.index_select(0, key.clamp(max=num_experts - 1))
        key = _ops.where(pos < capacity, key, num_experts)             # overflow: after every group too
        second = _ops.argsort(key, stable=True)
        order = order.index_select(0, second)
        key = key.index_select(0, second)
        group_sizes = _ops.clamp(counts, max=capacity)
    kept = key < num_experts
    token_ids = _ops.floor_divide(order, k)
    weights = gates.reshape(-1).index_select(0, order) * kept
    rows = h.index_select(0, token_ids)
    dropped = n - group_sizes.sum()
    return Dispatch(rows, group_sizes, token_ids, e_flat.index_select(0, order), weights, kept, counts, dropped)


def combine(expert_out, token_ids, weights, num_tokens: int):
    """``out[t] = Σ_{rows r of token t} weights[r] · expert_out[r]``: ``out.at[token_ids].add(weights[:,
    None] * expert_out)``.  The rows may come in any order (each carries its token id)."""
    if expert_out.dim() != 2 or token_ids.dim() != 1 or tuple(weights.shape) != tuple(token_ids.shape) \
            or expert_out.shape[0] != token_ids.shape[0]:
        raise ValueError(f"moe.combine: expert_out must be [R, D] with token_ids and weights [R], got "
                         f"{list(expert_out.shape)}, {list(token_ids.shape)} and {list(weights.shape)}")
    out = expert_out.new_zeros((num_tokens, expert_out.shape[1]))
    return out.index_add(0, token_ids, weights.unsqueeze(1).to(expert_out.dtype) * expert_out)


def load_balancing_loss(probs, counts):
    """Switch Transformers' auxiliary loss ``E · Σ_e f_e · P_e``: ``f = counts / Σ counts`` (no gradient),
    ``P = probs.mean(0)`` for ``probs: [S, E]`` and ``counts: [E]`` records per expert."""
    num_experts = probs.shape[-1]
    f = (counts.to(probs.dtype) / counts.sum().clamp(min=1).to(probs.dtype)).detach()
    return (f * probs.mean(0)).sum() * num_experts


def expert_mlp(rows, group_sizes, w1, w2=None, activation=F.gelu):
    """Every expert on its group of rows: ``ragged_dot(rows, w1, gs)`` with ``w1: [E, D, F]``, and
    with ``w2: [E, F, D_out]`` the two-projection MLP ``ragged_dot(activation(·), w2, gs)``."""
    y = _ops.ragged_dot(rows, w1, group_sizes)
    if w2 is None:
        return y
    return _ops.ragged_dot(activation(y), w2, group_sizes)


class MoE(Module):
    """A mixture-of-experts layer ``[..., D] -> MoEOutput([..., D], aux_loss, dropped)``.

    ``d_ff=None``: single-matrix experts ``weight: [E, D, D]`` (the seed's exercise); otherwise
    two-projection MLP experts without biases, ``w1: [E, D, d_ff]``, ``w2: [E, d_ff, D]`` with
    ``activation`` between (default gelu; the output rows of dropped records are zero whatever
    the activation, since the second ``ragged_dot`` zeroes them).  ``router: [D, E]``.  ``capacity_factor=None`` keeps every record; a factor gives
    ``C = capacity_rows(S, E, k, factor)`` rows per expert.  Initialisation: every weight uniform
    on ``±1/√fan_in`` (``fan_in`` = D, or d_ff for ``w2``), like ``nn.Linear``.
    """

    def __init__(self, d_model: int, num_experts: int, k: int = 1, d_ff: int | None = None, *,
                 renormalize: bool = False, capacity_factor: float | None = None, activation=F.gelu,
                 device=None, dtype=None):
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"MoE: k must be in [1, num_experts={num_experts}], got {k}")
        self.d_model, self.num_experts, self.k, self.d_ff = d_model, num_experts, k, d_ff
        self.renormalize, self.capacity_factor, self.activation = renormalize, capacity_factor, activation

        def param(*shape):
            return Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.router = param(d_model, num_experts)
        if d_ff is None:
            self.weight = param(num_experts, d_model, d_model)
        else:
            self.w1 = param(num_experts, d_model, d_ff)
            self.w2 = param(num_experts, d_ff, d_model)
        self.reset_parameters()

    def expert_weights(self):
        return (self.weight, None) if self.d_ff is None else (self.w1, self.w2)

    def reset_parameters(self) -> None:
        for p in (self.router, *(w for w in self.expert_weights() if w is not None)):
            bound = 1 / math.sqrt(p.shape[-2])
            init.uniform_(p, -bound, bound)

    def forward(self, h) -> MoEOutput:
        if h.shape[-1] != self.d_model:
            raise ValueError(f"MoE: the input's last dim must be d_model={self.d_model}, got {list(h.shape)}")
        x = h.reshape(-1, self.d_model)
        s = x.shape[0]
        r = route(x, self.router, self.k, self.renormalize)
        cap = None if self.capacity_factor is None else capacity_rows(s, self.num_experts, self.k,
                                                                     self.capacity_factor)
        d = dispatch(x, r.expert_ids, r.gates, self.num_experts, cap)
        w1, w2 = self.expert_weights()
        y = expert_mlp(d.rows, d.group_sizes, w1, w2, self.activation)
        out = combine(y, d.token_ids, d.weights, s)
        return MoEOutput(out.reshape(h.shape), load_balancing_loss(r.probs, d.counts), d.dropped)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_experts={self.num_experts}, k={self.k}, d_ff={self.d_ff}, "
                f"renormalize={self.renormalize}, capacity_factor={self.capacity_factor}")
