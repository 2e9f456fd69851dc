"""``tp.profiler.profile``: record a region of a program and export what ran, when, and what was
live (seed 001 §1-3).

    with tp.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                             profile_memory=True) as prof:
        loss = step(x, y)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")          # Perfetto / chrome://tracing
    prof.export_memory_timeline("memory.png")       # + memory.json

PyTorch's argument names and meanings where they exist: ``activities`` (``CPU``: host spans;
``CUDA``: kernel spans of the GPU, timed on the device by torch's profiler -- CUPTI -- and bound to
the host span that launched them), ``record_shapes``, ``profile_memory`` (every allocation and
free, through torch's profiler's allocation events: memory.py), ``with_stack`` (the user's
``file:line`` of each op), ``schedule`` (:func:`schedule`: which ``prof.step()`` calls record),
``on_trace_ready`` (called with the profile after each recorded cycle, e.g.
:func:`trace_handler`).

What is recorded (hooks.py; recorder.py): eager ops, autograd nodes, optimizer steps, the compile
phases of ``tp.compile`` (capture, passes, AOT and the partition, lowering, scheduling, code
generation, each compiler run and cache hit), Stax kernel calls with their model bytes and FLOPs
(``kernel_plan.model_cost``; with ``machine={"bandwidth": B, "peak": P}`` -- or the
``utils.machine.MachineParameters`` of ``measure_machine()`` -- also the fraction of the roofline
``max(bytes / B, flops / P) / time``), and ``record_function`` ranges.  Torch's profiler
runs underneath only when memory or CUDA is asked for.

Guarantees: with no profile recording nothing is installed (the dispatch and the compiled call do
no extra work); the exports follow trace.py's and memory.py's guarantees; one profile records at
a time (nesting raises).
"""
from __future__ import annotations

import enum
import os
import time

from . import hooks, recorder
from .memory import MemoryTimeline, allocation_events, persistent_blocks
from .trace import KeyAverages, chrome_trace, write_trace

__all__ = ["profile", "ProfilerActivity", "ProfilerAction", "schedule", "record_function", "trace_handler"]


class ProfilerActivity(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0):
    """PyTorch's schedule: skip ``skip_first`` steps, then cycles of ``wait`` idle steps, ``warmup``
    steps recorded and discarded, ``active`` steps recorded (the last one saves: ``on_trace_ready``
    runs after it); ``repeat`` cycles (0: forever).  Returns ``step number -> ProfilerAction``."""
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise ValueError(f"tp.profiler.schedule: wait={wait}, warmup={warmup}, active={active}, repeat={repeat}, "
                         f"skip_first={skip_first}: need active >= 1 and the others >= 0")

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        cycle = wait + warmup + active
        if repeat and step >= cycle * repeat:
            return ProfilerAction.NONE
        k = step % cycle
        if k < wait:
            return ProfilerAction.NONE
        if k < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if k < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


def trace_handler(dir_name: str, worker_name: str | None = None, use_gzip: bool = False):
    """An ``on_trace_ready`` that writes each recorded cycle's trace into ``dir_name``."""
    def handler(prof):
        os.makedirs(dir_name, exist_ok=True)
        name = worker_name or f"{os.uname().nodename}_{os.getpid()}"
        path = os.path.join(dir_name, f"{name}.{prof.step_num}.pt.trace.json" + (".gz" if use_gzip else ""))
        prof.export_chrome_trace(path)
    return handler


class record_function:
    """A user range (context manager or decorator): ``with tp.profiler.record_function("attn"):``
    -- a ``user`` span of the running profile; nothing without one."""

    def __init__(self, name: str, args: dict | None = None):
        self.name, self.args, self._ctx = name, args or {}, None

    def __enter__(self):
        self._ctx = recorder.span(self.name, "user", **self.args)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with record_function(self.name, self.args):
                return fn(*a, **k)
        return wrapped


_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


