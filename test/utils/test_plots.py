"""tensorplay.utils.plots: the figures of experiment 1 are written and not empty (with matplotlib),
and every function returns None without it."""
import sys

import pytest

from tensorplay.utils import plots

ROWS = [{"name": "ex1.1", "S": 3.9, "rho": 4.0}, {"name": "ex7.1", "S": 1.2, "rho": 1.5},
        {"name": "exp", "S": 0.97, "rho": 1.0}, {"name": "relu", "S": 1.03, "rho": 1.0}]
POINTS = [{"name": "ex1.1", "intensity": 0.5, "achieved_flops": 9e9}, {"name": "row sum", "intensity": 0.25,
                                                                        "achieved_flops": 8e9}]


def _check_png(path):
    import matplotlib.image as mpimg
    assert path is not None and path.endswith(".png")
    img = mpimg.imread(path)
    assert img.size > 0 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.var() > 0                                  # something is drawn


def test_figures_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    _check_png(plots.roofline_plot(str(tmp_path / "roof.png"), 40e9, 300e9, POINTS))
    _check_png(plots.speedup_plot(str(tmp_path / "s.png"), ROWS))
    _check_png(plots.size_sweep_plot(str(tmp_path / "sweep.png"), [1 << 10, 1 << 14, 1 << 18],
                                     {"S": [3.4, 3.6, None], "torch eager / tp": [2.0, 2.3, 4.1]},
                                     {"L1": 48 << 10, "L2": 1 << 20, "L3": 32 << 20}, 8))


def test_without_matplotlib_every_figure_is_none(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    monkeypatch.setattr(plots, "_WARNED", [])
    assert plots.pyplot() is None
    assert plots.roofline_plot(str(tmp_path / "r.png"), 40e9, 300e9, POINTS) is None
    assert plots.speedup_plot(str(tmp_path / "s.png"), ROWS) is None
    assert not list(tmp_path.iterdir())
    assert capsys.readouterr().err.count("matplotlib is not installed") == 1
