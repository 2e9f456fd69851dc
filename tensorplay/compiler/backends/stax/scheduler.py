"""The scheduler: buffers -> fused kernels (chapter §7).

Every realized buffer is a scheduler node; it starts as a group of its own.  A group has an
iteration space ``(outer, inner)``: a pointwise group of shape S may be split anywhere; a group
containing a reduction over the trailing ``inner`` dims has a fixed split (rows x reduced
elements).  Nodes are placed in a group as

* ``inner``  — pointwise over outer+inner (one value per element),
* ``reduce`` — a reduction: one value per row, accumulated over the inner loop,
* ``outer``  — pointwise over the rows only (e.g. ``mean = sum / n``), computed after the row's
  reductions.

Greedy fusion (Alg. 7.1): repeatedly take the legal pair (``choices.can_fuse``) with the best
``choices.score_fusion`` and merge it, until no legal pair is left.  This yields the fusions the
chapter asks for: pointwise->pointwise, pointwise->reduction (example 1.1), reduction->broadcast
pointwise over the same rows (example 7.1: ``x / x.sum(-1, keepdim=True)`` in one pass per row),
and horizontal fusion of reductions of one input (example 7.2).

A buffer whose every reader ended up in its own group, and that is not a graph output, is never
written to memory: it lives in registers (reductions, row values) or in a per-row scratch array
(the row stays in cache) — this is where the bytes of the model (§1.1) are saved.
"""
from __future__ import annotations

import sympy

from . import choices
from .ir import ComputedBuffer, ExternBuffer, InputBuffer, Reduction, ReinterpretView
from .ops_handler import OPS_NAMES, set_handler
from .sizevars import size_hint

__all__ = ["Scheduler", "Group", "SchedNode"]


def _sq(shape):
    return tuple(s for s in shape if s != 1)


class _Recorder:
    """Records every load (buffer, index) a compute function makes."""

    def __init__(self):
        self.loads = []

    def __getattr__(self, name):
        if name not in OPS_NAMES:
            raise AttributeError(name)

        def f(*args, **kw):
            if name == "load":
                self.loads.append((args[0], sympy.expand(args[1])))
            if name == "masked":
                return args[1]()
            return 0
        return f


class SchedNode:
    def __init__(self, buf, order):
        self.buf = buf
        self.name = buf.name
        self.order = order
        self.is_extern = isinstance(buf, ExternBuffer)
        self.is_reduction = isinstance(buf, ComputedBuffer) and isinstance(buf.data, Reduction)
        self.reads: set = set()
        if self.is_extern:
            for a in _flat(buf.args):
                if isinstance(a, (ComputedBuffer, ExternBuffer, InputBuffer)):
                    self.reads.add(a.name)
                elif isinstance(a, ReinterpretView):
                    self.reads.add(a.data.name)
        else:
            rec = self.record(self.placeholder_index())
            self.reads = {n for n, _ in rec}

    @property
    def ranges(self):
        return self.buf.data.ranges

    @property
    def rranges(self):
        return self.buf.data.reduction_ranges if self.is_reduction else ()

    def placeholder_index(self):
        idx = [sympy.Symbol(f"i{k}", integer=True) for k in range(len(self.ranges))]
        ridx = [sympy.Symbol(f"j{k}", integer=True) for k in range(len(self.rranges))]
        return idx, ridx

    def record(self, index):
        idx, ridx = index
        rec = _Recorder()
        with set_handler(rec):
            if self.is_reduction:
                self.buf.data.inner_fn(idx, ridx)
            else:
                self.buf.data.inner_fn(idx)
        return rec.loads

    def __repr__(self):
        return f"SchedNode({self.name})"


def _reader_index(items) -> dict:
    """buffer name -> the items (nodes or groups, each with ``reads``) that read it, in order."""
    idx = {}
    for it in items:
        for name in it.reads:
            idx.setdefault(name, []).append(it)
    return idx


def _flat(a):
    if isinstance(a, (list, tuple)):
        for x in a:
            yield from _flat(x)
    elif isinstance(a, slice):
        yield from _flat([a.start, a.stop, a.step])
    else:
        yield a