class profile:
    """The profiler (module doc)."""

    def __init__(self, activities=None, *, record_shapes=False, profile_memory=False, with_stack=False,
                 schedule=None, on_trace_ready=None, machine=None, rank=None):
        acts = set(activities) if activities is not None else {ProfilerActivity.CPU} | (
            {ProfilerActivity.CUDA} if _cuda_available() else set())
        bad = [a for a in acts if not isinstance(a, ProfilerActivity)]
        if bad:
            raise TypeError(f"tp.profiler.profile: activities are ProfilerActivity values, got {bad!r}")
        self.activities = acts
        self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
        self.schedule, self.on_trace_ready = schedule, on_trace_ready
        if machine is not None and not isinstance(machine, dict):     # utils.machine.MachineParameters
            machine = {"bandwidth": machine.B, "peak": machine.P}
        self.machine = dict(machine or {})
        self.rank = rank if rank is not None else _distributed_rank()
        self.step_num = 0
        self._rec = None          # the Recorder of the cycle being recorded
        self._result = None       # (Recorder, gpu spans, flows, MemoryTimeline) of the last cycle
        self._kineto = None
        self._persistent = None
        self._action = ProfilerAction.NONE

    # -- life cycle ----------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        self.step_num = 0
        self._transition(self._action_at(0))

    def step(self):
        """The end of one step of a scheduled profile (no-op without a schedule)."""
        if self.schedule is None:
            return
        prev = self._action
        self.step_num += 1
        if prev is ProfilerAction.RECORD_AND_SAVE:
            self._finish(save=True)
            self._action = ProfilerAction.NONE
        self._transition(self._action_at(self.step_num))

    def stop(self):
        if self._rec is not None:
            self._finish(save=self.schedule is None or self._action is ProfilerAction.RECORD_AND_SAVE
                         or self._action is ProfilerAction.RECORD)
        self._action = ProfilerAction.NONE

    def _action_at(self, step):
        return ProfilerAction.RECORD if self.schedule is None else self.schedule(step)

    def _transition(self, action):
        if action is ProfilerAction.NONE:
            if self._rec is not None:
                self._finish(save=False)
        elif self._rec is None:
            self._begin()
        elif self._action is ProfilerAction.WARMUP and action is not ProfilerAction.WARMUP:
            self._finish(save=False)      # the warm-up's events are discarded
            self._begin()
        self._action = action

    def _begin(self):
        self._rec = recorder.Recorder(self.record_shapes, self.with_stack)
        if self.profile_memory or ProfilerActivity.CUDA in self.activities:
            self._kineto = _start_kineto(self.activities, self.profile_memory)
        self._persistent = persistent_blocks(time.time_ns()) if self.profile_memory else None
        self._rec.started = time.time_ns()
        hooks.install(self._rec)

    def _finish(self, save):
        rec = self._rec
        hooks.uninstall()
        self._rec = None
        kin, self._kineto = self._kineto, None
        if kin is not None:
            _synchronize(self.activities)
            kin.stop()
        if not save:
            return
        end = time.time_ns()
        gpu, flows = _gpu_spans(kin, rec) if kin is not None and ProfilerActivity.CUDA in self.activities else ([], [])
        mem = None
        if self.profile_memory and kin is not None:
            mem = MemoryTimeline(self._persistent or [], allocation_events(kin), rec.marks, rec.spans, end)
        self._add_roofline(rec.spans + gpu)
        self._result = (rec, gpu, flows, mem, end)
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _add_roofline(self, spans):
        B, P = self.machine.get("bandwidth"), self.machine.get("peak")
        if not B and not P:
            return
        for s in spans:
            a = s.args
            if "model_bytes" not in a or s.dur <= 0:
                continue
            if s.cat == "kernel" and a.get("on_device"):
                continue       # a GPU launch's host span: the device's span carries the fraction
            t_roof = max(a["model_bytes"] / B if B else 0.0, a["model_flops"] / P if P else 0.0)
            a["roofline_fraction"] = float(f"{t_roof / (s.dur * 1e-9):.6g}")

    # -- results -------------------------------------------------------------------------------
    def _require(self):
        if self._result is None:
            raise RuntimeError("tp.profiler.profile: nothing recorded yet (use it as a context manager, or "
                               "call stop(); with a schedule, results exist after the first active cycle)")
        return self._result

    def events(self) -> list:
        """The recorded spans (host, then GPU), as recorder.Span objects (nanoseconds)."""
        rec, gpu, *_ = self._require()
        return list(rec.spans) + list(gpu)

    def key_averages(self, group_by_input_shape: bool = False) -> KeyAverages:
        return KeyAverages.of(self.events(), group_by_input_shape)

    def trace(self) -> dict:
        """The Chrome trace-event dict (trace.py)."""
        rec, gpu, flows, mem, _ = self._require()
        return chrome_trace(rec.spans, rec.started, gpu_spans=gpu, flows=flows, memory=mem, rank=self.rank)

    def export_chrome_trace(self, path) -> None:
        write_trace(self.trace(), path)

    def memory_timeline(self) -> MemoryTimeline:
        *_, mem, _end = self._require()
        if mem is None:
            raise RuntimeError("tp.profiler.profile: the memory timeline needs profile_memory=True")
        return mem

    def export_memory_timeline(self, path, device=None) -> None:
        """A PNG (matplotlib, when installed) and a JSON of the memory timeline (memory.py)."""
        rec = self._require()[0]
        self.memory_timeline().export(path, rec.started, device)

    def critical_path(self):
        """The critical-path report of the recorded trace (critical_path.py)."""
        from .critical_path import analyze_trace
        return analyze_trace(self.trace())


