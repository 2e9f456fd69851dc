"""``DataLoader`` and ``default_collate`` (see the package docstring)."""
from __future__ import annotations

import collections.abc
import numbers
import warnings

import numpy as np
import torch

from ..._tensor import Tensor, _wrap
from ...ops.factories import Generator
from .dataset import IterableDataset, TensorDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]


def get_worker_info():
    """``None``: loading runs in the main process (what PyTorch returns there too), so dataset code
    that splits its work among loader workers takes its single-process branch."""
    return None


def _stack(tensors):
    from ... import ops
    if any(t.requires_grad for t in tensors) and hasattr(ops, "stack"):
        return ops.stack(tensors, 0)  # keep the autograd history
    return _wrap(torch.stack([t._data for t in tensors], 0))


def default_collate(batch):
    """Merge a list of samples into a batch: tensors (and numpy arrays) are stacked along a new
    first dim; Python floats -> float64 tensor, ints -> int64, bools -> bool; strings stay a list;
    dicts, tuples, named tuples and lists are collated field by field (tuples give lists, as in
    PyTorch)."""
    if len(batch) == 0:
        raise ValueError("default_collate: got an empty batch")
    elem = batch[0]
    if isinstance(elem, Tensor):
        return _stack(batch)
    if isinstance(elem, torch.Tensor):
        return _wrap(torch.stack([b.detach() for b in batch], 0))
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "OUS":
            raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
                            f"found an array of dtype {elem.dtype}")
        return _wrap(torch.as_tensor(np.stack(batch)))
    if isinstance(elem, np.generic):
        return _wrap(torch.as_tensor(np.array(batch)))
    if isinstance(elem, bool):
        return _wrap(torch.tensor(batch, dtype=torch.bool))
    if isinstance(elem, numbers.Integral):
        return _wrap(torch.tensor(batch, dtype=torch.int64))
    if isinstance(elem, numbers.Real):
        return _wrap(torch.tensor(batch, dtype=torch.float64))
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        try:
            return type(elem)({k: default_collate([d[k] for d in batch]) for k in elem})
        except TypeError:
            return {k: default_collate([d[k] for d in batch]) for k in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        n = len(elem)
        if any(len(b) != n for b in batch):
            raise RuntimeError("default_collate: each element in list of batch should be of equal size")
        cols = [default_collate(list(s)) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return cols
        try:
            return type(elem)(cols)
        except TypeError:
            return cols
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
                    f"found {type(elem).__name__}")


def default_convert(data):
    """What ``batch_size=None`` yields: numpy arrays become tensors, containers are converted
    element-wise, everything else is returned unchanged."""
    if isinstance(data, np.ndarray) and data.dtype.kind not in "OUS":
        return _wrap(torch.as_tensor(data))
    if isinstance(data, torch.Tensor):
        return _wrap(data.detach())
    if isinstance(data, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(d) for d in data)
    return data


class DataLoader:
    """Iterate over ``dataset`` in batches (see the package docstring)."""

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, generator=None, *,
                 seed: int | None = None, prefetch_factor=None, persistent_workers: bool = False):
        if num_workers:
            warnings.warn("tp.utils.data.DataLoader: num_workers > 0 is not supported; loading in the main "
                          "process", stacklevel=2)
        if seed is not None:
            if generator is not None:
                raise ValueError("DataLoader: give either generator or seed, not both")
            generator = Generator().manual_seed(seed)
        self.dataset = dataset
        self.num_workers = 0
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle:
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler/batch_sampler")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with "
                             "drop_last")
        if sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._default_collate = collate_fn is None
        if collate_fn is None:
            collate_fn = default_collate if batch_size is not None or batch_sampler is not None else default_convert
        self.collate_fn = collate_fn

    def _fetch(self, indices):
        ds = self.dataset
        if (self._default_collate and type(ds) is TensorDataset
                and not any(isinstance(t, Tensor) and t.requires_grad for t in ds.tensors)):
            # fast path: one gather per tensor instead of len(indices) lookups + a stack
            idx = torch.as_tensor(indices, dtype=torch.int64)
            return [_wrap(t._data[idx] if isinstance(t, Tensor) else t.detach()[idx]) for t in ds.tensors]
        return self.collate_fn([ds[i] for i in indices])

    def __iter__(self):
        # PyTorch's iterator draws a base seed for its workers from the loader's generator at the
        # start of every epoch; drawing it too keeps the shuffles equal to torch's for the same seeds
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        if self._iterable:
            return self._iter_stream()
        if self.batch_sampler is not None:
            return (self._fetch(indices) for indices in self.batch_sampler)
        return (self.collate_fn(self.dataset[i]) for i in self.sampler)

    def _iter_stream(self):
        if self.batch_size is None:
            for item in self.dataset:
                yield self.collate_fn(item)
            return
        batch = []
        for item in self.dataset:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)
