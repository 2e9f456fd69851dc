"""Sharded arrays: a global array of which each process holds one block (seed 001 §4).

A :class:`ShardedArray` knows its *global* shape, its :class:`NamedSharding` and this process's
*local* block (a ``tp.Tensor``, :meth:`ShardedArray.local`).  Its printed form gives all three:
``ShardedArray(global=[8, 2048], spec=P('X', 'Y'), local=[2, 1024], mesh={'X': 4, 'Y': 2}, float32)``.

Rules and guarantees:

* :func:`device_put` ``(x, sharding)`` takes a global value that every process holds alike (an SPMD
  program computes it the same everywhere; this is not checked) and keeps this process's block of
  it, moved to the process's device; :meth:`ShardedArray.gather` assembles the global value again
  on every process from the blocks of its replica group (the processes that differ along the
  axes the spec names).  ``device_put`` then ``gather`` is the identity, for every spec;
* a block shape that does not divide raises ``ValueError`` naming the dimension, its size and the
  axes (sharding.py); a mesh whose size is not the world size raises (mesh.py);
* both are differentiable in the *global* convention of ordinary single-program autograd: every
  process holds the full cotangent of each value it holds (a plain tensor is a replicated global
  value; a block's cotangent is that block of the global cotangent).  So the backward of
  ``gather`` is the block of the cotangent, the backward of ``device_put`` the gathered
  cotangent, and ``x.grad`` of a ``device_put`` input is the global gradient on every process.
  Call ``backward`` on every process (the backward passes communicate);
* the ops of the table apply to a ShardedArray (operators, methods, ``tp.`` functions): explicit.py
  gives each a propagation rule, computing on the local blocks and communicating where needed.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._tensor import Tensor, _wrap
from ..autograd.function import Function
from ..ops.registry import OPS
from .collectives import mesh_id
from .runtime import local_device
from .sharding import NamedSharding, PartitionSpec

__all__ = ["ShardedArray", "Shard", "device_put"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """One block of a sharded array: the device (process rank) holding it, the slices of the global
    array it covers, its replica number (its linear index along the replicated axes) and its data
    (a ``tp.Tensor`` for this process's block, None for another process's)."""
    device: int
    index: tuple
    replica_id: int
    data: Tensor | None


def _assemble(local: Tensor, sharding: NamedSharding, global_shape) -> Tensor:
    """The global array from every member's block along the named axes: an all_gather over them
    (first axis of each dimension major, dimensions in order), then one reshape and permute that
    places block ``(b_0, b_1, ...)`` at its slices."""
    spec, mesh = sharding.spec, sharding.mesh
    axes = spec.mentioned
    if not axes:
        return local.clone()
    k = local.dim()
    stacked = OPS["dist_all_gather"].fn(local, mesh_id(mesh), list(axes), 0, False)
    counts = [mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1 for d in range(k)]
    blocks = stacked.reshape(*counts, *local.shape)
    order = [i for d in range(k) for i in (d, k + d)]
    return blocks.permute(*order).reshape(*global_shape)


def _block(x: Tensor, sharding: NamedSharding, global_shape, rank: int) -> Tensor:
    idx = sharding.index(rank, global_shape)
    return x[idx] if idx else x


def _refuse_capture(x, who):
    """A capture (tp.compile) keeps the forward of an autograd Function, not its backward."""
    if getattr(x, "_tracer", None) is not None and x.requires_grad:
        raise NotImplementedError(f"{who} inside a compiled function, on a value that requires grad: its gradient "
                                  f"would be lost; call it outside the compiled function")


class _Place(Function):
    """device_put: forward keeps this process's block; backward gathers the cotangent's blocks."""

    @staticmethod
    def forward(ctx, x, sharding, device):
        _refuse_capture(x, "device_put")
        ctx.sharding, ctx.shape, ctx.device = sharding, tuple(x.shape), x.device
        block = _block(x, sharding, ctx.shape, sharding.mesh.process_index())
        return _wrap(block._data.to(device).contiguous().clone())

    @staticmethod
    def backward(ctx, g):
        return _assemble(g, ctx.sharding, ctx.shape).to(ctx.device), None, None


class _Gather(Function):
    """gather: forward assembles the global array; backward keeps the cotangent's block."""

    @staticmethod
    def forward(ctx, local, sharding, global_shape):
        _refuse_capture(local, "ShardedArray.gather")
        ctx.sharding, ctx.shape = sharding, global_shape
        return _assemble(local, sharding, global_shape)

    @staticmethod
    def backward(ctx, g):
        return _block(g, ctx.sharding, ctx.shape, ctx.sharding.mesh.process_index()).contiguous(), None, None


