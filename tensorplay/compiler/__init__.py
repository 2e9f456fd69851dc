"""Stax: TensorPlay's compiler (``tp.compile``), following fig. 11.1 of the chapter.

Read in pipeline order:
  config.py               every knob declared once: config.get / config.patch / config.digest
  api.py                  tp.compile, first-level entry, specialization cache, staged Lowered/Compiled
  capture/proxy.py        proxies with sample values; data gates
  capture/tracer.py       capture: running the function on proxies records the graph
  capture/gates.py        guard-replay subgraphs of data gates (extracted before DCE)
  specialize/key.py       the specialization key
  specialize/guards.py    guards generated from the key
  graph/                  the graph IR (Node, Graph, GraphModule, Interpreter)
  passes/                 functionalisation and the rewrite passes to a fixed point
  backends/               registry; eager (op by op); stax (fused C++ kernels)
  cost.py                 FLOPs and model bytes
"""
from . import config
from .api import (BackendCompilerError, Compiled, CompiledFunction, GuardError, Lowered, RecompileLimitError,
                  compile, explain, list_mode_options, reset)
from .backends.registry import list_backends, lookup_backend, register_backend
from .backends import eager as _eager, stax as _stax  # noqa: F401  (register "eager", "aot_eager", "stax")
from .backends.stax import cpp as _stax_cpp  # noqa: F401  (the CPU device backend of Stax)
from .backends.stax import triton as _stax_triton  # noqa: F401  (the GPU device backend: Triton)
from .backends.debugging import locate_error
from .capture.proxy import CaptureError

__all__ = ["config", "compile", "explain", "locate_error", "reset", "list_backends", "register_backend",
           "lookup_backend", "list_mode_options", "CaptureError", "GuardError", "RecompileLimitError", "BackendCompilerError", "CompiledFunction", "Lowered",
           "Compiled"]
