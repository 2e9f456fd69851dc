"""Symbolic sizes at capture (the chapter, §10.1–§10.2): the shadow run of ``dynamic=True``.

With ``dynamic=True`` the tracer runs every op twice: on the sample values, as always (the capture
run is the first call and returns its values), and on **fake tensors** whose sizes are symbols —
torch's ``FakeTensorMode`` over a ``ShapeEnv``, the engine PyTorch's own compiler uses, so every op
of the table gets its symbolic output shape from its existing meta/eager function and no shape
rule is written twice.  The rules:

* every input size other than 0 and 1 is a fresh symbol whose **hint** is the sample's size
  (§10.2: 0 and 1 change what a program means — broadcasting, empty loops — so they stay
  constants); strides are expressions of the sizes; free tensors (parameters, buffers) and
  constants keep static shapes, as in PyTorch;
* sizes equal in the sample get *different* symbols (``duck_shape=False``); they become one only
  when the program relates them — a broadcast, a matmul, a ``cat`` records ``Eq(s1, s3)`` and the
  shape environment replaces one by the other;
* Python that reads ``x.shape`` gets ``torch.SymInt``s, which behave like ints; a branch on one
  (``if x.shape[0] % 8 == 0``) is decided on the hints and recorded as a **shape guard** in the
  environment (:meth:`SymbolicShapes.guards`), the shape analogue of a data gate;
* the real run gets the hints (:func:`hints_of`): computing the sample never adds a guard.
* which sizes are symbols: all of them with ``dynamic=True``; under the default ``dynamic="auto"``
  only the dims whose size changed since the first capture; always the dims marked with
  ``tp.mark_dynamic`` (capture/declare.py), whose ``min``/``max`` — and with ``dynamic.buckets``
  the sample's power-of-two bucket (Prop. 10.3) — constrain the symbol's range in the
  environment (``env.var_to_range``, :meth:`SymbolicShapes.range_of`), so guards the range
  implies are never recorded (§10.2: a guard is implied by the declared range or becomes a
  runtime check);
* a data-dependent output size (``x[mask]``, ``masked_select``, ``unique``) is, with
  ``dynamic=True``, an **unbacked** symbol (no hint, §10.3): torch's fake kernels make it, the
  graph reads it from the op's output (:meth:`SymbolicShapes.bind_unbacked`), the capture run
  knows its value; a Python branch on it is an error that says to state the fact with
  ``tp.check`` (:meth:`SymbolicShapes.check`, exercise 39);

At the end of capture every node's ``meta["val"]`` is its symbolic fake tensor (``meta["sym"]``),
so a pass or backend that reads a size as a number records a guard instead of baking in the
sample; size arguments are sympy expressions of the input symbols (:meth:`SymbolicShapes.expr`),
and ``Graph.size_symbols`` says where each symbol is read from (input, dim) when the graph runs.
:meth:`SymbolicShapes.inputs` lists every tensor input's fake, for the shape guards.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from ..graph.node import _is_size_expr

__all__ = ["SymbolicShapes", "SymbolSource", "hints_of", "specialize_graph"]

from .fakes import fake_mode_of, is_symbolic, map_leaves, sample_values  # noqa: F401  (re-exported)

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _hint(x, unbacked=None):
    """The sample value of a SymInt/SymFloat/SymBool, without recording a guard; a data-dependent
    size takes its value in the capture run (``unbacked``: symbol -> value)."""
    node = x.node
    h = node.hint
    if h is None:
        e = sympy.sympify(sympy.sympify(node.expr).xreplace(unbacked or {}))
        if e.is_number or e in (sympy.true, sympy.false):
            return bool(e) if isinstance(x, torch.SymBool) else int(e) if isinstance(x, torch.SymInt) else float(e)
        raise RuntimeError(f"size {node.expr} has no sample value (a data-dependent size)")
    return h


def hints_of(x, unbacked=None):
    """``x`` with every symbolic number replaced by its sample value (lists, tuples, slices
    recursively): what the real op of the capture run receives."""
    return map_leaves(x, lambda v: _hint(v, unbacked) if isinstance(v, _SYM_TYPES) else v)


def _on_meta(x, device="meta"):
    """Tensors (fake) of ``x`` moved to the meta device (or ``device``), recursively (inside the
    fake mode)."""
    def leaf(t):
        if isinstance(t, torch.Tensor) and t.device != torch.device(device):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        return t
    return map_leaves(x, leaf)


@dataclasses.dataclass(frozen=True)
class SymbolSource:
    """Where a size symbol is read from when the graph runs: dim ``dim`` of placeholder ``input``
    (``index``: its position among the flat inputs, ``name``: the human name).  A data-dependent
    size (an *unbacked* symbol, §10.3) is read from the output of the node ``input`` that
    computes it: ``index`` is None, ``name`` says which op made it and where (``op``, ``where``).
    ``kind`` "stride": the symbol is the stride of dim ``dim`` of an input that is a strided view
    (a stride no expression of the sizes gives), read with ``.stride(dim)``."""
    input: str
    index: int | None
    dim: int
    name: str
    op: str = ""
    where: str = ""
    kind: str = "size"

    def read(self, var: str) -> str:
        """Python reading this symbol from the tensor called ``var``."""
        return f"{var}.stride({self.dim})" if self.kind == "stride" else f"{var}.shape[{self.dim}]"

    def describe(self) -> str:
        return self.read(self.name)

    def origin(self) -> str:
        """In words, for messages: ``dim 0 of the output of index (x[mask]) at f.py:3``."""
        return f"dim {self.dim} of the output of {self.op} at {self.where}" if self.index is None \
            else f"{self.describe()} (an input {self.kind})"


def bucket_of(n: int) -> tuple:
    """The power-of-two bucket ``(2^(k-1), 2^k]`` of a size ``n >= 2`` as an inclusive range
    ``(2^(k-1) + 1, 2^k)`` (the chapter, Prop. 10.3)."""
    hi = 1 << max(0, (n - 1).bit_length())
    return hi // 2 + 1, hi


class SymbolicShapes:
    """One capture's shape environment and fake-tensor mode (module doc)."""

    def __init__(self, unbacked=True, buckets=False, mode=None):
        """``mode``: an existing FakeTensorMode to share (its ShapeEnv too); else a new one."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        if mode is None:
            mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False, specialize_zero_one=True),
                                  allow_non_fake_inputs=False)
        self.mode, self.env = mode, mode.shape_env
        self.sources: dict[sympy.Symbol, SymbolSource] = {}
        self.inputs: list = []     # (flat leaf index, human name, fake) of every tensor input
        #: data-dependent output sizes become unbacked symbols (dynamic=True); False: the shadow
        #: keeps the sample's size, checked by a shape gate (a symbol made by dynamic="auto")
        self.unbacked = unbacked
        self.buckets = buckets     # dynamic.buckets: each symbol's range is its sample's bucket
        #: symbol -> (lo, hi or None, why): the ranges declared for the input symbols (tp.mark_dynamic,
        #: buckets); the ShapeEnv's var_to_range holds them too (what decides implied guards)
        self.ranges: dict[sympy.Symbol, tuple] = {}
        self.static_why: dict[tuple, str] = {}     # (input index, dim) -> why that dim is no symbol
        self.marked: list = []                     # (input index, name, dim) marked by tp.mark_dynamic
        self.unbacked_values: dict[sympy.Symbol, int] = {}   # unbacked symbol -> its capture-run value
        self.pinned_by_backend: set = set()   # symbols specialize_graph set to their sample value

    def hints_of(self, x):
        """:func:`hints_of` with the data-dependent sizes' capture-run values."""
        return hints_of(x, self.unbacked_values)

    # -- inputs ------------------------------------------------------------------------------------
    def input_fake(self, t: torch.Tensor, placeholder: str, index: int, name: str, dims=None, marks=None):
        """A fake of input ``t`` whose sizes other than 0 and 1 are fresh symbols: every dim
        (``dims`` None: dynamic=True) or those in ``dims`` (dynamic="auto": the dims whose size
        changed), and always the dims of ``marks`` (``{dim: (min, max)}``, tp.mark_dynamic); a
        marked range, and with buckets the sample's bucket, constrains the symbol's range."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
        marks = marks or {}
        for d, (lo, hi) in marks.items():
            n = t.shape[d]
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                raise ValueError(f"tp.mark_dynamic({name}, {d}, min={lo}, max={hi}): {name}.shape[{d}] is {n}, "
                                 f"outside the declared range [{lo}, {hi}]")
        sym = [s not in (0, 1) and (dims is None or d in dims or d in marks) for d, s in enumerate(t.shape)]
        dyn = [DimDynamic.DYNAMIC if y else DimDynamic.STATIC for y in sym]
        ctx = StatelessSymbolicContext(dynamic_sizes=dyn, constraint_sizes=[None] * t.dim())
        fake = self.mode.from_tensor(t, symbolic_context=ctx)
        for d, s in enumerate(fake.shape):
            e = s.node.expr if isinstance(s, torch.SymInt) else None
            if d in marks:
                self.marked.append((index, name, d))
            if not sym[d]:
                self.static_why[(index, d)] = "0 and 1 are specialised" if t.shape[d] in (0, 1) else \
                    "static: its size has not changed between calls (dynamic='auto') and it is not marked dynamic"
            if isinstance(e, sympy.Symbol) and e not in self.sources:
                self.sources[e] = SymbolSource(placeholder, index, d, name)
                self._declare_range(e, t.shape[d], name, d, marks.get(d))
        for d, st in enumerate(fake.stride()):
            # a layout that is no expression of the sizes (a strided view) has fresh stride symbols
            # (torch's fakes give them, range [2, inf): strides 0 and 1 are specialised): each is
            # read from the input's ``.stride(d)`` as sizes are; with static sizes (no dim is a
            # symbol) they are pinned to the sample's strides by a guard, as the key does for
            # static inputs
            e = st.node.expr if isinstance(st, torch.SymInt) else None
            if e is None or set(e.free_symbols) <= set(self.sources):
                continue
            if isinstance(e, sympy.Symbol) and any(sym):
                self.sources[e] = SymbolSource(placeholder, index, d, name, kind="stride")
            else:
                int(st)
        self.inputs.append((index, name, fake))
        return fake

    def _declare_range(self, e, n, name, d, mark):
        """Constrain symbol ``e`` (sample ``n``) to the declared range and/or its bucket."""
        lo, hi, why = 2, None, []
        if mark is not None:
            lo, hi = max(lo, mark[0] if mark[0] is not None else 2), mark[1]
            why.append(f"declared by tp.mark_dynamic({name}, {d}, min={mark[0]}, max={mark[1]})")
        if self.buckets:
            blo, bhi = bucket_of(n)
            lo, hi = max(lo, blo), bhi if hi is None else min(hi, bhi)
            why.append(f"the power-of-two bucket ({bhi // 2}, {bhi}] of dynamic.buckets")
        if lo == 2 and hi is None:
            return
        from torch.utils._sympy.numbers import int_oo
        self.env.constrain_symbol_range(e, lo, int_oo if hi is None else hi)
        self.ranges[e] = (lo, hi, "; ".join(why))

    def range_of(self, e) -> tuple:
        """``(lo, hi)`` of a size expression over its symbols' ranges (``hi`` None: unbounded) — what a
        backend asks to choose index widths; the ranges live in ``env.var_to_range``."""
        vr = self.env.bound_sympy(sympy.sympify(e))
        hi = vr.upper
        return int(vr.lower), (int(hi) if getattr(hi, "is_finite", False) and hi.is_finite else None)

    def static_fake(self, t: torch.Tensor):
        """A fake of a free tensor or constant: its sizes stay integers."""
        return self.mode.from_tensor(t, static_shapes=True)

    # -- ops ---------------------------------------------------------------------------------------
    def run(self, op, args, device="cpu"):
        """The op on fake arguments: symbolic outputs (fake tensors, or a Python value).  Every
        tensor argument is seen on the meta device, so kernels that inspect values on real
        devices (index range checks) take their meta path, as they do for ``run_meta``; an op whose
        output size depends on values runs its kernel on fakes of the real ``device`` instead, where
        torch's fake kernels give that size an unbacked symbol (dynamic=True)."""
        from torch._dispatch.python import enable_python_dispatcher
        from ...ops.registry import DataDependentShapeError
        # (the Python dispatcher: the SymInt-aware meta functions, as torch's own tracing uses)
        with self.mode, enable_python_dispatcher():
            meta = _on_meta(args)
            try:
                return op.meta(*meta) if op.meta is not None else op.eager(*meta)
            except DataDependentShapeError:
                if not self.unbacked:
                    raise
            return op.eager(*_on_meta(args, device))

    def bind_unbacked(self, res, node_names, op_name, where, real):
        """After an op's shadow run: each fresh unbacked symbol that is a dim of an output fake
        (``res``, one or a tuple) gets its source (that output's node, in ``node_names``), and its value
        in the capture run (``real``: the outputs' real tensors or None).  Returns the symbols."""
        from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings
        compute_unbacked_bindings(self.env, res)       # (the ShapeEnv asks that fresh symbols be bound)
        outs = res if isinstance(res, (tuple, list)) else (res,)
        reals = real if isinstance(real, (tuple, list)) else (real,)
        found = []
        for i, (f, nm) in enumerate(zip(outs, node_names)):
            if not isinstance(f, torch.Tensor) or nm is None:
                continue
            for d, s in enumerate(f.shape):
                e = s.node.expr if isinstance(s, torch.SymInt) else None
                if isinstance(e, sympy.Symbol) and e not in self.sources and e.name.startswith("u"):
                    self.sources[e] = SymbolSource(nm, None, d, f"{op_name} output", op_name, where)
                    r = reals[i] if i < len(reals) else None
                    if isinstance(r, torch.Tensor):
                        self.unbacked_values[e] = int(r.shape[d])
                    found.append(e)
        return found

    def unbacked_in(self, gm) -> str:
        """The data-dependent sizes a graph uses, in words ('' if none): ``u0 (dim 0 of the output of
        index at f.py:3: `y = x[x > 0]`)``."""
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
        used = set()
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
                used |= set(free_unbacked_symbols(v))
        return "; ".join(f"{u} ({self.sources[u].origin()})" if u in self.sources else str(u)
                         for u in sorted(used, key=str))

    # -- facts (tp.check) ----------------------------------------------------------------------------
    def check(self, cond, msg, tracer):
        """``tp.check(cond)`` of a symbolic condition (capture/declare.py): an assert on the capture
        run's values, then a fact of the shape environment (``torch._check``: a guard over input
        sizes; over a data-dependent size a refined range), checked on every call by a gate that
        reads the data-dependent size from the op that makes it."""
        from .proxy import CaptureError, where
        e = cond.node.expr
        text = f"tp.check({sympy.sstr(e)})"
        try:
            value = bool(self.hints_of(cond))
        except RuntimeError:
            value = None           # (execute=False: no values to check)
        if value is False:
            raise AssertionError(msg or f"{text} failed at {where()}")
        us = [u for u in e.free_symbols if u in self.sources and self.sources[u].index is None]
        torch._check(cond, (lambda: msg) if msg else None)
        if not us:
            return
        producers = {self.sources[u].input for u in us}
        if len(producers) > 1 or len(e.free_symbols) > len(us):
            raise CaptureError(f"{text} at {where()}: a fact about data-dependent sizes must read the output of one "
                               f"op only (here: {', '.join(sorted(producers))} and input sizes); check each fact "
                               f"separately")
        (name,) = producers
        src = next(n for n in tracer.graph.nodes if n.name == name)
        dims = {u: self.sources[u].dim for u in us}
        tracer.record_gate(None, "check", True, convert=lambda d: bool(e.xreplace({u: d.shape[k] for u, k in dims.items()})),
                           text=text, src=src)

    # -- expressions -------------------------------------------------------------------------------
    def expr(self, x) -> sympy.Expr:
        """A SymInt (or an int) as a sympy expression of the input symbols, with the
        environment's replacements applied (``s3`` is ``s1`` after a broadcast related them)."""
        if isinstance(x, _SYM_TYPES):
            return self.env.replace(x.node.expr)
        return sympy.sympify(x)

    def args_to_exprs(self, x):
        """Node arguments with every symbolic number as its expression (recursively)."""
        def leaf(v):
            if not isinstance(v, _SYM_TYPES):
                return v
            e = self.expr(v)
            return int(e) if e.is_Integer else e
        return map_leaves(x, leaf)

    def hint(self, e) -> int:
        """The value of an expression of the input symbols at their hints."""
        v = sympy.sympify(e).xreplace({**dict(sample_values(self.env)), **self.unbacked_values})
        if not v.is_Integer:
            raise RuntimeError(f"size {e} has no sample value (a data-dependent size)")
        return int(v)

    def implied(self, cond) -> bool:
        """Is a condition true for every size in the declared ranges (>= 2 for a symbol with
        none)?  Only the declarations count: the environment's own ranges are refined by the
        guards themselves, so they would imply every guard."""
        from torch.utils._sympy.numbers import int_oo
        from torch.utils._sympy.value_ranges import ValueRanges
        vr = tuple((e, ValueRanges(self.ranges[e][0], int_oo if self.ranges[e][1] is None else self.ranges[e][1])
                    if e in self.ranges else ValueRanges(2, int_oo)) for e, src in self.sources.items()
                   if src.index is not None)
        v = self.env._maybe_evaluate_static(cond, axioms=(), var_to_range=vr)
        return v is not None and bool(v == sympy.true)

    # -- what the capture assumed --------------------------------------------------------------------
    def guards(self) -> list:
        """The shape guards recorded while capturing: ``(condition, where)``, in order; the
        condition holds at the hints."""
        out = []
        for g in self.env.guards:
            loc = g.sloc.maybe_user_loc or g.sloc.framework_loc
            where = f"{loc.filename}:{loc.lineno}" if hasattr(loc, "filename") else str(loc)
            out.append((self.env.replace(g.expr), where))
        return out


