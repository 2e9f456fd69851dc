"""TP_STAX_DEBUG dumps every Stax stage: loop IR, schedule, generated code (docs/debugging.md)."""

import pytest
import torch

import tensorplay as tp


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _softmax_like(x):
    return x / x.sum(-1, keepdim=True)


def test_all_stages_printed(monkeypatch, capfd):
    monkeypatch.setenv("TP_STAX_DEBUG", "1")
    x = tp.randn(8, 16)
    cf = tp.compile(_softmax_like, strict_native=True)
    out = cf(x)
    err = capfd.readouterr().err
    assert "[stax] ir" in err and "sum_{j0<16} load(arg0, 16*i0 + j0)" in err
    assert "truediv(load(arg0, 16*i0 + i1), load(buf0, i0))" in err
    assert "[stax] schedule" in err and "buf0     reduce  local" in err      # ex 7.1: the sum never reaches memory
    assert "[stax] code" in err and 'extern "C" void kernel0' in err and "def call(args)" in err
    assert torch.allclose(out._data, _softmax_like(x._data), rtol=1e-6)


def test_selected_stages_to_directory(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("TP_STAX_DEBUG", "ir,code")
    monkeypatch.setenv("TP_STAX_DEBUG_DIR", str(tmp_path))
    cf = tp.compile(lambda x: (x.exp() + 1).amax(0), strict_native=True)
    cf(tp.randn(5, 7))
    assert "debug dumps written" in capfd.readouterr().err
    (d,) = list(tmp_path.iterdir())
    assert sorted(p.name for p in d.iterdir()) == ["code.txt", "ir.txt"]
    assert "max_{j0<5}" in (d / "ir.txt").read_text()
    assert "kernel0" in (d / "code.txt").read_text()


def test_dumps_printed_again_when_the_graph_cache_is_warm(monkeypatch, capfd):
    monkeypatch.setenv("TP_STAX_DEBUG", "schedule")
    for _ in range(2):   # a new tp.compile of the same graph: the graph cache must not hide the dump
        tp.compile(_softmax_like, strict_native=True)(tp.randn(8, 16))
        assert "[stax] schedule" in capfd.readouterr().err


def test_nothing_printed_by_default(monkeypatch, capfd):
    monkeypatch.delenv("TP_STAX_DEBUG", raising=False)
    tp.compile(lambda x: x * 3)(tp.randn(4))
    assert "[stax]" not in capfd.readouterr().err
