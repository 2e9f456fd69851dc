"""Interval analysis of index expressions (chapter §6.8, Prop. 6.4), masks and checked indices.

Every index the generated code computes is an expression in loop variables whose ranges are known
(``0 <= v < n``).  Interval arithmetic over such expressions is exact for affine forms (the extreme
values are attained at the corners of the box), hence sound; ``Mod(a, q)`` and ``floor(a / q)``
(repeat, tile, roll with ``dims=None``) are bounded from the interval of ``a`` and are only
accepted when ``a >= 0`` is proved (the C++ printer uses truncating ``%`` and ``/``):

* **bounds checks are proved, not emitted**: every load and store of a kernel is checked at
  compile time to stay inside its buffer's storage (``check_access``); an access that cannot be
  proved in range makes the kernel Unsupported (a fallback) instead of risking a bad access --
  except a data-dependent one, whose element offsets the kernel then checks at run time
  (``CppHandler._checked_gather``: a bad one raises IndexError, it is never read);
* **masked loads** (``ops.masked``: pad, cat, roll, ...): a load inside a masked body only has to be
  in range where the mask holds.  :class:`AccessRecorder` evaluates a compute function
  symbolically, so a mask built from comparisons of ``index_expr``s with constants is a sympy
  condition; every conjunct that is affine in ONE loop variable clamps that variable's range
  (``refine``).  A mask it cannot read clamps nothing (the access must then be provable without
  it, else fallback) — an unchecked access is never emitted;
* **indirect (data-dependent) indices** (gather, index_select, embedding, ``x[idx]``): the loaded
  index value is checked *in the kernel* (``ops.indirect_indexing``: negative values wrap where torch
  wraps; a value outside ``[0, size)`` is reported and the lane reads index 0), so in index
  expressions it is the atom :class:`IndirectIndex` with the range ``[0, size - 1]``.  A bad index
  is reported with ``tp_report_error`` (stax_kernel.h, the kernels' run-time error slot); the
  kernel's Python call raises it as an ``IndexError`` naming the op, the index value and the size;
* **index width**: if every index of a kernel, every partial sum on the way to it (``magnitude``)
  and every loop counter (the iteration space's size plus the largest loop step) fits in
  [-2^31, 2^31), its loop variables and index arithmetic use ``int32_t`` (``index_type``),
  otherwise ``int64_t``.
"""
from __future__ import annotations

import dataclasses
import math

import sympy

from .ir import Unsupported

__all__ = ["Interval", "bound", "lane_bound", "check_access", "index_type", "magnitude", "IndirectIndex", "AccessRecorder",
           "refine"]

INT32 = (-(2 ** 31), 2 ** 31 - 1)


def _num(x):
    """An integer end point as an int; a symbolic one (an expression of size symbols) as is."""
    if isinstance(x, sympy.Basic):
        if not x.is_Integer:
            x = sympy.expand(x)
        return int(x) if x.is_Integer else x
    return x


def _le(a, b) -> bool:
    """Is ``a <= b`` proved?  Integers compare; symbolic end points are proved over the size
    symbols' ranges (sizevars.statically_known_leq: False means "not proved")."""
    a, b = _num(a), _num(b)
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    from .sizevars import statically_known_leq
    return statically_known_leq(a, b)


def _extreme(vals, smallest: bool):
    vals = [_num(v) for v in vals]
    if all(isinstance(v, int) for v in vals):
        return min(vals) if smallest else max(vals)
    for v in vals:
        if all((_le(v, w) if smallest else _le(w, v)) for w in vals):
            return v
    raise Unsupported(f"cannot order the interval end points {vals} over the size symbols' ranges")


