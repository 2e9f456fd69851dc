"""Tests of the Stax C++ vector library, ``cpp/cpp_prelude.h``.

A small C++ file of ``extern "C"`` array functions built on the prelude is compiled once per
variant (module-scoped fixture) with the flags the Stax compiler uses, and called through ctypes.
The variants are widths on the *host target* -- the target flags of the code cache's ISA level
(``cpp/build.py``: ``cpu_isa()``, which ``TP_CPU_ISA`` forces: ``TP_CPU_ISA=avx2`` builds every variant as an
AVX2-only machine would, ``sse`` as an SSE4.2 machine, ``scalar`` for plain x86-64):

* ``w64``     -- host target, ``-DTP_VEC_BYTES=64`` (16 lanes; double = 2 registers; without AVX-512
  each register is a pair of ymm / four xmm)
* ``w32``     -- host target, ``-DTP_VEC_BYTES=32`` (8 lanes)
* ``scalar``  -- host target, ``-DTP_SCALAR`` (1 lane)
* ``sse``     -- ``-msse4.2 -DTP_VEC_BYTES=16`` (4 lanes), the code cache's ``sse`` ISA level: no FMA
  hardware, so it runs the math kernels' no-FMA code path (Dekker products); only where the host
  level is ``sse`` or better.

Every build must print nothing at all (no warning, no note) on any host level.

Checked: the documented max-ulp bound of every vectorised function on ~1e5 points per function and
dtype (references in long double / mpmath) plus special values; bit-exactness of arithmetic,
sqrt, rounding, where, maximum/minimum, comparisons, integer division/shifts, casts against numpy /
torch; loads, stores, reductions; that all widths give bit-identical results; that the AVX-512
build of exp/log/tanh/erf/sigmoid uses zmm registers and calls no libm function.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import mpmath
import numpy as np
import pytest
import torch

from tensorplay.compiler.backends.stax.cpp import build as cc

REPO = Path(__file__).resolve().parents[2]
PRELUDE_DIR = REPO / "tensorplay" / "compiler" / "backends" / "stax" / "cpp"
PRELUDE = PRELUDE_DIR / "cpp_prelude.h"
CXX = os.environ.get("TP_CXX", "g++")
BASE = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
X86 = bool(re.match(r"x86_64|AMD64|i[3-6]86", os.uname().machine))
#: the ISA level the tests treat as the host's (TP_CPU_ISA forces a lower one) and its target flags
def _host_isa():
    if shutil.which(CXX) is None:
        return "scalar"
    with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"TP_CACHE_DIR": d}):
        return cc.cpu_isa()     # the detection probe goes to a scratch cache, not the user's


HOST_ISA = _host_isa()
TARGET = [f for f in cc.isa_flags(HOST_ISA) if not f.startswith("-D")]
AT_LEAST = {lvl: cc.ISA_LEVELS.index(HOST_ISA) <= cc.ISA_LEVELS.index(lvl) for lvl in cc.ISA_LEVELS}
VARIANTS = {
    "w64": TARGET + ["-DTP_VEC_BYTES=64"],
    "w32": TARGET + ["-DTP_VEC_BYTES=32"],
    "scalar": TARGET + ["-DTP_SCALAR"],
}
if X86:
    VARIANTS["sse"] = ["-msse4.2", "-DTP_VEC_BYTES=16"]
LANES = {"w64": 16, "w32": 8, "scalar": 1, "sse": 4}
#: FMA hardware in the build (the Dekker-product paths run without it)
HAS_FMA = {v: AT_LEAST["avx2"] and v != "sse" for v in LANES}

# Documented accuracy contract (max ulp vs the exact result) -- keep in sync with the header
# comment and docs/cpp_prelude.md.
ULP_BOUND = {"exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1,
             "tanh": 1, "sigmoid": 1, "erf": 1, "erfc": 1, "sin": 1, "cos": 1, "tan": 1.5, "sinh": 1, "cosh": 1,
             "hypot": 1}
LIBM_BOUND = 4   # per-lane libm wrappers: glibc's own bounds (cbrt double is ~3 ulp); checks the wiring
VECTORISED = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "erf", "erfc",
              "sin", "cos", "tan", "sinh", "cosh"]
LIBM = ["asin", "acos", "atan", "asinh", "acosh", "atanh", "cbrt"]

FT = {"f32": ("float", np.float32, torch.float32), "f64": ("double", np.float64, torch.float64)}
IT = {"i32": ("int32_t", np.int32, torch.int32), "i64": ("int64_t", np.int64, torch.int64)}
ALLT = {**FT, **IT, "u8": ("uint8_t", np.uint8, torch.uint8)}


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


CPU = _cpu_flags()
# builds for the host target run wherever they were built (TP_VEC_BYTES only sets the lane count;
# without AVX-512 a 64-byte Vec is two ymm registers); the SSE build needs SSE4.2
RUNNABLE = {"w64": True, "w32": True, "scalar": True, "sse": "sse4_2" in CPU and AT_LEAST["sse"]}

# ---------------------------------------------------------------------------------------------
# the C++ test source
# ---------------------------------------------------------------------------------------------
_LOOP = """
  using V = tp::Vec<{T}>; constexpr int L = V::size; int64_t i = 0;
  for (; i + L <= n; i += L) {{ {LOAD} ({EXPR}).store(y + i); }}
  if (i < n) {{ const int m = int(n - i); {LOADN} ({EXPR}).storen(y + i, m); }}
