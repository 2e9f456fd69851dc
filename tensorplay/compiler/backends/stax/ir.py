"""Loop-level IR (chapter §6): values are functions from an index to a value.

* :class:`Pointwise` — ``inner_fn(index) -> value`` over ``ranges`` (the output shape).
* :class:`Reduction` — ``inner_fn(index, rindex) -> value`` reduced over ``reduction_ranges`` with a
  monoid (``sum``, ``prod``, ``max``, ``min``, ``any``, ``all``, ``argmax``, ``argmin``,
  ``welford``); the reduction is associative, so the kernel may split it into several vector
  accumulators (invariant 6).  ``argmax``/``argmin`` accumulate (value, index) pairs and
  ``welford`` (mean, m2, count) triples: such a reduction has several results, and one Reduction
  node is one of them (``output``); :func:`Reduction.multi` makes the sibling nodes of one
  accumulator (same ``inner_fn``), which the kernel generator computes once when they share a kernel.
* Buffers — memory: :class:`InputBuffer` (graph inputs and constants), :class:`ComputedBuffer`
  (a Pointwise/Reduction written to memory — *materialised*), :class:`ExternBuffer` (result of an
  ATen call: matmul, conv, sort, ... or of a *fallback* eager call for ops with no lowering).
* :class:`ReinterpretView` — a buffer seen through another (size, stride, offset): every strided
  view of a realized value costs nothing.
* :class:`TensorBox` — what a graph value is during lowering: a mutable handle whose ``data`` is one
  of the above; ``realize()`` materialises an unrealized function.

Composition is function composition: a Pointwise that reads another unrealized Pointwise simply
calls its loader, so elementwise fusion happens while lowering (Property 6.1).  Whether a value is
written to memory is decided by the cost model in choices.py (§6.6), not here.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy
import torch

from . import sizevars
from .ops_handler import ops

__all__ = ["FixedLayout", "Loops", "Pointwise", "Reduction", "Buffer", "InputBuffer", "ComputedBuffer",
           "ExternBuffer", "ReinterpretView", "TensorBox", "contiguous_strides", "Unsupported"]


class Unsupported(Exception):
    """This op/dtype/form has no native lowering: the node becomes a fallback kernel."""


def contiguous_strides(size):
    """Row-major strides of ``size`` (expressions; sizevars.py)."""
    return sizevars.contiguous_strides(size)


def _falling(num):
    """Is ``num`` (expanded) ``c - k1*v1 - k2*v2 ...``: an integer ``c``, integer ``k > 0``, integer
    symbols?"""
    syms = num.free_symbols
    if not syms or not all(v.is_integer for v in syms):
        return False
    coeffs = [num.coeff(v) for v in syms]
    const = num.subs({v: 0 for v in syms})
    return (all(c.is_Integer and c < 0 for c in coeffs) and const.is_Integer
            and sympy.expand(num - const - sum(c * v for c, v in zip(coeffs, syms))) == 0)


def rising_floors(e):
    """``e`` with every ``floor(a / q)`` and ``Mod(a, q)`` (integer ``q > 0``) whose ``a`` falls in
    every variable (``a = c - k*v``, integer ``k > 0``) written with ``b = q - 1 - a`` as
    ``-floor(b / q)`` and ``q - 1 - Mod(b, q)`` -- the same integers for every integer ``a``.
    sympy pulls the integer part out of a floor (``floor((81 - i)/2) = 40 + floor((1 - i)/2)``:
    nearest upsampling read by reflect padding), leaving an argument that is <= 0 where the loop
    variables are >= 0; the rising form's is >= 0 there, which bounds.py must prove (the printer's
    ``/`` and ``%`` truncate)."""
    if not isinstance(e, sympy.Basic) or not e.has(sympy.floor, sympy.Mod):
        return e
    rep = {}
    for a in e.atoms(sympy.floor, sympy.Mod):
        if isinstance(a, sympy.floor):
            num, den = sympy.fraction(sympy.together(a.args[0]))
        else:
            num, den = a.args
        if not den.is_Integer or int(den) <= 0 or num.has(sympy.floor, sympy.Mod):
            continue
        num, q = sympy.expand(num), int(den)
        if _falling(num):
            rep[a] = -sympy.floor((q - 1 - num) / q) if isinstance(a, sympy.floor) else q - 1 - sympy.Mod(q - 1 - num, q)
    return e.xreplace(rep) if rep else e


def _exprs(xs) -> tuple:
    return tuple(sizevars.sympify(x) for x in xs)


@dataclasses.dataclass(frozen=True)
class FixedLayout:
    """A buffer's memory layout; ``size``, ``stride`` and ``offset`` are sympy expressions (ints
    given are converted; sizevars.py)."""
    dtype: torch.dtype
    device: torch.device
    size: tuple
    stride: tuple
    offset: sympy.Expr = sympy.Integer(0)

    def __post_init__(self):
        object.__setattr__(self, "size", _exprs(self.size))
        object.__setattr__(self, "stride", _exprs(self.stride))
        object.__setattr__(self, "offset", sizevars.sympify(self.offset))

    def index(self, idx) -> sympy.Expr:
        """The storage offset of element ``idx`` (a list of sympy expressions)."""
        e = self.offset
        for i, s, n in zip(idx, self.stride, self.size):
            if n != 1:
                e = e + i * s
        return rising_floors(e)

    @property
    def numel(self) -> sympy.Expr:
        return sizevars.numel(self.size)

    def storage_extent(self) -> sympy.Expr:
        """Elements of storage the layout spans (max index + 1)."""
        if sizevars.statically_known_equals(self.numel, 0):
            return sympy.Integer(0)
        return self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1


class IRNode:
    dtype: torch.dtype
    device: torch.device

    def get_size(self) -> tuple:
        raise NotImplementedError

    def make_loader(self) -> Callable:
        raise NotImplementedError


class Loops(IRNode):
    """An unrealized computation over ``ranges`` (sympy expressions)."""

    def __init__(self, dtype, device, ranges):
        self.dtype, self.device, self.ranges = dtype, device, _exprs(ranges)

    def get_size(self):
        return self.ranges


class Pointwise(Loops):
    def __init__(self, dtype, device, ranges, inner_fn):
        super().__init__(dtype, device, ranges)
        self.inner_fn = inner_fn

    def make_loader(self):
        return self.inner_fn

    def __repr__(self):
        return f"Pointwise({str(self.dtype)[6:]}, {list(self.ranges)})"


class Reduction(Loops):
    TYPES = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin", "welford", "online_softmax")
    #: results of the reductions with several (the first is the default ``output``); ``index`` is
    #: the flat position in the reduced elements (row-major over ``reduction_ranges``), int64.
    #: ``online_softmax`` (Prop. 9.1): the (m, d) monoid of a row -- m its max, d the sum of
    #: exp(x - m), two states combined by rescaling d to the larger m -- one pass instead of a max
    #: pass and a sum pass; made only for a device backend that implements it
    #: (``DeviceBackend.online_softmax``)
    OUTPUTS = {"argmax": ("index", "value"), "argmin": ("index", "value"), "welford": ("mean", "m2", "count"),
               "online_softmax": ("max", "sum")}

    def __init__(self, dtype, device, ranges, reduction_ranges, reduction_type, inner_fn, src_dtype, output=None):
        super().__init__(dtype, device, ranges)
        if reduction_type not in self.TYPES:
            raise Unsupported(f"reduction type {reduction_type}")
        outs = self.OUTPUTS.get(reduction_type, (None,))
        if output is None:
            output = outs[0]
        if output not in outs:
            raise ValueError(f"{reduction_type} reduction has no output {output!r} (has {outs})")
        self.reduction_ranges = _exprs(reduction_ranges)
        self.reduction_type = reduction_type
        self.inner_fn = inner_fn
        self.src_dtype = src_dtype
        self.output = output

    @classmethod
    def multi(cls, dtypes, device, ranges, reduction_ranges, reduction_type, inner_fn, src_dtype):
        """One node per output of a multi-result reduction (``dtypes``: output name -> dtype),
        all over the same ``inner_fn`` — siblings share one accumulator in a kernel."""
        return {o: cls(dt, device, ranges, reduction_ranges, reduction_type, inner_fn, src_dtype, output=o)
                for o, dt in dtypes.items()}

    def make_loader(self):
        raise RuntimeError("a Reduction must be realized before it is read")

    def __repr__(self):
        out = f".{self.output}" if self.output else ""
        return (f"Reduction({self.reduction_type}{out}, {str(self.dtype)[6:]}, {list(self.ranges)} / "
                f"{list(self.reduction_ranges)})")


class Buffer(IRNode):
    """A value in memory.  ``flexible``: the layout may still change (§6.6) — true for buffers the
    lowering realized itself, until something depends on the strides (a view of it is taken), so a
    graph output can take eager's strides at the end; loaders read the layout when they are called
    (at scheduling / code generation), never when they are made."""

    flexible = False

    def __init__(self, name, layout: FixedLayout):
        self.name, self.layout = name, layout
        self.dtype, self.device = layout.dtype, layout.device

    def get_size(self):
        return self.layout.size

    def freeze_layout(self):
        self.flexible = False

    def set_layout(self, layout: FixedLayout):
        assert self.flexible and layout.size == self.layout.size and layout.dtype == self.dtype, (self, layout)
        self.layout = layout

    def make_loader(self):
        def loader(index):
            return ops.load(self.name, self.layout.index(index))
        return loader

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {str(self.dtype)[6:]}, {list(self.layout.size)})"


class InputBuffer(Buffer):
    pass


class ComputedBuffer(Buffer):
    def __init__(self, name, layout, data: Loops):
        super().__init__(name, layout)
        self.data = data

    @property
    def is_reduction(self):
        return isinstance(self.data, Reduction)


class ExternBuffer(Buffer):
    """The result of an ATen call: ``kind`` is ``"extern"`` (a library kernel the backend chose,
    e.g. matmul) or ``"fallback"`` (no lowering exists; listed by TP_STAX_LOWER_DEBUG=1)."""

    def __init__(self, name, layout, op, args, kind, reason="", index=None):
        super().__init__(name, layout)
        self.op, self.args, self.kind, self.reason, self.index = op, args, kind, reason, index


class ReinterpretView(IRNode):
    def __init__(self, data: Buffer, layout: FixedLayout):
        data.freeze_layout()      # the view's strides were computed from the base's layout
        self.data, self.layout = data, layout
        self.dtype, self.device = layout.dtype, layout.device

    @property
    def name(self):
        return self.data.name

    def get_size(self):
        return self.layout.size

    def make_loader(self):
        name, layout = self.data.name, self.layout

        def loader(index):
            return ops.load(name, layout.index(index))
        return loader

    def __repr__(self):
        return f"ReinterpretView({self.data.name}, {list(self.layout.size)}, {list(self.layout.stride)}, +{self.layout.offset})"


class TensorBox:
    """A graph value during lowering; ``data`` is a Loops, a Buffer or a ReinterpretView."""

    def __init__(self, data):
        self.data = data

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def device(self):
        return self.data.device

    def get_size(self):
        return tuple(self.data.get_size())

    def make_loader(self):
        return self.data.make_loader()

    @property
    def is_realized(self):
        return isinstance(self.data, (Buffer, ReinterpretView))

    def __repr__(self):
        return f"TensorBox({self.data!r})"
