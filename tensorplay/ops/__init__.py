"""The op table (``OPS``) and everything generated from it.

Importing this package registers every op (one module per family: pointwise, reduction, view,
sorting, linalg, nn_ops, factories, random) and then installs, from the table alone:

* free functions in this module's namespace (re-exported as ``tp.<name>``);
* ``Tensor`` methods (unless ``Tensor`` defines the name itself, e.g. ``to``);
* Python operators (``dunders``, reflected ``rdunders``) and in-place operators (``__iadd__``).

To add an op, see docs/adding_an_op.md: one ``register(...)`` call with schema, kernel, derivative
formula (and its ``save=``), tags; then a line in the op test table.
"""
from __future__ import annotations

from .registry import OPS, OpDef, call, get, register  # noqa: F401
from . import factories, pointwise, reduction, view, sorting, linalg, nn_ops  # noqa: F401  (registration)
from .._tensor import Tensor

__all__ = ["OPS", "OpDef", "get", "register"]


def _reflect(fn):
    def r(self, other):
        return fn(other, self)
    return r


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
            setattr(Tensor, d, op.fn)
        for d in op.rdunders:
            setattr(Tensor, d, _reflect(op.fn))
    for name, extra in getattr(view, "EXTRA_METHODS", {}).items():
        setattr(Tensor, name, extra)


_install()
from .factories import *  # noqa: F401,F403,E402  (python-level factory wrappers)
from .view import *  # noqa: F401,F403,E402
__all__ += list(factories.__all__) + list(view.__all__)
