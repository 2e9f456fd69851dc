"""``tp.compile`` and the staged API (chapter §2, §11.3–11.6; seed 001 §2).

The path of one call of a compiled function (fig. 11.1):

1. **first-level entry** (§2.4): the same tensor objects, each still holding the same storage
   tensor (``_data``) at the same ``_version`` and with the same ``requires_grad``, as the last call
   (and the same grad mode, and the same ``training`` flags of the keyed modules and their
   submodules)?  Call that artifact — nothing else is checked.  This is a projection of the key:
   ``x.data = ...`` replaces ``_data`` (a new dtype, device, shape, strides or storage offset), and
   torch bumps ``_version`` on every in-place change of a storage tensor's metadata (``set_``,
   ``resize_``, ``as_strided_``, ``t_``), so every tensor field of the key — and which inputs
   alias (one storage tensor fixes its memory) — is unchanged when these hold.  Writes that bypass
   the version counter (through ``numpy()``) are not seen here, so data gates are not replayed for
   them (docs/compiler.md, "Hole").  In the common case (no module, free values, scalars or input
   mutation) this is one closure that calls the generated wrapper directly (``_make_fast``): few
   frames, which matters when the caches are cold (docs/stax.md "Call overhead with cold caches");
2. **specialization cache** (§2.2–2.3): flatten the inputs; for each cached entry run its guard
   (generated from its key, which starts with the call's structure: positional count, keywords,
   nesting) and replay its data gates; the first entry that passes runs;  a call that matches no
   entry and that the function cannot take (``inspect.signature(fn).bind``) raises Python's own
   ``TypeError`` before any capture;
3. **miss**: capture a new specialization (capture/tracer.py; which sizes are symbols: ``dynamic``
   — the default ``None``/``"auto"`` is static until a size changes, then those dims are symbols
   (§10, PyTorch's automatic dynamic), ``True`` every size, ``False`` none — plus the dims of
   ``tp.mark_dynamic``), run the front-end passes
   (functionalise → extract gate replays → fixed point of rewrites, passes/), hand the graph to the
   backend, cache the entry.  Each miss is explained in words (``TP_LOG_RECOMPILES=1`` logs it); at
   ``recompile_limit`` entries a miss warns once with all reasons and runs eagerly
   (``strict_native=True`` or ``options={"compile.error_on_recompile_limit": True}``: a
   :class:`RecompileLimitError` lists them).
4. a backend failure falls back to running the captured graph op by op (one warning per graph)
   unless ``strict_native=True`` (§11.3).

Staged: ``cf.lower(*args)`` -> :class:`Lowered` (graph after passes, guards in words);
``Lowered.compile()`` -> :class:`Compiled` (never recompiles: a guard miss raises
:class:`GuardError` naming the guard); ``Compiled.as_text()``, ``Compiled.cost_analysis()``.
"""
from __future__ import annotations

import functools
import sys
import warnings
import weakref

import torch

from .._tensor import Tensor, _wrap
from ..autograd import grad_mode
from ..profiler.recorder import span as _profiler_span
from . import config
from .backends.registry import StaticShapesRequired, lookup_backend
from .capture.gates import extract_replay
from .capture.proxy import CaptureError, _internal
from .capture.pytree import tree_flatten, tree_unflatten
from .capture.tracer import TENSOR_LEAF, capture, find_sources
from .specialize.aliasing import eager_reason, merge_same, written_placeholders
from .specialize.guards import build_guard
from .specialize.key import AliasEntry, input_names_for, specialization_key

__all__ = ["compile", "CompiledFunction", "Lowered", "Compiled", "GuardError", "RecompileLimitError",
           "BackendCompilerError", "MODES", "resolve_options", "list_mode_options", "reset", "explain"]


class GuardError(RuntimeError):
    """A ``Compiled`` artifact was called with inputs outside its specialization."""


class RecompileLimitError(RuntimeError):
    pass


class BackendCompilerError(RuntimeError):
    pass


# ---- modes and options (table 11.1): declared in config.py ------------------------------------------
MODES = config.MODES
#: options that nothing reads yet on CPU (no CUDA graphs, no autotuning there): accepted, so that code
#: written for GPUs runs, with a UserWarning once per process and option when set (``_warn_no_effect``,
#: the device check that reads them until a GPU backend does).  On CUDA tensors all three take effect
#: (inference graphs replayed as CUDA graphs: stax/triton/cudagraphs.py; launch configurations tuned:
#: stax/triton/autotune.py); the warning, given before the inputs' device is known, says so
NO_EFFECT_YET = ("stax.cudagraphs", "stax.max_autotune", "stax.coordinate_descent_tuning")
_WARNED_NO_EFFECT: set = set()


def resolve_options(mode=None, options=None) -> dict:
    """The mode's preset first, then ``options`` key by key (table 11.1; config.resolve_options)."""
    return config.resolve_options(mode, options)


def _warn_no_effect(mode, options, resolved):
    """One UserWarning naming the set options of :data:`NO_EFFECT_YET` not warned about before in
    this process (each option is named once per process)."""
    new = [k for k in NO_EFFECT_YET if resolved[k] != config.knob(k).default and k not in _WARNED_NO_EFFECT]
    if not new:
        return
    _WARNED_NO_EFFECT.update(new)

    def source(k):
        if k in (options or {}):
            return f"options[{k!r}]"
        return f"mode={mode!r}" if k in MODES[mode or "default"] else "config.patch"
    what = "; ".join(f"{k}={resolved[k]!r} (set by {source(k)}: {config.knob(k).help})" for k in new)
    cuda = (" (each does take effect on CUDA tensors: inference graphs replayed as CUDA graphs, kernel launch "
            "configurations tuned)")
    _warn_user(f"tp.compile: no effect on CPU yet: {what}; the code compiled for CPU tensors is what "
               f"mode='default' gives{cuda} (said once per process and option)", UserWarning)


