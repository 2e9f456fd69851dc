"""The memory timeline (seed 001 §1): what was live when, and what was live at the peak.

    M_peak = max_t [ M_persistent + sum over i live at t of M_i ]

**Allocations.**  Every allocation and free of the tensor allocators (CPU and CUDA: eager ops,
wrapper buffers, saved activations, gradients, optimizer state -- whoever asked) comes from
torch's profiler (Kineto's allocation events: time, device, pointer, bytes).  An allocation is one
storage: views and aliases of it are never counted again.

**Persistent memory** is what was live when the profile began (Kineto sees no allocation for it):
the storages of every tensor alive then (a scan of the live objects at the start), each counted
once.  A free of one of them during the profile ends it.

**Categories.**  An allocation's category is the strongest mark recorded on its pointer while it
was live (recorder.Recorder.mark; strongest first): ``parameter`` (an ``nn.Parameter``),
``optimizer state``, ``gradient`` (a ``.grad``), ``input`` (persistent and none of those),
``activation`` (saved for backward by an autograd node), else ``temporary``.

**Guarantees.**  ``peak`` is the maximum over the event times of the sum of live bytes (it equals
the allocator's own running total at its maximum plus the persistent bytes); ``live_at_peak``
lists every storage live at that instant with its bytes, category and the span (op, kernel, phase)
that allocated it; the series are piecewise constant between events.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import warnings

__all__ = ["CATEGORIES", "Block", "MemoryTimeline", "persistent_blocks", "allocation_events"]

#: the categories, strongest first (the one an allocation gets when several are marked on it)
CATEGORIES = ("parameter", "optimizer state", "gradient", "input", "activation", "temporary")
_RANK = {c: i for i, c in enumerate(CATEGORIES)}


@dataclasses.dataclass
class Block:
    """One storage: ``[start, end)`` nanoseconds (``start`` None: live before the profile; ``end``
    None: still live at its end), bytes, device, pointer, category, the span that allocated it."""
    device: str
    ptr: int
    nbytes: int
    start: int | None
    end: int | None
    category: str = "temporary"
    allocated_by: str = ""

    def live_at(self, t) -> bool:
        return (self.start is None or self.start <= t) and (self.end is None or t < self.end)


def persistent_blocks(now: int) -> list:
    """The storages of every live tensor (tp and torch), once each, categorised by what holds
    them (module doc): the profile's M_persistent at its start."""
    import torch

    from .._tensor import Tensor
    from ..nn.parameter import Parameter
    from ..optim.optimizer import Optimizer
    cat, blocks = {}, {}

    def storage(t):
        d = t._data if isinstance(t, Tensor) else t
        if not isinstance(d, torch.Tensor) or d.device.type == "meta" or d.is_sparse:
            return None
        if type(d).__name__ == "FakeTensor" or d.is_meta:      # (a capture's fake values own no memory)
            return None
        try:
            st = d.untyped_storage()
            ptr, n = st.data_ptr(), st.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        return (str(d.device), ptr, n) if isinstance(n, int) and isinstance(ptr, int) and n and ptr else None

    def note(t, c):
        k = storage(t)
        if k is None:
            return
        blocks.setdefault(k[:2], k[2])
        if k[:2] not in cat or _RANK[c] < _RANK[cat[k[:2]]]:
            cat[k[:2]] = c
    with warnings.catch_warnings():     # (isinstance on lazily deprecated module attributes warns)
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, (Tensor, torch.Tensor, Optimizer))]
    for o in objs:
        if isinstance(o, Parameter):
            note(o, "parameter")
            if o.grad is not None:
                note(o.grad, "gradient")
        elif isinstance(o, Optimizer):
            for v in o._state_tensors():
                note(v, "optimizer state")
        elif isinstance(o, (Tensor, torch.Tensor)):
            note(o, "input")
    return [Block(dev, ptr, n, None, None, cat[(dev, ptr)]) for (dev, ptr), n in blocks.items()]


def allocation_events(kineto_profile) -> list:
    """``[(time ns, device, pointer, bytes, allocator total)]`` (bytes < 0: a free; the total: the
    allocator's own count of allocated bytes after the event) from a stopped
    ``torch.profiler.profile(profile_memory=True)``, in time order."""
    out = []
    tree = kineto_profile.profiler.kineto_results.experimental_event_tree()
    stack = list(tree)
    while stack:
        e = stack.pop()
        f = e.extra_fields
        if type(f).__name__ == "_ExtraFields_Allocation":
            out.append((e.start_time_ns, str(f.device), int(f.ptr), int(f.alloc_size), int(f.total_allocated)))
        stack.extend(e.children)
    out.sort(key=lambda x: x[0])
    return out