@dataclasses.dataclass(frozen=True)
class Interval:
    """``[lo, hi]``: ints, or expressions of the size symbols (symbolic shapes, the chapter §10:
    the end points are then ordered by proofs over the symbols' ranges)."""
    lo: object
    hi: object

    def __post_init__(self):
        object.__setattr__(self, "lo", _num(self.lo))
        object.__setattr__(self, "hi", _num(self.hi))

    def __add__(self, o):
        return Interval(self.lo + o.lo, self.hi + o.hi)

    def __mul__(self, o):
        c = (self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi)
        return Interval(_extreme(c, True), _extreme(c, False))

    def within(self, lo, hi) -> bool:
        return _le(lo, self.lo) and _le(self.hi, hi)

    def empty(self) -> bool:
        """Is the interval proved empty?"""
        return _le(self.hi + 1, self.lo)


class IndirectIndex(sympy.Function):
    """``IndirectIndex(tag, size)``: an index loaded from data and checked in the kernel to lie in
    ``[0, size)``.  ``tag`` names the checked value inside one kernel body (the C++ handler maps it
    to a variable); it has no free symbols, so it is a constant for d/dx and loop merging."""
    is_integer = True
    nargs = 2


def _fraction(e):
    """``e`` as (integer-coefficient numerator, positive int denominator)."""
    num, den = sympy.fraction(sympy.together(e))
    if not den.is_Integer or int(den) <= 0:
        raise Unsupported(f"index division by a non-constant in {e}")
    return sympy.expand(num), int(den)


def _size_fraction(e):
    """``e`` as (numerator, denominator) where the denominator is a positive int or a size
    expression of the kernel's size symbols proved >= 1 (a flat index divided by a symbolic row
    length); else Unsupported."""
    num, den = sympy.fraction(sympy.together(e))
    if den.free_symbols and den.free_symbols <= _size_symbols() and _le(1, den):
        return sympy.expand(num), den
    return _fraction(e)


def _size_symbols() -> frozenset:
    from .sizevars import current
    return current().symbols


def _smin(*vals):
    """The least of ``vals`` (a range's upper bound tightened by a mask's): when symbolic end
    points cannot be ordered, the last one -- each is a valid bound, so any choice is sound."""
    try:
        return _extreme(vals, True)
    except Unsupported:
        return _num(vals[-1])


def _smax(*vals):
    try:
        return _extreme(vals, False)
    except Unsupported:
        return _num(vals[-1])


def _floordiv(a, den: int):
    return a // den if isinstance(a, int) else sympy.floor(a / den)


def _nonneg(e, ranges, what) -> Interval:
    iv = bound(e, ranges)
    if not _le(0, iv.lo):
        raise Unsupported(f"cannot prove the argument of {what} non-negative (interval [{iv.lo}, {iv.hi}])")
    return iv