def _distributed_rank():
    """This process's rank in an initialised ``torch.distributed`` group, else None."""
    import sys
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank()


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def _synchronize(activities):
    if ProfilerActivity.CUDA in activities:
        import torch
        torch.cuda.synchronize()


def _start_kineto(activities, memory):
    import torch.profiler as tprof
    acts = [tprof.ProfilerActivity.CPU]
    if ProfilerActivity.CUDA in activities:
        acts.append(tprof.ProfilerActivity.CUDA)
    k = tprof.profile(activities=acts, profile_memory=memory)
    k.start()
    return k


def _gpu_spans(kin, rec):
    """GPU kernel spans of torch's profiler as recorder Spans (tid: (device, stream)), with the
    flows from the host span that launched each: the innermost span around the launch call of the
    same correlation id; a kernel whose launch call was not recorded (a driver entry point the
    profiler does not trace) is bound to the earliest unbound Stax kernel span of its name that
    began before it (launches run in order on a stream)."""
    import torch
    evs = kin.profiler.kineto_results.events()
    launches = {e.correlation_id(): e for e in evs if e.device_type() == torch.autograd.DeviceType.CPU
                and e.name() in _LAUNCHES}
    host = sorted((s for s in rec.spans if s.end is not None), key=lambda s: s.start)
    by_name = {}
    for h in host:
        if h.cat == "kernel":
            by_name.setdefault(h.name, []).append(h)
    bound = set()
    gpu, flows = [], []
    ids = 10 ** 9
    for e in sorted((e for e in evs if e.device_type() == torch.autograd.DeviceType.CUDA and e.name() not in _LAUNCHES),
                    key=lambda e: e.start_ns()):
        ids += 1
        s = recorder.Span(e.name(), "gpu kernel", e.start_ns(), (e.device_index(), e.device_resource_id()), {}, ids)
        s.end = e.end_ns()
        h = None
        launch = launches.get(e.correlation_id())
        if launch is not None:
            t = launch.start_ns()
            around = [x for x in host if x.start <= t <= x.end]
            h = min(around, key=lambda x: x.dur) if around else None
        if h is None:
            h = next((x for x in by_name.get(e.name(), ()) if x.id not in bound and x.start <= s.start), None)
        if h is not None:
            bound.add(h.id)
            flows.append((h, s))
            if "model_bytes" in h.args:
                h.args["on_device"] = True
                s.args.update(model_bytes=h.args["model_bytes"], model_flops=h.args["model_flops"],
                              stax_kernel=h.name, graph=h.args.get("graph"))
                if s.dur > 0:
                    s.args["achieved_GBps"] = round(h.args["model_bytes"] / s.dur, 3)
        gpu.append(s)
    return gpu, flows
