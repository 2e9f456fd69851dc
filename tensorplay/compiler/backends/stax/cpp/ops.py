"""C++ of a compute function: the ``ops`` handler of the C++ kernels (the chapter, §8.2).

:class:`CppHandler` evaluates a node's compute function inside the current loop body of the
kernel being printed (codegen/cpp.py): every ``ops`` call becomes one line of C++ over
``tp::Vec<T>`` values (cpp_prelude.h), common subexpressions are printed once.  Loads pick the
cheapest form the index allows -- a plain or masked vector load, a broadcast, a strided gather, a
periodic or lane-pattern load for Mod/floor of the vector variable, a checked gather for a
data-dependent index bounds.py could not prove in range; masks built from affine index
conditions are tested per vector (a vector entirely inside a ``masked`` region runs it with plain
loads).  ``mode`` is ``"vec"`` (a full vector), ``"tail"`` (the first ``n`` lanes) or ``"row"``
(a row value: lane 0).  Guarantee: the printed C++ computes what the compute function says, in
the dtypes it names; indices are printed as :func:`cexpr` integer arithmetic.
"""
from __future__ import annotations

import math
import operator
import re

import sympy
import torch

from ..bounds import IndirectIndex, _size_fraction, _size_symbols, bound
from ..ir import Unsupported
from ..ops_handler import COMPARE

__all__ = ["CppHandler", "CTYPE", "STORAGE_CTYPE", "cexpr", "vec_type", "literal"]

CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
         torch.bool: "int32_t"}   # bool values live as 0/1 int32 lanes in registers
STORAGE_CTYPE = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
                 torch.bool: "bool"}


def vec_type(dtype):
    try:
        return f"tp::Vec<{CTYPE[dtype]}>"
    except KeyError:
        raise Unsupported(f"dtype {dtype} in a native kernel") from None


def literal(v, dtype):
    if dtype == torch.bool:
        return "1" if v else "0"
    if dtype.is_floating_point:
        ct = CTYPE[dtype]
        v = float(v)
        if math.isnan(v):
            return f"std::numeric_limits<{ct}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{ct}>::infinity()"
        r = repr(v)
        if "e" not in r and "." not in r:
            r += ".0"
        return r + ("f" if dtype == torch.float32 else "")
    iv = int(v)
    if dtype == torch.int64:
        return f"int64_t({iv}LL)" if abs(iv) > 2**31 - 1 else f"int64_t({iv})"
    return f"int32_t({iv})"


class _Val:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype

    def __str__(self):
        return self.name


