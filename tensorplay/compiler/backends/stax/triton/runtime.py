"""Loading and launching the Triton kernels of a wrapper (the chapter, §9.9 and §11.2; issue 18 §4).

The wrapper module of a graph (codegen/wrapper.py) defines each Triton kernel with
:func:`load_kernel` -- its source goes through the content-addressed cache (codecache.load_py:
``<TP_CACHE_DIR>/<key>/triton.py``, readable, experiment 2) and is imported from there, so that
``triton.jit`` finds the source it compiles -- and launches it through a small function of the
wrapper (backend.py) on the *current* CUDA stream (Triton's launcher asks torch for it); nothing
here synchronises.  Triton's own artefact cache (the compiled cubins, keyed by the source, the
Triton version, the device's capability and the launch options) is put under the same folder
(``<TP_CACHE_DIR>/triton``) unless ``TRITON_CACHE_DIR`` names another.

On CPU tensors the kernels run in Triton's interpreter (``interpret=True``), with interpret.py's
``libdevice``; the cached source differs from the GPU's in that import line and in a symbolic
row length ``rnumel`` being a constexpr (the interpreter's loops need a Python int).  The interpreter
is Triton's mode for the whole process, fixed when Triton is imported (``TRITON_INTERPRET=1``):
loading an interpreted kernel sets it when Triton is not imported yet, and raises
:class:`InterpreterRequired` when Triton was imported without it.

Guarantee: a kernel is loaded once per process and source (memoised by key); the loaded function
is Triton's own ``JITFunction`` (or ``InterpretedFunction``), launched as ``kernel[grid](...)``.
"""
from __future__ import annotations

import os
import sys

from .. import codecache

__all__ = ["load_kernel", "InterpreterRequired", "cdiv", "checked_launch", "Launcher", "GPU_LIBDEVICE", "INTERPRETER_LIBDEVICE", "triton_version"]

#: the import line of every generated kernel module ...
GPU_LIBDEVICE = "from triton.language.extra import libdevice"
#: ... and what it becomes in an interpreted one
INTERPRETER_LIBDEVICE = "from tensorplay.compiler.backends.stax.triton.interpret import libdevice"

_cache_set = False


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of non-negative ints (a launch grid)."""
    return -(-a // b)


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return triton.__version__


def _use_our_cache(triton):
    """Triton's artefact cache under TP_CACHE_DIR (once; TRITON_CACHE_DIR, when set, wins)."""
    global _cache_set
    if _cache_set:
        return
    _cache_set = True
    if not os.environ.get("TRITON_CACHE_DIR"):
        try:
            triton.knobs.cache.dir = str(codecache.cache_dir() / "triton")
        except AttributeError:     # (an older Triton without knobs: its default folder)
            pass


class InterpreterRequired(RuntimeError):
    """Triton kernels for CPU tensors need Triton's interpreter, chosen when Triton is imported."""


def _import_triton(interpret: bool):
    """Triton, in interpreter mode for ``interpret``: ``TRITON_INTERPRET=1`` is set here when Triton
    is not imported yet (its standard library is decorated in that mode at import time: an
    interpreted kernel cannot call a compiled ``tl.sum``); raises InterpreterRequired when it was
    imported without it."""
    if interpret and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton
    if interpret and not triton.knobs.runtime.interpret:
        raise InterpreterRequired(
            "Stax's Triton backend runs CPU tensors in Triton's interpreter, but triton was imported without "
            "it: set TRITON_INTERPRET=1 before triton is imported (or let tensorplay import triton first)")
    return triton


def load_kernel(source: str, name: str, interpret: bool = False):
    """The Triton kernel ``name`` defined by ``source`` (a generated kernel module)."""
    triton = _import_triton(interpret)
    _use_our_cache(triton)
    if interpret:
        source = source.replace(GPU_LIBDEVICE, INTERPRETER_LIBDEVICE, 1)
        # the interpreter cannot loop to an argument (a 1-element array): a symbolic row length is a
        # constexpr there
        source = source.replace(", rnumel, XBLOCK: tl.constexpr", ", rnumel: tl.constexpr, XBLOCK: tl.constexpr", 1)
    return getattr(codecache.load_py(source, "triton"), name)


def checked_launch(kernel, grid, *args, **config):
    """Launch an interpreted kernel that checks data-dependent indices (``tl.device_assert``, compiled
    by ``@triton.jit(debug=True)``): the interpreter runs its asserts in debug mode only, and a
    failed one is raised as the error its message names (``IndexError: tp.gather: ...``), as eager
    raises it.  (On a GPU a failed device assert is a CUDA error of the launch, as in eager.)"""
    import dataclasses

    from triton.runtime.interpreter import interpreter_builder
    prev = interpreter_builder.options
    interpreter_builder.options = dataclasses.replace(prev, debug=True)
    try:
        kernel[grid](*args, **config)
    except Exception as e:  # noqa: BLE001 -- the interpreter wraps the AssertionError
        text = str(e)
        for name, exc in (("IndexError: ", IndexError), ("RuntimeError: ", RuntimeError)):
            at = text.find(name)
            if at >= 0:
                raise exc(text[at + len(name):].rstrip("\"')")) from None
        raise
    finally:
        interpreter_builder.options = prev


def _spec(a):
    """What Triton specialises a kernel argument on (runtime/jit.py's binder): a tensor by the
    16-byte alignment of its data, an int by ``== 1``, divisibility by 16 and its width."""
    if isinstance(a, int):
        return (a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31)
    return a.data_ptr() % 16 == 0


class Launcher:
    """A Triton kernel with its launch configuration, launched at low cost (the call overhead of
    §9.9 and §11.2): the first call of each argument specialisation goes through Triton's JIT
    (``kernel[grid](...)``: it compiles, or finds its artefact in the cache, and launches); later
    calls launch the compiled kernel directly on the current stream -- Triton's binder, cache-key
    computation and hook look-ups are skipped (about 15 µs a launch on an H200 host).
    ``constexprs``: the values of the kernel's trailing constexpr parameters (XBLOCK, RBLOCK),
    passed positionally as the compiled launcher expects them."""

    __slots__ = ("kernel", "config", "constexprs", "compiled", "_stream", "_device")

    def __init__(self, kernel, config: dict, constexprs: tuple):
        self.kernel, self.config, self.constexprs = kernel, config, tuple(constexprs)
        self.compiled = {}
        self._stream = self._device = None

    def __call__(self, grid, *args):
        key = tuple(_spec(a) for a in args)
        c = self.compiled.get(key)
        if c is None:
            self.compiled[key] = self.kernel[grid](*args, **self.config)
            import torch
            self._device = torch.cuda.current_device()
            self._stream = torch._C._cuda_getCurrentRawStream
            return
        from triton import knobs
        if knobs.runtime.launch_enter_hook is not None:      # a profiler listens: Triton's own path
            self.kernel[grid](*args, **self.config)
            return
        c.run(grid[0], 1, 1, self._stream(self._device), c.function, c.packed_metadata, None, None, None,
              *args, *self.constexprs)