def list_mode_options(mode=None) -> dict:
    """The options a mode sets (all options with their values now when mode is None)."""
    return config.mode_options(mode)


_ALL = weakref.WeakSet()


def reset():
    """Forget every compiled specialization (in this process)."""
    for cf in list(_ALL):
        cf._cache.clear()
        cf._fold_fast_hits()
        cf._first = None
        cf._limit_warned = False


def _warn_user(msg, category=RuntimeWarning):
    """``warnings.warn`` attributed to the innermost frame outside the tensorplay package."""
    f, level = sys._getframe(0), 1
    while f is not None and _internal(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    warnings.warn(msg, category, stacklevel=level)


def _log_recompiles() -> bool:
    return config.get("log.recompiles")


# ---- one cached specialization ----------------------------------------------------------------------
_MISS = object()   # the fast first-level entry did not match


def _snapshot(values):
    """What the first-level entry remembers of each flat value: for a tensor its storage tensor,
    that tensor's version and ``requires_grad``; None for anything else (compared by identity)."""
    return tuple((v._data, v._data._version, v.requires_grad) if isinstance(v, Tensor) else None for v in values)


def _unchanged(values, objs, snaps) -> bool:
    """Are ``values`` the remembered objects, each tensor with the same storage tensor, version and
    ``requires_grad`` (module docstring, step 1)?  ``len(values) == len(objs)`` is the caller's."""
    for a, o, s in zip(values, objs, snaps):
        if a is not o or (s is not None and (a._data is not s[0] or s[0]._version != s[1]
                                             or a.requires_grad is not s[2])):
            return False
    return True


class Entry:
    def __init__(self, lowered, artifact, backend_name):
        self.lowered = lowered
        self.guard = lowered.guard
        self.replay = lowered.replay
        self.free = lowered.capture.free
        self.module_getters = lowered.module_getters
        self.constants = list(lowered.capture.gm.attrs.values())
        self.artifact = artifact
        # inputs that overlap in memory with one of them written (specialize/aliasing.py): this
        # specialization runs the function itself, eagerly; its data gates need no replay
        self.eager = lowered._cf.fn if lowered.eager_reason is not None else None
        if self.eager is not None:
            self.replay = None
        self.out_spec = lowered.capture.out_spec
        self.out_consts = lowered.capture.out_consts
        self.backend_name = backend_name
        self.has_scalars = any(not isinstance(x, Tensor) for x in lowered.leaves)
        self.mutates_inputs = any(n.op == "call_function" and n.opdef is not None and n.opdef.is_inplace
                                  for n in lowered.graph_module.graph.nodes)
        spec, consts = self.out_spec, self.out_consts
        self._out_form = None    # "one" tensor, a flat "tuple" of tensors, or None (general)
        if spec == "*" and consts == [TENSOR_LEAF]:
            self._unflatten, self._out_form = (lambda outs: outs[0]), "one"
        elif isinstance(spec, tuple) and spec[0] == "tuple" and all(ch == "*" for ch in spec[2]) \
                and all(c is TENSOR_LEAF for c in consts):
            self._unflatten, self._out_form = tuple, "tuple"
        else:
            self._unflatten = self._general_unflatten

    def fast_runner(self):
        """``run(args)`` for the first-level fast path, or None: a specialization with no free
        values, no Python scalar inputs and no input mutation, whose outputs are one tensor or a
        flat tuple of tensors.  A Stax artifact's wrapper ``call`` (``artifact.direct``) is then
        called with the torch tensors directly, skipping two frames of Python."""
        if self.free or self.has_scalars or self.mutates_inputs or self._out_form is None or self.eager:
            return None
        direct = getattr(self.artifact, "direct", None)
        if direct is None:
            art, unflatten = self.artifact, self._unflatten
            return lambda args: unflatten(art(*args))
        wrap = _wrap
        if self._out_form == "tuple":
            return lambda args: tuple([wrap(o) for o in direct([a._data for a in args])])
        return lambda args: wrap(direct([a._data for a in args])[0])

    def reruns_capture(self) -> bool:
        """Does the first call return this artifact's results rather than the capture run's?  For a
        training region compiled through AOT (docs/aot.md "The first step") that writes no input
        and draws no random numbers: the capture run's outputs carry eager autograd history, so
        their backward would run eagerly and the compiled backward would wait for the second step;
        running the compiled forward once more on the same inputs (pure, so the same values within
        the error model) gives outputs whose backward is the compiled one.  A region that writes an
        input (already written by the capture run) or draws random numbers (the stream would advance
        twice) keeps the capture run's outputs."""
        rt = getattr(self.artifact, "aot", None)
        if rt is None or not rt.needs_grad or rt.mutated or self.mutates_inputs or self.eager is not None:
            return False
        return not any("random" in n.tags for n in self.lowered.graph_module.graph.nodes if n.op == "call_function")

    def free_values(self):
        return [f.get() for f in self.free] if self.free else ()

    def modules(self):
        """The keyed modules as they are now (the compiled module, those of closures and globals)."""
        return tuple(g() for g in self.module_getters)

    def check(self, leaves, free_vals, spec):
        why = self.guard(leaves, free_vals, self.constants, self.modules(), spec)
        if why is None and self.replay is not None:
            why = self.replay.check([x for x in leaves if isinstance(x, Tensor)] + list(free_vals))
        return why

    def call(self, args, kwargs, tensors, free_vals):
        """Run this specialization on a call's arguments (``tensors``: its flat tensor leaves)."""
        if self.eager is not None:
            return self.eager(*args, **kwargs)
        return self._unflatten(self.artifact(*tensors, *free_vals))

    def _general_unflatten(self, outs):
        it = iter(outs)
        leaves = [next(it) if c is TENSOR_LEAF else c for c in self.out_consts]
        return tree_unflatten(leaves, self.out_spec)


class CompiledFunction:
    """What ``tp.compile(fn)`` returns."""

    def __init__(self, fn, *, backend="stax", mode=None, options=None, dynamic=None, fullgraph=True,
                 strict_native=False, recompile_limit=8, name=None, disable=False, module=None):
        if dynamic is not None and dynamic not in (False, True, "auto"):
            raise ValueError(f"tp.compile: dynamic must be None or 'auto' (automatic: static until a size "
                             f"changes), True or False, got {dynamic!r}")
        #: True, False or "auto" (None): the sizes that are symbols at capture (_dynamic_dims)
        self.dynamic = "auto" if dynamic is None else dynamic
        self._auto_sizes: dict = {}   # dynamic="auto": flat leaf index -> the sizes of its first capture
        self._auto_dims: dict = {}    # flat leaf index -> the dims whose size changed (symbols from then on)
        if not fullgraph:
            raise ValueError("tp.compile: fullgraph=False is not supported — TensorPlay has no graph breaks; "
                             "a region is compiled whole or not at all (§11.3)")
        if not isinstance(recompile_limit, int) or recompile_limit < 1:
            raise ValueError(f"tp.compile: recompile_limit must be a positive int, got {recompile_limit!r}")
        self.fn = fn
        self.module = module
        self.backend_name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
        self.backend = lookup_backend(backend)
        self.mode = mode
        self.options = resolve_options(mode, options)
        _warn_no_effect(mode, options, self.options)
        self.strict_native = strict_native
        self.recompile_limit = recompile_limit
        self.disable = disable
        self.name = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "fn"))
        self._cache: list[Entry] = []
        self._first = None
        self._fast = None        # (first-level check and run in one closure, its hit count) or None
        self._signature = _MISS  # inspect.Signature of fn, found at the first miss (None: none)
        self.recompile_reasons: list[list[str]] = []
        self._counters = {"calls": 0, "first_level_hits": 0, "cache_hits": 0, "captures": 0, "over_limit_calls": 0,
                          "sparse_eager_calls": 0}
        self._limit_warned = False   # the recompile_limit warning is given once
        self._sparse_warned = False  # the sparse-arguments warning too
        functools.update_wrapper(self, fn, updated=())
        _ALL.add(self)

    @property
    def counters(self) -> dict:
        """calls, first-level hits (of both first-level paths), cache hits, captures, calls that ran
        eagerly because they matched no specialization with ``recompile_limit`` cached, and compiled
        backward graphs built so far (training regions, at their first ``backward()``)."""
        c = dict(self._counters)
        c["backward_compiles"] = sum(getattr(getattr(e.artifact, "aot", None), "bw_compiles", 0) for e in self._cache)
        n = self._fast[1][0] if self._fast is not None else 0
        c["calls"] += n
        c["first_level_hits"] += n
        return c

    # -- the call path ------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        # The fast first-level entry: one closure checks identity, version and grad mode and runs
        # the artifact.  The few Python frames matter: a call that follows a kernel streaming
        # 64 MiB finds the interpreter's data evicted from the caches, and every frame costs
        # main-memory misses (docs/stax.md "Call overhead with cold caches").
        fast = self._fast
        if fast is not None and not kwargs:
            out = fast[0](args)
            if out is not _MISS:
                return out
        return self._call(args, kwargs)

    def _call(self, args, kwargs):
        if self.disable:
            return self.fn(*args, **kwargs)
        c = self._counters
        c["calls"] += 1
        fl = self._first
        # first-level entry (§2.4): same objects holding the same storage tensors at the same
        # versions, same requires_grad -> run the artifact directly
        if fl is not None and not kwargs and len(args) == fl[0] and grad_mode._state.enabled is fl[3]:
            _, objs, snaps, _, entry, flags, free_objs, free_snaps = fl
            if _unchanged(args, objs, snaps) and all(m.training is f for m, f in flags):
                if not entry.free:
                    return self._first_hit(entry, args, ())
                free_vals = entry.free_values()
                if _unchanged(free_vals, free_objs, free_snaps):
                    return self._first_hit(entry, args, free_vals)
        return self._slow_call(args, kwargs)

    def _first_hit(self, entry, args, free_vals):
        self._counters["first_level_hits"] += 1
        out = entry.call(args, {}, [a for a in args if isinstance(a, Tensor)] if entry.has_scalars else args,
                         free_vals)
        if entry.mutates_inputs:  # the artifact bumped input versions: remember the new ones
            self._set_first(args, entry, free_vals)
        return out

    def _set_first(self, args, entry, free_vals):
        """Remember this call for the first-level entry: tensors by identity and version, other
        flat arguments (Python scalars) by identity."""
        self._fold_fast_hits()
        if all(isinstance(a, Tensor) or a is None or isinstance(a, (int, float, bool, str)) for a in args):
            self._first = (len(args), args, _snapshot(args), grad_mode._state.enabled, entry,
                           tuple((x, x.training) for m in entry.modules() for x in m.modules()),
                           free_vals, _snapshot(free_vals))
            self._fast = self._make_fast(args, entry)
        else:
            self._first = None

    def _fold_fast_hits(self):
        """Move the fast path's hit count into the counters (before the fast path changes)."""
        if self._fast is not None:
            n = self._fast[1][0]
            self._counters["calls"] += n
            self._counters["first_level_hits"] += n
            self._fast = None

    def _make_fast(self, args, entry):
        """The fast first-level entry for these arguments, or None when the general first-level
        path must run (a module, free values, Python scalars, input mutation, complex outputs)."""
        run = entry.fast_runner() if not entry.module_getters and not self.disable else None
        if run is None or not all(isinstance(a, Tensor) for a in args):
            return None
        objs = tuple(args)
        snaps = _snapshot(args)
        n, enabled, state, hits = len(args), grad_mode._state.enabled, grad_mode._state, [0]
        direct = getattr(entry.artifact, "direct", None)
        if n == 1:
            (o0,), ((d0, v0, r0),) = objs, snaps
        if n == 1 and direct is not None and entry._out_form == "one":
            # the commonest form, with no frame between this closure and the generated wrapper
            wrap = _wrap

            def fast(args):
                if len(args) == 1 and args[0] is o0 and o0._data is d0 and d0._version == v0 \
                        and o0.requires_grad is r0 and state.enabled is enabled:
                    hits[0] += 1
                    return wrap(direct([d0])[0])
                return _MISS
        elif n == 1:
            def fast(args):
                if len(args) == 1 and args[0] is o0 and o0._data is d0 and d0._version == v0 \
                        and o0.requires_grad is r0 and state.enabled is enabled:
                    hits[0] += 1
                    return run(args)
                return _MISS
        else:
            def fast(args):   # (the loop of _unchanged inline: one frame fewer)
                if len(args) == n and state.enabled is enabled:
                    for a, o, (d, v, r) in zip(args, objs, snaps):
                        if a is not o or a._data is not d or d._version != v or a.requires_grad is not r:
                            return _MISS
                    hits[0] += 1
                    return run(args)
                return _MISS
        return fast, hits

    def _slow_call(self, args, kwargs):
        hook = _array_hook(args, kwargs)
        if hook is not None:
            return hook(self, "call", args, kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        tensors = [x for x in leaves if isinstance(x, Tensor)]
        if len(tensors) != len(leaves) and any(isinstance(x, torch.Tensor) for x in leaves):
            args, kwargs, leaves = self._from_torch(args, kwargs, leaves, spec)
            tensors = [x for x in leaves if isinstance(x, Tensor)]
        if any(t._data.layout != torch.strided for t in tensors):
            return self._sparse_eager(args, kwargs, tensors)
        reasons = []
        for entry in self._cache:
            free_vals = entry.free_values()
            why = entry.check(leaves, free_vals, spec)
            if why is None:
                self._counters["cache_hits"] += 1
                out = entry.call(args, kwargs, tensors, free_vals)
                if not kwargs:
                    self._set_first(args, entry, free_vals)
                return out
            reasons.append(why)
        self._check_binding(args, kwargs)
        if len(self._cache) >= self.recompile_limit:
            return self._over_limit(args, kwargs, reasons)
        if reasons:
            self.recompile_reasons.append(reasons)
            if _log_recompiles():
                print(f"[tp.compile] recompiling {self.name}: " + "; ".join(reasons), file=sys.stderr)
        lowered = self._lower(args, kwargs)
        artifact = self._backend_compile(lowered)
        lowered.add_shape_guards()    # after the backend: its specialisations are guards too
        entry = Entry(lowered, artifact, self.backend_name)
        self._cache.append(entry)
        self._counters["captures"] += 1
        if lowered.capture.result is not None or self.options["capture.execute"]:
            result = lowered.capture.result  # the capture run was the first call (execute=True)
            lowered.capture.result = None    # (the cache must not keep the first call's outputs alive)
            if entry.reruns_capture():
                result = entry.call(args, kwargs, tensors, entry.free_values())
        else:
            result = entry.call(args, kwargs, tensors, entry.free_values())
        if not kwargs:
            self._set_first(args, entry, entry.free_values())
        return result

    def _from_torch(self, args, kwargs, leaves, spec):
        """``torch.Tensor`` arguments are taken as ``tp.from_torch`` takes them — zero-copy, sharing
        memory and version counter — so the compiled program computes with TensorPlay ops and its
        tensor outputs are ``tp.Tensor`` (``.torch()`` is zero-copy too).  A torch tensor that
        requires grad is refused: its gradient would be lost (TensorPlay's autograd is its own).
        Fresh wrappers each call: such calls never take the first-level entry."""
        from .._tensor import from_torch
        out = []
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                if x.requires_grad:
                    name = input_names_for(self.fn, args, kwargs)[i]
                    raise TypeError(f"tp.compile({self.name}): argument {name!r} is a torch.Tensor that requires "
                                    f"grad; its gradient would not reach it (TensorPlay's autograd is its own). "
                                    f"Pass a tp.Tensor: tp.from_torch(t.detach()).requires_grad_()")
                x = from_torch(x)
            out.append(x)
        a, k = tree_unflatten(out, spec)
        return a, k, out

    def _over_limit(self, args, kwargs, reasons):
        """A miss with ``recompile_limit`` entries cached (as PyTorch does): warn once per compiled
        function with the reasons, then run the function eagerly for every call that misses;
        ``strict_native=True`` or ``options["compile.error_on_recompile_limit"]`` raise
        :class:`RecompileLimitError` instead."""
        msg = (f"tp.compile({self.name}): recompile_limit={self.recompile_limit} reached; this call matches none "
               f"of the cached specializations:\n" + "\n".join(f"  entry {i}: {r}" for i, r in enumerate(reasons)))
        if self.strict_native or self.options["compile.error_on_recompile_limit"]:
            raise RecompileLimitError(msg)
        if not self._limit_warned:
            self._limit_warned = True
            _warn_user(msg + "\nFrom now on, calls that match no cached specialization run eagerly (not compiled). "
                       "If sizes vary, compile with dynamic=True (symbolic shapes: one artifact for many sizes); or raise the limit with "
                       f"tp.compile(..., recompile_limit=N) (now {self.recompile_limit}), or pass "
                       "options={'compile.error_on_recompile_limit': True} to raise instead.", UserWarning)
        self._counters["over_limit_calls"] += 1
        return self.fn(*args, **kwargs)

    def _sparse_eager(self, args, kwargs, tensors):
        """A call with a sparse (non-strided) tensor argument runs eagerly: the capture and the
        kernels work on strided memory.  ``strict_native=True`` raises instead."""
        which = [f"{list(t.shape)} {t._data.layout}" for t in tensors if t._data.layout != torch.strided]
        msg = f"tp.compile({self.name}): sparse tensor arguments ({', '.join(which)}) are not compiled"
        if self.strict_native:
            raise BackendCompilerError(msg + " (strict_native=True); pass dense tensors (x.to_dense())")
        if not self._sparse_warned:
            self._sparse_warned = True
            _warn_user(msg + "; such calls run eagerly", UserWarning)
        self._counters["sparse_eager_calls"] += 1
        return self.fn(*args, **kwargs)

    # -- stages -------------------------------------------------------------------------------------
    def _check_binding(self, args, kwargs):
        """Arguments the function cannot take raise what calling it raises (Python's own
        ``TypeError``, e.g. ``f() takes 1 positional argument but 2 were given``), before any
        capture: ``inspect.signature(fn).bind`` decides, and then the function itself is called,
        which fails while binding, before its body runs."""
        sig = self._signature
        if sig is _MISS:
            import inspect
            try:
                sig = inspect.signature(self.fn)
            except (TypeError, ValueError):   # no signature to check (some builtins): capture decides
                sig = None
            self._signature = sig
        if sig is None:
            return
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            err = e
        else:
            return
        self.fn(*args, **kwargs)
        raise TypeError(f"{self.name}(): {err}")   # the signature refused what the function accepts

    def _dynamic_dims(self, leaves, names):
        """What the capture makes symbolic: True (every size, dynamic=True), ``{leaf index: dims}``
        (dynamic="auto": the dims whose size differs from their first capture — PyTorch's automatic
        dynamic — plus the dims of ``tp.mark_dynamic``), or False (static shapes)."""
        if self.dynamic is True:
            return True
        marked = any(getattr(x, "_tp_dynamic_dims", None) for x in leaves if isinstance(x, Tensor))
        if self.dynamic == "auto":
            new = []
            for i, x in enumerate(leaves):
                if not isinstance(x, Tensor):
                    continue
                first = self._auto_sizes.setdefault(i, tuple(x.shape))
                if len(first) == x.dim():
                    for d, (a, b) in enumerate(zip(first, x.shape)):
                        if a != b and d not in self._auto_dims.setdefault(i, set()):
                            self._auto_dims[i].add(d)
                            new.append(f"{names[i] if i < len(names) else f'arg {i}'}.shape[{d}]")
            if new and _log_recompiles():
                print(f"[tp.compile] {self.name}: automatic dynamic (dynamic='auto'): {', '.join(new)} changed "
                      f"size, a symbol from now on", file=sys.stderr)
            dims = {i: set(d) for i, d in self._auto_dims.items() if d}
            if dims:
                return dims
        return {} if marked else False

    def _lower(self, args, kwargs) -> "Lowered":
        names = input_names_for(self.fn, args, kwargs)
        mods = []
        leaves, spec = tree_flatten((args, kwargs))
        with _profiler_span(f"capture {self.name}", "compile"):
            cap = capture(self.fn, args, kwargs, execute=self.options["capture.execute"], input_names=names,
                          sources=find_sources(self.fn, self.module, mods), name=self.name,
                          dynamic=self._dynamic_dims(leaves, names), buckets=self.options["dynamic.buckets"])
        if cap.symbolic is not None:
            _check_marks_kept(cap.symbolic, self.name)
        written = written_placeholders(cap.gm.graph)
        key = specialization_key(leaves, names, [(f.name, f.tensor) for f in cap.free],
                                 constants=list(cap.gm.attrs.values()), modules=[(d, g()) for d, g in mods],
                                 writes_inputs=bool(written), spec=spec, symbolic=cap.symbolic is not None)
        return Lowered(self, cap, key, leaves, written, [g for _, g in mods])

    def _backend_compile(self, lowered):
        if lowered.eager_reason is not None:   # the entry runs the function itself (Entry.eager)
            msg = f"tp.compile({self.name}): {lowered.eager_reason}"
            if self.strict_native:
                raise BackendCompilerError(f"{msg}: no compiled form for this aliasing (strict_native=True); "
                                           f"pass tensors that do not overlap, or clone one of them")
            _warn_user(f"{msg}: this specialization runs the function eagerly (specialize/aliasing.py)")
            return None
        gm = lowered.graph_module
        example = lowered.example_inputs
        sym = lowered.capture.symbolic
        backend_call = self.backend
        if sym is not None and not getattr(self.backend, "dynamic_shapes", True):
            eager = self._no_static_form(gm, example, sym, "compiles static sizes only")
            if eager is not None:
                return eager
            tops = {}
            if self.options["dynamic.buckets"]:
                from .specialize.padding import padded_dims
                tops = padded_dims(gm, sym, lowered)
            if tops:         # run at the bucket's top: inputs padded, outputs sliced (specialize/padding.py)
                from .specialize.padding import compile_padded
                backend, sym_gm = self.backend, gm
                backend_call = lambda g, ex, **kw: compile_padded(backend, sym_gm, ex, sym, tops, **kw)  # noqa: E731
            else:
                from .capture.symbolic import specialize_graph
                gm = specialize_graph(gm, sym)     # a backend with static kernels: guarded to the sample's sizes
        try:
            return self._run_backend(backend_call, gm, example)
        except StaticShapesRequired as e:   # a symbolic graph this backend cannot compile symbolically
            if sym is None:
                return self._backend_failed(e, gm, example)
            lowered.specialized_reason = str(e)
            eager = self._no_static_form(gm, example, sym, f"needs static sizes here ({e})")
            if eager is not None:
                return eager
            if _log_recompiles():
                print(f"[tp.compile] {self.name}: backend {self.backend_name!r} specialises this graph to the "
                      f"sample's sizes: {e}", file=sys.stderr)
            from .capture.symbolic import specialize_graph
            gm = specialize_graph(gm, sym)
            return self._run_backend(self.backend, gm, example)

    def _run_backend(self, call, gm, example):
        """``call(gm, example, ...)``; a failure other than StaticShapesRequired falls back
        (:meth:`_backend_failed`)."""
        try:
            with _profiler_span(f"backend {self.backend_name} {self.name}", "compile"):
                return call(gm, example, options=self.options, strict_native=self.strict_native)
        except StaticShapesRequired:
            raise
        except Exception as e:
            return self._backend_failed(e, gm, example)

    def _backend_failed(self, e, gm, example):
        """The captured graph op by op (with a warning) after the backend failed; strict_native
        raises instead."""
        if self.strict_native:
            raise BackendCompilerError(f"tp.compile({self.name}): backend {self.backend_name!r} failed with "
                                       f"strict_native=True: {type(e).__name__}: {e}") from e
        _warn_user(f"tp.compile({self.name}): backend {self.backend_name!r} failed ({type(e).__name__}: {e}); "
                   f"running the captured graph op by op instead")
        from .backends.eager import eager_backend
        return eager_backend(gm, example)

    def _no_static_form(self, gm, example, sym, why):
        """A graph with data-dependent sizes has no form with static sizes: the captured graph op by
        op (with a warning naming the sizes; strict_native raises); None when it has none."""
        unbacked = sym.unbacked_in(gm)
        if not unbacked:     # static kernels cannot take a size known only when the program runs
            return None
        msg = (f"tp.compile({self.name}): backend {self.backend_name!r} {why}, and this graph has "
               f"data-dependent sizes ({unbacked})")
        if self.strict_native:
            raise BackendCompilerError(msg + " (strict_native=True)")
        _warn_user(msg + "; running the captured graph op by op instead")
        from .backends.eager import eager_backend
        return eager_backend(gm, example)

    def lower(self, *args, **kwargs) -> "Lowered":
        """Stage 1–2: capture and run the passes for these inputs (runs the function once with
        execute=True)."""
        hook = _array_hook(args, kwargs)
        if hook is not None:
            return hook(self, "lower", args, kwargs)
        self._check_binding(args, kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        if any(isinstance(x, torch.Tensor) for x in leaves):
            args, kwargs, _ = self._from_torch(args, kwargs, leaves, spec)
        return self._lower(args, kwargs)

    def explain(self) -> str:
        lines = [f"tp.compile({self.name}): {len(self._cache)} specialization(s), counters {self.counters}"]
        for i, e in enumerate(self._cache):
            lines.append(f"--- specialization {i} ---")
            if e.eager is not None:
                lines.append(f"runs eagerly: {e.lowered.eager_reason}")
            if e.lowered.specialized_reason is not None:
                lines.append(f"specialised to the sample's sizes for the backend: {e.lowered.specialized_reason}")
            lines.append(e.lowered.as_text())
            lines.append("guards:\n  " + "\n  ".join(e.lowered.guards))
        for i, rs in enumerate(self.recompile_reasons, start=1):
            lines.append(f"recompilation {i}: " + "; ".join(rs))
        return "\n".join(lines)

    def _describe(self, what) -> str:
        return (f"{what}, backend={self.backend_name!r}, mode={self.mode!r}, specializations={len(self._cache)}, "
                f"strict_native={self.strict_native}" + (", disable=True" if self.disable else "") + ")")

    def __repr__(self):
        return self._describe(f"CompiledFunction({self.name}")

    def __get__(self, obj, objtype=None):  # decorating a method
        if obj is None:
            return self
        bound = self.__dict__.setdefault("_bound", weakref.WeakKeyDictionary())
        cf = bound.get(obj)
        if cf is None:
            cf = CompiledFunction(self.fn.__get__(obj, objtype), backend=self.backend, mode=self.mode,
                                  options=self.options, dynamic=self.dynamic, strict_native=self.strict_native,
                                  recompile_limit=self.recompile_limit, name=self.name, disable=self.disable,
                                  module=obj if hasattr(obj, "named_parameters") else None)
            bound[obj] = cf
        return cf


def _array_hook(args, kwargs):
    """The ``__tp_compile__`` hook of the first argument (positional, then keyword) whose type has
    one (an array type that is not a tensor, tp.distributed's ShardedArray): such a call is the
    hook's -- ``hook(cf, "call" | "lower", args, kwargs)`` -- since capture sees tensors only."""
    for a in (*args, *kwargs.values()):
        hook = getattr(type(a), "__tp_compile__", None)
        if hook is not None:
            return hook
    return None


class Lowered:
    """A captured and optimised graph for one specialization (seed 001 §2: trace -> lower)."""

    def __init__(self, cf, cap, key, leaves, written=frozenset(), module_getters=()):
        self._cf = cf
        self.module_getters = list(module_getters)   # the keyed modules' getters (the guard's M)
        self.capture = cap
        self.key = key
        self.guard = build_guard(key, name="guard")
        self._shape_guards_added = False
        self.specialized_reason = None   # dynamic=True: why the backend needed the sample's static sizes
        self.leaves = leaves
        self.example_inputs = [x for x in leaves if isinstance(x, Tensor)] + [f.tensor for f in cap.free]
        gm = cap.gm
        # the inputs' aliasing (specialize/aliasing.py): "same" groups become one input; a written
        # partial overlap makes the specialization run eagerly (eager_reason)
        alias = next((e for e in key if isinstance(e, AliasEntry)), None)
        self.eager_reason = None
        if alias is not None and alias.value:
            merge_same(gm, alias.value)
            self.eager_reason = eager_reason(alias.value, set(written), alias.names)
        gates_after_dce = cf.options["debug.gates_after_dce"]
        from .passes import pipeline
        if not gates_after_dce:
            gm = _run_front(gm, cf.options, pipeline.run_passes, cap, self)
        else:
            if cf.options["passes.enabled"]:
                pipeline.run_passes(gm)
            self.replay = extract_replay(gm, cap.gates)
            if self.replay is not None and self.replay.dropped:
                warnings.warn(f"{len(self.replay.dropped)} data gate(s) lost: their condition was removed by DCE "
                              f"before extraction (debug.gates_after_dce) — results may be wrong", RuntimeWarning)
        self.graph_module = gm
        from .aot import is_training_region
        self.is_training = is_training_region(self.example_inputs)
        self._aot = None

    # -- AOT autograd (docs/aot.md): training regions only --------------------------------------------
    @property
    def aot(self):
        """The joint graph and its partition (``options["aot.partitioner"]``) of a training region,
        built on first access; None for a region that needs no autograd."""
        if self._aot is None and self.is_training:
            from .aot import aot_lower
            self._aot = aot_lower(self.graph_module, self.example_inputs, self._cf.options["aot.partitioner"],
                                  getattr(self._cf.backend, "aot_decompose", None))
        return self._aot

    @property
    def forward_graph(self):
        """The graph the forward runs: the partitioned forward of a training region, else the region."""
        return self.aot.forward_graph if self.is_training else self.graph_module

    @property
    def backward_graph(self):
        """The partitioned backward graph of a training region (None otherwise)."""
        return self.aot.backward_graph if self.is_training else None

    @property
    def saved_values(self) -> list:
        """Values the forward saves for the backward: ``SavedValue(name, shape, dtype, nbytes)``."""
        return self.aot.saved_values if self.is_training else []

    @property
    def guards(self) -> list[str]:
        out = []
        for e in self.key:
            out.append(f"{e.subject}: {e.field} == {e.value!r}")
        if self.replay is not None:
            for g in self.replay.gates:
                out.append(f"data gate {g.describe()} == {g.value!r}")
        return out

    def as_text(self) -> str:
        return self.graph_module.code

    def compile(self) -> "Compiled":
        artifact = self._cf._backend_compile(self)
        self.add_shape_guards()
        return Compiled(self, artifact)

    def add_shape_guards(self):
        """dynamic=True: append what the capture, the passes and the backend assumed about sizes
        (specialize/shape_guards.py) to the key, and regenerate the guard from it (invariant 1)."""
        sym = self.capture.symbolic
        if sym is None or self._shape_guards_added:
            return
        from .specialize.shape_guards import shape_entries
        self.key = list(self.key) + shape_entries(sym)
        self.guard = build_guard(self.key, name="guard")
        self._shape_guards_added = True


def _check_marks_kept(sym, name):
    """A dim marked with ``tp.mark_dynamic`` that the program specialised (``range`` over it, a
    branch that pins its value) is an error, as in PyTorch: the mark promised one artifact for
    many sizes."""
    for i, who, d in sym.marked:
        if (i, d) in sym.static_why:       # a sample size of 0 or 1: specialised by §10.2's rule
            continue
        fake = next(f for j, _, f in sym.inputs if j == i)
        e = sym.expr(fake.shape[d])
        if e.is_Integer:
            where = "; ".join(f"{c} (from {w})" for c, w in sym.guards()) or "a guard"
            raise CaptureError(f"tp.compile({name}): {who}.shape[{d}] was marked dynamic (tp.mark_dynamic) but the "
                               f"program specialised it to {int(e)}: {where}. Remove the mark, or rewrite the code "
                               f"that needs its value as a number (range(), int())")


def _run_front(gm, options, run_passes, cap, lowered):
    """canonicalise and functionalise, extract gate replays (before DCE, Prop. 3.1), then the
    other passes to a fixed point."""
    from .passes.canonicalize import canonicalize
    from .passes.functionalize import functionalize
    canonicalize(gm)
    functionalize(gm)
    gm.graph.lint()
    gm.recompile()
    lowered.replay = extract_replay(gm, cap.gates)
    if options["passes.enabled"]:
        run_passes(gm, skip_functionalize=True)
    return gm


class Compiled:
    """A compiled artifact for exactly one specialization; never recompiles."""

    def __init__(self, lowered, artifact):
        self.lowered = lowered
        self._entry = Entry(lowered, artifact, lowered._cf.backend_name)
        self.artifact = artifact

    def __call__(self, *args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        if any(isinstance(x, torch.Tensor) for x in leaves):
            args, kwargs, leaves = self.lowered._cf._from_torch(args, kwargs, leaves, spec)
        e = self._entry
        free_vals = e.free_values()
        why = e.check(leaves, free_vals, spec)
        if why is not None:
            raise GuardError(f"Compiled({self.lowered._cf.name}) called with inputs it was not built for: {why}")
        return e.call(args, kwargs, [x for x in leaves if isinstance(x, Tensor)], free_vals)

    def as_text(self) -> str:
        src = getattr(self.artifact, "source", None)
        return src if src is not None else self.lowered.as_text()

    def cost_analysis(self, *, args=None, compile_s=None, t_eager=None, t_compiled=None, repeats=15) -> dict:
        """FLOPs and model bytes of this artifact (compiler/cost.py): ``{"flops", "bytes_accessed",
        "input_bytes", "output_bytes", "intermediate_bytes"}``.

        With example inputs ``args`` (a tuple) or the times, also its compile amortisation (Prop.
        13.4, ``cost.break_even_calls``): ``compile_s`` (C), ``t_eager_s``, ``t_compiled_s`` (seconds
        per call), ``saving_per_call_s`` and ``break_even_calls`` = C / (t_e - t_c), ``inf`` when the
        compiled call is not faster.  What is not given is measured on ``args``: t_e (the function
        run eagerly) and t_c (this artifact) interleaved, medians of ``repeats`` readings; C by
        lowering and compiling the function again for ``args``: what the first compile stored (the
        kernel and compiled-graph caches, §11.1) is found again, so a measured C is a warm cache's
        (capture and passes, little of the backend); pass the first call's time in a fresh process
        with an empty ``TP_CACHE_DIR`` as ``compile_s`` for a cold one."""
        from .cost import amortization, cost_analysis
        out = cost_analysis(self.lowered.graph_module, intermediate_bytes=getattr(self.artifact, "intermediate_bytes", None))
        times = (compile_s, t_eager, t_compiled)
        if args is None and all(t is None for t in times):
            return out
        if args is None and any(t is None for t in times):
            missing = [k for k, t in zip(("compile_s", "t_eager", "t_compiled"), times) if t is None]
            raise ValueError(f"Compiled.cost_analysis: give args=(...) to measure {', '.join(missing)}, or give them")
        if compile_s is None:
            import time
            t0 = time.perf_counter()
            self.lowered._cf.lower(*args).compile()
            compile_s = time.perf_counter() - t0
        fn = self.lowered._cf.fn
        out.update(amortization(lambda: fn(*args), lambda: self(*args), compile_s=compile_s, t_eager=t_eager,
                                t_compiled=t_compiled, repeats=repeats))
        return out


class CompiledModule:
    """``tp.compile(module)``: calls go to the compiled ``forward``; attributes to the module."""

    def __init__(self, module, **kw):
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled_forward", CompiledFunction(module.forward, module=module, **kw))

    def __call__(self, *args, **kwargs):
        return self._compiled_forward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        setattr(self._orig_mod, name, value)

    def lower(self, *args, **kwargs):
        return self._compiled_forward.lower(*args, **kwargs)

    def explain(self):
        return self._compiled_forward.explain()

    @property
    def counters(self) -> dict:
        """The compiled forward's counters (:attr:`CompiledFunction.counters`)."""
        return self._compiled_forward.counters

    @property
    def recompile_reasons(self) -> list:
        """The compiled forward's recompile reasons (:attr:`CompiledFunction.recompile_reasons`)."""
        return self._compiled_forward.recompile_reasons

    def __repr__(self):
        return self._compiled_forward._describe(f"CompiledModule({type(self._orig_mod).__name__}")


def compile(model=None, *, backend="stax", mode=None, options=None, dynamic=None, fullgraph=True,
            strict_native=False, recompile_limit=8, name=None, disable=False):
    """Compile a function or an ``nn.Module``; usable as ``tp.compile(f)``, ``@tp.compile`` and
    ``@tp.compile(mode=...)``."""
    kw = dict(backend=backend, mode=mode, options=options, dynamic=dynamic, fullgraph=fullgraph,
              strict_native=strict_native, recompile_limit=recompile_limit, name=name, disable=disable)
    if model is None:
        return lambda f: compile(f, **kw)
    if hasattr(model, "forward") and hasattr(model, "named_parameters") and not isinstance(model, type):
        return CompiledModule(model, **kw)
    if not callable(model):
        raise TypeError(f"tp.compile: expected a function or an nn.Module, got {type(model).__name__}")
    return CompiledFunction(model, **kw)


def explain(fn, *args, **kwargs) -> str:
    """Compile ``fn`` (or reuse a CompiledFunction), call it on the arguments, and describe the
    graph, the guards and every recompilation so far."""
    cf = fn if isinstance(fn, CompiledFunction) else (fn._compiled_forward if isinstance(fn, CompiledModule)
                                                       else CompiledFunction(fn, backend="eager"))
    cf(*args, **kwargs)
    return cf.explain()
