"""Tests for Stax's content-addressed code cache and parallel compile (chapter §11.1–11.2).

Every test gets an empty ``TP_CACHE_DIR`` (with the compiler/ISA probes copied in, so that each
test does not repeat them).  Several tests point ``TP_CXX`` at small shell scripts: a *counting*
compiler that appends its arguments to a log and then runs g++, and a *failing* compiler that
refuses to compile (it still answers ``--version`` like g++, so the keys are the same).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tensorplay.compiler.backends.stax.cpp import async_compile as ac
from tensorplay.compiler.backends.stax import codecache as cc
from tensorplay.compiler.backends.stax.cpp import build as cb

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

ENV_VARS = ("TP_CXX", "TP_CXXFLAGS", "TP_CPU_ISA", "TP_COMPILE_THREADS")


def kernel_src(tag: str, scale: float = 2.0, name: str = "k") -> str:
    """A small kernel x[i] = x[i] * scale + 1; ``tag`` makes the source (hence the key) unique."""
    return (f"// {tag}\n"
            f'extern "C" void {name}(float* x, long n) {{\n'
            f"  #pragma omp simd\n"
            f"  for (long i = 0; i < n; ++i) x[i] = x[i] * {scale:.1f}f + 1.0f;\n"
            f"}}\n")


def run_kernel(fn, vals=(1.0, -2.0, 3.5, 0.25)):
    fn.restype = None
    arr = (ctypes.c_float * len(vals))(*vals)
    fn(arr, ctypes.c_long(len(vals)))
    return list(arr)


def expected(scale, vals=(1.0, -2.0, 3.5, 0.25)):
    return [v * scale + 1.0 for v in vals]


def tmp_files(root: Path):
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture(scope="session")
def probes_dir(tmp_path_factory):
    """Run the compiler/ISA probes once for the session (in a scratch cache)."""
    d = tmp_path_factory.mktemp("probe_cache")
    old = {k: os.environ.pop(k, None) for k in (*ENV_VARS, "TP_CACHE_DIR")}
    os.environ["TP_CACHE_DIR"] = str(d)
    try:
        cc.clear_memo()
        cb.cpu_isa()
    finally:
        os.environ.pop("TP_CACHE_DIR")
        os.environ.update({k: v for k, v in old.items() if v is not None})
        cc.clear_memo()
    return d / "probes"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch, probes_dir):
    d = tmp_path / "cache"
    d.mkdir()
    shutil.copytree(probes_dir, d / "probes")
    monkeypatch.setenv("TP_CACHE_DIR", str(d))
    for k in ENV_VARS:
        monkeypatch.delenv(k, raising=False)
    cc.clear_memo()
    for k in cc.stats:
        cc.stats[k] = 0
    yield d
    cc.clear_memo()


def make_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def counting_cxx(tmp_path):
    """A compiler that logs every invocation (one line each), then runs g++."""
    log = tmp_path / "cxx.log"
    log.touch()
    script = make_script(tmp_path / "counting-g++", f'echo "$@" >> "{log}"\nexec g++ "$@"\n')
    return script, log


@pytest.fixture
def failing_cxx(tmp_path):
    """A compiler that answers --version like g++ but refuses to compile (and logs attempts)."""
    log = tmp_path / "fail.log"
    log.touch()
    script = make_script(
        tmp_path / "failing-g++",
        'if [ "$1" = "--version" ]; then exec g++ --version; fi\n'
        f'echo "$@" >> "{log}"\necho "failing-g++: refusing to compile" >&2\nexit 1\n')
    return script, log


# A child process that imports codecache by path (no torch: quick to start), waits for a common
# start time, loads every source (function `k`) and prints the results and its counters.
CHILD = r"""
import ctypes, importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("tp_build_child", sys.argv[1])
cb = importlib.util.module_from_spec(spec); spec.loader.exec_module(cb)
cc = cb.codecache
job = json.load(open(sys.argv[2]))
time.sleep(max(0.0, job.get("start_at", 0.0) - time.time()))
results = []
for src in job["sources"]:
    f = cb.load_cpp(src).k
    f.restype = None
    arr = (ctypes.c_float * 4)(1.0, -2.0, 3.5, 0.25)
    f(arr, ctypes.c_long(4))
    results.append(list(arr))
