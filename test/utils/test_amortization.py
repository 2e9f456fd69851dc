"""Compile amortisation (chapter §13.4, Prop. 13.4): N* = C / (t_e - t_c), in compiler/cost.py and
``Compiled.cost_analysis``."""
import math

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler.cost import amortization, break_even_calls


def test_break_even_on_known_numbers():
    assert break_even_calls(2.0, 3e-3, 1e-3) == pytest.approx(1000.0)
    # the chapter's example 1.1: C = 5.6 s, 13.2 ms saved per call -> m* ~ 420
    assert break_even_calls(5.6, 16.6e-3, 3.4e-3) == pytest.approx(5.6 / 13.2e-3)
    assert math.ceil(break_even_calls(5.6, 16.6e-3, 3.4e-3)) == 425
    assert break_even_calls(1.0, 1e-3, 1e-3) == math.inf          # not faster: never pays
    assert break_even_calls(1.0, 1e-3, 2e-3) == math.inf
    assert break_even_calls(0.0, 2e-3, 1e-3) == 0.0
    with pytest.raises(ValueError, match="times must be >= 0"):
        break_even_calls(-1.0, 2e-3, 1e-3)


def test_amortization_measures_only_what_is_missing():
    calls = []
    r = amortization(lambda: calls.append("e"), lambda: calls.append("c"), compile_s=0.5, t_eager=4e-3,
                     t_compiled=1e-3)
    assert calls == [] and r["saving_per_call_s"] == pytest.approx(3e-3)
    assert r["break_even_calls"] == pytest.approx(0.5 / 3e-3)
    r = amortization(lambda: calls.append("e"), lambda: calls.append("c"), compile_s=0.5, t_eager=4e-3,
                     repeats=3, warmup=1)
    assert calls == ["c"] * 4 and 0 < r["t_compiled_s"] < 4e-3 and math.isfinite(r["break_even_calls"])


def _ex11(x, w):
    return (tp.relu(x + w) * 2).sum(-1)


def test_cost_analysis_reports_break_even_of_a_real_compiled_function():
    """Example 1.1 fused into one kernel is faster than its four eager ops, so N* is finite and
    follows the formula from the reported times; without times the dict is the cost analysis only."""
    g = torch.Generator().manual_seed(0)
    x, w = (tp.from_torch(torch.randn(256, 2048, generator=g)) for _ in range(2))
    c = tp.compile(_ex11, strict_native=True).lower(x, w).compile()
    plain = c.cost_analysis()
    assert set(plain) == {"flops", "bytes_accessed", "input_bytes", "output_bytes", "intermediate_bytes"}
    r = c.cost_analysis(args=(x, w), repeats=7)
    assert r["flops"] == plain["flops"] and r["compile_s"] > 0
    assert r["t_eager_s"] > r["t_compiled_s"] > 0
    assert math.isfinite(r["break_even_calls"]) and r["break_even_calls"] > 0
    assert r["break_even_calls"] == pytest.approx(r["compile_s"] / (r["t_eager_s"] - r["t_compiled_s"]))
    given = c.cost_analysis(compile_s=3.0, t_eager=5e-3, t_compiled=2e-3)
    assert given["break_even_calls"] == pytest.approx(1000.0)
    assert c.cost_analysis(compile_s=3.0, t_eager=2e-3, t_compiled=2e-3)["break_even_calls"] == math.inf
    with pytest.raises(ValueError, match="give args"):
        c.cost_analysis(compile_s=3.0)
