"""Loading and launching the Triton kernels of a wrapper (the chapter, §9.9 and §11.2).

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

import contextlib
import os
import sys

from .. import codecache
from .....profiler.recorder import span

__all__ = ["load_kernel", "InterpreterRequired", "cdiv", "checked_launch", "Launcher", "tuning_space", "precompile", "GPU_LIBDEVICE", "INTERPRETER_LIBDEVICE", "triton_version"]

#: the import line of every generated kernel module ...
GPU_LIBDEVICE = "from triton.language.extra import libdevice"
#: ... and what it becomes in an interpreted one
INTERPRETER_LIBDEVICE = "from tensorplay.compiler.backends.stax.triton.interpret import libdevice"

_cache_set = False
_NO_SPAN = contextlib.nullcontext()


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
    with span(f"triton load {name}", "compile"):
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


def _hooked(hook) -> bool:
    """Whether a launch hook listens: Triton 3.6's knobs hold a ``HookChain`` that is never None (a
    chain without calls is silent), earlier ones a function or None."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _launch_entry(c):
    """(launch function, kernel handle, the arguments between them and the kernel's) of a compiled
    kernel ``c``, launched with no hooks: the C launcher itself when the kernel needs no scratch
    memory (Triton's Python ``CudaLauncher.__call__`` only allocates scratch, then calls it), else
    that Python launcher."""
    run = c.run
    raw = getattr(run, "launch", None)
    if raw is not None and getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0 \
            and hasattr(run, "launch_cooperative_grid") and hasattr(run, "launch_pdl"):
        return raw, c.function, (run.launch_cooperative_grid, run.launch_pdl, None, None, c.packed_metadata,
                                 None, None, None)
    return run, c.function, (c.packed_metadata, None, None, None)


