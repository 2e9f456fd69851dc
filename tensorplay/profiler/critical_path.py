"""Critical-path analysis of a recorded timeline: which dependency chain decides when the output is done.

Seed 001, section 1 ("the end of the measurement, and the dependencies that really decide it"): an
event's *duration*, a resource's *busy time* and the time an event *adds to the critical path* are
three different quantities.  Two devices in one all-reduce, device 0 ready at 4 ms, device 1 at 9 ms,
the communication 2 ms once both are in: ``T = max(4, 9) + 2 = 11`` ms.  Device 0's communication
call lasts 7 ms but works 2 of them; it waits 5 for device 1.  Shortening device 0's compute to 2 ms
leaves T at 11 and makes that call 9 ms long.  A long bar is not a slow resource: the chain of
dependencies back from the output names the producer that limits it.

The model
---------
* An :class:`Activity` runs on one *track* (a resource that does one thing at a time: a host thread,
  a CUDA stream, a rank's device) from ``start`` to ``end``.
* Its *predecessors* are its explicit ``deps`` (ids of activities that must end before it can start:
  a launch before its kernel, a flow of a trace) and its track predecessor (the previous activity on
  its track that had ended when it started).  Its *ready time* is the latest end of its predecessors
  (the earliest start of all the activities, the *origin*, where it has none).
* Nesting on one track (a host span that contains child spans) is parent and children, not a
  sequence: a parent is cut into its children and the stretches of its *own time* between them, and
  those pieces, one after another on the track, are what is analysed.  A dependency on a parent is a
  dependency on its last piece, a parent's dependencies are its first piece's.  Spans that overlap
  without nesting on one track are an error.
* Waiting is separated from work: the gap between an activity's ready time and its start is *idle
  time of the track* (launch latency, or a wait the recording does not show), the *lag*, not part of
  the activity; an activity's busy time is ``end - start``.  A collective (activities sharing a
  ``group``, one participant per track) completes for every participant when the last participant has
  arrived plus that participant's own work: a participant's *wait* is ``last arrival - start`` and its
  busy time ``end - last arrival``.  A dependency recorded as ending after its dependent started (a
  launch call that returns after its kernel began) gives a negative lag: an overlap.
* The *critical path* is walked back from the piece that ends last: from each piece to the
  predecessor whose end decided its start (for a collective, the last arriver's gating predecessor),
  ties going to explicit dependencies before track order.  The time an activity *adds to the critical
  path* is its busy time on the path (a parent: the sum over its pieces), 0 off it.  Its *slack* is how
  much its busy time could grow before the end-to-end time ``T`` grows (a parent: the least over its
  pieces).
* :meth:`CriticalPathReport.what_if` replays the graph with new busy times: a piece starts when its
  predecessors have ended, its recorded lag after the one that gated it in the recording (a launch
  latency stays with the launch; a kernel queued behind a longer one starts when that one ends), so
  a replay without changes reproduces the recording; a collective's participants all end at the
  latest arrival plus each one's work.

Guarantees: ``sum(step.added for step in report.steps) + report.idle == report.total`` (the idle gaps
along the path include the lead-in from the origin); every step of the path has slack 0; an activity
off the path adds 0 (its slack is 0 only where the path had a tie); ``what_if({}) == total``; growing
a leaf activity's busy time by ``d`` grows T by exactly ``max(0, d - slack)``.

The forward and backward passes are written here: networkx's longest path (``dag_longest_path``) has
no notion of a collective that completes at the *latest* arrival of several chains nor of per-node
lags; networkx gives the topological order and finds cycles.
"""
from __future__ import annotations

import bisect
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Iterable

import networkx as nx

__all__ = ["Activity", "Row", "Step", "CriticalPathReport", "analyze", "from_trace", "analyze_trace"]


