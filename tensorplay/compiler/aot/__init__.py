"""AOT autograd: joint graphs, partitioning and compiled training (chapter §5; docs/aot.md).

  dispatch_trace.py   retrace a captured region at the dispatcher level (op-level graph, metas)
  joint.py            the joint forward + backward graph from the op table's derivative formulas
  partition.py        default and min-cut (max-flow) partitioners: forward graph, backward graph,
                      saved values
  function.py         the runtime: a tp.autograd.Function running the compiled forward and the
                      lazily compiled backward; the ``aot_backend`` used by "stax" and "aot_eager"
  sizes.py            the same stages on a dynamic=True capture's symbolic sizes: one forward and
                      one backward graph for every size
"""
from __future__ import annotations

from .dispatch_trace import DispatchTrace, dispatch_trace
from .function import AOTLowered, DoubleBackwardError, aot_backend, aot_lower
from .joint import JointGraph, build_joint

__all__ = ["dispatch_trace", "DispatchTrace", "build_joint", "JointGraph", "is_training_region",
           "aot_backend", "aot_lower", "AOTLowered", "DoubleBackwardError"]


def is_training_region(example_inputs) -> bool:
    """A region needs AOT autograd when grad mode is on and one of its inputs requires grad.

    (A module in train mode with no input requiring grad has nothing to differentiate: its joint
    graph is its forward graph, which the plain backend path compiles — dropout included.)"""
    from ...autograd import grad_mode
    from ..._tensor import Tensor
    return grad_mode.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in example_inputs)

