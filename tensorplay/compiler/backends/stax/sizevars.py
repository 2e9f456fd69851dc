"""Sizes as expressions (the chapter, §10.1–§10.2): the size symbols of a graph and the questions
the compiler asks about sizes.

Every size, stride and storage offset in the loop IR (ir.py: layouts, ``Loops.ranges``), in the
KernelPlans (kernel_plan.py: loop sizes, buffer extents) and in what is derived from them is a
sympy expression.  While shapes are static every one of them is an ``Integer``; a symbolic size
is a positive integer :func:`~SizeVarAllocator.symbol` with a **hint**, the value it had in the
sample the graph was captured with (§10.2: sizes 0 and 1 are never symbols — they change what a
program means — so a symbol's range starts at 2).

Rules for the stages that read sizes:

* a **heuristic** (parallel depth, unrolling, whether to realize, column mode...) decides on
  numbers: it asks :meth:`~SizeVarAllocator.size_hint` and may be wrong for other sizes without
  being incorrect;
* a **decision that changes meaning** (merging two loops, Prop. 6.3; whether a dim broadcasts)
  holds for every size only if it is proved: :meth:`~SizeVarAllocator.statically_known_equals`,
  ``_leq``, ``_lt``, ``_multiple_of`` answer True only when the relation holds for every value of
  the symbols in their ranges (False means "not proved", not "false");
  :meth:`~SizeVarAllocator.guard_equals` proves the relation or records it as a guard the compiled
  code's input check must test (the relation holds for the hints, else it raises);
* a printer prints the expression (a symbolic size is a size argument of the kernel, bound by the
  wrapper from its inputs); a stage that still needs a number asks
  :meth:`~SizeVarAllocator.evaluate_static_shape`, which raises :class:`SymbolicSizeError` on a
  symbol instead of silently taking the hint.

Symbols come from the capture's torch ShapeEnv (:meth:`~SizeVarAllocator.from_torch`: the same
sympy symbols, their hints and ranges; torch's size functions as sympy's).

Guarantee: for integer expressions every answer is exactly what the integer arithmetic gives,
so today's kernels are unchanged.  The module-level functions ask the allocator of the graph
being compiled (:func:`use`), or a static one (no symbols) outside a compilation.
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import sympy
import torch

__all__ = ["SizeVarAllocator", "SymbolicSizeError", "current", "use", "sympify", "size_hint", "size_hints",
           "from_torch", "size_upper_bound",
           "is_static", "is_size_expr", "evaluate_static_shape", "statically_known_true",
           "statically_known_equals", "statically_known_leq", "statically_known_lt",
           "statically_known_multiple_of", "guard_equals", "contiguous_strides", "numel"]


class SymbolicSizeError(RuntimeError):
    """A stage that needs a number met a symbolic size it cannot specialise."""


#: functions a size expression may contain (conv/pool output sizes, splits, ceil-div)
_SIZE_FUNCTIONS = (sympy.floor, sympy.ceiling, sympy.Mod, sympy.Max, sympy.Min)


def sympify(x) -> sympy.Expr:
    """``x`` (an int, a sympy expression, a torch/numpy integer) as a sympy expression."""
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        raise TypeError(f"a size must be an integer, not {x!r}")
    try:
        return sympy.Integer(x.__index__())
    except AttributeError:
        raise TypeError(f"a size must be an integer or a sympy expression, not {type(x).__name__} {x!r}") from None


class SizeVarAllocator:
    """The size symbols of one graph: each with its hint and its range [lo, hi], and the guards
    recorded about them (module doc)."""

    def __init__(self):
        self.var_to_hint: dict[sympy.Symbol, int] = {}
        self.var_to_range: dict[sympy.Symbol, tuple] = {}
        self.guards: list = []
        self.shape_env = None    # the capture's torch ShapeEnv, once a symbolic size came from it
        self._facts = None       # (number of the ShapeEnv's guards read, facts()) -- derived, cached

    # -- symbols ---------------------------------------------------------------------------------
    def symbol(self, name: str, hint: int, lo: int = 2, hi=None) -> sympy.Symbol:
        """A new positive integer size symbol ``name`` with sample value ``hint`` in ``[lo, hi]``
        (``hi=None``: unbounded)."""
        if not (isinstance(hint, int) and lo <= hint and (hi is None or hint <= hi)):
            raise ValueError(f"size symbol {name}: hint {hint!r} outside its range [{lo}, {hi}]")
        if lo < 2:
            raise ValueError(f"size symbol {name}: sizes 0 and 1 are specialised, a symbol's range starts at 2")
        s = sympy.Symbol(name, integer=True, positive=True)
        if s in self.var_to_hint:
            raise ValueError(f"size symbol {name} already exists")
        self.var_to_hint[s] = hint
        self.var_to_range[s] = (lo, hi)
        return s

    def from_torch(self, x) -> sympy.Expr:
        """A size of a captured graph (an int, a ``torch.SymInt`` of the capture's ShapeEnv, or a
        sympy expression of it) as an expression of this graph's symbols.  torch's size functions
        become sympy's (``FloorDiv(a, b)`` -> ``floor(a / b)``, ``ModularIndexing(a, b, c)`` ->
        ``Mod(floor(a / b), c)``, ``CleanDiv`` -> ``/``, ``Max``/``Min``, ``CeilDiv``); each of its
        symbols becomes a symbol of this graph with the ShapeEnv's hint and range (a size with no
        hint -- a data-dependent one -- raises SymbolicSizeError)."""
        env = None
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            env = x.node.shape_env
            x = env.replace(x.node.expr)
            if self.shape_env is None:
                self.shape_env = env
        env = env or self.shape_env
        if env is not None:     # a raw expression too gets the replacements (s93 is s26 after a view)
            x = env.replace(sympify(x))
        e = _from_torch_expr(sympify(x))
        for s in e.free_symbols - self.symbols:
            hint = None if env is None else _backed_hint(env, s)
            if hint is None:
                raise SymbolicSizeError(f"size {e}: symbol {s} has no hint (a data-dependent size)")
            vr = env.var_to_range.get(s)
            lo = max(2, _finite(vr.lower) or 2) if vr is not None else 2
            hi = _finite(vr.upper) if vr is not None else None
            self.var_to_hint[s] = hint
            self.var_to_range[s] = (lo, hi)
        return self._decide_min_max(e)

    def _decide_min_max(self, e):
        """``Max(a, b)`` / ``Min(a, b)`` replaced by the argument that is proved the larger /
        smaller over the ranges and the capture's guards (torch writes ``Max(1, n)`` into the
        strides of an output whose size ``n`` may be 0)."""
        def decide(a):
            x, y = a.args
            if self.statically_known_leq(x, y):
                return y if isinstance(a, sympy.Max) else x
            if self.statically_known_leq(y, x):
                return x if isinstance(a, sympy.Max) else y
            return a
        if not e.has(sympy.Max, sympy.Min):
            return e
        return e.replace(lambda a: isinstance(a, (sympy.Max, sympy.Min)) and len(a.args) == 2, decide)

    @property
    def symbols(self) -> frozenset:
        return frozenset(self.var_to_hint)

    # -- numbers -----------------------------------------------------------------------------------
    def size_hint(self, e) -> int:
        """The value of ``e`` at the symbols' hints (an int; for heuristics)."""
        e = sympify(e)
        if e.is_Integer:
            return int(e)
        v = e.xreplace({s: sympy.Integer(h) for s, h in self.var_to_hint.items()})
        if not v.is_Integer:
            raise SymbolicSizeError(f"size {e} has no hint (symbols without one: "
                                    f"{sorted(map(str, v.free_symbols))})")
        return int(v)

    def size_upper_bound(self, e):
        """The largest value of ``e`` over the symbols' ranges when every symbol of it has an upper
        bound and ``e`` grows with each of them (a polynomial whose non-constant terms have
        non-negative coefficients); else None.  (For decisions that must hold for every size,
        e.g. how deep a cascaded sum must be: the hint is not enough.)"""
        e = sympify(e)
        if e.is_Integer:
            return int(e)
        syms = sorted(e.free_symbols, key=str)
        if not syms or not self.is_size_expr(e) or any(self.var_to_range.get(s, (2, None))[1] is None for s in syms):
            return None
        p = sympy.expand(e)
        if not _grows_with(p, syms):
            return None
        return int(p.xreplace({s: sympy.Integer(self.var_to_range[s][1]) for s in syms}))

    def size_hints(self, es) -> tuple:
        return tuple(self.size_hint(e) for e in es)

    def evaluate_static_shape(self, e) -> int:
        """``e`` as an int when it is one for every value of the symbols; else SymbolicSizeError."""
        e = self.simplify(e)
        if not e.is_Integer:
            raise SymbolicSizeError(f"size {e} is symbolic where this stage needs a static size")
        return int(e)

    def simplify(self, e) -> sympy.Expr:
        e = sympify(e)
        return e if e.is_Integer else sympy.simplify(e)

    def is_static(self, e) -> bool:
        return sympify(e).is_Integer

    def is_size_expr(self, e) -> bool:
        """Is ``e`` an expression of sizes only (integers, this graph's symbols, the arithmetic
        and the floor/ceiling/Mod/Max/Min of sizes) — not of loop variables or unknown functions?"""
        e = sympify(e)
        if e.is_Integer:
            return True
        if not e.free_symbols <= self.symbols or e.has(sympy.Derivative, sympy.Subs):
            return False
        return all(isinstance(f, _SIZE_FUNCTIONS) for f in e.atoms(sympy.Function))

    # -- proofs ------------------------------------------------------------------------------------
    def _nonnegative(self, e) -> bool:
        """Is ``e >= 0`` for every value of the symbols in their ranges?  Each ``floor(p / q)``
        and ``Mod(a, q)`` is first replaced by its lower bound plus a non-negative unknown (or
        its upper bound minus one: :func:`_integer_parts`, both tried); then each symbol ``s`` in
        ``[lo, hi]`` is written ``lo + t`` (and ``hi - u``) with ``t, u >= 0``, and sympy's sign
        assumptions decide polynomials with the right signs (sound, not complete).  Failing that,
        each equality guard of the capture (:meth:`equalities`) is substituted and the proof retried:
        the key checks those guards on every call, so they hold wherever the kernel runs."""
        e = sympy.expand(sympify(e))
        if self._nonnegative_by_ranges(e):
            return True
        # the capture's equalities (shape guards the key checks, e.g. s0*s1 == s2*s3 after a
        # view(-1) of two inputs that an op needs equal): each side substituted for the other
        # and each inequality guard g >= 0: e >= 0 when e - g >= 0 is proved by the ranges
        eqs, ineqs = self.facts()
        for lhs, rhs in eqs:
            for a, b in ((lhs, rhs), (rhs, lhs)):
                f = sympy.expand(e.subs(a, b))
                if f != e and self._nonnegative_by_ranges(f):
                    return True
        return any(self._nonnegative_by_ranges(sympy.expand(e - c * g)) for g in ineqs for c in _multipliers(e, g))

    def equalities(self) -> list:
        """``(lhs, rhs)`` of each equality guard of the capture (:meth:`facts`)."""
        return self.facts()[0]

    def facts(self) -> tuple:
        """What the capture's ShapeEnv guarded about this graph's symbols: ``(equalities, g)`` —
        ``(lhs, rhs)`` of each equality (a product of sizes that is no single symbol's
        replacement, e.g. two flattened inputs an op needs equal) and each inequality as ``g``
        with ``g >= 0`` (an index at most an input's size).  The specialisation key checks every
        such guard on every call, so a kernel may rely on them."""
        env = self.shape_env
        guards = env.guards if env is not None else ()
        if self._facts is not None and self._facts[0] == len(guards):   # (guards are only appended)
            return self._facts[1]
        eqs, ineqs = [], []
        for g in guards:
            c = env.replace(g.expr)
            if not isinstance(c, sympy.core.relational.Relational) or c.rel_op == "!=":
                continue
            lhs, rhs = (sympy.expand(_from_torch_expr(x)) for x in c.args)
            if not (lhs.free_symbols | rhs.free_symbols) <= self.symbols or (lhs - rhs).is_Number \
                    or lhs.atoms(sympy.Function) or rhs.atoms(sympy.Function):
                continue    # (polynomial facts only: a substitution into floor/Mod need not terminate)
            if c.rel_op == "==":
                eqs.append((lhs, rhs))
            else:   # >=, >, <=, <: integer sizes, so a strict relation is one more
                d = lhs - rhs if c.rel_op in (">=", ">") else rhs - lhs
                ineqs.append(sympy.expand(d - 1 if c.rel_op in (">", "<") else d))
        self._facts = (len(guards), (eqs, ineqs))
        return eqs, ineqs

    def _nonnegative_by_ranges(self, e) -> bool:
        if e.is_Number:
            return bool(e >= 0)
        if not self.is_size_expr(e):
            return False
        # an integer-valued e (integer coefficients) is >= 0 as soon as it is > -1
        integral = all(t.as_coeff_Mul()[0].is_Integer for t in sympy.Add.make_args(e))
        for side in ("lower", "upper"):
            f = _integer_parts(e, side)
            if f is None:
                continue
            if self._polynomial_nonnegative(f):
                return True
            den = sympy.ilcm(1, *(sympy.fraction(t.as_coeff_Mul()[0])[1] for t in sympy.Add.make_args(sympy.expand(f))))
            if integral and self._polynomial_nonnegative(f + 1 - sympy.Rational(1, den)):
                return True
        f = self._floors_as_unknowns(e)
        return f is not None and self._polynomial_nonnegative(f)

    def _floors_as_unknowns(self, e):
        """``e`` with each ``floor(p / q)`` of a ``p`` that grows with its symbols written
        ``floor(p_min / q) + t`` (``p_min``: ``p`` at the symbols' lower bounds; ``t >= 0``), each
        ``Mod`` as ``t``: an integer lower bound kept (``2*floor(s/2) - 2 >= 0`` for ``s >= 2``, which
        the relaxation ``floor(y) >= y - 1 + 1/q`` loses).  None if an atom has no such form."""
        sub = {}
        for k, a in enumerate(sorted(e.atoms(sympy.floor, sympy.Mod), key=str)):
            t = sympy.Symbol(f"_f{k}", integer=True, nonnegative=True)
            if isinstance(a, sympy.Mod):
                sub[a] = t
                continue
            num, den = sympy.fraction(sympy.together(a.args[0]))
            syms = sorted(num.free_symbols, key=str)
            if not den.is_Integer or den <= 0 or not syms or not num.free_symbols <= self.symbols \
                    or not _grows_with(num, syms):
                return None
            low = num.xreplace({x: sympy.Integer(self.var_to_range[x][0]) for x in syms})
            sub[a] = sympy.floor(low / den) + t
        return e.xreplace(sub) if sub else None

    def _polynomial_nonnegative(self, e) -> bool:
        e = sympy.expand(e)
        if e.is_Number:
            return bool(e >= 0)
        syms = e.free_symbols & self.symbols
        low = {s: self.var_to_range[s][0] + sympy.Symbol(f"_t_{s}", integer=True, nonnegative=True) for s in syms}
        if sympy.expand(e.xreplace(low)).is_nonnegative:
            return True
        if all(self.var_to_range[s][1] is not None for s in syms):
            high = {s: self.var_to_range[s][1] - sympy.Symbol(f"_u_{s}", integer=True, nonnegative=True)
                    for s in syms}
            return bool(sympy.expand(e.xreplace(high)).is_nonnegative)
        return False

    def statically_known_equals(self, a, b) -> bool:
        a, b = sympify(a), sympify(b)
        if a.is_Integer and b.is_Integer:
            return a == b
        d = sympy.expand(a - b)
        return d == 0 if d.is_Number else (self.is_size_expr(d) and self.simplify(d) == 0)

    def statically_known_leq(self, a, b) -> bool:
        a, b = sympify(a), sympify(b)
        if a.is_Integer and b.is_Integer:
            return bool(a <= b)
        if b.is_Integer:       # a polynomial bounded by its symbols' upper bounds (an int32 index)
            ub = self.size_upper_bound(a)
            if ub is not None and ub <= int(b):
                return True
        return self._nonnegative(sympify(b) - sympify(a))

    def statically_known_lt(self, a, b) -> bool:
        a, b = sympify(a), sympify(b)
        if a.is_Integer and b.is_Integer:
            return bool(a < b)
        return self._nonnegative(sympify(b) - sympify(a) - 1)

    def statically_known_multiple_of(self, e, m) -> bool:
        """Is ``e`` divisible by the integer ``m`` for every value of the symbols?  (A polynomial
        in the symbols whose every coefficient is.)"""
        e, m = sympify(e), int(m)
        if e.is_Integer:
            return int(e) % m == 0
        if not self.is_size_expr(e):
            return False
        syms = sorted(e.free_symbols, key=str)
        e = sympy.expand(e)
        if not e.is_polynomial(*syms):
            return False
        return all(c.is_Integer and int(c) % m == 0 for c in sympy.Poly(e, *syms).coeffs())

    def statically_known_true(self, cond) -> bool:
        """Does the relation ``cond`` (``a <= b``, ``Eq(a, b)``, ...; or a bool) hold for every
        value of the symbols?"""
        cond = sympy.sympify(cond)
        if cond in (sympy.true, sympy.false):
            return bool(cond)
        a, b = cond.lhs, cond.rhs
        if isinstance(cond, sympy.Eq):
            return self.statically_known_equals(a, b)
        if isinstance(cond, sympy.Ne):
            return self.statically_known_lt(a, b) or self.statically_known_lt(b, a)
        if isinstance(cond, sympy.Le):
            return self.statically_known_leq(a, b)
        if isinstance(cond, sympy.Lt):
            return self.statically_known_lt(a, b)
        if isinstance(cond, sympy.Ge):
            return self.statically_known_leq(b, a)
        if isinstance(cond, sympy.Gt):
            return self.statically_known_lt(b, a)
        return False

    def guard_equals(self, a, b) -> sympy.Expr:
        """``a``, after making sure ``a == b``: proved, or true at the hints and recorded in
        :attr:`guards` (the input check tests it); raises ValueError when false at the hints."""
        if self.statically_known_equals(a, b):
            return sympify(a)
        if self.size_hint(a) != self.size_hint(b):
            raise ValueError(f"sizes {a} and {b} differ ({self.size_hint(a)} != {self.size_hint(b)})")
        self.guards.append(sympy.Eq(sympify(a), sympify(b)))
        return sympify(a)

    # -- layouts -----------------------------------------------------------------------------------
    def contiguous_strides(self, size) -> tuple:
        """Row-major strides of ``size`` (a size-0 dim counts as 1, as torch's)."""
        strides, acc = [], sympy.Integer(1)
        for s in reversed(size):
            strides.append(acc)
            s = sympify(s)
            acc = acc * (s if not s.is_Integer and self.statically_known_leq(1, s) else sympy.Max(s, 1))
        return tuple(reversed(strides))