"""


def _fn(name, T, OUT, args, expr, loads):
    params = ", ".join(f"const {t}* {a}" for a, t in args)
    load = " ".join(f"auto {v} = tp::Vec<{t}>::load({a} + i);" for v, a, t in loads)
    loadn = " ".join(f"auto {v} = tp::Vec<{t}>::loadn({a} + i, m);" for v, a, t in loads)
    body = _LOOP.format(T=T, EXPR=expr, LOAD=load, LOADN=loadn)
    return f'extern "C" void {name}({params}, {OUT}* y, int64_t n) {{{body}}}\n'


def _source():
    out = ['#include "cpp_prelude.h"\n#include <cstdint>\n']
    out.append('extern "C" int lanes_f32() { return tp::Vec<float>::size; }\n')
    out.append('extern "C" int lanes_f64() { return tp::Vec<double>::size; }\n')
    out.append('extern "C" int lanes_i8() { return tp::Vec<int8_t>::size; }\n')
    out.append('extern "C" int has_fma() { return TP_HAS_FMA; }\n')
    for s, (T, _, _) in FT.items():
        un = {f: f"tp::{f}(a)" for f in VECTORISED + LIBM + ["sqrt", "rsqrt", "reciprocal", "abs", "neg", "floor",
                                                               "ceil", "trunc", "round", "sign"]}
        un["uminus"] = "-a"
        for f, e in un.items():
            out.append(_fn(f"u_{f}_{s}", T, T, [("x", T)], e, [("a", "x", T)]))
        bi = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "maximum": "tp::maximum(a, b)",
              "minimum": "tp::minimum(a, b)", "pow": "tp::pow(a, b)", "fmod": "tp::fmod(a, b)",
              "floordiv": "tp::floordiv(a, b)", "remainder": "tp::remainder(a, b)", "atan2": "tp::atan2(a, b)",
              "copysign": "tp::copysign(a, b)", "hypot": "tp::hypot(a, b)", "fma1": "tp::fma(a, b, V(1))", "clamp01": "tp::clamp(a, V(0), b)",
              "scalar_ops": "(a * 2.0 + b) / 3 - 1"}
        for f, e in bi.items():
            out.append(_fn(f"b_{f}_{s}", T, T, [("x", T), ("xb", T)], e, [("a", "x", T), ("b", "xb", T)]))
        for f, e in {"isnan": "tp::isnan(a)", "isinf": "tp::isinf(a)", "isfinite": "tp::isfinite(a)",
                     "signbit": "tp::signbit(a)"}.items():
            out.append(_fn(f"m_{f}_{s}", T, "bool", [("x", T)], e, [("a", "x", T)]))
    for s, (T, _, _) in IT.items():
        bi = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "mod": "a % b",
              "floordiv": "tp::floordiv(a, b)", "remainder": "tp::remainder(a, b)", "and": "a & b", "or": "a | b",
              "xor": "a ^ b", "shl": "a << b", "shr": "a >> b", "maximum": "tp::maximum(a, b)",
              "minimum": "tp::minimum(a, b)", "pow": "tp::pow(a, b)", "fmod": "tp::fmod(a, b)"}
        for f, e in bi.items():
            out.append(_fn(f"b_{f}_{s}", T, T, [("x", T), ("xb", T)], e, [("a", "x", T), ("b", "xb", T)]))
        for f, e in {"uminus": "-a", "abs": "tp::abs(a)", "sign": "tp::sign(a)", "bnot": "~a",
                     "floor": "tp::floor(a)", "round": "tp::round(a)"}.items():
            out.append(_fn(f"u_{f}_{s}", T, T, [("x", T)], e, [("a", "x", T)]))
    for s, (T, _, _) in {**FT, **IT}.items():
        for f, op in {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}.items():
            out.append(_fn(f"c_{f}_{s}", T, "bool", [("x", T), ("xb", T)], f"(a {op} b)",
                           [("a", "x", T), ("b", "xb", T)]))
        # where(bool tensor, a, b)
        out.append(f'extern "C" void w_{s}(const bool* c, const {T}* x, const {T}* xb, {T}* y, int64_t n) {{'
                   + _LOOP.format(T=T, EXPR="tp::where(mc, a, b)",
                                  LOAD=f"auto mc = tp::Mask::load(c + i); auto a = V::load(x + i); "
                                       f"auto b = V::load(xb + i);",
                                  LOADN=f"auto mc = tp::Mask::loadn(c + i, m); auto a = V::loadn(x + i, m); "
                                        f"auto b = V::loadn(xb + i, m);") + "}\n")
        out.append(f'extern "C" {T} r_add_{s}(const {T}* x) {{ return tp::reduce_add(tp::Vec<{T}>::load(x)); }}\n')
        out.append(f'extern "C" {T} r_mul_{s}(const {T}* x) {{ return tp::reduce_mul(tp::Vec<{T}>::load(x)); }}\n')
        out.append(f'extern "C" {T} r_max_{s}(const {T}* x) {{ return tp::reduce_max(tp::Vec<{T}>::load(x)); }}\n')
        out.append(f'extern "C" {T} r_min_{s}(const {T}* x) {{ return tp::reduce_min(tp::Vec<{T}>::load(x)); }}\n')
        out.append(f'extern "C" void ld_loadn_{s}(const {T}* x, int m, {T}* y) {{ '
                   f'tp::Vec<{T}>::loadn(x, m).store(y); }}\n')
        out.append(f'extern "C" void ld_storen_{s}(const {T}* x, int m, {T}* y) {{ '
                   f'tp::Vec<{T}>::load(x).storen(y, m); }}\n')
        out.append(f'extern "C" void ld_stream_{s}(const {T}* x, {T}* y) {{ '
                   f'tp::Vec<{T}>::load(x).store_stream(y); tp::stream_fence(); }}\n')
        out.append(f'extern "C" void ld_streamn_{s}(const {T}* x, int m, {T}* y) {{ '
                   f'tp::Vec<{T}>::load(x).storen_stream(y, m); tp::stream_fence(); }}\n')
        out.append(f'extern "C" void ld_split_{s}(const {T}* x, {T}* y) {{ tp::Vec<{T}>::load_split(x).store(y); }}\n')
        out.append(f'extern "C" void ld_strided_{s}(const {T}* x, int64_t st, {T}* y) {{ '
                   f'tp::Vec<{T}>::load_strided(x, st).store(y); }}\n')
        out.append(f'extern "C" void ld_iota_{s}({T} start, {T}* y) {{ tp::Vec<{T}>::iota(start).store(y); }}\n')
        out.append(f'extern "C" void ld_gather_{s}(const {T}* x, const int64_t* ix, {T}* y) {{ '
                   f'tp::Vec<{T}>::gather(x, tp::Vec<int64_t>::load(ix)).store(y); }}\n')
        out.append(f'extern "C" {T} ld_lane_{s}(const {T}* x, int k) {{ return tp::Vec<{T}>::load(x)[k]; }}\n')
        out.append(f'extern "C" void ld_bcast_{s}({T} v, {T}* y) {{ tp::Vec<{T}>(v).store(y); }}\n')
        out.append(f'extern "C" void ld_zero_{s}({T}* y) {{ tp::Vec<{T}>().store(y); }}\n')
        out.append(f'extern "C" void m_tof_{s}(const bool* c, {T}* y) {{ '
                   f'tp::cast<{T}>(tp::Mask::load(c)).store(y); }}\n')
    for s1, (T1, _, _) in ALLT.items():
        for s2, (T2, _, _) in ALLT.items():
            if s1 != s2:
                out.append(_fn(f"cast_{s1}_{s2}", T1, T2, [("x", T1)], f"tp::cast<{T2}>(a)", [("a", "x", T1)]))
    # a mask of double lanes selecting float lanes (mixed widths in one loop)
    out.append('extern "C" void mixed_where(const double* x, const float* a, const float* b, float* y, int64_t n) {'
               + _LOOP.format(T="float", EXPR="tp::where(d < tp::Vec<double>(0.0), fa, fb)",
                              LOAD="auto d = tp::Vec<double>::load(x + i); auto fa = V::load(a + i); "
                                   "auto fb = V::load(b + i);",
                              LOADN="auto d = tp::Vec<double>::loadn(x + i, m); auto fa = V::loadn(a + i, m); "
                                    "auto fb = V::loadn(b + i, m);") + "}\n")
    # bool tensors through masks: y = (x > 0) & c, stored as bool
    out.append('extern "C" void mask_logic(const float* x, const bool* c, bool* y, int64_t n) {'
               + _LOOP.format(T="float", EXPR="(((a > V(0.0f)) & mc) | (~mc & tp::isnan(a)))",
                              LOAD="auto a = V::load(x + i); auto mc = tp::Mask::load(c + i);",
                              LOADN="auto a = V::loadn(x + i, m); auto mc = tp::Mask::loadn(c + i, m);") + "}\n")
    # Philox4x32-10: the four words of one vector of counters; uniform/normal/integer draws
    out.append('extern "C" void rng_words(int64_t seed, const int64_t* off, int64_t stream, int32_t* y) { '
               'auto r = tp::detail::philox(tp::Vec<int64_t>(seed), tp::Vec<int64_t>::load(off), stream); '
               'for (int k = 0; k < 4; ++k) r.w[k].store(y + k * tp::Vec<int32_t>::size); }\n')
    for s, (T, _, _) in FT.items():
        for kind in ("rand", "randn"):
            out.append(f'extern "C" void rng_{kind}_{s}(int64_t seed, const int64_t* off, int64_t stream, {T}* y) {{ '
                       f'tp::philox_{kind}<{T}>(tp::Vec<int64_t>(seed), tp::Vec<int64_t>::load(off), stream).store(y); }}\n')
    out.append(_fn("cos_2pi_unit", "float", "float", [("x", "float")], "tp::detail::cos_2pi_unit(a)",
                   [("a", "x", "float")]))
    out.append('extern "C" void rng_randint(int64_t seed, const int64_t* off, int64_t stream, int64_t low, '
               'uint64_t range, int64_t* y) { tp::philox_randint(tp::Vec<int64_t>(seed), tp::Vec<int64_t>::load(off), '
               'stream, low, range).store(y); }\n')
    # tail masks of compile-time lengths (GCC 12.2 with 512-bit vectors folded these to all-true)
    for k in (1, 3, 4, 7):
        out.append(f'extern "C" void const_tail_{k}(float* y) {{ const int n = {k}; '
                   f'tp::where(tp::Vec<float>::iota(0.0f) < tp::Vec<float>(float(n)), tp::Vec<float>(1.0f), '
                   f'tp::Vec<float>(0.0f)).store(y); }}\n')
    return "".join(out)


def _compile(variant, tmp):
    src = tmp / "tp_prelude_test.cpp"
    out = tmp / f"tp_prelude_{variant}.so"
    extra = shlex.split(os.environ.get("TP_CXXFLAGS", ""))   # same hook as the code cache
    cmd = [CXX, *BASE, *VARIANTS[variant], *extra, f"-I{PRELUDE_DIR}", str(src), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return variant, out, cmd, r


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which(CXX) is None:
        pytest.skip(f"no C++ compiler ({CXX})")
    tmp = tmp_path_factory.mktemp("cpp_prelude")
    (tmp / "tp_prelude_test.cpp").write_text(_source())
    with ThreadPoolExecutor(max_workers=len(VARIANTS)) as ex:
        results = list(ex.map(lambda v: _compile(v, tmp), VARIANTS))
    out = {}
    for variant, path, cmd, r in results:
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
        assert r.stderr.strip() == "", f"{' '.join(cmd)} printed:\n{r.stderr[-4000:]}"
        out[variant] = path
    return out


class Lib:
    def __init__(self, path, variant):
        self.cdll = ctypes.CDLL(str(path))
        self.path = path
        self.variant = variant
        self.lanes = self.cdll.lanes_f32()

    def fn(self, name, restype=None, argtypes=None):
        f = getattr(self.cdll, name)
        f.restype = restype
        if argtypes is not None:
            f.argtypes = argtypes
        return f

    def map(self, name, out_dtype, *arrays):
        arrays = [np.ascontiguousarray(a) for a in arrays]
        n = arrays[0].size
        y = np.empty(n, dtype=out_dtype)
        f = self.fn(name, None, [ctypes.c_void_p] * (len(arrays) + 1) + [ctypes.c_int64])
        f(*[a.ctypes.data for a in arrays], y.ctypes.data, n)
        return y


_lib_cache = {}


@pytest.fixture(params=list(VARIANTS))
def lib(request, libs):
    v = request.param
    if not RUNNABLE[v]:
        pytest.skip(f"this CPU cannot run the {v} build")
    if v not in _lib_cache:
        _lib_cache[v] = Lib(libs[v], v)
    return _lib_cache[v]


# ---------------------------------------------------------------------------------------------
# references and ulp measurement
# ---------------------------------------------------------------------------------------------
LD = np.longdouble
mpmath.mp.prec = 113


def _mp_vec(f, x):
    out = np.empty(x.size, dtype=LD)
    for i, v in enumerate(x.astype(np.float64)):
        v = float(v)
        if math.isnan(v) or math.isinf(v) or v == 0.0 or abs(v) > 40:   # exact 0, +-1, 2 there
            out[i] = LD(getattr(math, f.__name__)(v))
        else:
            out[i] = LD(mpmath.nstr(f(mpmath.mpf(v)), 30))
    return out


def _erf_ref(x):
    if x.dtype == np.float32:   # glibc double erf is ample for a float32 reference
        return np.array([math.erf(float(v)) for v in x], dtype=LD)
    return _mp_vec(mpmath.erf, x)


def _erfc_ref(x):
    if x.dtype == np.float32:
        return np.array([math.erfc(float(v)) for v in x], dtype=LD)
    return _mp_vec(mpmath.erfc, x)


def _sigmoid_ref(x):
    with np.errstate(over="ignore"):
        return LD(1) / (LD(1) + np.exp(-x.astype(LD)))


REF = {"exp": lambda x: np.exp(x.astype(LD)), "exp2": lambda x: np.exp2(x.astype(LD)),
       "expm1": lambda x: np.expm1(x.astype(LD)), "log": lambda x: np.log(x.astype(LD)),
       "log2": lambda x: np.log2(x.astype(LD)), "log10": lambda x: np.log10(x.astype(LD)),
       "log1p": lambda x: np.log1p(x.astype(LD)), "tanh": lambda x: np.tanh(x.astype(LD)),
       "sigmoid": _sigmoid_ref, "erf": _erf_ref, "erfc": _erfc_ref, "sin": lambda x: np.sin(x.astype(LD)),
       "cos": lambda x: np.cos(x.astype(LD)), "tan": lambda x: np.tan(x.astype(LD)),
       "sinh": lambda x: np.sinh(x.astype(LD)), "cosh": lambda x: np.cosh(x.astype(LD))}
for _f in LIBM:
    REF[_f] = (lambda g: (lambda x: g(x.astype(LD))))(getattr(np, {"asin": "arcsin", "acos": "arccos",
                                                                    "atan": "arctan", "asinh": "arcsinh",
                                                                    "acosh": "arccosh", "atanh": "arctanh"}
                                                                .get(_f, _f)))


def ulp_error(y, ref, dtype):
    """|y - ref| in units of the spacing of `dtype` at ref (subnormal spacing below the normal range).
    A reference that rounds to +-inf must be matched exactly; NaN where the reference is finite is inf."""
    fi = np.finfo(dtype)
    p, emin = fi.nmant + 1, fi.minexp
    with np.errstate(over="ignore", invalid="ignore"):
        rr = ref.astype(dtype)
        a = np.abs(ref)
        _, e = np.frexp(a)
        ex = np.maximum(e.astype(np.int64) - 1, emin)
        ulp = np.ldexp(LD(1), (ex - (p - 1)).astype(np.int32))
        err = np.abs(y.astype(LD) - ref) / ulp
    inf = np.isinf(rr)
    err[inf] = np.where(y[inf] == rr[inf], 0.0, np.inf)
    bad = np.isnan(y) & ~np.isnan(ref)
    err[bad] = np.inf
    err[np.isnan(y) & np.isnan(ref)] = 0.0
    return err


# Domains: where each function is defined and not trivially saturated (+ a margin beyond).
DOMAIN = {
    "f32": {"exp": (-110, 92), "exp2": (-155, 130), "expm1": (-25, 92), "log": (0, 3.4e38), "log2": (0, 3.4e38),
            "log10": (0, 3.4e38), "log1p": (-1, 3.4e38), "tanh": (-12, 12), "sigmoid": (-110, 30),
            "erf": (-5, 5), "erfc": (-5, 11), "sin": (-3e8, 3e8), "cos": (-3e8, 3e8), "tan": (-3e8, 3e8),
            "asin": (-1, 1), "acos": (-1, 1), "atan": (-1e6, 1e6), "sinh": (-90, 90), "cosh": (-90, 90),
            "asinh": (-1e30, 1e30), "acosh": (1, 1e30), "atanh": (-1, 1), "cbrt": (-1e30, 1e30)},
    "f64": {"exp": (-750, 712), "exp2": (-1080, 1030), "expm1": (-45, 712), "log": (0, 1.7e308),
            "log2": (0, 1.7e308), "log10": (0, 1.7e308), "log1p": (-1, 1.7e308), "tanh": (-22, 22),
            "sigmoid": (-750, 40), "erf": (-7, 7), "erfc": (-7, 28), "sin": (-3e8, 3e8), "cos": (-3e8, 3e8),
            "tan": (-3e8, 3e8), "asin": (-1, 1), "acos": (-1, 1), "atan": (-1e6, 1e6), "sinh": (-712, 712),
            "cosh": (-712, 712), "asinh": (-1e300, 1e300), "acosh": (1, 1e300), "atanh": (-1, 1),
            "cbrt": (-1e300, 1e300)},
}
# points where implementations switch branches or saturate
KNOTS = {"exp": [-103.97, -87.34, 88.72, 0, -745.13, -708.4, 709.78], "exp2": [-149, -126, 128, -1074, -1022, 1024],
         "expm1": [-17.33, -0.3466, 0.3466, 88.72, 709.78, -37.43, 0], "log": [1, 0.7071, 1.4142],
         "log2": [1, 2, 0.5, 0.7071], "log10": [1, 10, 0.1, 0.7071], "log1p": [0, -0.2929, 0.4142, -1, 1],
         "tanh": [0.625, -0.625, 9.01, 19.06, 0], "sigmoid": [0, -87.33, -103.97, -708.4, -745.1, 16.6, 36.7],
         "erf": [0.75, -0.75, 0.5, 3.92, 5.93, 0], "erfc": [0.5, -0.5, 0.6, -0.6, 0.75, 9.19, 10.05, 26.54, 27.22, 0],
         "sin": [0.785398, 1.570796, 3.141593, 2 ** 28, 355, 103993, 1e5], "cos": [0.785398, 1.570796, 2 ** 28, 355],
         "tan": [0.785398, 1.570796, 2 ** 28, 355],
         "sinh": [1, -1, 0.3466, -1.0397, 88.72, -89.41, 709.78, -710.47, 0], "cosh": [0.3466, 1.0397, 88.72, 89.41,
                                                                                     709.78, 710.47, 0]}
N_POINTS = 100_000
N_MPMATH = 6_000   # float64 erf/erfc need mpmath references (slow)


def sweep_points(fn, s):
    dtype = FT[s][1]
    lo, hi = DOMAIN[s][fn]
    rng = np.random.default_rng(abs(hash((fn, s))) % 2**32)
    n = N_MPMATH if (s == "f64" and fn in ("erf", "erfc")) else N_POINTS
    fi = np.finfo(dtype)
    parts = [rng.uniform(lo, hi, n // 3)]
    # log-uniform magnitudes from the smallest subnormal up
    mag = np.exp(rng.uniform(math.log(float(fi.smallest_subnormal)), math.log(max(abs(lo), abs(hi))), n // 3))
    parts.append(mag * rng.choice([-1.0, 1.0], mag.size))
    # dense around the knots
    knots = np.array(KNOTS.get(fn, [0.0]), dtype=np.float64)
    parts.append(rng.choice(knots, n // 3) * (1 + rng.uniform(-1e-3, 1e-3, n // 3))
                 + rng.uniform(-1e-3, 1e-3, n // 3))
    x = np.concatenate(parts).astype(dtype)
    return x[(x >= dtype(lo)) & (x <= dtype(hi))]


def special_points(s):
    dtype = FT[s][1]
    fi = np.finfo(dtype)
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, float(fi.tiny), -float(fi.tiny),
         float(fi.smallest_subnormal), -float(fi.smallest_subnormal), float(fi.tiny) * 0.75,
         float(fi.max), -float(fi.max), float(fi.eps), -float(fi.eps)]
    return np.array(v, dtype=dtype)


_ref_cache = {}


def reference(fn, s, x):
    key = (fn, s, x.size, x.tobytes()[:64], x.tobytes()[-64:])
    if key not in _ref_cache:
        with np.errstate(all="ignore"):
            _ref_cache[key] = REF[fn](x)
    return _ref_cache[key]


_points_cache = {}


def points(fn, s):
    if (fn, s) not in _points_cache:
        _points_cache[(fn, s)] = sweep_points(fn, s)
    return _points_cache[(fn, s)]


# ---------------------------------------------------------------------------------------------
# accuracy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", ["f32", "f64"])
@pytest.mark.parametrize("fn", VECTORISED)
def test_ulp_bound(lib, fn, s):
    dtype = FT[s][1]
    x = points(fn, s)
    y = lib.map(f"u_{fn}_{s}", dtype, x)
    err = ulp_error(y, reference(fn, s, x), dtype)
    i = int(np.argmax(err))
    assert err[i] <= ULP_BOUND[fn], f"{fn}[{s}] {err[i]:.3f} ulp at x={x[i]!r}: got {y[i]!r}"


@pytest.mark.parametrize("s", ["f32", "f64"])
@pytest.mark.parametrize("fn", VECTORISED)
def test_special_values(lib, fn, s):
    dtype = FT[s][1]
    x = special_points(s)
    with np.errstate(all="ignore"):
        ref = REF[fn](x)
    y = lib.map(f"u_{fn}_{s}", dtype, x)
    for xi, yi, ri in zip(x, y, ref):
        if np.isnan(ri):
            assert np.isnan(yi), f"{fn}({xi!r}) = {yi!r}, expected NaN"
            continue
        rd = dtype(ri)
        if np.isinf(rd) or rd == 0:   # exact, including the sign of zero
            assert yi == rd and np.signbit(yi) == np.signbit(rd), f"{fn}({xi!r}) = {yi!r}, expected {rd!r}"
        else:
            e = ulp_error(np.array([yi]), np.array([ri], dtype=LD), dtype)[0]
            assert e <= ULP_BOUND[fn], f"{fn}({xi!r}) = {yi!r}, expected {rd!r} ({e:.2f} ulp)"


@pytest.mark.parametrize("s", ["f32", "f64"])
@pytest.mark.parametrize("fn", LIBM)
def test_libm_wrappers(lib, fn, s):
    dtype = FT[s][1]
    lo, hi = DOMAIN[s][fn]
    x = np.random.default_rng(7).uniform(lo, hi, 4000).astype(dtype)
    x = np.concatenate([x, special_points(s)])
    y = lib.map(f"u_{fn}_{s}", dtype, x)
    with np.errstate(all="ignore"):
        ref = REF[fn](x)
    err = ulp_error(y, ref, dtype)
    assert err.max() <= LIBM_BOUND, f"{fn}[{s}] {err.max():.2f} ulp at {x[np.argmax(err)]!r}"


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_hypot_ulp_bound_and_special_values(lib, s):
    """hypot over random magnitudes from subnormal to overflow (and ratios of the two operands from
    1 to 2^-60), checked against long double ``hypotl``; IEEE: inf wins over NaN, hypot(+-0, +-0) = +0."""
    dtype = FT[s][1]
    fi = np.finfo(dtype)
    rng = np.random.default_rng(11)
    n = N_POINTS // 2
    lo, hi = math.log(float(fi.smallest_subnormal)), math.log(float(fi.max))
    a = np.exp(rng.uniform(lo, hi, n)) * rng.choice([-1.0, 1.0], n)
    b = np.concatenate([np.exp(rng.uniform(lo, hi, n // 2)),
                        a[n // 2:] * np.exp2(-rng.uniform(0, 60, n - n // 2))]) * rng.choice([-1.0, 1.0], n)
    a, b = a.astype(dtype), b.astype(dtype)
    y = lib.map(f"b_hypot_{s}", dtype, a, b)
    err = ulp_error(y, np.hypot(a.astype(LD), b.astype(LD)), dtype)
    i = int(np.argmax(err))
    assert err[i] <= ULP_BOUND["hypot"], f"hypot[{s}] {err[i]:.3f} ulp at {a[i]!r}, {b[i]!r}: got {y[i]!r}"
    sp = special_points(s)
    sa, sb = np.repeat(sp, sp.size), np.tile(sp, sp.size)
    y = lib.map(f"b_hypot_{s}", dtype, sa, sb)
    with np.errstate(all="ignore"):
        ref = torch.hypot(torch.from_numpy(sa), torch.from_numpy(sb)).numpy()
        err = ulp_error(y, np.hypot(sa.astype(LD), sb.astype(LD)), dtype)
    exact = ~np.isfinite(ref) | (ref == 0)
    assert same_bits(y[exact], ref[exact]), _show(sa[exact], y[exact], ref[exact])
    assert err[~exact].max() <= ULP_BOUND["hypot"]


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_sigmoid_tails_do_not_flush(lib, s):
    """sigmoid(x) ~ exp(x) for very negative x: no premature 0 from exp(-x) overflowing."""
    dtype = FT[s][1]
    x = np.array([-50, -88, -100, -103] if s == "f32" else [-300, -700, -740], dtype=dtype)
    y = lib.map(f"u_sigmoid_{s}", dtype, x)
    assert np.all(y > 0)
    assert np.all(ulp_error(y, _sigmoid_ref(x), dtype) <= 1)


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_store_stream_any_alignment(lib, s):
    """store_stream writes exactly what store writes, at every element offset from a 64-byte line
    (streamed in 64/32/16-byte pieces where aligned, plainly elsewhere), and nothing around it."""
    T, dtype, _ = {**FT, **IT}[s]
    f = lib.fn(f"ld_stream_{s}", None, [ctypes.c_void_p, ctypes.c_void_p])
    n = lib.lanes
    x = (np.random.default_rng(3).standard_normal(n) * 1000).astype(dtype)
    per_line = 64 // dtype().itemsize
    for off in range(per_line + 1):
        buf = np.full(n + 2 * per_line + 16, 7, dtype=dtype)
        base = (-buf.ctypes.data % 64) // dtype().itemsize   # first element on a 64-byte boundary
        y = buf[base + off: base + off + n]
        f(x.ctypes.data, y.ctypes.data)
        assert np.array_equal(y, x), f"{s} offset {off}"
        rest = np.concatenate([buf[:base + off], buf[base + off + n:]])
        assert np.all(rest == 7), f"{s} offset {off}: wrote outside the vector"


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_storen_stream_any_count_and_alignment(lib, s):
    """storen_stream(p, m) writes exactly the first m lanes (what storen writes) for every m and
    every element offset from a 64-byte line -- streamed where the m lanes are whole aligned
    pieces, plainly elsewhere -- and nothing around them."""
    T, dtype, _ = {**FT, **IT}[s]
    f = lib.fn(f"ld_streamn_{s}", None, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
    n = lib.lanes
    x = (np.random.default_rng(4).standard_normal(n) * 1000).astype(dtype)
    per_line = 64 // dtype().itemsize
    for off in range(per_line + 1):
        for m in range(-1, n + 1):
            buf = np.full(n + 2 * per_line + 16, 7, dtype=dtype)
            base = (-buf.ctypes.data % 64) // dtype().itemsize
            f(x.ctypes.data, m, buf[base + off:].ctypes.data)
            k = max(m, 0)
            assert np.array_equal(buf[base + off: base + off + k], x[:k]), f"{s} offset {off} m {m}"
            rest = np.concatenate([buf[:base + off], buf[base + off + k:]])
            assert np.all(rest == 7), f"{s} offset {off} m {m}: wrote outside the first m lanes"


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_load_split_reads_the_same_lanes_as_load(lib, s):
    """load_split (two 32-byte loads per 64-byte chunk on AVX-512, load() elsewhere) gives every
    lane, NaN payloads and -0.0 included, at every element offset from a 64-byte line."""
    T, dtype, _ = {**FT, **IT}[s]
    f = lib.fn(f"ld_split_{s}", None, [ctypes.c_void_p, ctypes.c_void_p])
    n = lib.lanes
    per_line = 64 // dtype().itemsize
    src = np.random.default_rng(5).standard_normal(n + 2 * per_line) * 1000
    x = src.astype(dtype)
    if s.startswith("f"):
        x[1], x[2] = -0.0, np.nan
    for off in range(per_line + 1):
        y = np.zeros(n, dtype=dtype)
        f(x[off:].ctypes.data, y.ctypes.data)
        assert x[off:off + n].tobytes() == y.tobytes(), f"{s} offset {off}"


@pytest.mark.parametrize("k", [1, 3, 4, 7])
def test_tail_masks_of_constant_length(lib, k):
    """``where(iota < n, 1, 0)`` with ``n`` known at compile time has exactly min(n, lanes) ones:
    GCC 12.2 on AVX-512 (512-bit vectors preferred) folded it to all ones until ``iota`` was made
    opaque to the optimiser (compiled layer_norm of rows shorter than a vector was wrong)."""
    f = lib.fn(f"const_tail_{k}", None, [ctypes.c_void_p])
    y = np.zeros(lib.lanes, dtype=np.float32)
    f(y.ctypes.data)
    want = (np.arange(lib.lanes) < k).astype(np.float32)
    assert y.tolist() == want.tolist()


TABLE_F32 = {   # table-driven float32 functions: (range checked exhaustively, measured worst FMA / no FMA)
    "erf": ((0.25, 4.0), 0.66, 0.79),     # tools/fit_erf.py
    "tanh": ((0.25, 10.0), 0.75, 0.93),   # tools/fit_tanh.py
}


@pytest.mark.parametrize("fn", list(TABLE_F32))
def test_table_f32_every_float(lib, fn):
    """float32 erf and tanh are tables of polynomials picked per lane (cpp_prelude.h): every float32
    of the table's range (every 5th on the narrower builds, which the width test shows give the same
    bits), both signs.  Measured on every float32 in [0, 4) (erf) and [0, 10) (tanh)."""
    (lo, hi), worst_fma, worst_sse = TABLE_F32[fn]
    step = 1 if lib.variant == "w64" else 5
    bits = np.arange(np.float32(lo).view(np.int32), np.float32(hi).view(np.int32), step, dtype=np.int32)
    ref_fn = getattr(torch, fn)
    worst = 0.0
    for chunk in np.array_split(bits, 16):
        x = chunk.view(np.float32)
        x = np.concatenate([x, -x])
        y = lib.map(f"u_{fn}_f32", np.float32, x)
        ref = ref_fn(torch.from_numpy(x.astype(np.float64))).numpy().astype(LD)
        err = ulp_error(y, ref, np.float32)
        i = int(np.argmax(err))
        assert err[i] <= ULP_BOUND[fn], f"{fn}(f32) {err[i]:.3f} ulp at x={x[i]!r}"
        worst = max(worst, float(err[i]))
    assert worst < (worst_fma if HAS_FMA[lib.variant] else worst_sse) + 0.03   # + the reference's own error


# ---------------------------------------------------------------------------------------------
# bit-exact operations
# ---------------------------------------------------------------------------------------------
def _float_inputs(dtype, n=5000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, 1.5, 2.5, -0.5, -2.5, 1e-40, -1e-310, 3.0, -3.0])
    x = np.concatenate([sp, x, np.round(rng.uniform(-10, 10, n)) + rng.choice([0, 0.5], n)])
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def same_bits(a, b):
    """Equal bit patterns, except that any NaN equals any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a) & np.isnan(b)
    eq = (a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")) | nan
    return bool(np.all(eq))


def _show(x, y, ref):
    bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)) )
    i = np.flatnonzero(bad)[:5]
    return f"x={x[i]!r} got={y[i]!r} expected={ref[i]!r}"


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_float_unary_bit_exact(lib, s):
    dtype = FT[s][1]
    x = _float_inputs(dtype)
    t = torch.from_numpy(x)
    with np.errstate(all="ignore"):
        expect = {"sqrt": np.sqrt(x), "rsqrt": torch.rsqrt(t).numpy(), "reciprocal": dtype(1) / x,
                  "abs": np.abs(x), "neg": -x, "uminus": -x, "floor": np.floor(x), "ceil": np.ceil(x),
                  "trunc": np.trunc(x), "round": np.round(x), "sign": torch.sign(t).numpy()}
    for fn, ref in expect.items():
        y = lib.map(f"u_{fn}_{s}", dtype, x)
        assert same_bits(y, ref), f"{fn}[{s}]: {_show(x, y, ref)}"
    # round is half-to-even, like torch.round
    assert same_bits(lib.map(f"u_round_{s}", dtype, x), torch.round(t).numpy())


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_float_binary_bit_exact(lib, s):
    dtype = FT[s][1]
    a = _float_inputs(dtype, seed=1)
    b = _float_inputs(dtype, seed=2)
    b[:40] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan] * 8, dtype=dtype)   # pair specials with all
    a[40:80] = -b[40:80]
    a[80:120] = b[80:120]
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    with np.errstate(all="ignore"):
        expect = {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b,
                  "maximum": torch.maximum(ta, tb).numpy(), "minimum": torch.minimum(ta, tb).numpy(),
                  "fmod": np.fmod(a, b), "floordiv": torch.floor_divide(ta, tb).numpy(),
                  "remainder": torch.remainder(ta, tb).numpy(), "copysign": np.copysign(a, b),
                  "clamp01": torch.clamp(ta, torch.zeros_like(ta), tb).numpy()}
    for fn, ref in expect.items():
        y = lib.map(f"b_{fn}_{s}", dtype, a, b)
        assert same_bits(y, ref), f"{fn}[{s}]: {_show(a, y, ref)}"


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_scalar_operands_and_fma(lib, s):
    dtype = FT[s][1]
    a = _float_inputs(dtype, seed=3)[20:]
    b = _float_inputs(dtype, seed=4)[20:]
    y = lib.map(f"b_scalar_ops_{s}", dtype, a, b)
    with np.errstate(all="ignore"):
        t = a * dtype(2.0)
        # the only contraction allowed by -ffp-contract=fast here is fma(a, 2, b): a*2 is exact
        ref = (t + b) / dtype(3) - dtype(1)
    assert same_bits(y, ref)
    y = lib.map(f"b_fma1_{s}", dtype, a, b)
    fin = np.isfinite(a) & np.isfinite(b) & (np.abs(a.astype(np.float64) * b) < 1e30)
    with mpmath.workprec(np.finfo(dtype).nmant + 1):   # a*b + 1 rounded once
        ref = np.array([float(mpmath.fadd(mpmath.fmul(float(u), float(v), exact=True), 1))
                        for u, v in zip(a[fin], b[fin])]).astype(dtype)
    assert same_bits(y[fin], ref)


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_pow(lib, s):
    dtype = FT[s][1]
    rng = np.random.default_rng(5)
    a = np.concatenate([rng.uniform(0, 10, 3000), [-8.0, -2.0, 0.0, -0.0, 1.0, np.nan, np.inf, -np.inf, 2.0]])
    b = np.concatenate([rng.uniform(-20, 20, 3000), [1 / 3, 3.0, -1.0, -1.0, np.nan, 0.0, -1.0, 3.0, 0.5]])
    a, b = a.astype(dtype), b.astype(dtype)
    y = lib.map(f"b_pow_{s}", dtype, a, b)
    with np.errstate(all="ignore"):
        ref = np.power(a.astype(LD), b.astype(LD))
    assert ulp_error(y, ref, dtype).max() <= 1
    with np.errstate(all="ignore"):
        assert same_bits(y[-9:], torch.pow(torch.from_numpy(a[-9:]), torch.from_numpy(b[-9:])).numpy())


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_comparisons_and_where(lib, s):
    T, dtype, _ = {**FT, **IT}[s]
    if s in FT:
        a, b = _float_inputs(dtype, seed=6), _float_inputs(dtype, seed=7)
        b[::3] = a[::3]
    else:
        rng = np.random.default_rng(6)
        a = rng.integers(-5, 5, 3001).astype(dtype)
        b = rng.integers(-5, 5, 3001).astype(dtype)
        a[:4] = np.iinfo(dtype).min
        b[:2] = np.iinfo(dtype).max
    with np.errstate(invalid="ignore"):
        expect = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}
    for f, ref in expect.items():
        y = lib.map(f"c_{f}_{s}", np.bool_, a, b)
        assert np.array_equal(y, ref), f
    c = np.random.default_rng(8).random(a.size) < 0.5
    y = lib.map(f"w_{s}", dtype, c, a, b)
    assert same_bits(y, np.where(c, a, b))


