"""Random-program differential tester for ``tp.compile`` (docs/testing.md).

Three parts, all deterministic from one integer seed:

**Generator** (:func:`generate`).  ``random.Random(seed)`` builds a DAG of 5–40 ops over 1–4 inputs:
pointwise unary ops (exp, expm1, log, log1p, sqrt, rsqrt, reciprocal, tanh, sigmoid, erf, sin, cos,
relu, gelu, silu, neg, abs, floor, ceil, trunc, round, sign, square, ``x ** k`` for k in 2, 3, 0.5,
1.5, -1), ``softmax`` / ``log_softmax`` along a dim, in-place ops on fresh intermediates (``add_ sub_
mul_ clamp_ relu_ neg_ abs_``; the mutated value is never read again), binary ops with broadcasting
and Python-scalar operands (add, sub, mul, div, maximum, minimum), comparisons, ``where``, ``clamp``,
logical ops, casts (int/bool -> float, float -> bool/int32, float32 -> float64), reductions with
``dim``/``keepdim`` (sum, mean, amax, amin, prod, var, logsumexp, any, all) and view/layout ops
(permute, transpose, mT, reshape/view, expand, broadcast_to, unsqueeze, squeeze, flatten,
unflatten, movedim, getitem with steps/None/ellipsis/ints, select, narrow, flip, contiguous,
clone).  Domains are guarded by construction: every value carries an interval for its finite
elements, ``log``/``rsqrt``/``reciprocal``/denominators get ``abs(x) + c`` when the interval is not
safely positive, ``exp`` gets a ``clamp`` when it could overflow, and ops whose result could leave
±1e6 are not emitted.  Every candidate node is evaluated first on small CPU tensors with the real input
strides (not on ``meta``: its stride predictions can differ from the CPU kernels'), so only valid
programs are emitted.  Inputs: random shapes (rank 0–4, sizes
including 1 and sometimes 0, broadcast-compatible suffixes of one "universe" shape), dtypes
(float32 mostly, float64, int32, int64, bool), layouts (contiguous, permuted storage order,
strided slice with storage offset, stride-0 expanded dims, offset into a larger storage) and value
distributions (normal, positive, half-integer grid with exact ties, ill-conditioned ``C + small``,
wide exponent range), plus (in some programs) ±0, ±inf and NaN planted in the storage.  The program
is readable Python (``Program.source``): ``def f(a0, a1, ...)`` over ``tp`` and a global ``FLOAT``
(the float dtype that int/bool inputs are cast to).

**Reference and error model** (:func:`error_model`).  The same source is run three ways:
``eager32`` (``FLOAT = float32``, the inputs as given), ``ref64`` (``FLOAT = float64``, float inputs
upcast exactly: the same program in float64) and a *running error analysis* that walks the node
list on float64 tensors and computes, per element of every value, a bound ``E`` on
``|value computed by a float32 program - exact value|``.  Inputs are exact (E = 0).  Each op adds
the propagated input error and its own rounding:

* monotone ops ``f`` (exp, log, tanh, erf, sqrt, floor, sign, relu, ...): the input lies in
  ``[x - Ex, x + Ex]``, so the propagated error is ``max(|f(x+Ex) - f(x)|, |f(x) - f(x-Ex)|)`` —
  exact for monotone functions, and it makes discontinuous ops sound (``floor`` near an integer
  gets E = 1);
* Lipschitz ops (sin, cos, gelu, silu, abs, neg, clamp, maximum, minimum, amax): ``L * Ex``;
* ``a ± b``: ``Ea + Eb``;  ``a * b``: ``|a|Eb + |b|Ea + Ea Eb``;  ``a / b``: ``(Ea + |q|Eb) /
  (|b| - Eb)`` (infinite when the denominator interval reaches 0);
* comparisons are *uncertain* where ``|a - b| <= Ea + Eb`` (bool E = 1 there); ``where`` with an
  uncertain condition gets ``max(Ex, Ey) + |x - y|``; casts of uncertain bools give E = 1;
* ``sum`` over n elements: ``sum(E) + 2 sqrt(n) u sum|a|`` (the blocked-summation bound of §6.5 /
  docs/testing.md); ``mean`` = sum / n; ``prod``: ``prod(|a| + E) - prod|a| + n u prod(|a| + E)``;
  ``var``: ``(2 sum|a - m| E + sum E^2) / (n - c)`` + a two-pass/Welford rounding term
  ``((2u + 2 sqrt(n) u) S + n dm^2 + 2 sqrt(n) u sqrt(S sum a^2)) / (n - c)`` (the last term is the
  float32 Welford update's error, ~ kappa n u with kappa = ||a|| / sqrt(S));
  ``logsumexp``: ``max E + u(4 + 2 sqrt(n) + 2 max|a|)``;
  ``softmax``: ``y (E_i + max E) + y u (7 + 2 sqrt(n) + min(n, max|x - m|)) + u y |x_i - m|`` (and
  the analogous absolute bound for ``log_softmax``);
* rounding of the op itself: ``k * u * scale + k * eta`` with ``u = 2^-24`` (float32 results) or
  ``2^-53`` (float64 results), ``k = 0`` for exact ops (abs, max, floor, views, ...), 1 for correctly
  rounded ones (+ - * /), 2 for sqrt and reciprocal (ATen's float32 sqrt is not always correctly
  rounded), 2 for ``tensor / scalar`` (CUDA multiplies by the reciprocal), 3 for ``scalar / tensor``
  (torch computes it as ``reciprocal(t) * s``), 4 for library
  functions (exp, tanh, erf, ...); ``scale`` is the largest ``|f|`` over the input interval (plus
  ``|x|`` for gelu, whose ``0.5x(1 + erf(x/sqrt2))`` form cancels for negative x, and 1 for log near
  1); ``eta = 2^-126`` (float32) is the underflow term of the IEEE model — 1e-38, not an atol;
* an operand of higher precision than the op's computation dtype (a float64 0-dim tensor combined
  with float32 tensors computes in float32) is first rounded: ``+ u |a|``.

Because E is built from the magnitudes of every intermediate (``sum|a|``, ``|q| Eb``, ...), it scales
with the inputs (multiplying all inputs by 2^k multiplies E by 2^k for homogeneous programs) and
with ill-conditioning (``(x + 1000) - 1000`` carries ``u * 1000``; ``sum`` of cancelling terms
carries ``u * sum|a|``, i.e. the condition number ``sum|a| / |sum a|`` times ``u |sum a|``).  There is
no fixed absolute tolerance anywhere.

Nonfinite values: specials in the inputs propagate deterministically, so where ``ref64``/``eager32``
is NaN or ±inf and E is finite, the compiled value must be *the same* nonfinite (NaN where NaN, inf
of the same sign).  Where the model cannot decide (``E = inf``: an uncertain comparison chooses
between a finite and an infinite branch, ``0 * inf`` with an uncertain factor, gelu/silu at ±inf
where ATen returns NaN instead of the limit, float -> int of a nonfinite) the element is not
checked.  Signed zeros are not distinguished (the only inexact rewrite allowed, ``x + 0 -> x``, changes them).

**Checker** (:func:`check_program`).  ``cf = tp.compile(f, backend=..., strict_native=True)`` is
called three times: with inputs A (capture run), again with the same objects (first-level entry:
the compiled artifact) and with fresh inputs B of the same shapes/strides/dtypes (guard path; must
not recapture).  Every result is compared with that input set's references::

    float element, E finite, eager32 finite:  |compiled - ref64| <= max(c1 |eager32 - ref64|, c2 E)
    float element, E finite, eager32 nonfinite: compiled is the same nonfinite value
    int element:  |compiled - eager32| <= 2E  (exact where E = 0);   bool: equal where E = 0

(``c1 = c2 = 2``).  The ``c1`` term is a safety net for the model; the model itself is validated
separately: eager32 must satisfy ``|eager32 - ref64| <= E`` everywhere (:func:`check_model`), so a
violation there is a bug of this file, not of TensorPlay.  The checker also verifies output shapes
and dtypes, that compiled calls do not modify their inputs, that the outputs of call 2 are not
overwritten by call 3 (reused output buffers), and that call 3 hits the cache.

**Tools.**  :func:`minimize` shrinks a failing program (the first value whose sub-program fails
alone, then bypasses nodes while it still fails).  ``interpreter_backend`` and the planted-bug
backends built on it (``reordered_sum_backend``, ``perturb_reductions_backend``, ``swap_backend``,
``nan_to_zero_backend``, ``stale_backend``) are the checker's self-test.  From the command line
(prints the program, the verdict, and with ``--minimize`` the smallest failing sub-program)::

    python test/stax/random_programs.py --seed 123 [--backend stax] [--count 50] [--minimize]

**Size-generic programs** (:func:`generate_dynamic`, :class:`DynamicProgramGenerator`): the same
generator, with every size a view op needs written from an operand's sizes and the inputs
instantiable at 5 universe sizes (``prog.at(k)``); :func:`check_dynamic` compiles with
``dynamic=True`` and calls the one compiled function at every size (``--dynamic`` on the command line).
"""
from __future__ import annotations

import dataclasses
import math
import random
import sys
import traceback
import warnings

import torch
import torch.nn.functional as F

import tensorplay as tp

__all__ = ["Program", "InputSpec", "Node", "generate", "generate_dynamic", "check_dynamic", "make_inputs", "build_function", "error_model",
           "check_program", "check_model", "compare", "CheckResult", "coverage", "minimize", "prune",
           "interpreter_backend", "perturb_reductions_backend", "reordered_sum_backend", "swap_backend",
           "nan_to_zero_backend", "stale_backend", "U", "C1", "C2"]

#: unit roundoff of a result dtype
U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
#: underflow term (smallest normal) of a result dtype
ETA = {torch.float32: 2.0 ** -126, torch.float64: 2.0 ** -1022, torch.float16: 2.0 ** -14, torch.bfloat16: 2.0 ** -126}
C1 = 2.0      # tolerance factor on the observed float32 eager error
C2 = 2.0      # tolerance factor on the error-model bound E
K_LIB = 4.0   # ulps allowed to a library function (exp, tanh, erf, ...)

MAX_NUMEL = 4096   # largest value a program may create ...
MAX_NUMEL_BIG = 1 << 17   # ... or a "big" program (1 in 10: long rows, parallel/vectorised kernel paths)
LIMIT = 1.0e6      # largest magnitude of a finite value (keeps float32 far from overflow)
SPECIALS = (float("nan"), float("inf"), float("-inf"), -0.0, 0.0)


class _TorchShim:
    """``tp`` for running a program's source on torch tensors (generation and the float64 error
    model): every name is torch's, except the few that live in ``torch.nn.functional``."""
    gelu = staticmethod(F.gelu)
    silu = staticmethod(F.silu)

    def __getattr__(self, name):
        return getattr(torch, name)


_TSHIM = _TorchShim()


# ---------------------------------------------------------------------------------------------------
# program representation
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class InputSpec:
    name: str
    shape: tuple
    dtype: torch.dtype
    layout: str            # contiguous | permuted | strided | expanded | offset
    layout_args: tuple
    dist: str              # normal | pos | grid | offset | wide | int | bool
    dist_args: tuple
    specials: int          # how many special values to plant in the storage (float inputs)
    shapes: tuple = ()     # a size-generic program (generate(dynamic=True)): the shape at each instance

    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        la = f"{self.layout}{self.layout_args}" if self.layout_args else self.layout
        da = f"{self.dist}{self.dist_args}" if self.dist_args else self.dist
        sp = f", {self.specials} special(s)" if self.specials else ""
        return f"{self.name}: {dt}{list(self.shape)} {la}, {da}{sp}"


@dataclasses.dataclass
class Node:
    name: str
    expr: str              # Python expression over tp (and the names in args)
    args: tuple            # value names (str) or Python scalars, in the order the rule reads them
    rule: str              # error-model rule
    params: dict
    dtype: torch.dtype     # dtype in the float32 program
    shape: tuple
    shapes: tuple = ()     # a size-generic program: the shape at each instance


@dataclasses.dataclass
class Program:
    seed: int
    inputs: list
    nodes: list
    outputs: list
    universes: tuple = ()  # a size-generic program: the universe shape of each instance (0 = the sample)

    @property
    def source(self) -> str:
        lines = [f"# random program, seed={self.seed}"]
        if self.universes:
            lines.append(f"#   size-generic; universe sizes of the instances: {[list(u) for u in self.universes]}")
        lines += [f"#   {s.describe()}" for s in self.inputs]
        lines.append(f"def f({', '.join(s.name for s in self.inputs)}):")
        for n in self.nodes:
            lines.append(f"    {n.name} = {n.expr}")
        lines.append(f"    return ({''.join(o + ', ' for o in self.outputs)})")
        return "\n".join(lines) + "\n"

    def ops(self) -> list:
        return [n.params.get("op", n.rule) for n in self.nodes]

    @property
    def instances(self) -> int:
        """How many size instances the program has (1: a program with the sample's sizes only)."""
        return max(len(self.universes), 1)

    def at(self, k: int) -> "Program":
        """Instance ``k`` of a size-generic program: the same source, inputs (and the recorded node
        shapes) at the universe sizes of instance ``k``; ``make_inputs(prog.at(k))`` are its inputs."""
        if not self.universes:
            if k:
                raise IndexError(f"program {self.seed} has one size instance")
            return self
        ins = [dataclasses.replace(s, shape=s.shapes[k]) for s in self.inputs]
        nodes = [dataclasses.replace(n, shape=n.shapes[k]) for n in self.nodes]
        return dataclasses.replace(self, inputs=ins, nodes=nodes)