class Launcher:
    """A Triton kernel with its launch configuration, launched at low cost (the call overhead of
    §9.9 and §11.2): the first call of each argument specialisation goes through Triton's JIT
    (``kernel[grid](...)``: it compiles, or finds its artefact in the cache, and launches); later
    calls launch the compiled kernel directly on the current stream -- Triton's binder, cache-key
    computation and hook look-ups are skipped.  The grid is ``cdiv(xnumel, XBLOCK)`` programs of
    the configuration's XBLOCK; the kernel's trailing constexpr parameters (XBLOCK, RBLOCK) are
    passed positionally, as the compiled launcher expects them.

    ``tune`` (``max-autotune``, autotune.method_for_options): before the first launch of a
    specialisation the configuration is searched over :func:`tuning_space` around the heuristic's
    (autotune.autotune: coordinate descent and/or random search, timed with CUDA events, the winner
    stored in the content-addressed cache under the kernel's source, the device, Triton's version
    and the sizes: a new process launches the tuned config without measuring).  Tuning runs the
    kernel on the call's own arguments (its outputs are written again; its inputs are only read)."""

    __slots__ = ("kernel", "config", "tune", "persistent", "compiled", "_stream", "_device", "tuned", "_knobs",
                 "grid", "constexprs")

    def __init__(self, kernel, config: dict, tune: str | None = None, persistent: bool = False, grid=None,
                 constexprs=("XBLOCK", "RBLOCK", "YBLOCK")):
        self.kernel, self.config, self.tune, self.persistent = kernel, dict(config), tune, persistent
        #: a fixed grid (a template: its tiles), else computed from the numel and the blocks
        self.grid, self.constexprs = grid, tuple(constexprs)
        self.compiled = {}
        self._stream = self._device = None
        self.tuned = None            # the autotune.Tuned result, once tuned

    def _blocks(self, config):
        return tuple(config[k] for k in self.constexprs if k in config)

    def _grid(self, numel, cfg):
        """Programs of a launch: ``numel`` is the element (row) count, or (rows, columns) of a tiled
        kernel; a template's grid is fixed."""
        if self.grid is not None:
            return self.grid
        if isinstance(numel, list):        # an explicit grid of this launch (matmul.py's runners)
            return numel[0]
        if isinstance(numel, tuple):
            return cdiv(numel[0], cfg["YBLOCK"]) * cdiv(numel[1], cfg["XBLOCK"])
        return cdiv(numel, cfg["XBLOCK"])

    def __call__(self, xnumel, *args):
        # One pass: each tensor's data pointer (an int: the C launcher then neither calls data_ptr()
        # again nor asks the driver about the pointer) and the specialisation key -- what Triton's
        # binder (runtime/jit.py) specialises on: a pointer's 16-byte alignment, an int's == 1,
        # divisibility by 16 and width.
        vals, key = [], []
        for a in args:
            c = a.__class__
            if c is int:
                vals.append(a)
                key.append((a == 1, a % 16 == 0, -2147483648 <= a < 2147483648))
            elif c is float or c is bool or a is None:
                vals.append(a)
                key.append(c)
            else:
                p = a.data_ptr()
                vals.append(p)
                key.append(p % 16 == 0)
        key = tuple(key)
        hit = self.compiled.get(key)
        hook = None if hit is None else self._knobs.launch_enter_hook
        if hit is None or (hook is not None and getattr(hook, "calls", True)):    # (_hooked, inline)
            return self._jit_launch(xnumel, args, key if hit is None else None)
        run, function, middle, blocks, xblock = hit
        grid = self.grid if self.grid is not None else \
            (-(-xnumel // xblock) if xnumel.__class__ is int else self._grid(xnumel, self.config))
        run(grid, 1, 1, self._stream(self._device), function, *middle, *vals, *blocks)

    def _jit_launch(self, xnumel, args, first):
        """A launch through Triton's JIT: the first of a specialisation (``first``: its key; tuned
        first under ``tune``; the compiled kernel's launcher, function handle, metadata and trailing
        constexprs are kept under the key for the direct launches), or any launch while a launch hook
        listens (a profiler; ``first`` None)."""
        if first is not None and self.tune and self.tuned is None:
            self._autotune(xnumel, args)
        cfg = self.config
        with span(f"triton jit {getattr(self.kernel, '__name__', 'kernel')}", "compile") if first is not None else _NO_SPAN:
            c = self.kernel[(self._grid(xnumel, cfg),)](*args, **cfg)
        if first is not None:
            import torch
            from triton import knobs
            self._device = torch.cuda.current_device()
            self._stream = torch._C._cuda_getCurrentRawStream
            self._knobs = knobs.runtime
            self.compiled[first] = (*_launch_entry(c), self._blocks(cfg), cfg.get("XBLOCK"))

    def _autotune(self, xnumel, args):
        import torch

        from . import autotune as at
        space, valid = tuning_space(self.config, xnumel, self.persistent)
        dev = next((a.device for a in args if hasattr(a, "device")), torch.device("cuda"))
        key = at.tuning_key(self.kernel.src, at.device_description(dev), xnumel,
                            [tuple(a.shape) if hasattr(a, "shape") else a for a in args])

        def launch(cfg):
            self.kernel[(self._grid(xnumel, cfg),)](*args, **cfg)
        self.tuned = at.autotune(key, self.config, space, at.launch_timer(launch, device=dev), self.tune,
                                 valid=valid, desc=f"tuning {getattr(self.kernel, '__name__', 'kernel')}")
        if self.tuned.seconds != float("inf"):
            self.config = dict(self.tuned.config)


#: the values a tuning search may give each launch parameter (powers of two: tl.arange's rule)
TUNE_XBLOCK = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TUNE_RBLOCK = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TUNE_WARPS = (1, 2, 4, 8, 16)
TUNE_STAGES = (1, 2, 3, 4)
#: a block holds at most this many elements (registers)
TUNE_MAX_BLOCK = 1 << 15


def tuning_space(config: dict, xnumel: int, persistent: bool):
    """(space, valid) of a search around ``config``: XBLOCK (and a tiled kernel's YBLOCK) up to the
    next power of two of its numel (``xnumel``: an int, or (rows, columns) of a tiled kernel),
    RBLOCK free in a looped reduction and fixed in a persistent one (it must cover the row),
    num_warps and num_stages; a block of at most :data:`TUNE_MAX_BLOCK` elements with at least one
    element per thread."""
    def upto(n, key):
        top = 1 << max(0, int(n) - 1).bit_length()
        return sorted({x for x in TUNE_XBLOCK if x <= max(top, 1)} | {config[key]})
    ynumel, xnumel = xnumel if isinstance(xnumel, tuple) else (1, xnumel)
    space = {"XBLOCK": upto(xnumel, "XBLOCK"), "num_warps": list(TUNE_WARPS), "num_stages": list(TUNE_STAGES)}
    if "YBLOCK" in config:
        space["YBLOCK"] = upto(ynumel, "YBLOCK")
    if "RBLOCK" in config:
        space["RBLOCK"] = [config["RBLOCK"]] if persistent else sorted(set(TUNE_RBLOCK) | {config["RBLOCK"]})

    def valid(c):
        elems = c["XBLOCK"] * c.get("RBLOCK", 1) * c.get("YBLOCK", 1)
        return elems <= TUNE_MAX_BLOCK and c["num_warps"] * 32 <= max(elems, 32)
    return space, valid


def precompile(jobs) -> int:
    """Compile a wrapper's kernels in parallel before their first launch (§11.1; run when the
    wrapper module is imported, i.e. at the compiled function's first call): ``jobs`` is
    [(JITFunction, argument dtypes and ints, launch configuration)], each compiled by
    ``kernel.warmup`` with stand-in tensors of those dtypes (Triton's MockTensor: 16-byte aligned,
    like every buffer of torch's caching allocator) under Triton's AsyncCompileMode on a thread pool
    of ``stax.compile_threads`` threads (default: one per core) -- Triton's passes and ptxas run
    outside the GIL.  A launch then finds its kernel compiled (a launch with other specialisations,
    an unaligned input, compiles its own).  A failing compile is left to the launch, which reports
    it.  Returns the number of kernels submitted (0 for fewer than two: nothing to overlap)."""
    if len(jobs) < 2:
        return 0
    import concurrent.futures

    from triton.runtime._async_compile import AsyncCompileMode

    from .... import config
    n = config.get("stax.compile_threads")
    n = min(len(jobs), n if n else (os.cpu_count() or 1))
    if n <= 1:
        return 0
    with concurrent.futures.ThreadPoolExecutor(n) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for kernel, args, cfg in jobs:
            try:
                kernel.warmup(*args, grid=(1,), **cfg)
            except Exception:  # noqa: BLE001 -- the launch compiles it again and reports the error
                pass
    codecache.stats["triton_precompiles"] = codecache.stats.get("triton_precompiles", 0) + len(jobs)
    return len(jobs)
