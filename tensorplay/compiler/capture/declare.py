"""What a program declares about its sizes (the chapter, §10.2–§10.3): ``tp.mark_dynamic`` and
``tp.check``.

* ``tp.mark_dynamic(x, dim, min=None, max=None)`` (PyTorch's name and meaning): dim ``dim`` of
  ``x`` is a size symbol whenever ``x`` is an input of a compiled function, whatever its
  ``dynamic`` setting; ``min``/``max`` constrain the symbol's range in the shape environment
  (``ShapeEnv.var_to_range``), so a guard the range implies (``s0 >= 2`` with ``min=16``) is decided
  at capture and never checked, and a backend may rely on the range (32-bit indices).  The range
  itself is checked on every call (a call outside it misses and recompiles, as in PyTorch); a
  marked input whose own size lies outside its declared range is an error naming the dim, the
  size and the range.  The mark is an attribute of the tensor object (``x._tp_dynamic_dims``).
* ``tp.check(cond, msg=None)`` (``torch._check``): in eager a plain assert.  Inside a symbolic
  capture a condition on sizes is recorded as a *fact* for the shape environment — the way to
  branch on a data-dependent size (exercise 39: ``n = x.nonzero().shape[0]; tp.check(n > 0)``
  before ``if n > 0:``).  A fact about input sizes becomes a shape guard; a fact about a
  data-dependent size is checked on every call before the artifact runs (a data gate that reads
  the size), so a call that violates it recaptures and the capture run raises as eager does.

This module imports neither sympy nor fake tensors (the compiler's import stays light).
"""
from __future__ import annotations

import torch

__all__ = ["mark_dynamic", "check"]


def mark_dynamic(t, index, min=None, max=None):
    """Mark dim ``index`` (an int or a list of ints) of ``t`` as dynamic, with an optional range
    ``[min, max]`` (module doc).  Returns None, as PyTorch's does."""
    from ..._tensor import Tensor
    if not isinstance(t, Tensor):
        raise TypeError(f"tp.mark_dynamic: expected a tp.Tensor, got {type(t).__name__}")
    dims = list(index) if isinstance(index, (list, tuple)) else [index]
    marks = dict(getattr(t, "_tp_dynamic_dims", None) or {})
    for d in dims:
        if not isinstance(d, int) or not -t.dim() <= d < t.dim():
            raise IndexError(f"tp.mark_dynamic: dim {d!r} out of range for a tensor of shape {tuple(t.shape)}")
        d = d % t.dim()
        for v, what in ((min, "min"), (max, "max")):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"tp.mark_dynamic: {what} must be a non-negative int or None, got {v!r}")
        if min is not None and max is not None and min > max:
            raise ValueError(f"tp.mark_dynamic: min={min} > max={max} for dim {d}")
        if max is not None and max < 2:
            raise ValueError(f"tp.mark_dynamic: max={max} for dim {d} leaves no size >= 2; sizes 0 and 1 are "
                             f"always specialised (the chapter, §10.2), so such a dim cannot be dynamic")
        marks[d] = (min, max)
    t._tp_dynamic_dims = marks


def _active_tracer():
    from ...ops import registry
    from .tracer import Tracer
    for obs in registry.observers:
        tr = getattr(obs, "__self__", None)
        if isinstance(tr, Tracer) and tr.active:
            return tr
    return None


def check(cond, msg=None):
    """Assert ``cond``; inside a symbolic capture, record it as a fact about sizes (module doc)."""
    if not isinstance(cond, torch.SymBool):
        if not bool(cond):
            raise AssertionError(msg or "tp.check failed")
        return
    tr = _active_tracer()
    if tr is None or tr.sym is None:
        raise AssertionError(msg or f"tp.check: a symbolic condition {cond} outside a symbolic capture")
    tr.sym.check(cond, msg, tr)
