"""One definition per distinct kernel of a graph: identical steps share one source and one build.

An unrolled recurrent loop or a stack of identical layers yields kernels that differ only in the
names of the buffers they read and write (``buf3`` in step 1 is ``buf9`` in step 2) and in their
own name (``kernel2``, ``kernel5``).  :func:`canonical_kernel` renames every such identifier --
the kernel's name, its parameters and the buffers it computes (also inside derived locals like
``acc_buf3_0``) -- to positional markers in order of first appearance; two kernels with the same
canonical text compute the same function of their arguments, position by position (the markers
cannot occur in generated code, so the renaming is a bijection on identifiers).
:class:`KernelTable` then hands the second one the FIRST kernel's name and source with its own
arguments: the wrapper defines (builds, loads) it once and calls it twice.

Guarantee: sharing never changes a result (the shared kernel is the one that would have run,
under other parameter names); a name the renaming misses only keeps two kernels apart.
``codecache.stats["kernels_shared"]`` counts the kernels that reused an earlier one.
"""
from __future__ import annotations

import re

from . import codecache

__all__ = ["canonical_kernel", "KernelTable"]


def canonical_kernel(source: str, names) -> str:
    """``source`` with each identifier of ``names`` (whole, or as an ``_``-separated part of a longer
    one) replaced by a marker ``\\x00k\\x00``, ``k`` its rank of first appearance."""
    names = sorted({n for n in names if n}, key=len, reverse=True)
    if not names:
        return source
    pat = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9])")
    order: dict = {}
    return pat.sub(lambda m: f"\x00{order.setdefault(m.group(1), len(order))}\x00", source)


class KernelTable:
    """The kernels of one graph as ``compile_graph`` renders them: :meth:`add` gives the name and
    source to use for a group -- an earlier kernel's when the canonical texts agree."""

    def __init__(self):
        self._by_text: dict = {}     # canonical text -> (name, source)
        self.shared = 0

    def add(self, name: str, source: str, params: dict, computed=()) -> tuple:
        """``name``/``source``: the kernel just rendered; ``params``: its parameters (in call
        order); ``computed``: the buffers its group computes.  Returns (name, source) to define
        and call with ``params``."""
        key = canonical_kernel(source, [name, *params, *computed])
        hit = self._by_text.get(key)
        if hit is None:
            self._by_text[key] = (name, source)
            return name, source
        self.shared += 1
        codecache._count("kernels_shared")
        return hit
