"""The launchers: examples/data_parallel.py end to end under ``python -m tensorplay.distributed.launch``
and under ``torchrun`` (2 processes, its parameters equal to the single-process training), and the
launcher's exit statuses: a failing worker's status, 124 for a hung collective stopped by
``--timeout``."""
import sys
import textwrap

from spmd import REPO, run_launcher

EXAMPLE = REPO / "examples" / "data_parallel.py"


def _check_example_output(r):
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ShardedArray(global=[16, 3], spec=P('data'), local=[8, 3], mesh={'data': 2}, float32)" in r.stdout
    assert r.stdout.strip().endswith("ok"), r.stdout


def test_example_under_the_launcher():
    _check_example_output(run_launcher(2, EXAMPLE, "--steps", 12, timeout=120))


def test_example_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    _check_example_output(run_launcher(2, EXAMPLE, "--steps", 12, timeout=120, launcher=cmd))


def test_launcher_returns_a_failing_workers_status(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)        # stopped by the launcher once rank 1 has failed
    """))
    r = run_launcher(2, script, timeout=50)
    assert r.returncode == 3, r.stderr


def test_launcher_timeout_ends_a_hung_collective(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import time
        import tensorplay as tp
        import tensorplay.distributed as D
        D.init()
        mesh = D.make_mesh((2,), ("X",))
        if D.rank() == 0:      # rank 1 never joins the psum
            D.shard_map(lambda b: D.psum(b, "X"), mesh, D.P(), D.P())(tp.ones(2))
        time.sleep(120)
    """))
    r = run_launcher(2, script, timeout=12)
    assert r.returncode == 124 and "timeout after 12 s" in r.stderr, (r.returncode, r.stderr[-2000:])