def test_mixed_width_mask_and_bool_logic(lib):
    rng = np.random.default_rng(9)
    d = rng.standard_normal(1003)
    a = rng.standard_normal(1003).astype(np.float32)
    b = rng.standard_normal(1003).astype(np.float32)
    assert same_bits(lib.map("mixed_where", np.float32, d, a, b), np.where(d < 0, a, b))
    x = _float_inputs(np.float32)
    c = rng.random(x.size) < 0.5
    with np.errstate(invalid="ignore"):
        ref = ((x > 0) & c) | (~c & np.isnan(x))
    assert np.array_equal(lib.map("mask_logic", np.bool_, x, c), ref)


@pytest.mark.parametrize("s", ["f32", "f64"])
def test_classification(lib, s):
    dtype = FT[s][1]
    x = _float_inputs(dtype)
    for f, ref in {"isnan": np.isnan(x), "isinf": np.isinf(x), "isfinite": np.isfinite(x),
                   "signbit": np.signbit(x)}.items():
        assert np.array_equal(lib.map(f"m_{f}_{s}", np.bool_, x), ref), f


# ---------------------------------------------------------------------------------------------
# integers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", ["i32", "i64"])
def test_integer_ops_match_torch(lib, s):
    T, dtype, tdt = IT[s]
    info = np.iinfo(dtype)
    rng = np.random.default_rng(10)
    a = np.concatenate([rng.integers(-1000, 1000, 2000), rng.integers(info.min, info.max, 1000, endpoint=True),
                        [info.min, info.min, info.max, -7, 7, -7, 7, 0, 5, -5]]).astype(dtype)
    b = np.concatenate([rng.integers(-30, 30, 2000), rng.integers(info.min, info.max, 1000, endpoint=True),
                        [-1, 1, -1, 2, 2, -2, -2, 3, 3, 3]]).astype(dtype)
    b[b == 0] = 1
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    # torch's trunc division traps (SIGFPE) on INT_MIN / -1; ours wraps to INT_MIN like floor_divide
    ovf = (a == info.min) & (b == -1)
    tdiv = torch.div(torch.where(torch.from_numpy(ovf), 1, ta), tb, rounding_mode="trunc")
    tdiv[torch.from_numpy(ovf)] = info.min
    expect = {"add": ta + tb, "sub": ta - tb, "mul": ta * tb, "and": ta & tb, "or": ta | tb, "xor": ta ^ tb,
              "floordiv": torch.floor_divide(ta, tb), "remainder": torch.remainder(ta, tb),
              "div": tdiv, "fmod": torch.fmod(ta, tb),
              "maximum": torch.maximum(ta, tb), "minimum": torch.minimum(ta, tb)}
    for f, ref in expect.items():
        y = lib.map(f"b_{f}_{s}", dtype, a, b)
        assert np.array_equal(y, ref.numpy()), f"{f}[{s}]: {_show(a, y, ref.numpy())}"
    assert np.array_equal(lib.map(f"b_mod_{s}", dtype, a, b), torch.fmod(ta, tb).numpy())
    for f, ref in {"uminus": -ta, "abs": torch.abs(ta), "sign": torch.sign(ta), "bnot": ~ta,
                   "floor": ta, "round": ta}.items():
        assert np.array_equal(lib.map(f"u_{f}_{s}", dtype, a), ref.numpy()), f
    # shifts, including counts outside [0, bits)
    bits = 8 * np.dtype(dtype).itemsize
    sh = rng.integers(-3, bits + 5, a.size).astype(dtype)
    ts = torch.from_numpy(sh)
    assert np.array_equal(lib.map(f"b_shl_{s}", dtype, a, sh), (ta << ts).numpy())
    assert np.array_equal(lib.map(f"b_shr_{s}", dtype, a, sh), (ta >> ts).numpy())
    # pow with non-negative exponents (wrapping like torch)
    base = rng.integers(-6, 7, 500).astype(dtype)
    ex = rng.integers(0, 40, 500).astype(dtype)
    assert np.array_equal(lib.map(f"b_pow_{s}", dtype, base, ex),
                          torch.pow(torch.from_numpy(base), torch.from_numpy(ex)).numpy())