def specialize_graph(gm, symbolic, values=None):
    """A static copy of a symbolic graph, for a backend that needs static sizes (Stax's kernels
    take no size arguments yet).  Every size and stride of every input is guarded to its sample
    value (the guards enter the key: the artifact is valid for exactly those sizes), size
    arguments become ints and metadata concrete meta tensors — the graph a static capture gives.
    ``values`` (``{symbol: int}``): symbols set to these values *without* a guard — the bucket
    padding of specialize/padding.py, whose artifact runs at the bucket's top size."""
    from ..graph import GraphModule
    values = {s: sympy.Integer(v) for s, v in (values or {}).items()}
    symbolic.pinned_by_backend = {s for s in symbolic.sources if not symbolic.expr(s).is_Integer} - set(values)
    for _, _, fake in symbolic.inputs:
        # int() of each size and stride records the guard that it equals the sample's
        for x in list(fake.shape) + list(fake.stride()):
            if isinstance(x, torch.SymInt) and not (symbolic.expr(x).free_symbols & set(values)):
                int(x)
    vals = {s: sympy.Integer(symbolic.hint(s)) for s, src in symbolic.sources.items() if src.index is not None}
    vals.update(values)
    g, _ = gm.graph.copy()

    def num(x):
        e = symbolic.expr(x) if isinstance(x, torch.SymInt) else sympy.sympify(x)
        v = e.xreplace(vals)
        return int(v) if v.is_Integer else x

    def arg(x):
        return num(x) if isinstance(x, torch.SymInt) or _is_size_expr(x) else x

    def concrete(v):
        if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
            return torch.empty_strided([num(s) for s in v.shape], [num(s) for s in v.stride()], dtype=v.dtype,
                                       device="meta")
        return v
    for n in g.nodes:
        n.args = map_leaves(n.args, arg)
        n.kwargs = {k: map_leaves(v, arg) for k, v in n.kwargs.items()}
        if "val" in n.meta:
            n.meta = {**n.meta, "val": map_leaves(n.meta["val"], concrete)}
            n.meta.pop("sym", None)
    g.size_symbols = {}
    return GraphModule(g, dict(gm.attrs), name=gm._name)
