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