@pytest.mark.parametrize("s", ["i32", "i64"])
def test_integer_division_by_zero_does_not_trap(lib, s):
    dtype = IT[s][1]
    a = np.array([5, -5, 0, np.iinfo(dtype).min] * 5, dtype=dtype)
    b = np.zeros_like(a)
    for f in ("div", "mod", "floordiv", "remainder", "fmod"):
        assert np.array_equal(lib.map(f"b_{f}_{s}", dtype, a, b), np.zeros_like(a)), f


# ---------------------------------------------------------------------------------------------
# casts
# ---------------------------------------------------------------------------------------------
def _cast_inputs(s):
    rng = np.random.default_rng(11)
    if s == "u8":
        return np.arange(256).astype(np.uint8)
    if s in IT:
        info = np.iinfo(IT[s][1])
        return np.concatenate([rng.integers(-300, 300, 2000), rng.integers(info.min, info.max, 2000),
                               [info.min, info.max, 0, 2**24 + 1, -(2**24 + 1), 2**53 + 1 if s == "i64" else 3]]
                              ).astype(IT[s][1])
    x = _float_inputs(FT[s][1])
    return x


@pytest.mark.parametrize("src,dst", [(a, b) for a in ALLT for b in ALLT if a != b])
def test_casts(lib, src, dst):
    x = _cast_inputs(src)
    sd, dd = ALLT[src][1], ALLT[dst][1]
    if src in FT and dst not in FT:   # float -> int: C semantics only where defined (in range)
        info = np.iinfo(dd)
        with np.errstate(invalid="ignore"):
            x = x[np.isfinite(x) & (np.trunc(x) >= info.min) & (np.trunc(x) <= info.max)]
    elif src in IT and dst == "u8":   # C conversion to unsigned: modulo 256
        pass
    y = lib.map(f"cast_{src}_{dst}", dd, x)
    with np.errstate(all="ignore"):
        ref = x.astype(dd)
    assert same_bits(y, ref), f"{src}->{dst}: {_show(x, y, ref)}"


