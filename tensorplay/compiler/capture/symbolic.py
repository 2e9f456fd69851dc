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

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _map_leaves(x, f):
    """``x`` with ``f`` applied to every leaf inside lists, tuples (named ones too) and slices —
    the shapes op arguments and metadata come in."""
    if isinstance(x, list):
        return [_map_leaves(v, f) for v in x]
    if isinstance(x, tuple):
        vals = [_map_leaves(v, f) for v in x]
        if hasattr(x, "_fields"):
            return type(x)(*vals)
        return tuple(vals) if isinstance(x, torch.Size) else type(x)(vals)   # (a Size holds no expression)
    if isinstance(x, slice):
        return slice(_map_leaves(x.start, f), _map_leaves(x.stop, f), _map_leaves(x.step, f))
    return f(x)


def _hint(x):
    """The sample value of a SymInt/SymFloat/SymBool, without recording a guard."""
    node = x.node
    h = node.hint
    if h is None:
        raise RuntimeError(f"size {node.expr} has no sample value (a data-dependent size)")
    return h


def hints_of(x):
    """``x`` with every symbolic number replaced by its sample value (lists, tuples, slices
    recursively): what the real op of the capture run receives."""
    return _map_leaves(x, lambda v: _hint(v) if isinstance(v, _SYM_TYPES) else v)


def _on_meta(x):
    """Tensors (fake) of ``x`` moved to the meta device, recursively (inside the fake mode)."""
    def leaf(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return t
    return _map_leaves(x, leaf)


@dataclasses.dataclass(frozen=True)
class SymbolSource:
    """Where a size symbol is read from when the graph runs: dim ``dim`` of placeholder ``input``
    (``index``: its position among the flat inputs, ``name``: the human name)."""
    input: str
    index: int
    dim: int
    name: str

    def describe(self) -> str:
        return f"{self.name}.shape[{self.dim}]"


class SymbolicShapes:
    """One capture's shape environment and fake-tensor mode (module doc)."""

    def __init__(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.env = ShapeEnv(duck_shape=False, specialize_zero_one=True)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=False)
        self.sources: dict[sympy.Symbol, SymbolSource] = {}
        self.inputs: list = []     # (flat leaf index, human name, fake) of every tensor input

    hints_of = staticmethod(hints_of)

    # -- inputs ------------------------------------------------------------------------------------
    def input_fake(self, t: torch.Tensor, placeholder: str, index: int, name: str):
        """A fake of input ``t`` whose sizes other than 0 and 1 are fresh symbols."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
        dyn = [DimDynamic.STATIC if s in (0, 1) else DimDynamic.DYNAMIC for s in t.shape]
        ctx = StatelessSymbolicContext(dynamic_sizes=dyn, constraint_sizes=[None] * t.dim())
        fake = self.mode.from_tensor(t, symbolic_context=ctx)
        for d, s in enumerate(fake.shape):
            e = s.node.expr if isinstance(s, torch.SymInt) else None
            if isinstance(e, sympy.Symbol) and e not in self.sources:
                self.sources[e] = SymbolSource(placeholder, index, d, name)
        self.inputs.append((index, name, fake))
        return fake

    def static_fake(self, t: torch.Tensor):
        """A fake of a free tensor or constant: its sizes stay integers."""
        return self.mode.from_tensor(t, static_shapes=True)

    # -- ops ---------------------------------------------------------------------------------------
    def run(self, op, args):
        """The op on fake arguments: symbolic outputs (fake tensors, or a Python value).  Every
        tensor argument is seen on the meta device, so kernels that inspect values on real
        devices (index range checks) take their meta path, as they do for ``run_meta``."""
        from torch._dispatch.python import enable_python_dispatcher
        # (the Python dispatcher: the SymInt-aware meta functions, as torch's own tracing uses)
        with self.mode, enable_python_dispatcher():
            args = _on_meta(args)
            if op.meta is not None:
                return op.meta(*args)
            return op.eager(*args)

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
        return _map_leaves(x, leaf)

    def hint(self, e) -> int:
        """The value of an expression of the input symbols at their hints."""
        env = self.env
        vals = getattr(env, "backed_var_to_val", None)
        vals = env.var_to_val if vals is None else vals
        v = sympy.sympify(e).xreplace(dict(vals))
        if not v.is_Integer:
            raise RuntimeError(f"size {e} has no sample value (a data-dependent size)")
        return int(v)

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


def specialize_graph(gm, symbolic):
    """A static copy of a symbolic graph, for a backend that needs static sizes (Stax's kernels
    take no size arguments yet).  Every size and stride of every input is guarded to its sample
    value (the guards enter the key: the artifact is valid for exactly those sizes), size
    arguments become ints and metadata concrete meta tensors — the graph a static capture gives."""
    from ..graph import GraphModule
    g, _ = gm.graph.copy()
    vals = {s: sympy.Integer(symbolic.hint(s)) for s in symbolic.sources}

    def arg(x):
        if isinstance(x, torch.SymInt):
            return int(x)
        if _is_size_expr(x):
            v = sympy.sympify(x).xreplace(vals)
            return int(v) if v.is_Integer else x
        return x

    def concrete(v):
        # int() of each size and stride records the guard that it equals the sample's: the
        # placeholders come first, so every input size and stride is guarded
        if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is not None:
            return torch.empty_strided([int(s) for s in v.shape], [int(s) for s in v.stride()], dtype=v.dtype,
                                       device="meta")
        return v
    for n in g.nodes:
        n.args = _map_leaves(n.args, arg)
        n.kwargs = {k: _map_leaves(v, arg) for k, v in n.kwargs.items()}
        if "val" in n.meta:
            n.meta = {**n.meta, "val": _map_leaves(n.meta["val"], concrete)}
            n.meta.pop("sym", None)
    g.size_symbols = {}
    return GraphModule(g, dict(gm.attrs), name=gm._name)
