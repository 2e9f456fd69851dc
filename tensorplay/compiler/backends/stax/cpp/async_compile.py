"""Parallel compilation of the kernels of one wrapper module (chapter §11.2).

A generated wrapper module submits every kernel at its top level and waits once at the end::

    from tensorplay.compiler.backends.stax.cpp.async_compile import AsyncCompile
    async_compile = AsyncCompile()
    kernel0 = async_compile.cpp('''extern "C" void kernel0(float* x, long n) {...}''', 'kernel0')
    kernel1 = async_compile.cpp('''...''', 'kernel1')
    async_compile.wait(globals())      # kernel0, kernel1 are now ctypes functions (restype None)

``cpp`` hands the compilation to a shared thread pool and returns a placeholder at once; ``wait``
replaces every placeholder in the given namespace by the compiled function.  Loading the module is
thus "submit everything, then wait once": a greedy list schedule of the n compilations on P workers,
whose makespan T obeys max(sum c_i / P, max c_i) <= T <= sum c_i / P + max c_i (Prop. 11.2).

Threads suffice for C++: a worker spends its time waiting for the g++ subprocess, without the GIL.
(Triton compilation runs largely in Python and would need a process pool.)

Configuration (tensorplay/compiler/config.py): ``stax.compile_threads`` (``TP_COMPILE_THREADS``)
= pool size (default ``os.cpu_count()``); ``0`` compiles synchronously inside ``cpp`` (errors are
then raised there, which is convenient for debugging).  ``stax.compile_progress``
(``TP_COMPILE_PROGRESS``): a ``wait`` still waiting after ``stax.compile_progress_delay_s`` seconds
shows a tqdm bar of kernels compiled / total on stderr -- by default (``auto``) only when stderr is a
terminal; ``1`` shows it in non-interactive runs too, ``0`` never.
Cache hits never reach the pool: a kernel already loaded in this process resolves immediately, and
one on disk costs a checksum and a ``dlopen`` in a worker.

The C++ wrapper (wrapper.py) compiles one translation unit per graph with
:meth:`AsyncCompile.cpp_library` (the placeholder resolves to the whole library, not one function)
and builds its call extension concurrently with :meth:`AsyncCompile.submit`.
"""
from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

from .... import config
from .. import codecache
from . import build
from .build import CppCompileError
from .....profiler.recorder import span

__all__ = ["AsyncCompile", "CppKernelFuture", "compile_threads", "shutdown_pool"]


def compile_threads() -> int:
    """Pool size: ``stax.compile_threads`` (``$TP_COMPILE_THREADS``) if set (0 = synchronous), else
    ``os.cpu_count()``."""
    n = config.get("stax.compile_threads")
    if n is not None:
        if n < 0:
            raise ValueError(f"TP_COMPILE_THREADS={n} (stax.compile_threads) must be >= 0")
        return n
    return os.cpu_count() or 1


def show_progress() -> bool:
    """``stax.compile_progress`` (``$TP_COMPILE_PROGRESS``): ``1`` always, ``0`` never, ``auto``
    (default) when stderr is a terminal."""
    env = config.get("stax.compile_progress")
    if env == "auto":
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return env == "1"


def _progress(futures, desc: str):
    """Iterate over ``futures`` as they finish, behind a tqdm bar that appears only after
    ``stax.compile_progress_delay_s`` seconds (short compiles stay silent; nothing when progress is
    off or tqdm is not installed)."""
    if not show_progress() or all(f.done() for f in futures):
        return iter(futures)
    try:
        from tqdm import tqdm
    except ImportError:
        return iter(futures)
    return tqdm(as_completed(futures), total=len(futures), desc=desc, unit="kernel",
                delay=config.get("stax.compile_progress_delay_s"), leave=False, file=sys.stderr)


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _get_pool(n: int) -> ThreadPoolExecutor:
    """The shared pool (recreated if the requested size changed)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != n:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="tp_compile")
            _pool_size = n
            if old is not None:
                old.shutdown(wait=False)  # its queued work still finishes
        return _pool


def shutdown_pool(wait: bool = True) -> None:
    """Shut the shared pool down (a later ``cpp`` creates a new one)."""
    global _pool, _pool_size
    with _pool_lock:
        pool, _pool, _pool_size = _pool, None, 0
    if pool is not None:
        pool.shutdown(wait=wait)


def _after_fork_in_child() -> None:  # the parent's worker threads do not exist in the child
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _chain(src: Future, dst: Future) -> None:
    """``dst`` gets ``src``'s result or exception when it has one."""
    def done(f):
        e = f.exception()
        if e is not None:
            dst.set_exception(e)
        else:
            dst.set_result(f.result())
    src.add_done_callback(done)


