"""Functionalisation (chapter §4.4, Prop. 4.4): in-place ops and mutation through views -> pure ops.

A captured graph records in-place ops the way the program ran them: ``add_(v, 1)`` is a node, and
later reads of the mutated tensor (and of every view of it) still reference the *old* node, as in
torch.fx.  Every other pass assumes a pure graph — a node's value is a function of its arguments —
so this pass runs first and rewrites mutation into values:

* **alias analysis.**  Each tensor value has a *storage root* and a *view path*: a node produced
  by an aliasing view op (tag ``view``, and the meta kernel confirms it aliases: the ops tagged
  ``may_copy``, ``reshape`` / ``contiguous`` / ``flatten``, may copy) has its input as parent and ``(view op, view args)`` as
  step; multi-output views (``split``/``chunk``/``unbind``) are read through their ``getitem``
  projections as single-output steps (``narrow``/``select``).  Everything else is a root.
* **in-place op on t** (root r, path ``p1 ... pk``): the functional twin computes the new value of
  t — ``add_`` -> ``add`` (the table's ``inplace_of``), ``copy_``/``fill_``/``zero_`` ->
  ``_scatter_view(t, src, "getitem", (...,))``, ``setitem_(t, idx, v)`` ->
  ``_scatter_view(t, v, "getitem" | "index", (idx,))``, a cast back to t's dtype where the
  functional op promotes — and the new value is written back level by level with the scatter
  inverse ``b_{i-1}' = _scatter_view(b_{i-1}, b_i', p_i)`` up to the root, whose current value
  becomes ``b_0'``.  ``y.t()[0].add_(1)`` becomes ``t = t(y); g = getitem(t, 0); a = add(g, 1);
  t' = _scatter_view(t, a, "getitem", (0,)); y' = _scatter_view(y, t', "t", ())``.
* **reads** of a tensor use its current value: a root's latest value, and for a view whose root
  was mutated since the view was last derived, a re-derived view of the new root (one view node
  per level, e.g. ``getitem(t(y'), 0)``).  Prop. 4.4's two conditions on ``_scatter_view``
  (``view(scatter(b, s)) = s`` and ``scatter(b, view(b)) = b``) are exactly what makes the new
  values of t and of every level of its path equal to the re-derived views, so they are reused.
* **graph inputs** that were mutated (placeholders whose root changed) get their final value
  written back at the end: ``copy_(placeholder, final, False)`` nodes right before the output,
  marked ``meta["writeback"] = True`` — the only in-place ops left.  Constants (``get_attr``) are
  not written back: a constant stands for a tensor the program creates afresh at every call.
* an in-place op without a functional twin (the random fills ``uniform_``, ``normal_``, ...) is
  applied to a private clone, ``c = clone(t); uniform_(c)``, which nobody else can observe.

Assumptions: graph inputs do not alias each other (the specialization key sees distinct tensors);
mutation through ``as_strided`` views (storage-relative) is refused with ``NotImplementedError``.
After the pass, outputs that were the mutated tensors are fresh tensors with the right values
(eager returns the input object itself); compare values, not identities.

Termination: one forward sweep over the original nodes; each in-place node is replaced by a
bounded number of new nodes (twin, one scatter per view level, re-derived views), none of them an
in-place op except the write-backs, which the pass leaves alone — so a second run is a no-op.
Measure: the number of in-place nodes that are not write-backs.

The alias analysis (:func:`view_step`, :func:`alias_root`, :func:`mutated_roots`) is shared with CSE
and constant folding, which must not merge or fold storage that is mutated later.
"""
from __future__ import annotations

import operator

import torch

from ...ops.registry import OPS
from ..graph.node import Node, map_arg
from .node_meta import _meta_args, fresh_meta, meta_of, set_meta

__all__ = ["functionalize", "view_step", "alias_root", "mutated_roots", "is_mutation", "is_writeback"]


# ---------------------------------------------------------------------------------------------
# alias analysis
# ---------------------------------------------------------------------------------------------
def is_mutation(n: Node) -> bool:
    d = n.opdef
    return n.op == "call_function" and d is not None and d.is_inplace


def is_writeback(n: Node) -> bool:
    return is_mutation(n) and bool(n.meta.get("writeback"))


_ALIAS_CACHE_KEY = "_alias_step"


def _aliases(node: Node) -> bool:
    """Does this view-tagged node really alias its input?  Decided by the op's meta kernel on a
    fresh meta input: views of meta tensors carry ``_base`` exactly when ATen aliased."""
    d = node.opdef
    src = node.args[0]
    v = src.meta.get("val") if isinstance(src, Node) else None
    if not isinstance(v, torch.Tensor):
        return "may_copy" not in d.tags     # no meta: assume the view aliases unless it may copy
    inp = fresh_meta(v)
    try:
        out = d.run_meta(inp, *_meta_args(node.args[1:]))
    except Exception:
        return "may_copy" not in d.tags
    # run_meta converts its input to a fresh meta tensor (no _base), so an output with a _base
    # is a view of that input
    return isinstance(out, torch.Tensor) and out._base is not None