def _integer_parts(e, side: str):
    """``e`` with each ``floor(p / q)`` (integer ``q > 0``) written ``(p - q + 1)/q + t`` (``side=
    "lower"``: floor(y) >= y - 1 + 1/q) or ``p/q - t`` ("upper"), and each ``Mod(a, q)`` written
    ``t`` or ``q - 1 - t`` (integer q), ``t`` a fresh non-negative unknown: an expression that
    equals ``e`` for some ``t >= 0``, so it is non-negative for every ``t >= 0`` only if ``e`` is.
    None for nested or non-constant divisions."""
    atoms = sorted(e.atoms(sympy.floor, sympy.Mod), key=str)
    sub = {}
    for k, a in enumerate(atoms):
        if any(x.has(sympy.floor, sympy.Mod) for x in a.args):
            return None
        t = sympy.Symbol(f"_k{k}", integer=True, nonnegative=True)
        if isinstance(a, sympy.floor):
            num, den = sympy.fraction(sympy.together(a.args[0]))
            if not den.is_Integer or den <= 0:
                return None
            sub[a] = (num - den + 1) / den + t if side == "lower" else num / den - t
        else:
            q = a.args[1]
            if side == "lower":
                sub[a] = t
            elif q.is_Integer:
                sub[a] = q - 1 - t
            else:
                return None
    return e.xreplace(sub)


