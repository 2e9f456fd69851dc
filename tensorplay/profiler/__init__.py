"""``tp.profiler``: when work ran, what was live at the peak, and why a kernel is as fast as it is
(seed 001 §1-3; the chapter §13).

Read in order: recorder.py (the events a profile keeps), hooks.py (where it listens: ops,
autograd, optimizers, Stax kernels; compile phases open spans themselves), memory.py (the memory
timeline and M_peak), trace.py (Chrome trace JSON, the key_averages table), critical_path.py (the
time each event adds to the critical path), profile.py (the ``profile`` context manager that ties
them together).
"""
from .profile import ProfilerAction, ProfilerActivity, profile, record_function, schedule, trace_handler
from .recorder import span
from .trace import merge_traces

__all__ = ["profile", "record_function", "schedule", "ProfilerActivity", "ProfilerAction", "trace_handler", "span",
           "merge_traces"]