print(json.dumps({"results": results, "stats": cc.stats}))
"""


def spawn(tmp_path, sources, env_extra=None, start_at=0.0, tag="job"):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    job = tmp_path / f"{tag}.json"
    job.write_text(json.dumps({"sources": sources, "start_at": start_at}))
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.Popen([sys.executable, str(child), cb.__file__, str(job)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def run_child(tmp_path, sources, env_extra=None, tag="job"):
    return finish(spawn(tmp_path, sources, env_extra, tag=tag))


# --------------------------------------------------------------------------------------------
# paths, ISA, command
# --------------------------------------------------------------------------------------------

def test_cache_dir_env_and_default(tmp_path, monkeypatch, cache):
    assert cc.cache_dir() == cache
    monkeypatch.delenv("TP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "tensorplay"
    assert cc.cache_dir().is_dir()  # created on demand


def test_isa_and_compile_command(monkeypatch):
    isa = cb.cpu_isa()
    assert isa in cb.ISA_LEVELS
    assert cb.isa_flags("scalar") == ["-DTP_SCALAR"]
    assert "-DTP_VEC_BYTES=64" in cb.isa_flags("avx512")
    assert "-DTP_VEC_BYTES=32" in cb.isa_flags("avx2")
    with pytest.raises(ValueError):
        cb.isa_flags("avx1024")
    cmd = cb.cpp_compile_command(Path("a.cpp"), Path("a.so"), isa)
    assert cmd[:10] == ["g++", "-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp",
                       "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", *cb.isa_flags(isa)[:1]]
    assert cmd[-3:] == ["a.cpp", "-o", "a.so"]
    assert f"-I{cb.PRELUDE_DIR}" in cmd
    assert not any("fast-math" in c for c in cmd)  # invariant 3
    assert cb.compiler_version().startswith("g++")
    monkeypatch.setenv("TP_CPU_ISA", "sse")
    assert cb.cpu_isa() == "sse"
    monkeypatch.setenv("TP_CPU_ISA", "mmx")
    with pytest.raises(ValueError, match="TP_CPU_ISA"):
        cb.cpu_isa()


def test_isa_detection_is_persisted(cache, counting_cxx, monkeypatch):
    """Detection compiles a probe once; a new process (fresh memo) reads it from probes/."""
    script, log = counting_cxx
    shutil.rmtree(cache / "probes")
    monkeypatch.setenv("TP_CXX", str(script))
    isa = cb.cpu_isa()
    n = len(log.read_text().splitlines())
    assert n >= 1  # --version (+ the probe compiles, unless the CPU is scalar-only)
    cc.clear_memo()
    assert cb.cpu_isa() == isa
    assert len(log.read_text().splitlines()) == n  # nothing ran the second time


# --------------------------------------------------------------------------------------------
# content addressing
# --------------------------------------------------------------------------------------------

def test_content_addressing(cache, monkeypatch, counting_cxx):
    src = kernel_src("addr")
    lib = cb.load_cpp(src)
    assert run_kernel(lib.k) == expected(2.0)
    key = cb.cpp_key(src)
    assert len(key) == 64 and int(key, 16) >= 0
    d = cache / key[:2] / key
    assert cc.entry_dir(key) == d
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == \
        ["kernel.cpp", "kernel.so", "kernel.so.sha256"]
    assert (d / "kernel.cpp").read_text() == src
    # same source -> same key and folder; nothing new is compiled
    assert cb.cpp_key(src) == key
    assert cb.load_cpp(src) is lib
    assert cc.stats["builds"] == 1
    # a different source, ISA, or TP_CXXFLAGS -> a different key
    keys = {key, cb.cpp_key(kernel_src("addr", 3.0)), cb.cpp_key(src, "scalar"),
            cb.cpp_key(src, "sse")}
    monkeypatch.setenv("TP_CXXFLAGS", "-DSOMETHING=1")
    keys.add(cb.cpp_key(src))
    assert len(keys) == 5
    monkeypatch.delenv("TP_CXXFLAGS")
    # the key names the compiler by its version, not its path or the cache location
    script, _ = counting_cxx
    monkeypatch.setenv("TP_CXX", str(script))
    assert cb.cpp_key(src) == key
    monkeypatch.delenv("TP_CXX")
    monkeypatch.setenv("TP_CACHE_DIR", str(cache.parent / "elsewhere"))
    assert cb.cpp_key(src) == key
    assert tmp_files(cache) == []


def test_headers_are_part_of_the_key(tmp_path, monkeypatch):
    """Prop. 11.1 needs build to be pure: the prelude's content, not only its path, is keyed."""
    inc = tmp_path / "codegen"
    inc.mkdir()
    monkeypatch.setattr(cb, "PRELUDE_DIR", inc)
    src = '#include "cpp_prelude.h"\nextern "C" void k(float* x, long n) ' \
          '{ for (long i = 0; i < n; ++i) x[i] = x[i] * TP_SCALE + 1.0f; }\n'
    (inc / "cpp_prelude.h").write_text("#define TP_SCALE 2.0f\n")
    k1 = cb.cpp_key(src)
    assert run_kernel(cb.load_cpp(src).k) == expected(2.0)
    (inc / "cpp_prelude.h").write_text("#define TP_SCALE 3.0f\n")
    k2 = cb.cpp_key(src)
    assert k2 != k1
    assert run_kernel(cb.load_cpp(src).k) == expected(3.0)
    assert cc.stats["builds"] == 2


