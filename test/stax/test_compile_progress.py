"""The compile progress bar (async_compile._progress): silent for short compiles, a tqdm bar of
kernels compiled / total on stderr once a wait passes stax.compile_progress_delay_s, off unless stderr is a
terminal or TP_COMPILE_PROGRESS=1 asks."""
import io
import time

import pytest

from tensorplay.compiler.backends.stax.cpp import async_compile as ac
from tensorplay.compiler.backends.stax.cpp import build

pytestmark = pytest.mark.usefixtures("stax_cache")


def _slow_build(seconds):
    def load_cpp(source, isa, extra=()):
        time.sleep(seconds)
        return object()     # a stand-in library: the test resolves placeholders as whole libraries
    return load_cpp


def _wait_for(monkeypatch, config_patch, n, seconds, env):
    monkeypatch.setenv("TP_COMPILE_PROGRESS", env)
    monkeypatch.setenv("TP_COMPILE_THREADS", "4")
    config_patch("stax.compile_progress_delay_s", 0.2)
    monkeypatch.setattr(build, "load_cpp", _slow_build(seconds))
    err = io.StringIO()
    monkeypatch.setattr(ac.sys, "stderr", err)
    comp = ac.AsyncCompile()
    scope = {f"k{i}": comp.cpp_library(f"// kernel {i} {time.time()}", f"k{i}") for i in range(n)}
    comp.wait(scope)
    assert all(not isinstance(v, ac.CppKernelFuture) for v in scope.values())
    return err.getvalue()


def test_long_compile_shows_kernels_done_of_total(monkeypatch, config_patch):
    out = _wait_for(monkeypatch, config_patch, 3, 0.6, "1")
    assert "tp.compile: kernels" in out and "/3 [" in out, out   # done of total (tqdm throttles updates)


def test_short_compile_is_silent(monkeypatch, config_patch):
    assert _wait_for(monkeypatch, config_patch, 2, 0.0, "1") == ""


def test_off_when_not_a_terminal_or_asked(monkeypatch, config_patch):
    assert _wait_for(monkeypatch, config_patch, 2, 0.5, "auto") == ""    # StringIO is not a terminal
    assert _wait_for(monkeypatch, config_patch, 2, 0.5, "0") == ""


def test_bad_setting_is_an_error(monkeypatch):
    monkeypatch.setenv("TP_COMPILE_PROGRESS", "yes")
    with pytest.raises(ValueError, match="TP_COMPILE_PROGRESS"):
        ac.show_progress()