def _multi_view_step(prod: Node, i: int):
    """``split``/``chunk``/``unbind`` output i as a single-output view step of their input."""
    d = prod.opdef
    vals = prod.meta.get("val")
    if d.name == "unbind":
        return "select", (prod.args[1], i)
    if d.name in ("split", "chunk") and isinstance(vals, (tuple, list)):
        dim = prod.args[2] if d.name == "split" else prod.args[2]
        nd = vals[0].dim()
        dim = dim % nd if nd else 0
        start = sum(int(vals[j].shape[dim]) for j in range(i))
        return "narrow", (dim, start, int(vals[i].shape[dim]))
    return "__unsupported__" + d.name, (i,)


def view_step(n: Node):
    """``(parent, view op name, view args)`` if ``n`` is an aliasing view of one input, else None."""
    if n.op != "call_function":
        return None
    d = n.opdef
    if d is not None:
        if not d.is_view or d.schema.returns_list or d.schema.returns_tuple or not isinstance(n.args[0], Node):
            return None
        if not _aliases(n):
            return None
        return n.args[0], d.name, tuple(n.args[1:])
    if n.target is operator.getitem and isinstance(n.args[0], Node):
        prod = n.args[0]
        pd = prod.opdef
        if pd is not None and pd.is_view and pd.schema.returns_list and isinstance(prod.args[0], Node):
            name, args = _multi_view_step(prod, n.args[1])
            return prod.args[0], name, args
    return None


def alias_root(n: Node, _memo=None) -> Node:
    """The storage root of a value: follow aliasing views (and in-place results) to a non-view node."""
    seen = 0
    while True:
        if is_mutation(n):
            n = n.args[n.opdef.schema.mutated_pos]
            continue
        s = view_step(n)
        if s is None:
            return n
        n = s[0]
        seen += 1
        if seen > 100000:  # pragma: no cover - graphs are acyclic
            raise RuntimeError("alias_root: cycle in view chain")


def mutated_roots(graph) -> set:
    """Storage roots written by an in-place op anywhere in the graph (write-backs included)."""
    out = set()
    for n in graph.nodes:
        if is_mutation(n):
            t = n.args[n.opdef.schema.mutated_pos]
            if isinstance(t, Node):
                out.add(alias_root(t))
    return out


# ---------------------------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------------------------
def _is_basic_index(idx) -> bool:
    from ...ops.view import _is_basic
    return _is_basic(idx)


def _compatible_twin(op):
    """The functional twin of an in-place op if its schema matches argument for argument."""
    name = op.inplace_of
    f = OPS.get(name) if name else None
    if f is None or f.is_inplace or "random" in f.tags:
        return None
    a, b = op.schema.args, f.schema.args
    if len(a) != len(b):
        return None
    for x, y in zip(a, b):
        if x.name != y.name or x.type.split("(")[0] != y.type.split("(")[0]:
            return None
    return f