def test_threads_compile_each_kernel_once():
    src = kernel_src("threads")
    libs, errs = [], []

    def go():
        try:
            libs.append(cb.load_cpp(src))
        except Exception as e:  # pragma: no cover
            errs.append(e)

    ts = [threading.Thread(target=go) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs and len(libs) == 8 and all(lib is libs[0] for lib in libs)
    assert cc.stats["builds"] == 1


# --------------------------------------------------------------------------------------------
# warm cache: the compiler never runs
# --------------------------------------------------------------------------------------------

def test_warm_cache_in_process_never_compiles(cache, monkeypatch, failing_cxx):
    srcs = [kernel_src(f"warm{i}", float(i)) for i in range(3)]
    for s in srcs:
        cb.load_cpp(s)
    assert cc.stats["builds"] == 3
    cc.clear_memo()  # as if the process had just started (libraries stay on disk)
    script, log = failing_cxx
    monkeypatch.setenv("TP_CXX", str(script))
    for i, s in enumerate(srcs):
        assert run_kernel(cb.load_cpp(s).k) == expected(float(i))
    assert cc.stats["builds"] == 3
    assert log.read_text() == ""  # no compile attempt
    # and a cold kernel really does need the (failing) compiler
    with pytest.raises(cb.CppCompileError, match="refusing to compile"):
        cb.load_cpp(kernel_src("cold"))


def test_warm_cache_new_process_with_failing_compiler(tmp_path, failing_cxx):
    srcs = [kernel_src(f"newproc{i}", float(i)) for i in range(2)]
    for s in srcs:
        cb.load_cpp(s)
    script, log = failing_cxx
    out = run_child(tmp_path, srcs, {"TP_CXX": str(script)})
    assert out["results"] == [expected(0.0), expected(1.0)]
    assert out["stats"]["builds"] == 0 and out["stats"]["build_hits"] == 2
    assert log.read_text() == ""


def test_warm_new_process_runs_nothing_at_all(tmp_path, counting_cxx):
    """With the counting compiler: the cold process logs its compiles; a second process with a
    warm cache logs nothing -- not even ``--version`` (the probes are persisted)."""
    script, log = counting_cxx
    srcs = [kernel_src(f"count{i}", float(i)) for i in range(2)]
    first = run_child(tmp_path, srcs, {"TP_CXX": str(script)}, tag="first")
    assert first["stats"]["builds"] == 2
    n = len(log.read_text().splitlines())
    assert sum("-shared" in ln for ln in log.read_text().splitlines()) == 2
    second = run_child(tmp_path, srcs, {"TP_CXX": str(script)}, tag="second")
    assert second["results"] == first["results"] == [expected(0.0), expected(1.0)]
    assert second["stats"]["builds"] == 0
    assert len(log.read_text().splitlines()) == n


def test_four_processes_compile_each_kernel_once(tmp_path, cache):
    """Four processes ask for the same kernels at the same moment, in an EMPTY cache folder
    (no probes either): file lock + double check -> the compiler builds each kernel once."""
    shutil.rmtree(cache / "probes")
    log = tmp_path / "cxx.log"
    log.touch()
    # a slow compiler (0.3 s per library) so that the processes really overlap
    script = make_script(tmp_path / "slow-g++",
                         f'echo "$@" >> "{log}"\n'
                         'case "$*" in *-shared*) sleep 0.3;; esac\nexec g++ "$@"\n')
    scales = [1.0, 2.0, 3.0]
    srcs = [kernel_src(f"four{i}", s) for i, s in enumerate(scales)]
    start_at = time.time() + 1.5
    procs = [spawn(tmp_path, srcs[r:] + srcs[:r], {"TP_CXX": str(script)}, start_at,
                   tag=f"p{r}") for r in range(4)]
    outs = [finish(p) for p in procs]
    for r, out in enumerate(outs):
        order = (scales[r:] + scales[:r]) if r < 3 else scales
        assert out["results"] == [expected(s) for s in order]
    compiles = [ln for ln in log.read_text().splitlines() if "-shared" in ln]
    keys = [cb.cpp_key(s) for s in srcs]
    assert len(compiles) == 3
    for k in keys:
        assert sum(k in ln for ln in compiles) == 1
    assert sum(o["stats"]["builds"] for o in outs) == 3
    assert sum(o["stats"]["build_hits"] for o in outs) == 4 * 3 - 3
    assert tmp_files(cache) == []


# --------------------------------------------------------------------------------------------
# damaged entries are rebuilt
# --------------------------------------------------------------------------------------------

def _entry_made_elsewhere(tmp_path, src, tag):
    """Build an entry in a child process, so this process has never dlopen'ed that file."""
    run_child(tmp_path, [src], tag=tag)
    return cc.entry_dir(cb.cpp_key(src))


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "garbage_with_checksum", "no_checksum"])
def test_damaged_library_is_rebuilt(tmp_path, cache, damage):
    src = kernel_src(f"damage-{damage}", 5.0)
    d = _entry_made_elsewhere(tmp_path, src, damage)
    so = d / "kernel.so"
    good = so.read_bytes()
    if damage == "truncate":  # in place, as a crashed non-atomic writer would leave it
        with open(so, "r+b") as f:
            f.truncate(len(good) // 3)
    elif damage == "corrupt":  # same size, flipped bytes in the code
        data = bytearray(good)
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
        so.write_bytes(bytes(data))
    elif damage == "garbage_with_checksum":  # checksum consistent, but dlopen fails
        so.write_bytes(b"not a shared library" * 10)
        import hashlib
        (d / "kernel.so.sha256").write_text(hashlib.sha256(so.read_bytes()).hexdigest())
    else:
        (d / "kernel.so.sha256").unlink()
    assert run_kernel(cb.load_cpp(src).k) == expected(5.0)
    assert cc.stats["builds"] == 1
    import hashlib
    assert (d / "kernel.so.sha256").read_text().strip() == \
        hashlib.sha256(so.read_bytes()).hexdigest()
    assert so.read_bytes()[:4] == b"\x7fELF"
    assert tmp_files(cache) == []


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------

def test_compile_error_carries_stderr_and_source(cache):
    src = 'extern "C" void k(float* x, long n) { x[0] = undeclared_thing; }\n'
    with pytest.raises(cb.CppCompileError) as ei:
        cb.load_cpp(src)
    e = ei.value
    msg = str(e)
    assert "undeclared_thing" in msg and "error" in msg  # the compiler's own words
    assert "undeclared_thing" in e.stderr
    assert e.source_path is not None and e.source_path.read_text() == src
    assert str(e.source_path) in msg
    assert not (e.source_path.parent / "kernel.so").exists()
    assert tmp_files(cache) == []
    assert cc.stats["builds"] == 0


# --------------------------------------------------------------------------------------------
# Python wrapper modules
# --------------------------------------------------------------------------------------------

def test_write_py_and_load_py(cache):
    src = "X = 41\ndef f(y):\n    return X + y\n"
    p = cc.write_py(src)
    key = cc.py_key(src)
    assert p == cache / key[:2] / key / "wrapper.py"
    assert p.read_text() == src
    assert cc.write_py(src) == p and cc.stats["py_writes"] == 1  # idempotent
    p.write_text("garbage")  # a damaged file is rewritten
    assert cc.write_py(src) == p and p.read_text() == src and cc.stats["py_writes"] == 2
    m = cc.load_py(src)
    assert m.f(1) == 42 and m.__file__ == str(p)
    assert cc.load_py(src) is m  # memoised by key
    assert sys.modules[m.__name__] is m
    import inspect
    assert inspect.getsource(m.f).startswith("def f(y)")
    other = cc.write_py("X = 1\n")
    assert other.parent != p.parent
    assert cc.write_py(src, kind="graph").parent == p.parent
    assert not any(q.name == "__pycache__" for q in cache.rglob("*"))
    assert tmp_files(cache) == []


WRAPPER = '''"""A wrapper module in the style of listing 8.1: C++ kernels embedded as strings."""
import ctypes
from tensorplay.compiler.backends.stax.cpp.async_compile import AsyncCompile
async_compile = AsyncCompile()

kernel0 = async_compile.cpp(r\'\'\'{k0}\'\'\', 'kernel0')
kernel1 = async_compile.cpp(r\'\'\'{k1}\'\'\', 'kernel1')
async_compile.wait(globals())

def call(buf):
    n = ctypes.c_long(len(buf))
    kernel0(buf, n)
    kernel1(buf, n)
    return buf
'''


def test_wrapper_module_experiment_2(cache):
    """Experiment 2: the wrapper .py sits in a content-hash-named folder with the kernels in it."""
    k0, k1 = kernel_src("w0", 2.0, "kernel0"), kernel_src("w1", 3.0, "kernel1")
    src = WRAPPER.replace("{k0}", k0).replace("{k1}", k1)
    m = cc.load_py(src)
    assert isinstance(m.kernel0, ctypes._CFuncPtr) and m.kernel0.restype is None
    buf = (ctypes.c_float * 3)(1.0, 2.0, -1.0)
    assert list(m.call(buf)) == [(v * 2 + 1) * 3 + 1 for v in (1.0, 2.0, -1.0)]
    wrappers = list(cache.glob("*/*/wrapper.py"))
    assert len(wrappers) == 1
    text = wrappers[0].read_text()
    assert "extern \"C\" void kernel0" in text and "async_compile.wait(globals())" in text
    assert wrappers[0].parent.name == cc.py_key(src)
    assert len(list(cache.glob("*/*/kernel.so"))) == 2


# --------------------------------------------------------------------------------------------
# AsyncCompile
# --------------------------------------------------------------------------------------------

def test_async_compile_parallel(tmp_path, monkeypatch):
    """Kernels compile concurrently (their compiler runs overlap) and wait() resolves them."""
    log = tmp_path / "times.log"
    script = make_script(
        tmp_path / "timed-g++",
        'case "$*" in *-shared*)\n'
        f'  echo "start $(date +%s%N)" >> "{log}"; g++ "$@"; rc=$?\n'
        f'  echo "end $(date +%s%N)" >> "{log}"; exit $rc;;\n'
        'esac\nexec g++ "$@"\n')
    monkeypatch.setenv("TP_CXX", str(script))
    monkeypatch.setenv("TP_COMPILE_THREADS", "4")
    a = ac.AsyncCompile()
    scope = {f"kernel{i}": a.cpp(kernel_src(f"par{i}", float(i), f"kernel{i}"), f"kernel{i}")
             for i in range(4)}
    scope["other"] = 123
    assert all(isinstance(v, ac.CppKernelFuture) for k, v in scope.items() if k != "other")
    a.wait(scope)
    assert scope["other"] == 123
    for i in range(4):
        fn = scope[f"kernel{i}"]
        assert isinstance(fn, ctypes._CFuncPtr) and fn.restype is None
        assert run_kernel(fn) == expected(float(i))
    assert cc.stats["builds"] == 4
    events = [ln.split() for ln in log.read_text().splitlines()]
    starts = [int(t) for e, t in events if e == "start"]
    ends = [int(t) for e, t in events if e == "end"]
    assert len(starts) == 4 and min(ends) > sorted(starts)[1]  # at least two overlapped
    # already loaded: resolved at once, without the pool
    again = a.cpp(kernel_src("par0", 0.0, "kernel0"), "kernel0")
    assert again.done() and run_kernel(again.result()) == expected(0.0)
    assert cc.stats["builds"] == 4


def test_async_compile_errors_name_the_kernel(monkeypatch):
    a = ac.AsyncCompile()
    scope = {"good": a.cpp(kernel_src("good", 1.0, "good"), "good"),
             "bad": a.cpp('extern "C" void bad(float* x, long n) { nope(); }', "bad"),
             "nosym": a.cpp(kernel_src("nosym", 1.0, "k"), "nosym")}
    with pytest.raises(cb.CppCompileError) as ei:
        a.wait(scope)
    msg = str(ei.value)
    assert "kernel 'bad'" in msg and "nope" in msg and "'nosym'" in msg
    assert ei.value.kernel_name == "bad"
    assert isinstance(scope["good"], ctypes._CFuncPtr)  # the good one is resolved anyway
    with pytest.raises(cb.CppCompileError, match="no function 'nosym'"):
        scope["nosym"].result()


_ENTRY_SRC = """
#include "stax_kernel.h"
extern "C" void kd(const float* __restrict__ x, float* __restrict__ y, const int64_t* __restrict__ d) {
    for (int i = 0; i < 4; ++i) {
        if (d[i] == 0) { tp_report_error("ZeroDivisionError: integer division by zero in kd"); return; }
        y[i] = x[i] * 2.0f + (float)(100 / d[i]);
    }
}
"""


@pytest.mark.parametrize("mechanism", ["extension", "ctypes"])
def test_async_compile_entry_takes_data_pointers(monkeypatch, mechanism):
    """``cpp(..., entry=)``: the placeholder resolves to a function of the data pointers as ints
    that runs the kernel through its pointer-array entry (the Python wrapper's kernel calls); a
    kernel's run-time error is raised after the call; ctypes when the call extension is missing."""
    from tensorplay.compiler.backends.stax.cpp import call as cpp_call, wrapper as cpp_wrapper
    import torch

    from tensorplay.compiler.backends.stax.runtime import KernelZeroDivisionError
    if mechanism == "ctypes":
        monkeypatch.setattr(cpp_call, "_ext_state", {"call": None})
    params = {"x": ("float", False), "y": ("float", True), "d": ("int64_t", False)}
    src = _ENTRY_SRC + f"// {mechanism}\n" + cpp_wrapper.kernel_entry("kd", params)
    scope = {"kd": ac.AsyncCompile().cpp(src, "kd", entry="kd_entry")}
    ac.AsyncCompile().wait(scope)
    x = torch.tensor([1.0, -2.0, 3.5, 0.25])
    y = torch.zeros(4)
    d = torch.tensor([1, 3, 7, 50])
    scope["kd"](x.data_ptr(), y.data_ptr(), d.data_ptr())
    assert y.tolist() == [102.0, 29.0, 21.0, 2.5]
    d[2] = 0
    with pytest.raises(KernelZeroDivisionError, match="division by zero in kd"):
        scope["kd"](x.data_ptr(), y.data_ptr(), d.data_ptr())
    d[2] = 7                                           # the error slot was emptied by the raise
    scope["kd"](x.data_ptr(), y.data_ptr(), d.data_ptr())
    assert y.tolist() == [102.0, 29.0, 21.0, 2.5]


def test_async_compile_synchronous_mode(monkeypatch):
    monkeypatch.setenv("TP_COMPILE_THREADS", "0")
    a = ac.AsyncCompile()
    ph = a.cpp(kernel_src("sync", 4.0, "ks"), "ks")
    assert ph.done()
    scope = {"ks": ph}
    a.wait(scope)
    assert run_kernel(scope["ks"]) == expected(4.0)
    with pytest.raises(cb.CppCompileError, match="kernel 'kbad'"):  # raised at once
        a.cpp('extern "C" void kbad() { syntax error }', "kbad")


def test_compiler_output_is_a_warning_and_kept(tmp_path, monkeypatch):
    """A kernel that builds but makes g++ print something (here: an unused variable under -Wall)
    gives a CompilerOutputWarning -- an error in the test suite (pyproject filterwarnings), so every
    test that compiles a kernel also checks that the generated code compiles silently."""
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TP_CXXFLAGS", "-Wall")
    src = 'extern "C" int tp_noisy(int x) { int unused_var = x; return 2 * x; }\n'
    with pytest.warns(cb.CompilerOutputWarning, match="unused_var"):
        lib = cb.load_cpp(src, "scalar")
    lib.tp_noisy.restype = ctypes.c_int
    assert lib.tp_noisy(21) == 42
    kept = list(tmp_path.rglob("compiler_output.txt"))
    assert len(kept) == 1 and "unused_var" in kept[0].read_text()
