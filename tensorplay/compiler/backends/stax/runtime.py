"""Small run-time helpers the generated wrappers call."""
from __future__ import annotations

import ctypes
import sys

import torch

__all__ = ["assert_size_stride", "allocator", "take", "stash", "reinterpret", "as_layout", "KernelZeroDivisionError",
           "checked_kernel"]


class KernelZeroDivisionError(RuntimeError, ZeroDivisionError):
    """Integer division by zero in a compiled kernel.  Eager raises ``RuntimeError('...:
    ZeroDivisionError')``; this is both a RuntimeError (same handling as eager) and a
    ZeroDivisionError, and its message names the op."""


def checked_kernel(fn, lib):
    """``fn`` (a ctypes kernel) followed by a look at its library's error slot: a kernel that
    reported an error (``tp_report_error`` in stax_kernel.h) raises it here, after the call."""
    take = lib.tp_kernel_take_error
    take.restype = ctypes.c_char_p
    take.argtypes = []

    def call(*args):
        fn(*args)
        msg = take()
        if msg is not None:
            text = msg.decode()
            if text.startswith("IndexError: "):   # a checked data-dependent index (bounds.py)
                raise IndexError(text[len("IndexError: "):])
            raise (KernelZeroDivisionError if "ZeroDivisionError" in text else RuntimeError)(text)
    call.__name__ = getattr(fn, "__name__", "kernel")
    return call


def assert_size_stride(t, size, stride, offset=None, name="input"):
    """The artifact was generated for exactly this layout; anything else is an error (the guards
    should have caught it before)."""
    if tuple(t.shape) != size or tuple(t.stride()) != stride:
        raise AssertionError(f"Stax wrapper: {name} expected size {size} stride {stride}, "
                             f"got size {tuple(t.shape)} stride {tuple(t.stride())}")


def allocator(device):
    """``empty(size, stride, dtype)`` on ``device``: what a wrapper allocates its buffers with.
    ATen's allocation without torch's Python argument parsing where torch has it (the functions
    TorchInductor's wrappers call, ``torch._C._dynamo.guards._empty_strided_<device>``: about half
    the time of ``torch.empty_strided`` on the CPU), else ``torch.empty_strided``.  The CUDA one
    allocates on the *current* device: used only when that is ``device``."""
    dev = torch.device(device)
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    fast = getattr(guards, f"_empty_strided_{dev.type}", None)
    if dev.type == "cpu" and fast is not None:
        return fast
    if dev.type == "cuda" and fast is not None:
        index, current = dev.index or 0, torch._C._cuda_getDevice

        def empty(size, stride, dtype):
            if current() == index:
                return fast(size, stride, dtype)
            return torch.empty_strided(size, stride, dtype=dtype, device=dev)
        return empty

    def empty(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=dev)
    return empty


def take(spare, name, alloc, size, stride, dtype):
    """``name``'s buffer: the one a previous call of this wrapper left in ``spare`` (same plan, so
    same layout), else a new one from ``alloc`` (:func:`allocator`).  Reusing it across calls saves
    the page faults of fresh memory (docs/stax.md "Buffers kept between calls")."""
    t = spare.pop(name, None)
    return t if t is not None else alloc(size, stride, dtype)


def take_sized(spare, name, alloc, size, stride, dtype):
    """:func:`take` for a symbolic graph: the kept buffer is reused only when this call's sizes
    are the ones it was allocated with."""
    t = spare.pop(name, None)
    if t is not None and t.size() == size and t.stride() == stride:
        return t
    return alloc(size, stride, dtype)


def _probe(spare, name, t):      # called like stash(): the same references to t
    return sys.getrefcount(t)


def _lone_refs():
    t = torch.empty(0)
    return _probe(None, "", t)


_LONE = _lone_refs()   # getrefcount of a tensor held by one variable of stash's caller (interpreter-specific)


def stash(spare, name, t):
    """Keep an intermediate buffer, dead at the end of the call, for the next call -- only when
    nothing else can see it: no other tensor shares its storage (a view, an extern's alias:
    storage use count 1, plus the temporary storage object here) and no other Python reference
    holds the tensor (as many references as a tensor held by one variable of its caller)."""
    if sys.getrefcount(t) == _LONE and torch._C._storage_Use_Count(t.untyped_storage()._cdata) == 2:
        spare[name] = t


def reinterpret(t, size, stride, offset):
    """A view of ``t``: ``offset`` is relative to ``t``'s first element (its data_ptr)."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


def as_layout(t, size, stride, offset):
    """An extern/fallback result in the layout the kernels were generated for (size, stride): the
    kernels address it from its data_ptr, so a result with that size and those strides is used as
    it is, at any storage offset (an alias of an input, a slice of one).  Any other result is
    copied into a new allocation with the layout (``offset`` elements before its first element):
    strides of any order, zero strides included -- a dim of stride 0 is written once, as all its
    positions are one memory location -- and overlapping ones (an element per memory location
    is written, from the result's values there)."""
    if tuple(t.shape) == tuple(size) and tuple(t.stride()) == tuple(stride):
        return t
    extent = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else offset + 1
    out = torch.empty(extent, dtype=t.dtype, device=t.device).as_strided(size, stride, offset)
    dst, src = out, t
    for d, (n, st) in enumerate(zip(size, stride)):
        if st == 0 and n > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, 0, 1)
    if torch._debug_has_internal_overlap(dst) == 0:     # (0: no two elements share a location)
        dst.copy_(src)
    else:
        # overlapping strides: scatter the values through the storage index of each element
        where = torch.arange(extent, device=t.device).as_strided(size, stride, offset)
        out.as_strided((extent,), (1,), 0).index_copy_(0, where.reshape(-1), t.reshape(-1).to(out.dtype))
    return out
