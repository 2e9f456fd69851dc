"""The lowering table and the lowering in progress (chapter §6.2): the state every rule reads.

``LOWERINGS`` maps an op-table name to its rule; ``register_lowering(*names)`` binds a rule to op
names (a later registration replaces an earlier one: experiment 3 overrides rules this way).  A
rule reads the node it lowers through ``V.graph.current_node`` (:func:`_node`, :func:`_out_val` --
the node's meta value, which gives the output's shape and dtype); the backend sets ``V.graph`` to
the :class:`GraphLowering` around its walk.  While a ``pointwise`` compute function runs,
:func:`cdt` is its compute dtype and :func:`current_op` its op's name (the C++ printer names the op
in a kernel's error messages with it).

This module is the only one of the package that holds mutable state; the rule modules import it.
"""
from __future__ import annotations

from ..ir import Unsupported

__all__ = ["LOWERINGS", "register_lowering", "V", "cdt", "current_op"]

LOWERINGS: dict = {}


class V:
    """The lowering in progress (set by the backend around GraphLowering.run)."""
    graph = None


class _CDT:
    """The pointwise compute function being generated: its compute dtype and op (set by the
    ``pointwise`` helper around the call)."""
    dtype = None
    op = None


def cdt():
    """The compute dtype of the pointwise op being generated (for ``ops.constant``)."""
    return _CDT.dtype


def current_op():
    """The op-table name of the pointwise op being generated (error messages of kernels)."""
    return _CDT.op


def register_lowering(*names):
    """Decorator: ``fn`` becomes the rule of every op named in ``names``."""
    def deco(fn):
        for n in names:
            LOWERINGS[n] = fn
        return fn
    return deco


def _node():
    return V.graph.current_node


def _out_val():
    v = _node().meta.get("val")
    if v is None:
        raise Unsupported("node has no meta value")
    return v


def backend_of(box):
    """The device backend that runs a value's kernels: its device's, or the graph's for a value on
    ``meta`` (an AOT graph's values)."""
    import torch

    from ..device import device_backend
    dev = torch.device(box.device)
    if dev.type == "meta" and V.graph is not None:
        dev = V.graph.device
    return device_backend(dev.type)