@dataclass
class Activity:
    """One recorded span of work on one track (see the module docstring for the model).

    ``id`` defaults to ``name``; ``deps`` are ids of activities that must end before this one may
    start; activities with the same ``group`` are the participants of one collective."""
    name: str
    track: Hashable
    start: float
    end: float
    deps: tuple = ()
    id: Hashable = None
    group: Hashable = None
    kind: str = "compute"

    def __post_init__(self):
        if self.id is None:
            self.id = self.name
        self.deps = tuple(self.deps)
        for what in ("start", "end"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise TypeError(f"activity {self.name!r} (id {self.id!r}): {what} must be a number, got {v!r}")
        if self.end < self.start:
            raise ValueError(f"activity {self.name!r} (id {self.id!r}) ends at {self.end} before it starts "
                             f"at {self.start}")

    @property
    def duration(self):
        return self.end - self.start


@dataclass(frozen=True)
class Row:
    """What the analysis says of one activity: ``duration`` (end - start), ``busy`` (duration less its
    ``wait`` in collectives), ``idle_before`` (its lag: ready time to start), ``on_path``, ``added``
    (time it adds to the critical path) and ``slack``.  A parent's numbers cover its children."""
    activity: Activity
    duration: float
    busy: float
    wait: float
    idle_before: float
    on_path: bool
    added: float
    slack: float
    depth: int = 0

    id = property(lambda self: self.activity.id)
    name = property(lambda self: self.activity.name)
    track = property(lambda self: self.activity.track)


@dataclass(frozen=True)
class Step:
    """One piece of the critical path: ``activity`` worked from ``start`` to ``end`` (for a collective,
    from the last arrival on), adding ``added``; ``own_time`` marks a parent's own time between its
    children.  ``idle_before`` is the gap between the end of the step before and this start (for a
    collective, before the last arrival); ``via`` says what held it back: ``"dependency"``,
    ``"track"`` (the track was busy) or ``"origin"`` (the first step); ``last_arriver`` is the
    collective participant whose arrival completed it (``None`` outside collectives)."""
    activity: Activity
    start: float
    end: float
    added: float
    idle_before: float
    via: str
    own_time: bool = False
    last_arriver: Activity | None = None


@dataclass
class _Piece:
    owner: Activity
    start: float
    end: float
    own: bool           # a parent's own time (True) or a leaf activity (False)


class _Graph:
    """The pieces of a set of activities, their predecessors, collectives and recorded lags."""

    def __init__(self, activities: Iterable[Activity]):
        self.acts = list(activities)
        if not self.acts:
            raise ValueError("critical path: no activities")
        self.by_id = {}
        for a in self.acts:
            if not isinstance(a, Activity):
                raise TypeError(f"critical path: expected Activity, got {type(a).__name__}")
            if a.id in self.by_id:
                raise ValueError(f"two activities have the id {a.id!r}: {self.by_id[a.id].name!r} and {a.name!r}")
            self.by_id[a.id] = a
        for a in self.acts:
            for d in a.deps:
                if d not in self.by_id:
                    raise ValueError(f"activity {a.name!r} (id {a.id!r}) depends on unknown id {d!r}")
                if d == a.id:
                    raise ValueError(f"activity {a.name!r} (id {a.id!r}) depends on itself")
        self._nest()
        self._link()
        self.origin = min(a.start for a in self.acts)
        self._record()

    # -- the pieces: nesting on each track -----------------------------------------------------
    def _nest(self):
        order = {a.id: i for i, a in enumerate(self.acts)}
        tracks: dict = {}
        for a in self.acts:
            tracks.setdefault(a.track, []).append(a)
        self.children = {a.id: [] for a in self.acts}
        self.depth = {}
        self.pieces: list[_Piece] = []
        self.first, self.last, self.span = {}, {}, {}
        self.track_pred: dict[int, int] = {}
        for acts in tracks.values():
            acts.sort(key=lambda a: (a.start, -a.end, order[a.id]))
            roots, stack = [], []
            for a in acts:
                while stack and stack[-1].end <= a.start:
                    stack.pop()
                if stack and a.end > stack[-1].end:
                    raise ValueError(f"activities {stack[-1].name!r} and {a.name!r} overlap on track "
                                     f"{a.track!r} without one containing the other")
                (self.children[stack[-1].id] if stack else roots).append(a)
                self.depth[a.id] = len(stack)
                stack.append(a)
            before = len(self.pieces)
            for a in roots:
                self._cut(a)
            for i in range(before + 1, len(self.pieces)):
                self.track_pred[i] = i - 1

    def _cut(self, a: Activity):
        """Append ``a``'s pieces (its children's, recursively, and its own time between them)."""
        lo = len(self.pieces)
        kids = self.children[a.id]
        if not kids:
            self.pieces.append(_Piece(a, a.start, a.end, own=False))
        else:
            if a.group is not None:
                raise ValueError(f"collective participant {a.name!r} contains other activities on its track")
            cursor = a.start
            for c in kids:
                if c.start > cursor:
                    self.pieces.append(_Piece(a, cursor, c.start, own=True))
                self._cut(c)
                cursor = c.end
            if a.end > cursor:
                self.pieces.append(_Piece(a, cursor, a.end, own=True))
        self.first[a.id], self.last[a.id] = lo, len(self.pieces) - 1
        self.span[a.id] = range(lo, len(self.pieces))

    # -- predecessors, collectives, the graph --------------------------------------------------
    def _link(self):
        n = len(self.pieces)
        self.preds: list[list[int]] = [[] for _ in range(n)]     # explicit dependencies first, then track
        self.explicit: set = set()
        for a in self.acts:
            p = self.preds[self.first[a.id]]
            for d in a.deps:
                self.explicit.add((self.last[d], self.first[a.id]))
                if self.last[d] not in p:
                    p.append(self.last[d])
        for i, j in self.track_pred.items():
            if j not in self.preds[i]:
                self.preds[i].append(j)
        self.groups: dict = {}
        self.group_of: dict[int, Hashable] = {}
        for i, pc in enumerate(self.pieces):
            g = pc.owner.group
            if g is None or pc.own:
                continue
            members = self.groups.setdefault(g, [])
            clash = [m for m in members if self.pieces[m].owner.track == pc.owner.track]
            if clash:
                raise ValueError(f"collective {g!r} has two participants on track {pc.owner.track!r}: "
                                 f"{self.pieces[clash[0]].owner.name!r} and {pc.owner.name!r}")
            members.append(i)
            self.group_of[i] = g
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        for i in range(n):
            target = ("group", self.group_of[i]) if i in self.group_of else i
            dag.add_edges_from((u, target) for u in self.preds[i])
        for g, members in self.groups.items():
            dag.add_edges_from((("group", g), m) for m in members)
        try:
            cycle = nx.find_cycle(dag)
        except nx.NetworkXNoCycle:
            self.topo = list(nx.topological_sort(dag))
            return
        names = [f"collective {u[1]!r}" if isinstance(u, tuple) else repr(self.pieces[u].owner.name)
                 for u, _ in cycle]
        raise ValueError("the dependencies form a cycle: " + " -> ".join(names + names[:1]))

    def _record(self):
        """Recorded lags, busy times and collective waits (the replay's inputs).  A piece's lag stays
        with the predecessor that gated it; its other predecessors keep only a recorded overlap."""
        n = len(self.pieces)
        self.lag, self.edge_lag = [], []
        for i, pc in enumerate(self.pieces):
            ends = [self.pieces[u].end for u in self.preds[i]]
            ready = max(ends, default=self.origin)
            gate = ends.index(ready) if ends else None
            self.lag.append(pc.start - ready)
            self.edge_lag.append([pc.start - e if k == gate else min(0, pc.start - e) for k, e in enumerate(ends)])
        self.busy = [pc.end - pc.start for pc in self.pieces]
        self.wait = [0] * n
        for members in self.groups.values():
            arrive = max(self.pieces[m].start for m in members)
            for m in members:
                pc = self.pieces[m]
                if pc.end < arrive:
                    last = max(members, key=lambda k: self.pieces[k].start)
                    raise ValueError(f"collective participant {pc.owner.name!r} ends at {pc.end}, before the "
                                     f"last participant {self.pieces[last].owner.name!r} arrives at {arrive}")
                self.wait[m], self.busy[m] = arrive - pc.start, pc.end - arrive

    def _start(self, i, ends):
        if not self.preds[i]:
            return self.origin + self.lag[i]
        return max(ends[u] + lag for u, lag in zip(self.preds[i], self.edge_lag[i]))

    def _latest_pred_ends(self, i, latest_start, late):
        for u, lag in zip(self.preds[i], self.edge_lag[i]):
            late[u] = min(late[u], latest_start - lag)

    # -- the passes -----------------------------------------------------------------------------
    def schedule(self, busy):
        """Forward pass: (starts, ends, arrival of each collective) with the given busy times."""
        n = len(self.pieces)
        start, end, arrival = [0] * n, [0] * n, {}
        for node in self.topo:
            if isinstance(node, tuple):
                g = node[1]
                for m in self.groups[g]:
                    start[m] = self._start(m, end)
                arrival[g] = max(start[m] for m in self.groups[g])
            elif node in self.group_of:
                end[node] = arrival[self.group_of[node]] + busy[node]
            else:
                start[node] = self._start(node, end)
                end[node] = start[node] + busy[node]
        return start, end, arrival

    def latest_ends(self, busy, finish):
        """Backward pass: the latest end of each piece that keeps the last end at ``finish``."""
        late = [finish] * len(self.pieces)
        for node in reversed(self.topo):
            if isinstance(node, tuple):
                members = self.groups[node[1]]
                latest_arrival = min(late[m] - busy[m] for m in members)
                for m in members:
                    self._latest_pred_ends(m, latest_arrival, late)
            elif node not in self.group_of:
                self._latest_pred_ends(node, late[node] - busy[node], late)
        return late

    def resolve(self, key) -> Activity:
        if key in self.by_id:
            return self.by_id[key]
        named = [a for a in self.acts if a.name == key]
        if len(named) != 1:
            raise KeyError(f"{key!r} is {'the name of several activities' if named else 'no id or name'}"
                           + (f" (ids {[a.id for a in named]})" if named else ""))
        return named[0]


class CriticalPathReport:
    """The result of :func:`analyze`: ``total`` (T, from the origin to the last end), ``rows`` (a
    :class:`Row` per activity id), ``steps`` (the critical path, first to last), ``path`` (the
    activities of the steps), ``idle`` (the idle gaps along the path)."""

    def __init__(self, graph: _Graph):
        self._g = g = graph
        start, end, arrival = g.schedule(g.busy)
        last = max(range(len(g.pieces)), key=lambda i: (end[i], self._is_last_arriver(i, start, arrival), -i))
        self.origin = g.origin
        self.total = end[last] - g.origin
        late = g.latest_ends(g.busy, end[last])
        slack = [late[i] - end[i] for i in range(len(g.pieces))]
        self.steps: list[Step] = []
        on = set()
        x = last
        while True:
            lead = x
            if x in g.group_of:
                gid = g.group_of[x]
                lead = max(g.groups[gid], key=lambda m: (start[m], m == x, -m))
            u = max(g.preds[lead], key=lambda p: end[p], default=None)
            via = "origin" if u is None else "dependency" if (u, lead) in g.explicit else "track"
            pc = g.pieces[x]
            self.steps.append(Step(pc.owner, end[x] - g.busy[x], end[x], g.busy[x], g.lag[lead], via, pc.own,
                                   g.pieces[lead].owner if x in g.group_of else None))
            on.add(x)
            if u is None:
                break
            x = u
        self.steps.reverse()
        self.idle = sum(s.idle_before for s in self.steps)
        self.rows: dict[Hashable, Row] = {}
        for a in g.acts:
            span = g.span[a.id]
            self.rows[a.id] = Row(
                a, a.end - a.start, sum(g.busy[i] for i in span), sum(g.wait[i] for i in span),
                g.lag[span[0]], any(i in on for i in span), sum(g.busy[i] for i in span if i in on),
                min(slack[i] for i in span), g.depth[a.id])

    def _is_last_arriver(self, i, start, arrival):
        return i in self._g.group_of and start[i] == arrival[self._g.group_of[i]]

    @property
    def path(self) -> list[Activity]:
        return [s.activity for s in self.steps]

    def __getitem__(self, key) -> Row:
        """The row of an activity, by id or (unique) name."""
        return self.rows[self._g.resolve(key).id]

    # -- what if --------------------------------------------------------------------------------
    def _busy_with(self, changes: dict) -> list:
        g = self._g
        busy = list(g.busy)
        chosen = [(g.resolve(k), v) for k, v in changes.items()]
        for a, v in chosen:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"what_if: the new busy time of {a.name!r} must be a number >= 0, got {v!r}")
        for a, v in sorted(chosen, key=lambda av: -g.depth[av[0].id]):      # children before their parents
            span = g.span[a.id]
            if not g.children[a.id]:
                busy[span[0]] = v
                continue
            own = [i for i in span if g.pieces[i].own and g.pieces[i].owner is a]
            new_own = v - sum(busy[i] for i in span if i not in own)
            if new_own < 0 or (not own and new_own > 0):
                raise ValueError(f"what_if: {a.name!r} cannot be busy {v}: its children are busy "
                                 f"{v - new_own} and its own time is {'not recorded' if not own else 'at least 0'}")
            old = sum(g.busy[i] for i in own)
            for i in own:
                busy[i] = new_own * (g.busy[i] / old if old else 1 / len(own))
        return busy

    def what_if(self, changes: dict) -> float:
        """T after replaying with new busy times: ``{id or name: new busy time}``.  A parent's new busy
        time changes its own time (spread over its stretches as recorded), not its children's."""
        g = self._g
        _, end, _ = g.schedule(self._busy_with(changes))
        return max(end) - g.origin

    def replay(self, changes: dict | None = None) -> "CriticalPathReport":
        """The report of the replayed timeline (the activities moved to their replayed times)."""
        g = self._g
        start, end, _ = g.schedule(self._busy_with(changes or {}))
        moved = [Activity(a.name, a.track, start[g.first[a.id]], end[g.last[a.id]], a.deps, a.id, a.group, a.kind)
                 for a in g.acts]
        return analyze(moved)

    # -- text -----------------------------------------------------------------------------------
    def table(self) -> str:
        """The rows as a text table (``*`` marks the critical path), then the path."""
        def num(v):
            return f"{v:.6g}"
        head = ("name", "track", "duration", "busy", "added", "slack", "")
        rows = sorted(self.rows.values(), key=lambda r: (str(r.track), r.activity.start, r.depth))
        body = [("  " * r.depth + r.name, str(r.track), num(r.duration), num(r.busy), num(r.added), num(r.slack),
                 "*" if r.on_path else "") for r in rows]
        widths = [max(len(line[c]) for line in [head] + body) for c in range(len(head))]
        fmt = "  ".join(f"{{:{'<' if c < 2 else '>'}{w}}}" for c, w in enumerate(widths))
        lines = [fmt.format(*head).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
        lines += [fmt.format(*line).rstrip() for line in body]
        chain = " -> ".join(s.activity.name + (" (own time)" if s.own_time else "") for s in self.steps)
        lines.append(f"T = {num(self.total)} = added {num(sum(s.added for s in self.steps))} + idle {num(self.idle)}")
        lines.append(f"critical path: {chain}")
        return "\n".join(lines)

    def __repr__(self):
        return f"CriticalPathReport(total={self.total!r}, path={[a.name for a in self.path]!r})"


def analyze(activities: Iterable[Activity]) -> CriticalPathReport:
    """The critical-path report of recorded activities (see the module docstring)."""
    return CriticalPathReport(_Graph(activities))


# ---------------------------------------------------------------------------------------------
# Chrome trace events
# ---------------------------------------------------------------------------------------------
_FLOW_RANK = {"s": 0, "t": 1, "f": 2}


class _Slices:
    """The slices of one track, for binding flow events."""

    def __init__(self):
        self.items: list[Activity] = []

    def sort(self):
        self.items.sort(key=lambda a: (a.start, -a.end, a.id))
        self.starts = [a.start for a in self.items]

    def enclosing(self, ts):
        """The innermost slice with start <= ts <= end (at a boundary, the one that starts there)."""
        for j in range(bisect.bisect_right(self.starts, ts) - 1, -1, -1):
            if self.items[j].end >= ts:
                return self.items[j]
        return None

    def next(self, ts):
        """The first slice that starts at or after ts."""
        j = bisect.bisect_left(self.starts, ts)
        return self.items[j] if j < len(self.items) else None


def _flow_key(ev):
    fid = ev.get("id", ev.get("id2"))
    if isinstance(fid, dict):
        fid = tuple(sorted(fid.items()))
    return ev.get("cat"), fid


def from_trace(events) -> list[Activity]:
    """Activities of Chrome trace events (a list, or a dict with ``"traceEvents"``).

    Complete events (``"ph": "X"``, and ``"B"``/``"E"`` pairs) become activities on track
    ``(pid, tid)`` with id = the event's index in the list, ``args["collective"]`` as the group and
    ``args["kind"]`` or ``cat`` as the kind.  Flow events (``"s"``, ``"t"``, ``"f"`` with one ``cat``
    and ``id``) make each slice of the flow depend on the one before: ``s`` and ``t`` bind to the
    enclosing slice on their thread at ``ts``, ``f`` to the enclosing slice with ``"bp": "e"`` and
    otherwise to the next slice that starts at or after ``ts``.  Other phases (metadata, counters,
    instants, samples) are ignored."""
    if isinstance(events, dict):
        events = events["traceEvents"]
    acts: list[Activity] = []
    open_: dict = {}
    flows: dict = {}

    def add(i, ev, ts, end):
        args = ev.get("args") or {}
        acts.append(Activity(str(ev.get("name", f"event {i}")), (ev.get("pid"), ev.get("tid")), ts, end, (), i,
                             args.get("collective"), str(args.get("kind") or ev.get("cat") or "activity")))

    for i, ev in enumerate(events):
        ph = ev.get("ph")
        track = (ev.get("pid"), ev.get("tid"))
        if ph == "X":
            if "dur" not in ev or "ts" not in ev:
                raise ValueError(f"trace event {i} ({ev.get('name')!r}): a complete event needs ts and dur")
            add(i, ev, ev["ts"], ev["ts"] + ev["dur"])
        elif ph == "B":
            open_.setdefault(track, []).append((i, ev))
        elif ph == "E":
            if not open_.get(track):
                raise ValueError(f"trace event {i}: an end event on {track} with no begin event open")
            j, begin = open_[track].pop()
            merged = dict(begin, args={**(begin.get("args") or {}), **(ev.get("args") or {})})
            add(j, merged, begin["ts"], ev["ts"])
        elif ph in _FLOW_RANK:
            flows.setdefault(_flow_key(ev), []).append((ev["ts"], _FLOW_RANK[ph], i, ev))
    unclosed = [(t, ev.get("name")) for t, stack in open_.items() for _, ev in stack]
    if unclosed:
        raise ValueError(f"begin events never ended: {unclosed}")

    by_track: dict = {}
    for a in acts:
        by_track.setdefault(a.track, _Slices()).items.append(a)
    for s in by_track.values():
        s.sort()
    deps: dict = {a.id: [] for a in acts}
    for key, chain in flows.items():
        current = None
        for ts, _, i, ev in sorted(chain, key=lambda c: c[:3]):
            slices = by_track.get((ev.get("pid"), ev.get("tid")))
            ph = ev["ph"]
            bound = None if slices is None else slices.next(ts) if ph == "f" and ev.get("bp") != "e" \
                else slices.enclosing(ts)
            if bound is None:
                raise ValueError(f"flow event {i} (cat {key[0]!r}, id {key[1]!r}, ph {ph!r}, ts {ts}) binds to no "
                                 f"slice on {(ev.get('pid'), ev.get('tid'))}")
            if ph != "s":
                if current is None:
                    raise ValueError(f"flow event {i} (cat {key[0]!r}, id {key[1]!r}, ph {ph!r}) has no start")
                if current.id != bound.id and current.id not in deps[bound.id]:
                    deps[bound.id].append(current.id)
            current = None if ph == "f" else bound
    for a in acts:
        a.deps = tuple(deps[a.id])
    acts.sort(key=lambda a: a.id)
    return acts


def analyze_trace(source: str | Path | dict | list) -> CriticalPathReport:
    """:func:`analyze` of a Chrome trace: a path to a ``.json`` (or ``.json.gz``) file, or its loaded
    content (a dict with ``"traceEvents"`` or the list of events)."""
    if isinstance(source, (str, Path)):
        opener: Any = gzip.open if str(source).endswith(".gz") else open
        with opener(source, "rt") as f:
            source = json.load(f)
    return analyze(from_trace(source))
