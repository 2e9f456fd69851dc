"""Exports of a profile: Chrome trace-event JSON and the ``key_averages()`` table (seed 001 §2).

**Trace.**  The Trace Event Format that Perfetto (ui.perfetto.dev) and chrome://tracing load:

* ``X`` (complete) events -- one per span: ``name``, ``cat``, ``ts`` and ``dur`` in microseconds
  from the profile's start, ``pid`` (the process, or the GPU), ``tid`` (the host thread, or the
  CUDA stream), ``args`` (shapes, model bytes and FLOPs, achieved GB/s, ...);
* ``C`` (counter) events -- the live memory per category after every allocation and free, in MiB,
  one counter track per device;
* ``s``/``f`` flow events -- each GPU kernel bound to the host span that launched it (``bp: e``:
  the flow ends in the kernel's slice), one id per pair;
* ``M`` (metadata) events -- process and thread names (``rank r`` when distributed).

Guarantees: every event has ``ph``, ``name``, ``pid``, ``tid`` and ``ts``; ``X`` events have
``dur >= 0``; the events of each thread are in non-decreasing ``ts``; every flow id has one
``s`` and one ``f``; ``path`` ending in ``.gz`` is written gzip-compressed.

**Table.**  ``key_averages()`` groups spans by name (and category; with ``group_by_input_shape``
also by input shapes): calls, total, self (total minus the spans nested in it on the same
thread), average, min and max, in the units PyTorch's table uses (µs/ms).
"""
from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict

__all__ = ["chrome_trace", "write_trace", "read_trace", "merge_traces", "KeyAverages", "self_times"]


def _us(t, t0) -> float:
    return round((t - t0) / 1e3, 3)


def chrome_trace(spans, t0, *, gpu_spans=(), flows=(), memory=None, rank=None, pid=None) -> dict:
    """The trace dict of a profile (module doc): host ``spans`` (recorder.Span), ``gpu_spans``
    (Span whose ``tid`` is ``(device index, stream)``), ``flows`` ([(host Span, gpu Span)]),
    ``memory`` (memory.MemoryTimeline or None); times relative to ``t0`` (ns)."""
    pid = os.getpid() if pid is None else pid
    pname = "tensorplay" + (f" (rank {rank})" if rank is not None else "")
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": pname}}]
    tids = sorted({s.tid for s in spans})
    for i, tid in enumerate(tids):
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                   "args": {"name": "host thread" + ("" if i == 0 else f" {i}")}})
    def complete(s, pid, tid):
        return {"ph": "X", "name": s.name, "cat": s.cat, "ts": _us(s.start, t0), "dur": max(_us(s.end, s.start), 0.0),
                "pid": pid, "tid": tid, "args": _jsonable(s.args)}
    body = [complete(s, pid, s.tid) for s in spans]
    gpu_pids = {}
    for s in gpu_spans:
        dev, stream = s.tid
        body.append(complete(s, gpu_pids.setdefault(dev, f"{pid}-gpu{dev}"), stream))
    for dev, gp in gpu_pids.items():
        ev.append({"ph": "M", "name": "process_name", "pid": gp, "tid": 0, "ts": 0,
                   "args": {"name": f"GPU {dev}" + (f" (rank {rank})" if rank is not None else "")}})
        for stream in sorted({s.tid[1] for s in gpu_spans if s.tid[0] == dev}):
            ev.append({"ph": "M", "name": "thread_name", "pid": gp, "tid": stream, "ts": 0,
                       "args": {"name": f"stream {stream}"}})
    for k, (h, g) in enumerate(flows, 1):
        dev, stream = g.tid
        body.append({"ph": "s", "name": "launch", "cat": "flow", "id": k, "ts": _us(h.start, t0), "pid": pid, "tid": h.tid})
        body.append({"ph": "f", "bp": "e", "name": "launch", "cat": "flow", "id": k, "ts": _us(g.start, t0),
                     "pid": gpu_pids[dev], "tid": stream})
    if memory is not None:
        for dev in sorted({b.device for b in memory.blocks}):
            times, series = memory.series(dev)
            for i, t in enumerate(times):
                body.append({"ph": "C", "name": f"memory {dev} (MiB)", "ts": max(_us(t, t0), 0.0), "pid": pid,
                             "tid": 0, "args": {c: round(v[i] / 2 ** 20, 4) for c, v in series.items() if any(v)}})
    body.sort(key=lambda e: (e["ts"], 0 if e["ph"] != "X" else -e.get("dur", 0)))
    return {"traceEvents": ev + body, "displayTimeUnit": "ms",
            "otherData": {"tool": "tensorplay.profiler", "clock": "wall-clock ns since the profile began / 1e3",
                          "t0_ns": t0}}


def _jsonable(args) -> dict:
    out = {}
    for k, v in args.items():
        try:
            json.dumps(v)
            out[k] = v
        except TypeError:
            out[k] = str(v)
    return out


def write_trace(trace: dict, path) -> None:
    """``trace`` as JSON at ``path`` (gzip when it ends in ``.gz``)."""
    path = str(path)
    data = json.dumps(trace).encode()
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