def cexpr(e) -> str:
    """Print a sympy index expression as C++ integer arithmetic: affine terms, ``Mod(a, q)`` as
    ``a % q`` (a symbolic ``q``: the floored ``((a % q) + q) % q``) and ``floor(p / q)`` as ``p / q`` (truncation == floor: bounds.py proves ``a, p >= 0``
    before a kernel is generated).  Symbols print as C++ variables (loop variables, or a
    ``tp::Vec<int64_t>`` of lane indices / checked indices in gathers)."""
    e = sympy.expand(e)
    if e.is_Integer:
        return f"{int(e)}"
    if e.is_Symbol:
        return e.name
    if e.is_Add:
        return "(" + " + ".join(cexpr(a) for a in e.args) + ")"
    if e.is_Mul:
        if any(a.is_Rational and not a.is_Integer for a in e.args):
            raise Unsupported(f"fractional index expression {e}")
        return "(" + " * ".join(cexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer:
        return f"({cexpr(e.args[0])} % {int(e.args[1])})"
    if isinstance(e, sympy.Mod) and e.args[1].free_symbols <= _size_symbols():
        # a modulus of size arguments (roll, repeat along a symbolic dim): sympy drops multiples of
        # it from the argument, whose sign is then unknown -- a floored modulo, right for either sign
        q = cexpr(e.args[1])
        return f"((({cexpr(e.args[0])} % {q}) + {q}) % {q})"
    if isinstance(e, sympy.floor):
        num, den = _size_fraction(e.args[0])      # (a symbolic divisor: a size argument)
        return f"({cexpr(num)} / {den if isinstance(den, int) else cexpr(den)})"
    if e.is_Pow and e.exp.is_Integer and 0 < int(e.exp) <= 4:     # a size squared: repeated products
        return "(" + " * ".join([cexpr(e.base)] * int(e.exp)) + ")"
    raise Unsupported(f"non-affine index expression {e}")


def _atoms_of(expr, v) -> list:
    """The ``Mod``/``floor`` atoms of ``expr`` that read the variable ``v``, in a fixed order (by
    their text): a set's order follows the hash seed, and the code printed from the atoms -- and
    which of them a rule looks at first -- must not differ between processes."""
    return sorted((a for a in expr.atoms(sympy.Mod, sympy.floor) if v in a.free_symbols), key=str)


class CppHandler:
    """Prints ``ops`` calls as C++ lines inside the current loop body."""

    def __init__(self, kernel, mode):
        self.k = kernel
        self.mode = mode           # "vec", "tail" or "row"
        self.lines = []
        self.cse = {}
        self._mask = None          # the enclosing ops.masked condition (a bool _Val), if any
        self._ind = {}             # IndirectIndex tag -> C++ variable of the checked index
        self._ind_expr = {}        # IndirectIndex tag -> its value as an index expression, when proved in range
        self._uniform = set()      # variables with the same value in every lane (broadcast loads)
        self._sym = {}             # variable -> sympy value of index arithmetic and its comparisons (masks)
        self._ind_op = {}          # IndirectIndex tag -> the op its check message names ("tp.gather")

    def _emit(self, expr, dtype):
        key = (expr, dtype)
        if key in self.cse:
            return self.cse[key]
        name = self.k.tmp()
        self.lines.append(f"auto {name} = {expr};")
        v = _Val(name, dtype)
        self.cse[key] = v
        return v

    # -- memory and indices ---------------------------------------------------------------------------
    def load(self, name, index):
        k = self.k
        local = k.local_value(name, self)
        if local is not None:
            return local
        dtype = k.dtype_of(name)
        k.loaded.add(name)
        expr = k.scratch_expr() if name in k.scratch else k.translate(index)
        vt = vec_type(dtype)
        ptr = k.ptr(name)
        ind = expr.atoms(IndirectIndex)
        known = {a: self._ind_expr[int(a.args[0])] for a in ind if int(a.args[0]) in self._ind_expr}
        if known:   # indices computed from loop variables (arange in embedding): a direct access
            expr = sympy.expand(expr.xreplace(known))
            ind = expr.atoms(IndirectIndex)
        if any(a.args[1] == 0 for a in ind):
            # an index into an empty dim: every active lane has reported an error; read nothing
            return self._emit(f"{vt}({literal(0, dtype)})", dtype)
        if ind and name in k.checked_loads:
            return self._checked_gather(ptr, name, expr, dtype, ind)
        if ind and all(self._ind[int(a.args[0])] in self._uniform for a in ind):
            # the same checked index in every lane (e.g. embedding rows): an ordinary affine load
            expr = expr.xreplace({a: sympy.Symbol(f"{self._ind[int(a.args[0])]}[0]", integer=True) for a in ind})
            ind = ()
        if ind or not self._affine_in_vec(expr):
            return self._gather(ptr, expr, dtype)
        coeff = k.inner_coeff(expr)
        base = cexpr(expr)
        if self._mask is not None:   # only active lanes read memory (stax_kernel.h)
            fn = "tp_masked_load_bool" if dtype == torch.bool else f"tp_masked_load<{CTYPE[dtype]}>"
            return self._emit(f"{fn}({ptr}, {base}, {coeff}, {self._mask}, {self._nl()})", dtype)
        if dtype == torch.bool:
            return self._emit(f"tp_load_bool({ptr} + {base}, {coeff}, {self._n()})", dtype)
        if self.mode == "row" or coeff == 0:
            v = self._emit(f"{vt}({ptr}[{base}])", dtype)
            self._uniform.add(v.name)
            return v
        if coeff == 1:
            if self.mode == "tail":
                return self._emit(f"{vt}::loadn({ptr} + {base}, n)", dtype)
            if k.stream_loads is not None:
                k.vec_loads.add((name, base))    # every unit-stride load of the loop (split_loads)
                if k.vec_var is k.prefetch_var:
                    k.stream_loads.setdefault((name, base), dtype)
            return self._emit(f"{vt}::load({ptr} + {base})", dtype)
        return self._emit(f"tp_gather<{CTYPE[dtype]}>({ptr} + {base}, {coeff}, {self._n()})", dtype)

    def _n(self):
        return "n" if self.mode == "tail" else "VL"

    def _nl(self):
        """Active lanes: a row value lives in lane 0 only."""
        return "1" if self.mode == "row" else self._n()

    def _active(self):
        return str(self._mask) if self._mask is not None else "tp::Vec<int32_t>(1)"

    # -- masks, per-lane index vectors and gathers (bounds.py proves them; stax_kernel.h) ---------------
    def _affine_in_vec(self, expr):
        v = self.k.vec_var
        return v is None or self.mode == "row" or not any(
            v in a.free_symbols for a in expr.atoms(sympy.Mod, sympy.floor))

    def _lane_expr(self, expr, emit=True):
        """``expr`` as a C++ ``tp::Vec<int64_t>``: one index per lane (the vector-loop variable
        becomes its lane vector, checked indices their variables); ``emit=False``: the C++
        expression itself, not a variable."""
        subs = {a: self._ind_expr[t] if t in self._ind_expr else sympy.Symbol(self._ind[t], integer=True)
                for a in expr.atoms(IndirectIndex) for t in (int(a.args[0]),)}
        v = self.k.vec_var
        if v is not None and self.mode != "row" and v in expr.free_symbols:
            lanes = f"(tp::Vec<int64_t>::iota(0) + tp::Vec<int64_t>({v}))"
            subs[v] = sympy.Symbol(self._emit(lanes, torch.int64).name if emit else lanes, integer=True)
        e = f"tp::Vec<int64_t>({cexpr(expr.xreplace(subs))})"
        return self._emit(e, torch.int64) if emit else e

    def _gather(self, ptr, expr, dtype):
        fn = "tp_gather_off_bool" if dtype == torch.bool else f"tp_gather_off<{CTYPE[dtype]}>"
        fast = None if dtype == torch.bool or expr.atoms(IndirectIndex) else self._periodic(expr)
        pattern = None if dtype == torch.bool or expr.atoms(IndirectIndex) or self._mask is not None \
            else self._lane_pattern(expr)
        if fast is None and pattern is None:
            off = self._lane_expr(expr)
            return self._emit(f"{fn}({ptr}, {off}, {self._active()}, {self._nl()})", dtype)
        code = f"{fn}({ptr}, {self._lane_expr(expr, emit=False)}, {self._active()}, {self._nl()})"   # lane by lane
        if fast is not None:
            # Mod/floor of the vector variable (repeat, tile): a vector inside one period is an affine
            # load from the scalar index of its first lane; only one that wraps is gathered lane by lane
            test, base, coeff = fast
            direct = f"tp_masked_load<{CTYPE[dtype]}>({ptr}, {base}, {coeff}, {self._active()}, {self._nl()})"
            code = f"(({test}) ? {direct} : [&] {{ return {code}; }}())"
        if pattern is not None:
            test, base, lanes = pattern
            code = (f"(({test}) ? tp_pattern_load<{CTYPE[dtype]}, {', '.join(map(str, lanes))}>({ptr} + {base}, "
                    f"{self._nl()}) : {code})")
        return self._emit(code, dtype)

    def _checked_gather(self, ptr, name, expr, dtype, ind):
        """A data-dependent load that bounds.py could not prove in range: its element offsets are
        checked in the kernel against the buffer's extent like a checked index (a bad active lane
        reports an IndexError naming the ops of its indices and reads element 0), so no lane ever
        reads outside the buffer.  The indices were checked against their dims first, so with a
        correct lowering this check never fires; it makes a weak proof cost speed, not safety."""
        ops_ = sorted({self._ind_op.get(int(a.args[0]), "tp.index") for a in ind})
        extent = self.k.extents[name]
        msg = (f"IndexError: {'/'.join(ops_)}: element offset {{value}} is out of bounds for {name} of "
               f"{extent} elements (run-time check of an index Stax could not prove in range)")
        tag = self.indirect_indexing(self._lane_expr(expr), extent, False, msg)
        off = self._ind[tag]
        fn = "tp_gather_off_bool" if dtype == torch.bool else f"tp_gather_off<{CTYPE[dtype]}>"
        return self._emit(f"{fn}({ptr}, {off}, {self._active()}, {self._nl()})", dtype)

    def _lane_pattern(self, expr):
        """For an index linear in Mod/floor atoms of the vector variable v (``floor((c*v + r)/q)``,
        ``Mod(c*v + r, q)``, integer c, q) whose period L in v divides 16: (C++ test that the
        vector starts a period -- every atom's argument at lane 0 is a multiple of its q, and VL %
        L == 0 --, C++ scalar index of lane 0, the 16 lane offsets from it), or None.  Inside a
        period the offsets do not depend on where the vector is: lane k adds ``floor(c*k/q)``
        (``Mod(c*k, q)``) per atom, times its coefficient, to the linear part's ``a*k``."""
        v = self.k.vec_var
        if v is None or self.mode == "row":
            return None
        atoms = _atoms_of(expr, v)
        if not atoms:
            return None
        syms, parts, period, tests = {}, [], 1, []
        for j, a in enumerate(atoms):
            if isinstance(a, sympy.Mod):
                arg, q = sympy.expand(a.args[0]), a.args[1]
            else:
                arg, q = sympy.fraction(sympy.together(a.args[0]))
                arg = sympy.expand(arg)
            # a modulus or divisor that is a size argument (roll, repeat along a symbolic dim) has
            # no period known at compile time: no lane pattern, whichever atom comes first
            if not q.is_Integer or int(q) <= 0 or arg.atoms(sympy.Mod, sympy.floor):
                return None
            q, c = int(q), sympy.diff(arg, v)
            if not c.is_Integer:
                return None
            period = math.lcm(period, q // math.gcd(int(c), q))
            syms[a] = sympy.Symbol(f"_atom{j}", integer=True)
            parts.append((syms[a], isinstance(a, sympy.Mod), int(c), q))
            tests.append(f"(({cexpr(arg)}) % {q} == 0)")
        lin = expr.xreplace(syms)
        coef = {s: sympy.diff(lin, s) for s in syms.values()}
        a_v = sympy.diff(lin, v)
        # integer coefficients also mean lin is linear in v and in every atom (no products)
        if not (a_v.is_Integer and all(c.is_Integer for c in coef.values())) or 16 % period:
            return None
        lanes = [int(a_v) * k + sum(int(coef[s]) * ((c * k) % q if is_mod else (c * k) // q)
                                    for s, is_mod, c, q in parts) for k in range(16)]
        if min(lanes) < 0 or max(lanes) > 15 or lanes[0] != 0:
            return None
        return f"(VL % {period} == 0) && " + " && ".join(tests), cexpr(expr), lanes

    def _periodic(self, expr):
        """For an index with Mod/floor atoms of the vector variable v: (C++ test that the vector's
        lanes see no wrap, C++ scalar index of lane 0, lane stride), or None."""
        v = self.k.vec_var
        if v is None or self.mode == "row":
            return None
        last = v + sympy.Symbol("n" if self.mode == "tail" else "VL", integer=True) - 1
        tests, lin = [], {}
        for a in _atoms_of(expr, v):
            if isinstance(a, sympy.Mod):
                arg, q = a.args
                c = sympy.diff(arg, v)
                if not (c.is_Integer and q.is_Integer) or arg.atoms(sympy.Mod, sympy.floor):
                    return None
                tests.append(f"({cexpr(a.subs(v, last))} - {cexpr(a)} == {int(c)} * ({cexpr(last - v)}))")
                lin[a] = arg
            else:
                if a.args[0].atoms(sympy.Mod, sympy.floor):
                    return None
                tests.append(f"({cexpr(a.subs(v, last))} == {cexpr(a)})")
                lin[a] = sympy.Integer(0)
        coeff = sympy.diff(expr.xreplace(lin), v)
        if not coeff.is_Integer or not tests:
            return None
        return " && ".join(tests), cexpr(expr), int(coeff)

    def masked(self, mask, body, other):
        """Lanes where ``mask`` is false never touch memory (every load of ``body`` is a masked
        load, see :meth:`load`) and give ``other``.  The body runs only if some lane is active;
        when the mask is a conjunction of affine index conditions (cat, pad, roll) it is tested on
        the first and last lane of the vector (monotone): a vector entirely inside runs the body with
        plain loads, one entirely outside skips it — a per-vector loop split."""
        prev = self._mask
        o = other if isinstance(other, _Val) else None
        r = self.k.tmp()
        tests = self._range_tests(self._sym.get(mask.name))
        masked_mask = mask if prev is None else self.logical_and(prev, mask)
        branches = []
        if tests is not None:
            branches.append((tests[0], prev, False))
            if tests[1] == "false":
                tests = None
        branches.append((None if tests is None else f"!({tests[1]})", masked_mask, True))
        lines = []
        for k, (test, m, select) in enumerate(branches):
            body_lines, v = self._in_block(m, body)
            if o is None:
                o = self.to_dtype(self.constant(other, v.dtype), v.dtype)
            head = "if" if k == 0 else "} else if"
            lines.append(f"{head} ({test if test is not None else f'tp::reduce_max({mask}) != 0'}) {{")
            lines += ["    " + ln for ln in body_lines]
            lines.append(f"    {r} = tp::where(tp_mask_from_bool<{CTYPE[v.dtype]}>({mask}), {v}, {o});" if select
                         else f"    {r} = {v};")
        o = self.to_dtype(o, v.dtype)
        self.lines.append(f"{vec_type(v.dtype)} {r} = {o};")
        self.lines += lines + ["}"]
        return _Val(r, v.dtype)

    def _in_block(self, mask, body):
        """Evaluate ``body`` under ``mask`` into separate lines; its values stay in the block."""
        outer_lines, outer_cse, prev = self.lines, self.cse, self._mask
        self.lines, self.cse, self._mask = [], dict(outer_cse), mask
        try:
            v = body()
        finally:
            body_lines, self.lines, self.cse, self._mask = self.lines, outer_lines, outer_cse, prev
        return body_lines, v

    def _range_tests(self, cond):
        """C++ (all lanes hold, no lane holds) for a conjunction of affine conditions in the loop
        variables, or None.  Affine in the vector variable means monotone over the lanes, so the
        first and the last active lane decide."""
        if cond is None:
            return None
        atoms = cond.args if isinstance(cond, sympy.And) else (cond,)
        v = self.k.vec_var if self.mode != "row" else None
        last = sympy.Symbol("n" if self.mode == "tail" else "VL", integer=True) - 1
        alls, nones = [], []
        for c in atoms:
            if c is sympy.true:
                continue
            if c is sympy.false:
                return "false", "true"
            if not isinstance(c, sympy.core.relational.Relational) or c.rel_op == "!=" or \
                    c.atoms(sympy.Function):
                return None
            e = sympy.expand(c.lhs - c.rhs)
            if v is not None and not sympy.diff(e, v).is_Integer:
                return None
            ends = [e] if v is None or v not in e.free_symbols else [e, e.subs(v, v + last)]
            holds = [f"({cexpr(x)} {c.rel_op} 0)" for x in ends]
            alls += holds
            if c.rel_op == "==" and len(ends) == 2:
                # e == 0 fails at both ends and may hold in between (select_backward's eq(i0, 1)
                # on lanes 0..3): no lane holds only if e keeps one strict sign over the lanes
                first, end = (cexpr(x) for x in ends)
                nones.append(f"((({first}) > 0 && ({end}) > 0) || (({first}) < 0 && ({end}) < 0))")
                continue
            nones.append("(" + " && ".join(f"!{h}" for h in holds) + ")")
        if not alls:
            return "true", "false"
        return " && ".join(alls), " || ".join(nones) if nones else "false"

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        """Check a loaded index against ``[0, size)`` in the kernel (see bounds.py); returns the tag
        of an :class:`IndirectIndex`.  ``check``: the error message, with ``{value}`` for the bad
        index; it starts with the exception's name ("IndexError: ..."), which the kernel's call
        raises (runtime.checked_kernel)."""
        if value.dtype.is_floating_point:
            raise Unsupported("a floating-point index")
        proved = self._proved_index(value, size)
        if proved is not None:       # index arithmetic on loop variables, provably in [0, size)
            tag = len(self._ind)
            self._ind[tag] = str(value)
            self._ind_expr[tag] = proved
            return tag
        msg = (check or "IndexError: index {value} is out of bounds for size " + str(size))
        op = re.match(r"\w+: (tp\.\w+)", msg)
        fmt = msg.replace("%", "%%").replace("{value}", "%lld").replace("\\", "\\\\").replace('"', '\\"')
        key = ("check", str(value), str(size), bool(wrap_negative), self._active(), self._nl(), fmt)
        if key not in self.cse:
            c = self.k.tmp()
            w = 1 if wrap_negative else 0
            if value.name in self._uniform and self._mask is None:   # every lane active, one value
                self.lines.append(f"const auto {c} = tp_check_index1(int64_t({value}[0]), int64_t({cexpr(size)}), {w});")
            else:
                self.lines.append(f"const auto {c} = tp_check_index({value}, int64_t({cexpr(size)}), {w}, "
                                  f"{self._active()}, {self._nl()});")
            self.lines.append(f'if ({c}.bad) tp_report_error(tp_index_text("{fmt}", {c}.value));')
            self.cse[key] = self._emit(f"{c}.idx", torch.int64)
            if value.name in self._uniform:
                self._uniform.add(self.cse[key].name)
        tag = len(self._ind)
        self._ind[tag] = self.cse[key].name
        if op:
            self._ind_op[tag] = op.group(1)
        return tag

    def _proved_index(self, value, size):
        """The index expression of ``value`` when it is arithmetic on loop variables (index_expr,
        constants, + - *) and bounds.py proves it in ``[0, size)``; else None."""
        e = self._sym.get(value.name)
        if not isinstance(e, sympy.Expr):
            return None
        k = self.k
        ranges = {m: (0, n - 1) for m, n in k.outer_loops + k.inner_loops}
        if k.vec_var is not None and k.inner_loops and not k.column:
            # the unrolled copy rm0_u = rm0 + u*VL of the vector variable stays in rm0's range
            ranges.setdefault(k.vec_var, ranges[k.inner_loops[-1][0]])
        try:
            iv = bound(e, ranges)
        except Unsupported:
            return None
        return e if iv.within(0, size - 1) else None

    def index_expr(self, expr, dtype):
        e = self.k.translate(expr)
        if e.atoms(IndirectIndex) or not self._affine_in_vec(e):
            v = self._lane_expr(e)
            return v if dtype == torch.int64 else self.to_dtype(v, dtype)
        coeff = self.k.inner_coeff(e) if self.mode != "row" else 0
        base = cexpr(e)
        v = self._emit(f"(tp::Vec<int64_t>::iota(0) * tp::Vec<int64_t>({coeff}) + tp::Vec<int64_t>({base}))"
                       if coeff else f"tp::Vec<int64_t>({base})", torch.int64)
        self._sym[v.name] = e
        return v if dtype == torch.int64 else self.to_dtype(v, dtype)

    def constant(self, value, dtype):
        v = self._emit(f"{vec_type(dtype)}({literal(value, dtype)})", dtype)
        if not dtype.is_floating_point and dtype != torch.bool:
            self._sym[v.name] = sympy.Integer(int(value))
        return v

    # -- random numbers: Philox4x32-10 of (seed, stream, element offset), cpp_prelude.h --------------
    def rand(self, seed, offset, stream, dtype):
        return self._emit(f"tp::philox_rand<{CTYPE[dtype]}>({seed}, {offset}, {int(stream)})", dtype)

    def randn(self, seed, offset, stream, dtype):
        return self._emit(f"tp::philox_randn<{CTYPE[dtype]}>({seed}, {offset}, {int(stream)})", dtype)

    def randint64(self, seed, offset, stream, low, high):
        return self._emit(f"tp::philox_randint({seed}, {offset}, {int(stream)}, {literal(low, torch.int64)}, "
                          f"{int(high) - int(low)}ULL)", torch.int64)

    def to_dtype(self, x, dtype, src_dtype=None):
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"tp_bool_from_mask({x} != {vec_type(x.dtype)}(0))", torch.bool)
        e = self._sym.get(x.name)
        if isinstance(e, sympy.Expr) and e.free_symbols and e.free_symbols <= _size_symbols():
            # a count of size arguments (mean's n): one scalar conversion, broadcast -- a vector
            # cast in the loop body is not hoisted by the C++ compiler
            v = self._emit(f"{vec_type(dtype)}(static_cast<{CTYPE[dtype]}>({cexpr(e)}))", dtype)
            self._uniform.add(v.name)
            return v
        return self._emit(f"tp::cast<{CTYPE[dtype]}>({x})", dtype)

    def where(self, c, a, b):
        return self._emit(f"tp::where(tp_mask_from_bool<{CTYPE[a.dtype]}>({c}), {a}, {b})", a.dtype)

    # -- arithmetic -------------------------------------------------------------------------------------
    def _int_arith(self, v, a, b, op):
        """Track integer index arithmetic symbolically (see _proved_index)."""
        if a.name in self._sym and b.name in self._sym and not v.dtype.is_floating_point:
            x, y = self._sym[a.name], self._sym[b.name]
            if isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr):   # not a comparison (mask)
                self._sym[v.name] = sympy.expand(op(x, y))
        return v

    def add(self, a, b):
        return self._int_arith(self._emit(f"({a} + {b})", a.dtype), a, b, operator.add)

    def sub(self, a, b):
        return self._int_arith(self._emit(f"({a} - {b})", a.dtype), a, b, operator.sub)

    def mul(self, a, b):
        return self._int_arith(self._emit(f"({a} * {b})", a.dtype), a, b, operator.mul)

    def truediv(self, a, b):
        return self._emit(f"({a} / {b})", a.dtype)

    def neg(self, a):
        return self._emit(f"(-{a})", a.dtype)

    def reciprocal(self, a):
        return self._emit(f"({vec_type(a.dtype)}({literal(1, a.dtype)}) / {a})", a.dtype)

    def logical_and(self, a, b):
        v = self._emit(f"({a} & {b})", torch.bool)
        if a.name in self._sym and b.name in self._sym:
            self._sym[v.name] = sympy.And(self._sym[a.name], self._sym[b.name])
        return v

    def logical_or(self, a, b):
        return self._emit(f"({a} | {b})", torch.bool)

    def logical_xor(self, a, b):
        return self._emit(f"({a} ^ {b})", torch.bool)

    def bitwise_and(self, a, b):
        return self._emit(f"({a} & {b})", a.dtype)

    def bitwise_or(self, a, b):
        return self._emit(f"({a} | {b})", a.dtype)

    def bitwise_xor(self, a, b):
        return self._emit(f"({a} ^ {b})", a.dtype)

    def bitwise_not(self, a):
        return self._emit(f"(~{a})", a.dtype)

    def logical_not(self, a):
        return self._emit(f"({a} ^ tp::Vec<int32_t>(1))", torch.bool)

    def bitwise_left_shift(self, a, b):
        return self._emit(f"({a} << {b})", a.dtype)   # torch: a count outside [0, bits) gives 0

    def bitwise_right_shift(self, a, b):
        return self._emit(f"({a} >> {b})", a.dtype)   # torch: ... gives the sign fill

    def _int_division(self, name, a, b, op=None):
        """Integer floordiv/truncdiv/remainder/fmod: a zero divisor in an active lane makes the
        kernel report ZeroDivisionError naming ``op`` (the op-table op the call computes, given by
        its lowering; default: the one of the same name) -- eager raises it; tp::floordiv etc.
        themselves return 0 and never trap.  The wrapper's kernel call raises it (async_compile,
        stax_kernel.h)."""
        vt = vec_type(b.dtype)
        zero = f"({b} == {vt}(0))"
        if self.mode == "tail":   # lanes past n were loaded as 0
            zero = f"({zero} & tp_tail_mask<{CTYPE[b.dtype]}>(n))"
        op = op or {"floordiv": "floor_divide", "truncdiv": "div"}.get(name, name)
        self.lines.append(f'if (tp::any({zero})) tp_report_error("tp.{op}: ZeroDivisionError '
                          f'(integer division by zero in a compiled kernel)");')
        return self._emit(f"tp::{name}({a}, {b})", a.dtype)

    def __getattr__(self, name):
        if name in COMPARE:
            sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
            return lambda a, b: self._emit(f"tp_bool_from_mask({a} {sym} {b})", torch.bool)
        if name in ("isnan", "isinf"):
            return lambda a: self._emit(f"tp_bool_from_mask(tp::{name}({a}))", torch.bool) \
                if a.dtype.is_floating_point else self._emit("tp::Vec<int32_t>(0)", torch.bool)
        if name in ("floordiv", "truncdiv", "remainder", "fmod"):
            return lambda a, b, op=None: self._emit(f"tp::{name}({a}, {b})", a.dtype) if a.dtype.is_floating_point \
                else self._int_division(name, a, b, op)
        if name in ("maximum", "minimum", "pow", "atan2", "hypot"):
            return lambda a, b: self._emit(f"tp::{name}({a}, {b})", a.dtype)
        if name in ("abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin",
                    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "erf", "erfc", "floor",
                    "ceil", "trunc", "round"):
            return lambda a: self._emit(f"tp::{name}({a})", a.dtype)
        raise AttributeError(name)


def _tracked_compare(name):
    """Comparisons as printed by ``CppHandler.__getattr__``, plus their sympy form when both sides
    are index arithmetic (a mask ``masked`` can test per vector, see ``_range_tests``)."""
    rel = {"lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge, "eq": sympy.Eq}[name]

    def compare(self, a, b):
        v = CppHandler.__getattr__(self, name)(a, b)
        if a.name in self._sym and b.name in self._sym:
            self._sym[v.name] = rel(self._sym[a.name], self._sym[b.name])
        return v
    return compare


for _name in ("lt", "le", "gt", "ge", "eq"):
    setattr(CppHandler, _name, _tracked_compare(_name))
