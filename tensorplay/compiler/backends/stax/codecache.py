"""Content-addressed disk cache for Stax's generated code (chapter §11.1); device-neutral.

Compiling generated code is a function ``build(s, a) -> o`` of the source ``s`` and the other
inputs ``a`` (for the CPU: the full compile command, the compiler, the target ISA, the headers it
includes -- cpp/build.py says what ``a`` is and runs g++).  If ``build`` is pure, memoising it is
safe, and keying the store by ``h(s, a) = SHA-256(s | a)`` makes it *content-addressed* (Def.
11.1): an entry never has to be invalidated, because any change of the compiler or of the
generated code changes the key and the old entry is simply never read again (Prop. 11.1).  This
module keeps the store: entry folders, hashing, atomic writes, locks, persisted probes, the
Python wrapper modules and the compiled graphs.

Layout of ``cache_dir()`` (``$TP_CACHE_DIR``; see docs/cache.md)::

    <key[:2]>/<key>/...                 a device backend's build artifacts (the CPU's, cpp/build.py:
                                        kernel.cpp, kernel.so and its SHA-256 kernel.so.sha256)
    <key[:2]>/<key>/wrapper.py          a generated Python wrapper module (kernels as strings)
    <key[:2]>/<key>/graph.json          a compiled graph: its wrapper's source and facts (below)
    probes/                             persisted one-off probes (the CPU's: compiler version, ISA)

Concurrency (several processes, several threads): an entry is written only when missing, always
to a temporary file in the same folder followed by an atomic ``os.replace``, so a reader sees no
file or a complete one.  A build (cpp/build.py) is guarded by a file lock (:func:`_file_lock`) and
a double check, so the compiler runs once per key however many processes ask at the same time.

A process whose cache is warm never runs the compiler, not even ``--version``: the probes are
persisted in ``probes/``, keyed by the compiler executable's path and ``stat`` (size, mtime, inode).
**Compiled graphs** (:func:`graph_key`, :func:`load_graph`, :func:`save_graph`): a new process that
compiles a graph it compiled before skips Stax's whole Python pipeline (lowering, scheduling, code
generation -- and the import of sympy they need).  The key hashes the graph's code, the layouts of
the example inputs, the values of the graph's tensor constants, the wrapper option, torch's
version and thread count, the configuration (``config.digest()``: the keyed knobs), the content of
every ``.py`` file of the tensorplay package (so any change of the compiler is a new key) and the
user code the process added to Stax (lowerings registered or overridden from a script, Stax
functions replaced by a script: usercode.py); ``TP_GRAPH_CACHE=0`` turns it off.

Knobs (``TP_CACHE_DIR``, ``TP_GRAPH_CACHE``, ...) are read through :mod:`tensorplay.compiler.config`.

Every run of an external build tool (a compiler) goes through :func:`run_build_tool`, which counts it
in ``stats["compiler_runs"]`` and, when ``$TP_COMPILE_LOG`` names a file, appends the command there
as one line (tests and ``benchmarks/compile_time.py`` use it to prove that a warm process runs no
compiler).  A backend's build counts what it built in ``stats["builds"]`` and what it found built
in ``stats["build_hits"]``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

try:
    from ... import config
except ImportError:     # this file loaded alone, by its path (the code cache's tests): the config module
    def _config_beside():   # of the package it lies in, loaded by its path too (it needs only the stdlib)
        path = next(p / "config.py" for p in Path(__file__).resolve().parents if p.name == "compiler")
        spec = importlib.util.spec_from_file_location("_tp_codecache_config", path)
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # (dataclasses look it up)
        spec.loader.exec_module(mod)
        return mod
    config = _config_beside()

__all__ = [
    "cache_dir", "write_py", "load_py", "py_key", "entry_dir", "stats", "on_clear_memo",
    "clear_memo", "compile_log_path", "graph_key", "load_graph", "save_graph",
    "graph_constants", "run_build_tool",
]

#: Bumped when the layout of an entry or the meaning of a key changes (part of every key).
CACHE_VERSION = "stax-codecache-2"

#: In-process counters (tests read them).
stats = {"builds": 0, "build_hits": 0, "py_writes": 0, "compiler_runs": 0, "graph_hits": 0, "kernels_shared": 0}
_stats_lock = threading.Lock()


def _count(name: str) -> None:
    with _stats_lock:
        stats[name] = stats.get(name, 0) + 1


def compile_log_path() -> Path | None:
    """``stax.compile_log`` (``$TP_COMPILE_LOG``: a file every compiler run is appended to), or None."""
    env = config.get("stax.compile_log")
    return Path(env) if env else None


def run_build_tool(cmd, **kw) -> subprocess.CompletedProcess:
    """Run a build tool, e.g. the compiler (builds and probes alike): counted, and logged to ``$TP_COMPILE_LOG`` as
    ``<pid> <seconds> <command>`` (one line per run, written when it ends)."""
    _count("compiler_runs")
    log = compile_log_path()
    t0 = time.perf_counter()
    try:
        return subprocess.run(cmd, capture_output=True, text=True, **kw)
    finally:
        if log is not None:
            with open(log, "a", encoding="utf-8") as f:  # one line per write: O_APPEND keeps it whole
                f.write(f"{os.getpid()} {time.perf_counter() - t0:.4f} "
                        f"{shlex.join(str(c) for c in cmd)}\n")


# --------------------------------------------------------------------------------------------
# folders, hashing, atomic writes, locks
# --------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """``stax.cache_dir`` (``$TP_CACHE_DIR``) if set, else ``$XDG_CACHE_HOME/tensorplay`` or
    ``~/.cache/tensorplay``.

    Read at every call (tests and users may change the variable); created on demand.
    """
    env = config.get("stax.cache_dir")
    if env:
        d = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        d = base / "tensorplay"
    d.mkdir(parents=True, exist_ok=True)
    return d


def entry_dir(key: str) -> Path:
    """The folder of one cache entry: ``<cache>/<key[:2]>/<key>`` (not created here)."""
    return cache_dir() / key[:2] / key


def _sha256_parts(*parts) -> str:
    """SHA-256 of several strings/bytes, each length-prefixed (no ambiguity between parts)."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tmp_name(path: Path) -> Path:
    """A temporary sibling of ``path`` (same folder, hence same file system: rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}."
                          f"{os.urandom(4).hex()}.tmp")


def _atomic_write(path: Path, data) -> None:
    """Write to a temporary file in the same folder, then ``os.replace`` it into place."""
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


try:  # filelock comes with torch; fcntl.flock otherwise
    from filelock import FileLock as _FileLock
except Exception:  # pragma: no cover - exercised only without filelock
    _FileLock = None


@contextmanager
def _file_lock(lock_path: Path):
    """An exclusive inter-process lock (released by the kernel if the holder dies)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    if _FileLock is not None:
        with _FileLock(str(lock_path)):
            yield
        return
    import fcntl  # pragma: no cover
    with open(lock_path, "a") as f:  # pragma: no cover
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


