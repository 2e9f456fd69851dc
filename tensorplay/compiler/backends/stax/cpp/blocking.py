"""Cascade (blocked) accumulation of long floating-point sums and Welford reductions (§6.5).

A kernel's reduction keeps ``U`` vector accumulators of ``L`` lanes (row mode: ``U`` is the knob
``stax.cpp.unroll``, or ``stax.cpp.welford_unroll`` with a Welford update; column mode: one
accumulator per column vector whose lanes are independent columns, so ``L = U = 1`` per column), and each lane adds one term per step
of the innermost loop.  A lane that adds all of its ``k ≈ n/(L·U)`` terms into one float32
register stops growing at 2^24 (``ones(1, 2**30).sum(-1)`` gave 2^28) and its error bound grows
like ``k·u``.

When a lane may get more than ``FAN_IN`` terms, the kernel keeps a **cascade** of ``m`` levels per
accumulator: level 1 is the accumulator itself; after a block of ``FAN_IN`` steps it is folded into
level 2 (``blk2 += acc; acc = 0``; Welford: Chan's combine, ``tp::welford_combine``); level ``j`` is
folded into level ``j + 1`` after every ``FAN_IN`` folds into it; the top level takes the rest.
After the loops every level is folded downwards into the accumulator, which is then combined with
the others and across the lanes as before.  A block ends after ``FAN_IN`` steps of the innermost
loop; when that loop is shorter (a reduction over several loops that do not merge) after as many
whole passes as fit into ``FAN_IN`` steps; and at the end of a pass of a long loop, whose last
steps (the single vectors after the unrolled loop and the masked tail) join the open block.
``m`` (:func:`levels`) is chosen for the narrowest vector a kernel may be built for
(``MIN_LANES``: the width is only known when g++ runs, ``TP_VEC_BYTES``), so the top level never
takes more than ``FAN_IN`` folds; the kernel itself sizes blocks from its own ``VL`` (constexpr),
and where a lane gets no more than a block, nothing is folded.

**Error bound** (first order in u; u = 2^-24 for float32, 2^-53 for float64).  A term passes
through at most ``FAN_IN + U`` additions in its block, at most ``min(FAN_IN, f_j) + 1`` at level
``j`` (``f_j``: the folds level ``j`` receives, ``⌈B / FAN_IN^(j-2)⌉`` of ``B`` blocks), ``U - 1``
combines of accumulators and ``log2 L`` levels of the lanes' tree (``tp::reduce_add``); so the
computed ``Ŝ`` of ``S = Σ a_i`` satisfies

    |Ŝ - S| <= c · u · Σ|a_i|,    c <= m·(FAN_IN + 1) + 2U + log2(L)

with ``c`` = :func:`error_factor` (the exact count).  With ``FAN_IN = 64``: ``n = 2^31`` float32,
row mode on AVX-512 (``L·U = 32``, ``m = 5``): ``c = 272``, i.e. ``1.6e-5·Σ|a_i|``, where the
chapter's blocked model is ``2·sqrt(n) = 92682``; ``n = 2^24``: ``c = 205`` (model 8192).  ``c`` is
below ``2·sqrt(n)`` for every sum of more than ~4500 terms (every mode and width); shorter ones
keep the sequential bound of their lanes (``k + U + log2 L + 2``, a column: its length + 4), as
eager's short sums do.  Measured (uniform random float32, float64 reference): ``n = 2^31`` row sum
1.1 u relative error, as eager's (the kernels before: 0.5, their lanes stuck at 2^24); a random
row of 1024 summed over 2^20 expanded rows 0.04 u (eager 56545 u, the kernels before 686035 u).
Sums of small integers stay exact while every level's partial sums are (``ones`` up to 2^36).
A Welford state as narrow as its data (layer_norm's float32 statistics, float64 var) cascades
the same way, its ``m2`` through the same number of combines times the condition factor of
docs/stax.md; a wider state (float32 var's float64) keeps one level (:func:`blockable`).
max/min/any/all are exact and prod's relative error (``k·u``) does not depend on the order, so
they keep one level too.

**Cost.** One fold (``U`` vector adds and resets, a counter) per ``FAN_IN`` steps of at least
``2·U`` instructions: ~2 % more instructions in the loop; the levels above are touched once per
``FAN_IN^(j-1)`` blocks.  Predicted: nothing for sums streaming from memory, at most ~2 % in cache.
Measured (``benchmarks``-style interleaved rounds, t(cascade)/t(before), median [95% CI], 1 thread,
2026-12-01): row sum 16384×1024 0.976 [0.959, 1.007], 1024×16384 1.001 [0.989, 1.011], full sum
2^24 0.998, column sum 4096×2048 1.018 [0.997, 1.044], in cache (64×16384) 1.004 [0.994, 1.012];
Welford folds: layer_norm 1024×16384 0.994 [0.983, 1.002], float64 var 1024×8192 1.031 [0.988,
1.074] (float32 var with folds of its float64 state: 1.029-1.060, so it keeps one level).
"""
from __future__ import annotations

