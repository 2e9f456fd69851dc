"""Guards generated from the specialization key (chapter §2.3).

``build_guard(key)`` returns a function ``check(L, F, C, M, S=None) -> None | str`` (flat input
leaves, free tensors, constants, the keyed modules, the tree spec of the call): None when every key
entry holds for the call, otherwise the description of the first entry that fails, e.g.
``arg 0 'x': size[0] expected 64, got 128``.  The function is generated as Python source from the
key entries alone (its text is in ``check.source``) — the guard is a projection of the key, never
maintained beside it (invariant 1).
"""
from __future__ import annotations

import math

from ..._tensor import Tensor
from ...autograd import grad_mode
from .aliasing import alias_structure

__all__ = ["build_guard"]


def _is_tensor(x):
    return isinstance(x, Tensor)


def _training(m):
    return tuple(x.training for x in m.modules()) if hasattr(m, "modules") else (m.training,)


def build_guard(key, name="guard"):
    consts = {}
    lines = [f"def {name}(L, F, C, M, S=None):"]
    lines.append("    try:")
    for i, e in enumerate(key):
        cname = f"_v{i}"
        consts[cname] = e.value
        consts[f"_e{i}"] = e
        cmp = "is not" if e.field == "type" and isinstance(e.value, type) else "!="
        lines.append(f"        # {e.subject}: {e.field}".replace("\n", " "))
        lines.append(f"        _g = {e.expr}")
        lines.append(f"        if _g {cmp} {cname}: return _e{i}.describe(_g)")
    lines.append("    except (IndexError, AttributeError, TypeError) as exc:")
    lines.append("        return f'input structure changed: {exc}'")
    lines.append("    return None")
    src = "\n".join(lines) + "\n"
    # (``math``: sympy's Python printer writes floor, ceiling, Min and Max of size expressions as
    # math.floor, ...)
    ns = {"math": math, "_is_tensor": _is_tensor, "_training": _training, "_aliasing": alias_structure, "G": grad_mode._state,
          **consts}
    exec(compile(src, f"<tp guard {name}>", "exec"), ns)
    fn = ns[name]
    fn.source = src
    fn.key = key
    return fn
