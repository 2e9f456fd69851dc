"""Triton of a compute function: the ``ops`` handler of the Triton kernels (the chapter, §9.3).

:class:`TritonHandler` evaluates a node's compute function inside the block being printed
(kernel.py): every ``ops`` call becomes one line ``tN = ...`` of Triton over blocks (``[XBLOCK]``
in a pointwise kernel, ``[XBLOCK, RBLOCK]`` / ``[XBLOCK, 1]`` in a reduction), common
subexpressions printed once.  Loads are masked by the block's masks of the loop variables their
index uses (tails: ``xmask``, ``rmask``) and by an enclosing ``ops.masked`` condition; a
data-dependent index is wrapped (negative indices) and checked with ``tl.device_assert``.

Dtypes: a value's ``dtype`` is the torch dtype the compute function names; float16 and
bfloat16 values are computed in float32 registers (loads upcast, an explicit cast rounds through
the narrow type, stores narrow) as eager's CUDA kernels do.  Integer division follows torch
(floored ``//`` and ``%``), shifts follow torch for out-of-range counts, ``maximum``/``minimum``
propagate NaN.  Random numbers are Philox4x32-10 of (seed, element offset, stream) with the
C++ kernels' counter and key layout (cpp/tp_philox.h): ``rand`` gives the CPU kernels' bits.

Guarantee: the printed Triton computes what the compute function says, in the dtypes it names.
"""
from __future__ import annotations

import math

import sympy
import torch

from ..bounds import IndirectIndex, _size_fraction
from ..ir import Unsupported
from ..ops_handler import COMPARE

__all__ = ["TritonHandler", "TL_DTYPE", "texpr", "compute_dtype", "literal", "tl_type", "GPU_IMPORTS"]

#: the imports of every kernel module (runtime.py swaps the libdevice line for the interpreter)
GPU_IMPORTS = ("import triton", "import triton.language as tl", "from triton.language.extra import libdevice")

TL_DTYPE = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
            torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
            torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1"}
_NARROW = (torch.float16, torch.bfloat16)

_LIBDEVICE_UNARY = ("tanh", "erfc", "expm1", "log1p", "tan", "asin", "acos", "atan", "sinh", "cosh", "log10", "trunc")
_TL_UNARY = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "rsqrt": "tl.rsqrt", "sin": "tl.sin",
             "cos": "tl.cos", "exp2": "tl.exp2", "log2": "tl.log2", "floor": "tl.floor", "ceil": "tl.ceil",
             "erf": "tl.erf", "sigmoid": "tl.sigmoid"}


def compute_dtype(dtype):
    """The dtype a value of ``dtype`` lives in registers as."""
    return torch.float32 if dtype in _NARROW else dtype


def tl_type(dtype) -> str:
    try:
        return TL_DTYPE[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} in a Triton kernel") from None


def literal(v, dtype) -> str:
    """A Python literal Triton reads as ``v`` (``tl.full`` gives it ``dtype``)."""
    if dtype == torch.bool:
        return "True" if v else "False"
    if dtype.is_floating_point:
        v = float(v)
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return f"float('{'-' if v < 0 else ''}inf')"
        return repr(v)
    return str(int(v))


def texpr(e, indirect=None) -> str:
    """A sympy index expression as Triton integer arithmetic: affine terms, ``Mod(a, q)`` as
    ``a % q`` (a symbolic ``q``: the floored ``((a % q) + q) % q``), ``floor(p / q)`` as
    ``p // q`` (truncation == floor: bounds.py proves ``a, p >= 0`` first), small powers as
    products; ``IndirectIndex`` atoms as the variables ``indirect`` maps their tags to."""
    e = sympy.expand(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, IndirectIndex):
        if indirect is None or int(e.args[0]) not in indirect:
            raise Unsupported(f"indirect index {e} outside its kernel body")
        return indirect[int(e.args[0])]
    if e.is_Add:
        return "(" + " + ".join(texpr(a, indirect) for a in e.args) + ")"
    if e.is_Mul:
        if any(a.is_Rational and not a.is_Integer for a in e.args):
            raise Unsupported(f"fractional index expression {e}")
        return "(" + " * ".join(texpr(a, indirect) for a in e.args) + ")"
    if isinstance(e, sympy.Mod):
        a, q = texpr(e.args[0], indirect), texpr(e.args[1], indirect)
        return f"({a} % {q})" if e.args[1].is_Integer else f"((({a} % {q}) + {q}) % {q})"
    if isinstance(e, sympy.floor):
        num, den = _size_fraction(e.args[0])
        return f"({texpr(num, indirect)} // {den if isinstance(den, int) else texpr(den, indirect)})"
    if e.is_Pow and e.exp.is_Integer and 0 < int(e.exp) <= 4:
        return "(" + " * ".join([texpr(e.base, indirect)] * int(e.exp)) + ")"
    raise Unsupported(f"non-affine index expression {e}")


