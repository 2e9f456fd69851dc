"""One configuration: every knob of TensorPlay declared once (the chapter, §11.6 and table 11.1).

A *knob* is a value that chooses among correct programs or says what to print: a heuristic's
threshold (the chapter's materialisation limit of §6.6, the streaming-store size of §8), a debug
switch, the kernel cache's folder, or an option of ``tp.compile`` (table 11.1).  Each is declared
here once (:data:`KNOBS`) with its dotted name, type, default, environment variable (or none),
help text, whether it is part of the compiled-graph cache key, and whether ``tp.compile(options=...)``
accepts it.  Guarantees:

* **One reader of the environment.**  No other module reads a ``TP_*`` variable; they ask
  :func:`get`, which reads the variable *at every call* (so a changed environment is seen, as
  before), parses it by the knob's type and names the variable in the error on a bad value.  A
  launcher gives the processes it starts a copy of the environment from :func:`child_environment`.
* **Scoped changes.**  :func:`patch` overrides knobs inside a ``with`` block or a decorated
  function; an override beats the environment, which beats the default.  Unknown names and values
  of the wrong type raise (with the closest name, as ``tp.compile`` does for its options).
* **The cache sees every change.**  :func:`digest` hashes the values of the keyed knobs (heuristics
  and anything else that changes generated code; not logs, debug dumps or cache locations); it is
  the configuration part of the compiled-graph key (backends/stax/codecache.graph_key).
* **Modes resolve here.**  :data:`MODES` are the presets of table 11.1; :func:`resolve_options` is
  what ``tp.compile(mode=..., options=...)`` runs.  A knob that is not an option is refused there,
  with the hint to use :func:`patch`.

Every declared knob is read by some module (test/test_config.py scans the sources for its name).
This module imports only the standard library: codecache.py, loaded alone by its path in the code
cache's tests, loads it beside itself.  How to add a knob: docs/config.md.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import threading
from dataclasses import dataclass

__all__ = ["Knob", "KNOBS", "MODES", "get", "patch", "digest", "watch", "knob", "options", "env_vars",
           "resolve_options", "mode_options", "markdown_table", "child_environment"]


@dataclass(frozen=True)
class Knob:
    """One declared knob.  ``type`` is bool, int, float or str; ``default`` None means "unset"
    (the reader decides, e.g. one compile thread per core).  ``keyed``: part of :func:`digest`.
    ``option``: accepted by ``tp.compile(options=...)`` (resolved per compiled function; the
    default is this module's value when ``tp.compile`` runs).  ``choices``: the allowed values."""
    name: str
    type: type
    default: object
    help: str
    env: str | None = None
    keyed: bool = False
    option: bool = False
    choices: tuple = ()


def _k(name, typ, default, help, env=None, *, keyed=False, option=False, choices=()):
    return Knob(name, typ, default, help, env, keyed, option, choices)


#: Every knob, grouped by the stage that reads it.
KNOBS = {k.name: k for k in (
    # -- tp.compile options (table 11.1): resolved per compiled function, keyed by their readers ----------
    _k("stax.cudagraphs", bool, False, "replay the kernels of a call as one CUDA graph (GPU)", option=True),
    _k("stax.max_autotune", bool, False, "benchmark launch configurations / templates and keep the best",
       option=True),
    _k("stax.coordinate_descent_tuning", bool, False, "refine launch configurations by coordinate descent",
       option=True),
    _k("stax.cpp_wrapper", bool, False, "one C++ translation unit and one foreign call per graph (CPU)",
       option=True),
    _k("stax.kernel_backend", str, "", "the Stax device backend of every device's kernels, by its registered name "
                                       "(empty: each device's own -- 'cpp' on CPU, 'triton' on CUDA; 'triton' on "
                                       "CPU tensors runs the Triton kernels in Triton's interpreter)", option=True),
    _k("capture.execute", bool, True, "capture with sample values (True) or purely symbolically (False)",
       option=True),
    _k("passes.enabled", bool, True, "run the front-end graph passes", option=True),
    _k("dynamic.buckets", bool, False, "symbolic sizes range over power-of-two buckets (2^(k-1), 2^k]: one "
                                       "specialization per bucket; static-kernel backends pad row-independent "
                                       "graphs to the bucket's top (Prop. 10.3, docs/compiler.md)", option=True),
    _k("aot.partitioner", str, "min_cut", "training regions: 'min_cut' (rematerialise cheap pointwise values) "
                                          "or 'default' (save what the backward reads); docs/aot.md", option=True),
    _k("debug.gates_after_dce", bool, False, "exercise 4 ONLY: extract gate replays after DCE — wrong on purpose",
       option=True),
    _k("compile.error_on_recompile_limit", bool, False, "at recompile_limit raise RecompileLimitError instead of "
                                                        "warning once and running the calls that miss eagerly",
       option=True),

    # -- logs and dumps (never keyed) ----------------------------------------------------------------------
    _k("log.ops", bool, False, "print every eager op call with its argument shapes", "TP_LOG_OPS"),
    _k("log.recompiles", bool, False, "print why tp.compile recompiled", "TP_LOG_RECOMPILES"),
    _k("debug.graph", bool, False, "print the graph after capture and after every pass that changed it",
       "TP_DEBUG_GRAPH"),
    _k("stax.lower_debug", bool, False, "list the ops Stax runs as fallback kernels, with the reason "
                                        "(bypasses the compiled-graph cache)", "TP_STAX_LOWER_DEBUG"),
    _k("stax.debug", str, "", "Stax stages to print, comma-separated: ir, schedule, plan, code (1 or all: every "
                              "stage; bypasses the compiled-graph cache)", "TP_STAX_DEBUG"),
    _k("stax.debug_dir", str, "", "with stax.debug: write dir/<graph hash>/<stage>.txt instead of printing",
       "TP_STAX_DEBUG_DIR"),

    # -- the kernel cache and the compile pool (never keyed) ------------------------------------------------
    _k("stax.cache_dir", str, "", "folder of compiled kernels and generated wrappers (empty: "
                                  "$XDG_CACHE_HOME/tensorplay or ~/.cache/tensorplay)", "TP_CACHE_DIR"),
    _k("stax.graph_cache", bool, True, "look compiled graphs up across processes (False: always lower and "
                                       "generate code)", "TP_GRAPH_CACHE"),
    _k("stax.compile_log", str, "", "a file every C++ compiler run is appended to, one line each",
       "TP_COMPILE_LOG"),
    _k("stax.compile_threads", int, None, "threads compiling kernels in parallel (0: synchronous; unset: one "
                                          "per core)", "TP_COMPILE_THREADS"),
    _k("stax.compile_progress", str, "auto", "a progress bar while a compile waits: auto (on a terminal), "
                                             "1 (always), 0 (never)", "TP_COMPILE_PROGRESS",
       choices=("auto", "0", "1")),
    _k("stax.compile_progress_delay_s", float, 2.0, "seconds a compile waits before its progress bar appears"),

    # -- the C++ toolchain (keyed: the ISA level decides vector widths) -----------------------------------
    _k("stax.cpp.cxx", str, "g++", "the C++ compiler command (may be 'ccache g++')", "TP_CXX", keyed=True),
    _k("stax.cpp.cxxflags", str, "", "extra compiler flags, shell-split", "TP_CXXFLAGS", keyed=True),
    _k("stax.cpp.isa", str, "", "force an ISA level: avx512, avx2, sse or scalar (empty: detect)", "TP_CPU_ISA",
       keyed=True),

    # -- the device backends of Stax (backends/stax/device.py; keyed: they generate the code) ---------------
    _k("stax.cpu_backend", str, "cpp", "the Stax device backend that generates the kernels of CPU tensors, by its "
                                       "registered name ('cpp': C++ with OpenMP and SIMD)", "TP_STAX_CPU_BACKEND",
       keyed=True),

    # -- device-neutral heuristics of Stax (choices.py, lowering) ------------------------------------------
    _k("stax.horizontal_fusion", bool, True, "fuse groups that share an input but do not depend on each other "
                                             "(example 7.2; experiment 4)", "TP_STAX_HORIZONTAL_FUSION", keyed=True),
    _k("stax.keep_realized_local", bool, True, "keep a value realized for several readers, all reductions, in "
                                               "registers when they fuse with it (False: the chapter's CPU model "
                                               "of §6.6)", "TP_STAX_KEEP_REALIZED_LOCAL", keyed=True),
    _k("stax.max_inline_ops", int, 24, "a value read by several consumers is recomputed by each unless it costs "
                                       "more ops than this (§6.6)", keyed=True),
    _k("stax.max_inline_loads", int, 4, "a value read by several consumers is recomputed by each unless it "
                                        "loads more buffers than this (a residual stream's chain of adds)",
       keyed=True),
    _k("stax.pool_unroll_max", int, 25, "pooling windows of at most this many elements are unrolled into a "
                                        "pointwise kernel", keyed=True),
    _k("stax.sdpa_decompose_max_scores", int, 1 << 20, "training regions decompose attention whose score matrix "
                                                       "has at most this many elements", keyed=True),
    _k("stax.fallback_random", bool, False, "random ops call eager's kernels (eager's numbers after the same "
                                            "manual_seed) instead of Philox streams", "TP_STAX_FALLBACK_RANDOM",
       keyed=True),
    _k("stax.keep_buffers", bool, True, "keep a compiled graph's dead intermediate buffers for its next call",
       "TP_STAX_KEEP_BUFFERS", keyed=True),

    # -- heuristics of the Triton (GPU) kernels ---------------------------------------------------------------
    _k("stax.triton.templates", str, "rule", "a matmul/linear and the pointwise group reading it as one Triton GEMM "
                                             "with that group as its epilogue, and the pointwise group computing "
                                             "its first operand as its prologue: 'rule' (when the choice rules of "
                                             "triton/matmul.py and triton/template_prologue.py say so), 'always', "
                                             "'never'", keyed=True,
       choices=("rule", "always", "never")),

    # -- heuristics of the C++ (CPU) kernels -----------------------------------------------------------------
    _k("stax.cpp.parallel_min_work", int, 1 << 15, "below this many elements of work a kernel runs on one "
                                                   "thread (Alg. 8.1)", keyed=True),
    _k("stax.cpp.scratch_max_bytes", int, 1 << 20, "the largest per-row scratch array a kernel keeps on its "
                                                   "stack; a longer row recomputes such a value", keyed=True),
    _k("stax.cpp.stream_min_bytes", int, 0, "outputs of at least this many bytes use streaming stores (0: the "
                                            "last-level cache size)", "TP_STAX_STREAM_MIN_BYTES", keyed=True),
    _k("stax.cpp.stream_piece_bytes", int, 32, "streaming stores need every store and row on this many bytes",
       "TP_STAX_STREAM_PIECE_BYTES", keyed=True),
    _k("stax.cpp.omp_schedule", str, "static", "OpenMP schedule of parallel loops over memory ('static': "
                                               "OpenMP's static split; e.g. 'guided, 16')", "TP_STAX_OMP_SCHEDULE",
       keyed=True),
    _k("stax.cpp.prefetch_bytes", int, 4096, "bytes of a cheap loop's read stream requested at once (0: no "
                                             "block prefetch)", "TP_STAX_PREFETCH_BYTES", keyed=True),
    _k("stax.cpp.prefetch_max_ops", int, 8, "a loop costing more ops per element is compute-bound: no block "
                                            "prefetch", keyed=True),
    _k("stax.cpp.prefetch_max_streams", int, 2, "a loop with more read streams from memory gets no block "
                                                "prefetch", keyed=True),
    _k("stax.cpp.split_loads", bool, True, "cheap loops load their streams from memory as two 32-byte halves "
                                           "instead of the block prefetch", "TP_STAX_SPLIT_LOADS", keyed=True),
    _k("stax.cpp.unroll", int, 2, "vector accumulators per reduction (latency hiding, invariant 6)", keyed=True),
    _k("stax.cpp.welford_unroll", int, 4, "vector accumulators per reduction in a phase with a Welford update",
       keyed=True),
    _k("stax.cpp.column_reductions", bool, True, "column mode for reductions over non-trailing dims",
       keyed=True),
    _k("stax.cpp.column_unroll", int, 8, "column mode: vectors of output columns per block", keyed=True),
    _k("stax.cpp.cascade", bool, True, "cascaded accumulators for long reductions (False: every lane adds all "
                                       "of its terms, for comparisons)", keyed=True),
)}

#: The modes of table 11.1: presets of options, applied before ``options``.
MODES = {
    "default": {},
    "reduce-overhead": {"stax.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"stax.max_autotune": True, "stax.coordinate_descent_tuning": True},
    "max-autotune": {"stax.cudagraphs": True, "stax.max_autotune": True, "stax.coordinate_descent_tuning": True},
}

_MISSING = object()
_lock = threading.RLock()
_frames: list = []            # active patches, innermost last: (token, {name: value})
_overrides: dict = {}         # their merged view (what get() looks at first)
_watchers: dict = {}          # name -> [callback(value)]
_parsed: dict = {}            # (env variable, raw text) -> parsed value


def knob(name: str) -> Knob:
    """The declaration of ``name``; an unknown name raises KeyError with the closest names."""
    try:
        return KNOBS[name]
    except KeyError:
        raise KeyError(_unknown(name, KNOBS, "configuration knob")) from None


def _unknown(name, known, what) -> str:
    near = difflib.get_close_matches(name, known, n=1)
    return (f"unknown {what} {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
            + "; see tensorplay/compiler/config.py (docs/config.md)")


def _parse_env(k: Knob, raw: str):
    """The value of ``k``'s variable from its text; a bad value raises naming the variable."""
    text = raw.strip()
    try:
        if k.type is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected 1 or 0 (true/false, yes/no, on/off)")
        if k.type is int:
            try:
                return int(text)
            except ValueError:
                raise ValueError("expected an integer") from None
        if k.type is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError("expected a number") from None
        return text.lower() if k.choices else text
    except ValueError as e:
        raise ValueError(f"{k.env}={raw!r}: {e} ({k.name}: {k.help})") from None


def _check(k: Knob, value, where: str):
    """Type and choices of a value set in code (patch, options) or read from the environment."""
    if value is None and k.default is None:
        return value
    ok = isinstance(value, k.type) and (k.type is bool or not isinstance(value, bool))
    if k.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise TypeError(f"{where}: {k.name!r} expects {k.type.__name__}, got {type(value).__name__} {value!r}")
    if k.choices and value not in k.choices:
        raise ValueError(f"{where}: {k.name}={value!r}: expected one of {', '.join(map(repr, k.choices))}")
    return value


def get(name: str):
    """The value of a knob now: the innermost :func:`patch`, else its environment variable (read at
    this call; empty counts as unset), else its default."""
    v = _overrides.get(name, _MISSING)
    if v is not _MISSING:
        return v
    k = KNOBS.get(name) or knob(name)
    if k.env is not None:
        raw = os.environ.get(k.env)
        if raw:
            v = _parsed.get((k.env, raw), _MISSING)
            if v is _MISSING:
                v = _parsed[(k.env, raw)] = _check(k, _parse_env(k, raw), k.env)
            return v
    return k.default


class patch(contextlib.ContextDecorator):
    """Override knobs in a ``with`` block or a decorated function::

        with config.patch({"stax.horizontal_fusion": False}):      # or patch(**{"stax....": False})
            ...

        @config.patch({"stax.cpp.prefetch_bytes": 0})
        def f(): ...

    Names and values are checked when the patch is made.  Patches nest (the innermost wins) and are
    process-wide (every thread sees them, like the environment)."""

    def __init__(self, changes: dict | None = None, **kw):
        changes = {**(changes or {}), **kw}
        self.changes = {n: _check(knob(n), v, "config.patch") for n, v in changes.items()}
        self._tokens: list = []

    def __enter__(self):
        token = object()
        with _lock:
            _frames.append((token, self.changes))
            self._tokens.append(token)
            _refresh(self.changes)
        return self

    def __exit__(self, *exc):
        with _lock:
            token = self._tokens.pop()
            _frames[:] = [f for f in _frames if f[0] is not token]
            _refresh(self.changes)
        return False


def _refresh(names) -> None:
    merged = {}
    for _, changes in _frames:
        merged.update(changes)
    global _overrides
    _overrides = merged
    for n in names:
        for cb in _watchers.get(n, ()):
            cb(get(n))


def watch(name: str, callback) -> None:
    """Call ``callback(value)`` now and whenever a :func:`patch` of ``name`` begins or ends: for a
    knob a module must act on when it changes (the eager op log installs an observer)."""
    knob(name)
    _watchers.setdefault(name, []).append(callback)
    callback(get(name))


def digest() -> str:
    """SHA-256 of the values of the keyed knobs now: the configuration part of the compiled-graph
    key (a patched heuristic is another key; a log or cache folder is not)."""
    vals = {n: get(n) for n, k in KNOBS.items() if k.keyed}
    return hashlib.sha256(json.dumps(vals, sort_keys=True).encode()).hexdigest()


def options() -> list:
    """The names ``tp.compile(options=...)`` accepts."""
    return [n for n, k in KNOBS.items() if k.option]


def env_vars() -> dict:
    """Environment variable -> knob name, for every knob that has one."""
    return {k.env: n for n, k in KNOBS.items() if k.env}


def child_environment(**updates) -> dict:
    """A copy of this process's environment with ``updates`` set (as strings): what a launcher hands
    to the processes it starts (tensorplay.distributed.launch: ``RANK``, ``WORLD_SIZE``, ...)."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in updates.items()})
    return env


def mode_options(mode=None) -> dict:
    """The options a mode sets (every option with its value now when ``mode`` is None)."""
    if mode is None:
        return {n: get(n) for n in options()}
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {sorted(MODES)}")
    return dict(MODES[mode])


def resolve_options(mode=None, opts=None, who: str = "tp.compile") -> dict:
    """The options of one compiled function: every option's value now, then the mode's preset,
    then ``opts`` key by key (table 11.1).  Unknown keys raise (with the closest option); a knob that
    is not an option raises with the hint to use :func:`patch`; a wrong type raises TypeError."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"{who}: unknown mode {mode!r}; modes: {sorted(MODES)}")
    names = options()
    out = {n: get(n) for n in names}
    out.update(MODES[mode or "default"])
    for n, v in (opts or {}).items():
        k = KNOBS.get(n)
        if k is None or not k.option:
            if k is not None:
                raise ValueError(f"{who}: {n!r} is a process-wide knob, not an option: set it with "
                                 f"tensorplay.compiler.config.patch({{{n!r}: ...}}) (docs/config.md)")
            near = difflib.get_close_matches(n, names, n=1)
            raise ValueError(f"{who}: unknown option {n!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                             + f"; options: {sorted(names)}")
        out[n] = _check(k, v, who)
    return out


def markdown_table() -> str:
    """Every knob as a Markdown table (docs/config.md holds it; a test checks it is current)."""
    rows = ["| knob | type | default | variable | keyed | effect |", "|---|---|---|---|---|---|"]
    for n, k in KNOBS.items():
        kind = "option" if k.option else ("yes" if k.keyed else "no")
        rows.append(f"| `{n}` | {k.type.__name__} | `{k.default!r}` | {f'`{k.env}`' if k.env else ''} | {kind} "
                    f"| {k.help.replace('|', '/')} |")
    return "\n".join(rows)


class _Group:
    """``config.stax.cpp.unroll``: attribute access by the dotted name."""

    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, attr):
        return _lookup(self._prefix + attr)

    def __dir__(self):
        return sorted({n[len(self._prefix):].split(".")[0] for n in KNOBS if n.startswith(self._prefix)})


def _lookup(name):
    if name in KNOBS:
        return get(name)
    if any(n.startswith(name + ".") for n in KNOBS):
        return _Group(name + ".")
    raise AttributeError(_unknown(name, KNOBS, "configuration knob"))


def __getattr__(attr):       # module attribute access: config.stax.horizontal_fusion
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _lookup(attr)
