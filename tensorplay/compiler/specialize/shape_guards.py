"""Shape guards (the chapter, §10.2–§10.4): what a symbolic capture assumed about sizes, as key
entries and as the check function generated from them.

A ``dynamic=True`` capture (capture/symbolic.py) is valid for every call whose sizes satisfy what
it assumed; each assumption is one :class:`~.key.KeyEntry` whose expression reads the call's
input sizes (``L[i]._data.shape[d]``), so the check is generated from the key like every other
guard (invariant 1: a guard is a projection of the key) and a miss names the assumption:

* **0/1 specialisation**: a symbolic dim is at least 2; a dim of size 0 or 1 stays that size (and
  under ``dynamic="auto"`` a dim whose size never changed stays its size);
* **declared ranges**: a symbol with a range (``tp.mark_dynamic(x, 0, min=16, max=1024)``, or its
  bucket with ``dynamic.buckets``) is checked to lie in it — the one check that replaces ``>= 2``;
* **strides**: each input stride equals its expression of the sizes (the sample's layout, e.g.
  contiguous: ``stride(0) == s1``);
* **related sizes**: sizes the program related (a broadcast, a matmul) are equal —
  the shape environment's replacements (``s3 -> s1``);
* **branches**: every shape guard recorded while capturing (``Mod(s0, 8) == 0`` from ``if
  x.shape[0] % 8 == 0``), with the source line it came from; guards the declared ranges imply
  (``s0 >= 2``, ``s0 <= 4096`` when ``s0`` lies in [16, 1024]) are decided at capture and dropped
  — the shape environment never records them, and any that a later fact implies are dropped here
  (exercise 28: ``Mod(s0, 8) == 0`` is implied by no range, so it stays a runtime check).

:func:`build_input_guard` returns the check function; its ``.source`` lists each condition with the
assumption it came from (experiment 5 (2)).
"""
from __future__ import annotations

import sympy
import torch

from .guards import build_guard
from .key import KeyEntry

__all__ = ["shape_entries", "build_input_guard"]


def _source_text(expr, sources) -> str:
    """``expr`` as Python over the call's leaves: each symbol read from its input's size."""
    from torch.utils._sympy.printers import PythonPrinter
    sub = {s: sympy.Symbol(src.read(f"L[{src.index}]._data")) for s, src in sources.items()
           if src.index is not None}
    return PythonPrinter().doprint(sympy.sympify(expr).xreplace(sub))


def _is_source(src, i, d, kind) -> bool:
    """Is ``src`` (a SymbolSource or None) dim ``d``'s size/stride (``kind``) of input ``i``?"""
    return src is not None and src.index == i and src.dim == d and src.kind == kind


def shape_entries(symbolic) -> list:
    """The key entries of a symbolic capture's size assumptions (over its tensor inputs,
    ``symbolic.inputs``)."""
    sources = symbolic.sources
    # the dims specialize_graph pinned, by their symbol's source: a SymInt's ``node.expr`` is
    # already the pinned integer by now (torch applies the replacements when it is read)
    pinned = {(src.index, src.dim) for e, src in sources.items()
              if e in symbolic.pinned_by_backend and src.kind == "size"}
    out = []
    for i, name, fake in symbolic.inputs:
        subject = f"arg {i} '{name}'"
        for d, s in enumerate(fake.shape):
            e = symbolic.expr(s)
            ref = f"L[{i}]._data.shape[{d}]"
            if e.is_Integer:
                if isinstance(s, torch.SymInt) and (i, d) in pinned:
                    why = "specialised for the backend: its kernels take static sizes"
                elif isinstance(s, torch.SymInt):
                    why = "specialised by a guard: the program needed its value, e.g. range() or int() of it"
                else:
                    why = symbolic.static_why.get((i, d), "0 and 1 are specialised")
                out.append(KeyEntry(subject, f"size[{d}] ({why})", ref, int(e)))
            elif _is_source(sources.get(e), i, d, "size"):
                rng = symbolic.ranges.get(e)
                if rng is None:
                    out.append(KeyEntry(subject, f"size[{d}] = {e} >= 2 (a symbol, hint {symbolic.hint(e)}; "
                                                 f"0 and 1 are specialised)", f"({ref} >= 2)", True))
                else:
                    lo, hi, why = rng
                    test = f"({lo} <= {ref})" if hi is None else f"({lo} <= {ref} <= {hi})"
                    out.append(KeyEntry(subject, f"size[{d}] = {e} in [{lo}, {'inf' if hi is None else hi}] (a symbol, "
                                                 f"hint {symbolic.hint(e)}; range {why}; implies >= 2)", test, True))
            else:
                out.append(KeyEntry(subject, f"size[{d}] == {e} (related by the program)",
                                    f"({ref} == {_source_text(e, sources)})", True))
        for d, (n, st) in enumerate(zip(fake.shape, fake.stride())):
            if symbolic.expr(n) == 1:
                continue        # the stride of a size-1 dim is never read
            e = symbolic.expr(st)
            ref = f"L[{i}]._data.stride({d})"
            if _is_source(sources.get(e), i, d, "stride"):
                out.append(KeyEntry(subject, f"stride[{d}] = {e} >= 2 (a symbol of a strided view, hint "
                                             f"{symbolic.hint(e)}; strides 0 and 1 are specialised)",
                                    f"({ref} >= 2)", True))
            else:
                out.append(KeyEntry(subject, f"stride[{d}] == {e}", f"({ref} == {_source_text(e, sources)})", True))
    for cond, where in symbolic.guards():
        if cond is sympy.true or cond == sympy.true or symbolic.implied(cond):
            continue
        out.append(KeyEntry("shape guard", f"{cond} (from {where})", f"bool({_source_text(cond, sources)})", True))
    return out


def build_input_guard(symbolic, name="shape_guard"):
    """``check(L, F, C, M, S=None) -> None | str`` for a symbolic capture's size assumptions
    (:func:`shape_entries`); ``check.source`` is its text, a comment per condition saying where
    the condition came from."""
    return build_guard(shape_entries(symbolic), name=name)