class MemoryTimeline:
    """Blocks over time (module doc).  Built by the profile from its allocation events, its
    persistent blocks and its marks; ``spans`` (recorder spans) name who allocated each block."""

    def __init__(self, persistent, events, marks, spans=(), end=None):
        self.blocks: list[Block] = list(persistent)
        live = {(b.device, b.ptr): b for b in self.blocks}
        #: per device, the largest total the allocator itself reported (the tracked allocator's peak:
        #: on the CPU counted from the profile's start, on CUDA including what was live before)
        self.allocator_peak = {}
        for t, dev, ptr, n, *total in events:
            if total:
                self.allocator_peak[dev] = max(self.allocator_peak.get(dev, 0), total[0])
            if n > 0:
                b = Block(dev, ptr, n, t, None)
                self.blocks.append(b)
                live[(dev, ptr)] = b
            else:
                b = live.pop((dev, ptr), None)
                if b is not None and b.end is None:
                    b.end = t
        self._categorise(marks)
        self._name_allocators(spans)
        self.end = end

    def _categorise(self, marks):
        by_ptr = {}
        for b in self.blocks:
            by_ptr.setdefault((b.device, b.ptr), []).append(b)
        for t, dev, ptr, _n, c in marks:
            for b in by_ptr.get((dev, ptr), ()):
                if b.live_at(t) and _RANK[c] < _RANK[b.category]:
                    b.category = c
        for b in self.blocks:      # persistent blocks are inputs unless marked stronger
            if b.start is None and b.category == "temporary":
                b.category = "input"

    def _name_allocators(self, spans):
        """Each block's allocating span: the innermost span open at its start."""
        ss = sorted((s for s in spans if s.end is not None), key=lambda s: (s.start, -s.end))
        if not ss:
            return
        import bisect
        starts = [s.start for s in ss]
        for b in self.blocks:
            if b.start is None:
                b.allocated_by = "(before the profile)"
                continue
            i = bisect.bisect_right(starts, b.start)
            best = None
            for s in reversed(ss[max(0, i - 64):i]):      # (nesting is shallow: a window suffices)
                if s.start <= b.start <= s.end and (best is None or s.dur < best.dur):
                    best = s
            b.allocated_by = f"{best.cat}: {best.name}" if best is not None else ""

    # -- the series ----------------------------------------------------------------------------
    def series(self, device=None) -> tuple:
        """``(times, {category: bytes at each time})``: the live bytes per category just after each
        event (allocation or free) on ``device`` (None: all devices), persistent included."""
        blocks = [b for b in self.blocks if device is None or b.device == device]
        deltas = []
        base = {c: 0 for c in CATEGORIES}
        for b in blocks:
            if b.start is None:
                base[b.category] += b.nbytes
            else:
                deltas.append((b.start, b.category, b.nbytes))
            if b.end is not None:
                deltas.append((b.end, b.category, -b.nbytes))
        deltas.sort(key=lambda d: (d[0], d[2]))     # frees before allocations at one instant
        times, cur = [], dict(base)
        out = {c: [] for c in CATEGORIES}
        for t, c, n in deltas:
            cur[c] += n
            if times and times[-1] == t:
                for k in CATEGORIES:
                    out[k][-1] = cur[k]
                continue
            times.append(t)
            for k in CATEGORIES:
                out[k].append(cur[k])
        if not times:
            times = [0]
            for k in CATEGORIES:
                out[k].append(base[k])
        return times, out

    @property
    def persistent(self) -> int:
        return sum(b.nbytes for b in self.blocks if b.start is None)

    def peak(self, device=None) -> tuple:
        """``(bytes, time ns)`` of the maximum live total."""
        times, out = self.series(device)
        totals = [sum(out[c][i] for c in CATEGORIES) for i in range(len(times))]
        i = max(range(len(totals)), key=totals.__getitem__)
        return totals[i], times[i]

    def live_at_peak(self, device=None) -> list:
        """The blocks live at the peak, largest first."""
        _, t = self.peak(device)
        live = [b for b in self.blocks if (device is None or b.device == device) and
                (b.start is None or b.start <= t) and (b.end is None or t < b.end)]
        return sorted(live, key=lambda b: -b.nbytes)

    # -- exports -------------------------------------------------------------------------------
    def to_dict(self, t0=0, device=None) -> dict:
        times, out = self.series(device)
        peak, tp_ = self.peak(device)
        return {"unit": "bytes; times in microseconds from the profile's start",
                "times_us": [(t - t0) / 1e3 for t in times], "series": out, "persistent": self.persistent,
                "peak": {"bytes": peak, "time_us": (tp_ - t0) / 1e3},
                "live_at_peak": [{"bytes": b.nbytes, "category": b.category, "device": b.device,
                                  "allocated_by": b.allocated_by,
                                  "since_us": None if b.start is None else (b.start - t0) / 1e3}
                                 for b in self.live_at_peak(device)]}

    def export(self, path, t0=0, device=None, title="memory timeline") -> None:
        """``path``.png (stacked areas per category, the peak marked; matplotlib, when installed)
        and ``path``.json (the numbers); ``path`` may end in .png or .json or be a stem."""
        stem = str(path)
        for ext in (".png", ".json", ".html"):
            if stem.endswith(ext):
                stem = stem[: -len(ext)]
        d = self.to_dict(t0, device)
        with open(stem + ".json", "w") as f:
            json.dump(d, f, indent=1)
        try:
            import matplotlib
        except ImportError:
            return
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4.5))
        xs = d["times_us"]
        cats = [c for c in CATEGORIES if any(d["series"][c])]
        ys = [[v / 2 ** 20 for v in d["series"][c]] for c in cats]
        if ys:
            ax.stackplot(xs, *ys, labels=cats, step="post", alpha=0.85)
        pk = d["peak"]
        ax.axvline(pk["time_us"], color="k", ls="--", lw=1)
        ax.annotate(f"peak {pk['bytes'] / 2 ** 20:.2f} MiB", (pk["time_us"], pk["bytes"] / 2 ** 20),
                    textcoords="offset points", xytext=(6, -12), fontsize=9)
        ax.set_xlabel("time since the profile began (µs)")
        ax.set_ylabel("live MiB")
        ax.set_title(title)
        if cats:
            ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=110)
        plt.close(fig)