_key_locks: dict[str, threading.Lock] = {}
_key_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    """One in-process lock per key (threads of one process wait here, not on the file lock)."""
    with _key_locks_guard:
        lk = _key_locks.get(key)
        if lk is None:
            lk = _key_locks[key] = threading.Lock()
        return lk


# --------------------------------------------------------------------------------------------
# probes: one-off facts of this machine and toolchain, persisted in <cache>/probes
# --------------------------------------------------------------------------------------------

def _probe_path(kind: str, fingerprint: str) -> Path:
    return cache_dir() / "probes" / f"{kind}-{fingerprint[:32]}.json"


def _read_probe(kind: str, fingerprint: str):
    try:
        with open(_probe_path(kind, fingerprint), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_probe(kind: str, fingerprint: str, value) -> None:
    try:
        p = _probe_path(kind, fingerprint)
        p.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(p, json.dumps(value, indent=1, sort_keys=True) + "\n")
    except OSError:  # a read-only cache only loses the persisted probe
        pass


# --------------------------------------------------------------------------------------------
# Python wrapper modules
# --------------------------------------------------------------------------------------------

_modules: dict[str, object] = {}


def py_key(source: str) -> str:
    """Key of a Python module: SHA-256 of its source (it is not compiled by anything external)."""
    return _sha256_parts(CACHE_VERSION, "py", source)


def write_py(source: str, kind: str = "wrapper") -> Path:
    """Save ``source`` as ``<cache>/<key[:2]>/<key>/<kind>.py`` (if missing or different) and
    return the path.  The files are meant to be read (experiment 2)."""
    if not kind.isidentifier():
        raise ValueError(f"write_py: kind must be an identifier, got {kind!r}")
    d = entry_dir(py_key(source))
    path = d / f"{kind}.py"
    try:
        if path.read_text(encoding="utf-8") == source:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    d.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, source)
    _count("py_writes")
    return path