def read_trace(source) -> dict:
    """A trace dict from a dict or a ``.json`` / ``.json.gz`` path."""
    if isinstance(source, dict):
        return source
    path = str(source)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def merge_traces(traces, path=None) -> dict:
    """One trace of several processes' (the ranks of a distributed run): their events side by side,
    one process track per rank (each trace's ``pid`` is its process's id; two traces of one process
    -- two profiles of one rank -- must not be merged).  The ranks' clocks are the machine's wall
    clock (one host), so their spans line up; a collective's spans carry the same ``collective``
    group id on every rank, which critical_path.py matches.  Written to ``path`` when given."""
    ts = [read_trace(t) for t in traces]
    pids = [{e["pid"] for e in t["traceEvents"] if e["ph"] != "M"} for t in ts]
    for i in range(len(pids)):
        for j in range(i):
            if pids[i] & pids[j]:
                raise ValueError(f"merge_traces: traces {j} and {i} share process ids {sorted(pids[i] & pids[j])} "
                                 f"(profiles of one process: export one trace per rank)")
    t0s = [t.get("otherData", {}).get("t0_ns", 0) for t in ts]
    origin = min(t0s)
    meta = [e for t in ts for e in t["traceEvents"] if e["ph"] == "M"]
    shifted = [{**e, "ts": round(e["ts"] + (t0 - origin) / 1e3, 3)} for t, t0 in zip(ts, t0s)
               for e in t["traceEvents"] if e["ph"] != "M"]
    body = sorted(shifted,
                  key=lambda e: (e["ts"], 0 if e["ph"] != "X" else -e.get("dur", 0)))
    merged = {"traceEvents": meta + body, "displayTimeUnit": "ms",
              "otherData": {"tool": "tensorplay.profiler", "merged": len(ts), "t0_ns": origin}}
    if path is not None:
        write_trace(merged, path)
    return merged


def self_times(spans) -> dict:
    """``{span id: self ns}``: each span's duration minus that of its direct children (the spans
    nested in it on its thread)."""
    out = {}
    by_tid = defaultdict(list)
    for s in spans:
        by_tid[s.tid].append(s)
    for ss in by_tid.values():
        ss.sort(key=lambda s: (s.start, -s.end))
        stack = []
        for s in ss:
            while stack and stack[-1].end <= s.start:
                stack.pop()
            out[s.id] = s.dur
            if stack and s.end <= stack[-1].end:
                out[stack[-1].id] -= s.dur
            stack.append(s)
    return out


_SORT_KEYS = {"cpu_time_total": "total", "self_cpu_time_total": "self", "cuda_time_total": "total",
              "self_cuda_time_total": "self", "count": "count", "total": "total", "self": "self",
              "avg": "avg", "cpu_time": "avg", "max": "max"}


class KeyAverages(list):
    """Rows ``{name, cat, count, total, self, avg, min, max[, input_shapes]}`` (nanoseconds) and
    :meth:`table`."""

    @classmethod
    def of(cls, spans, group_by_input_shape=False):
        selfs = self_times(spans)
        groups = {}
        for s in spans:
            key = (s.name, s.cat) + ((str(s.args.get("input_shapes")),) if group_by_input_shape else ())
            g = groups.setdefault(key, {"name": s.name, "cat": s.cat, "count": 0, "total": 0, "self": 0,
                                        "min": None, "max": 0})
            if group_by_input_shape:
                g["input_shapes"] = s.args.get("input_shapes")
            g["count"] += 1
            g["total"] += s.dur
            g["self"] += selfs.get(s.id, s.dur)
            g["min"] = s.dur if g["min"] is None else min(g["min"], s.dur)
            g["max"] = max(g["max"], s.dur)
        rows = cls()
        for g in groups.values():
            g["avg"] = g["total"] / g["count"]
            rows.append(g)
        return rows

    def table(self, sort_by="cpu_time_total", row_limit=100, header=None) -> str:
        key = _SORT_KEYS.get(sort_by)
        if key is None:
            raise ValueError(f"key_averages().table: sort_by={sort_by!r}; one of {sorted(_SORT_KEYS)}")
        rows = sorted(self, key=lambda r: -r[key])[:row_limit if row_limit and row_limit > 0 else None]
        total_self = sum(r["self"] for r in self) or 1
        shapes = any("input_shapes" in r for r in rows)
        head = ["Name", "Category", "Self %", "Self", "Total", "Avg", "Min", "Max", "# of Calls"] + \
            (["Input Shapes"] if shapes else [])
        body = [[r["name"], r["cat"], f"{100 * r['self'] / total_self:.2f}%", _fmt(r["self"]), _fmt(r["total"]),
                 _fmt(r["avg"]), _fmt(r["min"]), _fmt(r["max"]), str(r["count"])]
                + ([str(r.get("input_shapes"))] if shapes else []) for r in rows]
        widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
        line = "-" * (sum(widths) + 2 * (len(widths) - 1))
        fmt = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                      for i, (c, w) in enumerate(zip(cells, widths)))
        out = ([header] if header else []) + [line, fmt(head), line] + [fmt(b) for b in body] + [line]
        out.append(f"Self time total: {_fmt(sum(r['self'] for r in self))}")
        return "\n".join(out)

    def __str__(self):
        return self.table()


def _fmt(ns) -> str:
    if ns is None:
        return "-"
    us = ns / 1e3
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"