def unit_source(sources) -> str:
    """One translation unit of several kernel sources (each an ``#include "stax_kernel.h"`` and
    ``extern "C"`` functions of distinct names; the header is ``#pragma once``)."""
    return "\n".join(f"// ---- kernel {k} of the unit\n{src}" for k, src in enumerate(sources))


def _build_unit(members) -> None:
    """Build the kernels ``members`` ((placeholder, future) of one ISA and flags) as one library;
    if that fails, each alone (its own error for its own future)."""
    ph0 = members[0][0]
    try:
        lib = build.load_cpp(unit_source([ph.source for ph, _ in members]), ph0.isa, ph0.extra)
    except Exception:   # noqa: BLE001 - each kernel rebuilt alone reports its own failure
        lib = None
    for ph, fut in members:
        if lib is not None:
            fut.set_result(lib)
            continue
        try:
            fut.set_result(build.load_cpp(ph.source, ph.isa, ph.extra))
        except BaseException as e:  # noqa: BLE001 - delivered by the placeholder's result()
            fut.set_exception(e)


class CppKernelFuture:
    """Placeholder for a kernel being compiled; :meth:`result` gives the ctypes function (with
    ``entry``: a function of the data pointers as ints that runs the entry; with ``whole``: the
    library)."""

    __slots__ = ("name", "source", "isa", "_future", "_fn", "extra", "whole", "entry", "_ext", "_owner")

    def __init__(self, name: str, source: str, isa: str, future: Future, extra=(), whole=False, entry=None,
                 ext=None, owner=None):
        self.name, self.source, self.isa, self._future, self._fn = name, source, isa, future, None
        self.extra, self.whole = tuple(extra), whole   # whole: resolve to the library itself
        self.entry = entry    # an entry on a pointer array: resolve to a call of it with data pointers
        self._ext = ext       # the call extension's load, submitted next to the kernel's build
        self._owner = owner   # the AsyncCompile whose batch (not yet submitted) holds this kernel

    def done(self) -> bool:
        return self._future.done()

    def result(self):
        """Wait for the library and return ``getattr(lib, name)`` with ``restype = None``.

        A failure is raised as :class:`CppCompileError` naming the kernel."""
        if self._fn is not None:
            return self._fn
        if self._owner is not None:    # still in its module's batch: submit the batch now
            self._owner.flush()
        try:
            lib = self._future.result()
        except CppCompileError as e:
            raise e.with_kernel_name(self.name) from e
        except Exception as e:
            raise CppCompileError(f"compiling failed: {type(e).__name__}: {e}",
                                  kernel_name=self.name) from e
        if self.whole:
            self._fn = lib
            return lib
        if self.entry is not None:
            # fn(ptr0, ptr1, ...) with the data pointers as ints, through the call extension of
            # the C++ wrapper (ctypes if it cannot be built): ~2.5x less time per call than a
            # ctypes kernel with c_void_p arguments, and few cache lines when the caches are cold
            import functools

            from .call import bind_entries
            call, (entry,) = bind_entries(lib, self._ext, (self.entry,), checked="tp_report_error(" in self.source)
            self._fn = functools.partial(call, entry)
            return self._fn
        try:
            fn = getattr(lib, self.name)
        except AttributeError:
            key = build.cpp_key(self.source, self.isa, self.extra)
            raise CppCompileError(
                f"the compiled library has no function {self.name!r} "
                f"(is it declared extern \"C\"?)",
                source_path=codecache.entry_dir(key) / "kernel.cpp",
                kernel_name=self.name) from None
        fn.restype = None
        if "tp_report_error(" in self.source:   # the kernel can fail at run time (stax_kernel.h)
            from ..runtime import checked_kernel
            fn = checked_kernel(fn, lib)
        self._fn = fn
        return fn

    def __call__(self, *args):
        """Calling a placeholder waits for it (wrappers normally call ``wait`` first)."""
        return self.result()(*args)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<CppKernelFuture {self.name!r} ({state})>"