def _grows_with(p, syms) -> bool:
    """Is ``p`` a polynomial in ``syms`` that grows with each of them (no negative coefficient but
    the constant term's)?  Its least and largest values are then at the symbols' range ends."""
    return p.is_polynomial(*syms) and not any(c < 0 for m, c in sympy.Poly(p, *syms).terms() if any(m))


def _multipliers(e, g) -> list:
    """Positive ``c`` for which ``e - c*g`` cancels a term of ``g`` (``3*s0 - 3*s1 + 6`` against
    ``g = s0 - s1 + 2``: ``c = 3``; ``s2*s0 - s2*s1 + 2*s2``: ``c = s2``, a size), 1 first: the
    multiples of a fact ``g >= 0`` worth subtracting (``c*g >= 0`` for ``c > 0``)."""
    out = [sympy.Integer(1)]
    for t in sympy.Add.make_args(g):
        c, m = t.as_coeff_Mul()
        if m != 1:
            r = sympy.expand(e).coeff(m) / c     # a positive number, or a positive monomial of sizes
            if r != 0 and r.is_positive and not r.is_Add and r not in out:
                out.append(r)
    return out


def _finite(v):
    """A ValueRanges end point as an int, None when infinite (torch's int_oo)."""
    try:
        return int(v)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _backed_hint(env, s):
    from ...capture.fakes import sample_values
    v = sample_values(env).get(s)
    return None if v is None or not sympy.sympify(v).is_Integer else int(v)


