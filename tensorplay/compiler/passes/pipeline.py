"""The pass pipeline (chapter §4.1, Prop. 4.1): rewriting to a fixed point.

``run_passes(gm, basis=None, passes=None, max_iters=50)``:

1. ``canonicalize`` once, so that in-place methods of hand-built graphs are op-table nodes, then
   ``functionalize`` once (§4.4): every later pass assumes a pure graph (``skip_functionalize=True``
   when the caller did it, e.g. to extract data-gate replays before DCE, Prop. 3.1);
2. the loop ``canonicalize, simplify, constant_fold, decompose(basis), cse, dce`` until one whole
   round changes nothing (the fixed point); ``passes=`` replaces this list (names or callables);
3. ``regions`` (elementwise-region marks for the backend);

with ``gm.graph.lint()`` after every pass and ``gm.recompile()`` at the end.  ``TP_DEBUG_GRAPH=1``
(the knob ``debug.graph``) prints the graph (each node with its opcode, target and type) to stderr
on entry and after every pass that changed it, under a header naming the pass.

**Termination (Prop. 4.1).**  Each pass in the loop reports a change only if it strictly decreased
its own measure, and none increases the measures of the passes before it, so every round that
changes something strictly decreases the lexicographic measure

    mu(G) = ( #non-canonical nodes,                                   canonicalize
              multiset of decomposition depths of nodes outside B,   decompose (Dershowitz-Manna)
              #call nodes that are not constants,                      constant_fold, simplify
              #div nodes,                                             simplify (x / 2^k -> x * 2^-k)
              #nodes )                                                simplify, cse, dce

— canonicalize only creates canonical nodes; decompose creates canonical nodes of smaller depth
only; simplify and constant_fold create no non-canonical node and no node outside the basis with a
decomposition (the ``x / 2^k`` rule needs ``mul`` in the basis), constant_fold turns one call into a
``get_attr``, simplify erases a node or turns a div into a mul, cse and dce only erase.  mu lives in
a lexicographic product of well-founded orders (N, multisets over N, N, N, N), which is
well-founded: the loop stops after finitely many rounds.

Exercise 6: a rule that decreases no measure breaks this — ``a + b -> b + a`` alone rewrites
forever (it maps a graph to one of the same size and shape, so no measure built from counts can
decrease).  Commutation is admissible only as *normalisation*: order the operands by a fixed total
order on values (e.g. node position, constants last) and rewrite only unordered pairs; the number
of unordered pairs is then the extra (last) component of mu, and constant folding keeps its place
before it (a fold removes a node, which can only remove unordered pairs).  Every pass sweeps the whole graph in
program order, so a round settles whole chains of rewrites and two or three rounds suffice in
practice.  ``max_iters`` is a safety net for user-supplied passes (a pass that does not decrease a
measure, exercise 6): exceeding it raises a RuntimeError naming the passes still changing the graph.
"""
from __future__ import annotations

import sys

from .. import config
from .canonicalize import canonicalize
from .constant_fold import constant_fold
from .cse import cse
from .dce import dce
from .decompose import decompose
from .functionalize import functionalize
from .regions import regions
from .simplify import simplify
from ...profiler.recorder import span as _profiler_span

__all__ = ["run_passes", "DEFAULT_PASSES", "PASSES"]

DEFAULT_PASSES = ("canonicalize", "simplify", "constant_fold", "decompose", "cse", "dce")

PASSES = {"canonicalize": canonicalize, "simplify": simplify, "constant_fold": constant_fold,
          "decompose": decompose, "cse": cse, "dce": dce, "functionalize": functionalize, "regions": regions}


def _debug() -> bool:
    return config.get("debug.graph")


def _show(gm, header):
    print(f"===== [tp graph] {header} =====\n{gm.graph}", file=sys.stderr)


def _resolve(p):
    if callable(p):
        return getattr(p, "__name__", repr(p)), p
    try:
        return p, PASSES[p]
    except KeyError:
        raise ValueError(f"run_passes: unknown pass {p!r}; known: {sorted(PASSES)}") from None


def run_passes(gm, *, basis=None, passes=None, max_iters=50, skip_functionalize=False):
    """Run the pass pipeline on ``gm`` in place and return it (see module docstring).

    ``skip_functionalize=True``: the caller already functionalised the graph (the compile front
    end does, to extract the data-gate replays between functionalisation and DCE)."""
    debug = _debug()
    if debug:
        _show(gm, "after capture (input of run_passes)")

    def run(name, fn):
        with _profiler_span(f"pass {name}", "compile"):
            if name in ("decompose", "simplify"):
                changed = fn(gm, basis)
            else:
                changed = fn(gm)
        gm.graph.lint()
        if changed and debug:
            _show(gm, f"after {name}")
        return changed

    if not skip_functionalize:
        run("canonicalize", canonicalize)
        run("functionalize", functionalize)
    loop = [_resolve(p) for p in (DEFAULT_PASSES if passes is None else passes)]
    for _ in range(max_iters):
        changed = [name for name, fn in loop if run(name, fn)]
        if not changed:
            break
    else:
        raise RuntimeError(f"run_passes: no fixed point after {max_iters} rounds; passes still changing the "
                           f"graph in the last round: {', '.join(changed)} (a pass that does not decrease a "
                           f"well-founded measure, Prop. 4.1)")
    run("regions", regions)
    gm.recompile()
    return gm
