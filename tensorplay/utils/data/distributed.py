"""``DistributedSampler``: each of ``num_replicas`` processes iterates over its own share of a
map-style dataset.

The index list of an epoch is ``randperm(len, generator seeded with seed + epoch)`` (``shuffle``,
call ``set_epoch`` every epoch) or ``range(len)``; it is padded by repeating its start to a multiple
of ``num_replicas`` (or, with ``drop_last``, cut to one), and rank r takes every
``num_replicas``-th index from position r.  The same arithmetic as PyTorch, so every rank sees the
indices ``torch.utils.data.distributed.DistributedSampler`` gives it; ``num_replicas``/``rank``
default to the initialised ``torch.distributed`` process group's.
"""
from __future__ import annotations

import math

import torch

from .sampler import Sampler

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler):
    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        if num_replicas is None or rank is None:
            import torch.distributed as dist
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError("DistributedSampler: give num_replicas and rank, or initialise the "
                                   "torch.distributed process group first")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch, self.drop_last, self.shuffle, self.seed = 0, drop_last, shuffle, seed
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(indices)
            if pad <= len(indices):
                indices += indices[:pad]
            else:
                indices += (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch number, which seeds the shuffle (so that every epoch has its own order)."""
        self.epoch = epoch
