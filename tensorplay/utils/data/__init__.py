"""``tp.utils.data``: datasets, samplers and the ``DataLoader`` (chapter §4.3).

* ``Dataset``: anything with ``__getitem__(i)`` and ``__len__``; ``TensorDataset(*tensors)`` indexes
  several tensors along their first dimension together; ``StackDataset``, ``Subset``,
  ``ConcatDataset``, ``ChainDataset`` (streams), ``random_split``.
* Samplers produce indices lazily: ``SequentialSampler``, ``RandomSampler`` (a fresh permutation each
  epoch, or draws with replacement), ``SubsetRandomSampler``, ``WeightedRandomSampler``, ``BatchSampler``
  (groups indices into lists, optionally dropping the last short batch), ``DistributedSampler`` (one
  process's share); their draws are PyTorch's.
* ``DataLoader(dataset, batch_size, shuffle, drop_last, collate_fn, generator, seed)`` iterates over
  batches: it samples indices, fetches the items and merges them with ``collate_fn`` (default:
  :func:`default_collate`, which stacks tensors, turns numbers into tensors and recurses into tuples,
  lists and dicts).  Shuffling draws from ``generator`` (a ``torch.Generator``), or from a generator
  seeded with ``seed``, or else from the global generator (``tp.manual_seed`` makes it reproducible);
  each epoch consumes the generator as PyTorch's loader does, so the same seed gives the same batches.

Loading runs in the main process (``num_workers`` is accepted for compatibility and ignored;
``get_worker_info()`` is ``None``).
"""
from .dataloader import DataLoader, default_collate, default_convert, get_worker_info
from . import distributed
from .distributed import DistributedSampler
from .dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset, Subset, TensorDataset,
                      random_split)
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler,
                      WeightedRandomSampler)

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset", "Subset", "ConcatDataset", "ChainDataset",
           "random_split", "get_worker_info", "default_convert", "Sampler",
           "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler",
           "DistributedSampler", "DataLoader", "default_collate"]