def bound(expr, ranges: dict, lanes: bool = False) -> Interval:
    """Interval of ``expr`` when each symbol ``v`` ranges over ``ranges[v] = (lo, hi)``.

    ``lanes=True``: the interval of what the C++ code computes in EVERY lane, masked-out ones
    included (the index width, :func:`lane_bound`): there ``floor(p / q)`` and ``Mod(a, q)`` may
    see a negative argument (nearest upsampling read by reflect padding: ``floor((i - 1) / 2)``
    at ``i = 0``, a lane the mask drops) and are bounded as the truncating ``/`` and ``%`` the
    printer emits, instead of raising."""
    if lanes:
        return _lane_bound(sympy.sympify(expr), ranges)
    e = sympy.sympify(expr)
    if e.is_Integer:
        return Interval(int(e), int(e))
    if e.is_Symbol:
        if e in ranges:
            lo, hi = ranges[e]
            return Interval(lo, hi)
        if e in _size_symbols():      # a size symbol: a (symbolic) constant of the kernel
            return Interval(e, e)
        raise Unsupported(f"index variable {e} has no known range")
    if isinstance(e, IndirectIndex):
        return Interval(0, _extreme([e.args[1] - 1, 0], False))
    if e.is_Add:
        out = Interval(0, 0)
        for a in e.args:
            out = out + bound(a, ranges)
        return out
    if e.is_Mul:
        out = Interval(1, 1)
        for a in e.args:
            if a.is_Rational and not a.is_Integer:
                raise Unsupported(f"fractional index {e}")
            out = out * bound(a, ranges)
        return out
    if e.is_Pow and e.exp.is_Integer and int(e.exp) > 0:     # a size squared (T*T of a causal mask)
        iv = _nonneg(e.base, ranges, e)
        return Interval(_num(iv.lo ** e.exp), _num(iv.hi ** e.exp))
    if isinstance(e, sympy.Mod):
        a, q = e.args
        # the modulus: a positive constant, or a size expression of the kernel's size symbols that
        # is provably >= 1 (a roll or repeat along a symbolic dim)
        if not (q.is_Integer and int(q) > 0 or q.free_symbols and q.free_symbols <= _size_symbols() and _le(1, q)):
            raise Unsupported(f"Mod by a non-constant in {e}")
        if not q.is_Integer:    # printed as a floored modulo (cpp/ops.cexpr): any argument's sign
            iv = bound(a, ranges)
            return iv if _le(0, iv.lo) and _le(iv.hi + 1, q) else Interval(0, _num(q - 1))
        iv = _nonneg(a, ranges, e)
        return iv if _le(iv.hi + 1, q) else Interval(0, _num(q - 1))
    if isinstance(e, sympy.floor):
        num, den = _size_fraction(e.args[0])
        iv = _nonneg(num, ranges, e)
        if not isinstance(den, int):    # a symbolic divisor >= 1: floor(num / den) in [0, num]
            return Interval(0, iv.hi)
        return Interval(_floordiv(iv.lo, den), _floordiv(iv.hi, den))
    raise Unsupported(f"no interval rule for {e}")