@pytest.mark.skipif(not X86, reason="x86 conversion semantics")
def test_float_to_int_out_of_range_is_indefinite(lib):
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9] * 4, dtype=np.float32)
    y = lib.map("cast_f32_i32", np.int32, x)
    assert np.all(y == np.iinfo(np.int32).min)
    t = torch.from_numpy(x).to(torch.int32).numpy()
    assert np.array_equal(y, t)


# ---------------------------------------------------------------------------------------------
# loads, stores, lanes, reductions
# ---------------------------------------------------------------------------------------------
def test_lane_counts(lib):
    L = LANES[lib.variant]
    assert lib.fn("lanes_f32", ctypes.c_int)() == L
    assert lib.fn("lanes_f64", ctypes.c_int)() == L      # equal lane counts across dtypes
    assert lib.fn("lanes_i8", ctypes.c_int)() == L
    assert lib.fn("has_fma", ctypes.c_int)() == int(HAS_FMA[lib.variant])


def _ct(s):
    return {"f32": ctypes.c_float, "f64": ctypes.c_double, "i32": ctypes.c_int32, "i64": ctypes.c_int64}[s]


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_loads_and_stores(lib, s):
    dtype = {**FT, **IT}[s][1]
    L = lib.lanes
    P = ctypes.c_void_p
    x = (np.arange(4 * L) * 3 + 1).astype(dtype)
    for m in range(0, L + 1):
        y = np.full(L, 99, dtype=dtype)
        lib.fn(f"ld_loadn_{s}", None, [P, ctypes.c_int, P])(x.ctypes.data, m, y.ctypes.data)
        assert np.array_equal(y, np.concatenate([x[:m], np.zeros(L - m, dtype)])), m
        y = np.full(L + 2, 99, dtype=dtype)
        lib.fn(f"ld_storen_{s}", None, [P, ctypes.c_int, P])(x.ctypes.data, m, y.ctypes.data)
        assert np.array_equal(y, np.concatenate([x[:m], np.full(L + 2 - m, 99, dtype)])), m
    for stride in (1, 2, 3, -1):
        y = np.empty(L, dtype=dtype)
        base = x.ctypes.data + (len(x) - 1) * x.itemsize if stride < 0 else x.ctypes.data
        lib.fn(f"ld_strided_{s}", None, [P, ctypes.c_int64, P])(base, stride, y.ctypes.data)
        ref = x[::-1][:L] if stride < 0 else x[::stride][:L]
        assert np.array_equal(y, ref), stride
    y = np.empty(L, dtype=dtype)
    lib.fn(f"ld_iota_{s}", None, [_ct(s), P])(dtype(5), y.ctypes.data)
    assert np.array_equal(y, np.arange(5, 5 + L).astype(dtype))
    ix = np.random.default_rng(12).integers(0, x.size, L).astype(np.int64)
    lib.fn(f"ld_gather_{s}", None, [P, P, P])(x.ctypes.data, ix.ctypes.data, y.ctypes.data)
    assert np.array_equal(y, x[ix])
    lane = lib.fn(f"ld_lane_{s}", _ct(s), [P, ctypes.c_int])
    assert [lane(x.ctypes.data, k) for k in range(L)] == list(x[:L])
    lib.fn(f"ld_bcast_{s}", None, [_ct(s), P])(dtype(-0.0) if s in FT else dtype(-7), y.ctypes.data)
    assert same_bits(y, np.full(L, -0.0 if s in FT else -7, dtype=dtype))   # -0.0 survives broadcast
    y[:] = 5
    lib.fn(f"ld_zero_{s}", None, [P])(y.ctypes.data)
    assert np.array_equal(y, np.zeros(L, dtype)) and not np.any(np.signbit(y))
    c = (np.arange(L) % 3 == 0)
    lib.fn(f"m_tof_{s}", None, [P, P])(c.ctypes.data, y.ctypes.data)
    assert np.array_equal(y, c.astype(dtype))


