"""Content-addressed disk cache for Stax's generated code (chapter §11.1).

Compiling generated C++ is a function ``build(s, a) -> o`` of the source ``s`` and the other
inputs ``a`` (the full compile command, the compiler, the target ISA, the headers it includes).
If ``build`` is pure, memoising it is safe, and keying the store by ``h(s, a) = SHA-256(s | a)``
makes it *content-addressed* (Def. 11.1): an entry never has to be invalidated, because any change
of the compiler or of the generated code changes the key and the old entry is simply never read
again (Prop. 11.1).  The work here is to make ``a`` cover everything that determines the artifact:

* the full compile command (flags, ``TP_CXXFLAGS``, the ISA flags) with placeholder paths;
* the compiler's identity (first line of ``$TP_CXX --version``), not its path;
* the *content* of the headers in ``cpp/`` (``cpp_prelude.h``): they are compiled too, and a
  header replaced in place would otherwise make ``build`` impure;
* a fingerprint of the CPU when a flag says ``native`` (``-march=native`` means different
  instructions on different machines sharing one cache folder).

Layout of ``cache_dir()`` (``$TP_CACHE_DIR``; see docs/cache.md)::

    <key[:2]>/<key>/kernel.cpp          the C++ source (kept; compile errors point at it)
    <key[:2]>/<key>/kernel.so           the shared library
    <key[:2]>/<key>/kernel.so.sha256    SHA-256 of kernel.so (truncation/corruption check)
    <key[:2]>/<key>/wrapper.py          a generated Python wrapper module (kernels as strings)
    <key[:2]>/<key>/graph.json          a compiled graph: its wrapper's source and facts (below)
    probes/                             persisted one-off probes (compiler version, CPU ISA)

Concurrency (several processes, several threads): an entry is written only when missing, always
to a temporary file in the same folder followed by an atomic ``os.replace``, so a reader sees no
file or a complete one.  Building a shared library is guarded by a file lock and a double check, so
the compiler runs once per key however many processes ask at the same time.

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

Knobs (``TP_CXX``, ``TP_CACHE_DIR``, ...) are read through :mod:`tensorplay.compiler.config`.

Every compiler run goes through :func:`_run_compiler`, which counts it in ``stats["compiler_runs"]``
and, when ``$TP_COMPILE_LOG`` names a file, appends the command there as one line (tests and
``benchmarks/compile_time.py`` use it to prove that a warm process runs no compiler).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
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
    "cache_dir", "cpu_isa", "isa_flags", "compiler_version", "cpp_compile_command", "cpp_key",
    "load_cpp", "write_py", "load_py", "py_key", "entry_dir", "CppCompileError", "CompilerOutputWarning", "stats",
    "clear_memo", "ISA_LEVELS", "compile_log_path", "graph_key", "load_graph", "save_graph",
    "graph_constants",
]

#: Bumped when the layout of an entry or the meaning of a key changes (part of every key).
CACHE_VERSION = "stax-codecache-1"

#: ISA levels from best to worst (chapter §8.1).
ISA_LEVELS = ("avx512", "avx2", "sse", "scalar")

#: /proc/cpuinfo flags each level needs.
_ISA_CPU_FLAGS = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"),
    "avx2": ("avx2", "fma", "f16c"),
    "sse": ("sse4_2",),
    "scalar": (),
}

#: The fixed part of the compile command.  IEEE semantics are kept (invariant 3): no -ffast-math;
#: -fno-math-errno / -fno-trapping-math change no result, they let calls like sqrt be inlined.
#: -ffp-contract=off: no a*b+c -> fma contraction, so every op rounds exactly as written (the chapter, §12.5).
_BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp",
               "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off")

#: Where cpp_prelude.h lives; its *.h files are part of every C++ key.
PRELUDE_DIR = Path(__file__).resolve().parent / "cpp"

#: In-process counters (tests read them).
stats = {"cpp_compiles": 0, "cpp_hits": 0, "py_writes": 0, "compiler_runs": 0, "graph_hits": 0}
_stats_lock = threading.Lock()


def _count(name: str) -> None:
    with _stats_lock:
        stats[name] = stats.get(name, 0) + 1


def compile_log_path() -> Path | None:
    """``stax.compile_log`` (``$TP_COMPILE_LOG``: a file every compiler run is appended to), or None."""
    env = config.get("stax.compile_log")
    return Path(env) if env else None


def _run_compiler(cmd, **kw) -> subprocess.CompletedProcess:
    """Run the compiler (builds and probes alike): counted, and logged to ``$TP_COMPILE_LOG`` as
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


