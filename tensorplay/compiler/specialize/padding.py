"""Bucket padding (the chapter, Prop. 10.3): one static artifact per power-of-two bucket.

With ``options={"dynamic.buckets": True}`` every size symbol ranges over its sample's bucket
``(2^(k-1), 2^k]`` (capture/symbolic.py), so a backend that takes symbolic graphs compiles once per
bucket.  A backend with static kernels (``dynamic_shapes = False``) would still compile once per
*size* — unless the program may be run at the bucket's top size and its result cut back: the
inputs padded along the symbol's dim to ``2^k``, the outputs sliced to the call's size.

That is correct exactly when the program is **row-independent** along the padded dim: output row
``i`` reads input row ``i`` only, so the padding rows never reach a real row.  It is proved from the
op table's tags and the symbolic metadata alone (no op names):

* every node whose inputs carry the symbol is ``pointwise`` (the symbol's dim lines up, counted
  from the right, in every input that has it and in the output — broadcasting keeps rows apart)
  or a ``reduction`` that keeps the symbol's dim (it reduces over *other* dims);
* the symbol appears in each such tensor once, as a plain dim (not ``2*s``), and in no argument
  (a ``view(s, ...)`` or ``arange(s)`` would read the padded size);
* the graph writes no input in place, draws no random numbers (a stream's numbers depend on the
  size), has no data gates (a gate reads the padded values) and is no training region.

Anything else — a matmul contracting the dim, a reduction over it, a ``cat``, an index — is not
padded: the backend gets the graph specialised to the sample's sizes (one artifact per size).
"""
from __future__ import annotations

import sympy
import torch

from ..._tensor import Tensor, _wrap

__all__ = ["padded_dims", "compile_padded"]


def _positions(v, s, symbolic):
    """The dims of fake tensor ``v`` whose size is the symbol ``s``; None when ``s`` also occurs
    inside another size expression (``2*s``)."""
    out = []
    for d, x in enumerate(v.shape):
        e = symbolic.expr(x)
        if e == s:
            out.append(d)
        elif s in getattr(e, "free_symbols", ()):
            return None
    return out


def _args_mention(x, s) -> bool:
    from ..graph.node import _is_size_expr
    if isinstance(x, (list, tuple)):
        return any(_args_mention(v, s) for v in x)
    if isinstance(x, slice):
        return any(_args_mention(v, s) for v in (x.start, x.stop, x.step))
    if isinstance(x, torch.SymInt):
        return s in x.node.expr.free_symbols
    return _is_size_expr(x) and s in sympy.sympify(x).free_symbols


def _row_independent(gm, s, symbolic) -> bool:
    import operator
    vals = {}
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" or n.op == "get_attr":
            vals[n] = v
            continue
        if n.op == "output":
            return True           # every node that touches the symbol's dim keeps rows apart
        vals[n] = v
        if n.target is operator.getitem:
            continue
        d = n.opdef
        ins = [vals.get(a) for a in n.all_input_nodes]
        ins = [t for t in ins if isinstance(t, torch.Tensor)]
        carried = [(t, _positions(t, s, symbolic)) for t in ins]
        if not any(p for _, p in carried) and not any(p is None for _, p in carried):
            if _args_mention(n.args, s) or _args_mention(list(n.kwargs.values()), s):
                return False
            continue                       # the node does not touch the symbol's dim
        if d is None or d.is_inplace or "random" in d.tags or _args_mention(n.args, s) \
                or _args_mention(list(n.kwargs.values()), s):
            return False
        outs = v if isinstance(v, (tuple, list)) else (v,)
        outs = [o for o in outs if isinstance(o, torch.Tensor)]
        pos_out = [_positions(o, s, symbolic) for o in outs]
        if not outs or any(p is None or len(p) != 1 for p in pos_out) or any(p is None or len(p) > 1 for _, p in carried):
            return False
        if "pointwise" in d.tags:
            o, (po,) = outs[0], pos_out[0]
            if any(p and t.dim() - p[0] != o.dim() - po for t, p in carried):
                return False
        elif "reduction" not in d.tags:
            return False
    return False


def padded_dims(gm, symbolic, lowered):
    """``{symbol: bucket top}`` for the symbols along which padding preserves the program (module
    doc); empty when none or when the region itself rules padding out."""
    if lowered.replay is not None or lowered.is_training:
        return {}
    out = {}
    for s, (lo, hi, _) in symbolic.ranges.items():
        src = symbolic.sources.get(s)
        if hi is None or src is None or src.index is None or src.kind != "size" or hi == symbolic.hint(s):
            continue
        if _row_independent(gm, s, symbolic):
            out[s] = hi
    return out


def compile_padded(backend, gm, example, symbolic, tops, **kw):
    """Compile ``gm`` at the bucket tops ``tops`` (``{symbol: size}``) and return an artifact that
    pads its inputs to them and slices its outputs back to the call's sizes."""
    from ..capture.symbolic import specialize_graph
    static = specialize_graph(gm, symbolic, tops)
    pad = []            # (placeholder position, dim, top, symbol): every input dim of a padded symbol
    for s, top in tops.items():
        for i, n in enumerate(gm.graph.placeholders):
            v = n.meta.get("val")
            for d in (_positions(v, s, symbolic) or []) if isinstance(v, torch.Tensor) else []:
                pad.append((i, d, top, s))
    cut = []            # (output position, dim, the placeholder position and dim that give the size)
    where = {s: next((i, d) for i, d, _, t in pad if t == s) for s in tops}
    outs = gm.graph.output_node.args[0]
    for k, o in enumerate(outs):
        v = o.meta.get("val")
        for s in tops:
            for d in (_positions(v, s, symbolic) or []) if isinstance(v, torch.Tensor) else []:
                cut.append((k, d) + where[s])

    def padded(args):
        args = list(args)
        for i, d, top, _ in pad:
            a = args[i]._data if isinstance(args[i], Tensor) else args[i]
            if a.shape[d] == top:
                continue
            shape = list(a.shape)
            shape[d] = top
            p = a.new_zeros(shape)
            p.narrow(d, 0, a.shape[d]).copy_(a)
            args[i] = _wrap(p)
        return args
    art = backend(static, padded(example), **kw)

    def run(*args):
        outs = list(art(*padded(args)))
        for k, d, i, di in cut:
            n = args[i].shape[di]
            o = outs[k]
            outs[k] = _wrap(o._data.narrow(d, 0, n)) if isinstance(o, Tensor) else o.narrow(d, 0, n)
        return tuple(outs)
    run.padded_to = dict(tops)
    run.inner = art
    return run
