"""Variable-length sequences for the recurrent layers: ``PackedSequence`` and its helpers
``pack_padded_sequence``, ``pad_packed_sequence``, ``pack_sequence``, ``pad_sequence``,
``unpad_sequence`` and ``unpack_sequence`` (PyTorch's names, signatures and defaults).

A ``PackedSequence`` holds the time steps of a batch of sequences sorted by decreasing length,
step after step: ``data`` is ``(sum(lengths), *)``, and ``batch_sizes[t]`` (an int64 CPU tensor)
is the number of sequences that are longer than ``t``, so step ``t`` is the next
``batch_sizes[t]`` rows of ``data``.  ``sorted_indices[i]`` is the original batch index of the
``i``-th longest sequence and ``unsorted_indices`` its inverse permutation (both ``None`` when the
batch was already sorted, ``enforce_sorted=True``).  The recurrent modules accept it in place of a
padded tensor and return one with the same ``batch_sizes`` and indices.

Guarantees: packing and unpacking are index maps written in tp ops (``index_select``, ``cat``), so
gradients flow from ``data`` back to the padded input and ``tp.compile`` captures them; padding
positions get ``padding_value`` and receive no gradient; the layout, the sort order (a stable
descending sort of the lengths, as PyTorch's) and the error cases are PyTorch's.
"""
from __future__ import annotations

from collections import namedtuple

import torch

from ..._tensor import Tensor, _wrap
from ... import ops as _ops

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pack_sequence", "pad_sequence",
           "unpad_sequence", "unpack_sequence", "invert_permutation"]


def _index(values) -> Tensor:
    return _wrap(torch.as_tensor(values, dtype=torch.int64))


def invert_permutation(permutation):
    """The inverse permutation of ``permutation`` (an int64 tensor), or ``None`` for ``None``."""
    if permutation is None:
        return None
    p = permutation._data if isinstance(permutation, Tensor) else torch.as_tensor(permutation)
    inv = torch.empty_like(p)
    inv.scatter_(0, p, torch.arange(p.numel(), device=p.device))
    return _wrap(inv)


_PackedBase = namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])


class PackedSequence(_PackedBase):
    """``(data, batch_sizes, sorted_indices, unsorted_indices)``; build it with
    ``pack_padded_sequence`` or ``pack_sequence`` rather than by hand."""

    __slots__ = ()

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:  # PyTorch's positional form PackedSequence((data, batch_sizes))
            if not isinstance(data, (tuple, list)) or len(data) != 2:
                raise TypeError("nn.utils.rnn.PackedSequence: give data and batch_sizes")
            data, batch_sizes = data
        if not isinstance(batch_sizes, Tensor):
            batch_sizes = _index(batch_sizes)
        if batch_sizes.device.type != "cpu" or batch_sizes.dim() != 1:
            raise ValueError(f"nn.utils.rnn.PackedSequence: batch_sizes must be a 1-D CPU int64 tensor, got "
                             f"{batch_sizes.dim()}-D on {batch_sizes.device}")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def _map(self, fn):
        """The same sequence with ``fn`` applied to ``data`` (and the indices moved to its device)."""
        data = fn(self.data)
        move = (lambda i: None if i is None else i.to(data.device))
        return type(self)(data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices))

    def to(self, *args, **kwargs):
        return self._map(lambda d: d.to(*args, **kwargs))

    def cpu(self):
        return self.to("cpu")

    def cuda(self, *args, **kwargs):
        return self._map(lambda d: d.cuda(*args, **kwargs))

    def double(self):
        return self.to(dtype=torch.float64)

    def float(self):
        return self.to(dtype=torch.float32)

    def half(self):
        return self.to(dtype=torch.float16)

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda

    def is_pinned(self) -> bool:
        return self.data.is_pinned()


def _lengths_list(lengths, who):
    if isinstance(lengths, Tensor):
        lengths = lengths._data
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1:
            raise ValueError(f"{who}: lengths must be a 1-D tensor or list, got {lengths.dim()}-D")
        lengths = lengths.tolist()
    return [int(n) for n in lengths]


def _batch_sizes(lengths):
    """``batch_sizes[t]`` = how many of the (sorted, decreasing) lengths exceed ``t``."""
    out, b = [], len(lengths)
    for t in range(lengths[0] if lengths else 0):
        while b and lengths[b - 1] <= t:
            b -= 1
        out.append(b)
    return out


