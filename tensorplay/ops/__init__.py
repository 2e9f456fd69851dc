"""The op table (``OPS``) and everything generated from it.

Importing this package registers every op (one module per family: pointwise, reduction, view,
sorting, linalg, ragged, nn_ops, factories, random, search, combine) and then installs, from the table alone:

* free functions in this module's namespace (re-exported as ``tp.<name>``);
* ``Tensor`` methods (unless ``Tensor`` defines the name itself, e.g. ``to``);
* Python operators (``dunders``, reflected ``rdunders``) and in-place operators (``__iadd__``).

To add an op, see docs/adding_an_op.md: one ``register(...)`` call with schema, kernel, derivative
formula (and its ``save=``), tags; then a line in the op test table.
"""
from __future__ import annotations

import numbers

import torch

from .registry import OPS, OpDef, call, get, register  # noqa: F401
from . import factories, pointwise, reduction, view, sorting, linalg, ragged, nn_ops, functional_ops, special  # noqa: F401  (registration)
from . import search, combine  # noqa: F401,E402  (registration)
from . import linalg_extra, fft  # noqa: F401,E402  (registration: tp.linalg, tp.fft)
from . import sparse, aliases  # noqa: F401,E402  (registration: sparse COO conversions; PyTorch's aliases)
from .._tensor import Tensor

__all__ = ["OPS", "OpDef", "get", "register"]


def _reflect(fn):
    def r(self, other):
        return fn(other, self)
    return r


def _eq_dunder(fn):
    """``x == None`` / ``x == "a"`` is False (Python falls back to identity), as in PyTorch."""
    def d(self, other):
        if not isinstance(other, (Tensor, numbers.Number, torch.Tensor)):
            return NotImplemented
        return fn(self, other)
    d.__name__ = fn.__name__
    d._opdef = fn._opdef
    return d


def _install():
    g = globals()
    own = set(vars(Tensor))
    for name, op in OPS.items():
        if op.function and op.function not in g:
            g[op.function] = op.fn
            __all__.append(op.function)
        if op.method and op.method not in own:
            setattr(Tensor, op.method, op.fn)
        for d in op.dunders:
            setattr(Tensor, d, _eq_dunder(op.fn) if d in ("__eq__", "__ne__") else op.fn)
        for d in op.rdunders:
            setattr(Tensor, d, _reflect(op.fn))
    for name, extra in getattr(view, "EXTRA_METHODS", {}).items():
        setattr(Tensor, name, extra)
    # Python-level entry points that dispatch among several table ops (e.g. tp.max -> max /
    # max_dim / maximum, tp.unique -> unique with the requested outputs)
    for mod in (reduction, sorting, search, combine, sparse, aliases):
        for name, extra in getattr(mod, "EXTRA_METHODS", {}).items():
            setattr(Tensor, name, extra)
        for name, fn in getattr(mod, "EXTRA_FUNCTIONS", {}).items():
            g[name] = fn
            __all__.append(name)


_install()
from .factories import *  # noqa: F401,F403,E402  (python-level factory wrappers)
from .view import *  # noqa: F401,F403,E402
__all__ += list(factories.__all__) + list(view.__all__)
