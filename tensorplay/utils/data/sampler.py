"""Samplers: iterables of dataset indices (or, for ``BatchSampler``, of lists of indices)."""
from __future__ import annotations

import torch

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "BatchSampler"]


class Sampler:
    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


def _fresh_generator(generator):
    """The generator for one epoch: the given one, or a new one seeded from the global RNG."""
    if generator is not None:
        return generator
    seed = int(torch.empty((), dtype=torch.int64).random_().item())
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class SequentialSampler(Sampler):
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation of ``range(len(data_source))`` per epoch (or ``num_samples`` draws with
    replacement when ``replacement=True``)."""

    def __init__(self, data_source, replacement: bool = False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        g = _fresh_generator(self.generator)
        if self.replacement:     # drawn 32 at a time, as torch does: num_samples may be huge (1e10)
            return self._with_replacement(n, g)
        idx = []
        while len(idx) < self.num_samples:
            idx.extend(torch.randperm(n, generator=g).tolist())
        return iter(idx[:self.num_samples])

    def _with_replacement(self, n, g):
        full, rest = divmod(self.num_samples, 32)
        for _ in range(full):
            yield from torch.randint(high=n, size=(32,), dtype=torch.int64, generator=g).tolist()
        if rest:
            yield from torch.randint(high=n, size=(rest,), dtype=torch.int64, generator=g).tolist()

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order each epoch."""

    def __init__(self, indices, generator=None):
        self.indices = list(indices)
        self.generator = generator

    def __iter__(self):
        g = _fresh_generator(self.generator)
        return iter([self.indices[i] for i in torch.randperm(len(self.indices), generator=g).tolist()])

    def __len__(self):
        return len(self.indices)


class BatchSampler(Sampler):
    """Group the indices of ``sampler`` into lists of ``batch_size`` (the last one shorter unless
    ``drop_last``)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size