class ShardedArray:
    """A global array held as one block per process (module doc)."""

    __slots__ = ("_local", "sharding", "shape")

    def __init__(self, local: Tensor, sharding: NamedSharding, shape):
        shape = torch.Size(int(s) for s in shape)
        want = sharding.shard_shape(shape)
        if tuple(local.shape) != want:
            raise ValueError(f"ShardedArray: a local block of shape {list(local.shape)} for global shape "
                             f"{list(shape)} with {sharding.spec} on mesh {sharding.mesh.shape} (expected {list(want)})")
        self._local, self.sharding, self.shape = local, sharding, shape

    # ---- what it is -------------------------------------------------------------------------------
    @property
    def spec(self) -> PartitionSpec:
        return self.sharding.spec

    @property
    def mesh(self):
        return self.sharding.mesh

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return self._local.dtype

    @property
    def local_shape(self) -> torch.Size:
        return self._local.shape

    def local(self) -> Tensor:
        """This process's block (a ``tp.Tensor``; differentiable)."""
        return self._local

    @property
    def addressable_shards(self) -> list:
        """The blocks this process holds: one, with its data."""
        me = self.mesh.process_index()
        return [self._shard(me, self._local)]

    @property
    def global_shards(self) -> list:
        """Every device's block (data only for this process's)."""
        me = self.mesh.process_index()
        return [self._shard(r, self._local if r == me else None) for r in range(self.mesh.size)]

    def _shard(self, r, data):
        rep = self.sharding.replicated_axes
        return Shard(r, self.sharding.index(r, self.shape), self.mesh.linear_index(r, rep) if rep else 0, data)

    def gather(self) -> Tensor:
        """The global array, on every process (differentiable)."""
        return _Gather.apply(self._local, self.sharding, tuple(self.shape))

    def numpy(self):
        return np.asarray(self.gather().detach().numpy())

    # ---- autograd --------------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._local.requires_grad

    def requires_grad_(self, flag: bool = True) -> "ShardedArray":
        self._local.requires_grad_(flag)
        return self

    @property
    def grad(self):
        """The gradient as a sharded array of the same sharding (None before a backward pass)."""
        g = self._local.grad
        return None if g is None else ShardedArray(g, self.sharding, self.shape)

    def detach(self) -> "ShardedArray":
        return ShardedArray(self._local.detach(), self.sharding, self.shape)

    def backward(self, gradient=None, **kw) -> None:
        """Backward from this array: ``gradient`` is its global cotangent (a tensor of the global shape
        or a ShardedArray of the same sharding; None for a one-element array).  Every process calls it."""
        if gradient is None:
            if self.shape.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for one-element arrays; this one is "
                                   f"{list(self.shape)}: pass gradient=")
            return self._local.backward(**kw)
        if isinstance(gradient, ShardedArray):
            if gradient.sharding != self.sharding or gradient.shape != self.shape:
                raise ValueError(f"backward: gradient {gradient!r} does not match {self!r}")
            g = gradient.local()
        else:
            g = gradient if isinstance(gradient, Tensor) else Tensor(gradient)
            if tuple(g.shape) != tuple(self.shape):
                raise ValueError(f"backward: gradient of shape {list(g.shape)} for a global shape {list(self.shape)}")
            g = _block(g, self.sharding, self.shape, self.mesh.process_index())
        return self._local.backward(g.to(self._local.device), **kw)

    def __repr__(self):
        extra = ""
        if self._local.grad_fn is not None:
            extra = f", grad_fn=<{self._local.grad_fn.name()}>"
        elif self._local.requires_grad:
            extra = ", requires_grad=True"
        return (f"ShardedArray(global={list(self.shape)}, spec={self.spec}, local={list(self._local.shape)}, "
                f"mesh={self.mesh.shape}, {str(self.dtype).replace('torch.', '')}{extra})")


def _as_tensor(x) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, torch.Tensor):
        return _wrap(x.detach())
    return Tensor(x)


def device_put(x, sharding: NamedSharding) -> ShardedArray:
    """Place the global value ``x`` on the mesh by ``sharding``: each process keeps its block.  A
    ShardedArray of another sharding is gathered and placed again (resharding)."""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"device_put: expected a NamedSharding, got {type(sharding).__name__}")
    if isinstance(x, ShardedArray):
        if x.sharding == sharding:
            return x
        x = x.gather()
    x = _as_tensor(x)
    shape = tuple(x.shape)
    sharding.shard_shape(shape)             # the divisibility errors, before anything runs
    sharding.mesh.process_index()           # the binding error
    return ShardedArray(_Place.apply(x, sharding, local_device()), sharding, shape)