def load_py(source: str, kind: str = "wrapper"):
    """Write ``source`` with :func:`write_py` and import it from that path (memoised by key).

    The module is registered in ``sys.modules`` as ``tp_stax_<key>`` so that tracebacks and
    ``inspect.getsource`` show the cached file; no ``__pycache__`` is written next to it.
    """
    key = py_key(source)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _thread_lock("py:" + key):
        mod = _modules.get(key)
        if mod is not None:
            return mod
        path = write_py(source, kind)
        name = f"tp_stax_{key}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        mod.__dict__["__cache_key__"] = key
        sys.modules[name] = mod
        try:
            code = compile(source, str(path), "exec")
            exec(code, mod.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[key] = mod
        return mod


# --------------------------------------------------------------------------------------------
# compiled graphs: the wrapper source and its facts, keyed by everything that determines them
# --------------------------------------------------------------------------------------------

_package_memo: dict = {}


def _package_sources(root: str) -> list:
    """(path, size, mtime_ns) of every ``.py`` file under ``root``, in path order (one ``scandir``
    walk: a third of the time of ``Path.rglob`` plus ``stat``; the key is computed at every compile)."""
    out, stack = [], [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(e.path)
                elif e.name.endswith(".py"):
                    st = e.stat()
                    out.append((e.path, st.st_size, st.st_mtime_ns))
    out.sort(key=lambda t: t[0].split(os.sep))       # the order of sorted(Path) objects
    return out


def _package_digest() -> str:
    """SHA-256 of every ``.py`` file of the tensorplay package (re-hashed when a stat changes)."""
    root = str(Path(__file__).resolve().parents[3])
    sig = tuple(_package_sources(root))
    digest = _package_memo.get(sig)
    if digest is None:
        parts = []
        for f, _, _ in sig:
            with open(f, "rb") as fh:
                parts += [os.path.relpath(f, root), fh.read()]
        digest = _package_memo[sig] = _sha256_parts(*parts)
    return digest


def graph_constants(gm) -> dict:
    """The tensors a graph reads through ``get_attr``, named ``const0, const1, ...`` in node order
    (the names the lowering gives them)."""
    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            val = getattr(gm, node.target)
            d = getattr(val, "_data", val)
            if _is_tensor(d):
                out[f"const{len(out)}"] = d
    return out


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _tensor_sig(t, with_values: bool) -> str:
    sig = f"{t.dtype}:{t.device}:{tuple(t.shape)}:{tuple(t.stride())}"
    if with_values:
        import torch
        flat = t.detach().cpu().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        sig += ":" + hashlib.sha256(data).hexdigest()
    return sig


def graph_key(gm, example_inputs, *, cpp_wrapper: bool = False, variant: str = "") -> str | None:
    """The key of a compiled graph, or None when the graph cache is off (``stax.graph_cache``,
    ``TP_GRAPH_CACHE=0``, or ``stax.lower_debug`` / ``stax.debug`` ask to see the lowering) or an
    example input is not a tensor or a plain number.  Lowerings registered or overridden from
    outside the package, and Stax functions replaced by user code, are in the key
    (:func:`usercode.user_code_digest`; it returns to the package's key when they are removed).
    The configuration is in the key through :func:`config.digest` (the keyed knobs: heuristics,
    the toolchain; not logs, dumps or cache folders).  Not seen: a rule re-bound to another package
    function, and patches of other objects' state (a module's constants) -- set
    ``TP_GRAPH_CACHE=0`` then.  ``variant``: the options that change the generated code besides
    ``cpp_wrapper`` (the kernel backend, tuning), as text."""
    if not config.get("stax.graph_cache") or config.get("stax.lower_debug") \
            or config.get("stax.debug").strip() not in ("", "0"):
        return None     # the debug switches print what lowering and code generation do: always run them
    import torch

    from .usercode import user_code_digest    # (here: tests load this file alone, by its path)
    ins = []
    for x in example_inputs:
        d = getattr(x, "_data", x)
        if _is_tensor(d):
            ins.append(_tensor_sig(d, False))
        elif isinstance(x, (bool, int, float)) or x is None:
            ins.append(repr(x))
        else:
            return None
    consts = [_tensor_sig(t, True) for t in graph_constants(gm).values()]
    return _sha256_parts(CACHE_VERSION, "graph", gm.code, "\0".join(ins), "\0".join(consts), _symbolic_sig(gm),
                         f"cpp_wrapper={bool(cpp_wrapper)}", variant, torch.__version__, torch.get_num_threads(),
                         sys.version, config.digest(), _package_digest(), user_code_digest())


def _symbolic_sig(gm) -> str:
    """A symbolic graph's input layouts as expressions and its symbols' ranges ("" when static):
    the code generated for it depends on them (sizevars.py, bounds.py), the hints are in the
    example inputs' part of the key."""
    from ...capture.fakes import fake_mode_of
    mode = fake_mode_of(gm)
    if mode is None:
        return ""
    parts = [f"{[str(x) for x in v.shape]}/{[str(x) for x in v.stride()]}"
             for v in (p.meta.get("val") for p in gm.graph.placeholders) if hasattr(v, "shape")]
    parts += [f"{s}:{r}" for s, r in sorted(mode.shape_env.var_to_range.items(), key=lambda p: str(p[0]))]
    return "\0".join(parts)


def load_graph(key: str | None) -> dict | None:
    """The record :func:`save_graph` stored under ``key``; None if absent, unreadable, or saved
    under another configuration than this process's now (:func:`config.digest`: the key holds it,
    and a key computed before a ``config.patch`` and looked up inside it misses too)."""
    if key is None:
        return None
    try:
        with open(entry_dir(key) / "graph.json", encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("source"), str):
        return None
    if rec.get("config") != config.digest():
        return None
    _count("graph_hits")
    return rec


def save_graph(key: str | None, record: dict) -> None:
    """Store a compiled graph's record (JSON: ``source`` and plain facts) atomically."""
    if key is None:
        return
    try:
        d = entry_dir(key)
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write(d / "graph.json", json.dumps({**record, "config": config.digest()}, sort_keys=True))
    except OSError:  # a read-only cache only loses the entry
        pass


# --------------------------------------------------------------------------------------------
# testing helpers, fork safety
# --------------------------------------------------------------------------------------------

def clear_memo() -> None:
    """Forget everything memoised in this process (loaded libraries, modules, probes).

    The disk cache is untouched; libraries already loaded stay mapped.  For tests.
    """
    _modules.clear()
    for forget in _memo_hooks:   # what a device backend memoises (the CPU's libraries, probes, call extension)
        forget()


#: functions :func:`clear_memo` calls (a backend adds its own with :func:`on_clear_memo`)
_memo_hooks: list = []


def on_clear_memo(fn) -> None:
    """Make :func:`clear_memo` call ``fn()`` too."""
    _memo_hooks.append(fn)


def _after_fork_in_child() -> None:  # a lock held by another thread at fork() stays held
    global _key_locks_guard, _stats_lock
    _key_locks.clear()
    _key_locks_guard = threading.Lock()
    _stats_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
