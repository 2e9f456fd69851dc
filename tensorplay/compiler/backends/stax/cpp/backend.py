"""The CPU's device backend: C++ kernels (OpenMP + tp::Vec SIMD) called from the wrapper (the
chapter, §8.1 and §11.2).

:class:`CppBackend` is what ``compile_graph`` asks for a graph on the CPU (device.py): the CPU
decisions of a plan (plan.py), its C++ (kernel.py), and the wrapper lines that compile each kernel
in the pool (async_compile.py) and call its entry through the call extension (call.py) with the
buffers' data pointers; ``cpp_wrapper=True`` generates the C++ wrapper instead (wrapper.py).
"""
from __future__ import annotations

from ..device import DeviceBackend

__all__ = ["CppBackend"]


class CppBackend(DeviceBackend):
    name = "cpp"

    def plan(self, kernel_plan):
        from .plan import plan_cpp
        if kernel_plan.device is None:
            kernel_plan.device = plan_cpp(kernel_plan)
        return kernel_plan

    def render(self, kernel_plan, name):
        from . import kernel       # looked up at each call: tools patch kernel.generate_kernel
        return kernel.generate_kernel(self.plan(kernel_plan), name)

    def wrapper_imports(self):
        return ["from tensorplay.compiler.backends.stax.cpp.async_compile import AsyncCompile",
                "async_compile = AsyncCompile()"]

    def kernel_definition(self, name, source, params):
        from .wrapper import kernel_entry
        return [f"{name} = async_compile.cpp(r'''", '#include "stax_kernel.h"', source, kernel_entry(name, params),
                f"''', '{name}', entry='{name}_entry')"]

    def wait(self):
        return ["async_compile.wait(globals())"]

    def kernel_call(self, name, params):
        # tensors by data pointer, size arguments (``is_out`` None) as ints
        return f"{name}({', '.join(p if out is None else f'{p}.data_ptr()' for p, (_, out) in params.items())})"

    def fits_row_scratch(self, elements):
        from .choices import row_scratch_fits
        return row_scratch_fits(elements)

    def generate_wrapper(self, graph, sched, kernels, cpp_wrapper=False, **options):
        if not cpp_wrapper:
            return None
        from .wrapper import generate_cpp_wrapper
        return generate_cpp_wrapper(graph, sched, kernels, self)
