"""Proxies: tensors that carry a graph node and a sample value (chapter §3.2–3.4).

A :class:`Proxy` *is* a ``tp.Tensor`` whose ``_data`` is the sample value — the real result when
capturing with ``execute=True``, a ``device='meta'`` tensor (shape, dtype, strides, no data) with
``execute=False`` — plus ``_node``, the graph node that computes it.  Every op on a proxy runs
through the eager dispatcher, which computes the sample and lets the tracer record the node.

Where Python needs a concrete value — ``bool(p)``, ``int(p)``, ``float(p)``, ``p.item()``,
``p.tolist()``, ``if``/``while`` on a proxy — the proxy evaluates its sample value and records a
**data gate** (node, conversion, outcome).  With ``execute=False`` there is no value and capture fails
with a :class:`CaptureError` naming the source line.
"""
from __future__ import annotations

import os
import sys

from ..._tensor import Tensor

__all__ = ["Proxy", "CaptureError", "user_frame"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CaptureError(RuntimeError):
    """Capture failed: the region is not compiled (there are no graph breaks, §11.3)."""


def _internal(filename: str) -> bool:
    return filename.startswith("<tensorplay") or filename.startswith("<tp ") or \
        os.path.abspath(filename).startswith(_PKG_DIR)


def user_frame():
    """(filename, lineno, source line) of the innermost frame outside the tensorplay package."""
    f = sys._getframe(1)
    while f is not None and _internal(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0, "")
    import linecache
    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return (f.f_code.co_filename, f.f_lineno, line)


def where() -> str:
    fn, ln, src = user_frame()
    return f"{os.path.basename(fn)}:{ln}: `{src}`"


class Proxy(Tensor):
    _node = None
    _tracer = None
    _fake = None     # dynamic=True: the symbolic fake tensor of the shadow run (symbolic.py)

    # with dynamic=True, Python reads the symbolic sizes: torch.SymInts that behave like ints and
    # record shape guards when a branch depends on them
    @property
    def shape(self):
        f = self._fake
        return self._data.shape if f is None else f.shape

    def size(self, dim=None):
        f = self._fake
        if f is None:
            return super().size(dim)
        return f.shape if dim is None else f.size(dim)

    def stride(self, dim=None):
        f = self._fake
        if f is None:
            return super().stride(dim)
        return f.stride() if dim is None else f.stride(dim)

    def numel(self):
        f = self._fake
        return self._data.numel() if f is None else f.numel()

    nelement = numel

    def _gate(self, kind, convert):
        tr = self._tracer
        if tr is None or not tr.active:
            return convert(self._data)
        return tr.gate(self, kind, convert)

    def __bool__(self):
        if self._data.numel() != 1:
            return super().__bool__()
        return self._gate("bool", lambda d: bool(d))

    def item(self):
        if self._data.numel() != 1:
            return super().item()
        return self._gate("item", lambda d: d.item())

    def __int__(self):
        return self._gate("int", lambda d: int(d.item()))

    def __float__(self):
        return self._gate("float", lambda d: float(d.item()))

    def __index__(self):
        return self._gate("index", lambda d: int(d.item()))

    def tolist(self):
        return self._gate("tolist", lambda d: d.tolist())

    def numpy(self, *, force=False):
        raise CaptureError(f"numpy() on a traced tensor at {where()}: values leave the graph; not capturable")

    def __array__(self, dtype=None, copy=None):
        raise CaptureError(f"conversion to numpy of a traced tensor at {where()}: not capturable")

    def detach(self):
        # through the op table, so the graph records it: a detached input is read on every call,
        # not frozen at the capture run's value
        from ...ops.registry import OPS
        return OPS["detach"].fn(self)

    def backward(self, *a, **k):
        raise CaptureError(f"backward() inside a compiled region at {where()} is not supported; call it on the "
                           f"compiled function's output")

    def __repr__(self):
        n = self._node.name if self._node is not None else "?"
        return f"Proxy({n}: {str(self.dtype).replace('torch.', '')}{list(self.shape)})"