def _tree(v, op):
    v = list(v)
    while len(v) > 1:
        h = len(v) // 2
        v = [op(v[i], v[i + h]) for i in range(h)]
    return v[0]


@pytest.mark.parametrize("s", ["f32", "f64", "i32", "i64"])
def test_reductions(lib, s):
    dtype = {**FT, **IT}[s][1]
    L = lib.lanes
    P = ctypes.c_void_p
    rng = np.random.default_rng(13)

    def red(name, x):
        return lib.fn(f"r_{name}_{s}", _ct(s), [P])(np.ascontiguousarray(x).ctypes.data)

    def nanmax(a, b):
        return a + b if (np.isnan(a) or np.isnan(b)) else (a if a > b else b)

    def nanmin(a, b):
        return a + b if (np.isnan(a) or np.isnan(b)) else (a if a < b else b)

    for trial in range(20):
        if s in FT:
            x = (rng.standard_normal(L) * 10 ** rng.uniform(-3, 3, L)).astype(dtype)
            if trial % 4 == 1:
                x[rng.integers(L)] = np.nan
            if trial % 4 == 2:
                x[rng.integers(L)] = -np.inf
        else:
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, L).astype(dtype) if trial % 2 else rng.integers(-9, 9, L).astype(dtype)
        with np.errstate(all="ignore"):
            add = _tree(x, lambda a, b: (np.array([a]) + np.array([b]))[0])
            mul = _tree(x, lambda a, b: (np.array([a]) * np.array([b]))[0])
        assert same_bits(np.array([red("add", x)], dtype), np.array([add], dtype))
        assert same_bits(np.array([red("mul", x)], dtype), np.array([mul], dtype))
        if s in FT:
            assert same_bits(np.array([red("max", x)], dtype), np.array([_tree(x, nanmax)], dtype))
            assert same_bits(np.array([red("min", x)], dtype), np.array([_tree(x, nanmin)], dtype))
            if np.isnan(x).any():
                assert np.isnan(red("max", x)) and np.isnan(red("min", x))
        else:
            assert red("max", x) == x.max() and red("min", x) == x.min()


