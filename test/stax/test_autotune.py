"""The launch-configuration autotuner (backends/stax/triton/autotune.py; chapter §9.6–9.7, exercise 52).

* Prop. 9.3's sample count ``ceil(log δ / log(1 - q))`` (459 for q = δ = 0.01), random search draws
  that many distinct valid configs (all of a smaller space), and its quantile guarantee holds over
  many seeds;
* coordinate descent (Alg. 9.2) finds the global optimum of a separable convex cost, respects the
  validity predicate and the noise threshold, memoises, and on exercise 52 (2)'s cost stops at a
  local optimum in the slowest 1% (Prop. 9.2) that random search beats;
* failing configs cost inf; ``time_launch`` on the CPU;
* the cache: a second ``autotune`` of a key -- in this process or a fresh one -- measures nothing,
  another key or another space re-tunes, an all-failed search is not stored; the progress bar
  follows ``stax.compile_progress``;
* a real Triton kernel tuned under TRITON_INTERPRET=1 (a subprocess), its compile error as inf.
"""
import io
import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tensorplay.compiler import config
from tensorplay.compiler.backends.stax.triton import autotune as at

REPO = Path(__file__).resolve().parents[2]

POW2 = [1, 2, 4, 8, 16, 32, 64, 128]


def _counting(cost):
    calls = []

    def measure(c):
        calls.append(dict(c))
        return cost(c)
    return measure, calls


def _every(space, valid=None):
    names = list(space)
    out = [dict(zip(names, v)) for v in itertools.product(*space.values())]
    return [c for c in out if valid is None or valid(c)]


# ---- Prop. 9.3: the sample count ---------------------------------------------------------------------

def test_samples_needed_is_the_least_n_with_miss_probability_below_delta():
    assert at.samples_needed(0.01, 0.01) == 459          # exercise 52 (1)
    assert at.samples_needed(0.05, 0.05) == 59
    assert at.samples_needed(0.5, 0.25) == 2             # log δ / log(1-q) = 2 exactly: no float bump to 3
    for q, d in itertools.product((0.01, 0.05, 0.1, 0.3), (0.001, 0.01, 0.05, 0.2)):
        n = at.samples_needed(q, d)
        assert n == math.ceil(math.log(d) / math.log(1 - q) - 1e-9)
        assert (1 - q) ** n <= d < (1 - q) ** (n - 1), (q, d)
    for q, d in ((0, 0.1), (1, 0.1), (0.1, 0), (0.1, 1)):
        with pytest.raises(ValueError, match="0 < q < 1"):
            at.samples_needed(q, d)


@pytest.mark.parametrize("values", [list(range(1, 17)), list(range(1, 33))])   # enumerated / rejection-sampled
def test_random_search_measures_exactly_n_distinct_valid_configs(values):
    space = {"a": values, "b": values, "c": values, "d": values}
    assert (math.prod(map(len, space.values())) <= at.ENUMERATE_MAX) == (len(values) == 16)
    valid = lambda c: (c["a"] + c["b"]) % 3 != 0                                     # noqa: E731
    cost = lambda c: sum(c.values()) + 0.01 * c["a"]                               # noqa: E731
    measure, calls = _counting(cost)
    r = at.random_search(space, measure, q=0.01, delta=0.01, valid=valid, rng=1)
    assert len(calls) == 459 == len(r.measurements)
    assert len({tuple(c.values()) for c in calls}) == 459 and all(valid(c) for c in calls)
    assert r.seconds == min(map(cost, calls)) == cost(r.config) and r.config in calls


def test_random_search_measures_a_small_space_whole():
    space = {"XBLOCK": [16, 32, 64], "num_warps": [1, 2, 4]}
    valid = lambda c: c["num_warps"] * 32 <= c["XBLOCK"] * 2                        # noqa: E731
    every = _every(space, valid)
    assert len(every) == 6 < at.samples_needed(0.05, 0.05)
    measure, calls = _counting(lambda c: abs(c["XBLOCK"] - 32) + c["num_warps"])
    r = at.random_search(space, measure, valid=valid, rng=0)
    assert sorted(map(str, calls)) == sorted(map(str, every))
    assert r.config == {"XBLOCK": 32, "num_warps": 1} and r.seconds == 1


