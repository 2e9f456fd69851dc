"""The CPU build: g++ and the ISA levels (the chapter, §8.1 and §11.1).

Compiling a generated C++ source is ``build(s, a) -> o`` with ``a`` everything besides the source
that determines the library; codecache.py makes it content-addressed, this module says what ``a``
is for the CPU and runs the compiler:

* the full compile command (:func:`cpp_compile_command`: fixed flags keeping IEEE semantics, the
  ISA flags, ``TP_CXXFLAGS``, a library's own flags) with placeholder paths;
* the compiler's identity (first line of ``$TP_CXX --version``), not its path;
* the *content* of the headers in this folder (``cpp_prelude.h`` and the headers it includes):
  they are compiled too;
* a fingerprint of the CPU when a flag says ``native``.

:func:`cpu_isa` detects the best of :data:`ISA_LEVELS` the machine and the compiler support (the
probes are persisted in the cache: a warm process never runs the compiler).  :func:`load_cpp`
compiles a source or finds it in the cache and loads it (file lock and double check: one compiler
run per key however many processes ask); a kernel that builds but makes the compiler print
anything raises :class:`CompilerOutputWarning` (an error in the tests).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

try:
    from .... import config
    from .. import codecache
    from ..device import KernelBuildError
    from .....profiler.recorder import active as _recording, span as _span
except ImportError:     # this file loaded alone, by its path (the code cache's tests): the cache
    def _codecache_beside():   # module of the package it lies in, loaded by its path too
        path = Path(__file__).resolve().parent.parent / "codecache.py"
        spec = importlib.util.spec_from_file_location("_tp_build_codecache", path)
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    codecache = _codecache_beside()
    config = codecache.config
    KernelBuildError = RuntimeError
    import contextlib

    def _span(*a, **k):
        return contextlib.nullcontext()

    def _recording():
        return None

CACHE_VERSION = codecache.CACHE_VERSION
_count, run_build_tool, cache_dir, entry_dir = codecache._count, codecache.run_build_tool, codecache.cache_dir, codecache.entry_dir
_sha256_parts, _sha256_file, _tmp_name = codecache._sha256_parts, codecache._sha256_file, codecache._tmp_name
_atomic_write, _unlink_quiet, _file_lock, _thread_lock = (codecache._atomic_write, codecache._unlink_quiet,
                                                          codecache._file_lock, codecache._thread_lock)
_read_probe, _write_probe = codecache._read_probe, codecache._write_probe

__all__ = ["ISA_LEVELS", "cpu_isa", "isa_flags", "compiler_version", "cpp_compile_command", "cpp_key", "load_cpp",
           "CppCompileError", "CompilerOutputWarning", "PRELUDE_DIR"]

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
PRELUDE_DIR = Path(__file__).resolve().parent


class CompilerOutputWarning(UserWarning):
    """The compiler built a kernel but printed warnings or notes.  Generated code must compile
    silently at every ISA level (a diagnostic is silenced at its cause, in the generator or the
    prelude, never asserted away); the test suite turns this warning into an error."""


class CppCompileError(KernelBuildError):
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



@functools.lru_cache(maxsize=None)
def _compiler_version(cxx: tuple, cache: str) -> str:
    fp = _exe_fingerprint(cxx)
    rec = _read_probe("compiler", fp)
    if isinstance(rec, dict) and isinstance(rec.get("version"), str):
        return rec["version"]
    try:
        proc = run_build_tool([*cxx, "--version"], timeout=60)
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
            proc = run_build_tool(cmd, timeout=120)
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
            proc = run_build_tool(cmd, cwd=d)
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
    _count("builds")
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
        _count("build_hits")
        return lib
    with _thread_lock(key):
        lib = _libs.get(key)
        if lib is not None:
            _count("build_hits")
            return lib
        d = entry_dir(key)
        so = d / "kernel.so"
        if _entry_valid(d):
            with _build_span("cpp cache hit", source, where="disk", key=key[:16]):
                lib = _dlopen(so)
        if lib is not None:
            _count("build_hits")
        else:
            with _file_lock(d / ".lock"):
                if _entry_valid(d):  # double check: another process may have built it
                    lib = _dlopen(so)
                if lib is not None:
                    _count("build_hits")
                else:
                    with _build_span("g++", source, key=key[:16], isa=isa):
                        _build(source, isa, d, extra)
                    try:
                        lib = ctypes.CDLL(str(so))
                    except OSError as e:
                        raise CppCompileError(f"the compiled library does not load: {e}",
                                              source_path=d / "kernel.cpp") from e
        _libs[key] = lib
        return lib


def _build_span(what: str, source: str, **args):
    """A profiler span ``"<what> <kernel>"``, the kernel the first ``extern "C"`` function of the
    translation unit -- looked for only while a profile records (a warm start pays nothing)."""
    if _recording() is None:
        return _span(what)          # (the shared do-nothing context)
    import re
    m = re.search(r'extern "C"[^(]*?(\w+)\s*\(', source)
    return _span(f"{what} {m.group(1) if m else 'kernel'}", "compile", **args)


def _forget() -> None:
    _libs.clear()
    _compiler_version.cache_clear()
    _detect_isa.cache_clear()


codecache.on_clear_memo(_forget)   # codecache.clear_memo forgets the loaded libraries and probes too