class CompilerOutputWarning(UserWarning):
    """The compiler built a kernel but printed warnings or notes.  Generated code must compile
    silently at every ISA level (a diagnostic is silenced at its cause, in the generator or the
    prelude, never asserted away); the test suite turns this warning into an error."""


class CppCompileError(RuntimeError):
    """The C++ compiler rejected a generated kernel (or the result could not be loaded).

    Attributes: ``stderr`` (the compiler's output), ``source_path`` (the kept ``kernel.cpp``),
    ``cmd`` (the command that ran), ``kernel_name`` (set by AsyncCompile.wait).
    """

    def __init__(self, message: str, *, stderr: str = "", source_path=None, cmd=None,
                 kernel_name: str | None = None):
        self.stderr = stderr
        self.source_path = Path(source_path) if source_path is not None else None
        self.cmd = list(cmd) if cmd is not None else None
        self.kernel_name = kernel_name
        self.message = message
        super().__init__(self._text())

    def _text(self) -> str:
        head = f"kernel {self.kernel_name!r}: " if self.kernel_name else ""
        lines = [head + self.message]
        if self.source_path is not None:
            lines.append(f"  source: {self.source_path}")
        if self.cmd:
            lines.append(f"  command: {shlex.join(str(c) for c in self.cmd)}")
        if self.stderr:
            lines.append("  compiler output:")
            lines.extend("    " + ln for ln in self.stderr.rstrip().splitlines())
        return "\n".join(lines)

    def with_kernel_name(self, name: str) -> "CppCompileError":
        return CppCompileError(self.message, stderr=self.stderr, source_path=self.source_path,
                               cmd=self.cmd, kernel_name=name)


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
# probes: compiler version, CPU ISA (memoised in-process, persisted in <cache>/probes)
# --------------------------------------------------------------------------------------------

def _cxx() -> list[str]:
    """The compiler command: ``stax.cpp.cxx`` (``$TP_CXX``, may be ``"ccache g++"``), default ``g++``."""
    return shlex.split(config.get("stax.cpp.cxx") or "g++")


def _extra_flags() -> list[str]:
    return shlex.split(config.get("stax.cpp.cxxflags"))


