"""Critical-path analysis (tensorplay/profiler/critical_path.py):

* the seed's all-reduce of two devices (ready at 4 and 9 ms, 2 ms of communication): T = 11, the
  path is device 1's compute then the all-reduce, device 0's compute adds 0 with slack 5, its
  communication call lasts 7 and works 2; what if device 0 computed 2 ms (T stays 11, the call grows
  to 9), device 1 5 ms (T = 7) or 3 ms (T = 6, the path moves to device 0); from Activities and from
  Chrome trace events (a dict and a file);
* a host thread launching three kernels on one stream (flows host -> kernel): a busy GPU puts the
  stream on the path, a slow host the launches; a parent host span's own time counts as work;
* the guarantees: added + idle = T, what_if({}) = T, growth beyond slack moves T one for one;
* errors that name the activity: a cycle, an unknown dependency, end < start, overlap on a track.
"""
import json

import pytest

from tensorplay.profiler.critical_path import Activity, analyze, analyze_trace, from_trace


def _names(report):
    return [a.name for a in report.path]


def _check_guarantees(report):
    assert sum(s.added for s in report.steps) + report.idle == pytest.approx(report.total)
    assert report.what_if({}) == pytest.approx(report.total)
    for row in report.rows.values():
        assert row.slack >= 0
        if not row.on_path:
            assert row.added == 0
    for step in report.steps:
        assert report.rows[step.activity.id].slack == 0


# ---------------------------------------------------------------------------------------------
# the seed's all-reduce
# ---------------------------------------------------------------------------------------------
def _allreduce_activities():
    return [
        Activity("dev0 compute", "device 0", 0, 4),
        Activity("dev0 allreduce", "device 0", 4, 11, group="ar", kind="collective"),
        Activity("dev1 compute", "device 1", 0, 9),
        Activity("dev1 allreduce", "device 1", 9, 11, group="ar", kind="collective"),
    ]


def _check_allreduce(r, dev0_compute, dev0_ar, dev1_compute):
    assert r.total == 11
    assert _names(r) == ["dev1 compute", "dev1 allreduce"]
    assert [s.added for s in r.steps] == [9, 2] and r.idle == 0
    assert r.steps[1].last_arriver.name == "dev1 allreduce"
    c0, a0 = r.rows[dev0_compute], r.rows[dev0_ar]
    assert (c0.duration, c0.busy, c0.on_path, c0.added, c0.slack) == (4, 4, False, 0, 5)
    assert (a0.duration, a0.busy, a0.wait, a0.added) == (7, 2, 5, 0)
    assert r.rows[dev1_compute].added == 9 and r.rows[dev1_compute].slack == 0
    # device 0 faster: the end does not move, its communication call grows by what it saved
    assert r.what_if({"dev0 compute": 2}) == 11
    faster = r.replay({dev0_compute: 2})
    assert faster.total == 11
    assert (faster.rows[dev0_ar].duration, faster.rows[dev0_ar].busy, faster.rows[dev0_ar].wait) == (9, 2, 7)
    assert faster.rows[dev0_compute].slack == 7
    # device 1 faster: T = max(4, 5) + 2, and below 4 ms the path moves to device 0
    assert r.what_if({"dev1 compute": 5}) == 7
    assert _names(r.replay({"dev1 compute": 5})) == ["dev1 compute", "dev1 allreduce"]
    switched = r.replay({"dev1 compute": 3})
    assert switched.total == 6
    assert _names(switched) == ["dev0 compute", "dev0 allreduce"]
    assert switched.rows[dev1_compute].slack == 1
    # a slower network: every participant's work grows
    assert r.what_if({dev0_ar: 3, "dev1 allreduce": 3}) == 12
    _check_guarantees(r)
    _check_guarantees(faster)
    _check_guarantees(switched)


def test_seed_allreduce_from_activities():
    r = analyze(_allreduce_activities())
    _check_allreduce(r, "dev0 compute", "dev0 allreduce", "dev1 compute")
    assert r["dev0 allreduce"].track == "device 0"


def _allreduce_trace(ms=1000):
    """The same timeline as Chrome trace events (microseconds), one pid per device."""
    def x(name, pid, ts, dur, **args):
        return {"ph": "X", "name": name, "pid": pid, "tid": 0, "ts": ts * ms, "dur": dur * ms, "cat": "gpu",
                "args": args}
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "device 0"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "device 1"}},
        x("dev0 compute", 0, 0, 4),
        x("dev0 allreduce", 0, 4, 7, collective="ar"),
        {"ph": "C", "name": "memory", "pid": 0, "ts": 5 * ms, "args": {"bytes": 1024}},
        x("dev1 compute", 1, 0, 9),
        x("dev1 allreduce", 1, 9, 2, collective="ar"),
    ], "displayTimeUnit": "ms"}