class Group:
    def __init__(self, node: SchedNode):
        self.nodes = [node]
        self.is_extern = node.is_extern
        self.order = node.order
        self.reads = set(node.reads)
        self.writes = {node.name}
        #: extern nodes whose results this group's kernel computes instead (a device backend's
        #: prepare_schedule: a matmul template with a fused prologue, triton/template_prologue.py);
        #: the wrapper allocates their buffers for the kernel
        self.absorbed: list = []
        if node.is_extern:
            self.sig = None
        elif node.is_reduction:
            self.sig = (_sq(node.ranges), _sq(node.rranges))
        else:
            self.sig = ("pw", _sq(node.ranges))

    @staticmethod
    def placement(node, sig):
        """Where a node sits in a group with iteration space ``sig`` (see module doc), or None."""
        outer, inner = sig
        if node.is_reduction:
            return "reduce"
        s = _sq(node.ranges)
        if s == outer + inner:
            return "inner"
        if s == outer:
            return "outer"
        return None

    def __repr__(self):
        return f"Group({[n.name for n in self.nodes]}, {self.sig})"


def _same_index(a, b) -> bool:
    """Are two index expressions equal?  Expanded first (affine indices: exact and cheap), simplified
    only when that leaves a difference (floor / Mod forms)."""
    d = sympy.expand(a - b)
    return d == 0 or sympy.simplify(d) == 0


