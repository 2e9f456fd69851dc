"""Elementwise-region marks (chapter §4.1, §7): which pointwise nodes a backend may fuse.

A *region* is a maximal connected group of pointwise nodes (op tag ``pointwise``), where two
pointwise nodes are connected when one is an argument of the other.  Every pointwise node gets
``node.meta["region"] = r``, an int numbering the regions in graph order (the region of the first
node of the group in program order gets the smallest number); other nodes carry no mark.  The marks
are a hint for the backend's scheduler (loop fusion decides by itself, §7); they change no value.

Computed with union-find over the pointwise edges, near-linear time.  Idempotent: the marks are a
function of the graph alone, so a second run finds them equal and reports no change.

Termination: a single sweep (not part of the fixed-point loop; the pipeline runs it last).
"""
from __future__ import annotations

__all__ = ["regions", "is_pointwise"]


def is_pointwise(n) -> bool:
    d = n.opdef
    return n.op == "call_function" and d is not None and "pointwise" in d.tags and not d.is_inplace


def regions(gm) -> bool:
    """Mark maximal connected groups of pointwise nodes with ``meta["region"]`` (§4.1, §7); True if
    any mark changed.  A single sweep; idempotent."""
    g = gm.graph
    parent: dict = {}

    def find(x):
        while parent[x] is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    pw = [n for n in g.nodes if is_pointwise(n)]
    for n in pw:
        parent[n] = n
    for n in pw:
        for i in n.all_input_nodes:
            if i in parent:
                a, b = find(n), find(i)
                if a is not b:
                    parent[a] = b
    ids: dict = {}
    changed = False
    for n in g.nodes:
        if n in parent:
            r = ids.setdefault(find(n), len(ids))
            if n.meta.get("region") != r:
                n.meta["region"] = r
                changed = True
        elif "region" in n.meta:
            del n.meta["region"]
            changed = True
    return changed