def build_function(prog: Program, float_dtype=torch.float32, namespace=tp):
    """exec the program's source with ``FLOAT = float_dtype``; returns ``f``."""
    ns = {"tp": namespace, "FLOAT": float_dtype}
    exec(compile(prog.source, f"<random program {prog.seed}>", "exec"), ns)
    return ns["f"]


# ---------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------
def _storage_view(spec: InputSpec, device, fill):
    """The input tensor for ``spec``: a view with the spec's layout of a storage made by ``fill``."""
    shape, la = tuple(spec.shape), spec.layout_args
    if spec.layout == "permuted":
        perm = la[0]
        base = fill(tuple(shape[p] for p in perm))
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        return base.permute(*inv)
    if spec.layout == "strided":
        d, step, off = la
        bshape = list(shape)
        bshape[d] = shape[d] * step + off
        base = fill(tuple(bshape))
        idx = [slice(None)] * len(shape)
        idx[d] = slice(off, off + shape[d] * step, step)
        return base[tuple(idx)]
    if spec.layout == "expanded":
        dims = la[0]
        base = fill(tuple(1 if i in dims else s for i, s in enumerate(shape)))
        return base.expand(*shape)
    if spec.layout == "offset":
        off = la[0]
        n = math.prod(shape)
        base = fill((n + off + 1,))
        return base[off:off + n].view(shape)
    return fill(shape)


def _fill_values(spec: InputSpec, shape, g: torch.Generator, specials: bool):
    dist, da = spec.dist, spec.dist_args
    if spec.dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not spec.dtype.is_floating_point:
        return torch.randint(-5, 6, shape, generator=g, dtype=spec.dtype)
    if dist == "pos":
        x = 0.5 + 2.5 * torch.rand(shape, generator=g, dtype=torch.float64)
    elif dist == "grid":
        x = torch.randint(-8, 9, shape, generator=g).to(torch.float64) / 2
    elif dist == "offset":
        c, s = da
        x = c + s * torch.randn(shape, generator=g, dtype=torch.float64).clamp(-4, 4)
    elif dist == "wide":
        sign = torch.where(torch.rand(shape, generator=g) > 0.5, 1.0, -1.0).to(torch.float64)
        x = sign * torch.exp2(-20 + 30 * torch.rand(shape, generator=g, dtype=torch.float64))
    else:
        x = torch.randn(shape, generator=g, dtype=torch.float64).clamp(-4, 4)
    x = x.to(spec.dtype)
    if specials and spec.specials and x.numel():
        flat = x.view(-1)
        for _ in range(spec.specials):
            i = int(torch.randint(0, flat.numel(), (1,), generator=g))
            j = int(torch.randint(0, len(SPECIALS), (1,), generator=g))
            flat[i] = SPECIALS[j]
    return x


def make_inputs(prog: Program, which: int = 0, upcast: bool = False, device="cpu"):
    """Torch tensors for the program's inputs (set ``which`` = 0 or 1: same metadata, other values).
    ``upcast=True``: the same values with float storages in float64 and the same strides (so a view
    that is valid in the float32 program is valid in the float64 one).  ``device``: where the
    storages live (values are drawn on the CPU, so they are the same on every device)."""
    out = []
    for k, spec in enumerate(prog.inputs):
        slot = int(spec.name[1:])     # by name, so a minimised program keeps the values of its inputs
        g = torch.Generator().manual_seed((prog.seed * 7919 + slot * 104729 + which * 1299709) % (2 ** 62))

        def fill(s, spec=spec, g=g):
            x = _fill_values(spec, s, g, True)
            return (x.to(torch.float64) if upcast and x.is_floating_point() else x).to(device)
        out.append(_storage_view(spec, device, fill))
    return out


def _meta_input(spec: InputSpec):
    # small real CPU tensors, not device="meta": torch's meta kernels can predict other output strides
    # than the CPU kernels (e.g. int64[1,1,6] (permuted) * float32[2,1]: meta (12,6,1), CPU (1,1,2)), and
    # whether ``.view`` is valid depends on them
    return _storage_view(spec, "cpu", lambda s: torch.ones(s, dtype=spec.dtype))


def _input_interval(spec: InputSpec):
    if spec.dtype == torch.bool:
        return 0.0, 1.0
    if not spec.dtype.is_floating_point:
        return -5.0, 5.0
    if spec.dist == "pos":
        return 0.5, 3.0
    if spec.dist == "offset":
        c, s = spec.dist_args
        return c - 4 * s, c + 4 * s
    if spec.dist == "wide":
        return -1024.0, 1024.0
    return -4.0, 4.0


# ---------------------------------------------------------------------------------------------------
# generator
# ---------------------------------------------------------------------------------------------------
class _Val:
    __slots__ = ("name", "meta", "lo", "hi", "uses", "is_input", "unstable", "dead")

    def __init__(self, name, meta, lo, hi, is_input=False):
        self.name, self.meta, self.lo, self.hi, self.uses, self.is_input = name, meta, lo, hi, 0, is_input
        # the strides of a computed value are the kernel's choice: they can differ between CPU and CUDA
        # (TensorIterator) and between the float32 and float64 programs (``x.to(tp.float64)`` copies
        # in one and aliases in the other), so ``.view`` is only emitted on inputs, views of inputs
        # and ``.contiguous()`` results (elsewhere ``.reshape``)
        self.unstable = not is_input
        self.dead = False      # mutated in place: its old value is gone, never an operand again

    @property
    def kind(self):
        d = self.meta.dtype
        return "b" if d == torch.bool else ("f" if d.is_floating_point else "i")

    @property
    def shape(self):
        return tuple(self.meta.shape)

    @property
    def mag(self):
        return max(abs(self.lo), abs(self.hi))


class _Reject(Exception):
    pass


def _imul(a, b):
    ps = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    ps = [0.0 if p != p else p for p in ps]   # 0 * inf
    return min(ps), max(ps)


def _mono(f, lo, hi, inc=True):
    a, b = f(lo), f(hi)
    return (a, b) if inc else (b, a)


def _fmt(c):
    return repr(c)


_SCALARS_F = (0.5, 1.5, 2.0, -1.0, -0.75, 3.0, 0.125, 1.25, -2.5, 4.0)   # exactly representable in float32
_SCALARS_I = (1, 2, 3, -1, -2)

# unary float ops: name -> (expr format, weight, int_ok)
_UNARY = {
    "exp": ("tp.exp({})", 3, False), "expm1": ("tp.expm1({})", 1, False), "log": ("tp.log({})", 3, False),
    "log1p": ("tp.log1p({})", 1, False), "sqrt": ("tp.sqrt({})", 2, False), "rsqrt": ("tp.rsqrt({})", 1, False),
    "reciprocal": ("tp.reciprocal({})", 1, False), "tanh": ("tp.tanh({})", 3, False),
    "sigmoid": ("tp.sigmoid({})", 2, False), "erf": ("tp.erf({})", 2, False), "sin": ("tp.sin({})", 2, False),
    "cos": ("tp.cos({})", 1, False), "relu": ("tp.relu({})", 2, False), "gelu": ("tp.gelu({})", 2, False),
    "silu": ("tp.silu({})", 1, False), "neg": ("(-{})", 2, True), "abs": ("{}.abs()", 2, True),
    "floor": ("tp.floor({})", 2, False), "ceil": ("tp.ceil({})", 1, False), "trunc": ("tp.trunc({})", 1, False),
    "round": ("tp.round({})", 1, False), "sign": ("tp.sign({})", 1, True), "square": ("tp.square({})", 1, True),
    "pow2": ("({} ** 2)", 1, True), "pow3": ("tp.pow({}, 3)", 1, False), "pow05": ("({} ** 0.5)", 1, False),
    "pow15": ("tp.pow({}, 1.5)", 1, False), "powm1": ("({} ** -1)", 1, False),
}


def _unary_interval(op, lo, hi):
    if op in ("exp",):
        return _mono(math.exp, lo, hi)
    if op == "expm1":
        return _mono(math.expm1, lo, hi)
    if op == "log":
        return _mono(math.log, lo, hi)
    if op == "log1p":
        return _mono(math.log1p, lo, hi)
    if op == "sqrt":
        return _mono(math.sqrt, lo, hi)
    if op == "rsqrt":
        return 1 / math.sqrt(hi), 1 / math.sqrt(lo)
    if op == "reciprocal":
        return 1 / hi, 1 / lo
    if op in ("tanh", "erf", "sin", "cos", "sign"):
        return -1.0, 1.0
    if op == "sigmoid":
        return 0.0, 1.0
    if op == "relu":
        return max(lo, 0.0), max(hi, 0.0)
    if op == "gelu":
        return (min(lo, -0.2) if lo < 0 else lo * 0.5), max(hi, 0.0)
    if op == "silu":
        return (min(lo, -0.3) if lo < 0 else lo * 0.5), max(hi, 0.0)
    if op == "neg":
        return -hi, -lo
    if op == "abs":
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if op in ("floor", "ceil", "trunc", "round"):
        return math.floor(lo), math.ceil(hi)
    if op == "pow3":
        return lo ** 3, hi ** 3
    if op == "pow05":
        return math.sqrt(lo), math.sqrt(hi)
    if op == "pow15":
        return lo ** 1.5, hi ** 1.5
    if op == "powm1":
        return 1 / hi, 1 / lo
    if op in ("square", "pow2"):
        m = max(abs(lo), abs(hi))
        return (0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), m * m
    raise KeyError(op)


