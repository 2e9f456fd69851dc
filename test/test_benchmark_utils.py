"""tensorplay.utils.benchmark: the reading protocol of the benchmarks (chapter §13.1)."""
import math
import random

from tensorplay.utils.benchmark import Stats, compare, median_ci, paired_ratio


def test_compare_shuffles_rounds_so_every_callable_follows_every_other():
    log = []
    fns = {k: (lambda k=k: log.append(k)) for k in "ABCD"}
    res = compare(fns, repeats=40, warmup=2)
    assert all(len(res[k].times) == 40 for k in fns)
    timed = log[2 * 4:]                       # the warm-up calls run in the given order
    assert len(timed) == 160
    rounds = [timed[i:i + 4] for i in range(0, 160, 4)]
    assert all(sorted(r) == list("ABCD") for r in rounds)        # each round runs each once
    pred = {(a, b) for a, b in zip(timed, timed[1:])}
    assert {(a, b) for a in "ABCD" for b in "ABCD" if a != b} <= pred   # every predecessor occurs
    assert len({tuple(r) for r in rounds}) > 4                    # not one order, not a rotation
    log.clear()
    compare(fns, repeats=3, warmup=0, shuffle=False)
    assert log == list("ABCD") * 3


def test_compare_is_repeatable_for_a_seed():
    def run(seed):
        log = []
        compare({k: (lambda k=k: log.append(k)) for k in "XYZ"}, repeats=10, warmup=0, seed=seed)
        return log
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_median_ci_coverage_is_the_binomial_sum():
    xs = sorted(random.Random(0).random() for _ in range(15))
    lo, hi, cov = median_ci(xs)
    assert (lo, hi) == (xs[3], xs[11])            # (j, k) = (4, 12) for n = 15 (Prop. 13.2)
    assert math.isclose(cov, sum(math.comb(15, i) for i in range(4, 12)) / 2 ** 15)
    assert cov >= 0.95


def test_paired_ratio_cancels_a_common_drift():
    drift = [1.0 + 0.5 * i for i in range(15)]     # the machine slows down 8x during the run
    res = {"a": Stats("a", [2.0 * d for d in drift]), "b": Stats("b", [1.0 * d for d in drift])}
    m, lo, hi = paired_ratio(res, "a", "b")
    assert (m, lo, hi) == (2.0, 2.0, 2.0)
    assert res["a"].median / res["b"].median == 2.0 and res["a"].ci[1] / res["b"].ci[0] > 2.5


def test_compare_before_runs_untimed_before_each_reading():
    import time
    log = []
    fns = {"A": lambda: log.append("A"), "B": lambda: log.append("B")}
    res = compare(fns, repeats=6, warmup=0, before={"B": lambda: (log.append("evict"), time.sleep(0.02))})
    assert log.count("evict") == 6 and all(log[i + 1] == "B" for i, x in enumerate(log) if x == "evict")
    assert max(res["B"].times) < 0.015                     # the sleep before B is not in its readings
    log.clear()
    compare(fns, repeats=3, warmup=0, before=lambda: log.append("x"))
    assert log.count("x") == 6 and log[::2] == ["x"] * 6


def test_time_fn_on_the_cpu_reads_the_host_clock():
    import time

    import torch

    from tensorplay.utils.benchmark import is_cuda, machine_description, time_fn
    assert not is_cuda(None) and not is_cuda("cpu") and not is_cuda(torch.device("cpu"))
    assert is_cuda("cuda") and is_cuda("cuda:1") and is_cuda(torch.device("cuda", 0))
    for device in (None, "cpu"):
        t = time_fn(lambda: time.sleep(0.01), number=2, device=device)
        assert 0.009 < t < 0.05
    log = []
    time_fn(lambda: log.append("call"), sync=lambda: log.append("sync"), device="cpu")
    assert log == ["sync", "call", "sync"]
    assert machine_description("cpu") == machine_description()       # no GPU part on the CPU


class _FakeCuda:
    """torch.cuda's timing calls, logged, on a fake device clock that the timed function advances."""

    def __init__(self, monkeypatch):
        import torch
        self.log, self.clock, fake = [], [0.0], self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, stream):
                fake.log.append(("record", stream))
                self.t = fake.clock[0]

            def synchronize(self):
                fake.log.append("event.synchronize")

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3                           # milliseconds, as CUDA's
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fake.log.append("synchronize"))

    def kernel(self, name, seconds):
        def launch():
            self.log.append(name)
            self.clock[0] += seconds
        return launch


def test_cuda_timer_records_events_on_the_current_stream_around_the_calls(monkeypatch):
    from tensorplay.utils.benchmark import cuda_time_fn, time_fn
    cuda = _FakeCuda(monkeypatch)
    t = cuda_time_fn(cuda.kernel("k", 0.002), number=3)
    assert abs(t - 0.002) < 1e-12                                       # per call, in seconds
    assert cuda.log == ["synchronize", ("record", "stream"), "k", "k", "k", ("record", "stream"),
                        "event.synchronize"]
    cuda.log.clear()
    assert abs(time_fn(cuda.kernel("k", 0.001), device="cuda:0") - 0.001) < 1e-12
    assert cuda.log[0] == "synchronize" and cuda.log[-1] == "event.synchronize"


