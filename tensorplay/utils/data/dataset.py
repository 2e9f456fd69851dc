"""Datasets: the map-style protocol (``__getitem__``/``__len__``), streams (``IterableDataset``) and
their compositions (``TensorDataset``, ``StackDataset``, ``Subset``, ``ConcatDataset``,
``ChainDataset``, ``random_split``), as in ``torch.utils.data``; ``Dataset[T]`` is a generic."""
from __future__ import annotations

import bisect
import math
import warnings
from typing import Generic, TypeVar

import torch

from ..._tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset", "Subset", "ConcatDataset", "ChainDataset",
           "random_split"]


_T_co = TypeVar("_T_co", covariant=True)


class Dataset(Generic[_T_co]):
    """A map-style dataset: ``dataset[i]`` is the i-th sample; subclasses define ``__getitem__``
    and ``__len__``.  ``a + b`` concatenates two datasets."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples (``__iter__``); the DataLoader batches it in order (no shuffling)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class TensorDataset(Dataset):
    """Sample ``i`` is ``tuple(t[i] for t in tensors)``; all tensors share their first dimension."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: at least one tensor is required")
        for t in tensors:
            if not isinstance(t, (Tensor, torch.Tensor)):
                raise TypeError(f"TensorDataset: expected Tensors, got {type(t).__name__}")
            if t.dim() == 0:
                raise ValueError("TensorDataset: tensors must have at least one dimension")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ValueError("Size mismatch between tensors: TensorDataset needs the same first dimension, got "
                             + ", ".join(str(list(t.shape)) for t in tensors))
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class StackDataset(Dataset):
    """Several datasets of one length side by side: sample ``i`` is the tuple (positional datasets)
    or dict (keyword datasets) of their samples ``i``."""

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise ValueError("StackDataset: give datasets positionally (tuple samples) or by keyword (dict "
                             "samples), not both")
        if not args and not kwargs:
            raise ValueError("StackDataset: at least one dataset should be passed")
        self.datasets = args if args else kwargs
        members = list(args) if args else list(kwargs.values())
        self._length = len(members[0])
        if any(len(d) != self._length for d in members):
            raise ValueError(f"StackDataset: size mismatch between datasets: {[len(d) for d in members]}")

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = list(indices)

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    """Several datasets one after the other."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = []
        total = 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise IndexError(f"ConcatDataset: index {idx} out of range for length {len(self)}")
            idx += len(self)
        if idx >= len(self):
            raise IndexError(f"ConcatDataset: index {idx} out of range for length {len(self)}")
        k = bisect.bisect_right(self.cumulative_sizes, idx)
        start = 0 if k == 0 else self.cumulative_sizes[k - 1]
        return self.datasets[k][idx - start]


class ChainDataset(IterableDataset):
    """Several streams one after the other (``len`` is the sum of theirs)."""

    def __init__(self, datasets):
        self.datasets = datasets

    def _members(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError(f"ChainDataset only supports IterableDataset, got {type(d).__name__}")
            yield d

    def __iter__(self):
        for d in self._members():
            yield from d

    def __len__(self):
        return sum(len(d) for d in self._members())


def random_split(dataset, lengths, generator=None):
    """Split into non-overlapping random subsets of the given lengths, or of fractions summing to 1
    (``floor(n·f)`` each, the remainder handed out one by one from the first subset on).  The
    permutation is ``randperm(n, generator=generator)`` (the global RNG by default), as in PyTorch."""
    n = len(dataset)
    lengths = list(lengths)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        if any(f < 0 or f > 1 for f in lengths):
            raise ValueError(f"random_split: fractions must be in [0, 1], got {lengths}")
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, ln in enumerate(sizes):
            if ln == 0:
                warnings.warn(f"random_split: length of split at index {i} is 0; this might result in an empty "
                              f"dataset", stacklevel=2)
        lengths = sizes
    if any(not isinstance(ln, int) or ln < 0 for ln in lengths):
        raise ValueError(f"random_split: lengths must be non-negative integers or fractions summing to 1, got "
                         f"{lengths}")
    if sum(lengths) != n:
        raise ValueError(f"random_split: sum of input lengths ({sum(lengths)}) does not equal the length of the "
                         f"input dataset ({n})")
    perm = torch.randperm(n, generator=generator).tolist()
    out, start = [], 0
    for ln in lengths:
        out.append(Subset(dataset, perm[start:start + ln]))
        start += ln
    return out