def test_seed_allreduce_from_trace(tmp_path):
    trace = _allreduce_trace(ms=1)
    acts = from_trace(trace)
    assert [(a.name, a.track, a.start, a.end, a.group, a.id) for a in acts] == [
        ("dev0 compute", (0, 0), 0, 4, None, 2), ("dev0 allreduce", (0, 0), 4, 11, "ar", 3),
        ("dev1 compute", (1, 0), 0, 9, None, 5), ("dev1 allreduce", (1, 0), 9, 11, "ar", 6)]
    _check_allreduce(analyze(acts), 2, 3, 5)

    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_allreduce_trace()))
    r = analyze_trace(path)
    assert r.total == 11000 and _names(r) == ["dev1 compute", "dev1 allreduce"]
    assert r.rows[2].slack == 5000 and r.rows[3].busy == 2000
    assert r.what_if({"dev0 compute": 2000}) == 11000
    assert r.replay({"dev0 compute": 2000}).rows[3].duration == 9000
    assert analyze_trace(_allreduce_trace()["traceEvents"]).total == 11000


# ---------------------------------------------------------------------------------------------
# a host thread launching kernels on one stream
# ---------------------------------------------------------------------------------------------
HOST, STREAM = (0, "host"), (0, "stream 7")


def _launch_trace(launch, kernel, latency=5, parent=None):
    """Three launches of ``launch`` us back to back on the host thread, each kernel ``kernel`` us long on
    one stream, starting ``latency`` after its launch ends or when the stream frees up.  Flows: the
    first two bind to the next slice on the stream, the third to the enclosing one (bp e).  With
    ``parent=(before, after)``, a host span "step" holds the launches with that much own time around them."""
    before, after = parent or (0, 0)
    events, t, free = [], before, 0
    if parent:
        events.append({"ph": "X", "name": "step", "pid": 0, "tid": "host", "ts": 0,
                       "dur": before + 3 * launch + after, "cat": "python"})
    for k in range(3):
        events.append({"ph": "X", "name": f"launch {k}", "pid": 0, "tid": "host", "ts": t, "dur": launch,
                       "cat": "cuda_runtime"})
        start = max(t + launch + latency, free)
        events.append({"ph": "X", "name": f"kernel {k}", "pid": 0, "tid": "stream 7", "ts": start, "dur": kernel,
                       "cat": "kernel"})
        events.append({"ph": "s", "id": k, "cat": "launch", "name": "launch", "pid": 0, "tid": "host",
                       "ts": t + launch / 2})
        flow_end = {"ph": "f", "id": k, "cat": "launch", "name": "launch", "pid": 0, "tid": "stream 7"}
        events.append(dict(flow_end, ts=start + kernel / 2, bp="e") if k == 2 else dict(flow_end, ts=start - 1))
        t, free = t + launch, start + kernel
    return events


def test_flows_bind_launches_to_kernels():
    acts = {a.name: a for a in from_trace(_launch_trace(launch=10, kernel=100))}
    for k in range(3):
        assert acts[f"kernel {k}"].deps == (acts[f"launch {k}"].id,)
        assert acts[f"launch {k}"].track == HOST and acts[f"kernel {k}"].track == STREAM
        assert acts[f"kernel {k}"].kind == "kernel"


def test_kernels_gated_by_the_stream_when_the_gpu_is_busy():
    r = analyze_trace(_launch_trace(launch=10, kernel=100))
    assert r.total == 315
    assert _names(r) == ["launch 0", "kernel 0", "kernel 1", "kernel 2"]
    assert [s.via for s in r.steps] == ["origin", "dependency", "track", "track"]
    assert [s.idle_before for s in r.steps] == [0, 5, 0, 0] and r.idle == 5
    assert r["launch 1"].slack == 95 and r["launch 2"].slack == 185 and r["launch 1"].added == 0
    assert r["kernel 1"].added == 100
    # a faster host changes nothing but the first launch; a faster kernel moves T one for one
    assert r.what_if({"launch 1": 1, "launch 2": 1}) == 315
    assert r.what_if({"kernel 1": 50}) == 265
    assert r.what_if({"launch 1": 10 + 95 + 7}) == 315 + 7      # growth beyond the slack shows
    _check_guarantees(r)


def test_launches_gate_the_kernels_when_the_host_is_slow():
    r = analyze_trace(_launch_trace(launch=100, kernel=10))
    assert r.total == 315
    assert _names(r) == ["launch 0", "launch 1", "launch 2", "kernel 2"]
    assert [s.via for s in r.steps] == ["origin", "track", "track", "dependency"]
    # kernel 1 may end as late as kernel 2's start (305); kernel 0 as late as 295, pushing kernel 1
    assert r["kernel 0"].slack == 180 and r["kernel 1"].slack == 90 and r["kernel 1"].added == 0
    assert r["launch 1"].added == 100
    assert r.what_if({"kernel 0": 50, "kernel 1": 50}) == 315
    assert r.what_if({"kernel 0": 10 + 180}) == 315 and r.what_if({"kernel 0": 10 + 181}) == 316
    assert r.what_if({"launch 1": 40}) == 255
    # the host at 1 us a launch: the stream limits now (kernel 0 at 1 + 5, then 10 us each back to back)
    fast_host = r.replay({"launch 0": 1, "launch 1": 1, "launch 2": 1})
    assert fast_host.total == 1 + 5 + 3 * 10 == 36
    assert _names(fast_host) == ["launch 0", "kernel 0", "kernel 1", "kernel 2"]
    assert fast_host["launch 2"].slack == 36 - 10 - 3
    _check_guarantees(r)
    _check_guarantees(fast_host)


