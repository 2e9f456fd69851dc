"""Reductions over more than 2^31 elements: index width and loop counters.

Index width (bounds.py, ``KernelGen._check_bounds``): a kernel uses ``int32_t`` loop counters and
index arithmetic only if every index, every partial sum on the way to it and every loop counter
(the iteration space plus the largest loop step) fits; otherwise ``int64_t``.  Regression: an
expanded input (stride 0) has tiny indices over a huge loop, so ``x.expand(1, 2**31 - 1).sum(-1)``
got int32 counters, and ``rm0 + 2 * VL <= 2147483647`` overflowed: the compiled call never
returned.  Each case runs in a subprocess under a timeout, so a regression fails instead of
hanging the suite; the inputs are expanded (no memory) and the expected values exact.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tensorplay as tp

pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py

N31 = 2 ** 31 - 1

_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import tensorplay as tp
    case, v, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    dt = {"f64": torch.float64, "amax": torch.float32, "amin": torch.float32}.get(case, torch.int64)
    base = tp.from_torch(torch.full((1, 1), v, dtype=dt))
    x, f = {
        "row": (base.expand(1, n), lambda x: x.sum(-1)),
        "full2d": (base.expand(3, n), lambda x: x.sum()),
        "col": (base.expand(n, 2), lambda x: x.sum(0)),
        "f64": (base.expand(1, n), lambda x: x.sum(-1)),
        "amax": (base.expand(1, n), lambda x: x.amax(-1)),
        "amin": (base.expand(1, n), lambda x: x.amin(-1)),
    }[case]
    cf = tp.compile(f, strict_native=True)
    cf(x)                         # the capture (eager)
    out = cf(x)                   # the Stax kernel
    print("RESULT", repr(out._data.reshape(-1).tolist()))
""")


def _run_case(case, v, n=N31, timeout=120):
    env = dict(os.environ)
    try:
        p = subprocess.run([sys.executable, "-c", _SCRIPT, case, repr(v), str(n)], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case} over {n} elements did not finish in {timeout} s (a loop-counter overflow hangs)")
    assert p.returncode == 0, p.stdout + p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return eval(line[len("RESULT "):])


@pytest.mark.parametrize("case,want", [
    ("row", lambda v, n: [n * v]),                  # 1-D sum of 2^31 - 1 elements
    ("col", lambda v, n: [n * v, n * v]),           # column sum (column mode)
    ("f64", lambda v, n: [float(n * v)]),           # float64, exact: integer values below 2^53
    # full sum of 3 (2^31 - 1) > 2^32 elements in one merged loop (eager's capture alone takes ~7 s)
    pytest.param("full2d", lambda v, n: [3 * n * v], marks=pytest.mark.slow),
])
def test_sum_over_2_31_elements_finishes_exactly(case, want):
    v = int(torch.randint(2, 1000, (1,)).item())
    got = _run_case(case, v)
    assert got == want(v, N31), (case, v, got)


@pytest.mark.slow      # eager's capture of amax/amin over 2^31 stride-0 elements takes 10-35 s
@pytest.mark.parametrize("case", ["amax", "amin"])
def test_amax_amin_over_2_31_elements_finish(case):
    v = float(torch.randn(1, dtype=torch.float32).item())
    assert _run_case(case, v) == [v]


def _idx_type(f, *args):
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    cf(*args)
    return cf._cache[0].artifact.source


def test_index_type_is_int32_when_small_and_int64_for_huge_loops():
    src = _idx_type(lambda x: x.sum(-1), tp.randn(64, 128))
    assert "using idx_t = int32_t" in src and "using idx_t = int64_t" not in src
    # indices all 0, but the loop runs past 2^31: a float32 row sum of an expanded scalar
    src = _idx_type(lambda x: x.sum(-1) * 0.5, tp.from_torch(torch.randn(1, 1)).expand(1, 2 ** 31 - 8))
    assert "using idx_t = int64_t" in src


def test_magnitude_bounds_every_partial_sum():
    import sympy
    from tensorplay.compiler.backends.stax.bounds import bound, magnitude
    a, b = sympy.symbols("a b", integer=True)
    r = {a: (0, 2 ** 31 - 1), b: (0, 3)}
    e = a - 2 ** 31 * b + 5
    assert bound(e, r).hi == 2 ** 31 + 4
    assert magnitude(e, r) == (2 ** 31 - 1) + 3 * 2 ** 31 + 5
    assert magnitude(sympy.Mod(a + 1, 3), r) == 2 ** 31