def pack_padded_sequence(input, lengths, batch_first: bool = False, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch ``(T, B, *)`` (``(B, T, *)`` with ``batch_first``) of sequences of the
    given lengths; with ``enforce_sorted=False`` the lengths may come in any order."""
    who = "nn.utils.rnn.pack_padded_sequence"
    if not isinstance(input, Tensor):
        raise TypeError(f"{who}: input must be a tp.Tensor, got {type(input).__name__}")
    lens = _lengths_list(lengths, who)
    bdim = 0 if batch_first else 1
    if input.dim() < 2 or len(lens) != input.shape[bdim]:
        raise ValueError(f"{who}: expected {len(lens)} sequences along dim {bdim} of the input, got shape "
                         f"{list(input.shape)}")
    if enforce_sorted:
        if any(a < b for a, b in zip(lens, lens[1:])):
            raise RuntimeError(f"{who}: `lengths` array must be sorted in decreasing order when `enforce_sorted` "
                               f"is True (got {lens}). Pass enforce_sorted=False to pack unsorted sequences")
        sorted_indices = None
        order = list(range(len(lens)))
    else:
        _, perm = torch.sort(torch.as_tensor(lens, dtype=torch.int64), descending=True)
        order = perm.tolist()
        sorted_indices = _wrap(perm.to(input.device))
        lens = [lens[i] for i in order]
    if lens and lens[-1] <= 0:
        raise RuntimeError(f"{who}: every sequence must have a length > 0, got lengths {lens}")
    T = input.shape[1 - bdim]
    if lens and lens[0] > T:
        raise RuntimeError(f"{who}: a length ({lens[0]}) exceeds the padded sequence length {T}")
    sizes = _batch_sizes(lens)
    B = len(lens)
    # row (t, b) of the (T*B) or (B*T) flattening, for every step t and every sorted sequence it still has
    rows = [(t * B + order[i]) if not batch_first else (order[i] * T + t) for t, bs in enumerate(sizes)
            for i in range(bs)]
    flat = input.reshape(T * B, *input.shape[2:])
    data = _ops.index_select(flat, 0, _index(rows).to(input.device))
    return PackedSequence(data, _index(sizes), sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length=None):
    """The inverse of ``pack_padded_sequence``: ``(padded, lengths)`` with the batch in its original
    order and ``padding_value`` after each sequence's end (padded to ``total_length`` if given)."""
    who = "nn.utils.rnn.pad_packed_sequence"
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"{who}: expected a PackedSequence, got {type(sequence).__name__}")
    data = sequence.data
    sizes = sequence.batch_sizes.tolist()
    B, T = (sizes[0] if sizes else 0), len(sizes)
    if total_length is not None:
        if total_length < T:
            raise ValueError(f"{who}: Expected total_length to be at least the length of the longest sequence "
                             f"({T}), got total_length={total_length}")
        T_out = int(total_length)
    else:
        T_out = T
    # padded row (t, b) reads packed row offsets[t] + b, or the extra padding row past the data
    n = data.shape[0]
    rows, off = [], 0
    for bs in sizes:
        rows.append(list(range(off, off + bs)) + [n] * (B - bs))
        off += bs
    rows += [[n] * B] * (T_out - T)
    pad_row = _ops.full([1, *data.shape[1:]], padding_value, dtype=data.dtype, device=data.device)
    ext = _ops.cat([data, pad_row], 0)
    if batch_first:
        rows = [list(r) for r in zip(*rows)]
    flat = [i for r in rows for i in r]
    out_shape = (B, T_out) if batch_first else (T_out, B)
    padded = _ops.index_select(ext, 0, _index(flat).to(data.device)).reshape(*out_shape, *data.shape[1:])
    lengths = [sum(1 for bs in sizes if bs > b) for b in range(B)]
    lengths_t = _index(lengths)
    if sequence.unsorted_indices is not None:
        padded = _ops.index_select(padded, 0 if batch_first else 1, sequence.unsorted_indices)
        lengths_t = _index([lengths[i] for i in sequence.unsorted_indices.tolist()])
    return padded, lengths_t


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"):
    """Stack sequences ``(L_i, *)`` into ``(max L, B, *)`` (``(B, max L, *)`` with ``batch_first``),
    filling with ``padding_value`` on the ``padding_side`` ("right" or "left")."""
    who = "nn.utils.rnn.pad_sequence"
    if padding_side not in ("left", "right"):
        raise ValueError(f"{who}: padding_side must be 'left' or 'right', got {padding_side!r}")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError(f"{who}: received an empty list of sequences")
    trailing = tuple(sequences[0].shape[1:])
    for s in sequences:
        if tuple(s.shape[1:]) != trailing:
            raise RuntimeError(f"{who}: every sequence must have the trailing shape {list(trailing)}, got "
                               f"{list(s.shape)}")
    L = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        k = L - s.shape[0]
        if k:
            fill = _ops.full([k, *trailing], padding_value, dtype=s.dtype, device=s.device)
            s = _ops.cat([s, fill] if padding_side == "right" else [fill, s], 0)
        padded.append(s)
    return _ops.stack(padded, 0 if batch_first else 1)


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences ``(L_i, *)``; with ``enforce_sorted=True`` they must come longest first."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first: bool = False):
    """The list of sequences ``padded[:length_i, i]`` (the inverse of ``pad_sequence``)."""
    lens = _lengths_list(lengths, "nn.utils.rnn.unpad_sequence")
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [padded_sequences[i, :n] for i, n in enumerate(lens)]


def unpack_sequence(packed_sequences: PackedSequence):
    """The list of sequences packed in ``packed_sequences`` (the inverse of ``pack_sequence``)."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
