"""python -m tensorplay.experiments.roofline: one quick run writes its JSON (and figures where
matplotlib is installed); the speed-up decomposition in it is Prop. 13.3's identity on the
measured medians."""
import json
import math
import os

import pytest

from tensorplay.experiments import roofline
from tensorplay.utils.benchmark import speedup_decomposition


def test_speedup_decomposition_is_the_ratio_of_times():
    d = speedup_decomposition(t_eager=12e-3, t_compiled=4e-3, bytes_eager=8e6, bytes_compiled=2e6)
    assert d["S"] == pytest.approx(3.0) and d["rho"] == 4.0
    assert d["beta_e"] == pytest.approx(8e6 / 12e-3) and d["beta_c"] == pytest.approx(2e6 / 4e-3)
    assert d["rho"] * d["beta_c"] / d["beta_e"] == pytest.approx(d["S"])


def test_quick_run_writes_json_and_figures(tmp_path):
    out = tmp_path / "e1"
    doc = roofline.main(["--quick", "--cases", "ex1.1,row sum", "--repeats", "3", "--sweep", "10:12:2",
                         "--no-torch-compile", "--skip-error-model", "--out", str(out)])
    saved = json.loads((out / "experiment1.json").read_text())
    m = saved["machine"]
    assert 1e9 < m["B"] < 1e13 and 1e8 < m["P"] < 1e15 and m["ridge"] == pytest.approx(m["P"] / m["B"])
    assert m["B"] == max(m["bandwidth_rounds"]) and len(m["bandwidth_rounds"]) == 3   # start + one per case
    assert [c["case"] for c in saved["cases"]] == ["ex1.1 (relu(x+w)*2).sum(-1)", "row sum"]
    for c in saved["cases"]:
        te, tc = c["variants"]["tp eager"]["median"], c["variants"]["tp compiled"]["median"]
        assert c["S"] == pytest.approx(te / tc)                                       # computed afresh
        assert c["rho"] == pytest.approx(c["bytes_eager"] / c["bytes_compiled"])
        assert c["S"] == pytest.approx(c["rho"] * c["beta_c_GBps"] / c["beta_e_GBps"])
        assert c["roofline"]["intensity"] == pytest.approx(c["flops"] / c["bytes_compiled"])
        assert c["compile_s"] > 0
        n_star = c["break_even_calls"]        # null: the compiled call was not faster (N* = inf)
        assert (n_star is None) == (te <= tc)
        if n_star is not None:
            assert n_star == pytest.approx(c["compile_s"] / ((te - tc) * 1e-3))
    ex11 = saved["cases"][0]
    assert ex11["rho"] == pytest.approx(4.0, rel=1e-3)      # 8N eager against 2N fused (+ the output)
    assert [p["N"] for p in saved["size_sweep"]] == [1 << 10, 1 << 12]
    assert all(p["fits_in"] == "L1" for p in saved["size_sweep"])
    assert doc["cases"][0]["case"] == ex11["case"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert all(v is None for v in saved["figures"].values())
        return
    for name in ("roofline", "speedup_vs_rho", "size_sweep"):
        path = saved["figures"][name]
        assert path == os.path.join(str(out), f"{name}.png") and os.path.getsize(path) > 0


def test_error_model_check_on_example_1_1():
    em = roofline.error_model_check(R=256, C=2048)
    assert em["compiled_error_std"] > 0 and em["eager_error_std"] > 0
    # the measured deviation lies below Corollary 13.1's prediction for one way, near the one for 16-32
    assert em["compiled_error_std"] < em["predicted_std"]["1"] / 4
    assert 0.3 < em["compiled_error_std"] / em["predicted_std"]["32"] < 1.5
    assert em["max_compiled_minus_eager"] <= em["tolerance_paired_W16"]
    assert math.isclose(em["term_mean"], 2 * math.sqrt(2) / math.sqrt(2 * math.pi), rel_tol=0.02)
