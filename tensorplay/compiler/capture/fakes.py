"""Fake tensors of a symbolic capture, the helpers that need no sympy (the chapter §10.1): a graph's
fake mode and whether it is symbolic, a ShapeEnv's sample values, a leaf mapper over the nested
shapes op arguments come in.  Kept apart from ``symbolic.py`` so that the static paths (AOT's
dispatch trace, a warm cache's call) import no sympy."""
from __future__ import annotations

import torch

__all__ = ["map_leaves", "fake_mode_of", "sample_values", "is_symbolic"]


def map_leaves(x, f):
    """``x`` with ``f`` applied to every leaf inside lists, tuples (named ones too) and slices —
    the shapes op arguments and metadata come in."""
    if isinstance(x, list):
        return [map_leaves(v, f) for v in x]
    if isinstance(x, tuple):
        vals = [map_leaves(v, f) for v in x]
        if hasattr(x, "_fields"):
            return type(x)(*vals)
        return tuple(vals) if isinstance(x, torch.Size) else type(x)(vals)   # (a Size holds no expression)
    if isinstance(x, slice):
        return slice(map_leaves(x.start, f), map_leaves(x.stop, f), map_leaves(x.step, f))
    return f(x)


def fake_mode_of(gm):
    """The fake mode (with its ShapeEnv) of a symbolic graph — a ``dynamic=True`` capture's, read
    from its placeholders' ``meta["val"]`` — or None for a static graph."""
    for p in gm.graph.placeholders:
        mode = getattr(p.meta.get("val"), "fake_mode", None)
        if getattr(mode, "shape_env", None) is not None:
            return mode
    return None


def sample_values(env) -> dict:
    """A ShapeEnv's backed symbols -> their sample values (the hints; torch versions name the
    table ``backed_var_to_val`` or ``var_to_val``)."""
    vals = getattr(env, "backed_var_to_val", None)
    return env.var_to_val if vals is None else vals


def is_symbolic(gm) -> bool:
    """Do ``gm``'s placeholders carry symbolic fakes (a ``dynamic=True`` capture)?"""
    return fake_mode_of(gm) is not None
