"""The device mesh: named logical coordinates for the processes (seed 001 §4).

A :class:`Mesh` is an n-dimensional array of *device ids* with one name per dimension ("axis"):
``Mesh(np.arange(8).reshape(4, 2), ("X", "Y"))`` has axes X (size 4) and Y (size 2).  TensorPlay runs
one process per device, so a device id is a process rank of ``torch.distributed``.  The mesh's
logical neighbours are not necessarily physical network neighbours.

Rules and guarantees:

* the device ids are exactly ``0 .. size-1``, each once; the axis names are distinct strings, one per
  dimension.  Anything else raises ``ValueError`` at construction;
* a mesh is a value: two meshes with the same names and the same device array are equal, hash alike
  and share their process groups;
* a mesh needs no process group to exist: shapes, specs and local-block arithmetic
  (:mod:`tensorplay.distributed.sharding`) work on an *abstract* mesh anywhere, in any process;
* what needs processes -- the current process's coordinates, placing data, collectives -- *binds*
  the mesh (:meth:`Mesh.process_index`): the process group must be initialised and its world size
  must equal the mesh's size (else ``RuntimeError`` naming both); a mesh of one device binds in a
  process without a group (a single-process run: every collective over it is the identity);
* the ranks of a collective over a tuple of axes ``(a1, ..., ak)`` are the ranks that differ from
  this process only along those axes, ordered by the *linear index* ``((i_a1 * n_a2 + i_a2) * n_a3
  + ...)`` -- the first axis major, as in ``P(("X", "Y"))``; :meth:`Mesh.group` builds, the first
  time a set of axes is used, one ``torch.distributed`` sub-group for each such set of ranks (a
  collective call of every process, which an SPMD program makes in the same order everywhere).
"""
from __future__ import annotations

import atexit
import itertools
import math

import numpy as np

__all__ = ["Mesh", "make_mesh", "AxisGroup", "forget_groups"]


def _dist():
    import torch.distributed as dist
    return dist


class AxisGroup:
    """The ranks that take part with this process in a collective over ``axes`` of a mesh.

    ``ranks``: their global ranks in linear-index order over ``axes``; ``index``: this process's
    position there (``axis_index(axes)``); ``pg``: the ``torch.distributed`` process group of those
    ranks (None for a group of one)."""

    __slots__ = ("axes", "ranks", "index", "pg")

    def __init__(self, axes, ranks, index, pg):
        self.axes, self.ranks, self.index, self.pg = axes, tuple(ranks), index, pg

    @property
    def size(self) -> int:
        return len(self.ranks)

    def group_rank(self, member: int) -> int:
        """The ``torch.distributed`` group rank of the member at linear position ``member``."""
        return _dist().get_group_rank(self.pg, self.ranks[member])

    def __repr__(self):
        return f"AxisGroup(axes={self.axes}, ranks={list(self.ranks)}, index={self.index})"


#: (mesh key, frozenset of axes) -> (the default process group it was built under, {rank: process group})
_GROUPS: dict = {}


def forget_groups() -> None:
    """Drop every sub-group this module holds (before the process group is destroyed: a group
    object that outlives it is torn down at interpreter exit, where gloo aborts the process)."""
    _GROUPS.clear()


atexit.register(forget_groups)