# ---------------------------------------------------------------------------------------------
# all widths agree bit for bit; the vector build is really vectorised
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", ["f32", "f64"])
def test_widths_bit_identical(libs, s):
    runnable = [v for v in ("w64", "w32", "scalar") if RUNNABLE[v]]
    if len(runnable) < 2:
        pytest.skip("needs two runnable widths")
    ls = {v: _lib_cache.get(v) or Lib(libs[v], v) for v in runnable}
    dtype = FT[s][1]
    for fn in VECTORISED:
        x = np.concatenate([points(fn, s)[:20000], special_points(s)])
        outs = {v: lib.map(f"u_{fn}_{s}", dtype, x) for v, lib in ls.items()}
        first = outs[runnable[0]]
        for v in runnable[1:]:
            assert same_bits(outs[v], first), f"{fn}[{s}]: {v} differs from {runnable[0]}"


def _disassemble(path, symbols):
    if shutil.which("objdump") is None:
        pytest.skip("objdump not installed")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True).stdout
    out = {}
    for sym in symbols:
        m = re.search(rf"<{sym}>:\n(.*?)(?:\n\n|\Z)", text, re.S)
        assert m, sym
        out[sym] = m.group(1)
    return out


@pytest.mark.parametrize("variant,reg,level", [("w64", "zmm", "avx512"), ("w32", "ymm", "avx2"),
                                               ("w64", "ymm", "avx2")])