def _exe_fingerprint(cxx: tuple) -> str:
    """Path and stat of every executable of the compiler command: changes when it is replaced."""
    parts = []
    for word in cxx:
        exe = shutil.which(word) if os.sep not in word else word
        if exe is None or not os.path.exists(exe):
            parts.append(f"{word}:?")
            continue
        real = os.path.realpath(exe)
        st = os.stat(real)
        parts.append(f"{word}:{real}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    return _sha256_parts(CACHE_VERSION, *parts)


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


@functools.lru_cache(maxsize=None)
def _compiler_version(cxx: tuple, cache: str) -> str:
    fp = _exe_fingerprint(cxx)
    rec = _read_probe("compiler", fp)
    if isinstance(rec, dict) and isinstance(rec.get("version"), str):
        return rec["version"]
    try:
        proc = _run_compiler([*cxx, "--version"], timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise CppCompileError(f"cannot run the C++ compiler {shlex.join(cxx)!r} "
                              f"(set TP_CXX): {e}") from e
    out = (proc.stdout or "").strip()
    if proc.returncode != 0 or not out:
        raise CppCompileError(f"{shlex.join(cxx)} --version failed (exit {proc.returncode}); "
                              "set TP_CXX to a working C++ compiler", stderr=proc.stderr or "")
    version = out.splitlines()[0].strip()
    _write_probe("compiler", fp, {"cxx": list(cxx), "version": version})
    return version


def compiler_version() -> str:
    """First line of ``$TP_CXX --version`` (memoised; persisted per compiler executable)."""
    return _compiler_version(tuple(_cxx()), str(cache_dir()))


def _cpu_info() -> tuple[frozenset, str]:
    """(/proc/cpuinfo flags of the first CPU, model name); empty on non-Linux systems."""
    flags, model = frozenset(), platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("flags", "Features") and not flags:
                    flags = frozenset(v.split())
                elif k == "model name" and v.strip():
                    model = v.strip()
                if k == "" and flags:  # end of the first processor block
                    break
    except OSError:
        pass
    return flags, model


@functools.lru_cache(maxsize=None)
def _machine_fingerprint() -> str:
    """What ``-march=native`` depends on: the CPU model and its feature flags."""
    flags, model = _cpu_info()
    return _sha256_parts(platform.machine(), model, " ".join(sorted(flags)))


_ISA_PROBE_SRC = """
#include <cstdint>
#ifndef TP_SCALAR
typedef float tp_vec __attribute__((vector_size(TP_VEC_BYTES)));
extern "C" void tp_probe(float* x, long n) {
  for (long i = 0; i + (long)(sizeof(tp_vec)/4) <= n; i += sizeof(tp_vec)/4) {
    tp_vec v; __builtin_memcpy(&v, x + i, sizeof v); v = v * v + v;
    __builtin_memcpy(x + i, &v, sizeof v);
  }
}
#else
extern "C" void tp_probe(float* x, long n) { for (long i = 0; i < n; ++i) x[i] *= x[i]; }
#endif
"""


def _compiler_accepts(isa: str) -> bool:
    """Does the compiler (and assembler) build a small vector kernel with ``isa_flags(isa)``?"""
    with tempfile.TemporaryDirectory(prefix="tp_isa_probe_") as d:
        src = Path(d) / "probe.cpp"
        src.write_text(_ISA_PROBE_SRC)
        cmd = [*_cxx(), "-O2", "-std=c++17", "-fPIC", "-c", *isa_flags(isa), str(src),
               "-o", str(Path(d) / "probe.o")]
        try:
            proc = _run_compiler(cmd, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0


@functools.lru_cache(maxsize=None)
def _detect_isa(cxx: tuple, cache: str) -> str:
    flags, _ = _cpu_info()
    fp = _sha256_parts(CACHE_VERSION, _compiler_version(cxx, cache), _machine_fingerprint())
    rec = _read_probe("isa", fp)
    if isinstance(rec, dict) and rec.get("isa") in ISA_LEVELS:
        return rec["isa"]
    is_x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
    isa = "scalar"
    for level in ISA_LEVELS[:-1]:
        if is_x86 and all(f in flags for f in _ISA_CPU_FLAGS[level]) and _compiler_accepts(level):
            isa = level
            break
    _write_probe("isa", fp, {"isa": isa, "cpu_flags": sorted(flags & {
        f for fs in _ISA_CPU_FLAGS.values() for f in fs})})
    return isa


def cpu_isa() -> str:
    """The best ISA level of this machine that the compiler accepts: one of :data:`ISA_LEVELS`.

    ``stax.cpp.isa`` (``$TP_CPU_ISA``) forces a level.  Detection reads the /proc/cpuinfo flags,
    then compiles a small vector kernel with the level's flags (once per machine and compiler:
    memoised in-process and persisted under ``<cache>/probes``).
    """
    forced = config.get("stax.cpp.isa")
    if forced:
        if forced not in ISA_LEVELS:
            raise ValueError(f"TP_CPU_ISA={forced!r}: expected one of {ISA_LEVELS}")
        return forced
    return _detect_isa(tuple(_cxx()), str(cache_dir()))


def isa_flags(isa: str) -> list[str]:
    """Compiler flags for an ISA level.  ``TP_VEC_BYTES`` is the SIMD width the C++ prelude uses;
    ``TP_SCALAR`` asks for plain scalar loops."""
    if isa == "avx512":
        return ["-march=native", "-DTP_VEC_BYTES=64"]
    if isa == "avx2":
        return ["-mavx2", "-mfma", "-mf16c", "-DTP_VEC_BYTES=32"]
    if isa == "sse":
        return ["-msse4.2", "-DTP_VEC_BYTES=16"]
    if isa == "scalar":
        return ["-DTP_SCALAR"]
    raise ValueError(f"unknown ISA level {isa!r}; expected one of {ISA_LEVELS}")


# --------------------------------------------------------------------------------------------
# C++: command, key, build, load
# --------------------------------------------------------------------------------------------

def cpp_compile_command(src, out, isa: str, extra=()) -> list[str]:
    """``g++ -O3 -std=c++17 -shared -fPIC -fopenmp -fno-math-errno -fno-trapping-math
    <isa flags> <$TP_CXXFLAGS> <extra> -I<codegen dir> src -o out`` (``$TP_CXX`` replaces ``g++``).

    ``extra``: flags of one kind of library (e.g. ``-I<Python include dir>`` for the C++ wrapper's
    call extension); they are part of the key like every other flag."""
    return [*_cxx(), *_BASE_FLAGS, *isa_flags(isa), *_extra_flags(), *extra, f"-I{PRELUDE_DIR}",
            str(src), "-o", str(out)]


_headers_memo: dict = {}


def _headers_digest() -> str:
    """Content of every header in the prelude folder (they are compiled with each kernel).

    Re-hashed whenever a header's size or mtime changes, so an edited header changes the key."""
    headers = []
    if PRELUDE_DIR.is_dir():
        for h in sorted(PRELUDE_DIR.iterdir()):
            if h.suffix in (".h", ".hpp") and h.is_file():
                st = h.stat()
                headers.append((h.name, st.st_size, st.st_mtime_ns, st.st_ino))
    sig = tuple(headers)
    digest = _headers_memo.get(sig)
    if digest is None:
        parts = []
        for name, *_ in headers:
            parts += [name, (PRELUDE_DIR / name).read_bytes()]
        digest = _headers_memo[sig] = _sha256_parts(*parts)
    return digest


def cpp_key(source: str, isa: str | None = None, extra=()) -> str:
    """SHA-256 (hex) of the source and everything else that determines the library (Prop. 11.1).

    The command enters with placeholder paths and without the compiler's path (its identity is
    ``compiler_version()``), so the key does not depend on where the cache or the package lives.
    """
    isa = isa or cpu_isa()
    n = len(_cxx())
    cmd = cpp_compile_command("{src}", "{out}", isa, extra)[n:]
    cmd = ["{include}" if c == f"-I{PRELUDE_DIR}" else c for c in cmd]
    native = any("=native" in c for c in cmd)
    return _sha256_parts(CACHE_VERSION, "cpp", source, "\0".join(cmd), compiler_version(),
                         _headers_digest(), _machine_fingerprint() if native else "")


_libs: dict[str, ctypes.CDLL] = {}


def _entry_valid(d: Path) -> bool:
    """kernel.so exists and its SHA-256 is the one recorded when it was built."""
    so, chk = d / "kernel.so", d / "kernel.so.sha256"
    try:
        want = chk.read_text().strip()
        return bool(want) and _sha256_file(so) == want
    except OSError:
        return False


def _build(source: str, isa: str, d: Path, extra=()) -> None:
    """Compile into ``d`` (caller holds the file lock): source, temporary .so, verify, rename."""
    d.mkdir(parents=True, exist_ok=True)
    src = d / "kernel.cpp"
    try:
        same = src.read_text(encoding="utf-8") == source
    except OSError:
        same = False
    if not same:
        _atomic_write(src, source)
    tmp = _tmp_name(d / "kernel.so")
    cmd = cpp_compile_command(src, tmp, isa, extra)
    try:
        try:
            proc = _run_compiler(cmd, cwd=d)
        except OSError as e:
            raise CppCompileError(f"cannot run the C++ compiler: {e}", source_path=src,
                                  cmd=cmd) from e
        if proc.returncode != 0:
            raise CppCompileError(f"C++ compilation failed (exit {proc.returncode})",
                                  stderr=(proc.stderr or "") + (proc.stdout or ""),
                                  source_path=src, cmd=cmd)
        try:
            data = tmp.read_bytes()
        except OSError:
            data = b""
        if not data.startswith(b"\x7fELF") and sys.platform.startswith("linux"):
            raise CppCompileError("the compiler exited 0 but wrote no shared library",
                                  stderr=proc.stderr or "", source_path=src, cmd=cmd)
        # checksum first, library second: a reader that sees the new .so also sees its checksum
        _atomic_write(d / "kernel.so.sha256", hashlib.sha256(data).hexdigest() + "\n")
        os.replace(tmp, d / "kernel.so")
    finally:
        _unlink_quiet(tmp)
    _count("cpp_compiles")
    said = ((proc.stderr or "") + (proc.stdout or "")).strip()
    if said:    # generated code compiles silently on every ISA level: anything printed is a bug to fix
        _atomic_write(d / "compiler_output.txt", said + "\n")
        warnings.warn(CompilerOutputWarning(
            f"the C++ compiler printed diagnostics for {src} (ISA level {isa!r}; kept in "
            f"{d / 'compiler_output.txt'}):\n" + "\n".join(said.splitlines()[:20])), stacklevel=2)


def _dlopen(path: Path):
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        return None


def load_cpp(source: str, isa: str | None = None, extra=()) -> ctypes.CDLL:
    """Compile ``source`` (or find it in the cache) and return the loaded library.

    Fast path (warm cache): checksum the existing ``kernel.so`` and ``dlopen`` it -- no compiler.
    Otherwise, under a file lock and after checking again, build it; a truncated or corrupted
    library (checksum mismatch, or ``dlopen`` fails) is rebuilt the same way.
    """
    isa = isa or cpu_isa()
    key = cpp_key(source, isa, extra)
    lib = _libs.get(key)
    if lib is not None:
        _count("cpp_hits")
        return lib
    with _thread_lock(key):
        lib = _libs.get(key)
        if lib is not None:
            _count("cpp_hits")
            return lib
        d = entry_dir(key)
        so = d / "kernel.so"
        if _entry_valid(d):
            lib = _dlopen(so)
        if lib is not None:
            _count("cpp_hits")
        else:
            with _file_lock(d / ".lock"):
                if _entry_valid(d):  # double check: another process may have built it
                    lib = _dlopen(so)
                if lib is not None:
                    _count("cpp_hits")
                else:
                    _build(source, isa, d, extra)
                    try:
                        lib = ctypes.CDLL(str(so))
                    except OSError as e:
                        raise CppCompileError(f"the compiled library does not load: {e}",
                                              source_path=d / "kernel.cpp") from e
        _libs[key] = lib
        return lib


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


def graph_key(gm, example_inputs, *, cpp_wrapper: bool = False) -> str | None:
    """The key of a compiled graph, or None when the graph cache is off (``stax.graph_cache``,
    ``TP_GRAPH_CACHE=0``, or ``stax.lower_debug`` / ``stax.debug`` ask to see the lowering) or an
    example input is not a tensor or a plain number.  Lowerings registered or overridden from
    outside the package, and Stax functions replaced by user code, are in the key
    (:func:`usercode.user_code_digest`; it returns to the package's key when they are removed).
    The configuration is in the key through :func:`config.digest` (the keyed knobs: heuristics,
    the toolchain; not logs, dumps or cache folders).  Not seen: a rule re-bound to another package
    function, and patches of other objects' state (a module's constants) -- set
    ``TP_GRAPH_CACHE=0`` then."""
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
    return _sha256_parts(CACHE_VERSION, "graph", gm.code, "\0".join(ins), "\0".join(consts),
                         f"cpp_wrapper={bool(cpp_wrapper)}", torch.__version__, torch.get_num_threads(),
                         sys.version, config.digest(), _package_digest(), user_code_digest())


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
    _libs.clear()
    _modules.clear()
    _compiler_version.cache_clear()
    _detect_isa.cache_clear()
    for forget in _memo_hooks:   # what a device backend memoises besides (the CPU's call extension)
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