class AsyncCompile:
    """Submit kernels with :meth:`cpp`, then resolve them all with :meth:`wait`.

    **Batches**: the kernels of a Python wrapper (``cpp(..., entry=)``) that are not loaded yet
    are held until :meth:`wait` (or until one is needed: :meth:`flush`).  If there are more of
    them than pool workers, they are compiled as one translation unit per worker (kernels split
    by source size, longest first onto the least-loaded unit, each unit in the wrapper's order),
    so g++ starts, and parses stax_kernel.h, once per worker instead of once per kernel; a unit
    that fails is rebuilt kernel by kernel, so the error names its kernel.  A unit is
    content-addressed like a kernel: the same wrapper (a warm process) finds the same units."""

    _ext = None   # the call extension's load, submitted with this module's first entry kernel

    def __init__(self):
        self._batch: list = []     # (placeholder, its future) of the held entry kernels

    def flush(self) -> None:
        """Submit the held kernels: one build each when they are no more than the pool's workers,
        else one translation unit per worker."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        for ph, _ in batch:
            ph._owner = None
        n = compile_threads()
        if len(batch) <= n or len({(ph.isa, ph.extra) for ph, _ in batch}) > 1:
            for ph, fut in batch:
                _chain(_get_pool(n).submit(build.load_cpp, ph.source, ph.isa, ph.extra), fut)
            return
        units, load = [[] for _ in range(n)], [0] * n
        for k in sorted(range(len(batch)), key=lambda k: -len(batch[k][0].source)):
            u = min(range(n), key=lambda j: (load[j], j))
            units[u].append(k)
            load[u] += len(batch[k][0].source)
        for unit in units:
            if unit:
                members = [batch[k] for k in sorted(unit)]
                _get_pool(n).submit(_build_unit, members)

    def cpp(self, source: str, name: str, *, extra=(), whole: bool = False, entry: str | None = None) -> CppKernelFuture:
        """Start compiling ``source`` (which defines ``extern "C" void <name>(...)``).

        ``extra``: additional compile flags (part of the key); ``whole=True``: the placeholder
        resolves to the loaded library (``name`` then only labels errors); ``entry``: the source
        also defines ``extern "C" void <entry>(void* const* p)`` (cpp/wrapper.py: kernel_entry)
        and the placeholder resolves to a function of the data pointers as ints that calls it."""
        isa = build.cpu_isa()  # resolved here, once, not by racing workers
        ext = None
        if entry is not None:   # the call extension builds (first time only) while the kernel does
            if self._ext is None:
                from .call import submit_call_extension
                self._ext = submit_call_extension(self)
            ext = self._ext
        fut: Future = Future()
        n = compile_threads()
        if n == 0:
            try:
                fut.set_result(build.load_cpp(source, isa, extra))
            except BaseException as e:  # noqa: BLE001 - re-raised just below with the name
                fut.set_exception(e)
            ph = CppKernelFuture(name, source, isa, fut, extra, whole, entry, ext)
            ph.result()  # synchronous mode: raise now, at the kernel's line in the wrapper
            return ph
        key = build.cpp_key(source, isa, extra)
        lib = build._libs.get(key)
        if lib is not None:  # already loaded in this process: no trip through the pool
            codecache._count("build_hits")
            with span(f"cpp cache hit {name}", "compile", where="memory", key=key[:16]):
                fut.set_result(lib)
        elif entry is not None:    # a wrapper's kernel: held for a batch (flush)
            ph = CppKernelFuture(name, source, isa, fut, extra, whole, entry, ext, owner=self)
            self._batch.append((ph, fut))
            return ph
        else:
            fut = _get_pool(n).submit(build.load_cpp, source, isa, extra)
        return CppKernelFuture(name, source, isa, fut, extra, whole, entry, ext)

    def cpp_library(self, source: str, label: str, *, extra=()) -> CppKernelFuture:
        """Like :meth:`cpp`, but :meth:`wait` puts the loaded library (a ``ctypes.CDLL``) in
        place of the placeholder: for a translation unit with several entry points."""
        return self.cpp(source, label, extra=extra, whole=True)

    def submit(self, fn, *args) -> Future:
        """Run ``fn(*args)`` in the compile pool (synchronously with ``TP_COMPILE_THREADS=0``);
        returns a ``concurrent.futures.Future``, which :meth:`wait` leaves alone."""
        n = compile_threads()
        if n == 0:
            fut: Future = Future()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - delivered by fut.result()
                fut.set_exception(e)
            return fut
        return _get_pool(n).submit(fn, *args)

    def wait(self, scope: dict) -> None:
        """Replace every :class:`CppKernelFuture` value in ``scope`` (e.g. ``globals()``) by its
        compiled function.  Waits for all of them; the first failure is raised (naming the
        kernel), with the names of any other failed kernels appended."""
        self.flush()
        pending = [(k, v) for k, v in list(scope.items()) if isinstance(v, CppKernelFuture)]
        for _ in _progress([ph._future for _, ph in pending], "tp.compile: kernels"):
            pass
        errors = []
        for k, ph in pending:
            try:
                scope[k] = ph.result()
            except CppCompileError as e:
                errors.append(e)
        if errors:
            first = errors[0]
            if len(errors) > 1:
                others = ", ".join(repr(e.kernel_name) for e in errors[1:])
                first.message += f" (also failed: {others})"
                first.args = (first._text(),)
            raise first
