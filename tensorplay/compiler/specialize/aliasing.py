"""Which inputs share memory: the aliasing part of the specialization key (chapter §2.2).

The captured graph names each tensor input by its own placeholder, and functionalisation
(passes/functionalize.py) assumes that placeholders do not alias: ``a.add_(1); return b * 2``
becomes ``a' = a + 1; copy_(a, a'); b * 2`` — right for two tensors, wrong for ``g(x, x)``, where
eager's ``b`` sees the update.  So how the inputs overlap is part of the key, and the graph
compiled for one overlap pattern is made right for it:

* **memory model** — a tensor with elements occupies the byte span ``[p, p + e)``, ``p`` its data
  pointer and ``e = (Σ (size_i - 1)·stride_i + 1)·itemsize``; two tensors *may overlap* when their
  spans on one device intersect (different allocations never do).  Groups are the connected
  components of that relation.  The test is conservative: interleaved views such as ``x[::2]``
  and ``x[1::2]`` share a span without sharing an element and count as overlapping (right, at
  worst slower); views with disjoint spans (``x[0:2]``, ``x[2:4]``) are unaliased.  Tensors
  without elements alias nothing.
* **the datum** — :func:`alias_structure` returns one ``(kind, positions)`` per group of two or
  more: ``kind`` is ``"same"`` when every member is the same view (data pointer, sizes, strides,
  dtype), else ``"overlap"``; positions index the graph's placeholders (tensor inputs, then free
  tensors).  The key entry stores it and the guard recomputes and compares it (invariant 1).
* **what is compiled** — a ``"same"`` group is one input: :func:`merge_same` rewires the uses of
  the later members' placeholders to the first before functionalisation, so reads see writes as in
  eager (PyTorch dedupes such inputs too).  An ``"overlap"`` group that contains an input the region
  writes has no functional form here (an update seen through a partial overlap), so that
  specialization runs the function eagerly (:func:`eager_reason`): correct, not fast.
* **when it is in the key** — only when the region writes one of its placeholders (an in-place op
  on an input or free tensor) and has two or more: a region that writes no input computes the
  same values whatever overlaps (its outputs are fresh), so there the datum is left out and costs
  nothing.
"""
from __future__ import annotations

__all__ = ["alias_structure", "describe_structure", "merge_same", "eager_reason", "written_placeholders"]


def _span(d):
    """(device, first byte, end byte) of a torch tensor with elements, else None."""
    n = d.numel()
    if n == 0:
        return None
    if d.is_contiguous():
        e = n * d.element_size()
    else:
        e = (sum((s - 1) * st for s, st in zip(d.shape, d.stride())) + 1) * d.element_size()
    p = d.data_ptr()
    return (str(d.device), p, p + e)


def alias_structure(tensors) -> tuple:
    """The overlap groups of ``tensors`` (tp.Tensors), as ``((kind, positions), ...)`` — see the
    module docstring; ``()`` when no two overlap."""
    spans = []
    for i, t in enumerate(tensors):
        s = _span(t._data)
        if s is not None:
            spans.append((s, i))
    if len(spans) < 2:
        return ()
    spans.sort()
    groups, cur, (dev, _, end) = [], [spans[0][1]], spans[0][0]
    for (d, lo, hi), i in spans[1:]:
        if d == dev and lo < end:
            cur.append(i)
            end = max(end, hi)
        else:
            if len(cur) > 1:
                groups.append(cur)
            cur, dev, end = [i], d, hi
    if len(cur) > 1:
        groups.append(cur)
    out = []
    for g in groups:
        g.sort()
        views = {(tensors[i]._data.data_ptr(), tuple(tensors[i]._data.shape), tensors[i]._data.stride(),
                  tensors[i]._data.dtype) for i in g}
        out.append(("same" if len(views) == 1 else "overlap", tuple(g)))
    return tuple(out)


def describe_structure(structure, names) -> str:
    """``structure`` in words, with the placeholders' human names."""
    if not structure:
        return "no two share memory"
    parts = []
    for kind, pos in structure:
        who = ", ".join(repr(names[i]) if i < len(names) else f"#{i}" for i in pos)
        parts.append(f"{who} are the same tensor" if kind == "same" else f"{who} overlap in memory")
    return "; ".join(parts)


def written_placeholders(graph) -> set:
    """Positions of the placeholders whose storage an in-place op of the (captured, not yet
    functionalised) graph writes."""
    from ..passes.functionalize import mutated_roots
    roots = mutated_roots(graph)
    return {i for i, p in enumerate(graph.placeholders) if p in roots}


def merge_same(gm, structure):
    """Rewire the uses of every ``"same"`` group's later placeholders to its first one (before
    functionalisation); the placeholders stay, so the artifact's signature does not change."""
    ph = gm.graph.placeholders
    changed = False
    for kind, pos in structure:
        if kind == "same":
            for i in pos[1:]:
                changed |= bool(ph[i].replace_all_uses_with(ph[pos[0]]))
    if changed:
        gm.graph.lint()
        gm.recompile()


def eager_reason(structure, written, names):
    """Why this specialization must run eagerly, or None: an ``"overlap"`` group with a written
    member (module docstring)."""
    for kind, pos in structure:
        if kind == "overlap" and written.intersection(pos):
            w = [names[i] for i in pos if i in written]
            return (f"inputs {describe_structure(((kind, pos),), names)} and the region writes "
                    f"{', '.join(map(repr, w))} in place")
    return None
