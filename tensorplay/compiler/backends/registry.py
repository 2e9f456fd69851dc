"""Backend registry (chapter §11.4–11.5).

A backend is ``backend(gm, example_inputs, **kwargs) -> callable``: it receives the graph after the
front-end passes and example inputs (the flat placeholder values), and returns a function of the
flat inputs returning the tuple of flat outputs.  ``kwargs`` carries the resolved mode options and
``strict_native``.

This module is the table only (it imports no backend): each backend registers itself when it is
imported, and ``tensorplay.compiler`` imports the built-in ones (``eager``, ``aot_eager``, ``stax``).
"""
from __future__ import annotations

__all__ = ["register_backend", "lookup_backend", "list_backends", "StaticShapesRequired"]


class StaticShapesRequired(Exception):
    """Raised by a backend given a symbolic graph (``dynamic=True``) that it cannot compile with
    symbolic sizes; ``tp.compile`` then hands it the graph specialised to the sample's sizes
    (capture/symbolic.specialize_graph: a guard per input size) and records the reason (the
    chapter §10: a specialisation, not a fallback to eager)."""

_BACKENDS: dict = {}


def register_backend(fn=None, *, name=None):
    """Use as ``register_backend(fn, name=...)`` or as a decorator ``@register_backend``."""
    def deco(f):
        n = name or f.__name__
        _BACKENDS[n] = f
        return f
    return deco(fn) if fn is not None else deco


def lookup_backend(name_or_fn):
    if callable(name_or_fn):
        return name_or_fn
    try:
        return _BACKENDS[name_or_fn]
    except KeyError:
        raise ValueError(f"tp.compile: unknown backend {name_or_fn!r}; available: {list_backends()}") from None


def list_backends() -> list[str]:
    return sorted(_BACKENDS)
