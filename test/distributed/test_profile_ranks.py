"""Per-rank traces of a 2-process run merged into one (tp.profiler.merge_traces): one process
track per rank, the collective matched across the ranks (same group id, its bytes), and the
critical path of seed 001 §1 -- the slow rank's work and the all-reduce decide T; the fast rank's
psum bar is long because it waits, and shortening the fast rank's work changes nothing."""
import pytest

from spmd import run_launcher
from tensorplay.profiler import merge_traces
from tensorplay.profiler.critical_path import analyze_trace


def test_merged_rank_traces_and_the_critical_path(tmp_path):
    r = run_launcher(2, __file__.replace("test_profile_ranks.py", "profile_worker.py"), tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    merged = merge_traces([tmp_path / "rank0.json", tmp_path / "rank1.json"], tmp_path / "merged.json.gz")
    names = sorted(e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name")
    assert names == ["tensorplay (rank 0)", "tensorplay (rank 1)"]
    xs = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    psums = [e for e in xs if e["name"] == "dist_psum"]
    assert len(psums) == 2 and psums[0]["args"]["collective"] == psums[1]["args"]["collective"]
    assert all(e["args"]["bytes"] == 4000 for e in psums)
    pid_of = {e["pid"]: e["args"]["name"][-2] for e in merged["traceEvents"] if e["name"] == "process_name"}
    work = {pid_of[e["pid"]]: e for e in xs if e["name"] == "work"}
    psum = {pid_of[e["pid"]]: e for e in psums}
    assert psum["0"]["dur"] > 70e3          # rank 0's all-reduce bar includes ~140 ms of waiting
    cp = analyze_trace(tmp_path / "merged.json.gz")
    rows = {(r.activity.track, r.name): r for r in cp.rows.values()}
    track = {k: (e["pid"], e["tid"]) for k, e in work.items()}
    fast, slow = rows[(track["0"], "work")], rows[(track["1"], "work")]
    assert slow.on_path and not fast.on_path and fast.added == 0
    assert fast.slack > 0.5 * (slow.duration - fast.duration)
    p0 = rows[(track["0"], "dist_psum")]
    assert p0.busy < p0.duration / 2        # most of the fast rank's bar is waiting, not work
    assert cp.what_if({fast.id: fast.busy / 2}) == pytest.approx(cp.total, rel=1e-6)
