"""Every script in benchmarks/ imports and parses its arguments (``--help``) against this tree:
a module a benchmark imports from may move (a refactor), and the benchmark must move with it."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_imports_and_parses_arguments(script):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), "--help"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout
