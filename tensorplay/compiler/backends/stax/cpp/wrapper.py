"""The C++ wrapper: one translation unit and one foreign call per compiled graph (chapter §11.2).

Chosen with ``tp.compile(f, options={"stax.cpp_wrapper": True})``.  The generated Python module
keeps what must stay in Python (the guard's size/stride checks, allocation through torch, extern
calls into ATen) and hands every run of consecutive Stax kernels to C++ at once::

    graph_lib = async_compile.cpp_library(r'''
    #include "stax_kernel.h"
    static void kernel0(const float* __restrict__ arg0, float* __restrict__ buf0) {...}
    static void kernel1(const float* __restrict__ buf0, float* __restrict__ buf1) {...}
    extern "C" void stax_entry0(void* const* p) {      // the kernels of segment 0, in order
        kernel0(static_cast<const float*>(p[0]), static_cast<float*>(p[1]));
        kernel1(static_cast<const float*>(p[1]), static_cast<float*>(p[2]));
    }
    ''', 'graph')
    call_ext = submit_call_extension(async_compile)   # built concurrently with the graph
    async_compile.wait(globals())
    _call, (_entry0,) = bind_entries(graph_lib, call_ext, ('stax_entry0',), checked=False)

    def call(args):
        arg0, = args
        args.clear()
        if arg0.size() != (8,) or arg0.stride() != (1,):
            assert_size_stride(arg0, (8, ), (1, ), 0, 'arg0')          # raises, naming the input
        buf0 = _empty((8, ), (1, ), torch.float32)
        buf1 = _empty((8, ), (1, ), torch.float32)
        _call(_entry0, arg0.data_ptr(), buf0.data_ptr(), buf1.data_ptr())   # ONE foreign call
        del arg0, buf0
        return (buf1, )

Guarantees and limits:

* **Same results as the Python wrapper, bit for bit**: the kernels are the same C++ functions (made
  ``static`` so the compiler may inline them into the entry), run in the same order on buffers with
  the same layouts; allocation and reuse of dead buffers (``# reuse``) follow the Python wrapper's
  rules; frees are deferred to the end of the segment (a segment's buffers are all alive while its
  entry runs).
* **Extern and fallback kernels split the entry**: they are calls into eager ATen ops and cannot run
  inside C++, so the kernels between two of them form one segment with its own ``stax_entryN``.
  A graph without extern kernels makes exactly one foreign call; one with k extern calls between
  kernel runs makes at most k + 1.  A graph with no Stax kernel at all gets the Python wrapper.
* **The call mechanism** is a tiny CPython extension (``tp_stax_call``, ``METH_FASTCALL``: an entry
  address and the data pointers as Python ints, converted on the C stack, GIL released around the
  call), compiled once per Python ABI and cached in ``TP_CACHE_DIR`` like every library.  Measured
  for two pointers (``benchmarks/call_overhead.py --mechanisms``; docs/stax.md): 127 ns, against
  493 ns for ctypes filling a preallocated pointer array and 728 ns building it per call.  If the
  extension cannot be built (no ``Python.h``), ctypes with ``argtypes=[c_void_p]`` and a pointer
  array built per call is used instead, with one warning.
* **Run-time errors**: when a kernel can report one (``tp_report_error``: integer division by zero,
  an index out of range), the library's error slot is read after every entry call and the error is
  raised as with the Python wrapper (one slot per translation unit; the first report wins).
"""
from __future__ import annotations

from ..codegen.wrapper import CallWriter, allocation, generate_wrapper

__all__ = ["generate_cpp_wrapper", "static_kernel", "kernel_entry"]

# --------------------------------------------------------------------------------------------
# code generation
# --------------------------------------------------------------------------------------------

def static_kernel(src: str, name: str) -> str:
    """A kernel's source with internal linkage (``static``), so that the entry may inline it.

    Kernels are generated as ``extern "C" void <name>(...)``; if that head is not found the
    source is kept as is (``extern "C"`` names are unique within one translation unit)."""
    head = f'extern "C" void {name}('
    return src.replace(head, f"static void {name}(", 1) if src.count(head) == 1 else src


class _Segment:
    """Consecutive Stax kernels between two extern calls: one ``stax_entryN``."""

    def __init__(self, index, entry=None):
        self.index = index
        self.entry = entry or f"stax_entry{index}"   # the C name of the entry
        self.slots: dict[str, int] = {}   # Python variable -> index in the pointer array
        self.sizes: set = set()           # ... of those, the size arguments (ints, not tensors)
        self.calls: list[str] = []        # C++ lines of the entry body

    def add_kernel(self, kname, params):
        """Append a call of kernel ``kname``; its parameters get slots in the pointer array (a
        size argument travels as a pointer-sized integer)."""
        args = []
        for name, (ct, is_out) in params.items():
            slot = self.slots.setdefault(name, len(self.slots))
            if is_out is None:
                self.sizes.add(name)
                args.append(f"static_cast<{ct}>(reinterpret_cast<intptr_t>(p[{slot}]))")
            else:
                args.append(f"static_cast<{'' if is_out else 'const '}{ct}*>(p[{slot}])")
        self.calls.append(f"    {kname}({', '.join(args)});")

    def cpp(self) -> str:
        return "\n".join([f'extern "C" void {self.entry}(void* const* p) {{', "    (void)p;",
                          *self.calls, "}"])

    def py_call(self) -> str:
        ptrs = "".join(f", {v}" if v in self.sizes else f", {v}.data_ptr()" for v in self.slots)
        return f"    _call(_entry{self.index}{ptrs})"


def kernel_entry(kname, params) -> str:
    """``extern "C" void <kname>_entry(void* const* p)``: kernel ``kname`` called on an array of
    data pointers, the form the call extension runs (the Python wrapper appends it to every
    kernel's source; AsyncCompile.cpp(..., entry=))."""
    seg = _Segment(0, entry=f"{kname}_entry")
    seg.add_kernel(kname, params)
    return seg.cpp()


class _SegmentWriter(CallWriter):
    """The body of the C++ wrapper's ``call(args)``: consecutive kernels are one segment, run by
    one foreign call (``_call(_entryN, ...)``) when an extern call or the end comes; the buffers that
    die inside a segment are deleted after its call (its entry uses them all)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.segments: list[_Segment] = []
        self.seg = None
        self.pending_del: list[str] = []

    def flush(self):
        if self.seg is not None:
            self.lines.append(self.seg.py_call())
            self.segments.append(self.seg)
            self.seg = None
        if self.pending_del:
            self.lines.append(f"    del {', '.join(self.pending_del)}")
            self.pending_del.clear()

    def extern(self, g):
        self.flush()   # the extern call may read what the segment's kernels write
        super().extern(g)

    def reuse(self, name, old):
        self.lines.append(f"    {name} = {old}  # reuse")
        self.pending_del.append(old)

    def allocate(self, name, lay):
        self.lines.append(allocation(name, lay))

    def kernel(self, kname, params):
        if self.seg is None:
            self.seg = _Segment(len(self.segments))
        self.seg.add_kernel(kname, params)

    def free(self, g, dead):
        self.pending_del += dead
        if g.is_extern:
            self.flush()

    def end_of_groups(self):
        self.flush()

    def before_return(self):
        pass


def generate_cpp_wrapper(graph, sched, kernels, backend) -> tuple[str, set]:
    """Like :func:`codegen.wrapper.generate_wrapper` (same arguments, same result), but the
    kernels are compiled as one translation unit and run through one entry per segment."""
    if not kernels:
        return generate_wrapper(graph, sched, kernels, backend)
    writer = _SegmentWriter(graph, sched, kernels, backend)
    body = writer.write()
    segments, plan = writer.segments, writer.plan

    tu = ['#include "stax_kernel.h"']
    for kname, src in dict((k, s) for k, s, _ in kernels.values()).items():   # shared kernels once (reuse.py)
        tu.append(static_kernel(src, kname))
    tu += [s.cpp() for s in segments]
    checked = any("tp_report_error(" in t for t in tu)   # a kernel can fail at run time
    entries = "".join(f"'stax_entry{s.index}', " for s in segments)
    unpack = "".join(f"_entry{s.index}, " for s in segments)
    L = ['"""Generated by TensorPlay Stax (C++ wrapper): the graph\'s kernels are one C++ translation',
         'unit; each run of kernels between extern calls is one foreign call."""',
         "import torch",
         "from tensorplay.ops.registry import OPS",
         "from tensorplay.compiler.backends.stax.runtime import assert_size_stride, reinterpret, as_layout, allocator",
         "from tensorplay.compiler.backends.stax.cpp.async_compile import AsyncCompile",
         "from tensorplay.compiler.backends.stax.cpp.call import submit_call_extension, bind_entries",
         "async_compile = AsyncCompile()",
         "constants = {}",
         "_empty = allocator('cpu')",
         "",
         "graph_lib = async_compile.cpp_library(r'''",
         "\n\n".join(tu),
         "''', 'graph')",
         "call_ext = submit_call_extension(async_compile)",
         "async_compile.wait(globals())",
         f"_call, ({unpack}) = bind_entries(graph_lib, call_ext, ({entries}), checked={checked})",
         "",
         "",
         "def call(args):",
         *body]
    return "\n".join(L) + "\n", plan.materialized