class Scheduler:
    def __init__(self, graph):
        self.graph = graph
        self.nodes = [SchedNode(b, i) for i, b in enumerate(graph.buffers)]
        self.by_name = {n.name: n for n in self.nodes}
        self.output_names = {o.name if not isinstance(o, ReinterpretView) else o.data.name for o in graph.outputs}
        # values written back into mutated inputs are read by the wrapper: they must reach memory
        self.output_names |= {src.name for _, src in graph.mutations}
        # calls into eager's generator keep the graph's order (the numbers eager gives after the
        # same manual_seed, TP_STAX_FALLBACK_RANDOM=1): each random extern reads the one before
        prev = None
        for n in self.nodes:
            if n.is_extern and "random" in getattr(n.buf.op, "tags", ()):
                if prev is not None:
                    n.reads.add(prev.name)
                prev = n
        self.groups = [Group(n) for n in self.nodes]
        self.group_of = {n.name: g for g in self.groups for n in g.nodes}
        # bytes at the size hints: what the fusion and ordering heuristics weigh (sizevars.py)
        self._bytes = {b.name: size_hint(b.layout.numel) * b.layout.dtype.itemsize
                       for b in list(graph.buffers) + list(graph.inputs)}

    def buffer_bytes(self, name) -> int:
        """Bytes of buffer ``name`` at the size hints (0 for a constant)."""
        return self._bytes.get(name, 0)

    # -- relations ------------------------------------------------------------------------------
    def node_readers(self, name) -> list:
        """The scheduler nodes that read buffer ``name``, in program order (an index built once: the
        nodes' reads do not change while fusing)."""
        idx = self.__dict__.get("_node_readers")
        if idx is None:
            idx = self._node_readers = _reader_index(self.nodes)
        return idx.get(name, [])

    def depends(self, g_later, g_earlier) -> bool:
        """Does g_later read something g_earlier writes?"""
        return bool(g_later.reads & g_earlier.writes)

    def _succ(self, g):
        """The groups that read what ``g`` writes (from the readers' index; cached until the groups
        change: ``_merge``)."""
        cache = self.__dict__.get("_succ_cache")
        if cache is None:
            cache = self._succ_cache = {}
        out = cache.get(id(g))
        if out is None:
            readers = self._readers_index()
            seen, out = {id(g)}, []
            for name in g.writes:
                for h in readers.get(name, ()):
                    if id(h) not in seen:
                        seen.add(id(h))
                        out.append(h)
            out.sort(key=lambda h: h.order)
            cache[id(g)] = out
        return out

    def _readers_index(self):
        """buffer name -> the groups that read it (kept up to date by ``_merge``)."""
        idx = self.__dict__.get("_readers")
        if idx is None:
            idx = self._readers = _reader_index(self.groups)
        return idx

    def path_through_other(self, a, b) -> bool:
        """Is there a path a -> x -> ... -> b with x not in {a, b}?  While ``fuse`` keeps a
        topological rank of the groups (``_rank``), the search visits only groups ranked before
        ``b`` (a group on a path to ``b`` is)."""
        rank = self.__dict__.get("_rank")
        if rank is not None:
            rb = rank[id(b)]
            if rank[id(a)] > rb:
                return False
        stack = [h for h in self._succ(a) if h is not b and (rank is None or rank[id(h)] < rb)]
        seen = set(map(id, stack))
        while stack:
            h = stack.pop()
            if b.reads & h.writes:
                return True
            for k in self._succ(h):
                if k is not b and id(k) not in seen and (rank is None or rank[id(k)] < rb):
                    seen.add(id(k))
                    stack.append(k)
        return False

    def _rerank(self, a, b, topo):
        """Before ``_merge(a, b)`` (legal: no path between them through a third group): keep the
        topological list ``topo`` (None in the slots of merged groups) and ``_rank`` valid for the
        merged group ``a``.  Of the groups ranked between the two, the descendants of the earlier
        one move after the merged group, the others stay before it, each part in its order."""
        rank = self._rank
        first, lo, hi = (a, rank[id(a)], rank[id(b)]) if rank[id(a)] < rank[id(b)] else (b, rank[id(b)], rank[id(a)])
        below = set()
        stack = [first]
        while stack:
            for k in self._succ(stack.pop()):
                if id(k) not in below and lo < rank[id(k)] < hi:
                    below.add(id(k))
                    stack.append(k)
        seg = [g for g in topo[lo + 1:hi] if g is not None]
        new = [None] * (hi - lo + 1 - len(seg) - 1) + [g for g in seg if id(g) not in below] + [a] + \
            [g for g in seg if id(g) in below]
        topo[lo:hi + 1] = new
        for i, g in enumerate(new, lo):
            if g is not None:
                rank[id(g)] = i
        rank.pop(id(b), None)

    def merged_signature(self, g1, g2):
        s1, s2 = g1.sig, g2.sig
        if s1 is None or s2 is None:
            return None
        if s1[0] == "pw" and s2[0] == "pw":
            if s1[1] != s2[1]:
                return None
            shape = s1[1]
            return (shape[:-1], shape[-1:]) if shape else ((), ())
        if s1[0] == "pw":
            s1, s2 = s2, s1
        if s2[0] == "pw":
            outer, inner = s1
            if s2[1] in (outer + inner, outer):
                return s1
            return None
        return s1 if s1 == s2 else None

    def dependencies_aligned(self, g1, g2, sig) -> bool:
        """Prop. 7.2: for every read of a buffer produced inside the merged group, the reader's
        index must be the producer's store index (same element), or a row value read by row."""
        key = (tuple(n.name for n in g1.nodes), tuple(n.name for n in g2.nodes), sig)
        memo = self.__dict__.setdefault("_aligned_memo", {})     # (a pure function of the two groups)
        if key not in memo:
            memo[key] = self._dependencies_aligned(g1, g2, sig)
        return memo[key]

    def _dependencies_aligned(self, g1, g2, sig) -> bool:
        nodes = g1.nodes + g2.nodes
        names = {n.name for n in nodes}
        if any(Group.placement(n, sig) is None for n in nodes):
            return False
        for n in nodes:
            pl = Group.placement(n, sig)
            for bname, expr in self._loads_at(n, sig):
                if bname not in names:
                    continue
                prod = self.by_name[bname]
                ppl = Group.placement(prod, sig)
                pexpr = self._store_at(prod, sig)
                if ppl == "inner":
                    if pl not in ("inner", "reduce") or not self._same(expr, pexpr):
                        return False
                else:  # producer is a row value (reduce/outer): reader must read it by row
                    if any(str(s).startswith("r") for s in expr.free_symbols):
                        return False
                    if not self._same(expr, pexpr):
                        return False
        return True

    def _loads_at(self, n, sig):
        """The loads (buffer, index) node ``n`` makes when placed in a group of iteration space
        ``sig`` -- a pure function of the two, kept: a node is checked again at every merge of
        its group, so without the memo a group of k nodes costs k^2 recordings."""
        memo = self.__dict__.setdefault("_loads_memo", {})
        key = (n.name, sig)
        if key not in memo:
            memo[key] = n.record(kernel_index(n, Group.placement(n, sig), sig))
        return memo[key]

    def _store_at(self, n, sig):
        """``store_index`` of node ``n`` in a group of iteration space ``sig`` (kept, as ``_loads_at``)."""
        memo = self.__dict__.setdefault("_store_memo", {})
        key = (n.name, sig)
        if key not in memo:
            memo[key] = store_index(n, Group.placement(n, sig), sig)
        return memo[key]

    def _same(self, a, b) -> bool:
        """``_same_index(a, b)``, kept per pair of expressions."""
        memo = self.__dict__.setdefault("_same_memo", {})
        key = (a, b)
        if key not in memo:
            memo[key] = _same_index(a, b)
        return memo[key]

    # -- the greedy loop (Alg. 7.1) -------------------------------------------------------------
    def fuse(self):
        """Alg. 7.1: merge the legal pair of best ``choices.score_fusion`` until none is left.

        Incremental, with the exhaustive loop's result (``fuse_exhaustive``, which the tests compare
        it with): the candidates are the pairs that share a buffer (found through the readers'
        index, not by testing every pair), kept in a heap by (score, the pair's place in program
        order) -- a pair's score depends on its two groups only, so a merge re-scores only the pairs
        of the merged group -- and each popped pair is checked by ``choices.can_fuse`` then.  A
        pair found illegal stays illegal while its groups are unchanged (merging two *other* groups
        only adds paths between groups, Prop. 7.1's obstacle), so it is dropped; a legal pair is the
        best legal one, as in the exhaustive loop."""
        import heapq
        gen = {id(g): 0 for g in self.groups}
        alive = {id(g): g for g in self.groups}
        heap = []

        def push_pairs(g):
            if g.is_extern:               # an extern kernel fuses with nothing (can_fuse); many share
                return                    # a weight, and their pairs would fill the heap quadratically
            readers = self._readers_index()
            writer = self._writer_index()
            others = {}
            for name in g.writes:
                for h in readers.get(name, ()):
                    others[id(h)] = h
            for name in g.reads:
                w = writer.get(name)
                if w is not None:
                    others[id(w)] = w
                for h in readers.get(name, ()):
                    others[id(h)] = h
            others.pop(id(g), None)
            for h in others.values():
                if h.is_extern:
                    continue
                a, b = (g, h) if g.order < h.order else (h, g)
                shared, neg_dist = choices.score_fusion(self, a, b)
                heapq.heappush(heap, (-shared, -neg_dist, a.order, b.order, gen[id(a)], gen[id(b)], id(a), id(b)))

        topo = list(self.groups)       # program order: topological
        self._rank = {id(g): i for i, g in enumerate(topo)}
        for g in list(self.groups):
            push_pairs(g)
        while heap:
            _, _, _, _, ga, gb, ia, ib = heapq.heappop(heap)
            a, b = alive.get(ia), alive.get(ib)
            if a is None or b is None or gen[ia] != ga or gen[ib] != gb:
                continue                  # a pair of a group that has changed since: re-pushed
            if not choices.can_fuse(self, a, b):
                continue
            self._rerank(a, b, topo)
            self._merge(a, b, reorder=False)
            del alive[ib]
            gen[ia] += 1
            push_pairs(a)
        self._rank = None
        self.groups = [g for g in self.groups if id(g) in alive]
        self._order_groups()
        return self._fused()

    def fuse_exhaustive(self):
        """Alg. 7.1 as the chapter states it: every round scans every pair of groups (the reference
        ``fuse`` is tested against; quadratic per round)."""
        while True:
            best = None
            for i, g1 in enumerate(self.groups):
                for g2 in self.groups[i + 1:]:
                    if not (g1.reads & g2.writes or g2.reads & g1.writes or g1.reads & g2.reads):
                        continue
                    if not choices.can_fuse(self, g1, g2):
                        continue
                    sc = choices.score_fusion(self, g1, g2)
                    if best is None or sc > best[0]:
                        best = (sc, g1, g2)
            if best is None:
                break
            _, g1, g2 = best
            self._merge(g1, g2)
        return self._fused()

    def _fused(self):
        """After fusion: the program order kept, the kernels put in memory order (§7.5), the
        indexes dropped (a backend's prepare_schedule may still change the groups)."""
        self.program_order = list(self.groups)
        self.groups = self.memory_order()
        self._succ_cache = self._readers = self._writer = None
        return self

    def _writer_index(self):
        """buffer name -> the group that writes it (kept up to date by ``_merge``)."""
        idx = self.__dict__.get("_writer")
        if idx is None:
            idx = self._writer = {name: h for h in self.groups for name in h.writes}
        return idx

    def _merge(self, g1, g2, reorder=True):
        """Merge ``g2`` into ``g1``, keeping the readers', writers' and successors' indexes; with
        ``reorder`` also drop ``g2`` from ``groups`` and keep their topological order.  Without it
        the caller drops the merged groups (``fuse`` filters and orders once, at the end: a list
        removal and an order per merge made the greedy loop quadratic)."""
        readers, writer = self._readers_index(), self._writer_index()
        succ = self.__dict__.get("_succ_cache")
        if succ is not None:    # the successor lists that name g2 (its inputs' writers), and g1's, change
            for name in g1.reads | g2.reads:
                w = writer.get(name)
                if w is not None:
                    succ.pop(id(w), None)
            succ.pop(id(g1), None)
            succ.pop(id(g2), None)
        for name in g2.reads:
            lst = readers.get(name, [])
            lst[:] = [h for h in lst if h is not g2]
            if not any(h is g1 for h in lst):
                lst.append(g1)
        for name in g2.writes:
            writer[name] = g1
        sig = self.merged_signature(g1, g2)
        g1.nodes = sorted(g1.nodes + g2.nodes, key=lambda n: n.order)
        g1.reads |= g2.reads
        g1.writes |= g2.writes
        g1.order = min(g1.order, g2.order)
        # two pointwise groups keep their flexible ("pw", shape) signature; anything with a
        # reduction takes the fixed (rows, reduced elements) split
        if g1.sig[0] != "pw" or g2.sig[0] != "pw":
            g1.sig = sig
        for n in g2.nodes:
            self.group_of[n.name] = g1
        if reorder:
            self.groups.remove(g2)
            self._order_groups()

    def _order_groups(self):
        """Topological order of groups (a group runs after every group it reads from); among the
        groups whose inputs are ready, the smallest ``order`` first (Kahn's algorithm on a heap)."""
        import heapq
        writer = self._writer_index()
        preds = {id(g): {id(writer[n]) for n in g.reads if n in writer and writer[n] is not g} for g in self.groups}
        succs = {id(g): [] for g in self.groups}
        for g in self.groups:
            for p in preds[id(g)]:
                succs[p].append(g)
        left = {k: len(v) for k, v in preds.items()}
        ready = [(g.order, id(g), g) for g in self.groups if left[id(g)] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, _, g = heapq.heappop(ready)
            order.append(g)
            for h in succs[id(g)]:
                left[id(h)] -= 1
                if left[id(h)] == 0:
                    heapq.heappush(ready, (h.order, id(h), h))
        if len(order) != len(self.groups):
            raise RuntimeError("scheduler: cycle between fused groups (Prop. 7.1 violated)")
        self.groups = order

    # -- kernel order (§7.5) ------------------------------------------------------------------------
    def _live_model(self):
        """(bytes each group allocates, readers of each materialised intermediate)."""
        readers = _reader_index(self.groups)
        alloc = {}
        for g in self.groups:
            local = self._local_given(g, readers)
            alloc[id(g)] = sum(self.buffer_bytes(n) for n in g.writes if n not in local)
        return alloc, readers

    def peak_bytes(self, order=None) -> int:
        """Peak of live intermediate bytes when the groups run in ``order`` (default: the
        schedule): a buffer is live from its writer to its last reader; outputs stay live."""
        order = self.groups if order is None else order
        alloc, readers = self._live_model()
        pos = {id(g): i for i, g in enumerate(order)}
        frees = {}
        for g in order:
            for n in g.writes:
                rs = readers.get(n, [])
                if n in self.output_names or not rs or alloc[id(g)] == 0:
                    continue
                frees.setdefault(max(pos[id(r)] for r in rs), []).append(self.buffer_bytes(n))
        live = peak = 0
        for i, g in enumerate(order):
            live += alloc[id(g)]
            peak = max(peak, live)
            live -= sum(frees.get(i, ()))
        return peak

    def memory_order(self):
        """A topological order of the groups that keeps live memory low: among the groups whose
        inputs are ready, run the one with the smallest (bytes it allocates - bytes it frees),
        ties broken by program order.  A greedy list schedule — optimal orders are NP-hard in
        general; the greedy one never does worse than program order on chains, and runs a
        consumer as soon as it frees a large producer (two independent matmul branches: the first
        branch's reduction runs before the second matmul).

        The ready groups sit in a heap by (net, order).  A group's freed bytes only grow while it
        waits (a buffer is freed by its last reader: when all its other readers have run), so a
        group whose net drops is pushed again and its older, larger entry is skipped when popped."""
        import heapq
        alloc, readers = self._live_model()
        writer = {n: g for g in self.groups for n in g.writes}
        remaining = {n: len(rs) for n, rs in readers.items()}
        freed = {id(g): 0 for g in self.groups}
        for n, rs in readers.items():
            if n in writer and len(rs) == 1 and n not in self.output_names:
                freed[id(rs[0])] += self.buffer_bytes(n)
        succs = {id(g): [] for g in self.groups}
        left = {}
        for g in self.groups:
            preds = {id(writer[n]) for n in g.reads if n in writer and writer[n] is not g}
            left[id(g)] = len(preds)
            for p in preds:
                succs[p].append(g)
        heap = [(alloc[id(g)] - freed[id(g)], g.order, id(g), g) for g in self.groups if left[id(g)] == 0]
        heapq.heapify(heap)
        done, order = set(), []
        while heap:
            net, _, _, g = heapq.heappop(heap)
            if id(g) in done or net != alloc[id(g)] - freed[id(g)]:
                continue                  # an entry from before the group's net dropped
            order.append(g)
            done.add(id(g))
            for n in g.reads:
                if n not in remaining:
                    continue
                remaining[n] -= 1
                if remaining[n] == 1 and n in writer and n not in self.output_names:
                    last = next(r for r in readers[n] if id(r) not in done)
                    freed[id(last)] += self.buffer_bytes(n)
                    if left[id(last)] == 0:
                        heapq.heappush(heap, (alloc[id(last)] - freed[id(last)], last.order, id(last), last))
            for h in succs[id(g)]:
                left[id(h)] -= 1
                if left[id(h)] == 0:
                    heapq.heappush(heap, (alloc[id(h)] - freed[id(h)], h.order, id(h), h))
        if len(order) != len(self.groups):
            raise RuntimeError("scheduler: cycle between fused groups (Prop. 7.1 violated)")
        return order

    def kernel_sig(self, g):
        """The final (outer, inner) split of a group's iteration space."""
        if g.sig[0] == "pw":
            shape = g.sig[1]
            return (shape[:-1], shape[-1:]) if shape else ((), ())
        return g.sig

    def local_buffers(self, g):
        """Buffers produced in g that nobody outside g reads and that are not outputs."""
        return self._local_given(g, _reader_index(h for h in self.groups if h is not g))

    def _local_given(self, g, readers):
        """``local_buffers(g)`` from ``readers`` (buffer name -> the groups that read it; g may be
        among them)."""
        return {n.name for n in g.nodes if n.name not in self.output_names
                and all(r is g for r in readers.get(n.name, ()))}

def kernel_vars(sig):
    outer, inner = sig
    xs = [sympy.Symbol(f"x{k}", integer=True, nonnegative=True) for k in range(len(outer))]
    rs = [sympy.Symbol(f"r{k}", integer=True, nonnegative=True) for k in range(len(inner))]
    return xs, rs


def _spread(shape, vals):
    """Index for ``shape`` (which may contain size-1 dims) from values of its non-1 dims."""
    it = iter(vals)
    return [sympy.Integer(0) if s == 1 else next(it) for s in shape]


def kernel_index(node, placement, sig):
    xs, rs = kernel_vars(sig)
    if placement == "reduce":
        return _spread(node.ranges, xs), _spread(node.rranges, rs)
    if placement == "inner":
        return _spread(node.ranges, xs + rs), []
    return _spread(node.ranges, xs), []


def store_index(node, placement, sig):
    idx, _ = kernel_index(node, placement, sig)
    return sympy.expand(node.buf.layout.index(idx))