def _from_torch_expr(e: sympy.Expr) -> sympy.Expr:
    """``e`` with torch's sympy size functions (torch.utils._sympy.functions) as sympy's."""
    from torch.utils._sympy import functions as F
    if e.is_Atom:
        return e
    args = [_from_torch_expr(a) for a in e.args]
    t = type(e)
    if t is F.FloorDiv:
        return sympy.floor(args[0] / args[1])
    if t is F.CeilDiv:
        return sympy.ceiling(args[0] / args[1])
    if t is F.CleanDiv:
        return args[0] / args[1]
    if t is F.ModularIndexing:
        return sympy.Mod(sympy.floor(args[0] / args[1]), args[2])
    if t in (F.Mod, F.PythonMod):
        return sympy.Mod(*args)
    if t is F.Max:
        return sympy.Max(*args)
    if t is F.Min:
        return sympy.Min(*args)
    if t is F.Identity:
        return args[0]
    if t.__module__.startswith("torch."):
        raise SymbolicSizeError(f"size function {t.__name__} of {e} has no Stax equivalent")
    return e.func(*args)


def to_torch_expr(e: sympy.Expr) -> sympy.Expr:
    """The inverse of :func:`_from_torch_expr`: sympy's floor/ceiling of a quotient and Mod as
    torch's FloorDiv, CeilDiv and Mod (what a ShapeEnv's SymNodes hold)."""
    from torch.utils._sympy import functions as F
    if e.is_Atom:
        return e
    args = [to_torch_expr(a) for a in e.args]
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(args[0]))
        return (F.FloorDiv if isinstance(e, sympy.floor) else F.CeilDiv)(num, den)
    if isinstance(e, sympy.Mod):
        return F.Mod(*args)
    return e.func(*args)


