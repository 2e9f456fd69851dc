"""The event recorder of a running profile (seed 001 §1-2): spans, marks and what they carry.

A :class:`Recorder` holds what one ``tp.profiler.profile`` saw while it was active:

* **spans** -- ``(name, category, start, end, thread, args)`` with wall-clock nanoseconds
  (``time.time_ns``: the clock torch's profiler (Kineto) stamps its events with, so both kinds of
  event share one time axis).  Categories: ``op`` (an eager op), ``backward`` (an autograd node),
  ``optimizer`` (an optimizer step), ``compile`` (a compile phase, a compiler run, a cache hit),
  ``kernel`` (a Stax kernel call), ``wrapper`` (a compiled graph's call), ``user``
  (``record_function``);
* **storage marks** -- ``(time, device, data pointer, category)``: what a storage turned out to be
  (a parameter, an optimizer state, a gradient, an activation saved for backward, an input); the
  memory timeline (memory.py) gives each allocation the category marked on it.

:func:`span` is what instrumented code calls: with no profile running it returns one shared
``nullcontext`` (a global read and a call), so compile phases can be instrumented at no cost that
matters; the hot paths (eager op dispatch, a compiled call) are not instrumented at all -- the
profile installs its hooks when it starts and removes them when it stops (hooks.py).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time

__all__ = ["Span", "Recorder", "span", "active", "mark_storage"]


class Span:
    """One timed event: nanoseconds ``start``/``end`` (None while open), the native thread id
    ``tid``, ``args`` (shown in the trace's details)."""
    __slots__ = ("name", "cat", "start", "end", "tid", "args", "id")

    def __init__(self, name, cat, start, tid, args, id):
        self.name, self.cat, self.start, self.end, self.tid, self.args, self.id = name, cat, start, None, tid, args, id

    @property
    def dur(self) -> int:
        """Nanoseconds (0 while open)."""
        return 0 if self.end is None else self.end - self.start

    def __repr__(self):
        return f"Span({self.name!r}, {self.cat!r}, {self.dur / 1e3:.1f} us)"


#: the Recorder of the profile that is recording now (None: no profile, or one between its steps)
_ACTIVE = None
_NULL = contextlib.nullcontext()


def active():
    """The recording Recorder, or None."""
    return _ACTIVE


def set_active(rec) -> None:
    global _ACTIVE
    _ACTIVE = rec


class _SpanContext:
    __slots__ = ("rec", "span")

    def __init__(self, rec, name, cat, args):
        self.rec = rec
        self.span = rec.begin(name, cat, args)

    def __enter__(self):
        return self.span

    def __exit__(self, *exc):
        self.rec.end(self.span)
        return False


def span(name: str, cat: str = "user", **args):
    """A context manager timing its block as a span of the running profile; a do-nothing context
    (entering it gives None) when none records.  ``args`` are shown with the span."""
    rec = _ACTIVE
    if rec is None:
        return _NULL
    return _SpanContext(rec, name, cat, args)


def mark_storage(t, category: str) -> None:
    """Record that the storage of tensor ``t`` (a tp.Tensor or torch.Tensor) is of ``category``
    (no-op without a profile)."""
    rec = _ACTIVE
    if rec is not None:
        rec.mark(t, category)


class Recorder:
    """What one profile records (module doc).  Thread-safe appends (list.append is atomic)."""

    def __init__(self, record_shapes=False, with_stack=False):
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self.spans: list[Span] = []
        self.marks: list[tuple] = []      # (time ns, device str, data_ptr, nbytes, category)
        self.collectives: dict = {}       # (op name, ranks) -> calls so far (hooks._collective_args)
        self.started = time.time_ns()
        self._ids = itertools.count(1)
        self._local = threading.local()

    def begin(self, name, cat, args=None) -> Span:
        s = Span(name, cat, time.time_ns(), threading.get_native_id(), dict(args) if args else {}, next(self._ids))
        self.spans.append(s)
        return s

    def end(self, s: Span) -> None:
        s.end = time.time_ns()

    def add(self, name, cat, start, end, args=None) -> Span:
        """A span measured by the caller (nanoseconds on the ``time.time_ns`` clock)."""
        s = Span(name, cat, start, threading.get_native_id(), dict(args) if args else {}, next(self._ids))
        s.end = end
        self.spans.append(s)
        return s

    @property
    def stack(self) -> list:
        """This thread's stack of open (key, span) pairs (the op hooks' nesting)."""
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def mark(self, t, category) -> None:
        d = getattr(t, "_data", t)
        try:
            st = d.untyped_storage()
        except (AttributeError, RuntimeError, NotImplementedError):
            return
        n = st.nbytes()
        if d.device.type == "meta" or not isinstance(n, int) or n == 0:
            return
        self.marks.append((time.time_ns(), str(d.device), st.data_ptr(), n, category))

    def close(self) -> None:
        """End the spans left open (an op that raised, a profile stopped inside a span)."""
        now = time.time_ns()
        for s in self.spans:
            if s.end is None:
                s.end = now