def test_vectorised_in_machine_code(libs, variant, reg, level):
    """The host level's own registers: zmm in the 64-byte build of an AVX-512 host, ymm in the 32-byte
    build of an AVX2 host; on an AVX2-only host the 64-byte build is pairs of ymm."""
    if not X86 or not AT_LEAST[level] or (reg == "ymm" and variant == "w64" and HOST_ISA != "avx2"):
        pytest.skip(f"host level {HOST_ISA}: the {variant} build has no {reg} registers")
    syms = [f"u_{f}_{s}" for f in ("exp", "log", "tanh", "erf", "sigmoid", "expm1", "log1p") for s in FT]
    code = _disassemble(libs[variant], syms)
    libm = re.compile(r"call.*<(exp|log|tanh|erf|expm1|log1p|expf|logf|tanhf|erff|expm1f|log1pf)(@plt)?>")
    for sym, body in code.items():
        assert reg in body, f"{sym}: no {reg} instructions in the {variant} build"
        assert not libm.search(body), f"{sym} calls libm: {libm.search(body).group(0)}"
    sq = _disassemble(libs[variant], ["u_sqrt_f32", "u_sqrt_f64"])
    assert re.search(rf"vsqrtps\s+.*%{reg}", sq["u_sqrt_f32"]) and re.search(rf"vsqrtpd\s+.*%{reg}",
                                                                              sq["u_sqrt_f64"])
    if (variant, reg) == ("w64", "ymm"):
        return      # register pairs: not a width the code cache builds, so no claims on stores
    st = _disassemble(libs[variant], ["ld_stream_f32", "ld_streamn_f32"])
    for sym, body in st.items():   # streamed straight from the register, no detour through the stack
        assert re.search(rf"vmovntdq\s+%{reg}", body) and "sfence" in body, f"{sym}: no streaming store"
        assert not re.search(rf"vmov\w+\s+%{reg}\d+,\s*-?(0x[0-9a-f]+)?\(%rsp\)", body), f"{sym}: spills the vector\n{body}"
    if reg == "zmm":    # p * 2^n in one vscalefps (detail::ldexp_split), the clamp as max + min
        ex = _disassemble(libs[variant], ["u_exp_f32"])["u_exp_f32"]
        assert "vscalefps" in ex and "vmaxps" in ex and "vminps" in ex, ex
    sp = _disassemble(libs[variant], ["ld_split_f32"])["ld_split_f32"]
    if reg == "zmm":    # two 32-byte loads joined by one insert, not one 64-byte load (choices.split_loads)
        assert re.search(r"vinsert[if](32x8|64x4)\s+\$0x1,\s*0x20\(", sp) and not re.search(r"vmov\w+\s+\(%\w+\),%zmm", sp), sp


# ---------------------------------------------------------------------------------------------
# Philox4x32-10 (random ops): Random123's known answers, the same bits at every width
# ---------------------------------------------------------------------------------------------
PHILOX_KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
              ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
              ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
               (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


def _i64(lo, hi):
    return int(np.array(lo | (hi << 32), dtype=np.uint64).view(np.int64))


def _rng(lib, name, out_dtype, seed, off, stream, *extra):
    y = np.zeros(4 * lib.lanes if name == "rng_words" else lib.lanes, dtype=out_dtype)
    off = np.ascontiguousarray(off, dtype=np.int64)
    types = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int64, ctypes.c_uint64][:len(extra)]
    lib.fn(name, None, types + [ctypes.c_void_p])(seed, off.ctypes.data, stream, *extra, y.ctypes.data)
    return y


def test_philox_known_answers(lib):
    for ctr, key, want in PHILOX_KAT:
        off = np.full(lib.lanes, _i64(ctr[0], ctr[1]), dtype=np.int64)
        w = _rng(lib, "rng_words", np.uint32, _i64(*key), off, _i64(ctr[2], ctr[3])).reshape(4, lib.lanes)
        assert (w == np.array(want, dtype=np.uint32)[:, None]).all()


def test_philox_draws_same_bits_at_every_width(libs):
    runnable = [v for v in VARIANTS if RUNNABLE[v]]
    ls = {v: _lib_cache.get(v) or Lib(libs[v], v) for v in runnable}
    seed, stream = -0x1234567890ABCDE, 3
    offs = np.arange(64, dtype=np.int64) * 977 + (1 << 33)

    def draws(lib):
        out = {}
        for start in range(0, 64, lib.lanes):
            o = offs[start:start + lib.lanes]
            for s, (_, dt, _) in FT.items():
                for kind in ("rand", "randn"):
                    out.setdefault(f"{kind}_{s}", []).append(_rng(lib, f"rng_{kind}_{s}", dt, seed, o, stream))
            for lo, rng in ((-5, 10), (1, 2**40 + 7)):
                out.setdefault(f"int{rng}", []).append(_rng(lib, "rng_randint", np.int64, seed, o, stream, lo, rng))
        return {k: np.concatenate(v) for k, v in out.items()}
    results = {v: draws(lib) for v, lib in ls.items()}
    first = results[runnable[0]]
    for v in runnable[1:]:
        for k in first:
            if v == "sse" and k.startswith("randn"):
                continue   # no FMA hardware: log and cos take the other (equally accurate) path
            assert same_bits(results[v][k], first[k]), f"{k}: {v} differs from {runnable[0]}"
    u = first["rand_f32"]
    assert (u >= 0).all() and (u < 1).all() and np.isfinite(first["randn_f64"]).all()
    assert ((first["int10"] >= -5) & (first["int10"] < 5)).all()
    assert ((first[f"int{2**40 + 7}"] >= 1) & (first[f"int{2**40 + 7}"] < 2**40 + 8)).all()


def test_cos_2pi_of_a_box_muller_angle_every_float(lib):
    """detail::cos_2pi_unit on every u = k 2^-24 in [0, 1) (the float uniforms): the reduction is
    exact, so the error is the polynomials' -- below 1e-7 absolute (1.4 ulp at 0.7)."""
    u = np.arange(1 << 24, dtype=np.float64) * 2.0 ** -24
    got = lib.map("cos_2pi_unit", np.float32, u.astype(np.float32))
    err = np.abs(got.astype(np.float64) - np.cos(2 * np.pi * u))
    assert err.max() < 1e-7, (err.max(), u[err.argmax()])
