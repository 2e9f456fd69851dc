"""``spmd`` (session fixture): one run of spmd_worker.py on 4 processes (a 2x2 mesh) with every
scenario of spmd_cases.py; ``spmd[rank][scenario]`` is what that rank recorded.  The kernel cache
of the workers is the test session's (test/conftest.py)."""
import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import spmd_cases  # noqa: E402
from spmd import run_launcher  # noqa: E402


@pytest.fixture(scope="session")
def spmd(tmp_path_factory):
    out = tmp_path_factory.mktemp("spmd")
    cache = os.environ.get("TP_TEST_CACHE") or tmp_path_factory.getbasetemp() / "tp_cache"
    r = run_launcher(spmd_cases.WORLD, HERE / "spmd_worker.py", out, *spmd_cases.SCENARIOS, cache_dir=cache)
    assert r.returncode == 0, f"spmd_worker.py failed (exit {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    return [torch.load(out / f"rank{k}.pt", weights_only=False) for k in range(spmd_cases.WORLD)]