def test_compare_on_cuda_times_every_reading_by_events_and_before_stays_outside(monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    fns = {"A": cuda.kernel("A", 0.001), "B": cuda.kernel("B", 0.003)}
    res = compare(fns, repeats=5, warmup=1, device="cuda", before={"B": cuda.kernel("evict", 1.0)})
    assert all(abs(t - 0.001) < 1e-9 for t in res["A"].times) and all(abs(t - 0.003) < 1e-9 for t in res["B"].times)
    timed = cuda.log[2:]                                                 # after the warm-up calls
    evicts = [i for i, x in enumerate(timed) if x == "evict"]
    assert len(evicts) == 5      # the untimed eviction: finished (synchronised) before the first event
    assert all(timed[i + 1:i + 4] == ["synchronize", ("record", "stream"), "B"] for i in evicts)


def test_stats_as_dict_scales_readings_and_summary():
    s = Stats("x", [0.003, 0.001, 0.002])
    d = s.as_dict()
    assert d["median"] == 2.0 and d["min"] == 1.0 and d["readings"] == [3.0, 1.0, 2.0]
    assert d["ci"] == [1.0, 3.0] and d["coverage"] == s.ci[2]
    assert s.as_dict(scale=1)["median"] == 0.002


def _table13():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "table13.py")
    spec = importlib.util.spec_from_file_location("table13_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table13_quick_json_with_a_case_that_does_not_compile(monkeypatch, tmp_path, capsys):
    """A quick CPU run of two cases to JSON: 'exp' compiles (with B's probe in its rounds: the LLC is
    made 1 MiB, so its 4 MiB input exceeds twice that); 'row sum' fails to compile as a GPU case of
    the Triton backend may (StaxStrictError): its tp-compiled cells read n/a, and the run goes on."""
    import json

    from tensorplay.compiler.backends.stax import StaxStrictError
    t13 = _table13()
    monkeypatch.setattr(t13, "last_level_cache_bytes", lambda: 1 << 20)
    real, compiles = t13.tp.compile, []

    def compile_(fn, **kw):
        compiles.append(kw)
        if len(compiles) == 1:
            return real(fn, **kw)

        def fails(*xs):
            raise StaxStrictError("row sum: no Stax kernel for this reduction (test)")
        return fails
    monkeypatch.setattr(t13.tp, "compile", compile_)
    out = tmp_path / "t13.json"
    rows = t13.main(["--quick", "--repeats", "3", "--warmup", "1", "--no-torch-compile", "--cases", "exp,row sum",
                     "--json", str(out)])
    assert compiles == [{"strict_native": True}] * 2
    text = capsys.readouterr().out
    assert "row sum: tp.compile(strict_native=True) failed on cpu" in text and "StaxStrictError" in text
    assert "beta_c/copy" not in text and "| beta_c/B adj | compile s |" in text    # the CPU's columns
    assert len(rows) == 2 and all(len(r) == 17 for r in rows)
    assert rows[1][2] == "n/a" and rows[1][5] == "n/a" and rows[1][4] == "-"

    def no_nan(c):
        raise AssertionError(f"non-finite {c} in the JSON")
    doc = json.loads(out.read_text(), parse_constant=no_nan)
    assert doc["device"] == "cpu" and doc["sizes"] == {"R": 2048, "C": 512, "SR": 4096, "SC": 250}
    bw = doc["bandwidth"]
    assert len(bw["read_round_medians_GBps"]) == 3 and bw["B_GBps"] == max(bw["read_round_medians_GBps"])
    exp, rsum = doc["cases"]
    assert exp["case"] == "exp" and exp["error"] is None
    assert set(exp["variants"]) == {"tp eager", "tp compiled", "torch eager", "B probe"}
    v = exp["variants"]["tp compiled"]
    assert len(v["readings"]) == 3 and v["ci"][0] <= v["median"] <= v["ci"][1]
    assert abs(exp["S"] - exp["variants"]["tp eager"]["median"] / v["median"]) < 1e-9
    assert exp["vs_torch_compile"] is None and exp["paired_vs_torch_compile"] is None
    assert exp["beta_c_over_B_in_round"]["lo"] <= exp["beta_c_over_B_in_round"]["median"]
    assert abs(exp["beta_c_over_B"] - exp["beta_c_GBps"] / bw["B_GBps"]) < 1e-9
    assert rsum["error"].startswith("StaxStrictError: row sum")
    assert "tp compiled" not in rsum["variants"] and rsum["S"] is None and rsum["beta_c_over_B"] is None
    assert rsum["beta_e_GBps"] > 0
    # on a GPU the row has beta_c / copy bandwidth after beta_c/B adj
    row = t13._row(dict(exp, beta_c_over_copy=0.9), cuda=True)
    assert len(row) == 18 and row[12] == rows[0][12] and row[13] == "90%" and row[14] == rows[0][13]