def test_random_search_quantile_guarantee_over_seeds():
    """Prop. 9.3 on an arbitrary cost (a random permutation of 512 distinct times): the best of
    N = 59 samples is in the best 5% in at least ~95% of the runs."""
    space = {"x": POW2, "y": POW2, "z": POW2}
    every = _every(space)
    times = list(range(1, len(every) + 1))
    random.Random(7).shuffle(times)
    cost = {tuple(c.values()): float(t) for c, t in zip(every, times)}
    cutoff = sorted(cost.values())[math.ceil(0.05 * len(every)) - 1]          # the best q-quantile: t <= cutoff
    runs, misses = 400, 0
    for seed in range(runs):
        r = at.random_search(space, lambda c: cost[tuple(c.values())], q=0.05, delta=0.05, rng=seed)
        assert len(r.measurements) == 59
        misses += r.seconds > cutoff
    # P(miss) = C(486, 59) / C(512, 59) ~ 0.042 <= δ: about 17 of 400 (a binomial; 40 is > 5 sd away)
    assert misses <= 40, misses


# ---- Alg. 9.2 / Prop. 9.2: coordinate descent --------------------------------------------------------

SPACE4 = {"XBLOCK": [2 ** k for k in range(11)], "RBLOCK": [2 ** k for k in range(11)],
          "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3, 4]}


def _separable(c):
    """A separable convex cost over the grid (in log2 of the block sizes)."""
    return (1.0 + (math.log2(c["XBLOCK"]) - 7) ** 2 + 0.5 * (math.log2(c["RBLOCK"]) - 3) ** 2
            + (math.log2(c["num_warps"]) - 2) ** 2 + 0.25 * (c["num_stages"] - 3) ** 2)


@pytest.mark.parametrize("doubling", [False, True])
def test_coordinate_descent_finds_the_global_optimum_of_a_separable_convex_cost(doubling):
    best = min(_every(SPACE4), key=_separable)
    assert best == {"XBLOCK": 128, "RBLOCK": 8, "num_warps": 4, "num_stages": 3} and _separable(best) == 1.0
    for start in ({"XBLOCK": 1, "RBLOCK": 1, "num_warps": 1, "num_stages": 1},
                  {"XBLOCK": 1024, "RBLOCK": 1024, "num_warps": 16, "num_stages": 4},
                  {"num_stages": 1, "num_warps": 16, "RBLOCK": 2, "XBLOCK": 512}):      # any key order
        measure, calls = _counting(_separable)
        r = at.coordinate_descent(start, SPACE4, measure, doubling=doubling)
        assert r.config == best and r.seconds == 1.0
        assert list(r.config) == list(SPACE4)
        # memoised: every measurement is a distinct config, and far fewer than the 2420 of the grid
        assert len(calls) == len(r.measurements) == len({tuple(c.values()) for c in calls}) < 80
        assert [c for c, _ in r.measurements] == calls and all(t == _separable(c) for c, t in r.measurements)


def test_coordinate_descent_measures_only_valid_configs():
    max_elems = 2048
    valid = lambda c: (c["XBLOCK"] * c["RBLOCK"] <= max_elems                       # noqa: E731
                       and c["num_warps"] * 32 <= c["XBLOCK"] * c["RBLOCK"])
    cost = lambda c: 1.0 / (c["XBLOCK"] * c["RBLOCK"]) + 0.001 * c["num_warps"]      # noqa: E731 (bigger is faster)
    measure, calls = _counting(cost)
    start = {"XBLOCK": 16, "RBLOCK": 8, "num_warps": 4, "num_stages": 1}
    r = at.coordinate_descent(start, SPACE4, measure, valid=valid)
    assert calls and all(valid(c) for c in calls)
    assert r.config["XBLOCK"] * r.config["RBLOCK"] == max_elems and r.config["num_warps"] == 1
    with pytest.raises(ValueError, match="not a valid config"):
        at.coordinate_descent({**start, "XBLOCK": 1024}, SPACE4, measure, valid=valid)
    with pytest.raises(ValueError, match="outside the space"):
        at.coordinate_descent({**start, "XBLOCK": 3}, SPACE4, measure)
    with pytest.raises(ValueError, match="names"):
        at.coordinate_descent({"XBLOCK": 16}, SPACE4, measure)
    with pytest.raises(ValueError, match="increasing list"):
        at.coordinate_descent({"XBLOCK": 16}, {"XBLOCK": [32, 16]}, measure)


def test_coordinate_descent_ignores_gains_below_the_noise_threshold():
    space = {"XBLOCK": [16, 32, 64]}
    assert at.NOISE_THRESHOLD == 0.01
    noise = {16: 1.0, 32: 0.995, 64: 0.99}                  # 0.5% and 1% better: noise
    r = at.coordinate_descent({"XBLOCK": 16}, space, lambda c: noise[c["XBLOCK"]])
    assert r.config == {"XBLOCK": 16} and len(r.measurements) == 2
    real = {16: 1.0, 32: 0.97, 64: 0.9}                     # 3%, then 7% better: moves twice
    r = at.coordinate_descent({"XBLOCK": 16}, space, lambda c: real[c["XBLOCK"]])
    assert r.config == {"XBLOCK": 64} and r.seconds == 0.9
    r = at.coordinate_descent({"XBLOCK": 16}, space, lambda c: noise[c["XBLOCK"]], threshold=0.0)
    assert r.config == {"XBLOCK": 64}                       # no threshold: every gain is a move


def test_coordinate_descent_steps_one_value_or_doubles():
    space = {"XBLOCK": [16, 24, 32]}
    cost = {16: 1.0, 24: 2.0, 32: 0.5}
    r = at.coordinate_descent({"XBLOCK": 16}, space, lambda c: cost[c["XBLOCK"]])
    assert r.config == {"XBLOCK": 16} and len(r.measurements) == 2    # 32 is no neighbour of 16...
    r = at.coordinate_descent({"XBLOCK": 16}, space, lambda c: cost[c["XBLOCK"]], doubling=True)
    assert r.config == {"XBLOCK": 32} and r.seconds == 0.5            # ... but 16 × 2 is, with doubling


def _moat(c):
    """Exercise 52 (2): every config costs 1 + its grid distance to (128, 128, 128), except the
    start (1, 1, 1), at 50, and its three neighbours, walls at 100 (they spill registers, say)."""
    i = [int(math.log2(v)) for v in c.values()]
    if sum(i) == 0:
        return 50.0
    if sum(i) == 1:
        return 100.0
    return 1.0 + sum(7 - k for k in i)


def test_coordinate_descent_stops_at_a_slow_local_optimum_that_random_search_beats():
    space = {"x": POW2, "y": POW2, "z": POW2}
    start = {"x": 1, "y": 1, "z": 1}
    every = sorted(_moat(c) for c in _every(space))
    r = at.coordinate_descent(start, space, _moat)
    assert r.config == start and r.seconds == 50.0 and len(r.measurements) == 4
    # Prop. 9.2: a local optimum (no neighbour faster) -- and among the slowest 1% of the 512 configs
    assert all(_moat(y) >= r.seconds for n in space for y in at._neighbours(r.config, n, space[n], True))
    assert sum(t >= r.seconds for t in every) / len(every) <= 0.01
    assert every[0] == 1.0 and r.seconds > 1.0              # not the global optimum
    # random search (N = 59 of 512) avoids it with high probability: in every one of 100 seeded runs
    rs = [at.random_search(space, _moat, rng=random.Random(seed)) for seed in range(100)]
    assert all(x.seconds < r.seconds for x in rs)
    cutoff = every[math.ceil(0.05 * len(every)) - 1]
    assert sum(x.seconds <= cutoff for x in rs) >= 90      # mostly in the best 5% (Prop. 9.3)
    # "both" = random search with the start among the candidates, then descent from its winner
    b = at.autotune("moat", start, space, _moat, method="both", rng=3)
    assert b.seconds <= rs[3].seconds and b.seconds < r.seconds
    assert all(_moat(y) >= b.seconds for n in space for y in at._neighbours(b.config, n, space[n], False))


# ---- failures and timing ---------------------------------------------------------------------------------

def test_failing_configs_cost_inf_and_are_skipped():
    space = {"XBLOCK": POW2, "RBLOCK": POW2}

    def measure(c):
        if c["XBLOCK"] * c["RBLOCK"] > 256:
            raise RuntimeError("out of resources: shared memory, Required: 262144, Hardware limit: 232448")
        return 1.0 / (c["XBLOCK"] * c["RBLOCK"])        # bigger is faster, up to the limit
    r = at.coordinate_descent({"XBLOCK": 1, "RBLOCK": 1}, space, measure)
    assert r.config["XBLOCK"] * r.config["RBLOCK"] == 256 and r.seconds == 1 / 256
    assert any(math.isinf(t) for _, t in r.measurements)
    assert all(math.isinf(t) == (c["XBLOCK"] * c["RBLOCK"] > 256) for c, t in r.measurements)
    r = at.random_search(space, measure, rng=0)
    assert math.isfinite(r.seconds) and r.config["XBLOCK"] * r.config["RBLOCK"] <= 256
    assert at.time_launch(lambda: 1 / 0, device="cpu") == math.inf
    assert at.coordinate_descent({"XBLOCK": 1}, {"XBLOCK": [1, 2]}, lambda c: float("nan")).seconds == math.inf


def test_time_launch_on_the_cpu_is_the_median_per_call():
    import time
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)
    t = at.time_launch(fn, device="cpu", warmup=2, rep=3, repeats=4)
    assert len(calls) == 2 + 3 * 4
    assert 0.002 <= t < 0.05
    m = at.launch_timer(lambda c: time.sleep(c["ms"] / 1e3), device="cpu", warmup=0, rep=2, repeats=3)
    assert 0.004 <= m({"ms": 4}) < 0.05
    with pytest.raises(ValueError, match="rep and repeats"):
        at.time_launch(fn, device="cpu", rep=0)


