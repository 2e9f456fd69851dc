"""PartitionSpec and NamedSharding: how a global array's dimensions split over mesh axes (seed 001 §4).

``P(...)`` has one entry per array dimension (missing trailing entries mean ``None``): ``None`` --
the dimension is not split; an axis name -- split along that mesh axis; a tuple of names -- split
jointly along several axes, the first one major (``P(("X", "Y"))`` on X=4, Y=2 cuts one dimension
into 8 blocks).  A spec alone says nothing about sizes: ``NamedSharding(mesh, spec)`` binds it to a
mesh, and only then are local shapes defined.

Rules and guarantees (checked for a given global shape by :meth:`NamedSharding.shard_shape`):

* a spec has at most as many entries as the array has dimensions, and names each mesh axis at most
  once; an axis it names must exist in the mesh;
* every split dimension is divisible by the product of its axes' sizes -- otherwise ``ValueError``
  naming the dimension, its size and the axes (there is no padding);
* the mesh axes a spec does not name carry *replicas*: the devices that differ only along them hold
  the same block (:attr:`NamedSharding.replicated_axes`);
* device ``r`` holds the block whose index along dimension ``d`` is ``r``'s linear index over that
  dimension's axes (:meth:`Mesh.linear_index`): :meth:`NamedSharding.index` gives its slices.

The seed's table on X=4, Y=2: ``In[8, 2048]`` with ``P("X", "Y")`` -> ``[2, 1024]`` on every
device, no replica axis; ``W[2048, 8192]`` with ``P("Y", None)`` -> ``[1024, 8192]``, replicated
along X.
"""
from __future__ import annotations

import math

from .mesh import Mesh

__all__ = ["PartitionSpec", "P", "NamedSharding"]


class PartitionSpec(tuple):
    """``P("X", None, ("Y", "Z"))``: per array dimension, None, one axis name or a tuple of them."""

    def __new__(cls, *parts):
        norm = []
        for p in parts:
            if p is None or isinstance(p, str):
                norm.append(p)
            elif isinstance(p, (tuple, list)) and all(isinstance(a, str) for a in p):
                norm.append(None if len(p) == 0 else p[0] if len(p) == 1 else tuple(p))
            else:
                raise TypeError(f"PartitionSpec entries are None, an axis name or a tuple of axis names; got {p!r}")
        return super().__new__(cls, norm)

    def axes_of(self, dim: int) -> tuple:
        """The mesh axes dimension ``dim`` is split along (``()`` when not split)."""
        p = self[dim] if dim < len(self) else None
        return () if p is None else (p,) if isinstance(p, str) else p

    @property
    def mentioned(self) -> tuple:
        """Every axis the spec names, in dimension order (within a dimension: major first)."""
        return tuple(a for d in range(len(self)) for a in self.axes_of(d))

    def __repr__(self):
        return "P(" + ", ".join(repr(p) for p in self) + ")"

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


P = PartitionSpec


class NamedSharding:
    """A :class:`Mesh` and a :class:`PartitionSpec`: where each block of a global array lives."""

    def __init__(self, mesh: Mesh, spec):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"NamedSharding: expected a Mesh, got {type(mesh).__name__}")
        if not isinstance(spec, PartitionSpec):
            spec = PartitionSpec(*spec) if isinstance(spec, (tuple, list)) else PartitionSpec(spec)
        used = spec.mentioned
        for a in used:
            if a not in mesh.axis_names:
                raise ValueError(f"unknown axis name {a!r} in {spec}: the mesh has axes {mesh.axis_names}")
        if len(set(used)) != len(used):
            raise ValueError(f"{spec} names a mesh axis more than once")
        self.mesh, self.spec = mesh, spec

    @property
    def replicated_axes(self) -> tuple:
        """The mesh axes the spec does not name: the devices along them hold the same block."""
        used = set(self.spec.mentioned)
        return tuple(a for a in self.mesh.axis_names if a not in used)

    @property
    def num_replicas(self) -> int:
        shape = self.mesh.shape
        return math.prod(shape[a] for a in self.replicated_axes)

    def _check_rank(self, global_shape):
        if len(self.spec) > len(global_shape):
            raise ValueError(f"{self.spec} has {len(self.spec)} entries, but the array has {len(global_shape)} "
                             f"dimensions {list(global_shape)}")

    def shard_shape(self, global_shape) -> tuple:
        """The local block's shape (the same on every device)."""
        global_shape = tuple(int(s) for s in global_shape)
        self._check_rank(global_shape)
        out = []
        for d, size in enumerate(global_shape):
            axes = self.spec.axes_of(d)
            n = self.mesh.axis_size(axes) if axes else 1
            if size % n:
                what = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes}"
                raise ValueError(f"dimension {d} of size {size} is not divisible by the size {n} of mesh {what} "
                                 f"({self.spec} on mesh {self.mesh.shape}, global shape {list(global_shape)})")
            out.append(size // n)
        return tuple(out)

    def block_index(self, rank: int) -> tuple:
        """Per dimension, the index of the block device ``rank`` holds."""
        return tuple(self.mesh.linear_index(rank, self.spec.axes_of(d)) if self.spec.axes_of(d) else 0
                     for d in range(len(self.spec)))

    def index(self, rank: int, global_shape) -> tuple:
        """The slices of the global array that device ``rank`` holds."""
        local = self.shard_shape(global_shape)
        blocks = self.block_index(rank) + (0,) * (len(local) - len(self.spec))
        return tuple(slice(b * n, (b + 1) * n) for b, n in zip(blocks, local))

    def devices_indices_map(self, global_shape) -> dict:
        """``{device: slices}`` for every device of the mesh (JAX's name)."""
        return {r: self.index(r, global_shape) for r in range(self.mesh.size)}

    def __eq__(self, other):
        return isinstance(other, NamedSharding) and other.mesh == self.mesh and tuple(other.spec) == tuple(self.spec)

    def __hash__(self):
        return hash((self.mesh, tuple(self.spec)))

    def __repr__(self):
        return f"NamedSharding(mesh={self.mesh.shape}, spec={self.spec})"
