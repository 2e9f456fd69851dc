"""Interval analysis of index expressions (chapter §6.8, Prop. 6.4).

Every index the generated code computes is an affine expression in loop variables whose ranges
are known (``0 <= v < n``).  Interval arithmetic over such expressions is exact for affine forms
(the extreme values are attained at the corners of the box), hence sound:

* **bounds checks are proved, not emitted**: every load and store of a kernel is checked at
  compile time to stay inside its buffer's storage (``check_access``); an access that cannot be
  proved in range makes the kernel Unsupported (a fallback) instead of risking a bad access;
* **index width**: if every index of a kernel fits in [-2^31, 2^31), its loop variables and index
  arithmetic use ``int32_t`` (``index_type``), otherwise ``int64_t``.
"""
from __future__ import annotations

import dataclasses

import sympy

from .ir import Unsupported

__all__ = ["Interval", "bound", "check_access", "index_type"]

INT32 = (-(2 ** 31), 2 ** 31 - 1)


@dataclasses.dataclass(frozen=True)
class Interval:
    lo: int
    hi: int

    def __add__(self, o):
        return Interval(self.lo + o.lo, self.hi + o.hi)

    def __mul__(self, o):
        c = (self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi)
        return Interval(min(c), max(c))

    def within(self, lo, hi) -> bool:
        return lo <= self.lo and self.hi <= hi


def bound(expr, ranges: dict) -> Interval:
    """Interval of ``expr`` when each symbol ``v`` ranges over ``ranges[v] = (lo, hi)``."""
    e = sympy.sympify(expr)
    if e.is_Integer:
        return Interval(int(e), int(e))
    if e.is_Symbol:
        if e not in ranges:
            raise Unsupported(f"index variable {e} has no known range")
        lo, hi = ranges[e]
        return Interval(lo, hi)
    if e.is_Add:
        out = Interval(0, 0)
        for a in e.args:
            out = out + bound(a, ranges)
        return out
    if e.is_Mul:
        out = Interval(1, 1)
        for a in e.args:
            out = out * bound(a, ranges)
        return out
    raise Unsupported(f"no interval rule for {e}")


def check_access(name, expr, ranges, extent):
    """Prove ``0 <= expr < extent`` for every point of the iteration space (empty spaces pass)."""
    if extent == 0 or any(hi < lo for lo, hi in ranges.values()):
        return
    iv = bound(expr, ranges)
    if not iv.within(0, extent - 1):
        raise Unsupported(f"cannot prove access {name}[{expr}] in [0, {extent}) (interval [{iv.lo}, {iv.hi}])")


def index_type(intervals) -> str:
    return "int32_t" if all(iv.within(*INT32) for iv in intervals) else "int64_t"
