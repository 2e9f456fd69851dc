"""Stax's CPU device backend: C++ kernels, OpenMP + SIMD (the chapter, §8 and §11).

Read in pipeline order:

  choices.py        the CPU's heuristics: parallel depth, streaming stores, prefetching, schedule
  plan.py           the CPU's decisions for a KernelPlan: threads, parallel depth, vector loop,
                    column mode, accumulators; blocking.py the cascades (blocked reductions)
  kernel.py         prints a plan as one C++ function (tp::Vec vectors, OpenMP); ops.py the C++ of
                    compute functions, reduce.py of accumulators
  cpp_prelude.h     the vector library the kernels include; stax_kernel.h the kernels' run-time
                    support (error slot, index checks)
  wrapper.py        kernel entries on pointer arrays; option stax.cpp_wrapper: one C++ unit, one
                    foreign call per graph
  build.py          g++ and the ISA levels: compile command, cache key, build, load (cached by
                    codecache.py)
  async_compile.py  parallel compilation of a wrapper's kernels
  call.py           the call extension: Python runs an entry on the data pointers (ctypes fallback)
  backend.py        CppBackend, the DeviceBackend of the CPU (device.py), registered here

Importing this package registers it for ``"cpu"`` under the name ``"cpp"`` (tensorplay.compiler imports
it; the knob ``stax.cpu_backend`` selects it, by default).
"""
from ..device import register_device_backend
from .backend import CppBackend

__all__ = ["CppBackend"]

register_device_backend("cpu", CppBackend(), name="cpp")