# ---- the cache ------------------------------------------------------------------------------------------

START = {"XBLOCK": 1, "RBLOCK": 1, "num_warps": 1, "num_stages": 1}
SUBPROCESS = """
import json, math, sys, time
from tensorplay.compiler.backends.stax.triton import autotune as at
space, start, key, *pause = json.loads(sys.argv[1])
calls = []
def measure(c):
    calls.append(c)
    time.sleep(pause[0] if pause else 0)
    return (1.0 + (math.log2(c["XBLOCK"]) - 7) ** 2 + 0.5 * (math.log2(c["RBLOCK"]) - 3) ** 2
            + (math.log2(c["num_warps"]) - 2) ** 2 + 0.25 * (c["num_stages"] - 3) ** 2)
r = at.autotune(key, start, space, measure)
print(json.dumps({"calls": len(calls), "config": r.config, "seconds": r.seconds, "n": len(r.measurements)}))
"""


def _fresh_process(cache, *args, script=SUBPROCESS, env=()):
    e = {**os.environ, "PYTHONPATH": str(REPO), "TP_CACHE_DIR": str(cache), **dict(env)}
    out = subprocess.run([sys.executable, "-c", script, *args], env=e, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_autotune_remembers_across_calls_and_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    key = at.tuning_key("kernel source", "cpu", (1024, 64))
    measure, calls = _counting(_separable)
    r = at.autotune(key, START, SPACE4, measure)
    n = len(calls)
    assert n > 0 and r.config == {"XBLOCK": 128, "RBLOCK": 8, "num_warps": 4, "num_stages": 3}
    files = list(tmp_path.glob("*/*/autotune.json"))
    assert len(files) == 1 and files[0].parent.name[:2] == files[0].parent.parent.name
    entry = json.loads(files[0].read_text())
    assert entry["format"] == at.TUNE_VERSION and entry["key"] == key and entry["method"] == "coordinate"
    assert entry["config"] == r.config and entry["seconds"] == 1.0 and len(entry["measurements"]) == n
    assert not list(tmp_path.glob("**/.*.tmp"))                                   # written atomically
    hits = at.codecache.stats.get("tune_hits", 0)
    again = at.autotune(key, START, SPACE4, measure)                              # this process: no measurement
    assert len(calls) == n and again == (r.config, r.seconds, r.measurements)
    assert at.codecache.stats["tune_hits"] == hits + 1
    fresh = _fresh_process(tmp_path, json.dumps([SPACE4, START, key]))           # a new process: none either
    assert fresh == {"calls": 0, "config": r.config, "seconds": 1.0, "n": n}
    other = at.tuning_key("kernel source", "cpu", (1024, 65))                     # another size: re-tunes
    assert _fresh_process(tmp_path, json.dumps([SPACE4, START, other]))["calls"] == n
    at.autotune(key, START, {**SPACE4, "num_stages": [1, 2, 3]}, measure)         # another space: re-tunes
    assert len(calls) > n
    assert len(list(tmp_path.glob("*/*/autotune.json"))) == 3


def test_concurrent_processes_tune_a_key_once(tmp_path):
    """Two processes ask for one key at once: the file lock lets one measure, the other reads its entry."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "TP_CACHE_DIR": str(tmp_path)}
    arg = json.dumps([SPACE4, START, "concurrent", 0.02])
    procs = [subprocess.Popen([sys.executable, "-c", SUBPROCESS, arg], env=e, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    calls = sorted(o["calls"] for o in outs)
    assert calls[0] == 0 and calls[1] > 0 and outs[0]["config"] == outs[1]["config"]


def test_autotune_does_not_store_an_all_failed_search(tmp_path, monkeypatch):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    measure, calls = _counting(lambda c: 1 / 0)
    r = at.autotune("broken", {"XBLOCK": 16}, {"XBLOCK": [16, 32]}, measure, method="random", rng=0)
    assert r.seconds == math.inf and len(calls) == 2
    at.autotune("broken", {"XBLOCK": 16}, {"XBLOCK": [16, 32]}, measure, method="random", rng=0)
    assert len(calls) == 4 and not list(tmp_path.glob("*/*/autotune.json"))
    with pytest.raises(ValueError, match="method"):
        at.autotune("k", {"XBLOCK": 16}, {"XBLOCK": [16]}, measure, method="exhaustive")


def test_tuning_key_covers_source_device_triton_and_sizes(monkeypatch):
    k = at.tuning_key("src", "NVIDIA H200 sm_90", (4096, 128), "float16")
    assert k == at.tuning_key("src", "NVIDIA H200 sm_90", (4096, 128), "float16") and len(k) == 64
    assert len({k, at.tuning_key("src2", "NVIDIA H200 sm_90", (4096, 128), "float16"),
                at.tuning_key("src", "NVIDIA H100 sm_90", (4096, 128), "float16"),
                at.tuning_key("src", "NVIDIA H200 sm_90", (4096, 256), "float16")}) == 4
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(triton, "__version__", "0.0.0")
    assert at.tuning_key("src", "NVIDIA H200 sm_90", (4096, 128), "float16") != k
    assert at.device_description("cpu") == "cpu"


def test_method_follows_the_modes_of_table_11_1():
    assert at.method_for_options(config.resolve_options("max-autotune")) == "both"
    assert at.method_for_options(config.resolve_options("max-autotune-no-cudagraphs")) == "both"
    assert at.method_for_options(config.resolve_options(None, {"stax.max_autotune": True})) == "random"
    assert at.method_for_options(config.resolve_options(None, {"stax.coordinate_descent_tuning": True})) \
        == "coordinate"
    assert at.method_for_options(config.resolve_options("default")) is None


@pytest.mark.parametrize("setting, shown", [("1", True), ("0", False), ("auto", False)])
def test_progress_bar_follows_the_compile_progress_knob(tmp_path, monkeypatch, config_patch, setting, shown):
    monkeypatch.setenv("TP_CACHE_DIR", str(tmp_path))
    config_patch({"stax.compile_progress": setting, "stax.compile_progress_delay_s": 0.0})
    err = io.StringIO()                                   # not a terminal: "auto" is off
    monkeypatch.setattr(sys, "stderr", err)
    at.autotune(f"progress-{setting}", START, SPACE4, _separable, desc="kernel0")
    out = err.getvalue()
    assert ("tp.compile: autotune kernel0" in out and "config" in out) == shown, out
    assert (out != "") == shown


# ---- a real Triton kernel, interpreted on the CPU ------------------------------------------------------

TRITON_SCRIPT = """
import json, math, torch, triton, triton.language as tl
from tensorplay.compiler.backends.stax.triton import autotune as at
assert triton.knobs.runtime.interpret

@triton.jit
def affine(x, y, n, XBLOCK: tl.constexpr):
    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offs < n
    tl.store(y + offs, tl.load(x + offs, mask=mask) * 2.0 + 1.0, mask=mask)

n = 1024
x = torch.randn(n)
y = torch.empty_like(x)
launches = []
def launch(c):
    launches.append(c["XBLOCK"])
    affine[(triton.cdiv(n, c["XBLOCK"]),)](x, y, n, **c)
measure = at.launch_timer(launch, device=x.device, warmup=1, rep=2, repeats=3)
space = {"XBLOCK": [16, 32, 64], "num_warps": [4]}
key = at.tuning_key(getattr(affine, "src", affine.fn.__name__), at.device_description(x.device), n)
r = at.autotune(key, {"XBLOCK": 16, "num_warps": 4}, space, measure, method="coordinate")
tuned = len(launches)
again = at.autotune(key, {"XBLOCK": 16, "num_warps": 4}, space, measure, method="coordinate")
y.zero_()
launch(r.config)
print(json.dumps({"config": r.config, "times": {str(c["XBLOCK"]): t for c, t in r.measurements},
                  "tuned": tuned, "after": len(launches) - 1, "same": again == r,
                  "correct": bool(torch.allclose(y, x * 2 + 1)),
                  "bad": measure({"XBLOCK": 48, "num_warps": 4})}))   # tl.arange needs a power of 2
"""


def test_tunes_a_triton_kernel_under_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    r = _fresh_process(tmp_path, script=TRITON_SCRIPT, env={"TRITON_INTERPRET": "1"})
    assert r["config"] == {"XBLOCK": 64, "num_warps": 4}       # fewer programs: the interpreter's cost
    t = r["times"]
    assert set(t) == {"16", "32", "64"} and all(0 < v < math.inf for v in t.values())
    assert t["16"] > t["32"] > t["64"]
    assert r["tuned"] == 3 * (1 + 2 * 3) and r["after"] == r["tuned"] and r["same"]   # the second call: cached
    assert r["correct"] and r["bad"] == math.inf
