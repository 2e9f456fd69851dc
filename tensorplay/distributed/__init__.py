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
``explicit.py``    explicit mode: ops on ShardedArrays propagate shardings and insert collectives;
                   :func:`with_sharding_constraint`, :func:`explain`
``compiled.py``    ``tp.compile`` of explicit-mode functions called with ShardedArrays: the local
                   program compiled, :func:`compiled_text`, training through it
``moe.py``         expert parallelism (seed 001 §6): tokens dispatched to the member owning their
                   expert by :func:`all_to_all_v`, the outputs returned and combined by token
=================  ================================================================================

Two of the seed's three modes are here: manual (:func:`shard_map`: the body sees local blocks and
writes the collectives) and explicit (global-array code on ShardedArrays, the shardings propagated
and the collectives inserted by explicit.py).  Auto mode (a compiler choosing the shardings) is not.
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
from .explicit import Explanation, PartialSum, compiled_text, explain, matmul, on_blocks, with_sharding_constraint

__all__ = ["init", "shutdown", "is_initialized", "rank", "world_size", "local_device",
           "Mesh", "make_mesh", "AxisGroup", "PartitionSpec", "P", "NamedSharding",
           "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all", "all_to_all_v",
           "axis_index", "axis_size", "ShardedArray", "Shard", "device_put", "shard_map", "ShardMapped",
           "collective_matmul",
           "expert_parallel_moe", "dispatch_to_experts", "return_to_tokens", "ExpertDispatch"]
__all__ += ["with_sharding_constraint", "matmul", "explain", "Explanation", "PartialSum", "on_blocks", "compiled_text"]