class Mesh:
    """``Mesh(devices, axis_names)``: device ids (process ranks) arranged on named axes."""

    def __init__(self, devices, axis_names):
        arr = np.array(devices)
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        names = tuple(axis_names)
        if arr.ndim == 0:
            raise ValueError("Mesh: devices must be an array with one dimension per axis, got a scalar")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"Mesh: devices are process ranks (integers), got dtype {arr.dtype}")
        if len(names) != arr.ndim:
            raise ValueError(f"Mesh: {len(names)} axis names {names} for a device array of {arr.ndim} "
                             f"dimensions {tuple(arr.shape)}")
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"Mesh: axis names must be distinct non-empty strings, got {names}")
        if sorted(arr.ravel().tolist()) != list(range(arr.size)):
            raise ValueError(f"Mesh: the device ids must be 0..{arr.size - 1}, each once; got {arr.ravel().tolist()}")
        arr = arr.astype(np.int64)
        arr.setflags(write=False)
        self.devices = arr
        self.axis_names = names
        self._key = (names, arr.shape, tuple(arr.ravel().tolist()))

    # ---- shape arithmetic (no process group needed) ------------------------------------------
    @property
    def shape(self) -> dict:
        """``{axis name: size}`` in mesh order (JAX's ``mesh.shape``)."""
        return dict(zip(self.axis_names, self.devices.shape))

    @property
    def size(self) -> int:
        return int(self.devices.size)

    @property
    def ndim(self) -> int:
        return self.devices.ndim

    def axes(self, axis_name) -> tuple:
        """``axis_name`` (a name or a tuple of names) as a tuple of known, distinct names."""
        axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
        for a in axes:
            if a not in self.axis_names:
                raise ValueError(f"unknown axis name {a!r}: the mesh has axes {self.axis_names}")
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis names repeated in {axes}")
        return axes

    def axis_size(self, axis_name) -> int:
        """Number of devices along one axis or a tuple of axes (their product)."""
        shape = self.shape
        return math.prod(shape[a] for a in self.axes(axis_name))

    def coords(self, rank: int) -> dict:
        """``{axis name: index}`` of device ``rank``."""
        where = np.argwhere(self.devices == rank)
        if len(where) != 1:
            raise ValueError(f"device {rank} is not in the mesh {self.shape}")
        return dict(zip(self.axis_names, (int(i) for i in where[0])))

    def linear_index(self, rank: int, axes) -> int:
        """The position of device ``rank`` along ``axes`` (first axis major)."""
        c, shape, idx = self.coords(rank), self.shape, 0
        for a in self.axes(axes):
            idx = idx * shape[a] + c[a]
        return idx

    def peers(self, rank: int, axes) -> tuple:
        """The devices that differ from ``rank`` only along ``axes``, in linear-index order."""
        axes = self.axes(axes)
        c = self.coords(rank)
        out = []
        for idx in itertools.product(*(range(self.shape[a]) for a in axes)):
            pos = dict(c, **dict(zip(axes, idx)))
            out.append(int(self.devices[tuple(pos[a] for a in self.axis_names)]))
        return tuple(out)

    # ---- binding to processes ----------------------------------------------------------------
    def process_index(self) -> int:
        """This process's device id in the mesh (its rank); binds the mesh (module doc)."""
        dist = _dist()
        if dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
            if world != self.size:
                raise RuntimeError(
                    f"a mesh of {self.size} devices {self.shape} needs a process group of {self.size} processes, "
                    f"but the world size is {world}: start {self.size} processes (python -m "
                    f"tensorplay.distributed.launch --nproc {self.size} ...) or build a mesh of {world} devices")
            return dist.get_rank()
        if self.size == 1:
            return 0
        raise RuntimeError(
            f"a mesh of {self.size} devices {self.shape} needs an initialised process group of {self.size} "
            f"processes (tp.distributed.init() in a script started by python -m tensorplay.distributed.launch "
            f"--nproc {self.size} or torchrun); without one a mesh serves shape arithmetic only")

    def group(self, axes) -> AxisGroup:
        """This process's :class:`AxisGroup` over ``axes`` (built on first use: module doc)."""
        axes = self.axes(axes)
        me = self.process_index()
        members = frozenset(axes)
        dist = _dist()
        world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        entry = _GROUPS.get((self._key, members))
        if entry is None or entry[0] is not world:
            entry = (world, self._build_groups(members, world))
            _GROUPS[(self._key, members)] = entry
        pg = entry[1][me]
        ranks = self.peers(me, axes)
        return AxisGroup(axes, ranks, ranks.index(me), pg)

    def _build_groups(self, members, world) -> dict:
        """{rank: process group of its peers along ``members``}, every sub-group created in the same
        order on every process (``dist.new_group`` is collective over the world)."""
        n = math.prod(self.shape[a] for a in members)
        if n == 1:
            return {r: None for r in range(self.size)}
        if n == self.size:
            return {r: world for r in range(self.size)}
        dist = _dist()
        out = {}
        others = [a for a in self.axis_names if a not in members]
        for idx in itertools.product(*(range(self.shape[a]) for a in others)):
            sel = tuple(idx[others.index(a)] if a in others else slice(None) for a in self.axis_names)
            ranks = sorted(int(r) for r in self.devices[sel].ravel())
            pg = dist.new_group(ranks)
            for r in ranks:
                out[r] = pg
        return out

    # ---- value semantics -----------------------------------------------------------------------
    def __eq__(self, other):
        return isinstance(other, Mesh) and other._key == self._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"Mesh({self.shape}, devices={self.devices.tolist()})"


def make_mesh(axis_shapes, axis_names) -> Mesh:
    """``make_mesh((4, 2), ("X", "Y"))``: the devices ``0 .. n-1`` in row-major order on the axes."""
    shape = tuple(int(s) for s in axis_shapes)
    return Mesh(np.arange(math.prod(shape)).reshape(shape), axis_names)
