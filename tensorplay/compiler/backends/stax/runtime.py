"""Small run-time helpers the generated wrappers call."""
from __future__ import annotations

import ctypes

import torch

__all__ = ["assert_size_stride", "empty_strided", "ptr", "reinterpret", "as_layout", "KernelZeroDivisionError",
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


def empty_strided(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


def ptr(t):
    """A tensor's data pointer as a C ``void*`` (ctypes would truncate a bare int to 32 bits)."""
    return ctypes.c_void_p(t.data_ptr())


def reinterpret(t, size, stride, offset):
    """A view of ``t``: ``offset`` is relative to ``t``'s first element (its data_ptr)."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


def as_layout(t, size, stride, offset):
    """An extern/fallback result in the layout the kernels were generated for (copy if ATen
    chose another layout)."""
    if tuple(t.shape) == tuple(size) and tuple(t.stride()) == tuple(stride) and t.storage_offset() == offset:
        return t
    extent = offset + 1 + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else offset + 1
    out = torch.empty(extent, dtype=t.dtype, device=t.device).as_strided(size, stride, offset)
    out.copy_(t)
    return out
