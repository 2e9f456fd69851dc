// cpp_prelude.h -- the C++ vector library that Stax CPU kernels are written against.
//
// Header-only, C++17, namespace tp, standard library only.  Built on GCC vector extensions
// (__attribute__((vector_size(N)))) so that a generated kernel reads as plain arithmetic:
//
//     auto x = tp::Vec<float>::load(in + i);
//     auto y = tp::where(x > 0.0f, x, tp::expm1(x));      // ELU
//     y.store(out + i);
//
// ---------------------------------------------------------------------------------------------
// WIDTH.  TP_VEC_BYTES is the register width in bytes: 64 (AVX-512), 32 (AVX2), 16 (SSE/NEON),
// chosen from __AVX512F__/__AVX2__ when the compile command does not define it.  TP_SCALAR (or
// TP_VEC_BYTES=0) selects the scalar fallback: every Vec has ONE lane, so the same generated code
// compiles and runs on any machine.
//
// LANES.  Every Vec<T> has the same number of lanes, TP_VEC_LANES = TP_VEC_BYTES / 4 (16, 8, 4, 1),
// whatever T is.  A Vec<float> / Vec<int32_t> is one register; a Vec<double> / Vec<int64_t> is two
// registers (an array of two native vectors, never one over-wide vector: GCC scalarises
// comparisons on those); Vec<int16_t>, Vec<int8_t>, Vec<uint8_t> use part of one register.  Lane
// i of every type belongs to the same loop index, so one loop can mix dtypes and cast<U>(v)
// converts all lanes of one value.
//
// MASKS.  A comparison of two Vec<T> gives a VecMask<sizeof(T)> (lanes all-ones or zero, same
// register layout as Vec<T>); tp::Mask = VecMask<4>.  Masks of different element widths convert
// into each other implicitly, so where(mask_of_doubles, float_a, float_b) works.
//
// IEEE.  Everything follows IEEE 754 with round-to-nearest: no -ffast-math (the chapter, §12.5), NaN in
// -> NaN out, +-0, +-inf, gradual underflow (subnormal results are produced, never flushed).
// NOTE: GCC's default -ffp-contract=fast fuses a*b+c written in a kernel into one FMA (one rounding
// instead of two) even with -std=c++17; -ffp-contract=off (the code cache passes it) keeps
// composite expressions bit-identical to eager PyTorch.  The functions below do not depend on it.
//
// ACCURACY CONTRACT (max error in ulps of the exact result over the whole domain, float32 and
// float64; enforced by test/stax/test_cpp_prelude.py on ~1e5 points per function and dtype plus
// special values, for every width, with and without FMA hardware; measured maxima are listed in
// docs/cpp_prelude.md).  "cr" = correctly rounded, i.e. bit-exact with IEEE, numpy and torch.
//
//   function                 bound  implementation
//   + - * /  sqrt            cr     hardware (vsqrtps/vsqrtpd); rsqrt = 1/sqrt(x), reciprocal = 1/x
//   floor ceil trunc round   exact  hardware rounding (vrndscale/vroundps); round = half to even
//   exp exp2 expm1           1      vectorised: Cody-Waite reduction + minimax polynomial
//   log log2 log10 log1p     1      vectorised: exponent split + atanh-series minimax polynomial
//   tanh (float)             1      vectorised: sixteen polynomials picked per lane (as float erf);
//                                   0.75 ulp, every float tested
//   tanh (double) sigmoid    1      vectorised: polynomial near 0, exp as a double-word elsewhere
//   erf (float)              1      vectorised: eight polynomials picked per lane by trunc(2|x|)
//                                   through a table permute (0.66 ulp, every float tested)
//   erf (double) erfc        1      vectorised: odd polynomial near 0, else exp(-x^2) * erfcx(x)
//                                   with erfcx a polynomial in t = (x-K)/(x+K)
//   sin cos                  1      vectorised in double precision (3-part pi/2, double-word
//   tan                      1.5    reduction) for |x| <= 2^28; per-lane libm beyond
//   sinh cosh                1      vectorised: Taylor polynomial (sinh, |x| < 1), else e^|x| as a
//                                   double-word and one correctly rounded e^-|x| term
//   hypot                    1      vectorised: float in double; double scaled, double-word a^2+b^2,
//                                   corrected sqrt
//   asin acos atan asinh acosh atanh cbrt lgamma atan2 nextafter pow fmod
//                            libm   per-lane calls to std:: (glibc: <= 1-4 ulp, cbrt ~3)
// Subnormal inputs and results are handled (never flushed to zero).  Polynomial coefficients were
// fitted for this file with a weighted Remez exchange (mpmath) and are stored as exact hex literals.
//
// INTEGERS.  + - * and unary - wrap (two's complement, computed unsigned: no UB).  / and % are C
// truncating division that never traps: x/0 == 0, x%0 == 0, INT_MIN/-1 == INT_MIN.
// floordiv/remainder follow Python/torch floor semantics (same zero-division convention; eager
// torch raises ZeroDivisionError instead: Stax kernels check divisors, see stax_kernel.h).  << and >> follow torch: shift counts < 0 or >= bit
// width give 0 (<<) or the sign fill (>>).  cast float->int truncates (C); out-of-range and NaN
// give the x86 "integer indefinite" value (INT_MIN), like torch on x86.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <iterator>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// ABI NOTE.  A Vec wider than the target's registers (TP_VEC_BYTES=64 without AVX-512, 32 without
// AVX) is a GCC vector returned by value, for which g++ notes "-Wpsabi: ... changes the ABI" at the
// first such call -- in the including file, after this header, so a push/pop around the header
// cannot hide it.  The note is about passing such values between objects built with different
// flags; Vec values never cross a translation unit (everything here is inline, and kernels export
// only extern "C" functions of pointers and integers), so the note does not apply to any program
// that includes this header and is switched off for the whole translation unit.
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic push

// ------------------------------------------------------------------ width selection
#if defined(TP_SCALAR)
#undef TP_VEC_BYTES
#define TP_VEC_BYTES 0
#elif !defined(TP_VEC_BYTES)
#if defined(__AVX512F__)
#define TP_VEC_BYTES 64
#elif defined(__AVX2__)
#define TP_VEC_BYTES 32
#else
#define TP_VEC_BYTES 16
#endif
#endif

#if TP_VEC_BYTES == 0
#define TP_VEC_LANES 1
#elif TP_VEC_BYTES == 16 || TP_VEC_BYTES == 32 || TP_VEC_BYTES == 64
#define TP_VEC_LANES (TP_VEC_BYTES / 4)
#else
#error "TP_VEC_BYTES must be 0 (scalar), 16, 32 or 64"
#endif

// Hardware fused multiply-add available?  The math kernels use it when present and fall back to
// exact (Dekker) products otherwise; both paths are tested.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define TP_HAS_FMA 1
#else
#define TP_HAS_FMA 0
#endif

#define TP_INLINE inline __attribute__((always_inline))

// The library, by topic (each a header of this folder; all in namespace tp):
#include "tp_vec.h"      // Vec<T>, VecMask<W>, memory, select, conversions, elementwise
#include "tp_reduce.h"   // horizontal reductions, accumulators (argmax/argmin, Welford)
#include "tp_math.h"     // division helpers, transcendental functions, per-lane libm
#include "tp_philox.h"   // Philox4x32-10 random numbers


#pragma GCC diagnostic pop