_STATIC = SizeVarAllocator()
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("tp_stax_sizevars", default=_STATIC)


def current() -> SizeVarAllocator:
    """The allocator of the graph being compiled (a static one outside a compilation)."""
    return _CURRENT.get()


@contextlib.contextmanager
def use(allocator: SizeVarAllocator):
    """Make ``allocator`` the one the module-level functions ask, inside the block."""
    token = _CURRENT.set(allocator)
    try:
        yield allocator
    finally:
        _CURRENT.reset(token)


def _ask_current(name):
    """The module-level ``name``: the method of the same name of :func:`current`'s allocator."""
    method = getattr(SizeVarAllocator, name)

    def ask(*args):
        return method(current(), *args)
    ask.__name__ = ask.__qualname__ = name
    ask.__doc__ = method.__doc__
    return ask


size_hint = _ask_current("size_hint")
size_hints = _ask_current("size_hints")
size_upper_bound = _ask_current("size_upper_bound")
is_static = _ask_current("is_static")
is_size_expr = _ask_current("is_size_expr")
evaluate_static_shape = _ask_current("evaluate_static_shape")
from_torch = _ask_current("from_torch")
statically_known_true = _ask_current("statically_known_true")
statically_known_equals = _ask_current("statically_known_equals")
statically_known_leq = _ask_current("statically_known_leq")
statically_known_lt = _ask_current("statically_known_lt")
statically_known_multiple_of = _ask_current("statically_known_multiple_of")
guard_equals = _ask_current("guard_equals")
contiguous_strides = _ask_current("contiguous_strides")


def numel(size) -> sympy.Expr:
    """The product of ``size`` (1 for ``()``) as an expression."""
    return sympify(math.prod(size, start=sympy.Integer(1)))