class _Val:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype

    def __str__(self):
        return self.name


class TritonHandler:
    """Prints ``ops`` calls as Triton lines of the current block (module doc).  ``kernel`` is the
    printer (kernel.py): it names temporaries, knows the masks of the loop variables and the
    values of local buffers; ``row``: a row value (a reduction kernel's outer node)."""

    def __init__(self, kernel, row=False):
        self.k = kernel
        self.row = row
        self.lines = []
        self.cse = kernel.cse      # shared by the handlers of one scope (kernel.py)
        self._mask = None          # the enclosing ops.masked condition (a bool _Val), if any
        self.indirect = {}         # IndirectIndex tag -> Triton variable of the checked index

    def _emit(self, expr, dtype):
        key = (expr, dtype)
        if key in self.cse:
            return self.cse[key]
        name = self.k.tmp()
        self.lines.append(f"{name} = {expr}")
        v = _Val(name, dtype)
        self.cse[key] = v
        return v

    # -- memory and indices ---------------------------------------------------------------------------
    def pointer(self, name, index, store=False) -> tuple:
        """(pointer text, mask text or None) of ``name[index]`` in the current block.  A load is
        masked by the masks of the block axes its index varies along (the tails) and by an
        enclosing ``ops.masked`` condition; a store by all of the block's.  When the mask spans
        axes the index does not (a condition on other variables, a store of one element) the
        pointer is broadcast to the full block (Triton broadcasts a mask to its pointer)."""
        k = self.k
        e = k.translate(index)
        offset = f"{name} + ({texpr(e, self.indirect)})"
        groups = k.groups_of(None if e.atoms(IndirectIndex) else e, self.row)
        ctx = k.context_groups(self.row)
        if store or self._mask is not None:
            masks = [f"{g}mask" for g in ctx] + ([self._mask.name] if self._mask is not None else [])
            if groups != ctx:
                offset = f"tl.broadcast_to({offset}, {k.full_shape(self.row)})"
        else:
            masks = [f"{g}mask" for g in groups]
        return offset, (" & ".join(masks) or None)

    def load(self, name, index):
        v = self.k.local_value(name, self)
        if v is not None:
            return v
        ptr = self.k.ptr(name)
        dt = self.k.dtype_of(name)
        if name in self.k.host_scalars:         # a value argument (index 0 of one element)
            return _Val(ptr, dt)
        offset, mask = self.pointer(ptr, index)
        if mask:
            v = self._emit(f"tl.load({offset}, {mask}, other=0)", dt)
        else:    # one element (an index of no loop variable), broadcast to the block
            v = self._emit(f"tl.broadcast_to(tl.load({offset}), {self.k.full_shape(self.row)})", dt)
        if dt in _NARROW:
            v = self._emit(f"{v}.to(tl.float32)", dt)
        return v

    def index_expr(self, expr, dtype):
        e = self.k.translate(expr)
        text = texpr(e, self.indirect)
        if not (e.free_symbols - self.k.size_symbols()) and not e.atoms(IndirectIndex):
            return self._emit(f"tl.full([], {text}, {tl_type(dtype)})", dtype)
        return self._emit(f"({text}).to({tl_type(dtype)})", dtype)

    def constant(self, value, dtype):
        return self._emit(f"tl.full([], {literal(value, compute_dtype(dtype))}, {tl_type(compute_dtype(dtype))})",
                          dtype)

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        """The loaded index ``value`` as a block of indices in ``[0, size)``: negative ones wrapped
        (``wrap_negative``), every one checked by ``tl.device_assert`` (``check``: the message,
        ``{value}`` for the bad index) and clamped into range, so no lane reads outside."""
        if value.dtype.is_floating_point:
            raise Unsupported("a floating-point index")
        n = texpr(sympy.sympify(size))
        i = self._emit(f"{value}.to({tl_type(self.k.index_dtype)})", self.k.index_dtype)
        if wrap_negative:
            i = self._emit(f"tl.where({i} < 0, {i} + {n}, {i})", i.dtype)
        ok = self._emit(f"(0 <= {i}) & ({i} < {n})", torch.bool)
        msg = (check or "IndexError: index {value} is out of bounds for size " + str(size)).replace("{value}", "?")
        active = " & ".join([f"{g}mask" for g in self.k.context_groups(self.row)] +
                            ([self._mask.name] if self._mask is not None else []))
        self.lines.append(f"tl.device_assert({ok}{' | ~(' + active + ')' if active else ''}, {msg!r})")
        i = self._emit(f"tl.where({ok}, {i}, 0)", i.dtype)
        tag = len(self.indirect)
        self.indirect[tag] = i.name
        return tag

    # -- control ----------------------------------------------------------------------------------------
    def masked(self, mask, body, other):
        """Loads in ``body`` touch memory only where ``mask`` holds; there the value is ``body``'s,
        elsewhere ``other``."""
        prev = self._mask
        self._mask = mask if prev is None else self.logical_and(prev, mask)
        try:
            v = body()
        finally:
            self._mask = prev
        o = other if isinstance(other, _Val) else self.constant(other, v.dtype)
        return self._emit(f"tl.where({mask}, {v}, {o})", v.dtype)

    def where(self, c, a, b):
        return self._emit(f"tl.where({c}, {a}, {b})", a.dtype)

    def to_dtype(self, x, dtype, src_dtype=None):
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"({x} != 0)", torch.bool)
        if dtype in _NARROW:       # round through the narrow type, keep float32 registers
            return self._emit(f"{x}.to({tl_type(dtype)}).to(tl.float32)", dtype)
        if compute_dtype(x.dtype) == dtype:
            return _Val(x.name, dtype)
        return self._emit(f"{x}.to({tl_type(dtype)})", dtype)

    # -- random numbers ---------------------------------------------------------------------------------
    def _philox(self, seed, offset, stream):
        key = ("philox", str(seed), str(offset), int(stream))
        if key not in self.cse:
            s = int(stream)
            c0 = self._emit(f"{offset}.to(tl.uint32)", torch.int32)
            c1 = self._emit(f"({offset} >> 32).to(tl.uint32)", torch.int32)
            c2 = self._emit(f"{c0} * 0 + {s & 0xFFFFFFFF}", torch.int32)
            c3 = self._emit(f"{c0} * 0 + {(s >> 32) & 0xFFFFFFFF}", torch.int32)
            name = self.k.tmp()
            self.lines.append(f"{name}_0, {name}_1, {name}_2, {name}_3 = tl.philox({seed}, {c0}, {c1}, {c2}, {c3})")
            self.cse[key] = name
        return self.cse[key]

    def _unit(self, a, b, dtype, open0):
        """A uniform float on [0, 1) (``open0``: (0, 1]) from Philox words (cpp/tp_philox.h)."""
        one = " + 1" if open0 else ""
        if dtype == torch.float64:
            m = f"((({a}.to(tl.uint64) << 21) | ({b} >> 11).to(tl.uint64)){one})"
            return self._emit(f"{m}.to(tl.float64) * 1.1102230246251565e-16", torch.float64)
        return self._emit(f"(({a} >> 8){one}).to(tl.float32) * 5.960464477539063e-08", torch.float32)

    def rand(self, seed, offset, stream, dtype):
        r = self._philox(seed, offset, stream)
        return self._unit(f"{r}_0", f"{r}_1", compute_dtype(dtype), False)

    def randn(self, seed, offset, stream, dtype):
        r = self._philox(seed, offset, stream)
        dt = compute_dtype(dtype)
        u1 = self._unit(f"{r}_0", f"{r}_1", dt, True)
        u2 = self._unit(f"{r}_2", f"{r}_3", dt, False)
        return self._emit(f"tl.sqrt(-2.0 * tl.log({u1})) * tl.cos(6.283185307179586 * {u2})", dtype)

    def randint64(self, seed, offset, stream, low, high):
        r = self._philox(seed, offset, stream)
        rng = int(high) - int(low)
        if rng <= 1 << 32:
            v = f"(({r}_0.to(tl.uint64) * {rng}) >> 32).to(tl.int64)"
        else:
            v = f"(((({r}_0.to(tl.uint64) << 32) | {r}_1.to(tl.uint64)) % {rng}).to(tl.int64)"
        return self._emit(f"{v} + {int(low)}", torch.int64)

    # -- arithmetic -------------------------------------------------------------------------------------
    def add(self, a, b):
        return self._emit(f"({a} + {b})", a.dtype)

    def sub(self, a, b):
        return self._emit(f"({a} - {b})", a.dtype)

    def mul(self, a, b):
        return self._emit(f"({a} * {b})", a.dtype)

    def truediv(self, a, b):
        return self._emit(f"({a} / {b})", a.dtype)

    def neg(self, a):
        return self._emit(f"(-{a})", a.dtype)

    def reciprocal(self, a):
        return self._emit(f"(1.0 / {a})", a.dtype)

    def square(self, a):
        return self._emit(f"({a} * {a})", a.dtype)

    def abs(self, a):
        return self._emit(f"tl.abs({a})", a.dtype) if a.dtype != torch.bool else a

    def sign(self, a):
        if a.dtype == torch.bool:
            return a
        t = tl_type(compute_dtype(a.dtype))     # (sign(NaN) is 0, as torch's)
        return self._emit(f"(({a} > 0).to({t}) - ({a} < 0).to({t}))", a.dtype)

    def maximum(self, a, b):
        return self._emit(f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", a.dtype)

    def minimum(self, a, b):
        return self._emit(f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", a.dtype)

    def pow(self, a, b):
        if not a.dtype.is_floating_point:
            return self._emit(f"{self.k.helper('_pow_int')}({a}, {b})", a.dtype)
        return self._emit(f"libdevice.pow({a}, {b})", a.dtype)

    def atan2(self, a, b):
        return self._emit(f"libdevice.atan2({a}, {b})", a.dtype)

    def hypot(self, a, b):
        return self._emit(f"libdevice.hypot({a}, {b})", a.dtype)

    def round(self, a):
        return self._emit(f"libdevice.rint({a})", a.dtype)     # half to even, as torch.round

    def isnan(self, a):
        return self._emit(f"({a} != {a})", torch.bool) if a.dtype.is_floating_point else \
            self._emit("tl.full([], False, tl.int1)", torch.bool)

    def isinf(self, a):
        return self._emit(f"(tl.abs({a}) == float('inf'))", torch.bool) if a.dtype.is_floating_point else \
            self._emit("tl.full([], False, tl.int1)", torch.bool)

    # integer division as torch: floored // and %, truncated div and fmod
    def floordiv(self, a, b, op=None):
        if a.dtype.is_floating_point:
            return self._emit(f"{self.k.helper('_floordiv_float')}({a}, {b})", a.dtype)
        q, r = self._emit(f"({a} // {b})", a.dtype), self._emit(f"({a} % {b})", a.dtype)
        return self._emit(f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {q} - 1, {q})", a.dtype)

    def truncdiv(self, a, b, op=None):
        if a.dtype.is_floating_point:
            return self._emit(f"libdevice.trunc({a} / {b})", a.dtype)
        return self._emit(f"({a} // {b})", a.dtype)

    def remainder(self, a, b, op=None):
        r = self.fmod(a, b)
        return self._emit(f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})", a.dtype)

    def fmod(self, a, b, op=None):
        return self._emit(f"libdevice.fmod({a}, {b})" if a.dtype.is_floating_point else f"({a} % {b})", a.dtype)

    # logic and bits (bools are int1 blocks)
    def logical_and(self, a, b):
        return self._emit(f"({self._bool(a)} & {self._bool(b)})", torch.bool)

    def logical_or(self, a, b):
        return self._emit(f"({self._bool(a)} | {self._bool(b)})", torch.bool)

    def logical_xor(self, a, b):
        return self._emit(f"({self._bool(a)} ^ {self._bool(b)})", torch.bool)

    def logical_not(self, a):
        return self._emit(f"({self._bool(a)} == 0)", torch.bool)

    def _bool(self, a):
        return a if a.dtype == torch.bool else self.to_dtype(a, torch.bool)

    def bitwise_and(self, a, b):
        return self._emit(f"({a} & {b})", a.dtype)

    def bitwise_or(self, a, b):
        return self._emit(f"({a} | {b})", a.dtype)

    def bitwise_xor(self, a, b):
        return self._emit(f"({a} ^ {b})", a.dtype)

    def bitwise_not(self, a):
        return self._emit(f"({a} == 0)" if a.dtype == torch.bool else f"(~{a})", a.dtype)

    def bitwise_left_shift(self, a, b):
        bits = a.dtype.itemsize * 8
        return self._emit(f"tl.where(({b} >= 0) & ({b} < {bits}), {a} << {b}, 0)", a.dtype)

    def bitwise_right_shift(self, a, b):
        bits = a.dtype.itemsize * 8
        return self._emit(f"{a} >> tl.where(({b} >= 0) & ({b} < {bits}), {b}, {bits - 1})", a.dtype)

    def __getattr__(self, name):
        if name in COMPARE:
            sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
            return lambda a, b: self._emit(f"({a} {sym} {b})", torch.bool)
        if name in _TL_UNARY:
            return lambda a: self._emit(f"{_TL_UNARY[name]}({a})", a.dtype)
        if name in _LIBDEVICE_UNARY:
            return lambda a: self._emit(f"libdevice.{name}({a})", a.dtype)
        raise AttributeError(name)