def test_a_parent_span_is_cut_into_its_children_and_its_own_time():
    r = analyze_trace(_launch_trace(launch=100, kernel=10, parent=(5, 10)))
    # step [0, 315): own time 5, launches [5, 305), own time 10; kernel 2 ends at 305 + 5 + 10 = 320
    assert r.total == 320
    assert [(a.name, s.own_time) for a, s in zip(r.path, r.steps)] == [
        ("step", True), ("launch 0", False), ("launch 1", False), ("launch 2", False), ("kernel 2", False)]
    step = r["step"]
    assert (step.duration, step.busy, step.on_path, step.added, step.slack, step.depth) == (315, 315, True, 305, 0, 0)
    assert r["launch 1"].depth == 1
    assert r["step"].slack == 0
    # the step's own time: 15 -> 5 (spread as recorded: 5 before, 10 after, now 5/3 and 10/3)
    assert r.what_if({"step": 305}) == pytest.approx(320 - 5 + 5 / 3)
    with pytest.raises(ValueError, match="'step' cannot be busy 200"):
        r.what_if({"step": 200})
    _check_guarantees(r)


def test_a_launch_that_returns_after_its_kernel_began_is_an_overlap():
    acts = [Activity("launch", "host", 0, 10), Activity("kernel", "stream", 8, 20, deps=["launch"]),
            Activity("launch 2", "host", 10, 12), Activity("kernel 2", "stream", 25, 30, deps=["launch 2", "kernel"])]
    r = analyze(acts)
    assert r.total == 30 and _names(r) == ["launch", "kernel", "kernel 2"]
    assert [s.idle_before for s in r.steps] == [0, -2, 5]
    assert r.what_if({"launch": 20}) == 40
    assert r.what_if({"kernel": 1}) == 19
    _check_guarantees(r)


def test_table():
    text = analyze(_allreduce_activities()).table()
    lines = text.splitlines()
    assert lines[0].split() == ["name", "track", "duration", "busy", "added", "slack"]
    assert lines[2].split() == ["dev0", "compute", "device", "0", "4", "4", "0", "5"]
    assert lines[3].split() == ["dev0", "allreduce", "device", "0", "7", "2", "0", "0"]
    assert lines[5].split() == ["dev1", "allreduce", "device", "1", "2", "2", "2", "0", "*"]
    assert lines[-2] == "T = 11 = added 11 + idle 0"
    assert lines[-1] == "critical path: dev1 compute -> dev1 allreduce"


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_a_cycle_is_named():
    acts = [Activity("a", "t0", 0, 1, deps=["b"]), Activity("b", "t1", 2, 3, deps=["a"])]
    with pytest.raises(ValueError, match=r"cycle: '(a' -> 'b' -> 'a|b' -> 'a' -> 'b)'"):
        analyze(acts)
    on_track = [Activity("first", "t0", 0, 1, deps=["second"]), Activity("second", "t0", 2, 3)]
    with pytest.raises(ValueError, match="cycle: .*'first'.*'second'"):
        analyze(on_track)


def test_an_unknown_dependency_is_named():
    with pytest.raises(ValueError, match="activity 'k' \\(id 'k'\\) depends on unknown id 'nope'"):
        analyze([Activity("k", "s", 0, 1, deps=["nope"])])


def test_end_before_start_is_named():
    with pytest.raises(ValueError, match="activity 'k' \\(id 3\\) ends at 1 before it starts at 2"):
        Activity("k", "s", 2, 1, id=3)
    with pytest.raises(ValueError, match="trace event 0 \\('k'\\): a complete event needs ts and dur"):
        from_trace([{"ph": "X", "name": "k", "ts": 0}])


def test_other_bad_input_is_named():
    with pytest.raises(ValueError, match="'a' and 'b' overlap on track 't'"):
        analyze([Activity("a", "t", 0, 5), Activity("b", "t", 3, 8)])
    with pytest.raises(ValueError, match="two activities have the id 'a'"):
        analyze([Activity("a", "t", 0, 5), Activity("a", "u", 0, 5)])
    with pytest.raises(ValueError, match="collective 'g' has two participants on track 't'"):
        analyze([Activity("a", "t", 0, 5, group="g"), Activity("b", "t", 5, 8, group="g")])
    with pytest.raises(ValueError, match="participant 'a' ends at 5, before the last participant 'b' arrives at 6"):
        analyze([Activity("a", "t", 0, 5, group="g"), Activity("b", "u", 6, 8, group="g")])
    r = analyze(_allreduce_activities())
    with pytest.raises(KeyError, match="'nope' is no id or name"):
        r.what_if({"nope": 1})
    with pytest.raises(ValueError, match="new busy time of 'dev0 compute' must be a number >= 0"):
        r.what_if({"dev0 compute": -1})
    with pytest.raises(ValueError, match="flow event 0 .* binds to no slice"):
        from_trace([{"ph": "s", "id": 1, "cat": "c", "pid": 0, "tid": 0, "ts": 5}])
