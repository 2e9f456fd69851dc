"""Manual mode: ``shard_map(f, mesh, in_specs, out_specs)`` runs ``f`` on local blocks (seed 001 §4).

``in_specs`` says which block of each argument the body sees, ``out_specs`` how to read the body's
local results as global arrays; between them the body computes locally and communicates with the
collectives of collectives.py.  ``shard_map(mesh=..., in_specs=..., out_specs=...)`` without ``f``
is a decorator.

Rules and guarantees:

* ``in_specs`` is a tree prefix of the argument tuple: one ``P`` applies to every argument (and to
  every tensor of a nested list, tuple or dict); a tuple or list of specs must have one entry per
  argument (else ``ValueError`` saying both counts).  ``out_specs`` likewise for the result;
* a ``tp.Tensor`` (or torch tensor, array) argument is a global value: the body sees its block
  (:func:`device_put`); a :class:`ShardedArray` of another spec is resharded first; a Python scalar
  or other non-array passes unchanged.  Keyword arguments are refused;
* ``out_specs`` *reinterprets*, it computes nothing: a local result of shape ``l`` with spec
  ``P(a, ...)`` is the block of a global array whose dimension ``d`` has ``l[d] * size(axes of d)``
  entries.  ``P()`` *claims* the result is the same on every process; it does not reduce -- each
  process keeps its own local value (a sum or mean needs psum / pmean inside the body);
* gradients are those of the global function, for every spec: the body's autograd works in
  *parts* (collectives.py), so the body's view of an argument replicated along some axes
  transposes to a psum over them (the global cotangent of a replicated input), and a result's
  global cotangent is divided by the number of processes its spec replicates it over (their
  parts sum to it);
* composition with ``tp.compile``: compile the *local* function -- ``shard_map(tp.compile(f), ...)``
  or ``@shard_map(...)`` over ``@tp.compile``.  Its collectives are ops of the graph that Stax runs
  as fallback kernels between the fused ones; a compiled body is specialised to the mesh of its
  first call (another mesh raises).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from .._tensor import Tensor
from ..autograd.function import Function
from .array import ShardedArray, device_put
from ..ops.registry import OPS
from .collectives import bind, mesh_id
from .mesh import Mesh
from .sharding import NamedSharding, PartitionSpec

__all__ = ["shard_map"]


class _Enter(Function):
    """An argument's block entering the body: identity; backward: the parts of its cotangent,
    summed over the axes its spec replicates it along."""

    @staticmethod
    def forward(ctx, local, mid, axes):
        ctx.mid, ctx.axes = mid, axes
        return local

    @staticmethod
    def backward(ctx, g):
        return (OPS["dist_psum"].fn(g, ctx.mid, ctx.axes) if ctx.axes else g), None, None


class _Exit(Function):
    """A result leaving the body: identity; backward: the global cotangent split into equal parts
    over the processes that replicate it."""

    @staticmethod
    def forward(ctx, local, replicas):
        ctx.replicas = replicas
        return local

    @staticmethod
    def backward(ctx, g):
        return (g / ctx.replicas if ctx.replicas != 1 else g), None


def _is_array(x) -> bool:
    return isinstance(x, (Tensor, ShardedArray, torch.Tensor, np.ndarray))


def _prefix_map(specs, tree, fn, what, path):
    """Apply ``fn(leaf, spec, path)`` to the array leaves of ``tree``; ``specs`` is a tree prefix."""
    if isinstance(specs, PartitionSpec):
        if isinstance(tree, (tuple, list)) and not _is_array(tree):
            return type(tree)(_prefix_map(specs, v, fn, what, f"{path}[{i}]") for i, v in enumerate(tree))
        if isinstance(tree, dict):
            return {k: _prefix_map(specs, v, fn, what, f"{path}[{k!r}]") for k, v in tree.items()}
        return fn(tree, specs, path)
    if isinstance(specs, (tuple, list)):
        if not isinstance(tree, (tuple, list)):
            raise ValueError(f"shard_map: {what} has {len(specs)} entries, but {path} is a {type(tree).__name__}")
        if len(tree) != len(specs):
            raise ValueError(f"shard_map: {what} has {len(specs)} entries, but {path} has {len(tree)}")
        return type(tree)(_prefix_map(s, v, fn, what, f"{path}[{i}]") for i, (s, v) in enumerate(zip(specs, tree)))
    if isinstance(specs, dict):
        if not isinstance(tree, dict) or set(tree) != set(specs):
            raise ValueError(f"shard_map: {what} is a dict with keys {sorted(specs)}, {path} is not")
        return {k: _prefix_map(specs[k], tree[k], fn, what, f"{path}[{k!r}]") for k in tree}
    raise TypeError(f"shard_map: {what} must be PartitionSpecs (P(...)) or tuples/lists/dicts of them, "
                    f"got {type(specs).__name__} at {path}")


class ShardMapped:
    """The global function that :func:`shard_map` returns (module doc)."""

    def __init__(self, f, mesh: Mesh, in_specs, out_specs):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"shard_map: mesh must be a Mesh, got {type(mesh).__name__}")
        self.f, self.mesh, self.in_specs, self.out_specs = f, mesh, in_specs, out_specs
        self._mid = mesh_id(mesh)
        functools.update_wrapper(self, f, updated=())

    def _enter(self, x, spec, path):
        if not _is_array(x):
            return x
        sharding = NamedSharding(self.mesh, spec)
        if isinstance(x, ShardedArray) and x.mesh != self.mesh:
            raise ValueError(f"shard_map: argument {path} lives on {x.mesh}, the function on {self.mesh}")
        arr = device_put(x, sharding)
        return _Enter.apply(arr.local(), self._mid, list(sharding.replicated_axes))

    def _exit(self, y, spec, path):
        if not isinstance(y, Tensor):
            raise TypeError(f"shard_map: result {path} of the body is a {type(y).__name__}; out_specs describe "
                            f"tensors (the local blocks)")
        sharding = NamedSharding(self.mesh, spec)
        if len(spec) > y.dim():
            raise ValueError(f"shard_map: out_specs {spec} has {len(spec)} entries for result {path} of "
                             f"{y.dim()} dimensions {list(y.shape)}")
        shape = [n * (self.mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1) for d, n in enumerate(y.shape)]
        return ShardedArray(_Exit.apply(y, sharding.num_replicas), sharding, shape)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"shard_map: keyword arguments are not supported (got {sorted(kwargs)}); pass them "
                            f"positionally with a spec each")
        self.mesh.process_index()
        if isinstance(self.in_specs, (tuple, list)) and not isinstance(self.in_specs, PartitionSpec) \
                and len(self.in_specs) != len(args):
            raise ValueError(f"shard_map: in_specs has {len(self.in_specs)} entries, but the function got "
                             f"{len(args)} arguments")
        local = _prefix_map(self.in_specs, args, self._enter, "in_specs", "args")
        with bind(self.mesh):
            out = self.f(*local)
        return _prefix_map(self.out_specs, out, self._exit, "out_specs", "result")

    def __repr__(self):
        return (f"shard_map({getattr(self.f, '__qualname__', self.f)!s}, mesh={self.mesh.shape}, "
                f"in_specs={self.in_specs}, out_specs={self.out_specs})")


def shard_map(f=None, mesh=None, in_specs=None, out_specs=None):
    """``shard_map(f, mesh, in_specs, out_specs)``, or without ``f`` a decorator (module doc)."""
    if mesh is None or in_specs is None or out_specs is None:
        raise TypeError("shard_map: mesh, in_specs and out_specs are required")
    if f is None:
        return lambda g: ShardMapped(g, mesh, in_specs, out_specs)
    return ShardMapped(f, mesh, in_specs, out_specs)
