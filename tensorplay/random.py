"""``tp.random``: PyTorch's ``torch.random`` namespace over tensorplay's one global generator.

``manual_seed``, ``seed``, ``initial_seed``, ``get_rng_state`` (a tp uint8 tensor) and
``set_rng_state`` (a tp or torch tensor) are ``tp.manual_seed`` and its siblings; ``Generator`` and
``default_generator`` are ``tp.Generator`` and ``tp.default_generator``.  ``fork_rng()`` is
torch's: the global CPU generator (and the given accelerators') is restored when the block ends,
so draws inside it leave the stream outside unchanged.  Draws from an explicit generator are not
affected by either.
"""
from __future__ import annotations

import torch

from .ops.factories import Generator, default_generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state

__all__ = ["Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed", "manual_seed", "seed",
           "set_rng_state"]

fork_rng = torch.random.fork_rng