class ProgramGenerator:
    def __init__(self, seed: int, min_ops: int = 5, max_ops: int = 40):
        self.seed = seed
        self.rng = random.Random(seed)
        self.min_ops, self.max_ops = min_ops, max_ops
        self.vals: list[_Val] = []
        self.nodes: list[Node] = []
        self.inputs: list[InputSpec] = []
        self.ns = {"tp": _TSHIM, "FLOAT": torch.float32}

    # -- inputs ----------------------------------------------------------------------------------------
    def _make_inputs(self):
        r = self.rng
        sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32]
        big = r.random() < 0.1
        self.max_numel = MAX_NUMEL_BIG if big else MAX_NUMEL
        uni = [r.choice(sizes) for _ in range(4)]
        if big:
            uni[r.randrange(2, 4)] = r.choice([100, 255, 256, 1000, 1031, 4099])
        if r.random() < 0.08:
            uni[r.randrange(4)] = 0
        n_in = r.choice([1, 1, 2, 2, 2, 3, 3, 4])
        has_specials = r.random() < 0.25
        for k in range(n_in):
            rank = r.choices([0, 1, 2, 3, 4], weights=[1, 3, 4, 3, 2])[0]
            shape = tuple(1 if r.random() < 0.2 else s for s in uni[4 - rank:])
            while math.prod(shape) > self.max_numel // 4:
                i = max(range(len(shape)), key=lambda j: shape[j])
                shape = shape[:i] + (max(1, shape[i] // 4),) + shape[i + 1:]
            spec = self._input_spec(k, shape, has_specials)
            self.inputs.append(spec)
            lo, hi = _input_interval(spec)
            self.vals.append(_Val(spec.name, _meta_input(spec), lo, hi, is_input=True))

    def _input_spec(self, k, shape, has_specials, shapes=()):
        """Input ``a{k}`` of ``shape``: its dtype, layout and value distribution."""
        r, rank = self.rng, len(shape)
        dtype = r.choices([torch.float32, torch.float64, torch.int32, torch.int64, torch.bool],
                          weights=[75, 7, 7, 4, 7])[0]
        layouts = ["contiguous", "offset"]
        if rank >= 2:
            layouts += ["permuted", "permuted"]
        if rank >= 1:
            layouts += ["strided", "strided"]
        if any(s > 1 for s in shape):
            layouts += ["expanded"]
        layout = r.choice(layouts)
        la = ()
        if layout == "permuted":
            perm = list(range(rank))
            while perm == sorted(perm):
                r.shuffle(perm)
            la = (tuple(perm),)
        elif layout == "strided":
            la = (r.randrange(rank), r.choice([2, 3]), r.choice([0, 1]))
        elif layout == "expanded":
            cand = [i for i, s in enumerate(shape) if s > 1]
            la = (tuple(sorted(r.sample(cand, r.randint(1, len(cand))))),)
        elif layout == "offset":
            la = (r.randint(1, 5),)
        dist, da = ("bool", ()) if dtype == torch.bool else ("int", ())
        if dtype.is_floating_point:
            dist = r.choices(["normal", "pos", "grid", "offset", "wide"], weights=[10, 2, 2, 2, 2])[0]
            if dist == "offset":
                da = (r.choice([10.0, -100.0, 1000.0, 100.0, -1000.0]), r.choice([1.0, 0.01, 0.1]))
            else:
                da = ()
        specials = r.randint(1, 3) if (has_specials and dtype.is_floating_point and r.random() < 0.7) else 0
        return InputSpec(f"a{k}", shape, dtype, layout, la, dist, da, specials, shapes)

    # -- emission --------------------------------------------------------------------------------------
    def _evaluate(self, expr, env):
        """``expr`` on the meta tensors ``env``; rejected when torch refuses it or it is too large."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                meta = eval(expr, self.ns, env)
        except Exception:
            raise _Reject(expr) from None
        if not isinstance(meta, torch.Tensor) or meta.numel() > self.max_numel:
            raise _Reject(expr)
        return meta

    def _candidate(self, expr, args):
        """The meta tensor of a candidate node (raises _Reject when it is not valid)."""
        return self._evaluate(expr, {a.name: a.meta for a in args if isinstance(a, _Val)})

    def _emit(self, expr, args, rule, lo, hi, **params):
        meta = self._candidate(expr, args)
        if meta.dtype == torch.bool:
            lo, hi = 0.0, 1.0
        if not (lo == lo and hi == hi) or max(abs(lo), abs(hi)) > LIMIT:
            raise _Reject(expr)
        name = f"v{len(self.nodes)}"
        for a in args:
            if isinstance(a, _Val):
                a.uses += 1
        self.nodes.append(Node(name, expr, tuple(a.name if isinstance(a, _Val) else a for a in args), rule,
                               params, meta.dtype, tuple(meta.shape)))
        v = _Val(name, meta, float(lo), float(hi))
        self.vals.append(v)
        return v

    def _pick(self, pred=lambda v: True):
        cands = [v for v in self.vals if not v.dead and pred(v)]
        if not cands:
            raise _Reject("no operand")
        n = len(self.vals)
        w = [1.0 + 2.0 * (v.uses == 0) + 3.0 * self.vals.index(v) / n for v in cands]
        return self.rng.choices(cands, weights=w)[0]

    def _to_float(self, x):
        if x.kind == "f":
            return x
        return self._emit(f"{x.name}.to(FLOAT)", [x], "cast", x.lo, x.hi, op="cast")

    def _positive(self, x, margin):
        """x itself when its interval is >= margin, else abs(x) + c (two nodes)."""
        if x.lo >= margin:
            return x
        a = self._emit(f"{x.name}.abs()" if self.rng.random() < 0.5 else f"tp.abs({x.name})", [x], "lip",
                       *_unary_interval("abs", x.lo, x.hi), op="abs", L=1.0, k=0)
        c = self.rng.choice([0.5, 1.0]) if margin > 0 else 0.0
        if margin <= 0:
            return a
        return self._emit(f"({a.name} + {_fmt(c)})", [a, c], "add", a.lo + c, a.hi + c, op="add")

    # -- op families -----------------------------------------------------------------------------------
    def _op_unary(self):
        r = self.rng
        names = list(_UNARY)
        op = r.choices(names, weights=[_UNARY[n][1] for n in names])[0]
        fmt, _, int_ok = _UNARY[op]
        x = self._pick(lambda v: v.kind != "b" or not int_ok)
        if x.kind != "f" and not (int_ok and x.kind == "i" and r.random() < 0.5):
            x = self._to_float(x)
        if op in ("exp", "expm1") and (x.hi > 8 or x.lo < -60):
            lo, hi = max(x.lo, -30.0), min(x.hi, 8.0)
            if lo > hi:
                lo = hi = max(min(x.lo, 8.0), -30.0)
            x = self._emit(f"tp.clamp({x.name}, min=-30.0, max=8.0)", [x], "lip", lo, hi, op="clamp", L=1.0, k=0)
        elif op == "log":
            x = self._positive(x, 0.25)
        elif op in ("rsqrt", "reciprocal", "powm1"):
            x = self._positive(x, 0.25)
        elif op in ("log1p", "sqrt", "pow05", "pow15"):
            x = self._positive(x, 0.0)
        lo, hi = _unary_interval(op, x.lo, x.hi)
        if op in ("neg", "abs"):
            return self._emit(fmt.format(x.name), [x], "lip", lo, hi, op=op, L=1.0, k=0)
        if op in ("square", "pow2"):
            return self._emit(fmt.format(x.name), [x], "square", lo, hi, op=op)
        if op in ("sin", "cos", "gelu", "silu"):
            L = {"sin": 1.0, "cos": 1.0, "gelu": 1.13, "silu": 1.1}[op]
            return self._emit(fmt.format(x.name), [x], "lip", lo, hi, op=op, L=L, k=K_LIB)
        return self._emit(fmt.format(x.name), [x], "mono", lo, hi, op=op)

    def _second_operand(self, a, allow_scalar=True, kinds="fi"):
        r = self.rng
        if allow_scalar and r.random() < 0.25:
            return None
        cands = []
        for v in self.vals:
            if v.kind not in kinds or v.dead:
                continue
            try:
                s = torch.broadcast_shapes(a.shape, v.shape)
            except RuntimeError:
                continue
            if math.prod(s) <= self.max_numel:
                cands.append(v)
        if not cands:
            if allow_scalar:
                return None
            raise _Reject("no broadcast partner")
        n = len(self.vals)
        w = [(1.0 + 2.0 * (v.uses == 0) + 2.0 * self.vals.index(v) / n + (2.0 if v.shape != a.shape else 0.0))
             * (0.15 if v is a else 1.0) for v in cands]
        return r.choices(cands, weights=w)[0]

    def _op_binary(self):
        r = self.rng
        op = r.choices(["add", "sub", "mul", "div", "maximum", "minimum"], weights=[4, 3, 4, 2, 2, 2])[0]
        a = self._pick(lambda v: v.kind != "b" or r.random() < 0.3)
        if a.kind == "b":
            a = self._to_float(a)
        b = self._second_operand(a, allow_scalar=op not in ("maximum", "minimum"))
        if b is not None and b.kind == "b":
            b = self._to_float(b)
        if op == "div":
            if a.kind == "i":
                a = self._to_float(a)
            if b is None:
                if r.random() < 0.5:   # tensor / scalar
                    c = r.choice([0.5, 2.0, -4.0, 0.125, 3.0])
                    lo, hi = _imul((a.lo, a.hi), (1 / c, 1 / c))
                    # CUDA divides by a scalar as a multiplication by its (rounded) reciprocal
                    return self._emit(f"({a.name} / {_fmt(c)})", [a, c], "div", lo, hi, op="div", k=2)
                c = r.choice(_SCALARS_F)
                d = self._positive(a, 0.25)
                lo, hi = _imul((c, c), (1 / d.hi, 1 / d.lo))
                # eager computes scalar / tensor as reciprocal(tensor) * scalar (torch's __rtruediv__)
                return self._emit(f"({_fmt(c)} / {d.name})", [c, d], "div", lo, hi, op="div", k=3)
            d = self._positive(b, 0.25)
            lo, hi = _imul((a.lo, a.hi), (1 / d.hi, 1 / d.lo))
            form = r.choice(["({} / {})", "tp.div({}, {})"])
            return self._emit(form.format(a.name, d.name), [a, d], "div", lo, hi, op="div")
        if b is None:
            c = r.choice(_SCALARS_I if a.kind == "i" else _SCALARS_F)
            rev = r.random() < 0.4
            if op == "add":
                lo, hi = a.lo + c, a.hi + c
            elif op == "sub":
                lo, hi = (c - a.hi, c - a.lo) if rev else (a.lo - c, a.hi - c)
            else:
                lo, hi = _imul((a.lo, a.hi), (c, c))
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            expr = f"({_fmt(c)} {sym} {a.name})" if rev else f"({a.name} {sym} {_fmt(c)})"
            args = [c, a] if rev else [a, c]
            return self._emit(expr, args, op, lo, hi, op=op)
        if op in ("maximum", "minimum"):
            f = max if op == "maximum" else min
            return self._emit(f"tp.{op}({a.name}, {b.name})", [a, b], "maxmin", f(a.lo, b.lo), f(a.hi, b.hi), op=op)
        if op == "add":
            lo, hi = a.lo + b.lo, a.hi + b.hi
        elif op == "sub":
            lo, hi = a.lo - b.hi, a.hi - b.lo
        else:
            lo, hi = _imul((a.lo, a.hi), (b.lo, b.hi))
        sym = {"add": "+", "sub": "-", "mul": "*"}[op]
        expr = f"tp.{op}({a.name}, {b.name})" if r.random() < 0.25 else f"({a.name} {sym} {b.name})"
        return self._emit(expr, [a, b], op, lo, hi, op=op)

    def _compare(self):
        r = self.rng
        a = self._pick(lambda v: v.kind != "b")
        b = self._second_operand(a)
        if b is a and r.random() < 0.8:
            b = None
        sym = r.choice([">", "<", ">=", "<=", "==", "!="] if a.kind == "i" else [">", "<", ">=", "<="])
        if b is None:
            c = r.choice(_SCALARS_I) if a.kind == "i" else round(r.uniform(a.lo, a.hi) * 8) / 8
            return self._emit(f"({a.name} {sym} {_fmt(c)})", [a, c], "cmp", 0, 1, op="cmp")
        return self._emit(f"({a.name} {sym} {b.name})", [a, b], "cmp", 0, 1, op="cmp")

    def _op_compare(self):
        return self._compare()

    def _op_where(self):
        r = self.rng
        c = self._pick(lambda v: v.kind == "b") if (r.random() < 0.5 and any(v.kind == "b" for v in self.vals)) \
            else self._compare()
        x = self._second_operand(c, allow_scalar=False, kinds="fi")
        y = self._second_operand(x if r.random() < 0.5 else c, kinds="fi")
        if y is not None:
            try:
                if math.prod(torch.broadcast_shapes(c.shape, x.shape, y.shape)) > self.max_numel:
                    y = None
            except RuntimeError:
                y = None
        if y is None:
            s = r.choice(_SCALARS_I if x.kind == "i" else _SCALARS_F)
            return self._emit(f"tp.where({c.name}, {x.name}, {_fmt(s)})", [c, x, s], "where",
                              min(x.lo, s), max(x.hi, s), op="where")
        return self._emit(f"tp.where({c.name}, {x.name}, {y.name})", [c, x, y], "where",
                          min(x.lo, y.lo), max(x.hi, y.hi), op="where")

    def _op_clamp(self):
        r = self.rng
        x = self._to_float(self._pick(lambda v: v.kind != "b"))
        lo = round(r.uniform(x.lo, x.hi) * 4) / 4
        hi = lo + r.choice([0.25, 1.0, 2.0, 8.0])
        form = r.choice(["both", "min", "max"])
        if form == "both":
            expr, ilo, ihi = f"tp.clamp({x.name}, min={_fmt(lo)}, max={_fmt(hi)})", lo, hi
        elif form == "min":
            expr, ilo, ihi = f"{x.name}.clamp(min={_fmt(lo)})", max(x.lo, lo), max(x.hi, lo)
        else:
            expr, ilo, ihi = f"tp.clamp({x.name}, max={_fmt(hi)})", min(x.lo, hi), min(x.hi, hi)
        return self._emit(expr, [x], "lip", ilo, ihi, op="clamp", L=1.0, k=0)

    def _op_cast(self):
        r = self.rng
        x = self._pick()
        if x.kind != "f":
            return self._to_float(x)
        c = r.choice(["bool", "int", "f64", "bool"])
        if c == "bool":
            return self._emit(f"{x.name}.to(tp.bool)", [x], "to_bool", 0, 1, op="cast")
        if c == "int":
            return self._emit(f"{x.name}.to(tp.int32)", [x], "to_int", math.floor(x.lo), math.ceil(x.hi), op="cast")
        if x.meta.dtype == torch.float64:
            raise _Reject("already f64")
        return self._emit(f"{x.name}.to(tp.float64)", [x], "cast", x.lo, x.hi, op="cast")

    def _op_logical(self):
        r = self.rng
        if not any(v.kind == "b" for v in self.vals):
            self._compare()
        a = self._pick(lambda v: v.kind == "b")
        if r.random() < 0.25:
            return self._emit(f"(~{a.name})", [a], "logical", 0, 1, op="logical")
        b = self._second_operand(a, allow_scalar=False, kinds="b")
        sym = r.choice(["&", "|", "^"])
        return self._emit(f"({a.name} {sym} {b.name})", [a, b], "logical", 0, 1, op="logical")

    def _red_dims(self, x, allow_tuple=True, allow_none=True):
        r, rank = self.rng, x.meta.dim()
        if rank == 0:
            return r.choice([None, 0, -1] if allow_none else [0, -1])
        c = r.random()
        if allow_none and c < 0.2:
            return None
        if not allow_tuple or c < 0.6:
            d = r.randrange(rank)
            return d - rank if r.random() < 0.3 else d
        return tuple(sorted(r.sample(range(rank), r.randint(1, rank))))

    @staticmethod
    def _red_count(x, dims):
        shape = x.shape
        if dims is None or not shape:
            return math.prod(shape)
        ds = (dims,) if isinstance(dims, int) else dims
        return math.prod(shape[d] for d in ds)

    def _op_reduction(self):
        r = self.rng
        op = r.choices(["sum", "mean", "amax", "amin", "prod", "var", "logsumexp", "anyall"],
                       weights=[5, 3, 2, 2, 1, 2, 2, 1])[0]
        if op == "anyall":
            if not any(v.kind == "b" for v in self.vals):
                self._compare()
            x = self._pick(lambda v: v.kind == "b")
        else:
            x = self._pick(lambda v: v.kind != "b" or op == "sum")
        if op in ("mean", "var", "logsumexp") and x.kind != "f":
            x = self._to_float(x)
        keep = r.random() < 0.4
        if op == "prod":
            dims = self._red_dims(x, allow_tuple=False, allow_none=False)
        elif op == "logsumexp":
            dims = self._red_dims(x, allow_none=False)
        elif op == "anyall":
            dims = self._red_dims(x, allow_tuple=False)
        else:
            dims = self._red_dims(x)
        n = self._red_count(x, dims)
        kw = [] if dims is None else [f"dim={dims!r}"]
        if keep and dims is not None:
            kw.append("keepdim=True")
        params = dict(dims=dims, keepdim=keep and dims is not None, n=n, op=op)
        if op == "sum":
            expr = f"{x.name}.sum({', '.join(kw)})" if r.random() < 0.8 or dims is None else \
                f"tp.sum({x.name}, {dims!r}, {keep})"
            lo, hi = (0, n) if x.kind == "b" else (n * min(x.lo, 0), n * max(x.hi, 0))
            return self._emit(expr, [x], "sum", lo, hi, **params)
        if op == "mean":
            return self._emit(f"{x.name}.mean({', '.join(kw)})", [x], "mean", x.lo, x.hi, **params)
        if op in ("amax", "amin"):
            return self._emit(f"{x.name}.{op}({', '.join(kw)})", [x], "amax", x.lo, x.hi, **params)
        if op == "prod":
            if n > 6:
                raise _Reject("prod too long")
            lo, hi = 1.0, 1.0
            for _ in range(n):
                lo, hi = _imul((lo, hi), (x.lo, x.hi))
            expr = f"{x.name}.prod({', '.join(kw)})"
            return self._emit(expr, [x], "prod", lo, hi, **params)
        if op == "var":
            corr = r.choice([0, 1, 1]) if n > 1 or r.random() < 0.1 else 0   # n <= correction: NaN, rarely
            kw2 = kw + ([f"correction={corr}"] if corr != 1 or r.random() < 0.3 else [])
            params["correction"] = corr
            return self._emit(f"{x.name}.var({', '.join(kw2)})", [x], "var", 0.0, (x.hi - x.lo) ** 2, **params)
        if op == "logsumexp":
            if n == 0:
                raise _Reject("logsumexp over nothing")
            expr = f"tp.logsumexp({x.name}, dim={dims!r}" + (", keepdim=True)" if params["keepdim"] else ")")
            return self._emit(expr, [x], "logsumexp", x.lo, x.hi + math.log(max(n, 1)), **params)
        which = r.choice(["any", "all"])
        params["op"] = which
        return self._emit(f"{x.name}.{which}({', '.join(kw)})", [x], "anyall", 0, 1, **params)

    def _reshape_target(self, shape):
        r = self.rng
        n = math.prod(shape)
        c = r.random()
        if c < 0.2 or len(shape) == 0:
            return (-1,) if r.random() < 0.5 else (n,)
        if c < 0.45 and len(shape) >= 2:
            i = r.randrange(len(shape) - 1)
            return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
        if c < 0.7:
            i = r.randrange(len(shape))
            s = shape[i]
            divs = [d for d in range(2, s) if s % d == 0]
            if divs:
                d = r.choice(divs)
                return shape[:i] + (d, s // d) + shape[i + 1:]
            return shape[:i] + (1,) + shape[i:]
        # random factorisation of n into up to 4 dims
        if n == 0:
            return shape[::-1]
        fs, m, p = [], n, 2
        while m > 1 and p * p <= m:
            while m % p == 0:
                fs.append(p)
                m //= p
            p += 1
        if m > 1:
            fs.append(m)
        k = r.randint(1, 4)
        dims = [1] * k
        for f_ in fs:
            dims[r.randrange(k)] *= f_
        if r.random() < 0.3:
            dims[r.randrange(k)] = -1
        return tuple(dims)

    def _index_parts(self, shape, generic=False):
        """``generic``: bounds valid at every size >= ``shape`` that select the same kind of slice
        there (no bound past the end)."""
        r = self.rng
        parts = []
        if r.random() < 0.15 and shape:
            parts.append("...")
            dims = list(range(len(shape) - r.randint(1, len(shape)), len(shape)))
        else:
            dims = list(range(r.randint(1, max(len(shape), 1)))) if shape else []
        for d in dims:
            if r.random() < 0.1:
                parts.append("None")
            s = shape[d]
            c = r.random()
            if c < 0.25:
                parts.append(":")
            elif c < 0.8:
                step = r.choice([None, None, 2, 3])
                if r.random() < 0.85 and s > 0:      # non-empty, positive or negative bounds
                    i0 = r.randrange(s)
                    i1 = r.randint(i0 + 1, s)
                    start = r.choice([None, i0, i0 - s]) if i0 == 0 else r.choice([i0, i0 - s])
                    stop = r.choice([None, s]) if i1 == s else r.choice([i1, i1 - s])
                else:                                # anything, empty or out of range included
                    start = r.choice([None, 0, 1, 2, -1, -2, s - 1, s + 1] if not generic else
                                     [None, 0, 1, -1, 1 - s])
                    stop = r.choice([None, s, 1, 3, -1, -2] if not generic else [None, s, 1, -1, 1 - s])
                parts.append(("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop))
                             + ("" if step is None else f":{step}"))
            elif s > 0:
                parts.append(str(r.randrange(-s, s)))
            else:
                parts.append(":")
        if not parts or r.random() < 0.1:
            parts.append("None")
        return parts

    def _op_view(self):
        r = self.rng
        x = self._pick()
        shape, rank = x.shape, x.meta.dim()
        kind = r.choices(["permute", "transpose", "mT", "reshape", "view", "expand", "broadcast_to", "unsqueeze",
                          "squeeze", "getitem", "select", "narrow", "flatten", "unflatten", "movedim", "flip",
                          "contiguous", "clone"],
                         weights=[3, 2, 1, 3, 2, 2, 1, 2, 2, 5, 2, 1, 1, 1, 1, 1, 1, 1])[0]
        if kind == "view" and x.unstable:
            kind = "reshape"
        expr, reads = self._view_expr(x, kind)
        v = self._emit(expr, [x] + reads, "view", x.lo, x.hi, op=kind)
        v.unstable = kind == "flip" or (x.unstable and kind != "contiguous")
        return v

    def _view_expr(self, x, kind):
        """The expression of view op ``kind`` on ``x`` and the other values whose sizes it reads."""
        r = self.rng
        shape, rank = x.shape, x.meta.dim()
        nm = x.name
        if kind == "permute":
            if rank < 2:
                raise _Reject("rank")
            p = list(range(rank))
            r.shuffle(p)
            expr = f"{nm}.permute{tuple(p)!r}" if r.random() < 0.5 else f"tp.permute({nm}, {tuple(p)!r})"
        elif kind == "transpose":
            if rank < 1:
                raise _Reject("rank")
            i, j = r.randrange(rank), r.randrange(rank)
            expr = f"{nm}.transpose({i}, {j - rank if r.random() < 0.3 else j})"
        elif kind == "mT":
            if rank < 2:
                raise _Reject("rank")
            expr = f"{nm}.mT" if r.random() < 0.5 or rank != 2 else f"{nm}.t()"
        elif kind in ("reshape", "view"):
            expr = f"{nm}.{kind}({self._reshape_target(shape)!r})"
        elif kind in ("expand", "broadcast_to"):
            uni = [v.shape for v in self.vals if len(v.shape) >= rank]
            target = list(r.choice(uni)) if uni and r.random() < 0.7 else list(shape)
            target = target[len(target) - rank:] if rank else []
            new = [t if s == 1 else s for s, t in zip(shape, target)] if rank else []
            new = [r.choice([2, 3, 4]) if s == 1 and t == 1 and r.random() < 0.3 else t for s, t in zip(shape, new)]
            if r.random() < 0.4 or new == list(shape):
                new = [r.choice([2, 3])] + new
            if kind == "expand":
                shown = [(-1 if (i >= len(new) - rank and r.random() < 0.3) else s) for i, s in enumerate(new)]
                expr = f"{nm}.expand({', '.join(map(str, shown))})"
            else:
                expr = f"tp.broadcast_to({nm}, {tuple(new)!r})"
        elif kind == "unsqueeze":
            d = r.randint(-rank - 1, rank)
            expr = f"{nm}.unsqueeze({d})"
        elif kind == "squeeze":
            ones = [i for i, s in enumerate(shape) if s == 1]
            if ones and r.random() < 0.7:
                expr = f"{nm}.squeeze({r.choice(ones)})"
            else:
                expr = f"{nm}.squeeze()"
        elif kind == "getitem":
            expr = f"{nm}[{', '.join(self._index_parts(shape))}]"
        elif kind == "select":
            if rank < 1 or 0 in shape:
                raise _Reject("select")
            d = r.randrange(rank)
            expr = f"{nm}.select({d}, {r.randrange(-shape[d], shape[d])})"
        elif kind == "narrow":
            if rank < 1:
                raise _Reject("narrow")
            d = r.randrange(rank)
            start = r.randint(0, shape[d])
            expr = f"{nm}.narrow({d}, {start}, {r.randint(0, shape[d] - start)})"
        elif kind == "flatten":
            if rank < 1:
                raise _Reject("rank")
            i = r.randrange(rank)
            expr = f"{nm}.flatten({i}, {r.randrange(i, rank)})" if r.random() < 0.7 else f"{nm}.flatten()"
        elif kind == "unflatten":
            if rank < 1:
                raise _Reject("rank")
            d = r.randrange(rank)
            s = shape[d]
            divs = [k for k in range(1, s + 1) if s and s % k == 0]
            if not divs:
                raise _Reject("unflatten")
            k = r.choice(divs)
            expr = f"{nm}.unflatten({d}, ({k}, {-1 if r.random() < 0.3 else s // k}))"
        elif kind == "movedim":
            if rank < 2:
                raise _Reject("rank")
            expr = f"{nm}.movedim({r.randrange(rank)}, {r.randrange(rank)})"
        elif kind == "flip":
            if rank < 1:
                raise _Reject("rank")
            expr = f"tp.flip({nm}, {tuple(sorted(r.sample(range(rank), r.randint(1, rank))))!r})"
        else:
            expr = f"{nm}.{kind}()"
        return expr, []

    # -- driver ----------------------------------------------------------------------------------------
    FAMILIES = {"unary": 28, "binary": 28, "reduction": 12, "view": 20, "where": 4, "compare": 2, "clamp": 3,
                "cast": 2, "logical": 1, "softmax": 2, "inplace": 3}

    def _op_inplace(self):
        """``x.add_(y)``, ``x.clamp_(...)``, ... on a fresh, unused intermediate (not an input, not a view:
        the mutation must not reach anything else); x is dead afterwards, the result (x itself) lives on."""
        r = self.rng
        cands = [v for v in self.vals if not v.is_input and not v.dead and v.uses == 0 and v.kind == "f"
                 and self.nodes[int(v.name[1:])].rule not in ("view", "cast")]
        if not cands:
            raise _Reject("nothing to mutate")
        x = r.choice(cands)
        op = r.choice(["add_", "sub_", "mul_", "clamp_", "relu_", "neg_", "abs_", "add_", "mul_"])
        nm = x.name
        if op in ("relu_", "neg_", "abs_"):
            lo, hi = _unary_interval(op[:-1], x.lo, x.hi)
            rule, extra = ("mono", {}) if op == "relu_" else ("lip", dict(L=1.0, k=0))
            v = self._emit(f"{nm}.{op}()", [x], rule, lo, hi, op=op, inplace=True, **extra)
        elif op == "clamp_":
            lo = round(r.uniform(x.lo, x.hi) * 4) / 4
            hi = lo + r.choice([0.5, 2.0])
            v = self._emit(f"{nm}.clamp_(min={_fmt(lo)}, max={_fmt(hi)})", [x], "lip", lo, hi, op=op, inplace=True,
                           L=1.0, k=0)
        else:
            b = None
            if r.random() < 0.6:
                cands = [w for w in self.vals if not w.dead and w.kind in "fi" and w.meta.dim() <= x.meta.dim()]
                cands = [w for w in cands if _broadcasts_into(w.shape, x.shape)]
                b = r.choice(cands) if cands else None
            if b is None:
                c = r.choice(_SCALARS_F)
                blo = bhi = c
                arg, argv = _fmt(c), c
            else:
                blo, bhi, arg, argv = b.lo, b.hi, b.name, b
            if op == "add_":
                lo, hi = x.lo + blo, x.hi + bhi
            elif op == "sub_":
                lo, hi = x.lo - bhi, x.hi - blo
            else:
                lo, hi = _imul((x.lo, x.hi), (blo, bhi))
            v = self._emit(f"{nm}.{op}({arg})", [x, argv], op[:-1], lo, hi, op=op, inplace=True)
        x.dead = True
        return v

    def _op_softmax(self):
        r = self.rng
        x = self._to_float(self._pick(lambda v: v.kind != "b"))
        rank = x.meta.dim()
        d = r.randrange(-max(rank, 1), max(rank, 1))
        n = x.shape[d] if rank else 1
        if r.random() < 0.6:
            expr = f"tp.softmax({x.name}, dim={d})" if r.random() < 0.5 else f"{x.name}.softmax({d})"
            return self._emit(expr, [x], "softmax", 0.0, 1.0, op="softmax", dim=d, n=n)
        return self._emit(f"tp.log_softmax({x.name}, dim={d})", [x], "log_softmax",
                          x.lo - x.hi - math.log(max(n, 1)), 0.0, op="log_softmax", dim=d, n=n)

    def generate(self) -> Program:
        r = self.rng
        self._make_inputs()
        target = r.randint(self.min_ops, max(self.min_ops, self.max_ops - 2))   # a guarded op adds <= 3 nodes
        fams = list(self.FAMILIES)
        weights = [self.FAMILIES[f] for f in fams]
        attempts = 0
        while len(self.nodes) < target and attempts < 50 * self.max_ops:
            attempts += 1
            fam = r.choices(fams, weights=weights)[0]
            try:
                getattr(self, f"_op_{fam}")()
            except _Reject:
                pass
        if not self.nodes:   # every attempt rejected (tiny/empty inputs): one exact op
            x = self.vals[0]
            self._emit(f"{x.name}.clone()", [x], "view", x.lo, x.hi, op="clone")
        # outputs: the most recent unused values (always the last node), sometimes an extra one
        sinks = [v for v in self.vals if v.uses == 0 and not v.is_input]
        k = r.randint(1, 4)
        outs = [self.vals[-1].name] + [v.name for v in reversed(sinks) if v.name != self.vals[-1].name][:k - 1]
        if r.random() < 0.15:
            outs.append(r.choice([v for v in self.vals if not v.dead]).name)   # an intermediate, an input, a duplicate
        return Program(self.seed, self.inputs, self.nodes, outs)


def _broadcasts_into(small, big):
    """Can a tensor of shape ``small`` be broadcast to exactly ``big`` (in-place operand)?"""
    try:
        return tuple(torch.broadcast_shapes(tuple(small), tuple(big))) == tuple(big)
    except RuntimeError:
        return False


def generate(seed: int, min_ops: int = 5, max_ops: int = 40) -> Program:
    """The random program of ``seed`` (deterministic)."""
    return ProgramGenerator(seed, min_ops, max_ops).generate()


# ---------------------------------------------------------------------------------------------------
# size-generic programs (dynamic=True): one program, several universe sizes
# ---------------------------------------------------------------------------------------------------
class DynamicProgramGenerator(ProgramGenerator):
    """Programs valid at several sizes: every size a view op needs is written from an operand's sizes
    (``v3.reshape(v3.shape[0] * v3.shape[1], -1)``, ``a1.expand(3, a0.shape[1], -1)``,
    ``v2.narrow(1, 1, v2.shape[1] - 1)``), never as the sample's number.  The universe shape has
    ``instances`` size draws (instance 0 is the sample); a universe dim is either *fixed* (0 or 1 at
    every instance: 0 and 1 are specialised by design, the chapter §10.2 — a broadcast dim stays 1)
    or *dynamic* (a new size >= 2 at every instance, sometimes all multiples of 2 or 4, so that
    splits ``(s // 2, 2)`` stay valid).  Every candidate op is evaluated at every instance and kept
    only when it is valid there, stays within the size budget, and every dim of its result is 0 at
    all instances, 1 at all, or >= 2 at all (no instance turns a symbolic size into a specialised
    0/1 one, which would legitimately need another compilation).  Intervals use the largest
    reduction length over the instances."""

    def __init__(self, seed: int, min_ops: int = 5, max_ops: int = 40, instances: int = 5):
        super().__init__(seed, min_ops, max_ops)
        self.instances = instances
        self.metas: dict = {}          # value name -> its meta tensor at each instance
        self.universes: list = []

    # -- inputs: the universe at each instance -----------------------------------------------------------
    def _universe(self, big):
        r, n = self.rng, self.instances
        kinds = ["dyn" if r.random() > 0.12 else "one" for _ in range(3)] + ["dyn"]
        if r.random() < 0.05:
            kinds[r.randrange(4)] = "zero"
        if big:
            kinds[r.randrange(2, 4)] = "big"
        cols = []
        for kind in kinds:
            if kind in ("one", "zero"):
                cols.append([int(kind == "one")] * n)
                continue
            q = r.choice([1, 1, 1, 2, 4])
            lo, top = (100, 1100) if kind == "big" else (2, 24)
            cols.append([q * m for m in r.sample(range(-(-lo // q), top // q + 1), n)])
        return [tuple(c[k] for c in cols) for k in range(n)]

    def _make_inputs(self):
        r = self.rng
        big = r.random() < 0.1
        self.max_numel = MAX_NUMEL_BIG if big else MAX_NUMEL
        for _ in range(100):      # the sample's dynamic sizes differ from each other: a relation the
            unis = self._universe(big)   # program makes between two dims cannot hold by accident
            dyn = [s for s, t in zip(unis[0], unis[1]) if s != t]
            if len(set(dyn)) == len(dyn):
                break
        self.universes = unis
        n_in = r.choice([1, 1, 2, 2, 2, 3, 3, 4])
        has_specials = r.random() < 0.25
        for k in range(n_in):
            for _ in range(10):   # the first input has a dynamic size
                rank = r.choices([0, 1, 2, 3, 4], weights=[1, 3, 4, 3, 2])[0]
                dims = [d if r.random() >= 0.2 else None for d in range(4 - rank, 4)]  # None: broadcast dim 1
                if k or any(d is not None and unis[0][d] != unis[1][d] for d in dims):
                    break

            def shapes_of(dims):
                return [tuple(1 if d is None else u[d] for d in dims) for u in unis]
            while max(math.prod(s) for s in shapes_of(dims)) > self.max_numel // 4:
                i = max(range(rank), key=lambda j: max(s[j] for s in shapes_of(dims)))
                dims[i] = None
            shapes = tuple(shapes_of(dims))
            spec = self._input_spec(k, shapes[0], has_specials, shapes)
            self.inputs.append(spec)
            lo, hi = _input_interval(spec)
            self.vals.append(_Val(spec.name, _meta_input(spec), lo, hi, is_input=True))
            self.metas[spec.name] = [_meta_input(dataclasses.replace(spec, shape=s)) for s in shapes]

    # -- emission: valid at every instance ---------------------------------------------------------------
    def _candidate(self, expr, args):
        metas = [self._evaluate(expr, {a.name: a.meta if k == 0 else self.metas[a.name][k]
                                       for a in args if isinstance(a, _Val)}) for k in range(self.instances)]
        shapes = [tuple(m.shape) for m in metas]
        if any(len(sh) != len(shapes[0]) for sh in shapes):
            raise _Reject(expr)
        for col in zip(*shapes):
            if not (all(c == 0 for c in col) or all(c == 1 for c in col) or all(c >= 2 for c in col)):
                raise _Reject(f"{expr}: a size is 0/1 at some instances only")
        self._pending = metas
        return metas[0]

    def _emit(self, expr, args, rule, lo, hi, **params):
        v = super()._emit(expr, args, rule, lo, hi, **params)
        self.metas[v.name] = self._pending
        self.nodes[-1].shapes = tuple(tuple(m.shape) for m in self._pending)
        return v

    def _red_count(self, x, dims):
        """The longest reduction over the instances (for the intervals)."""
        return max(ProgramGenerator._red_count(m, dims) for m in self.metas[x.name])

    def _min_shape(self, x):
        return tuple(min(c) for c in zip(*[m.shape for m in self.metas[x.name]])) if x.shape else ()

    # -- size-generic view arguments -----------------------------------------------------------------------
    def _size(self, nm, d):
        return f"{nm}.shape[{d}]" if self.rng.random() < 0.6 else f"{nm}.size({d})"

    def _reshape_dyn(self, x):
        r, nm, shape = self.rng, x.name, x.shape
        rank = len(shape)
        c = r.random()
        if c < 0.2 or rank == 0:
            return ["-1"] if r.random() < 0.5 or rank == 0 else [" * ".join(self._size(nm, d) for d in range(rank))]
        sizes = [self._size(nm, d) for d in range(rank)]
        if c < 0.45 and rank >= 2:
            i = r.randrange(rank - 1)
            return sizes[:i] + [f"{sizes[i]} * {sizes[i + 1]}"] + sizes[i + 2:]
        if c < 0.7:
            i = r.randrange(rank)
            g = math.gcd(*[m.shape[i] for m in self.metas[nm]])
            divs = [d for d in range(2, g) if g % d == 0]     # divides the size at every instance
            if divs:
                d = r.choice(divs)
                parts = [f"{sizes[i]} // {d}", str(d)] if r.random() < 0.5 else [str(d), "-1"]
                return sizes[:i] + parts + sizes[i + 1:]
            return sizes[:i] + ["1"] + sizes[i:]
        # contiguous groups of dims, each written as the product of its sizes; one may be -1; 1s inserted
        cuts = sorted(r.sample(range(1, rank), r.randint(0, rank - 1))) if rank > 1 else []
        groups = [" * ".join(sizes[a:b]) for a, b in zip([0] + cuts, cuts + [rank])]
        if r.random() < 0.3:
            groups[r.randrange(len(groups))] = "-1"
        for _ in range(r.choice([0, 0, 1, 2])):
            groups.insert(r.randint(0, len(groups)), "1")
        return groups

    def _view_expr(self, x, kind):
        r, nm = self.rng, x.name
        shape, rank = x.shape, x.meta.dim()
        low = self._min_shape(x)
        if kind in ("reshape", "view"):
            target = self._reshape_dyn(x)
            if r.random() < 0.5:
                return f"{nm}.{kind}({', '.join(target)})", []
            return f"{nm}.{kind}(({', '.join(target)}{',' if len(target) == 1 else ''}))", []
        if kind in ("expand", "broadcast_to"):
            ws = [v for v in self.vals if len(v.shape) >= rank and not v.dead and v is not x]
            w = r.choice(ws) if ws and r.random() < 0.7 else None
            out, reads = [], []
            off = len(w.shape) - rank if w is not None else 0
            for i, s in enumerate(shape):
                if s == 1 and w is not None and w.shape[off + i] != 1:
                    out.append(self._size(w.name, off + i))
                    reads = [w]
                elif s == 1 and r.random() < 0.3:
                    out.append(str(r.choice([2, 3, 4])))
                else:
                    out.append("-1" if kind == "expand" and r.random() < 0.5 else self._size(nm, i))
            if w is not None and off and r.random() < 0.5:
                out = [self._size(w.name, j) for j in range(off)] + out
                reads = [w]
            elif r.random() < 0.4 or all(o == "-1" or o.startswith(nm + ".") for o in out):
                out = [str(r.choice([2, 3]))] + out
            if kind == "expand":
                return f"{nm}.expand({', '.join(out)})", reads
            return f"tp.broadcast_to({nm}, ({', '.join(out)}{',' if len(out) == 1 else ''}))", reads
        if kind == "getitem":
            return f"{nm}[{', '.join(self._index_parts(low, generic=True))}]", []
        if kind == "select":
            if rank < 1 or 0 in low:
                raise _Reject("select")
            d = r.randrange(rank)
            return f"{nm}.select({d}, {r.randrange(-low[d], low[d])})", []
        if kind == "narrow":
            if rank < 1:
                raise _Reject("narrow")
            d = r.randrange(rank)
            start = r.randint(0, low[d])
            if r.random() < 0.5:
                return f"{nm}.narrow({d}, {start}, {self._size(nm, d)} - {start})", []
            # a literal length short of the dim at every instance (the whole dim at one instance, torch
            # specialises the size to the literal)
            return f"{nm}.narrow({d}, {start}, {r.randint(0, max(0, low[d] - start - 1))})", []
        if kind == "unflatten":
            if rank < 1:
                raise _Reject("rank")
            d = r.randrange(rank)
            g = math.gcd(*[m.shape[d] for m in self.metas[nm]])
            divs = [k for k in range(1, g + 1) if g % k == 0]
            if not divs:
                raise _Reject("unflatten")
            k = r.choice(divs)
            second = "-1" if r.random() < 0.4 else f"{self._size(nm, d)} // {k}"
            return f"{nm}.unflatten({d}, ({k}, {second}))", []
        return super()._view_expr(x, kind)

    def generate(self) -> Program:
        prog = super().generate()
        return dataclasses.replace(prog, universes=tuple(self.universes))


def generate_dynamic(seed: int, min_ops: int = 5, max_ops: int = 40, instances: int = 5) -> Program:
    """The size-generic random program of ``seed`` (deterministic): ``prog.at(k)`` is its instance ``k``
    (``k = 0``: the sample), ``make_inputs(prog.at(k))`` its inputs there."""
    return DynamicProgramGenerator(seed, min_ops, max_ops, instances).generate()


# ---------------------------------------------------------------------------------------------------
# error model (running error analysis in float64)
# ---------------------------------------------------------------------------------------------------
def _f64(x):
    return x.to(torch.float64)


def _fin(x):
    """float64 copy with nonfinite entries replaced by 0 (magnitudes of the finite part)."""
    x = _f64(x)
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=torch.float64))


def _nonfinite(x):
    return ~torch.isfinite(x) if x.is_floating_point() else torch.zeros(x.shape, dtype=torch.bool)


_MONO_FN = {
    "exp": (torch.exp, 1), "expm1": (torch.expm1, 1), "log": (torch.log, 1), "log1p": (torch.log1p, 1),
    "sqrt": (torch.sqrt, 1), "rsqrt": (torch.rsqrt, 1), "reciprocal": (torch.reciprocal, 1),
    "tanh": (torch.tanh, 1), "sigmoid": (torch.sigmoid, 1), "erf": (torch.erf, 1), "relu": (torch.relu, 1),
    "floor": (torch.floor, 1), "ceil": (torch.ceil, 1), "trunc": (torch.trunc, 1), "round": (torch.round, 1),
    "sign": (torch.sign, 1), "pow3": (lambda t: torch.pow(t, 3), 1), "pow05": (torch.sqrt, 1),
    "pow15": (lambda t: torch.pow(t, 1.5), 1), "powm1": (torch.reciprocal, 1),
}
#: ulps of rounding per op (0 = exact)
_K = {"exp": K_LIB, "expm1": K_LIB, "log": K_LIB, "log1p": K_LIB, "sqrt": 2.0, "rsqrt": K_LIB, "reciprocal": 2.0,
      "tanh": K_LIB, "sigmoid": K_LIB, "erf": K_LIB, "relu": 0.0, "floor": 0.0, "ceil": 0.0, "trunc": 0.0,
      "round": 0.0, "sign": 0.0, "pow3": K_LIB, "pow05": 2.0, "pow15": K_LIB, "powm1": 2.0}
_LIP_FN = {"sin": torch.sin, "cos": torch.cos, "gelu": F.gelu, "silu": F.silu}


def _reduce(t, dims, keepdim, how):
    """``how`` in sum/amax/prod of a float64 tensor over ``dims`` (None = all); empty -> identity."""
    if t.dim() == 0:
        return t.clone()
    if dims is None:
        dims = tuple(range(t.dim()))
    elif isinstance(dims, int):
        dims = (dims,)
    dims = tuple(d % t.dim() for d in dims)
    if how == "sum":
        return t.sum(dim=dims, keepdim=keepdim)
    if how == "prod":
        out = t
        for d in sorted(dims, reverse=True):
            out = out.prod(dim=d, keepdim=True)
        if not keepdim:
            for d in sorted(dims, reverse=True):
                out = out.squeeze(d)
        return out
    if any(t.shape[d] == 0 for d in dims):
        shape = [1 if (d in dims) else s for d, s in enumerate(t.shape)] if keepdim else \
            [s for d, s in enumerate(t.shape) if d not in dims]
        return torch.zeros(shape, dtype=t.dtype)
    return t.amax(dim=dims, keepdim=keepdim)


def _node_error(node: Node, vals, errs, out):
    """E of ``node``'s result from its arguments' values/errors (float64) and its float64 result."""
    rule, p = node.rule, node.params
    u = U.get(node.dtype, 0.0) if node.dtype.is_floating_point else 0.0
    eta = ETA.get(node.dtype, 0.0) if node.dtype.is_floating_point else 0.0
    fo = _fin(out)
    zero = torch.zeros((), dtype=torch.float64)

    if rule == "view":
        env = {n: e for n, e in zip(node.args, errs) if isinstance(n, str)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return eval(node.expr, {"tp": _TSHIM, "FLOAT": torch.float64}, env)
    if rule == "cast":
        (x,), (ex,) = vals, errs
        e = ex       # .to() of the same dtype aliases: keep the layout
        if node.dtype.is_floating_point and x.dtype.is_floating_point and U[node.dtype] > U.get(x.dtype, 0.0):
            e = e + u * (fo.abs() + ex) + eta
        return e
    if rule == "to_bool":
        (x,), (ex,) = vals, errs
        return (((ex > 0) & (_fin(x).abs() <= ex) & torch.isfinite(x)) | torch.isinf(ex)).to(torch.float64)
    if rule == "to_int":
        (x,), (ex,) = vals, errs
        a = _fin(x)
        e = torch.maximum((torch.trunc(a + ex) - torch.trunc(a)).abs(), (torch.trunc(a) - torch.trunc(a - ex)).abs())
        return torch.where(torch.isfinite(x), e, torch.inf)   # float -> int of NaN/inf is undefined
    if rule == "mono":
        (x,), (ex,) = vals, errs
        op = p["op"].rstrip("_")       # relu_ is relu
        f = _MONO_FN[op][0]
        a = _fin(x)
        lo, hi = a - ex, a + ex
        if op in ("sqrt", "log1p", "pow05", "pow15"):
            lo = lo.clamp(min=-1.0 if op == "log1p" else 0.0)
        fa = f(a)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prop = torch.maximum((f(hi) - fa).abs(), (fa - f(lo)).abs())
        prop = torch.where(ex > 0, prop, zero)
        prop = torch.where(torch.isinf(ex), torch.inf, prop)   # undecided (maybe NaN) stays undecided
        nf = ~torch.isfinite(x)     # f(±inf), f(NaN) are determined: exact unless undecided
        k = _K[op]
        if not k:
            return torch.where(nf & ~torch.isinf(ex), zero, prop)
        # the computed result lies anywhere in f([lo, hi]): round relative to the largest of it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scale = torch.where(ex > 0, torch.maximum(f(lo).abs(), f(hi).abs()), zero)
        scale = torch.maximum(fa.abs(), scale) + (1.0 if op == "log" else 0.0)
        return torch.where(nf & ~torch.isinf(ex), zero, prop + k * u * scale + k * eta)
    if rule == "lip":
        (x,), (ex,) = vals, errs
        k = p.get("k", 0)
        e = p["L"] * ex
        op = p["op"]
        if k:
            a = _fin(x)
            fa = _LIP_FN[op](a)
            scale = fa.abs() + e + (a.abs() + ex if op == "gelu" else 0.0) \
                + (2.0 ** -8 if op in ("sin", "cos") else 0.0)
            e = e + k * u * scale + k * eta
        if op in ("gelu", "silu"):   # ATen returns NaN at ±inf where the limit is ±inf / 0
            e = torch.where(torch.isinf(x), torch.inf, e)
        return e
    if rule == "square":
        (x,), (ex,) = vals, errs
        a = _fin(x).abs()
        prop = (2 * a + ex) * ex
        return prop + u * (fo.abs() + prop) + (eta if u else 0.0)
    if rule in ("add", "sub"):
        ea, eb = errs
        return ea + eb + u * (fo.abs() + ea + eb)
    if rule == "mul":
        (a, b), (ea, eb) = vals, errs
        fa, fb = _fin(a).abs(), _fin(b).abs()
        prop = fa * eb + fb * ea + ea * eb
        e = prop + u * (fo.abs() + prop) + (eta if u else 0.0)
        # inf times an uncertain factor: the sign or NaN-ness is undecided
        return torch.where((_nonfinite(a) & (eb > 0)) | (_nonfinite(b) & (ea > 0)), torch.inf, e)
    if rule == "div":
        (a, b), (ea, eb) = vals, errs
        q = fo.abs()
        den = _fin(b).abs() - eb
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            e = torch.where(den > 0, (ea + q * eb) / den, torch.inf)
        e = e + p.get("k", 1) * u * (q + e) + eta
        # x / ±inf = ±0 and NaN / y = NaN whatever the rounding of the other operand
        det = (_nonfinite(b) | _nonfinite(a)) & ~torch.isinf(ea) & ~torch.isinf(eb)
        return torch.where(det, zero, e)
    if rule == "maxmin":
        ea, eb = errs
        return torch.maximum(ea, eb)
    if rule == "cmp":
        (a, b), (ea, eb) = vals, errs
        tol = ea + eb
        unc = (tol > 0) & ((_fin(a) - _fin(b)).abs() <= tol) & torch.isfinite(_f64(a)) & torch.isfinite(_f64(b))
        return (unc | torch.isinf(tol)).to(torch.float64)       # an undecided operand (maybe NaN) decides nothing
    if rule == "logical":
        return torch.clamp(sum(errs), max=1.0) if len(errs) > 1 else errs[0].clone()
    if rule == "where":
        (c, x, y), (ec, ex, ey) = vals, errs
        xf, yf = _f64(x), _f64(y)
        chosen = torch.where(c, ex, ey)
        same = (xf == yf) | (torch.isnan(xf) & torch.isnan(yf))
        nonfin = ~torch.isfinite(xf) | ~torch.isfinite(yf)
        unc = torch.maximum(ex, ey) + (_fin(x) - _fin(y)).abs()
        unc = torch.where(nonfin & ~same, torch.inf, unc)
        return torch.where(ec > 0, unc, chosen)
    if rule in ("softmax", "log_softmax"):
        (x,), (ex,) = vals, errs
        n = x.shape[p["dim"]] if x.dim() else 1     # of the operand at hand (a size-generic program)
        if out.numel() == 0:
            return torch.zeros(out.shape, dtype=torch.float64)
        d = p["dim"] if x.dim() else None
        a = _fin(x)
        red = (lambda t: t.amax(dim=d, keepdim=True)) if d is not None else (lambda t: t)
        mex = red(ex)
        m = red(a)
        t = (a - m).abs()                       # |x_i - max|: the rounding of the shifted exponent
        rel = (K_LIB + 3 + 2 * math.sqrt(n)) * u + u * torch.clamp(red(t), max=float(n))
        if rule == "softmax":
            y = fo.abs()
            e = y * (ex + mex) + y * rel + u * y * t + eta
            e = torch.clamp(e, max=1.0)         # any evaluation stays in [0, 1]
        else:
            e = ex + mex + rel + u * (t + fo.abs()) + eta
        undecided = red(torch.isinf(ex).to(torch.float64)) > 0
        return torch.where(undecided, torch.inf, e)
    # reductions
    dims, keep = p["dims"], p["keepdim"]
    (x,), (ex,) = vals, errs
    n = ProgramGenerator._red_count(x, dims)     # of the operand at hand (a size-generic program)
    a = _fin(x)
    if rule == "sum":
        g = 2.0 * math.sqrt(n) * u if n > 1 else 0.0
        return _reduce(ex, dims, keep, "sum") + g * _reduce(a.abs() + ex, dims, keep, "sum")
    if rule == "mean":
        if n == 0:
            return torch.zeros(out.shape, dtype=torch.float64)
        g = 2.0 * math.sqrt(n) * u if n > 1 else 0.0
        e = (_reduce(ex, dims, keep, "sum") + g * _reduce(a.abs() + ex, dims, keep, "sum")) / n
        return e + u * (fo.abs() + e) + eta
    if rule in ("amax", "anyall"):
        e = _reduce(ex, dims, keep, "amax")
        return e.clamp(max=1.0) if rule == "anyall" else e
    if rule == "prod":
        if n == 0:
            return torch.zeros(out.shape, dtype=torch.float64)
        p1 = _reduce(a.abs() + ex, dims, keep, "prod")
        p0 = _reduce(a.abs(), dims, keep, "prod")
        e = (p1 - p0) + n * u * p1 + (n * eta if u else 0.0)
        risky = _reduce((_nonfinite(x)).to(torch.float64), dims, keep, "amax") * \
            _reduce((ex > 0).to(torch.float64), dims, keep, "amax")
        return torch.where(risky > 0, torch.inf, e)
    if rule == "var":
        corr = p["correction"]
        D = n - corr
        if D <= 0:
            return torch.zeros(out.shape, dtype=torch.float64)
        m = _reduce(a, dims, True, "sum") / n
        dev = (a - m).abs()
        S = _reduce(dev * dev, dims, keep, "sum")
        prop = (2 * _reduce(dev * ex, dims, keep, "sum") + _reduce(ex * ex, dims, keep, "sum")) / D
        g = 2.0 * math.sqrt(n) * u
        mk = m if keep else _reduce(a, dims, keep, "sum") / n
        dm = g * _reduce(a.abs(), dims, keep, "sum") / n + u * mk.abs()
        # float32 Welford / parallel-combine updates (CUDA, compiled kernels) do not cancel the mean's
        # error to first order: ~ sqrt(n) u kappa S with kappa = ||x|| / sqrt(S) (Chan, Golub, LeVeque)
        welford = g * torch.sqrt(S * _reduce(a * a, dims, keep, "sum"))
        rnd = ((2 * u + g) * S + n * dm * dm + welford) / D
        return prop + rnd + u * (fo.abs() + prop + rnd) + eta
    if rule == "logsumexp":
        g = 2.0 * math.sqrt(n) * u
        prop = _reduce(ex, dims, keep, "amax")
        return prop + u * (K_LIB + 1) + g + 2 * u * _reduce(a.abs() + ex, dims, keep, "amax") \
            + 2 * u * (fo.abs() + prop) + eta
    raise KeyError(f"no error rule {rule!r}")


def error_model(prog: Program, inputs):
    """Run the program node by node on ``inputs`` (torch tensors; floats are upcast to float64 —
    pass ``make_inputs(prog, which, upcast=True)`` to keep the strides); returns ``(values, errors)``:
    the float64 value and the error bound E of every output."""
    V, E = {}, {}
    D = {s.name: s.dtype for s in prog.inputs}           # dtypes in the float32 program
    D.update({n.name: n.dtype for n in prog.nodes})
    for spec, t in zip(prog.inputs, inputs):
        V[spec.name] = _f64(t) if t.is_floating_point() else t   # same strides as the program's input
        # E has the value's layout (stride-0 dims included), so view expressions apply to it too
        E[spec.name] = _storage_view(spec, "cpu", lambda s: torch.zeros(s, dtype=torch.float64))
    ns = {"tp": _TSHIM, "FLOAT": torch.float64}
    for node in prog.nodes:
        vals = [V[a] if isinstance(a, str) else torch.tensor(a, dtype=torch.float64 if isinstance(a, float)
                                                              else torch.int64) for a in node.args]
        if node.params.get("inplace"):
            vals = [v.clone() for v in vals]       # the rule reads the operands before the mutation
        env = {a: V[a] for a in node.args if isinstance(a, str)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = eval(node.expr, ns, env)
        errs = [E[a] if isinstance(a, str) else torch.zeros((), dtype=torch.float64) for a in node.args]
        # an operand of higher precision than the op's computation dtype (a float64 0-dim tensor
        # with a float32 tensor computes in float32) is rounded first
        if node.rule not in ("view", "cast", "to_bool", "to_int"):
            tgt = node.dtype
            if node.rule == "cmp":
                tgt = torch.result_type(*[torch.empty(() if V[a].dim() == 0 else (0,), dtype=D[a])
                                          if isinstance(a, str) else a for a in node.args])
            if tgt.is_floating_point:
                for i, a in enumerate(node.args):
                    if isinstance(a, str) and D[a].is_floating_point and U[tgt] > U[D[a]]:
                        errs[i] = errs[i] + U[tgt] * (_fin(vals[i]).abs() + errs[i]) + ETA[tgt]
        e = _node_error(node, vals, errs, out)
        e = torch.broadcast_to(_f64(e), out.shape)
        e = torch.where(torch.isnan(e), torch.inf, e)
        if node.rule != "view" and e.stride() != out.stride():
            if all(st != 0 or sz <= 1 for st, sz in zip(out.stride(), out.shape)):
                e = torch.empty_strided(out.shape, out.stride(), dtype=torch.float64).copy_(e)
        E[node.name] = e
        V[node.name] = out
    return [V[o] for o in prog.outputs], [E[o] for o in prog.outputs]


# ---------------------------------------------------------------------------------------------------
# checker
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class CheckResult:
    seed: int
    failures: list            # one line each: TensorPlay disagrees with the error model
    model_violations: list    # one line each: float32 eager is outside E (a bug of this tester)
    checked: int = 0          # output elements compared
    empty_outputs: int = 0    # outputs compared that have no elements (their shapes are still judged)
    outputs: int = 0          # outputs compared
    unconstrained: int = 0    # output elements the model could not decide (E = inf)
    source: str = ""
    backend: str = ""
    captures: int = 0         # check_dynamic: specializations the calls made ...
    recompile_reasons: list = dataclasses.field(default_factory=list)   # ... and why each after the first
    explain: str = ""         # check_dynamic: the compiled function's explain() when it made more than one

    @property
    def ok(self):
        return not self.failures

    def report(self, model=False) -> str:
        """The full report: what failed, how to re-run it, the program."""
        issues = self.model_violations if model else self.failures
        what = "ERROR MODEL (tester) too tight" if model else f"{len(issues)} problem(s)"
        return (f"random program seed={self.seed} backend={self.backend!r}: {what}\n"
                + "".join(f"  - {m}\n" for m in issues)
                + (f"re-run: python test/stax/random_programs.py --dynamic --seed {self.seed} "
                   if "size-generic" in self.source else
                   f"re-run (add --minimize to shrink it): python test/stax/random_programs.py --seed {self.seed} ")
                + f"--backend {self.backend}\n{self.source}")


def _to_torch(out):
    if isinstance(out, tp.Tensor):
        return out._data.detach().clone()
    if isinstance(out, (tuple, list)):
        return [_to_torch(o) for o in out]
    return out


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _flatten_outs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _fmt_idx(i):
    return tuple(int(v) for v in i)


def compare(got, eager32, ref64, E, *, c1=C1, c2=C2):
    """Compare one output.  Returns ``(message or None, checked, unconstrained)``."""
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}", 0, 0
    if tuple(got.shape) != tuple(eager32.shape):
        return f"shape {list(got.shape)} != eager {list(eager32.shape)}", 0, 0
    if got.dtype != eager32.dtype:
        return f"dtype {got.dtype} != eager {eager32.dtype}", 0, 0
    if got.numel() == 0:
        return None, 0, 0
    E = E.broadcast_to(got.shape)
    free = torch.isinf(E)
    nfree = int(free.sum())
    if not got.dtype.is_floating_point:
        g, e = got.to(torch.float64), eager32.to(torch.float64)
        if got.dtype == torch.bool:
            bad = (g != e) & (E == 0)
        else:
            bad = ((g - e).abs() > 2 * E) & ~free
        if bool(bad.any()):
            i = _fmt_idx(bad.nonzero()[0])
            return (f"{int(bad.sum())} of {got.numel()} elements differ; first at {i}: compiled={got[i].item()} "
                    f"eager32={eager32[i].item()} ref64={ref64[i].item()} E={E[i].item():.3g}"), \
                got.numel() - nfree, nfree
        return None, got.numel() - nfree, nfree
    g, e, r = _f64(got), _f64(eager32), _f64(ref64)
    nf_e = ~torch.isfinite(e)
    # nonfinite positions: the same nonfinite value
    same_nf = (torch.isnan(g) & torch.isnan(e)) | (g == e)
    bad_nf = nf_e & ~free & ~same_nf
    ref = torch.where(torch.isfinite(r), r, e)
    fin = ~nf_e & ~free
    err = (g - ref).abs()
    tol = torch.maximum(c1 * (e - ref).abs(), c2 * E)
    bad_fin = fin & ~(err <= tol)          # NaN/inf compiled at a finite position fails too
    bad = bad_nf | bad_fin
    if bool(bad.any()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ratio = torch.where(bad_fin, err / tol, torch.zeros((), dtype=torch.float64))
        ratio = torch.where(bad_nf | (bad_fin & ~torch.isfinite(ratio)), torch.inf, ratio)
        i = _fmt_idx((ratio == ratio.max()).nonzero()[0])
        head = (f"{int(bad.sum())} of {got.numel()} elements outside the error model; worst at {i}: "
                f"compiled={g[i].item()!r} eager32={e[i].item()!r} ref64={r[i].item()!r} ")
        if bool(bad_nf[i]):
            tail = "(expected the same nonfinite value as eager)"
        else:
            tail = (f"E={E[i].item():.4g} tol={tol[i].item():.4g} |err|={err[i].item():.4g} "
                    f"|err|/tol={ratio[i].item():.4g}")
        return head + tail, got.numel() - nfree, nfree
    return None, got.numel() - nfree, nfree


def _model_message(eager32, ref64, E):
    """Is the float32 eager result inside the model (|eager32 - ref64| <= E)?"""
    if eager32.numel() == 0 or not eager32.dtype.is_floating_point:
        if eager32.numel() and eager32.dtype != torch.bool:
            bad = ((_f64(eager32) - _f64(ref64)).abs() > E) & ~torch.isinf(E)
            if bool(bad.any()):
                i = _fmt_idx(bad.nonzero()[0])
                return f"int at {i}: eager32={eager32[i].item()} ref64={ref64[i].item()} E={E[i].item()}"
        return None
    e, r = _f64(eager32), _f64(ref64)
    both_nf = ~torch.isfinite(e) & ~torch.isfinite(r)
    same_nf = (torch.isnan(e) & torch.isnan(r)) | (e == r)
    bad = ~torch.isinf(E) & ((both_nf & ~same_nf) | (torch.isfinite(e) != torch.isfinite(r)) |
                             (torch.isfinite(e) & torch.isfinite(r) & ((e - r).abs() > E)))
    if bool(bad.any()):
        ratio = torch.where(bad, (e - r).abs() / E.clamp(min=1e-300), torch.zeros((), dtype=torch.float64))
        ratio = torch.where(bad & ~torch.isfinite(ratio), torch.inf, ratio)
        i = _fmt_idx((ratio == ratio.max()).nonzero()[0])
        return (f"{int(bad.sum())} elements; worst at {i}: eager32={e[i].item()!r} ref64={r[i].item()!r} "
                f"E={E[i].item():.4g} ratio={ratio[i].item():.4g}")
    return None


def _references(prog, f32, f64, which, device="cpu"):
    """(eager32 outputs (on ``device``, returned on the CPU), ref64 outputs, E bounds) of input set
    ``which``; the float64 reference and the error model always run on the CPU."""
    inputs = make_inputs(prog, which, device=device)
    up = make_inputs(prog, which, upcast=True)
    eager = [_cpu(o) for o in _flatten_outs(_to_torch(f32(*[tp.from_torch(t) for t in inputs])))]
    ref = _flatten_outs(_to_torch(f64(*[tp.from_torch(t) for t in up])))
    _, E = error_model(prog, up)
    return eager, ref, E


def check_model(prog: Program):
    """The error model must contain the float32 eager result: returns a list of violation messages."""
    f32, f64 = build_function(prog, tp.float32), build_function(prog, tp.float64)
    msgs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for which in (0, 1):
            eager, ref, E = _references(prog, f32, f64, which)
            for k, (e, r, b) in enumerate(zip(eager, ref, E)):
                m = _model_message(e, r, b)
                if m:
                    msgs.append(f"input set {which}, output {k} ({prog.outputs[k]}): {m}")
    return msgs


def _report(prog, backend, what, detail):
    return f"{what}: {detail}"


def _judge(res, prog, bname, name, outs, refs, device, c1, c2):
    """Compare the outputs ``outs`` of call ``name`` with its references ``(eager, ref, E)``."""
    eager, ref, E = refs
    if len(outs) != len(eager):
        res.failures.append(_report(prog, bname, name, f"{len(outs)} outputs, eager has {len(eager)}"))
        return
    for k, (o, e, r, b) in enumerate(zip(outs, eager, ref, E)):
        if isinstance(o, torch.Tensor) and o.device.type != torch.device(device).type:
            res.failures.append(_report(prog, bname, f"{name} output {k} ({prog.outputs[k]})",
                                        f"on {o.device}, the inputs are on {device}"))
            continue
        msg, n_chk, n_free = compare(_cpu(o), e, r, b, c1=c1, c2=c2)
        res.checked += n_chk
        res.unconstrained += n_free
        res.outputs += 1
        res.empty_outputs += isinstance(e, torch.Tensor) and e.numel() == 0
        if msg:
            res.failures.append(_report(prog, bname, f"{name} output {k} ({prog.outputs[k]})", msg))


def _check_untouched(res, prog, bname, tps, snap, which):
    """Compiled calls must not modify their inputs (``snap``: copies taken before the calls)."""
    for k, (t, s) in enumerate(zip(tps, snap)):
        if not torch.equal(t._data, s) and not (t._data.is_floating_point() and
                                                torch.equal(t._data.nan_to_num(1.5), s.nan_to_num(1.5))):
            res.failures.append(_report(prog, bname, "compiled call modified an input",
                                        f"input {prog.inputs[k].name} of {which}"))


def check_program(prog_or_seed, backend="stax", *, strict_native=True, c1=C1, c2=C2, model=True,
                  device="cpu") -> CheckResult:
    """Differential check of one program: compiled (3 calls) vs float64 reference under the error model.
    ``device``: where the inputs live (eager32 and the compiled function run there; the float64
    reference and the error model run on the CPU)."""
    prog = prog_or_seed if isinstance(prog_or_seed, Program) else generate(prog_or_seed)
    bname = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
    res = CheckResult(prog.seed, [], [], source=prog.source, backend=bname)
    f32, f64 = build_function(prog, tp.float32), build_function(prog, tp.float64)
    ins = [make_inputs(prog, 0, device=device), make_inputs(prog, 1, device=device)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = []
        for which in (0, 1):
            try:
                refs.append(_references(prog, f32, f64, which, device))
            except Exception as exc:   # the program is valid torch (checked at generation): TensorPlay eager failed
                res.failures.append(_report(prog, bname, "eager (uncompiled) TensorPlay raised",
                                            "".join(traceback.format_exception_only(type(exc), exc)).strip()))
                return res
        if model:
            for which, (eager, ref, E) in enumerate(refs):
                for k, (e, r, b) in enumerate(zip(eager, ref, E)):
                    m = _model_message(e, r, b)
                    if m:
                        res.model_violations.append(_report(prog, bname, f"input set {which}, output {k}", m))
        tpA = [tp.from_torch(t) for t in ins[0]]
        tpB = [tp.from_torch(t) for t in ins[1]]
        snapA = [t.clone() for t in ins[0]]
        snapB = [t.clone() for t in ins[1]]
        calls = []
        try:
            cf = tp.compile(f32, backend=backend, strict_native=strict_native)
            out1 = _flatten_outs(cf(*tpA))
            keep1 = _to_torch(out1)
            out2 = _flatten_outs(cf(*tpA))
            keep2 = _to_torch(out2)
            captures = cf.counters.get("captures", None)
            out3 = _flatten_outs(cf(*tpB))
            calls = [("call 1 (capture)", keep1, refs[0]), ("call 2 (compiled artifact)", keep2, refs[0]),
                     ("call 3 (compiled artifact, new inputs)", _to_torch(out3), refs[1])]
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            res.failures.append(_report(prog, bname, "tp.compile'd function raised",
                                        f"{type(exc).__name__}: {str(exc)[:1500]}\n"
                                        f"  (at {where.filename}:{where.lineno})"))
            return res
        for name, outs, refs_k in calls:
            _judge(res, prog, bname, name, outs, refs_k, device, c1, c2)
        # side effects: inputs untouched; outputs of call 2 not overwritten by call 3
        for which, (tps, snap) in enumerate(((tpA, snapA), (tpB, snapB))):
            _check_untouched(res, prog, bname, tps, snap, f"set {which}")
        for k, (o, kept) in enumerate(zip(out2, keep2)):
            now = o._data if isinstance(o, tp.Tensor) else o
            if isinstance(now, torch.Tensor) and now.numel() and not torch.equal(
                    now.nan_to_num(1.5) if now.is_floating_point() else now,
                    kept.nan_to_num(1.5) if kept.is_floating_point() else kept):
                aliases_input = any(now.data_ptr() == t._data.data_ptr() for t in tpA) if now.numel() else False
                if not aliases_input:
                    res.failures.append(_report(prog, bname, "output of call 2 changed by call 3 (reused buffer?)",
                                                f"output {k} ({prog.outputs[k]})"))
        if captures is not None and cf.counters.get("captures") != captures:
            res.failures.append(_report(prog, bname, "call 3 recaptured",
                                        f"inputs with identical shapes/strides/dtypes missed the cache: "
                                        f"{getattr(cf, 'recompile_reasons', '?')}"))
    return res


def check_dynamic(prog_or_seed, backend="eager", *, strict_native=True, c1=C1, c2=C2, model=True,
                  device="cpu") -> CheckResult:
    """Differential check of a size-generic program (:func:`generate_dynamic`) under
    ``tp.compile(f, dynamic=True)``: one compiled function is called at every instance in turn (call 1,
    at the sample, is the capture run), then at the sample again with new values; every result is
    judged against that instance's references as in :func:`check_program`.  ``res.captures`` is the
    number of specializations the calls made, ``res.recompile_reasons`` why each after the first was
    made (``res.explain``: the compiled function's ``explain()`` then)."""
    prog = prog_or_seed if isinstance(prog_or_seed, Program) else generate_dynamic(prog_or_seed)
    bname = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
    res = CheckResult(prog.seed, [], [], source=prog.source, backend=bname)
    f32, f64 = build_function(prog, tp.float32), build_function(prog, tp.float64)
    plan = [(k, 0) for k in range(prog.instances)] + [(0, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = []
        for k, which in plan:
            try:
                refs.append(_references(prog.at(k), f32, f64, which, device))
            except Exception as exc:   # valid torch at every instance (checked at generation)
                res.failures.append(_report(prog, bname, f"eager (uncompiled) TensorPlay raised at instance {k}",
                                            "".join(traceback.format_exception_only(type(exc), exc)).strip()))
                return res
        if model:
            for (k, which), (eager, ref, E) in zip(plan, refs):
                for j, (e, r, b) in enumerate(zip(eager, ref, E)):
                    m = _model_message(e, r, b)
                    if m:
                        res.model_violations.append(f"instance {k}, input set {which}, output {j}: {m}")
        cf = tp.compile(f32, backend=backend, strict_native=strict_native, dynamic=True,
                        recompile_limit=len(plan) + 1)
        for i, ((k, which), refs_k) in enumerate(zip(plan, refs)):
            ins = make_inputs(prog.at(k), which, device=device)
            tps = [tp.from_torch(t) for t in ins]
            snap = [t.clone() for t in ins]
            sizes = [list(t.shape) for t in ins]
            name = f"call {i + 1} (instance {k}, input set {which}, sizes {sizes}{', capture' if not i else ''})"
            try:
                outs = _to_torch(_flatten_outs(cf(*tps)))
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                res.failures.append(_report(prog, bname, f"{name}: the tp.compile'd function raised",
                                            f"{type(exc).__name__}: {str(exc)[:1500]}\n"
                                            f"  (at {where.filename}:{where.lineno})"))
                break
            _judge(res, prog, bname, name, outs, refs_k, device, c1, c2)
            _check_untouched(res, prog, bname, tps, snap, name)
        res.captures = cf.counters["captures"]
        res.recompile_reasons = [list(r) for r in cf.recompile_reasons]
        if res.captures > 1:
            res.explain = cf.explain()
    return res


# ---------------------------------------------------------------------------------------------------
# coverage statistics
# ---------------------------------------------------------------------------------------------------
def coverage(progs) -> dict:
    """What a set of programs exercises: counts of ops, input dtypes/layouts/ranks, sizes 0 and 1, specials,
    broadcasting (operands of different shapes / ranks), scalar operands."""
    c: dict = {}

    def inc(k, n=1):
        c[k] = c.get(k, 0) + n
    for p in progs:
        inc("programs")
        inc("nodes", len(p.nodes))
        shapes = {s.name: tuple(s.shape) for s in p.inputs}
        shapes.update({n.name: n.shape for n in p.nodes})
        for n in p.nodes:
            if n.rule in ("add", "sub", "mul", "div", "maxmin", "where", "cmp", "logical"):
                ts = [shapes[a] for a in n.args if isinstance(a, str)]
                if len(ts) < len(n.args):
                    inc("scalar_operand")
                if len(set(ts)) > 1:
                    inc("broadcast")
                if len({len(t) for t in ts}) > 1:
                    inc("broadcast_rank")
            if not n.shape:
                inc("value_rank0")
        for s in p.inputs:
            inc(f"dtype:{str(s.dtype).replace('torch.', '')}")
            inc(f"layout:{s.layout}")
            inc(f"rank:{len(s.shape)}")
            inc(f"dist:{s.dist}")
            if 0 in s.shape:
                inc("size0")
            if 1 in s.shape:
                inc("size1")
            if s.specials:
                inc("specials")
        for n in p.nodes:
            inc(f"op:{n.params.get('op', n.rule)}")
            if 0 in n.shape:
                inc("value_size0")
            if n.dtype == torch.bool:
                inc("value_bool")
            elif not n.dtype.is_floating_point:
                inc("value_int")
            elif n.dtype == torch.float64:
                inc("value_f64")
    return c


# ---------------------------------------------------------------------------------------------------
# planted bugs: backends that the checker must accept (legitimate float32 variations) or reject
# ---------------------------------------------------------------------------------------------------
def interpreter_backend(call, name="planted"):
    """A backend running the captured graph node by node, where ``call(opdef, args, kwargs)``
    computes each ``call_function`` node (``opdef(*args, **kwargs)`` is the faithful answer).
    ``backend.log`` collects whatever ``call`` appends to it."""
    from tensorplay.compiler.graph.interpreter import Interpreter

    class _I(Interpreter):
        def call_function(self, target, args, kwargs):
            return call(target, args, kwargs)

    def backend(gm, example_inputs, **kwargs):
        def run(*args):
            return tuple(_I(gm).run(*args))
        return run
    backend.__name__ = name
    backend.log = []
    return backend


def _opname(target):
    return getattr(target, "name", getattr(target, "__name__", str(target)))


def _reduced_count(args, out):
    x = args[0]
    if not isinstance(x, tp.Tensor) or not isinstance(out, tp.Tensor) or out.numel() == 0:
        return 0
    return x.numel() // out.numel()


def perturb_reductions_backend(*, ulps=None, rel=None, ops=("sum", "mean"), min_n=4):
    """Moves every nonzero float result of the listed reductions (over >= ``min_n`` elements) by
    ``ulps`` units in the last place (within the model: a sum's bound is >= 2 sqrt(n) u sum|a|),
    or multiplies it by ``1 + rel`` (a real bug when rel >> u)."""
    def call(target, args, kwargs):
        out = target(*args, **kwargs)
        if _opname(target) in ops and isinstance(out, tp.Tensor) and out.dtype.is_floating_point \
                and _reduced_count(args, out) >= min_n:
            t = out._data
            if ulps is not None:
                for _ in range(ulps):
                    t = torch.where(t != 0, torch.nextafter(t, torch.full_like(t, torch.inf)), t)
            else:
                t = t * (1 + rel)
            backend.log.append(_opname(target))
            return tp.from_torch(t)
        return out
    backend = interpreter_backend(call, f"perturb_{ulps or rel}")
    return backend


def reordered_sum_backend():
    """sum / mean re-implemented as a plain float32 loop accumulating in *reverse* order — a legitimate
    compiled kernel (different rounding from ATen's cascade sum) that the checker must accept."""
    def call(target, args, kwargs):
        name = _opname(target)
        x = args[0] if args else None
        if name in ("sum", "mean") and isinstance(x, tp.Tensor) and x.dtype == torch.float32 and not kwargs:
            dim, keepdim = args[1], args[2]
            t = x._data
            dims = list(range(t.dim())) if dim is None or (not isinstance(dim, int) and len(dim) == 0) else \
                [d % max(t.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]
            if t.dim() == 0:
                return target(*args, **kwargs)
            keep = [d for d in range(t.dim()) if d not in dims]
            moved = t.permute(*keep, *dims)
            flat = moved.reshape(*[t.shape[d] for d in keep], -1)
            acc = torch.zeros(flat.shape[:-1], dtype=torch.float32)
            for i in reversed(range(flat.shape[-1])):
                acc = acc + flat[..., i]
            if name == "mean":
                n = flat.shape[-1]
                acc = acc / n if n else torch.full_like(acc, float("nan"))
            if keepdim:
                for d in sorted(dims):
                    acc = acc.unsqueeze(d)
            backend.log.append(name)
            return tp.from_torch(acc.contiguous())
        return target(*args, **kwargs)
    backend = interpreter_backend(call, "reordered_sum")
    return backend


def swap_backend(a: str, b: str):
    """Computes op ``a`` with op ``b``'s kernel (same canonical arguments): a wrong lowering."""
    from tensorplay.ops import OPS

    def call(target, args, kwargs):
        if _opname(target) == a:
            backend.log.append(a)
            return OPS[b](*args, **kwargs)
        return target(*args, **kwargs)
    backend = interpreter_backend(call, f"swap_{a}_{b}")
    return backend


def nan_to_zero_backend():
    """Outputs with NaN replaced by 0 (a kernel that loses NaN propagation)."""
    def backend(gm, example_inputs, **kwargs):
        def run(*args):
            outs = gm.forward(*args)
            res = []
            for o in outs:
                if isinstance(o, tp.Tensor) and o.dtype.is_floating_point and bool(torch.isnan(o._data).any()):
                    backend.log.append("nan")
                    o = tp.from_torch(torch.nan_to_num(o._data, nan=0.0, posinf=torch.inf, neginf=-torch.inf))
                res.append(o)
            return tuple(res)
        return run
    backend.log = []
    return backend


def stale_backend():
    """Returns the outputs of its first call forever (a cache that ignores new inputs)."""
    def backend(gm, example_inputs, **kwargs):
        memo = []

        def run(*args):
            if not memo:
                memo.append(tuple(gm.forward(*args)))
            return memo[0]
        return run
    return backend


# ---------------------------------------------------------------------------------------------------
# minimisation: the smallest sub-program that still fails
# ---------------------------------------------------------------------------------------------------
def prune(prog: Program, outputs) -> Program:
    """The sub-program computing ``outputs`` (their ancestors only; unused inputs dropped; input values
    unchanged because they are seeded by name)."""
    need = set(outputs)
    keep = []
    for n in reversed(prog.nodes):
        if n.name in need:
            keep.append(n)
            need.update(a for a in n.args if isinstance(a, str))
    keep.reverse()
    ins = [s for s in prog.inputs if s.name in need]
    return Program(prog.seed, ins, keep, list(outputs), prog.universes)


def minimize(prog: Program, backend="stax", fails=None, device="cpu") -> Program:
    """Shrink a failing program: the first value (in program order) whose sub-program fails alone,
    then drop its nodes one by one where the failure stays (replacing a node by one of its operands
    of the same shape and dtype).  ``fails(p) -> bool`` defaults to "check_program reports a
    failure"."""
    if fails is None:
        def fails(p):
            try:
                return bool(check_program(p, backend, model=False, device=device).failures)
            except Exception:
                return False
    best = prog
    for n in prog.nodes:
        cand = prune(prog, [n.name])
        if fails(cand):
            best = cand
            break
    # bypass nodes: uses of v -> uses of one of v's same-shape/dtype operands
    changed = True
    while changed:
        changed = False
        for n in list(best.nodes[:-1]):
            for a in n.args:
                if not isinstance(a, str):
                    continue
                src = next((m for m in best.nodes if m.name == a), None)
                spec = next((s for s in best.inputs if s.name == a), None)
                shape, dtype = (src.shape, src.dtype) if src else (tuple(spec.shape), spec.dtype)
                if shape != n.shape or dtype != n.dtype:
                    continue
                nodes = []
                for m in best.nodes:
                    if m is n:
                        continue
                    if n.name in m.args:
                        m = dataclasses.replace(m, args=tuple(a if x == n.name else x for x in m.args),
                                                expr=_rename(m.expr, n.name, a))
                    nodes.append(m)
                outs = [a if o == n.name else o for o in best.outputs]
                cand = prune(Program(best.seed, best.inputs, nodes, outs), outs)
                if fails(cand):
                    best, changed = cand, True
                    break
            if changed:
                break
    return best


def _rename(expr, old, new):
    import re
    return re.sub(rf"\b{old}\b", new, expr)


def _main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--backend", default="stax")
    ap.add_argument("--device", default="cpu", help="where the inputs live (cuda for a GPU backend)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--minimize", action="store_true", help="print the smallest failing sub-program")
    ap.add_argument("--dynamic", action="store_true",
                    help="size-generic programs under tp.compile(dynamic=True), called at 5 sizes (check_dynamic)")
    a = ap.parse_args(argv)
    gen, check = (generate_dynamic, check_dynamic) if a.dynamic else (generate, check_program)
    bad = 0
    for s in range(a.seed, a.seed + a.count):
        prog = gen(s)
        if a.count == 1 and not a.quiet:
            print(prog.source)
        r = check(prog, a.backend, device=a.device)
        if r.failures:
            print(r.report())
        if r.model_violations:
            print(r.report(model=True))
        bad += bool(r.failures or r.model_violations)
        if a.minimize and r.failures and not a.dynamic:
            small = minimize(prog, a.backend, device=a.device)
            print(f"minimised (seed {s}, {len(small.nodes)} of {len(prog.nodes)} nodes):\n{small.source}")
            for m in check_program(small, a.backend, model=False, device=a.device).failures:
                print("  -", m)
        if a.count == 1 or a.dynamic:
            print(f"seed {s}: {'OK' if r.ok and not r.model_violations else 'FAIL'}; "
                  f"{r.checked} elements checked, {r.unconstrained} undecided by the model"
                  + (f"; {r.captures} specialization(s)" if a.dynamic else "")
                  + "".join(f"\n  recompiled: {'; '.join(rs)}" for rs in r.recompile_reasons))
    if a.count > 1:
        print(f"{a.count - bad}/{a.count} programs OK")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(_main())