class _State:
    def __init__(self, gm):
        self.gm = gm
        self.g = gm.graph
        self.resolve: dict = {}      # in-place node -> the tensor node it mutated
        self.parent: dict = {}       # view node -> (parent node, step name, step args)
        self.root: dict = {}         # node -> storage root
        self.epoch: dict = {}        # root -> number of writes so far
        self.cur: dict = {}          # node -> (epoch of its root, node holding its current value)
        self.changed_roots: dict = {}  # roots written so far (insertion ordered)
        self.orig_src: dict = {}       # multi-output view node -> its original input

    # -- helpers --------------------------------------------------------------------------------
    def _emit(self, op, args, before, extra_meta=None):
        with self.g.inserting_before(before):
            node = self.g.call_function(op, tuple(args))
        set_meta(node, op)
        if extra_meta:
            node.meta.update(extra_meta)
        return node

    def _res(self, a):
        while a in self.resolve:
            a = self.resolve[a]
        return a

    def value(self, a, before):
        """The node holding the current value of (original) node ``a``, re-deriving stale views."""
        a = self._res(a)
        r = self.root.get(a)
        if r is None:
            return a
        e = self.epoch[r]
        c = self.cur.get(a)
        if c is not None and c[0] == e:
            return c[1]
        p, name, sargs = self.parent[a]
        pv = self.value(p, before)
        if name.startswith("__unsupported__") or name == "as_strided":
            raise NotImplementedError(f"functionalize: cannot re-derive view {name.replace('__unsupported__', '')} of "
                                      f"{r.name} after it was mutated (unsupported view kind)")
        node = self._emit(OPS[name], (pv,) + tuple(sargs), before)
        self.cur[a] = (e, node)
        return node

    def _rewrite_inputs(self, n):
        n.args = map_arg(n.args, lambda a: self.value(a, n))
        if n.kwargs:
            n.kwargs = map_arg(n.kwargs, lambda a: self.value(a, n))

    # -- per node -------------------------------------------------------------------------------
    def record(self, n, step):
        if step is None:
            self.root[n] = n
            self.epoch[n] = 0
            self.cur[n] = (0, n)
        else:
            p = self._res(step[0])
            self.parent[n] = (p, step[1], step[2])
            r = self.root.get(p, p)
            if p not in self.root:        # parent unknown to the sweep: make it a root
                self.root[p] = p
                self.epoch[p] = 0
                self.cur[p] = (0, p)
            self.root[n] = r
            self.cur[n] = (self.epoch[r], n)

    def mutate(self, m):
        op = m.opdef
        mp = op.schema.mutated_pos
        t = self._res(m.args[mp])
        if t not in self.root:
            self.record(t, None)
        args = list(map_arg(m.args, lambda a: self.value(a, m)))
        tv = args[mp]
        new = self._functional(op, args, mp, tv, m)
        chain = []
        a = t
        while a in self.parent:
            p, name, sargs = self.parent[a]
            if name.startswith("__unsupported__") or name == "as_strided":
                raise NotImplementedError(f"functionalize: mutation of {t.name} through a "
                                          f"{name.replace('__unsupported__', '')} view is not supported")
            chain.append((p, name, sargs))
            a = p
        root = a
        pvals = [self.value(p, m) for p, _, _ in chain]
        updates = [(t, new)]
        nv = new
        for (p, name, sargs), pv in zip(chain, pvals):
            nv = self._emit(OPS["_scatter_view"], (pv, nv, name, tuple(sargs)), m)
            updates.append((p, nv))
        self.epoch[root] += 1
        for node, v in updates:
            self.cur[node] = (self.epoch[root], v)
        self.resolve[m] = t
        self.changed_roots[root] = None

    def _functional(self, op, args, mp, tv, before):
        name = op.name
        sv = OPS["_scatter_view"]
        if mp != 0:
            raise NotImplementedError(f"functionalize: {name} mutates argument {mp}; only self-mutating ops are supported")
        if name == "copy_":
            new = self._emit(sv, (tv, args[1], "getitem", (Ellipsis,)), before)
        elif name == "zero_":
            new = self._emit(sv, (tv, 0, "getitem", (Ellipsis,)), before)
        elif name == "fill_":
            new = self._emit(sv, (tv, args[1], "getitem", (Ellipsis,)), before)
        elif name == "setitem_":
            idx, v = args[1], args[2]
            kind = "getitem" if _is_basic_index(idx) else "index"
            new = self._emit(sv, (tv, v, kind, (idx,)), before)
        else:
            twin = _compatible_twin(op)
            if twin is not None:
                new = self._emit(twin, args, before)
            else:   # no functional twin: mutate a private clone (unobservable)
                c = self._emit(OPS["clone"], (tv,), before)
                new = self._emit(op, [c] + list(args[1:]), before, {"private_inplace": True})
        want = meta_of(tv)
        got = meta_of(new)
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
            if tuple(got.shape) != tuple(want.shape):
                raise RuntimeError(f"functionalize: functional form of {name} changes the shape "
                                   f"{list(want.shape)} -> {list(got.shape)}")
            if got.dtype != want.dtype:
                new = self._emit(OPS["_to_copy"], (new, want.dtype, None, False), before)
        return new

    def finish(self, out):
        self._rewrite_inputs(out)
        for r in self.changed_roots:
            if r.op == "placeholder":
                final = self.cur[r][1]
                w = self._emit(OPS["copy_"], (r, final, False), out, {"writeback": True})
                w.meta["val"] = r.meta.get("val")


def functionalize(gm) -> bool:
    """Rewrite in-place ops and mutation through views into pure ops (module doc, §4.4, Prop. 4.4).
    Measure: the number of in-place nodes other than write-backs (and private-clone fills);
    one sweep brings it to 0.  Returns True if the graph changed."""
    g = gm.graph
    changed = False
    if any(n.op == "call_method" or (n.op == "call_function" and n.opdef is None and n.target is not operator.getitem)
           for n in g.nodes):
        from .canonicalize import canonicalize
        changed = canonicalize(gm)
    muts = [n for n in g.nodes if is_mutation(n) and not is_writeback(n) and not n.meta.get("private_inplace")]
    if not muts:
        return changed
    st = _State(gm)
    for n in list(g.nodes):
        if n.op in ("placeholder", "get_attr"):
            st.record(n, None)
        elif n.op == "output":
            st.finish(n)
        elif is_writeback(n):                 # from an earlier run: reads final values already
            st.record(n, None)
        elif n.meta.get("private_inplace"):     # fills a private clone: a pure value
            st._rewrite_inputs(n)
            st.record(n, None)
        elif is_mutation(n):
            st.mutate(n)
        else:
            step = view_step(n)            # decided on the original arguments
            if step is not None and n.opdef is None:          # getitem of split/chunk/unbind
                step = (st.orig_src.get(n.args[0], step[0]),) + tuple(step[1:])
            d = n.opdef
            if d is not None and d.is_view and d.schema.returns_list and n.args and isinstance(n.args[0], Node):
                st.orig_src[n] = n.args[0]
            st._rewrite_inputs(n)
            st.record(n, step)
    for m in reversed(muts):
        if m.users:
            raise RuntimeError(f"functionalize: in-place node {m.name} still has users {list(m.users)}")
        g.erase_node(m)
    return True
