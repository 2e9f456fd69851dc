"""``tp.distributed``: JAX's sharding model on ``torch.distributed``, one process per device (seed 001 §4).

Read in this order -- one stage per module:

=================  ================================================================================
``launch.py``      start N processes: ``python -m tensorplay.distributed.launch --nproc N`` (or
                   ``torchrun``)
``runtime.py``     join them in one process group (:func:`init`): gloo on CPU, NCCL when every
                   process has a GPU
``mesh.py``        :class:`Mesh`: the processes on named axes; sub-groups per set of axes
``sharding.py``    :class:`PartitionSpec` (``P``) and :class:`NamedSharding`: which block of a
                   global array each device holds, and its shape
``collectives.py`` psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all,
                   all_to_all_v, axis_index: op-table entries with derivatives (their transposes)
``array.py``       :class:`ShardedArray`: global shape, sharding, local block; :func:`device_put`
                   and ``gather``
``shard_map.py``   manual mode: :func:`shard_map` runs a function on the local blocks
``collective_      :func:`collective_matmul`: input blocks around the ring, weights stay, the next
matmul.py``        transfer overlapped with the current product (seed 001 §5)
=================  ================================================================================

Of the seed's three modes only the manual one is here: the body sees local blocks and the user
writes the collectives.  Explicit mode (propagating shardings through global-array code) builds on
these pieces and is not part of this package yet.
docs/distributed.md walks through the model with examples.
"""
from __future__ import annotations

from .runtime import init, is_initialized, local_device, rank, shutdown, world_size
from .mesh import AxisGroup, Mesh, make_mesh
from .sharding import NamedSharding, P, PartitionSpec
from .collectives import (all_gather, all_to_all, all_to_all_v, axis_index, axis_size, pmax, pmean, pmin,
                          ppermute, psum, psum_scatter)
from .array import Shard, ShardedArray, device_put
from .shard_map import ShardMapped, shard_map
from .collective_matmul import collective_matmul
from .moe import ExpertDispatch, dispatch_to_experts, expert_parallel_moe, return_to_tokens

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_device",
           "Mesh", "make_mesh", "AxisGroup", "PartitionSpec", "P", "NamedSharding",
           "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all", "all_to_all_v",
           "axis_index", "axis_size", "ShardedArray", "Shard", "device_put", "shard_map", "ShardMapped",
           "collective_matmul",
           "expert_parallel_moe", "dispatch_to_experts", "return_to_tokens", "ExpertDispatch"]