from .... import config

__all__ = ["FAN_IN", "MIN_LANES", "blockable", "levels", "error_factor", "Plan"]

# the knob stax.cpp.cascade (tensorplay/compiler/config.py) switches the cascade off: every lane adds
# all of its terms (the kernels before 2026-12-01; for comparisons)
FAN_IN = 64      # terms per lane of a block, and folds per level
MIN_LANES = 4    # the narrowest vector the kernels are built for (SSE4.2: 16 bytes of float32)


def blockable(rtype, acc_dtype, src_dtype) -> bool:
    """Reductions whose error grows with the terms a lane adds: floating sums, and Welford states
    as narrow as their data (layer_norm's float32 state, float64 var).  A wider state (float32
    var keeps float64, docs/stax.md) adds ``k·2^-53`` <= ``2^-27`` for ``k <= 2^26`` terms per
    lane, below the float32 result's own rounding, so it keeps one level (a fold there cost 3-6 %
    of a compute-bound var)."""
    if rtype == "welford":
        return acc_dtype.itemsize <= src_dtype.itemsize
    return rtype == "sum" and acc_dtype.is_floating_point


def levels(terms: int, passes: int) -> int:
    """Cascade levels (1: none) for at most ``terms`` terms per lane and pass of the innermost
    loop and ``passes`` passes: level 1 (a block) takes at most FAN_IN steps and the rest of a
    pass, so there are at most ``passes * (terms // FAN_IN + 2)`` blocks, and each further level
    takes FAN_IN folds of the one below."""
    if terms * passes <= FAN_IN:
        return 1
    blocks, m, cap = passes * (terms // FAN_IN + 2), 2, FAN_IN
    while cap < blocks:
        m, cap = m + 1, cap * FAN_IN
    return m


def error_factor(v: int, passes: int = 1, nacc: int = 2, lanes: int = 16, column: bool = False) -> int:
    """``c`` of ``|Ŝ - S| <= c·u·Σ|a_i|`` (first order) for a sum whose innermost loop has ``v``
    elements per pass and ``passes`` passes (the other reduced loops), as a kernel built for
    ``lanes`` lanes computes it (row mode: ``nacc`` accumulators; column mode: one lane per
    column): the most additions one term passes through (the module's error bound)."""
    if column:
        nacc, lanes = 1, 1
    tree = max(lanes.bit_length() - 1, 0)
    per_pass = (v if column else -(-v // (nacc * lanes)) + nacc)     # terms of the first accumulator
    total = per_pass * passes
    m = levels(v if column else -(-v // (nacc * MIN_LANES)) + nacc, passes) if config.get("stax.cpp.cascade") else 1
    if m == 1 or total <= FAN_IN:
        return total + nacc + tree + 2
    blocks = -(-total // FAN_IN) + passes          # the rest of every pass may end a block of its own
    depth = FAN_IN + nacc                          # a block (and the rest of a pass)
    for j in range(2, m + 1):
        depth += min(FAN_IN, -(-blocks // FAN_IN ** (j - 2))) + 1   # folds into level j, and its own fold
    return depth + nacc - 1 + tree


def _zero(rt, ct):
    return f"tp::WelfordAcc<{ct}>()" if rt == "welford" else f"tp::Vec<{ct}>({ct}(0))"


def _add(rt, a, b):
    return f"tp::welford_combine({a}, {b})" if rt == "welford" else f"({a} + {b})"


class Plan:
    """The C++ of one phase's cascaded accumulators.  ``specs``: (buffer, rtype, C++ element type)
    of the accumulators' leaders; ``nacc`` accumulators each; ``steps``: C++ constant, the steps
    of the innermost loop's main (unrolled) loop per pass; ``terms``: C++ constant, the terms the
    first accumulator gets per pass (the main loop's steps, the single vectors after it and the
    tail); ``passes``: the product of the other reduced loops' sizes; ``m``: levels
    (:func:`levels`).  Names carry the phase ``p``."""

    def __init__(self, p, specs, nacc, steps, terms, passes, m, static=True):
        # sizes are literals (constexpr) or, with ``static=False``, size arguments (const)
        self.specs, self.nacc, self.m, self.p = specs, nacc, m, p
        self.multi = passes > 1 if static else True    # (a symbolic size is at least 2)
        self.const, self.if_const = ("constexpr", "if constexpr") if static else ("const", "if")
        self.per_pass, self.block = f"blk_pass_{p}", f"blk_steps_{p}"
        self.every, self.count = f"blk_every_{p}", f"blk_count_{p}"
        self.decls = [f"{self.const} int64_t {self.per_pass} = {steps};",
                      f"{self.const} idx_t {self.block} = idx_t({self.per_pass} >= {FAN_IN} ? {FAN_IN} : "
                      f"{self.per_pass} + 1);   // steps per block within a pass"]
        if self.multi:
            self.decls += [f"{self.const} int64_t blk_terms_{p} = {terms};",
                           f"{self.const} int64_t {self.every} = ({self.per_pass} >= {FAN_IN} || blk_terms_{p} >= "
                           f"{FAN_IN}) ? 1 : {FAN_IN} / blk_terms_{p};   // passes per block",
                           f"int64_t {self.count} = 0;"]
        self.decls += [f"int64_t blk_n{j}_{p} = 0;" for j in range(2, m)]
        for name, rt, ct in specs:
            t = f"tp::WelfordAcc<{ct}>" if rt == "welford" else f"tp::Vec<{ct}>"
            init = "" if rt == "welford" else f"({ct}(0))"
            self.decls += [f"{t} blk{j}_{name}_{u}{init};" for j in range(2, m + 1) for u in range(nacc)]

    def _level(self, j):
        """C++ variable of level ``j`` of accumulator ``u`` (level 1: the accumulator)."""
        return lambda name, u: f"acc_{name}_{u}" if j == 1 else f"blk{j}_{name}_{u}"

    def _fold(self, j, ind="    "):
        """Fold level ``j`` into ``j + 1``; every FAN_IN folds into ``j + 1`` fold it further."""
        lo, hi = self._level(j), self._level(j + 1)
        out = [f"{hi(name, u)} = {_add(rt, hi(name, u), lo(name, u))}; {lo(name, u)} = {_zero(rt, ct)};"
               for name, rt, ct in self.specs for u in range(self.nacc)]
        if j + 1 < self.m:
            c = f"blk_n{j + 1}_{self.p}"
            out += [f"if (++{c} == {FAN_IN}) {{", f"{ind}{c} = 0;"] + [ind + ln for ln in self._fold(j + 1)] + ["}"]
        return out

    def block_end(self, ind="    "):
        """Inside a pass, after each block (only when a pass holds a whole block)."""
        return [f"{self.if_const} ({self.per_pass} >= {FAN_IN}) {{"] + [ind + ln for ln in self._fold(1)] + ["}"]

    def pass_end(self, ind="    "):
        """After each pass of the innermost loop (when there are several): a block ends every
        ``every`` passes, or at every pass end when a pass holds whole blocks (its remainder)."""
        if not self.multi:
            return []
        return [f"if (++{self.count} == {self.every}) {{", f"{ind}{self.count} = 0;"] + \
            [ind + ln for ln in self._fold(1)] + ["}"]

    def finals(self):
        """After the loops: every level folded downwards into the accumulator (then combined as
        before)."""
        out = []
        for name, rt, _ in self.specs:
            for u in range(self.nacc):
                top = self._level(self.m)(name, u)
                for j in range(self.m - 1, 0, -1):
                    lo = self._level(j)(name, u)
                    out.append(f"{lo} = {_add(rt, top, lo)};")
                    top = lo
        return out

    def split_head(self, var, size, step, ind="    "):
        """The head of the unrolled loop ``for (; var + step <= size; var += step)`` cut into blocks
        of ``block`` steps: a loop over blocks up to the loop's end ``var_main`` (a constant), the
        loop over one block; :meth:`foot` closes both and sets ``var = var_main``, so the compiler
        still knows where the single vectors and the tail after the loop start."""
        bstep = f"{self.block} * {step}"
        main = f"{var}_main"
        return [f"{self.const} idx_t {main} = ({size} / ({step})) * ({step});",
                f"for (; {var} + {step} <= {size}; ) {{",
                f"{ind}const idx_t {var}_end = ({main} - {var} > {bstep}) ? {var} + {bstep} : {main};",
                f"{ind}for (; {var} < {var}_end; {var} += {step}) {{"]

    def counted_head(self, var, size, ind="    "):
        """``for (idx_t var = 0; var < size; var += 1)`` cut into blocks of ``block`` iterations."""
        return [f"for (idx_t {var}_b = 0; {var}_b < {size}; {var}_b += {self.block}) {{",
                f"{ind}const idx_t {var}_end = ({size} - {var}_b > {self.block}) ? {var}_b + {self.block} : {size};",
                f"{ind}for (idx_t {var} = {var}_b; {var} < {var}_end; {var} += 1) {{"]

    def foot(self, var=None, ind="    "):
        return [f"{ind}}}"] + [ind + ln for ln in self.block_end()] + ["}"] + \
            ([f"{var} = {var}_main;"] if var else [])