def _trunc_div(a, den: int):
    """``a / den`` truncated toward zero (C++'s integer ``/``) for an int ``a``; a symbolic end
    point as ``floor`` (only asked for end points proved >= 0)."""
    if isinstance(a, int):
        return -((-a) // den) if a < 0 else a // den
    return _floordiv(a, den)


def _lane_bound(e, ranges) -> Interval:
    """:func:`bound` with ``lanes=True``: sound for any sign of a ``floor``/``Mod`` argument."""
    if isinstance(e, sympy.floor):
        num, den = _size_fraction(e.args[0])
        iv = _lane_bound(num, ranges)
        if _le(0, iv.lo):
            return bound(e, ranges)
        if not isinstance(den, int):    # truncation by a divisor >= 1 moves toward zero
            return Interval(_smin(iv.lo, 0), _smax(iv.hi, 0))
        if not isinstance(iv.hi, int) and not _le(0, iv.hi):
            raise Unsupported(f"cannot bound {e} in every lane (interval [{iv.lo}, {iv.hi}])")
        return Interval(_trunc_div(iv.lo, den) if isinstance(iv.lo, int) else _smin(iv.lo, 0), _trunc_div(iv.hi, den))
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer and int(e.args[1]) > 0:
        iv = _lane_bound(e.args[0], ranges)
        if _le(0, iv.lo):
            return bound(e, ranges)
        q = int(e.args[1])              # a % q truncating: the sign of a, |result| < q
        return Interval(-(q - 1), q - 1)
    if e.is_Add and e.atoms(sympy.floor, sympy.Mod):
        out = Interval(0, 0)
        for a in e.args:
            out = out + _lane_bound(a, ranges)
        return out
    if e.is_Mul and e.atoms(sympy.floor, sympy.Mod):
        out = Interval(1, 1)
        for a in e.args:
            out = out * _lane_bound(a, ranges)
        return out
    return bound(e, ranges)


def lane_bound(expr, ranges: dict) -> Interval:
    """The interval of the value an index expression takes in every lane a kernel computes it,
    masked or not (sets the index width): ``bound(expr, ranges, lanes=True)``."""
    return bound(expr, ranges, lanes=True)


def _conjuncts(cond, ranges):
    """(``lhs - rhs`` expanded, the relation, its loop variables) of every conjunct of ``cond`` that
    is a relation other than ``!=`` over loop variables of ``ranges`` only."""
    for c in cond.args if isinstance(cond, sympy.And) else (cond,):
        if not isinstance(c, sympy.core.relational.Relational) or c.rel_op == "!=":
            continue
        e = sympy.expand(c.lhs - c.rhs)
        free = [s for s in e.free_symbols if s in ranges]
        if not e.free_symbols - set(free) - _size_symbols():   # (size symbols: constants of the kernel)
            yield e, c.rel_op, free


def refine(ranges: dict, cond) -> dict:
    """Clamp variable ranges with a mask condition (a sympy boolean, or None = unknown): every
    conjunct ``c*v + k  <op>  0`` in a single variable tightens ``v``; other conjuncts are ignored
    (sound: ignoring a condition only widens the ranges)."""
    if cond is None or cond is sympy.true:
        return ranges
    out = dict(ranges)
    if cond is sympy.false:
        return {v: (0, -1) for v in out} or {sympy.Symbol("_never"): (0, -1)}
    for e, op, free in _conjuncts(cond, out):
        if len(free) != 1 or e.atoms(sympy.Function):
            continue
        v = free[0]
        a = e.coeff(v)
        k = sympy.expand(e - a * v)
        if not a.is_Integer or a == 0 or k.free_symbols & {*out}:
            continue
        a = int(a)
        if k.is_Integer:
            k = int(k)
        elif abs(a) != 1:       # a symbolic bound is taken when the division by a is exact
            continue

        def fdiv(x, d):         # floor(x / d); exact for a symbolic x when |d| == 1
            return x // d if isinstance(x, int) else x * d
        lo, hi = out[v]
        # a*v + k  op  0  over the integers
        if op in ("<", ">"):   # strict -> non-strict
            k, op = (k + 1, "<=") if op == "<" else (k - 1, ">=")
        if op == "==":
            if isinstance(k, int) and k % a:
                lo, hi = 0, -1
            else:
                lo, hi = _smax(lo, fdiv(-k, a)), _smin(hi, fdiv(-k, a))
        elif op == "<=":
            if a > 0:
                hi = _smin(hi, fdiv(-k, a))            # v <= floor(-k / a)
            else:
                lo = _smax(lo, -fdiv(-k, -a))          # v >= ceil(k / |a|)
        else:   # ">="
            if a > 0:
                lo = _smax(lo, -fdiv(k, a))            # v >= ceil(-k / a)
            else:
                hi = _smin(hi, fdiv(k, -a))            # v <= floor(k / |a|)
        out[v] = (lo, hi)
    return out


def _linear_windows(ranges: dict, cond) -> dict:
    """The conjuncts ``E + k  <op>  0`` of a mask condition whose linear part E has several
    variables (``2*oh + kh < 11`` in a pooling window), grouped by E: E -> the interval the mask
    leaves it (its interval over ``ranges`` tightened by every conjunct on it)."""
    out = {}
    for e, op, free in _conjuncts(cond, ranges):
        if len(free) < 2 or e.atoms(sympy.Function) or e.atoms(sympy.Mod):
            continue
        k = e.subs({v: 0 for v in free})
        lin = sympy.expand(e - k)
        if not k.is_Integer or not all(lin.coeff(v).is_Integer for v in free):
            continue
        k = int(k)
        if lin not in out:
            iv = bound(lin, ranges)
            out[lin] = (iv.lo, iv.hi)
        lo, hi = out[lin]     # lin + k  op  0
        if op == "<":
            hi = _smin(hi, -k - 1)
        elif op == "<=":
            hi = _smin(hi, -k)
        elif op == ">":
            lo = _smax(lo, -k + 1)
        elif op == ">=":
            lo = _smax(lo, -k)
        else:  # ==
            lo, hi = _smax(lo, -k), _smin(hi, -k)
        out[lin] = (lo, hi)
    return out


def check_access(name, expr, ranges, extent, cond=None):
    """Prove ``0 <= expr < extent`` for every point of the iteration space where ``cond`` (a mask
    condition, see :func:`refine`) holds; empty spaces pass.  A conjunct on a linear combination E
    of several variables (:func:`_linear_windows`) is used when ``expr`` contains a multiple of E:
    ``expr = c*E + rest`` is bounded as ``c*t + rest`` with ``t`` in the interval the mask leaves E
    (sound: the identity holds at every point, and the other variables keep their ranges).
    Each ``floor``/``Mod`` term of the loop variables is first read as a variable of its own over
    its interval (over the ranges the mask's single-variable conjuncts leave), the same one in
    ``expr`` and in ``cond``: a conjunct ``floor(9*o/7) + 2 < 9`` then bounds the access
    ``floor(9*o/7) + 2``, and ``i >= 2`` bounds ``floor((i + 1)/3) - 1`` (a strided slice's
    gradient, ``_getitem_backward``; sound as well -- the term's values lie in its interval, and
    dropping their link to the loop variables only widens).  Each checked index
    ``IndirectIndex(tag, size)`` is read the same way, as a variable over ``[0, size)``, so a mask
    on it clamps it: ``cat([a, b]).gather(0, i)`` reads ``b[i - 2]`` where ``2 <= i < 5`` (sound:
    the kernel computes the mask and the access from the same checked value)."""
    ind = sorted(expr.atoms(IndirectIndex) | (cond.atoms(IndirectIndex) if isinstance(cond, sympy.Basic) else set()),
                 key=str)
    shown = expr
    if ind:
        sub = {a: sympy.Symbol(f"_indirect{k}", integer=True) for k, a in enumerate(ind)}
        ranges = {**ranges, **{sub[a]: (0, _num(a.args[1] - 1)) for a in ind}}
        expr = expr.xreplace(sub)
        cond = cond.xreplace(sub) if isinstance(cond, sympy.Basic) else cond
    if cond is not None and cond is not sympy.true and cond is not sympy.false:
        ranges = refine(ranges, cond)       # the terms' intervals over the loop ranges the mask leaves
        terms = sorted({a for a in expr.atoms(sympy.floor, sympy.Mod) | cond.atoms(sympy.floor, sympy.Mod)
                        if a.free_symbols and a.free_symbols <= set(ranges)}, key=str)
        sub, ranges = {}, dict(ranges)
        for a in terms:
            try:
                iv = bound(a, ranges)
            except Unsupported:     # a term bound() cannot take stays as it is
                continue
            sub[a] = sympy.Symbol(f"_term{len(sub)}", integer=True)
            ranges[sub[a]] = (iv.lo, iv.hi)
        expr, cond = expr.xreplace(sub), cond.xreplace(sub)
    ranges = refine(ranges, cond)
    if _num(extent) == 0 or any(Interval(lo, hi).empty() for lo, hi in ranges.values()):
        return
    e, ext = expr, ranges
    if cond is not None and cond is not sympy.true:
        e, ext = sympy.expand(expr), dict(ranges)
        for j, (lin, (lo, hi)) in enumerate(_linear_windows(ranges, cond).items()):
            if Interval(lo, hi).empty():
                return          # the mask never holds: nothing is read
            vs = sorted(lin.free_symbols, key=str)
            c = e.coeff(vs[0]) / lin.coeff(vs[0])
            if c != 0 and c.is_Integer and all(e.coeff(v) == c * lin.coeff(v) for v in vs):
                t = sympy.Symbol(f"_window{j}", integer=True)
                e, ext[t] = sympy.expand(e - c * lin + c * t), (lo, hi)
    iv = bound(e, ext)
    if not iv.within(0, extent - 1):
        raise Unsupported(f"cannot prove access {name}[{shown}] in [0, {extent}) (interval [{iv.lo}, {iv.hi}])")


def magnitude(expr, ranges: dict) -> int:
    """The largest ``|value|`` of ``expr`` and of every partial result C++ forms while evaluating it
    term by term (``cexpr``'s sums, products, ``%`` and ``/`` arguments): the sum of the terms'
    maxima bounds every partial sum in any order, so an index type that holds it never overflows
    on the way, even where the terms' signs differ."""
    e = sympy.sympify(expr)
    if e.is_Add:
        return sum(magnitude(a, ranges) for a in e.args)
    if e.is_Mul:
        return math.prod(magnitude(a, ranges) for a in e.args)
    if isinstance(e, sympy.Mod):
        return _extreme([magnitude(e.args[0], ranges), abs(int(e.args[1])) if e.args[1].is_Integer else 0], False)
    if isinstance(e, sympy.floor):
        return magnitude(_size_fraction(e.args[0])[0], ranges)
    iv = bound(e, ranges)
    return _extreme([_abs(iv.lo), _abs(iv.hi)], False)


def _abs(x):
    if isinstance(x, int):
        return abs(x)
    if _le(0, x):
        return x
    if _le(x, 0):
        return -x
    raise Unsupported(f"cannot tell the sign of {x} over the size symbols' ranges")


def index_type(intervals) -> str:
    return "int32_t" if all(iv.within(*INT32) for iv in intervals) else "int64_t"


# ---- symbolic evaluation of a compute function: loads, masks, index expressions ----------------------
class _Opaque:
    """A value the recorder does not track (data)."""


OPAQUE = _Opaque()
_REL = {"lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge, "eq": sympy.Eq, "ne": sympy.Ne}


def _is_expr(v):
    return isinstance(v, sympy.Expr)


def _is_bool(v):
    return isinstance(v, sympy.logic.boolalg.Boolean)


class AccessRecorder:
    """An ``ops`` handler that records every load as ``(buffer, index, condition)`` — the condition
    is the conjunction of the enclosing masks (None if one of them is not a readable sympy
    condition) — and every ``index_expr`` expression (they constrain loop merging).  Index-valued
    ops (index_expr, integer constants, + - * and comparisons of them) are evaluated as sympy."""

    def __init__(self):
        self.loads = []
        self.index_exprs = []
        self._conds = []
        self._tags = 0

    def _cond(self):
        if any(c is None for c in self._conds):
            return None
        return sympy.And(*self._conds) if self._conds else None

    def load(self, name, index):
        self.loads.append((name, sympy.expand(index), self._cond()))
        return OPAQUE

    def index_expr(self, expr, dtype):
        e = sympy.expand(sympy.sympify(expr))
        self.index_exprs.append(e)
        return e

    def constant(self, value, dtype):
        try:
            f = float(value)
        except (TypeError, ValueError):
            return OPAQUE
        return sympy.Integer(int(f)) if f == f and abs(f) != float("inf") and f == int(f) else OPAQUE

    def to_dtype(self, x, dtype, src_dtype=None):
        return x

    def masked(self, mask, body, other):
        self._conds.append(mask if _is_bool(mask) else None)
        try:
            body()
        finally:
            self._conds.pop()
        return OPAQUE

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        self._tags += 1       # one tag per checked value: masks on one never clamp another
        return self._tags - 1

    def add(self, a, b):
        return a + b if _is_expr(a) and _is_expr(b) else OPAQUE

    def sub(self, a, b):
        return a - b if _is_expr(a) and _is_expr(b) else OPAQUE

    def mul(self, a, b):
        return a * b if _is_expr(a) and _is_expr(b) else OPAQUE

    def logical_and(self, a, b):
        return sympy.And(a, b) if _is_bool(a) and _is_bool(b) else OPAQUE

    def __getattr__(self, name):
        from .ops_handler import OPS_NAMES
        if name in _REL:
            return lambda a, b: _REL[name](a, b) if _is_expr(a) and _is_expr(b) else OPAQUE
        if name not in OPS_NAMES:
            raise AttributeError(name)
        return lambda *a, **k: OPAQUE


def record_accesses(fn, *args):
    from .ops_handler import set_handler
    rec = AccessRecorder()
    with set_handler(rec):
        fn(*args)
    return rec
