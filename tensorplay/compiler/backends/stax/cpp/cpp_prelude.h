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

namespace tp {

constexpr int kVecBytes = TP_VEC_BYTES;
constexpr int kLanes = TP_VEC_LANES;

template <typename T> struct Vec;
template <int W> struct VecMask;
using Mask = VecMask<4>;
template <typename U, typename T> TP_INLINE Vec<U> cast(const Vec<T>& v);

namespace detail {

template <typename T>
struct is_elem
    : std::integral_constant<bool, std::is_same<T, float>::value || std::is_same<T, double>::value ||
                                       std::is_same<T, int8_t>::value || std::is_same<T, uint8_t>::value ||
                                       std::is_same<T, int16_t>::value || std::is_same<T, int32_t>::value ||
                                       std::is_same<T, int64_t>::value> {};

template <int W> struct int_of;
template <> struct int_of<1> { using type = int8_t; };
template <> struct int_of<2> { using type = int16_t; };
template <> struct int_of<4> { using type = int32_t; };
template <> struct int_of<8> { using type = int64_t; };

// Register layout of kLanes lanes of T: `count` native vectors of `bytes` bytes each.
template <typename T>
struct layout {
    static constexpr int total = kLanes * (int)sizeof(T);
    static constexpr int bytes = (kVecBytes == 0 || total <= kVecBytes) ? total : kVecBytes;
    static constexpr int count = total / bytes;
    static constexpr int chunk_lanes = bytes / (int)sizeof(T);
};
template <typename T>
struct chunk {
    typedef T type __attribute__((vector_size(layout<T>::bytes)));
    typedef T wide __attribute__((vector_size(layout<T>::total)));   // only for conversions
};
template <typename T> using uint_t = typename std::make_unsigned<T>::type;

}  // namespace detail

namespace detail {
// Streaming (non-temporal) stores: the bytes go to memory through write-combining buffers without
// first reading the destination line into the cache (the read-for-ownership a plain store of an
// uncached line costs).  For outputs larger than the last-level cache that is a third of the
// traffic of a read-one-write-one kernel.  A vector chunk is streamed in the widest pieces (64,
// 32 or 16 bytes) its destination's alignment allows -- a row that starts 32 bytes into a line
// streams as 32-byte halves -- straight from the register (a detour through memory to split it
// cost the 16384 x 1000 softmax 6 %); anything else is a plain store.  Streaming stores are
// weakly ordered: a writer must run stream_fence() (sfence) before another thread may read them
// -- generated kernels fence at the end of every parallel region and of the kernel.
#if defined(__SSE2__)
TP_INLINE void stream16(char* d, const __m128i& x) { _mm_stream_si128(reinterpret_cast<__m128i*>(d), x); }
#endif

// streams the first `bytes` bytes of chunk v to d (bytes <= sizeof(C)) if they are whole
// aligned pieces; false, with nothing written, otherwise
template <typename C>
TP_INLINE bool stream_chunk(char* d, const C& v, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(d);
#if defined(__AVX512F__)
    if constexpr (sizeof(C) == 64) {
        __m512i x;
        std::memcpy(&x, &v, 64);
        if (bytes == 64 && a % 64 == 0) {
            _mm512_stream_si512(reinterpret_cast<__m512i*>(d), x);
            return true;
        }
        if (bytes % 32 == 0 && a % 32 == 0) {
            _mm256_stream_si256(reinterpret_cast<__m256i*>(d), _mm512_castsi512_si256(x));
            if (bytes == 64) _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), _mm512_extracti64x4_epi64(x, 1));
            return true;
        }
        if (bytes % 16 == 0 && a % 16 == 0) {
            stream16(d, _mm512_castsi512_si128(x));
            if (bytes > 16) stream16(d + 16, _mm512_extracti32x4_epi32(x, 1));
            if (bytes > 32) stream16(d + 32, _mm512_extracti32x4_epi32(x, 2));
            if (bytes > 48) stream16(d + 48, _mm512_extracti32x4_epi32(x, 3));
            return true;
        }
        return false;
    }
#endif
#if defined(__AVX__)
    if constexpr (sizeof(C) == 32) {
        __m256i x;
        std::memcpy(&x, &v, 32);
        if (bytes == 32 && a % 32 == 0) {
            _mm256_stream_si256(reinterpret_cast<__m256i*>(d), x);
            return true;
        }
        if (bytes % 16 == 0 && a % 16 == 0) {
            stream16(d, _mm256_castsi256_si128(x));
            if (bytes > 16) stream16(d + 16, _mm256_extractf128_si256(x, 1));
            return true;
        }
        return false;
    }
#endif
#if defined(__SSE2__)
    if constexpr (sizeof(C) == 16) {
        if (bytes != 16 || a % 16 != 0) return false;
        __m128i x;
        std::memcpy(&x, &v, 16);
        stream16(d, x);
        return true;
    }
#endif
    (void)a; (void)d; (void)v; (void)bytes;
    return false;   // 8-byte chunks, or no SIMD streaming stores
}
}  // namespace detail
// orders this thread's streaming stores before its later stores (and so before the barrier that
// ends an OpenMP region): an sfence on x86, nothing elsewhere (no streaming stores there)
TP_INLINE void stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

// Asks for the ``bytes`` bytes from ``p`` on, one prefetch per 64-byte line.  Generated kernels
// call it at the start of every chunk of a read stream from memory (choices.prefetch_chunk): all
// of the chunk's misses are then in flight at once, where the hardware prefetcher, which follows a
// stream only within a 4 KiB page, ramps up again on every page.  A prefetch never faults, so the
// block may run past the end of the buffer; the address is formed as an integer for that reason.
TP_INLINE void prefetch_block(const void* p, int bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (int k = 0; k < bytes; k += 64) __builtin_prefetch(reinterpret_cast<const void*>(a + k), 0, 3);
}

namespace detail {
// One native chunk of lanes p[0], p[stride], p[2*stride], ... (a strided view read by a vector
// loop: a pooling window with stride 2, a transposed operand).  AVX-512: stride 2 is two loads and
// one lane permute (the second load masked so that it stops at the last element used: it never
// touches memory past it); other strides whose offsets fit in 32 bits are one hardware gather.  A
// lane loop otherwise (AVX2/SSE/scalar builds, 1/2-byte elements).
template <typename C, typename E>
TP_INLINE C chunk_load_strided(const E* p, int64_t stride) {
    constexpr int lanes = int(sizeof(C) / sizeof(E));
#if defined(__AVX512F__)
    if constexpr (sizeof(C) == 64 && sizeof(E) == 4) {
        if (stride == 2) {
            const __m512 a = _mm512_loadu_ps(p), b = _mm512_maskz_loadu_ps(__mmask16(0x7FFF), p + 16);
            const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            return (C)_mm512_permutex2var_ps(a, even, b);
        }
        if (stride > -(1 << 26) && stride < (1 << 26)) {
            const __m512i off = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                   _mm512_set1_epi32(int(stride)));
            return (C)_mm512_i32gather_ps(off, p, 4);
        }
    }
    if constexpr (sizeof(C) == 64 && sizeof(E) == 8) {
        if (stride == 2) {
            const __m512d a = _mm512_loadu_pd(p), b = _mm512_maskz_loadu_pd(__mmask8(0x7F), p + 8);
            return (C)_mm512_permutex2var_pd(a, _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), b);
        }
        const __m512i off = _mm512_mullo_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi64(stride));
        return (C)_mm512_i64gather_pd(off, p, 8);
    }
#endif
    C r;
    for (int i = 0; i < lanes; ++i) r[i] = p[(int64_t)i * stride];
    return r;
}

// Partial loads/stores of one native chunk: the first m lanes (m may be <= 0 or >= the lane count).
// AVX-512 / AVX2 masked moves (they never touch memory outside the mask); a lane loop otherwise.
template <typename C, typename E>
TP_INLINE C chunk_loadn(const E* p, int m) {
    constexpr int lanes = int(sizeof(C) / sizeof(E));
    if (m >= lanes) {
        C r;
        std::memcpy(&r, p, sizeof(C));
        return r;
    }
    if (m <= 0) return C{};
#if defined(__AVX512F__)
    if constexpr (sizeof(C) == 64 && sizeof(E) == 4) {
        const __mmask16 k = __mmask16((1u << m) - 1u);
        if constexpr (std::is_same<E, float>::value) return (C)_mm512_maskz_loadu_ps(k, p);
        else return (C)_mm512_maskz_loadu_epi32(k, p);
    }
    if constexpr (sizeof(C) == 64 && sizeof(E) == 8) {
        const __mmask8 k = __mmask8((1u << m) - 1u);
        if constexpr (std::is_same<E, double>::value) return (C)_mm512_maskz_loadu_pd(k, p);
        else return (C)_mm512_maskz_loadu_epi64(k, p);
    }
#endif
#if defined(__AVX2__)
    if constexpr (sizeof(C) == 32 && sizeof(E) == 4) {
        const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        if constexpr (std::is_same<E, float>::value) return (C)_mm256_maskload_ps(p, k);
        else return (C)_mm256_maskload_epi32(reinterpret_cast<const int*>(p), k);
    }
    if constexpr (sizeof(C) == 32 && sizeof(E) == 8) {
        const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(m), _mm256_setr_epi64x(0, 1, 2, 3));
        if constexpr (std::is_same<E, double>::value) return (C)_mm256_maskload_pd(p, k);
        else return (C)_mm256_maskload_epi64(reinterpret_cast<const long long*>(p), k);
    }
#endif
    E t[lanes] = {};
    for (int i = 0; i < m; ++i) t[i] = p[i];
    C r;
    std::memcpy(&r, t, sizeof(C));
    return r;
}
template <typename C, typename E>
TP_INLINE void chunk_storen(E* p, const C& v, int m) {
    constexpr int lanes = int(sizeof(C) / sizeof(E));
    if (m >= lanes) {
        std::memcpy(p, &v, sizeof(C));
        return;
    }
    if (m <= 0) return;
#if defined(__AVX512F__)
    if constexpr (sizeof(C) == 64 && sizeof(E) == 4) {
        const __mmask16 k = __mmask16((1u << m) - 1u);
        if constexpr (std::is_same<E, float>::value) _mm512_mask_storeu_ps(p, k, (__m512)v);
        else _mm512_mask_storeu_epi32(p, k, (__m512i)v);
        return;
    }
    if constexpr (sizeof(C) == 64 && sizeof(E) == 8) {
        const __mmask8 k = __mmask8((1u << m) - 1u);
        if constexpr (std::is_same<E, double>::value) _mm512_mask_storeu_pd(p, k, (__m512d)v);
        else _mm512_mask_storeu_epi64(p, k, (__m512i)v);
        return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (sizeof(C) == 32 && sizeof(E) == 4) {
        const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        if constexpr (std::is_same<E, float>::value) _mm256_maskstore_ps(p, k, (__m256)v);
        else _mm256_maskstore_epi32(reinterpret_cast<int*>(p), k, (__m256i)v);
        return;
    }
    if constexpr (sizeof(C) == 32 && sizeof(E) == 8) {
        const __m256i k = _mm256_cmpgt_epi64(_mm256_set1_epi64x(m), _mm256_setr_epi64x(0, 1, 2, 3));
        if constexpr (std::is_same<E, double>::value) _mm256_maskstore_pd(p, k, (__m256d)v);
        else _mm256_maskstore_epi64(reinterpret_cast<long long*>(p), k, (__m256i)v);
        return;
    }
#endif
    E t[lanes];
    std::memcpy(t, &v, sizeof(C));
    for (int i = 0; i < m; ++i) p[i] = t[i];
}
}  // namespace detail

// =============================================================================================
// VecMask<W>: the result of comparing Vec<T> with sizeof(T) == W.  Lanes are -1 (true) or 0.
// =============================================================================================
template <int W>
struct VecMask {
    using I = typename detail::int_of<W>::type;
    using L = detail::layout<I>;
    using chunk_type = typename detail::chunk<I>::type;
    static constexpr int size = kLanes;
    static constexpr int nchunks = L::count;
    static constexpr int chunk_lanes = L::chunk_lanes;
    chunk_type c[nchunks];

    TP_INLINE VecMask() : c{} {}
    TP_INLINE VecMask(bool b) : c{} {
        for (int k = 0; k < nchunks; ++k)
            c[k] = I(b ? -1 : 0) - chunk_type{};
    }
    template <int W2, typename = typename std::enable_if<W2 != W>::type>
    TP_INLINE VecMask(const VecMask<W2>& o);    // width conversion (sign extension / truncation)
    // bool tensors: one byte per element, 0 or 1
    static TP_INLINE VecMask load(const bool* p);
    static TP_INLINE VecMask loadn(const bool* p, int n);
    TP_INLINE void store(bool* p) const;
    TP_INLINE void storen(bool* p, int n) const;
    TP_INLINE bool operator[](int i) const { return c[i / chunk_lanes][i % chunk_lanes] != 0; }

    friend TP_INLINE VecMask operator&(const VecMask& a, const VecMask& b) {
        VecMask r;
        for (int k = 0; k < nchunks; ++k) r.c[k] = a.c[k] & b.c[k];
        return r;
    }
    friend TP_INLINE VecMask operator|(const VecMask& a, const VecMask& b) {
        VecMask r;
        for (int k = 0; k < nchunks; ++k) r.c[k] = a.c[k] | b.c[k];
        return r;
    }
    friend TP_INLINE VecMask operator^(const VecMask& a, const VecMask& b) {
        VecMask r;
        for (int k = 0; k < nchunks; ++k) r.c[k] = a.c[k] ^ b.c[k];
        return r;
    }
    friend TP_INLINE VecMask operator~(const VecMask& a) {
        VecMask r;
        for (int k = 0; k < nchunks; ++k) r.c[k] = ~a.c[k];
        return r;
    }
    friend TP_INLINE VecMask operator!(const VecMask& a) { return ~a; }
    friend TP_INLINE VecMask operator==(const VecMask& a, const VecMask& b) { return ~(a ^ b); }
    friend TP_INLINE VecMask operator!=(const VecMask& a, const VecMask& b) { return a ^ b; }
};

template <int W> TP_INLINE bool any(const VecMask<W>& m) {
    for (int i = 0; i < kLanes; ++i)
        if (m[i]) return true;
    return false;
}
template <int W> TP_INLINE bool all(const VecMask<W>& m) {
    for (int i = 0; i < kLanes; ++i)
        if (!m[i]) return false;
    return true;
}

// =============================================================================================
// Vec<T>
// =============================================================================================
template <typename T>
struct Vec {
    static_assert(detail::is_elem<T>::value,
                  "tp::Vec<T>: T must be float, double, int8_t, uint8_t, int16_t, int32_t or int64_t");
    using value_type = T;
    using L = detail::layout<T>;
    using chunk_type = typename detail::chunk<T>::type;
    using mask_type = VecMask<sizeof(T)>;
    static constexpr int size = kLanes;
    static constexpr int nchunks = L::count;
    static constexpr int chunk_lanes = L::chunk_lanes;
    chunk_type c[nchunks];

    TP_INLINE Vec() : c{} {}                 // all lanes zero
    TP_INLINE Vec(T s) : c{} {                // broadcast (keeps -0.0 and NaN payloads)
        for (int k = 0; k < nchunks; ++k) c[k] = s - chunk_type{};   // s - (+0) == s, also for -0
    }
    static TP_INLINE Vec load(const T* p) {  // unaligned
        Vec r;
        std::memcpy(r.c, p, sizeof(r.c));
        return r;
    }
    // load() of a read stream from main memory (choices.split_loads): each 64-byte chunk as two
    // 32-byte loads joined by one lane insert.  The same lanes as load().  On the 2-core AMD EPYC
    // (Zen 4, which executes a 64-byte load as two halves) a row sum streamed 12-17 % faster this
    // way than with 64-byte loads, one thread or two; loads from cache gain nothing from it.
    static TP_INLINE Vec load_split(const T* p) {
#if defined(__AVX512F__)
        if constexpr (sizeof(chunk_type) == 64) {
            Vec r;
            const char* q = reinterpret_cast<const char*>(p);
            for (int k = 0; k < nchunks; ++k) {
                const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * k));
                const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * k + 32));
                r.c[k] = (chunk_type)_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
            return r;
        }
#endif
        return load(p);
    }
    static TP_INLINE Vec loadn(const T* p, int n) {   // first n lanes, the rest 0
        Vec r;
        for (int k = 0; k < nchunks; ++k)
            r.c[k] = detail::chunk_loadn<chunk_type>(p + (n > k * chunk_lanes ? k * chunk_lanes : 0),
                                                     n - k * chunk_lanes);
        return r;
    }
    static TP_INLINE Vec load_strided(const T* p, int64_t stride) {   // gather p[i*stride]
        Vec r;
        for (int k = 0; k < nchunks; ++k)
            r.c[k] = detail::chunk_load_strided<chunk_type>(p + (int64_t)k * chunk_lanes * stride, stride);
        return r;
    }
    template <typename Ix>
    static TP_INLINE Vec gather(const T* p, const Vec<Ix>& idx) {       // p[idx[i]]
        T t[size];
        for (int i = 0; i < size; ++i) t[i] = p[(int64_t)idx[i]];
        return load(t);
    }
    TP_INLINE void store(T* p) const { std::memcpy(p, c, sizeof(c)); }
    // store() that bypasses the caches (non-temporal) as far as p's alignment allows; the data
    // is visible to other threads only after tp::stream_fence() (see detail::stream_chunk)
    TP_INLINE void store_stream(T* p) const { storen_stream(p, size); }
    TP_INLINE void storen(T* p, int n) const {         // first n lanes only
        for (int k = 0; k < nchunks; ++k)
            detail::chunk_storen(p + (n > k * chunk_lanes ? k * chunk_lanes : 0), c[k], n - k * chunk_lanes);
    }
    // storen() that streams where the n lanes are whole aligned pieces (a row's 32-byte tail),
    // a plain storen() elsewhere
    TP_INLINE void storen_stream(T* p, int n) const {
        for (int k = 0; k < nchunks; ++k) {
            const int m = n - k * chunk_lanes;
            if (m <= 0) break;
            const size_t bytes = (size_t)(m < chunk_lanes ? m : chunk_lanes) * sizeof(T);
            if (!detail::stream_chunk(reinterpret_cast<char*>(p + k * chunk_lanes), c[k], bytes))
                detail::chunk_storen(p + k * chunk_lanes, c[k], m);
        }
    }
    TP_INLINE void store_strided(T* p, int64_t stride) const {
        T t[size];
        store(t);
        for (int i = 0; i < size; ++i) p[(int64_t)i * stride] = t[i];
    }
    static TP_INLINE Vec iota(T start) {      // start, start+1, ...
        T t[size];
        for (int i = 0; i < size; ++i) t[i] = T(start + T(i));
        return load(t);
    }
    TP_INLINE T operator[](int i) const { return c[i / chunk_lanes][i % chunk_lanes]; }
    TP_INLINE void set(int i, T v) { c[i / chunk_lanes][i % chunk_lanes] = v; }

    // ---- arithmetic (integers wrap: computed on the unsigned type) ----
#define TP_VEC_ARITH(OP)                                                                  \
    friend TP_INLINE Vec operator OP(const Vec& a, const Vec& b) {                        \
        Vec r;                                                                            \
        for (int k = 0; k < nchunks; ++k) {                                               \
            if constexpr (std::is_integral<T>::value) {                                   \
                using U = typename detail::chunk<detail::uint_t<T>>::type;                \
                r.c[k] = (chunk_type)((U)a.c[k] OP (U)b.c[k]);                            \
            } else {                                                                      \
                r.c[k] = a.c[k] OP b.c[k];                                                \
            }                                                                             \
        }                                                                                 \
        return r;                                                                         \
    }                                                                                     \
    TP_INLINE Vec& operator OP##=(const Vec& b) { return *this = *this OP b; }
    TP_VEC_ARITH(+)
    TP_VEC_ARITH(-)
    TP_VEC_ARITH(*)
#undef TP_VEC_ARITH

    friend TP_INLINE Vec operator/(const Vec& a, const Vec& b) {
        Vec r;
        if constexpr (std::is_integral<T>::value) {
            for (int k = 0; k < nchunks; ++k)
                for (int i = 0; i < chunk_lanes; ++i) {
                    T x = a.c[k][i], y = b.c[k][i];
                    r.c[k][i] = y == 0 ? T(0) : (std::is_signed<T>::value && y == T(-1))
                                                    ? T(detail::uint_t<T>(0) - detail::uint_t<T>(x))
                                                    : T(x / y);
                }
        } else {
            for (int k = 0; k < nchunks; ++k) r.c[k] = a.c[k] / b.c[k];
        }
        return r;
    }
    TP_INLINE Vec& operator/=(const Vec& b) { return *this = *this / b; }
    friend TP_INLINE Vec operator%(const Vec& a, const Vec& b) {   // C remainder (integers)
        static_assert(std::is_integral<T>::value, "operator% is for integer Vec; use tp::fmod");
        Vec r;
        for (int k = 0; k < nchunks; ++k)
            for (int i = 0; i < chunk_lanes; ++i) {
                T x = a.c[k][i], y = b.c[k][i];
                r.c[k][i] = (y == 0 || (std::is_signed<T>::value && y == T(-1))) ? T(0) : T(x % y);
            }
        return r;
    }
    friend TP_INLINE Vec operator-(const Vec& a) {
        if constexpr (std::is_integral<T>::value) {
            return Vec(T(0)) - a;
        } else {
            Vec r;
            for (int k = 0; k < nchunks; ++k) r.c[k] = -a.c[k];
            return r;
        }
    }
    friend TP_INLINE Vec operator+(const Vec& a) { return a; }

    // ---- bitwise (integers) ----
#define TP_VEC_BITOP(OP)                                                                  \
    friend TP_INLINE Vec operator OP(const Vec& a, const Vec& b) {                        \
        static_assert(std::is_integral<T>::value, "bitwise ops are for integer Vec");     \
        Vec r;                                                                            \
        for (int k = 0; k < nchunks; ++k) r.c[k] = a.c[k] OP b.c[k];                      \
        return r;                                                                         \
    }                                                                                     \
    TP_INLINE Vec& operator OP##=(const Vec& b) { return *this = *this OP b; }
    TP_VEC_BITOP(&)
    TP_VEC_BITOP(|)
    TP_VEC_BITOP(^)
#undef TP_VEC_BITOP
    friend TP_INLINE Vec operator~(const Vec& a) {
        static_assert(std::is_integral<T>::value, "bitwise ops are for integer Vec");
        Vec r;
        for (int k = 0; k < nchunks; ++k) r.c[k] = ~a.c[k];
        return r;
    }
    // shifts with torch semantics: count outside [0, bits) gives 0 (<<) or the sign fill (>>)
    friend TP_INLINE Vec operator<<(const Vec& a, const Vec& b) {
        static_assert(std::is_integral<T>::value, "shifts are for integer Vec");
        using U = typename detail::chunk<detail::uint_t<T>>::type;
        constexpr T nb = T(8 * sizeof(T));
        const Vec zero(T(0)), bits(nb);
        Vec r;
        for (int k = 0; k < nchunks; ++k) {
            auto oob = (b.c[k] < zero.c[k]) | (b.c[k] >= bits.c[k]);
            chunk_type cnt = oob ? zero.c[k] : b.c[k];
            chunk_type s = (chunk_type)((U)a.c[k] << (U)cnt);
            r.c[k] = oob ? zero.c[k] : s;
        }
        return r;
    }
    friend TP_INLINE Vec operator>>(const Vec& a, const Vec& b) {
        static_assert(std::is_integral<T>::value, "shifts are for integer Vec");
        constexpr T nb = T(8 * sizeof(T));
        const Vec zero(T(0)), bits(nb), top(T(nb - 1));
        Vec r;
        for (int k = 0; k < nchunks; ++k) {
            auto oob = (b.c[k] < zero.c[k]) | (b.c[k] >= bits.c[k]);
            if constexpr (std::is_signed<T>::value) {
                chunk_type cnt = oob ? top.c[k] : b.c[k];
                r.c[k] = a.c[k] >> cnt;
            } else {
                chunk_type cnt = oob ? zero.c[k] : b.c[k];
                chunk_type s = a.c[k] >> cnt;
                r.c[k] = oob ? zero.c[k] : s;
            }
        }
        return r;
    }
    TP_INLINE Vec& operator<<=(const Vec& b) { return *this = *this << b; }
    TP_INLINE Vec& operator>>=(const Vec& b) { return *this = *this >> b; }

    // ---- comparisons -> VecMask<sizeof(T)> ----
#define TP_VEC_CMP(OP)                                                                    \
    friend TP_INLINE mask_type operator OP(const Vec& a, const Vec& b) {                  \
        mask_type m;                                                                      \
        for (int k = 0; k < nchunks; ++k)                                                 \
            m.c[k] = (typename mask_type::chunk_type)(a.c[k] OP b.c[k]);                  \
        return m;                                                                         \
    }
    TP_VEC_CMP(==)
    TP_VEC_CMP(!=)
    TP_VEC_CMP(<)
    TP_VEC_CMP(<=)
    TP_VEC_CMP(>)
    TP_VEC_CMP(>=)
#undef TP_VEC_CMP
};

// =============================================================================================
// select, conversions
// =============================================================================================
template <typename T, int W>
TP_INLINE Vec<T> where(const VecMask<W>& m0, const Vec<T>& a, const Vec<T>& b) {
    const VecMask<sizeof(T)> m(m0);
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = m.c[k] ? a.c[k] : b.c[k];
    return r;
}
template <typename T, int W>
TP_INLINE Vec<T> where(const VecMask<W>& m, const Vec<T>& a, typename Vec<T>::value_type b) {
    return where(m, a, Vec<T>(b));
}
template <typename T, int W>
TP_INLINE Vec<T> where(const VecMask<W>& m, typename Vec<T>::value_type a, const Vec<T>& b) {
    return where(m, Vec<T>(a), b);
}
template <int W, int W2>
TP_INLINE VecMask<W> where(const VecMask<W2>& m0, const VecMask<W>& a, const VecMask<W>& b) {
    const VecMask<W> m(m0);
    return (m & a) | (~m & b);
}

// cast<U>(v): lane-wise C conversion (float->int truncates).  Converted chunk by chunk through
// sub-vectors of a native register, so that no over-wide temporary goes through memory.
namespace detail {
template <typename T, int N> struct subvec { typedef T type __attribute__((vector_size(N * sizeof(T)))); };
}  // namespace detail
template <typename U, typename T>
TP_INLINE Vec<U> cast(const Vec<T>& v) {
    static_assert(detail::is_elem<U>::value, "cast<U>: unsupported lane type");
    if constexpr (std::is_same<U, T>::value) {
        return v;
    } else {
        constexpr int ls = Vec<T>::chunk_lanes, ld = Vec<U>::chunk_lanes;
        Vec<U> r;
        if constexpr (ld <= ls) {   // each destination chunk comes from part of one source chunk
            using S = typename detail::subvec<T, ld>::type;
            for (int j = 0; j < Vec<U>::nchunks; ++j) {
                S part;
                std::memcpy(&part, reinterpret_cast<const T*>(&v.c[(j * ld) / ls]) + (j * ld) % ls, sizeof(S));
                r.c[j] = __builtin_convertvector(part, typename Vec<U>::chunk_type);
            }
        } else {                    // each destination chunk is made of several converted source chunks
            using D = typename detail::subvec<U, ls>::type;
            for (int k = 0; k < Vec<T>::nchunks; ++k) {
                D part = __builtin_convertvector(v.c[k], D);
                std::memcpy(reinterpret_cast<U*>(&r.c[(k * ls) / ld]) + (k * ls) % ld, &part, sizeof(D));
            }
        }
        return r;
    }
}
// VecMask members that need Vec and cast
template <int W>
template <int W2, typename>
TP_INLINE VecMask<W>::VecMask(const VecMask<W2>& o) {
    using I2 = typename VecMask<W2>::I;
    Vec<I2> v;
    std::memcpy(v.c, o.c, sizeof(v.c));
    Vec<I> r = cast<I>(v);   // -1 stays -1
    std::memcpy(c, r.c, sizeof(c));
}
template <int W>
TP_INLINE VecMask<W> VecMask<W>::load(const bool* p) {
    const Vec<uint8_t> b = Vec<uint8_t>::load(reinterpret_cast<const uint8_t*>(p));
    return VecMask<W>(b != Vec<uint8_t>(uint8_t(0)));
}
template <int W>
TP_INLINE VecMask<W> VecMask<W>::loadn(const bool* p, int n) {
    const Vec<uint8_t> b = Vec<uint8_t>::loadn(reinterpret_cast<const uint8_t*>(p), n);
    return VecMask<W>(b != Vec<uint8_t>(uint8_t(0)));
}
template <int W>
TP_INLINE void VecMask<W>::store(bool* p) const {
    const VecMask<1> m(*this);
    Vec<uint8_t> b;
    std::memcpy(b.c, m.c, sizeof(b.c));
    (b & Vec<uint8_t>(uint8_t(1))).store(reinterpret_cast<uint8_t*>(p));
}
template <int W>
TP_INLINE void VecMask<W>::storen(bool* p, int n) const {
    const VecMask<1> m(*this);
    Vec<uint8_t> b;
    std::memcpy(b.c, m.c, sizeof(b.c));
    (b & Vec<uint8_t>(uint8_t(1))).storen(reinterpret_cast<uint8_t*>(p), n);
}

// cast<U>(mask): true -> 1, false -> 0
template <typename U, int W>
TP_INLINE Vec<U> cast(const VecMask<W>& m) {
    return where(m, Vec<U>(U(1)), Vec<U>(U(0)));
}
template <typename T>
TP_INLINE typename Vec<T>::mask_type to_mask(const Vec<T>& v) { return v != Vec<T>(T(0)); }

// Reinterpret the bits of each lane (sizeof(U) == sizeof(T)).
template <typename U, typename T>
TP_INLINE Vec<U> bitcast(const Vec<T>& v) {
    static_assert(sizeof(U) == sizeof(T), "bitcast needs equal lane widths");
    Vec<U> r;
    std::memcpy(r.c, v.c, sizeof(r.c));
    return r;
}

// Apply a scalar function lane by lane (the fallback for functions without a vector version).
template <typename T, typename F>
TP_INLINE Vec<T> map(const Vec<T>& a, F f) {
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k)
        for (int i = 0; i < Vec<T>::chunk_lanes; ++i) r.c[k][i] = f(a.c[k][i]);
    return r;
}
template <typename T, typename F>
TP_INLINE Vec<T> map(const Vec<T>& a, const Vec<T>& b, F f) {
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k)
        for (int i = 0; i < Vec<T>::chunk_lanes; ++i) r.c[k][i] = f(a.c[k][i], b.c[k][i]);
    return r;
}

namespace detail {
// Lane-wise hardware operations on one native chunk: x86 intrinsics where the chunk is a native
// register of the compile target, a lane loop otherwise (scalar builds, other ISAs).
enum class rnd { floor, ceil, trunc, nearest };

template <typename C>
TP_INLINE C chunk_fma(const C& a, const C& b, const C& c) {
    using E = typename std::remove_cv<typename std::remove_reference<decltype(a[0])>::type>::type;
    constexpr int bytes = sizeof(C);
    (void)bytes;
#if defined(__AVX512F__)
    if constexpr (bytes == 64 && std::is_same<E, float>::value) return (C)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
    if constexpr (bytes == 64 && std::is_same<E, double>::value) return (C)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#endif
#if defined(__FMA__)
    if constexpr (bytes == 32 && std::is_same<E, float>::value) return (C)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
    if constexpr (bytes == 32 && std::is_same<E, double>::value) return (C)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
    if constexpr (bytes == 16 && std::is_same<E, float>::value) return (C)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
    if constexpr (bytes == 16 && std::is_same<E, double>::value) return (C)_mm_fmadd_pd((__m128d)a, (__m128d)b, (__m128d)c);
#endif
    C r;
    for (int i = 0; i < int(sizeof(C) / sizeof(E)); ++i) r[i] = std::fma(a[i], b[i], c[i]);
    return r;
}

template <typename C>
TP_INLINE C chunk_sqrt(const C& a) {
    using E = typename std::remove_cv<typename std::remove_reference<decltype(a[0])>::type>::type;
    constexpr int bytes = sizeof(C);
    (void)bytes;
#if defined(__AVX512F__)
    if constexpr (bytes == 64 && std::is_same<E, float>::value) return (C)_mm512_sqrt_ps((__m512)a);
    if constexpr (bytes == 64 && std::is_same<E, double>::value) return (C)_mm512_sqrt_pd((__m512d)a);
#endif
#if defined(__AVX__)
    if constexpr (bytes == 32 && std::is_same<E, float>::value) return (C)_mm256_sqrt_ps((__m256)a);
    if constexpr (bytes == 32 && std::is_same<E, double>::value) return (C)_mm256_sqrt_pd((__m256d)a);
#endif
#if defined(__SSE2__)
    if constexpr (bytes == 16 && std::is_same<E, float>::value) return (C)_mm_sqrt_ps((__m128)a);
    if constexpr (bytes == 16 && std::is_same<E, double>::value) return (C)_mm_sqrt_pd((__m128d)a);
#endif
    C r;
    for (int i = 0; i < int(sizeof(C) / sizeof(E)); ++i) r[i] = std::sqrt(a[i]);
    return r;
}

template <rnd M, typename C>
TP_INLINE C chunk_round(const C& a) {
    using E = typename std::remove_cv<typename std::remove_reference<decltype(a[0])>::type>::type;
    constexpr int bytes = sizeof(C);
    (void)bytes;
#if defined(__SSE4_1__)
    constexpr int imm = (M == rnd::floor ? _MM_FROUND_TO_NEG_INF
                         : M == rnd::ceil ? _MM_FROUND_TO_POS_INF
                         : M == rnd::trunc ? _MM_FROUND_TO_ZERO : _MM_FROUND_TO_NEAREST_INT) | _MM_FROUND_NO_EXC;
#endif
#if defined(__AVX512F__)
    if constexpr (bytes == 64 && std::is_same<E, float>::value) return (C)_mm512_roundscale_ps((__m512)a, imm);
    if constexpr (bytes == 64 && std::is_same<E, double>::value) return (C)_mm512_roundscale_pd((__m512d)a, imm);
#endif
#if defined(__AVX__)
    if constexpr (bytes == 32 && std::is_same<E, float>::value) return (C)_mm256_round_ps((__m256)a, imm);
    if constexpr (bytes == 32 && std::is_same<E, double>::value) return (C)_mm256_round_pd((__m256d)a, imm);
#endif
#if defined(__SSE4_1__)
    if constexpr (bytes == 16 && std::is_same<E, float>::value) return (C)_mm_round_ps((__m128)a, imm);
    if constexpr (bytes == 16 && std::is_same<E, double>::value) return (C)_mm_round_pd((__m128d)a, imm);
#endif
    C r;
    for (int i = 0; i < int(sizeof(C) / sizeof(E)); ++i)
        r[i] = M == rnd::floor ? std::floor(a[i]) : M == rnd::ceil ? std::ceil(a[i])
             : M == rnd::trunc ? std::trunc(a[i]) : std::nearbyint(a[i]);   // default mode: ties to even
    return r;
}

template <rnd M, typename T>
TP_INLINE Vec<T> round_vec(const Vec<T>& a) {
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = chunk_round<M>(a.c[k]);
    return r;
}
}  // namespace detail

namespace detail {
template <typename T> using if_float = typename std::enable_if<std::is_floating_point<T>::value, Vec<T>>::type;
template <typename T> using if_int = typename std::enable_if<std::is_integral<T>::value, Vec<T>>::type;
template <typename T>
using if_float_mask = typename std::enable_if<std::is_floating_point<T>::value, VecMask<sizeof(T)>>::type;
template <typename T> TP_INLINE Vec<T> splat(T v) { return Vec<T>(v); }
}  // namespace detail

// =============================================================================================
// basic elementwise functions (all dtypes)
// =============================================================================================
template <typename T>
TP_INLINE typename Vec<T>::mask_type isnan(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) return a != a;
    else return typename Vec<T>::mask_type(false);
}
template <typename T>
TP_INLINE typename Vec<T>::mask_type isinf(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) {
        const T inf = std::numeric_limits<T>::infinity();
        return (a == Vec<T>(inf)) | (a == Vec<T>(-inf));
    } else {
        return typename Vec<T>::mask_type(false);
    }
}
template <typename T>
TP_INLINE typename Vec<T>::mask_type isfinite(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) {
        return (a - a) == Vec<T>(T(0));   // false for inf and NaN
    } else {
        return typename Vec<T>::mask_type(true);
    }
}
template <typename T>
TP_INLINE typename Vec<T>::mask_type signbit(const Vec<T>& a) {
    using I = typename detail::int_of<sizeof(T)>::type;
    if constexpr (std::is_floating_point<T>::value) return bitcast<I>(a) < Vec<I>(I(0));
    else return a < Vec<T>(T(0));
}

// torch.maximum / torch.minimum: NaN if either is NaN; otherwise (a > b ? a : b) -- for equal
// values (also +0 vs -0) the second argument is returned, like ATen's vectorised path.
// Floats: (a > b ? a : b) is exactly x86's maxps(a, b) -- b when either is NaN -- so only a NaN
// in a needs a fix-up: max, compare, blend (in a reduction acc = maximum(acc, x) the compare of acc
// is off the dependency chain).
namespace detail {
template <bool Max, typename T>
TP_INLINE Vec<T> select_gt(const Vec<T>& a, const Vec<T>& b) {   // Max ? (a > b ? a : b) : (a < b ? a : b)
    Vec<T> r;
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
    if constexpr (std::is_floating_point<T>::value) {
        using C = typename Vec<T>::chunk_type;
        constexpr bool f = std::is_same<T, float>::value;
        for (int k = 0; k < Vec<T>::nchunks; ++k) {
            const C x = a.c[k], y = b.c[k];
#if defined(__AVX512F__)
            if constexpr (sizeof(C) == 64) {
                if constexpr (f) r.c[k] = (C)(Max ? _mm512_max_ps((__m512)x, (__m512)y) : _mm512_min_ps((__m512)x, (__m512)y));
                else r.c[k] = (C)(Max ? _mm512_max_pd((__m512d)x, (__m512d)y) : _mm512_min_pd((__m512d)x, (__m512d)y));
                continue;
            }
#endif
#if defined(__AVX__)
            if constexpr (sizeof(C) == 32) {
                if constexpr (f) r.c[k] = (C)(Max ? _mm256_max_ps((__m256)x, (__m256)y) : _mm256_min_ps((__m256)x, (__m256)y));
                else r.c[k] = (C)(Max ? _mm256_max_pd((__m256d)x, (__m256d)y) : _mm256_min_pd((__m256d)x, (__m256d)y));
                continue;
            }
#endif
            if constexpr (sizeof(C) == 16) {
                if constexpr (f) r.c[k] = (C)(Max ? _mm_max_ps((__m128)x, (__m128)y) : _mm_min_ps((__m128)x, (__m128)y));
                else r.c[k] = (C)(Max ? _mm_max_pd((__m128d)x, (__m128d)y) : _mm_min_pd((__m128d)x, (__m128d)y));
                continue;
            }
            r.c[k] = Max ? (x > y ? x : y) : (x < y ? x : y);
        }
        return r;
    }
#endif
    return Max ? where(a > b, a, b) : where(a < b, a, b);
}
}  // namespace detail
template <typename T>
TP_INLINE Vec<T> maximum(const Vec<T>& a, const Vec<T>& b) {
    Vec<T> r = detail::select_gt<true>(a, b);
    if constexpr (std::is_floating_point<T>::value) r = where(a != a, a, r);
    return r;
}
template <typename T>
TP_INLINE Vec<T> minimum(const Vec<T>& a, const Vec<T>& b) {
    Vec<T> r = detail::select_gt<false>(a, b);
    if constexpr (std::is_floating_point<T>::value) r = where(a != a, a, r);
    return r;
}
// torch.clamp(x, lo, hi): NaN in x propagates
template <typename T>
TP_INLINE Vec<T> clamp(const Vec<T>& x, const Vec<T>& lo, const Vec<T>& hi) {
    return minimum(maximum(x, lo), hi);
}

template <typename T>
TP_INLINE Vec<T> neg(const Vec<T>& a) { return -a; }

template <typename T>
TP_INLINE Vec<T> abs(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) {   // clear the sign bit (NaN, -0 right)
        using I = typename detail::int_of<sizeof(T)>::type;
        return bitcast<T>(bitcast<I>(a) & Vec<I>(std::numeric_limits<I>::max()));
    } else if constexpr (std::is_unsigned<T>::value) {
        return a;
    } else {
        return where(a < Vec<T>(T(0)), -a, a);
    }
}

// torch.sign: 1, -1 or 0; sign(+-0) = +0 and sign(NaN) = 0, exactly like torch on CPU.
template <typename T>
TP_INLINE Vec<T> sign(const Vec<T>& a) {
    const Vec<T> zero(T(0));
    return cast<T>(a > zero) - cast<T>(a < zero);
}

template <typename T>
TP_INLINE Vec<T> copysign(const Vec<T>& mag, const Vec<T>& sgn) {
    static_assert(std::is_floating_point<T>::value, "copysign is for floating Vec");
    using I = typename detail::int_of<sizeof(T)>::type;
    const Vec<I> smask(std::numeric_limits<I>::min());
    return bitcast<T>((bitcast<I>(mag) & ~smask) | (bitcast<I>(sgn) & smask));
}

// rounding: exact hardware operations; integers are returned unchanged
template <typename T>
TP_INLINE Vec<T> floor(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) return detail::round_vec<detail::rnd::floor>(a);
    else return a;
}
template <typename T>
TP_INLINE Vec<T> ceil(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) return detail::round_vec<detail::rnd::ceil>(a);
    else return a;
}
template <typename T>
TP_INLINE Vec<T> trunc(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) return detail::round_vec<detail::rnd::trunc>(a);
    else return a;
}
// torch.round: half to even
template <typename T>
TP_INLINE Vec<T> round(const Vec<T>& a) {
    if constexpr (std::is_floating_point<T>::value) return detail::round_vec<detail::rnd::nearest>(a);
    else return a;
}

// correctly rounded square root (vsqrtps/vsqrtpd), reciprocal, 1/sqrt
template <typename T>
TP_INLINE detail::if_float<T> sqrt(const Vec<T>& a) {
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = detail::chunk_sqrt(a.c[k]);
    return r;
}
template <typename T>
TP_INLINE detail::if_float<T> rsqrt(const Vec<T>& a) { return Vec<T>(T(1)) / sqrt(a); }
template <typename T>
TP_INLINE detail::if_float<T> reciprocal(const Vec<T>& a) { return Vec<T>(T(1)) / a; }

// fused multiply-add a*b+c with one rounding (explicit: the code generator must not use it
// for a*b+c unless the op asks for it, see invariant 3)
template <typename T>
TP_INLINE detail::if_float<T> fma(const Vec<T>& a, const Vec<T>& b, const Vec<T>& c) {
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k)
        r.c[k] = detail::chunk_fma(a.c[k], b.c[k], c.c[k]);
    return r;
}

// =============================================================================================
// horizontal reductions: a fixed pairwise tree (lane i with lane i + size/2, halving), so the
// result does not depend on anything but the lanes.  reduce_max/min propagate NaN.
// =============================================================================================
namespace detail {
template <typename T>
TP_INLINE T smax(T a, T b) {
    if constexpr (std::is_floating_point<T>::value)
        if (a != a || b != b) return a + b;
    return a > b ? a : b;
}
template <typename T>
TP_INLINE T smin(T a, T b) {
    if constexpr (std::is_floating_point<T>::value)
        if (a != a || b != b) return a + b;
    return a < b ? a : b;
}
template <typename T>
TP_INLINE T swrap_mul(T a, T b) {
    if constexpr (std::is_integral<T>::value) return T(detail::uint_t<T>(a) * detail::uint_t<T>(b));
    else return a * b;
}
template <typename T>
TP_INLINE T swrap_add(T a, T b) {
    if constexpr (std::is_integral<T>::value) return T(detail::uint_t<T>(a) + detail::uint_t<T>(b));
    else return a + b;
}
template <typename T, typename Op>
TP_INLINE T reduce_tree(const Vec<T>& v, Op op) {
    T t[kLanes];
    v.store(t);
    for (int s = kLanes / 2; s > 0; s /= 2)
        for (int i = 0; i < s; ++i) t[i] = op(t[i], t[i + s]);
    return t[0];
}
}  // namespace detail

template <typename T> TP_INLINE T reduce_add(const Vec<T>& v) { return detail::reduce_tree(v, detail::swrap_add<T>); }
template <typename T> TP_INLINE T reduce_mul(const Vec<T>& v) { return detail::reduce_tree(v, detail::swrap_mul<T>); }
template <typename T> TP_INLINE T reduce_max(const Vec<T>& v) { return detail::reduce_tree(v, detail::smax<T>); }
template <typename T> TP_INLINE T reduce_min(const Vec<T>& v) { return detail::reduce_tree(v, detail::smin<T>); }

// =============================================================================================
// reduction accumulators of the Stax code generator (argmax/argmin, Welford).  Section owned by
// the reductions work; the generated kernel keeps UNROLL accumulators per reduction, updates
// each lane with one element per iteration and combines accumulators, then lanes, at the end.
// =============================================================================================
// ArgAcc<T>: per lane, the best value seen and its flat index in the reduced row.  The order on
// (value, index) pairs is total: a pair beats another if its value is more extreme (NaN is the
// most extreme: torch's max/argmax propagate NaN), or the values are equal (both NaN included)
// and its index is smaller.  Any combination order therefore gives torch's answer: the first
// index of the extreme value, the first NaN if there is one.  Lanes that never saw an element
// hold (identity, INT64_MAX) and lose every tie against a real element.
template <typename T>
struct ArgAcc {
    Vec<T> val;
    Vec<int64_t> idx;
};
namespace detail {
template <bool IsMax, typename T>
TP_INLINE Mask arg_beats(const Vec<T>& v, const Vec<int64_t>& i, const Vec<T>& bv, const Vec<int64_t>& bi) {
    const Mask earlier = Mask(i < bi);
    const Mask better = IsMax ? Mask(v > bv) : Mask(v < bv);
    Mask m = better | (Mask(v == bv) & earlier);
    if constexpr (std::is_floating_point<T>::value) {
        const Mask vn = Mask(v != v), bn = Mask(bv != bv);
        m = (m & ~bn) | (vn & ~bn) | (vn & bn & earlier);
    }
    return m;
}
}  // namespace detail
template <bool IsMax, typename T>
TP_INLINE ArgAcc<T> arg_identity() {
    const T id = std::is_floating_point<T>::value
                     ? (IsMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity())
                     : (IsMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
    return ArgAcc<T>{Vec<T>(id), Vec<int64_t>(std::numeric_limits<int64_t>::max())};
}
// fold element (v, i) into acc, in the lanes where `m` is set (the tail mask; all lanes otherwise)
template <bool IsMax, typename T>
TP_INLINE void arg_update(ArgAcc<T>& acc, const Vec<T>& v, const Vec<int64_t>& i, Mask m = Mask(true)) {
    const Mask take = m & detail::arg_beats<IsMax>(v, i, acc.val, acc.idx);
    acc.val = where(take, v, acc.val);
    acc.idx = where(take, i, acc.idx);
}
template <bool IsMax, typename T>
TP_INLINE ArgAcc<T> arg_combine(ArgAcc<T> a, const ArgAcc<T>& b) {
    arg_update<IsMax>(a, b.val, b.idx);
    return a;
}
// the winning (value, index) over the lanes
template <bool IsMax, typename T>
TP_INLINE void arg_reduce(const ArgAcc<T>& a, T& val, int64_t& idx) {
    val = a.val[0];
    idx = a.idx[0];
    for (int k = 1; k < kLanes; ++k) {
        const T v = a.val[k];
        const int64_t i = a.idx[k];
        bool beats = IsMax ? (v > val) : (v < val);
        beats = beats || (v == val && i < idx);
        if constexpr (std::is_floating_point<T>::value) {
            const bool vn = v != v, bn = val != val;
            beats = (beats && !bn) || (vn && !bn) || (vn && bn && i < idx);
        }
        if (beats) { val = v; idx = i; }
    }
}

// WelfordAcc<T>: per lane, the count n, mean and m2 = sum (x - mean)^2 of the elements seen
// (Welford's update: n += 1; d = x - mean; mean += d / n; m2 += d * (x - mean)).  Accumulators and
// lanes are merged with Chan et al.'s pairwise formula:
//     n = na + nb;  d = mb - ma;  mean = ma + d * (nb / n);  m2 = m2a + m2b + d^2 * na * (nb / n).
// Error bound (Chan, Golub & LeVeque 1983, for the updating algorithm; u = unit roundoff):
//     |m2_computed - m2| <= c * (n' + log2(lanes)) * kappa * u * m2,   kappa = sqrt(1 + mean^2 / var)
// with n' = n / (UNROLL * lanes) the elements each lane folds in (the lanes and accumulators are
// merged pairwise).  It grows with kappa, not kappa^2 like the naive sum(x^2) - n mean^2, which
// loses every digit once mean^2 / var > 1/u (e.g. 1e4 + randn in float32).  docs/stax.md, Numerics.
// While every lane has seen the same number of elements (no masked update yet: the common case
// of one inner loop, whose tail comes last), the count is one scalar and the update multiplies
// by its reciprocal instead of dividing every lane (a vector division costs 2-4x a multiply).
template <typename T>
struct WelfordAcc {
    Vec<T> mean, m2, n;     // all zero; n (per-lane counts) is used once the lanes differ
    T count = T(0);         // the count of every lane while `uniform`
    bool uniform = true;
    TP_INLINE Vec<T> counts() const { return uniform ? Vec<T>(count) : n; }
};
template <typename T>
TP_INLINE void welford_update(WelfordAcc<T>& a, const Vec<T>& x) {
    const Vec<T> d = x - a.mean;
    if (a.uniform) {
        a.count += T(1);
        a.mean = a.mean + d * Vec<T>(T(1) / a.count);
    } else {
        a.n = a.n + Vec<T>(T(1));
        a.mean = a.mean + d / a.n;
    }
    a.m2 = a.m2 + d * (x - a.mean);
}
// update only the lanes where m is set (masked tail)
template <typename T>
TP_INLINE void welford_update(WelfordAcc<T>& a, const Vec<T>& x, Mask m) {
    if (a.uniform) {
        a.n = Vec<T>(a.count);
        a.uniform = false;
    }
    const Vec<T> zero(T(0)), one(T(1));
    a.n = a.n + where(m, one, zero);
    const Vec<T> d = where(m, x - a.mean, zero);
    a.mean = a.mean + d / where(m, a.n, one);
    a.m2 = a.m2 + where(m, d * (x - a.mean), zero);
}
template <typename T>
TP_INLINE WelfordAcc<T> welford_combine(const WelfordAcc<T>& a, const WelfordAcc<T>& b) {
    const Vec<T> zero(T(0));
    const Vec<T> na = a.counts(), nb = b.counts();
    WelfordAcc<T> r;
    r.uniform = false;
    r.n = na + nb;
    const Vec<T> wb = where(r.n == zero, zero, nb / r.n);   // empty + empty stays empty
    const Vec<T> d = b.mean - a.mean;
    r.mean = a.mean + d * wb;
    r.m2 = a.m2 + b.m2 + d * d * na * wb;
    // a lane that holds nothing must not turn the other's state into NaN (0 * inf)
    r.mean = where(nb == zero, a.mean, where(na == zero, b.mean, r.mean));
    r.m2 = where(nb == zero, a.m2, where(na == zero, b.m2, r.m2));
    return r;
}
// merge the lanes pairwise (lane i with lane i + size/2, halving): (mean, m2, n) of the row
template <typename T>
TP_INLINE void welford_reduce(const WelfordAcc<T>& a, T& mean, T& m2, T& n) {
    T mu[kLanes], q[kLanes], c[kLanes];
    a.mean.store(mu);
    a.m2.store(q);
    a.counts().store(c);
    for (int s = kLanes / 2; s > 0; s /= 2)
        for (int i = 0; i < s; ++i) {
            const T na = c[i], nb = c[i + s], nn = na + nb;
            if (nb == T(0)) continue;
            if (na == T(0)) { mu[i] = mu[i + s]; q[i] = q[i + s]; c[i] = nb; continue; }
            const T w = nb / nn, d = mu[i + s] - mu[i];
            mu[i] = mu[i] + d * w;
            q[i] = q[i] + q[i + s] + d * d * na * w;
            c[i] = nn;
        }
    mean = mu[0];
    m2 = q[0];
    n = c[0];
}

// =============================================================================================
// division helpers with torch semantics
// =============================================================================================
namespace detail {
template <typename T>
inline T floordiv_int(T a, T b) {
    if (b == 0) return T(0);                                 // torch raises ZeroDivisionError
    if (std::is_signed<T>::value && b == T(-1)) return T(uint_t<T>(0) - uint_t<T>(a));
    T q = T(a / b), r = T(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) q = T(q - 1);
    return q;
}
template <typename T>
inline T remainder_int(T a, T b) {
    if (b == 0 || (std::is_signed<T>::value && b == T(-1))) return T(0);
    T r = T(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
    return r;
}
template <typename T>
inline T floordiv_float(T a, T b) {   // c10::div_floor_floating
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if ((mod != 0) && ((b < 0) != (mod < 0))) div -= T(1);
    T fd;
    if (div != 0) {
        fd = std::floor(div);
        if (div - fd > T(0.5)) fd += T(1);
    } else {
        fd = std::copysign(T(0), a / b);
    }
    return fd;
}
template <typename T>
inline T remainder_float(T a, T b) {   // ATen remainder: fmod, then shift into b's sign
    T mod = std::fmod(a, b);
    if ((mod != 0) && ((b < 0) != (mod < 0))) mod += b;
    return mod;
}
template <typename T>
inline T ipow(T a, T b) {             // torch.pow on integers (b < 0: 1/a truncated)
    if (b < 0) return a == 1 ? T(1) : (a == T(-1) ? ((b & 1) ? T(-1) : T(1)) : T(0));
    uint_t<T> r = 1, x = uint_t<T>(a);
    for (uint_t<T> e = uint_t<T>(b); e; e >>= 1) {
        if (e & 1) r *= x;
        x *= x;
    }
    return T(r);
}
}  // namespace detail

// floor division (torch.floor_divide / Python //)
template <typename T>
TP_INLINE Vec<T> floordiv(const Vec<T>& a, const Vec<T>& b) {
    if constexpr (std::is_integral<T>::value) return map(a, b, [](T x, T y) { return detail::floordiv_int(x, y); });
    else return map(a, b, [](T x, T y) { return detail::floordiv_float(x, y); });
}
// remainder with the sign of the divisor (torch.remainder / Python %)
template <typename T>
TP_INLINE Vec<T> remainder(const Vec<T>& a, const Vec<T>& b) {
    if constexpr (std::is_integral<T>::value) return map(a, b, [](T x, T y) { return detail::remainder_int(x, y); });
    else return map(a, b, [](T x, T y) { return detail::remainder_float(x, y); });
}
// truncating division / C remainder (torch.div(rounding_mode='trunc'), torch.fmod)
template <typename T>
TP_INLINE Vec<T> truncdiv(const Vec<T>& a, const Vec<T>& b) {
    if constexpr (std::is_integral<T>::value) return a / b;
    else return trunc(a / b);
}
template <typename T>
TP_INLINE Vec<T> fmod(const Vec<T>& a, const Vec<T>& b) {
    if constexpr (std::is_integral<T>::value) return a % b;
    else return map(a, b, [](T x, T y) { return std::fmod(x, y); });
}
template <typename T>
TP_INLINE Vec<T> pow(const Vec<T>& a, const Vec<T>& b) {
    if constexpr (std::is_integral<T>::value) return map(a, b, [](T x, T y) { return detail::ipow(x, y); });
    else return map(a, b, [](T x, T y) { return std::pow(x, y); });
}

// =============================================================================================
// transcendental functions
// =============================================================================================
namespace detail {

template <typename T> struct fp;

template <> struct fp<float> {
    using I = int32_t;
    static constexpr int mant = 23;
    static constexpr I bias = 127;
    static constexpr float magic = 0x1.8p23f;                   // 1.5*2^23: round to integer
    static constexpr float log2e = 0x1.715476p+0f;
    static constexpr float ln2_hi = 0x1.62e4p-1f;                // 15 bits: k*ln2_hi exact
    static constexpr float ln2_lo = 0x1.7f7d1cp-20f;
    static constexpr float ln2 = 0x1.62e43p-1f;
    static constexpr float ln2_tail = -0x1.05c610p-29f;          // ln2 - (float)ln2
    static constexpr float exp_lo = -104.0f, exp_hi = 89.0f;     // beyond: 0 / inf
    static constexpr float exp2_lo = -152.0f, exp2_hi = 129.0f;
    static constexpr float expm1_lo = -20.0f;                    // expm1 = -1 below
    static constexpr I sqrt_half_bits = 0x3f3504f3;               // sqrt(2)/2
    static constexpr float min_normal = 0x1p-126f;
    static constexpr float subnormal_scale = 0x1p25f;
    static constexpr I subnormal_exp = 25;
    static constexpr float ivln2 = 0x1.715476p+0f, ivln2_lo = 0x1.4ae0cp-26f;
    static constexpr float ivln10 = 0x1.bcb7b2p-2f, ivln10_lo = -0x1.5b235ep-27f;
    static constexpr float log10_2hi = 0x1.344p-2f, log10_2lo = 0x1.3509f8p-18f;
    static constexpr float split = 4097.0f;                      // Veltkamp: 2^12 + 1
    static constexpr float tanh_cut = 0.625f, tanh_max = 10.0f;   // tanh(x) rounds to 1 beyond max
    static constexpr float erf_cut = 0.75f, erfc_cut = 0.6f, erfc_K = 2.5f, erfc_max = 10.1f;
    // expm1(r) = r + r^2*(1/2 + r*P(r)), |r| <= ln2/2 (+margin)
    static constexpr float expm1_p[] = {0x1.555556p-3f, 0x1.555518p-5f, 0x1.1110cap-7f, 0x1.6d13e6p-10f,
                                        0x1.a1550cp-13f};
    // log(1+f) = 2 atanh(s), s = f/(2+f): R(z) = z*P(z), z = s^2
    static constexpr float log_p[] = {0x1.555556p-1f, 0x1.9999eep-2f, 0x1.245afp-2f, 0x1.de14a6p-3f};
    // tanh(x) = x + x^3*P(x^2), |x| < tanh_cut
    static constexpr float tanh_p[] = {-0x1.555556p-2f, 0x1.1110eap-3f, -0x1.ba095p-5f, 0x1.64b11ap-6f,
                                       -0x1.1195dcp-7f, 0x1.2d334cp-9f};
    // erf(x) = x + x*P(x^2), |x| < erf_cut
    static constexpr float erf_p[] = {0x1.06eba8p-3f, -0x1.81273ep-2f, 0x1.ce2d1ep-4f, -0x1.b7fb86p-6f,
                                      0x1.54186cp-8f, -0x1.a479ep-11f, 0x1.4ac1b2p-14f};
    // erfc(x) exp(x^2) (1+2x) = P(t), t = (x-K)/(x+K), erfc_cut <= x <= erfc_max; the constant
    // term is P[0] + erfc_c0_lo (double-word)
    static constexpr float erfc_c0_lo = -0x1.316c2cp-25f;
    static constexpr float erfc_p[] = {0x1.43cc7p+0f, -0x1.f52c6p-4f, -0x1.959a96p-4f, 0x1.42d3acp-3f,
                                       -0x1.a5c476p-4f, 0x1.0c555ep-5f, 0x1.f63c0cp-11f, -0x1.1cfd38p-8f,
                                       0x1.b02c28p-12f, 0x1.185c84p-11f};
    // erf by table (float only): entry i >= 1 of each row serves |x| in [i/2, i/2 + 1/2) (the last
    // up to the clamp 3.95; erf rounds to 1 from 3.9192) as erf = P_i(|x| - c_i), with c_i picked so
    // that erf(c_i) = P_i(0) is a float to < 0.01 ulp; entry 0 serves |x| < 1/2 as x + x P_0(x^2).
    // Row k holds the degree-(7-k) coefficients.  Weighted least-squares fits rounded to float one
    // coefficient at a time (mpmath; tools/fit_erf.py), at most 0.035 ulp from erf before rounding.
    // tanh by table (float only; tools/fit_tanh.py): the scheme of erf_tab with sixteen entries,
    // i = trunc(2 min(|x|, 7.75)); the last entry serves [7.5, 9.02] (tanh rounds to 1 from 9.0109)
    static constexpr float tanh_tab_c[16] = {0.0f, 0x1.4cce1ep-1f, 0x1.40015ep+0f, 0x1.bfff9p+0f, 0x1.1ffe24p+1f, 0x1.60023p+1f, 0x1.9ffd2cp+1f, 0x1.e0081cp+1f, 0x1.100976p+2f, 0x1.2ffe1ep+2f, 0x1.4fd34cp+2f, 0x1.6f56cap+2f, 0x1.9044c4p+2f, 0x1.ab77e6p+2f, 0x1.d1cb7ep+2f, 0x1.0a2b24p+3f};
    static constexpr float tanh_tab_p[8][16] = {
        {0.0f, 0x1.632f5ep-6f, -0x1.3d8462p-8f, -0x1.0452aap-9f, -0x1.0f6ccp-14f, 0x1.eb2d1ap-14f, 0x1.e13d2cp-15f, 0x1.8fd28cp-16f, 0x1.59dae4p-17f, 0x1.0c469ep-18f, 0x1.71eb34p-20f, 0x1.1d642ep-21f, 0x1.9951c6p-23f, 0x1.daae62p-25f, 0x1.41f396p-25f, 0x1.fba22ap-29f},
        {0x1.74d0c4p-9f, -0x1.1c0938p-6f, 0x1.ee51cp-7f, 0x1.0fd2fep-9f, -0x1.795c32p-11f, -0x1.1e8e2cp-11f, -0x1.00cfecp-12f, -0x1.9064b8p-14f, -0x1.24c378p-15f, -0x1.b4c2ap-17f, -0x1.4ed196p-18f, -0x1.f83892p-20f, -0x1.65aa8ap-21f, -0x1.269d7cp-22f, -0x1.5fa31ep-24f, -0x1.84ef6p-27f},
        {-0x1.1ef726p-7f, -0x1.dcd524p-5f, -0x1.39e0acp-6f, 0x1.e4e856p-9f, 0x1.0518bep-8f, 0x1.f28884p-10f, 0x1.90bebcp-11f, 0x1.2ffcfcp-12f, 0x1.c396fep-14f, 0x1.4df398p-15f, 0x1.ef2a78p-17f, 0x1.72116p-18f, 0x1.087698p-19f, 0x1.c4f6e6p-21f, 0x1.0fed62p-22f, 0x1.0d4948p-25f},
        {0x1.668326p-6f, 0x1.0bbe8ep-3f, -0x1.9c6c56p-7f, -0x1.8164d6p-6f, -0x1.93d51ap-7f, -0x1.4e2f0cp-8f, -0x1.007d5ap-9f, -0x1.7f0648p-11f, -0x1.1b517ap-12f, -0x1.a252d8p-14f, -0x1.357f06p-15f, -0x1.ce7d96p-17f, -0x1.4a9bc6p-18f, -0x1.1aba54p-19f, -0x1.5579bp-21f, -0x1.547124p-24f},
        {-0x1.ba2544p-5f, -0x1.1f9568p-8f, 0x1.bba18ap-4f, 0x1.01ba9p-4f, 0x1.bbd93ep-6f, 0x1.598c6cp-7f, 0x1.03a4d8p-8f, 0x1.80bc04p-10f, 0x1.1badfep-11f, 0x1.a272fp-13f, 0x1.359b26p-14f, 0x1.cea1c8p-16f, 0x1.4aa892p-17f, 0x1.1aa986p-18f, 0x1.5556b8p-20f, 0x1.55865p-23f},
        {0x1.111146p-3f, -0x1.8a1494p-2f, -0x1.e7258ep-3f, -0x1.b6d9a6p-4f, -0x1.5c473ap-5f, -0x1.077534p-6f, -0x1.87d2aep-8f, -0x1.213122p-9f, -0x1.a9dd1ep-11f, -0x1.39edb2p-12f, -0x1.d0764p-14f, -0x1.5afd6ap-15f, -0x1.effeb6p-17f, -0x1.a7ff4cp-18f, -0x1.ffff5cp-20f, -0x1.0004acp-22f},
        {-0x1.555556p-2f, 0x1.58abccp-1f, 0x1.1f227ap-2f, 0x1.d22e22p-4f, 0x1.641aa8p-5f, 0x1.099ea4p-6f, 0x1.8900b8p-8f, 0x1.218308p-9f, 0x1.aa09d4p-11f, 0x1.39f9fap-12f, 0x1.d07cb6p-14f, 0x1.5aff16p-15f, 0x1.efff88p-17f, 0x1.a7ffd4p-18f, 0x1.ffffecp-20f, 0x1.fffd8ap-23f},
        {-0x1.6c1a08p-36f, 0x1.24b2dp-1f, 0x1.b253p-1f, 0x1.e1fbep-1f, 0x1.f4bf84p-1f, 0x1.fbd52ep-1f, 0x1.fe7668p-1f, 0x1.ff6f2ap-1f, 0x1.ffcabcp-1f, 0x1.ffec6p-1f, 0x1.fff8bep-1f, 0x1.fffd4ap-1f, 0x1.ffff08p-1f, 0x1.ffff96p-1f, 0x1.ffffep-1f, 0x1.fffffcp-1f},
    };
    static constexpr float erf_tab_c[8] = {0.0f, 0x1.7ffd96p-1f, 0x1.4001f8p+0f, 0x1.c0029cp+0f, 0x1.1ffc88p+1f, 0x1.6003dap+1f, 0x1.a2441ep+1f, 0x1.d8788p+1f};
    static constexpr float erf_tab_p[8][8] = {
        {0.0f, 0x1.31aa9ep-6f, 0x1.ddaa1cp-9f, -0x1.85f0e8p-8f, -0x1.7b72ap-11f, 0x1.4e16d4p-11f, 0x1.6dd2ep-13f, 0x1.4719eap-16f},
        {-0x1.1160dcp-10f, -0x1.b3b61ep-6f, 0x1.529e02p-6f, 0x1.2840a8p-7f, -0x1.6dc806p-9f, -0x1.b4c784p-10f, -0x1.077142p-12f, -0x1.d799a4p-16f},
        {0x1.2ad42ap-14f, -0x1.b4a324p-5f, -0x1.826e1ep-5f, 0x1.b201b2p-8f, 0x1.5d607p-7f, 0x1.691958p-9f, 0x1.2b92bcp-12f, 0x1.bfc838p-16f},
        {0x1.43a0b2p-8f, 0x1.34983ep-3f, -0x1.92bb6ep-8f, -0x1.8a1096p-5f, -0x1.38d156p-6f, -0x1.aacbb8p-9f, -0x1.105c3ap-12f, -0x1.557454p-16f},
        {-0x1.b77a16p-6f, 0x1.b6c408p-6f, 0x1.571c7ap-3f, 0x1.7140c8p-4f, 0x1.64111p-6f, 0x1.699bc4p-9f, 0x1.7224e2p-13f, 0x1.90c774p-17f},
        {0x1.ce2bdcp-4f, -0x1.edc5bep-2f, -0x1.2ebb56p-2f, -0x1.7a3f38p-4f, -0x1.07682ap-6f, -0x1.a663f8p-10f, -0x1.647812p-14f, -0x1.523fe4p-18f},
        {-0x1.81274p-2f, 0x1.493096p-1f, 0x1.e45bep-3f, 0x1.b045c4p-5f, 0x1.d44d54p-8f, 0x1.332df2p-11f, 0x1.b456fp-16f, 0x1.6e8bcap-20f},
        {0x1.06eba8p-3f, 0x1.6c1b0ap-1f, 0x1.d8874cp-1f, 0x1.f92d4ep-1f, 0x1.ff402ep-1f, 0x1.fff2d2p-1f, 0x1.ffff8p-1f, 0x1.fffffap-1f},
    };
};

template <> struct fp<double> {
    using I = int64_t;
    static constexpr int mant = 52;
    static constexpr I bias = 1023;
    static constexpr double magic = 0x1.8p52;
    static constexpr double log2e = 0x1.71547652b82fep+0;
    static constexpr double ln2_hi = 0x1.62e42feep-1;             // 32 bits: k*ln2_hi exact
    static constexpr double ln2_lo = 0x1.a39ef35793c76p-33;
    static constexpr double ln2 = 0x1.62e42fefa39efp-1;
    static constexpr double ln2_tail = 0x1.abc9e3b39803fp-56;     // ln2 - (double)ln2
    static constexpr double exp_lo = -746.0, exp_hi = 710.0;
    static constexpr double exp2_lo = -1077.0, exp2_hi = 1025.0;
    static constexpr double expm1_lo = -40.0;
    static constexpr I sqrt_half_bits = 0x3fe6a09e667f3bcdLL;
    static constexpr double min_normal = 0x1p-1022;
    static constexpr double subnormal_scale = 0x1p54;
    static constexpr I subnormal_exp = 54;
    static constexpr double ivln2 = 0x1.71547652b82fep+0, ivln2_lo = 0x1.777d0ffda0d24p-56;
    static constexpr double ivln10 = 0x1.bcb7b1526e50ep-2, ivln10_lo = 0x1.95355baaafad3p-57;
    static constexpr double log10_2hi = 0x1.34413508p-2, log10_2lo = 0x1.f79fef311f12bp-34;
    static constexpr double split = 134217729.0;                 // Veltkamp: 2^27 + 1
    static constexpr double tanh_cut = 0.625, tanh_max = 20.0;
    static constexpr double erf_cut = 0.75, erfc_cut = 0.6, erfc_K = 3.0, erfc_max = 27.3;
    static constexpr double expm1_p[] = {0x1.5555555555556p-3,  0x1.5555555555556p-5,  0x1.111111111095cp-7,
                                         0x1.6c16c16c15d1dp-10, 0x1.a01a01a807f55p-13, 0x1.a01a01a986d1ap-16,
                                         0x1.71de0ca86589ap-19, 0x1.27e4d3f141a93p-22, 0x1.af3b1528c6c24p-26,
                                         0x1.1f80d08582119p-29};
    static constexpr double log_p[] = {0x1.5555555555555p-1, 0x1.9999999999a45p-2, 0x1.2492492474d78p-2,
                                       0x1.c71c7204c1437p-3, 0x1.745cf79e1a711p-3, 0x1.3b1c8077abf7ap-3,
                                       0x1.0fb6d33f10da3p-3, 0x1.0c53d6e2d11edp-3};
    static constexpr double tanh_p[] = {-0x1.5555555555555p-2, 0x1.11111111110adp-3,  -0x1.ba1ba1ba0f92bp-5,
                                        0x1.664f487e31ad0p-6,  -0x1.226e347a025e5p-7, 0x1.d6d39c033a86cp-9,
                                        -0x1.7d9f7f87bfe56p-10, 0x1.3527836afae39p-11, -0x1.f24ab87bdc5bcp-13,
                                        0x1.846073a7c64f8p-14, -0x1.05f4a3a07e56fp-15, 0x1.b4050c4015db1p-18};
    static constexpr double erf_p[] = {0x1.06eba8214db69p-3,  -0x1.812746b0379e6p-2, 0x1.ce2f21a042b32p-4,
                                       -0x1.b82ce31284ea3p-6, 0x1.565bcd0dbc12cp-8,  -0x1.c02db3db011d6p-11,
                                       0x1.f9a321dc17d5fp-14, -0x1.f4d1e387e7d41p-17, 0x1.b9df275d3f48bp-20,
                                       -0x1.5f1ef1f7f490ap-23, 0x1.f7b62f79d360ep-27, -0x1.38a135d989b37p-30,
                                       0x1.0608f58748ee0p-34};
    static constexpr double erfc_c0_lo = 0x1.87ee27ee44ea1p-55;
    static constexpr double erfc_p[] = {
        0x1.40c522d7e4987p+0,  -0x1.15c084bb9e8f7p-3,  -0x1.85a15c58aa564p-5, 0x1.098366a5b490fp-3,
        -0x1.e88b803a4a208p-4, 0x1.17ca2877e51e3p-4,   -0x1.8574c40b62372p-6, 0x1.4b884e605da02p-9,
        0x1.ef1bdcdfa5328p-10, -0x1.98db55aaa48d2p-11, -0x1.b91238e782fc9p-14, 0x1.065aa9bf52ebcp-13,
        0x1.4c0f2c4fae780p-18, -0x1.514944cec6064p-16, -0x1.85c78ba41a23ep-21, 0x1.d318cd28d3932p-19,
        0x1.706ee1cfd51bfp-22, -0x1.50ec76f76818ep-21, -0x1.020bda2195ebep-23, 0x1.d77201732419dp-24,
        0x1.7fbe7b6fcc0f6p-26, -0x1.f7fb7677f5a34p-27};
};

template <typename T> using ivec = Vec<typename fp<T>::I>;

// shifts by a constant count in range (no torch out-of-range handling needed)
template <int S, typename I>
TP_INLINE Vec<I> shl_c(const Vec<I>& a) {
    using U = typename chunk<uint_t<I>>::type;
    Vec<I> r;
    for (int k = 0; k < Vec<I>::nchunks; ++k) r.c[k] = (typename Vec<I>::chunk_type)((U)a.c[k] << S);
    return r;
}
template <int S, typename I>
TP_INLINE Vec<I> sra_c(const Vec<I>& a) {
    Vec<I> r;
    for (int k = 0; k < Vec<I>::nchunks; ++k) r.c[k] = a.c[k] >> S;
    return r;
}

// a*b + c: fused where the hardware has FMA (more accurate), else two roundings
template <typename T>
TP_INLINE Vec<T> mla(const Vec<T>& a, const Vec<T>& b, const Vec<T>& c) {
#if TP_HAS_FMA
    return tp::fma(a, b, c);
#else
    return a * b + c;
#endif
}
// a*b rounded, in a form the compiler cannot contract into a following addition
// (-ffp-contract=fast would otherwise fuse it differently in scalar and vector code).
// fma(a, b, -0) == a*b bit for bit, including signed zeros, inf and NaN.
template <typename T>
TP_INLINE Vec<T> mul_nc(const Vec<T>& a, const Vec<T>& b) {
#if TP_HAS_FMA
    return tp::fma(a, b, Vec<T>(T(-0.0)));
#else
    return a * b;
#endif
}
// exact product: hi + lo == a*b (FMA, or Dekker/Veltkamp splitting without FMA)
template <typename T>
TP_INLINE void two_prod(const Vec<T>& a, const Vec<T>& b, Vec<T>& hi, Vec<T>& lo) {
    hi = mul_nc(a, b);
#if TP_HAS_FMA
    lo = tp::fma(a, b, -hi);
#else
    const Vec<T> s(fp<T>::split);
    Vec<T> ta = s * a, tb = s * b;
    Vec<T> ah = ta - (ta - a), al = a - ah;
    Vec<T> bh = tb - (tb - b), bl = b - bh;
    lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl;
#endif
}
template <typename T, size_t N>
TP_INLINE Vec<T> horner(const Vec<T>& x, const T (&c)[N]) {
    Vec<T> p(c[N - 1]);
    for (int i = int(N) - 2; i >= 0; --i) p = mla(p, x, Vec<T>(c[i]));
    return p;
}
// tab[idx & (N2 - 1)] per lane, N2 = N rounded up to a power of two (entries past N read 0): a
// small constant table indexed by a lane value.  When a native register holds the whole table this
// is one permute per chunk (vpermps on AVX-512 and AVX2), two registers' worth two permutes and a
// blend; narrower registers go lane by lane.
template <typename T, size_t N>
TP_INLINE Vec<T> lookup(const T (&tab)[N], const ivec<T>& idx) {
    constexpr int N2 = N <= 1 ? 1 : 1 << (32 - __builtin_clz(unsigned(N - 1)));
    using C = typename Vec<T>::chunk_type;
    Vec<T> r;
    constexpr int L = Vec<T>::chunk_lanes;
#if defined(__GNUC__) && !defined(__clang__)   // __builtin_shuffle with a variable mask: GCC only
    if constexpr (L >= N2 && L > 1 && L == ivec<T>::chunk_lanes) {
        C t{};
        for (size_t k = 0; k < N; ++k) t[k] = tab[k];
        for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = __builtin_shuffle(t, idx.c[k] & (N2 - 1));
    } else if constexpr (2 * L == N2 && L > 1 && L == ivec<T>::chunk_lanes) {   // two registers (AVX2, 16 entries)
        C t0{}, t1{};
        for (size_t k = 0; k < N; ++k) (k < size_t(L) ? t0[k] : t1[k - L]) = tab[k];
        for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = __builtin_shuffle(t0, t1, idx.c[k] & (N2 - 1));
    } else
#endif
    {
        for (int i = 0; i < Vec<T>::size; ++i) {
            const int j = int(idx[i]) & (N2 - 1);
            r.set(i, j < int(N) ? tab[j] : T(0));
        }
    }
    return r;
}
// x clamped to [lo, hi]; NaN stays NaN: (lo > x ? lo : x) is maxps(lo, x), which returns x when
// x is NaN -- one instruction per bound (a compare and a blend as written with where())
template <typename T>
TP_INLINE Vec<T> clamp_keep_nan(const Vec<T>& x, T lo, T hi) {
    return select_gt<false>(Vec<T>(hi), select_gt<true>(Vec<T>(lo), x));
}
// An odd function rising to 1 (float erf, tanh) from a table of polynomials (fp<float>::erf_tab,
// tools/fit_erf.py): i = trunc(2 min(|x|, idx_hi)), |x| clamped to [0, hi] (2|x| is exact; NaN gives
// INT_MIN, masked to entry 0); entry 0 is x + x P_0(x^2), entry i >= 1 is P_i(|x| - c_i) with
// the sign of x.  The result for x = -0 is left to the caller.
template <typename T, size_t N, size_t D>
TP_INLINE Vec<T> odd_by_table(const Vec<T>& x, const T (&tab_c)[N], const T (&tab_p)[D][N], T hi, T idx_hi) {
    Vec<T> a = abs(x);
    Vec<T> b = clamp_keep_nan(a, T(0), hi);
    ivec<T> i = cast<typename fp<T>::I>(clamp_keep_nan(a, T(0), idx_hi) * Vec<T>(T(2)));
    auto small = i == ivec<T>(0);
    Vec<T> u = where(small, x * x, b - lookup(tab_c, i));
    Vec<T> q = lookup(tab_p[0], i);
    for (size_t k = 1; k < D; ++k) q = mla(q, u, lookup(tab_p[k], i));
    return where(small, mla(x, q, x), copysign(q, x));
}
template <typename T>
TP_INLINE Vec<T> quiet_nan() { return Vec<T>(std::numeric_limits<T>::quiet_NaN()); }
template <typename T>
TP_INLINE Vec<T> infinity() { return Vec<T>(std::numeric_limits<T>::infinity()); }

// 2^n for integer lanes n in the normal exponent range
template <typename T>
TP_INLINE Vec<T> pow2i(const ivec<T>& n) {
    return bitcast<T>(shl_c<fp<T>::mant>(n + ivec<T>(fp<T>::bias)));
}
// p * 2^n in two exact-then-rounding steps: right for n down to 2*(min exponent) (subnormal
// results are rounded once, correctly) and up to overflow
template <typename T>
TP_INLINE Vec<T> ldexp_twostep(const Vec<T>& p, const ivec<T>& n) {
    ivec<T> n1 = sra_c<1>(n);
    ivec<T> n2 = n - n1;
    return (p * pow2i<T>(n1)) * pow2i<T>(n2);
}
// p * 2^n rounded once, correct down to 2*(min exponent) and up to overflow, with n as integer
// lanes and as the same integers in floating lanes nf: AVX-512 has it as one instruction
// (vscalefps/pd: p * 2^floor(nf), correctly rounded), elsewhere ldexp_twostep
template <typename T>
TP_INLINE Vec<T> ldexp_split(const Vec<T>& p, const Vec<T>& nf, const ivec<T>& n) {
#if defined(__AVX512F__)
    using C = typename Vec<T>::chunk_type;
    if constexpr (sizeof(C) == 64) {
        Vec<T> r;
        for (int k = 0; k < Vec<T>::nchunks; ++k) {
            if constexpr (std::is_same<T, float>::value) r.c[k] = (C)_mm512_scalef_ps((__m512)p.c[k], (__m512)nf.c[k]);
            else r.c[k] = (C)_mm512_scalef_pd((__m512d)p.c[k], (__m512d)nf.c[k]);
        }
        return r;
    }
#endif
    (void)nf;
    return ldexp_twostep(p, n);
}
// the same from the integer lanes alone: on AVX-512 one conversion (vcvtdq2ps, or vcvtqq2pd
// where AVX512DQ has it) and vscalef
template <typename T>
TP_INLINE Vec<T> ldexp_split(const Vec<T>& p, const ivec<T>& n) {
#if defined(__AVX512F__)
#if defined(__AVX512DQ__)
    constexpr bool convert = true;
#else
    constexpr bool convert = std::is_same<T, float>::value;
#endif
    if constexpr (convert && sizeof(typename Vec<T>::chunk_type) == 64) return ldexp_split(p, cast<T>(n), n);
#endif
    return ldexp_twostep(p, n);
}
// e^(r+c) = 1 + r + tail for |r| <= ln2/2 and |c| << |r| (c: the rounding error of r)
template <typename T>
TP_INLINE Vec<T> exp_tail(const Vec<T>& r, const Vec<T>& c) {
    Vec<T> p = horner(r, fp<T>::expm1_p);
    p = mla(p, r, Vec<T>(T(0.5)));
    return mla(r * r, p, mla(c, r, c));   // r^2 (1/2 + r P(r)) + c (1 + r)
}
// A + r + tail rounded once more accurately: Fast2Sum of A + r (|A| >= |r| or A == 0), then
// the low part and the tail are added before the final rounding
template <typename T>
TP_INLINE Vec<T> add3(const Vec<T>& A, const Vec<T>& r, const Vec<T>& tail) {
    Vec<T> hi = A + r;
    Vec<T> lo = (A - hi) + r;
    return hi + (lo + tail);
}
// x = n*ln2 + r + c: n (float and int lanes), r, c (c = the rounding error of r)
template <typename T>
TP_INLINE void exp_reduce(const Vec<T>& x, Vec<T>& n, ivec<T>& ni, Vec<T>& r, Vec<T>& c) {
    using F = fp<T>;
    const Vec<T> magic(F::magic);
    Vec<T> t = mla(x, Vec<T>(F::log2e), magic);
    n = t - magic;
    ni = bitcast<typename F::I>(t) - bitcast<typename F::I>(magic);
    Vec<T> rh = mla(n, Vec<T>(-F::ln2_hi), x);   // exact (ln2_hi has trailing zeros)
    r = mla(n, Vec<T>(-F::ln2_lo), rh);
    c = mla(n, Vec<T>(-F::ln2_lo), rh - r);
}

// a/b for b with a known rounding error: (ah + al) / (bh + bl) given inv ~ 1/bh, one rounding
// after a Newton-type correction (the remainder ah - q0*bh is exact)
template <typename T>
TP_INLINE Vec<T> div_dw(const Vec<T>& ah, const Vec<T>& al, const Vec<T>& bh, const Vec<T>& bl,
                        const Vec<T>& inv) {
    Vec<T> q0 = ah * inv;
    Vec<T> ph, pl;
    two_prod(q0, bh, ph, pl);
    Vec<T> rem = mla(-q0, bl, ((ah - ph) - pl) + al);
    return mla(rem, inv, q0);
}
// e^x == (hi + lo) * 2^n with hi + lo in [sqrt(2)/2, sqrt(2)] to about 2^-(2*mant) relative
// (x clamped to [exp_lo, exp_hi], NaN kept); the scaling is left to the caller so that
// products with hi + lo can be formed before a single final rounding (also for subnormals)
template <typename T>
TP_INLINE void exp_dw_unscaled(const Vec<T>& x0, Vec<T>& hi, Vec<T>& lo, ivec<T>& ni) {
    using F = fp<T>;
    Vec<T> x = clamp_keep_nan(x0, F::exp_lo, F::exp_hi);
    Vec<T> n, r, c;
    exp_reduce(x, n, ni, r, c);
    const Vec<T> one(T(1));
    Vec<T> h = one + r;
    Vec<T> l = ((one - h) + r) + exp_tail(r, c);
    hi = h + l;                       // renormalise (|h| >= |l|)
    lo = l - (hi - h);
}
// e^x == hi + lo (lo loses accuracy where it is subnormal)
template <typename T>
TP_INLINE void exp_dw(const Vec<T>& x, Vec<T>& hi, Vec<T>& lo) {
    ivec<T> ni;
    exp_dw_unscaled(x, hi, lo, ni);
    hi = ldexp_split(hi, ni);
    lo = ldexp_split(lo, ni);
}

// log reduction: x = 2^k * (1+f), 1+f in [sqrt(2)/2, sqrt(2)); log(1+f) = f - hfsq + s*(hfsq+R)
template <typename T>
struct log_parts {
    Vec<T> k, f, s, hfsq, hR;   // hR = hfsq + R
};
template <typename T, bool Subnormals>
TP_INLINE log_parts<T> log_reduce(const Vec<T>& x) {
    using F = fp<T>;
    using I = typename F::I;
    Vec<T> xs = x;
    ivec<T> kadj(I(0));
    if constexpr (Subnormals) {
        auto sub = x < Vec<T>(F::min_normal);
        xs = where(sub, x * Vec<T>(F::subnormal_scale), x);
        kadj = where(sub, ivec<T>(I(-F::subnormal_exp)), kadj);
    }
    ivec<T> ix = bitcast<I>(xs);
    ivec<T> k = sra_c<F::mant>(ix - ivec<T>(F::sqrt_half_bits));
    Vec<T> m = bitcast<T>(ix - shl_c<F::mant>(k));
    log_parts<T> p;
    p.f = m - Vec<T>(T(1));
    p.k = cast<T>(k + kadj);
    p.s = p.f / (p.f + Vec<T>(T(2)));
    Vec<T> z = p.s * p.s;
    p.hfsq = mul_nc(Vec<T>(T(0.5)) * p.f, p.f);
    p.hR = mla(z, horner(z, F::log_p), p.hfsq);
    return p;
}
// log(x) for x <= 0, inf, NaN
template <typename T>
TP_INLINE Vec<T> log_fixup(const Vec<T>& x, const Vec<T>& r) {
    Vec<T> special = where(x == Vec<T>(T(0)), -infinity<T>(), where(x < Vec<T>(T(0)), quiet_nan<T>(), x));
    return where((x > Vec<T>(T(0))) & (x < infinity<T>()), r, special);
}
// log(1+f) as hi + lo with hi = f - hfsq (used by log2/log10)
template <typename T>
TP_INLINE void log1pf_hilo(const log_parts<T>& p, Vec<T>& hi, Vec<T>& lo) {
    hi = p.f - p.hfsq;
    lo = mla(p.s, p.hR, (p.f - hi) - p.hfsq);
}
// exp(-x^2) * erfcx(x) for x >= erfc_cut (clamped to [erfc_cut, erfc_max]; NaN kept)
template <typename T>
TP_INLINE Vec<T> erfc_tail(const Vec<T>& a);
}  // namespace detail

// ---- exp family ------------------------------------------------------------------------------
template <typename T>
TP_INLINE detail::if_float<T> exp(const Vec<T>& x0) {
    using F = detail::fp<T>;
    Vec<T> x = detail::clamp_keep_nan(x0, F::exp_lo, F::exp_hi);
    Vec<T> n, r, c;
    detail::ivec<T> ni;
    if constexpr (std::is_same<T, float>::value) {
        // float: x = n ln2 + r with r rounded once (its error < 0.2 ulp of the result), then
        // e^r = 1 + (r + r^2 (1/2 + r P(r))) with one final rounding — ~30% fewer operations than
        // the double-word path below; max error 0.8x ulp, tested (test_cpp_prelude.py)
        const Vec<T> magic(F::magic);
        Vec<T> t = detail::mla(x, Vec<T>(F::log2e), magic);
        n = t - magic;
        ni = bitcast<typename F::I>(t) - bitcast<typename F::I>(magic);
        r = detail::mla(n, Vec<T>(-F::ln2_lo), detail::mla(n, Vec<T>(-F::ln2_hi), x));
        Vec<T> p = detail::mla(detail::horner(r, F::expm1_p), r, Vec<T>(T(0.5)));
        Vec<T> q = detail::mla(r * r, p, r);
        return detail::ldexp_split(Vec<T>(T(1)) + q, n, ni);
    } else {
        detail::exp_reduce(x, n, ni, r, c);
        Vec<T> y = detail::add3(Vec<T>(T(1)), r, detail::exp_tail(r, c));   // e^(r+c)
        return detail::ldexp_split(y, n, ni);
    }
}

template <typename T>
TP_INLINE detail::if_float<T> exp2(const Vec<T>& x0) {
    using F = detail::fp<T>;
    Vec<T> x = detail::clamp_keep_nan(x0, F::exp2_lo, F::exp2_hi);
    const Vec<T> magic(F::magic);
    Vec<T> t = x + magic;
    Vec<T> n = t - magic;
    detail::ivec<T> ni = bitcast<typename F::I>(t) - bitcast<typename F::I>(magic);
    Vec<T> f = x - n;   // exact, |f| <= 1/2
    Vec<T> r, c;
    detail::two_prod(f, Vec<T>(F::ln2), r, c);   // f*ln2 = r + c
    c = detail::mla(f, Vec<T>(F::ln2_tail), c);
    Vec<T> y = detail::add3(Vec<T>(T(1)), r, detail::exp_tail(r, c));
    return detail::ldexp_split(y, n, ni);
}

template <typename T>
TP_INLINE detail::if_float<T> expm1(const Vec<T>& x0) {
    using F = detail::fp<T>;
    using I = typename F::I;
    Vec<T> x = detail::clamp_keep_nan(x0, F::expm1_lo, F::exp_hi);
    Vec<T> n, r, c;
    detail::ivec<T> ni;
    detail::exp_reduce(x, n, ni, r, c);
    Vec<T> tail = detail::exp_tail(r, c);
    // expm1 = 2^n (1 + r + tail) - 1, with one final rounding of a three-term sum:
    //   n <= 0:          (2^n - 1) + 2^n r + 2^n tail          (2^n - 1 exact for n >= -mant)
    //   1 <= n <= mant:  ((1 - 2^-n) + r + tail) * 2^n          (1 - 2^-n exact)
    //   n > mant:        (1 + r + (tail - 2^-n)) * 2^n          (may overflow to inf)
    const detail::ivec<T> zero(I(0)), nmant(I(F::mant)), cap(I(100));
    auto nonpos = ni <= zero;
    Vec<T> t = detail::pow2i<T>(where(nonpos, ni, zero));                  // 2^min(n,0)
    Vec<T> tinv = detail::pow2i<T>(-where(ni < cap, ni, cap));            // 2^-min(n,100)
    const Vec<T> one(T(1));
    Vec<T> A = where(nonpos, t - one, where(ni <= nmant, one - tinv, one));
    Vec<T> R = where(nonpos, t * r, r);
    Vec<T> TL = where(nonpos, t * tail, where(ni <= nmant, tail, tail - tinv));
    Vec<T> y = detail::add3(A, R, TL);
    Vec<T> res = detail::ldexp_split(y, where(nonpos, zero, ni));
    return where(x0 == Vec<T>(T(0)), x0, res);   // keeps -0
}

// ---- log family ------------------------------------------------------------------------------
template <typename T>
TP_INLINE detail::if_float<T> log(const Vec<T>& x) {
    using F = detail::fp<T>;
    detail::log_parts<T> p = detail::log_reduce<T, true>(x);
    Vec<T> lo = detail::mla(p.s, p.hR, p.k * Vec<T>(F::ln2_lo));
    Vec<T> r = detail::mla(p.k, Vec<T>(F::ln2_hi), p.f - (p.hfsq - lo));
    return detail::log_fixup(x, r);
}

template <typename T>
TP_INLINE detail::if_float<T> log2(const Vec<T>& x) {
    using F = detail::fp<T>;
    detail::log_parts<T> p = detail::log_reduce<T, true>(x);
    Vec<T> hi, lo, vh, vl;
    detail::log1pf_hilo(p, hi, lo);
    detail::two_prod(hi, Vec<T>(F::ivln2), vh, vl);
    vl = vl + detail::mla(hi, Vec<T>(F::ivln2_lo), lo * Vec<T>(F::ivln2));
    Vec<T> w = p.k + vh;
    vl = vl + ((p.k - w) + vh);
    return detail::log_fixup(x, w + vl);
}

template <typename T>
TP_INLINE detail::if_float<T> log10(const Vec<T>& x) {
    using F = detail::fp<T>;
    detail::log_parts<T> p = detail::log_reduce<T, true>(x);
    Vec<T> hi, lo, vh, vl;
    detail::log1pf_hilo(p, hi, lo);
    detail::two_prod(hi, Vec<T>(F::ivln10), vh, vl);
    vl = vl + detail::mla(hi, Vec<T>(F::ivln10_lo), detail::mla(lo, Vec<T>(F::ivln10), p.k * Vec<T>(F::log10_2lo)));
    Vec<T> y2 = p.k * Vec<T>(F::log10_2hi);   // exact
    Vec<T> w = y2 + vh;
    vl = vl + ((y2 - w) + vh);
    return detail::log_fixup(x, w + vl);
}

template <typename T>
TP_INLINE detail::if_float<T> log1p(const Vec<T>& x) {
    using F = detail::fp<T>;
    const Vec<T> one(T(1));
    Vec<T> u = one + x;
    // rounding error of u = 1 + x (Fast2Sum, larger operand first), divided by u
    Vec<T> c = where(abs(x) >= one, one - (u - x), x - (u - one)) / u;
    detail::log_parts<T> p = detail::log_reduce<T, false>(u);
    Vec<T> lo = detail::mla(p.s, p.hR, detail::mla(p.k, Vec<T>(F::ln2_lo), c));
    Vec<T> r = detail::mla(p.k, Vec<T>(F::ln2_hi), p.f - (p.hfsq - lo));
    Vec<T> special = where(x == -one, -detail::infinity<T>(), where(x < -one, detail::quiet_nan<T>(), x));
    r = where((x > -one) & (x < detail::infinity<T>()), r, special);
    return where(x == Vec<T>(T(0)), x, r);   // keeps -0
}

// ---- hyperbolic, logistic ----------------------------------------------------------------------
template <typename T>
TP_INLINE detail::if_float<T> tanh(const Vec<T>& x) {
    using F = detail::fp<T>;
    if constexpr (std::is_same<T, float>::value) {
        // the scheme of float erf with a sixteen-entry table (detail::odd_by_table): no exp, no division
        return where(x == Vec<T>(T(0)), x, detail::odd_by_table(x, F::tanh_tab_c, F::tanh_tab_p, 9.02f, 7.75f));   // keeps -0
    }
    const Vec<T> one(T(1));
    Vec<T> a = abs(x);
    Vec<T> z = x * x;
    Vec<T> small = detail::mla(x * z, detail::horner(z, F::tanh_p), x);
    // |x| >= cut: 1 - 2/(e^{2|x|} + 1), e and e + 1 kept as double-words
    Vec<T> ac = detail::clamp_keep_nan(a, T(0), F::tanh_max);
    Vec<T> eh, el;
    detail::exp_dw(ac + ac, eh, el);
    Vec<T> dh = eh + one;
    Vec<T> dl = ((eh - dh) + one) + el;   // e >= 1: Fast2Sum
    Vec<T> q = detail::div_dw(Vec<T>(T(2)), Vec<T>(T(0)), dh, dl, one / dh);
    Vec<T> big = copysign(one - q, x);
    return where(a < Vec<T>(F::tanh_cut), where(x == Vec<T>(T(0)), x, small), big);   // keeps -0
}

// sigmoid(x) = 1/(1+exp(-x)), evaluated with e = exp(-|x|) <= 1 so that neither branch overflows
template <typename T>
TP_INLINE detail::if_float<T> sigmoid(const Vec<T>& x) {
    const Vec<T> one(T(1)), zero(T(0));
    Vec<T> eh, el;
    detail::exp_dw(-abs(x), eh, el);      // e = exp(-|x|) in (0, 1]
    Vec<T> dh = one + eh;
    Vec<T> dl = ((one - dh) + eh) + el;   // 1 + e == dh + dl
    auto pos = x >= zero;                 // 1/(1+e) for x >= 0, e/(1+e) for x < 0
    return detail::div_dw(where(pos, one, eh), where(pos, zero, el), dh, dl, one / dh);
}

// ---- error function ----------------------------------------------------------------------------
namespace detail {
template <typename T>
TP_INLINE Vec<T> erfc_tail(const Vec<T>& a) {
    using F = fp<T>;
    const Vec<T> one(T(1));
    Vec<T> b = clamp_keep_nan(a, F::erfc_cut, F::erfc_max);
    const Vec<T> K(F::erfc_K);
    Vec<T> t = (b - K) / (b + K);
    // H = P(t) = c0 + t*Q(t) as a double-word Hh + Hl
    Vec<T> Q(F::erfc_p[std::size(F::erfc_p) - 1]);
    for (int i = int(std::size(F::erfc_p)) - 2; i >= 1; --i) Q = mla(Q, t, Vec<T>(F::erfc_p[i]));
    Vec<T> ph, pl;
    two_prod(t, Q, ph, pl);
    const Vec<T> c0(F::erfc_p[0]);
    Vec<T> Hh = c0 + ph;
    Vec<T> Hl = (((c0 - Hh) + ph) + pl) + Vec<T>(F::erfc_c0_lo);
    // G = erfc(b) exp(b^2) = H / (2b + 1) as G0 + Gl
    Vec<T> dh = (b + b) + one;
    Vec<T> dl = ((b + b) - dh) + one;     // 2b + 1 == dh + dl
    Vec<T> inv = one / dh;
    Vec<T> G0 = mul_nc(Hh, inv);
    Vec<T> gh, gl;
    two_prod(G0, dh, gh, gl);
    Vec<T> Gl = mul_nc(mla(-G0, dl, ((Hh - gh) - gl) + Hl), inv);
    // exp(-b^2) = exp(-h - l) = (eh + el) (1 - l)
    Vec<T> h, l;
    two_prod(b, b, h, l);
    Vec<T> eh, el;
    ivec<T> ni;
    exp_dw_unscaled(-h, eh, el, ni);
    // erfc = (eh + el)(1 - l)(G0 + Gl) 2^n, rounded once before the exact-or-final scaling
    Vec<T> Ph, Pl;
    two_prod(eh, G0, Ph, Pl);
    return ldexp_split(Ph + (Pl + mla(eh, mla(-G0, l, Gl), mul_nc(el, G0))), ni);
}
// P(x^2) with erf(x) = x + x P(x^2)
template <typename T>
TP_INLINE Vec<T> erf_small_p(const Vec<T>& x) {
    return horner(x * x, fp<T>::erf_p);
}
}  // namespace detail

template <typename T>
TP_INLINE detail::if_float<T> erf(const Vec<T>& x) {
    using F = detail::fp<T>;
    if constexpr (std::is_same<T, float>::value) {
        // one degree-7 polynomial per lane (detail::odd_by_table): about 2.6x fewer cycles than the
        // exp(-x^2) * erfcx(x) path that erfc and double keep
        return detail::odd_by_table(x, F::erf_tab_c, F::erf_tab_p, 3.95f, 3.95f);
    }
    Vec<T> a = abs(x);
    Vec<T> small = detail::mla(x, detail::erf_small_p(x), x);
    Vec<T> big = copysign(Vec<T>(T(1)) - detail::erfc_tail(a), x);
    return where(a < Vec<T>(F::erf_cut), small, big);
}

template <typename T>
TP_INLINE detail::if_float<T> erfc(const Vec<T>& x) {
    using F = detail::fp<T>;
    Vec<T> a = abs(x);
    const Vec<T> one(T(1));
    Vec<T> h = one - x;
    Vec<T> small = h + detail::mla(-x, detail::erf_small_p(x), (one - h) - x);   // 1 - x - x P(x^2)
    Vec<T> E = detail::erfc_tail(a);
    Vec<T> big = where(x > Vec<T>(T(0)), E, Vec<T>(T(2)) - E);
    return where(a < Vec<T>(F::erfc_cut), small, big);
}

// ---- sin, cos, tan ------------------------------------------------------------------------------
// Evaluated in double precision for both dtypes (float lanes are widened: the result is then
// correctly rounded but for rare double roundings).  x = n*pi/2 + r with pi/2 as a sum of three
// doubles and exact products (two_prod), r = rh + rl as a double-word: accurate for |x| <= 2^28.
// Larger |x| (and inf) take the per-lane libm path.
namespace detail {
struct trig {
    static constexpr double pio2_1 = 0x1.921fb54442d18p+0, pio2_2 = 0x1.1a62633145c07p-54,
                            pio2_3 = -0x1.f1976b7ed8fbcp-110, twoopi = 0x1.45f306dc9c883p-1;
    static constexpr double big = 0x1p28;
    // sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2), |r| <= pi/4: double, and float-accurate
    static constexpr double sin_d[] = {-0x1.5555555555555p-3, 0x1.1111111111110p-7,  -0x1.a01a01a019882p-13,
                                       0x1.71de3a544aa3fp-19, -0x1.ae6453ed04af8p-26, 0x1.6121616906ac9p-33,
                                       -0x1.ab0686b3400b0p-41};
    static constexpr double cos_d[] = {0x1.5555555555555p-5,  -0x1.6c16c16c16920p-10, 0x1.a01a019f3e0fbp-16,
                                       -0x1.27e4fa027cae6p-22, 0x1.1eeb52da828afp-29, -0x1.906de5410c538p-37};
    static constexpr double sin_f[] = {-0x1.555555544a3d4p-3, 0x1.11110dbf31f5ep-7, -0x1.a0136725a54b1p-13,
                                       0x1.6da94bb75903dp-19};
    static constexpr double cos_f[] = {0x1.55555554fc2c7p-5, -0x1.6c16bf34c5cf2p-10, 0x1.a015995f89411p-16,
                                       -0x1.25166ef2e56d1p-22};
};
// Knuth's TwoSum: s + e == a + b exactly
TP_INLINE void two_sum(const Vec<double>& a, const Vec<double>& b, Vec<double>& s, Vec<double>& e) {
    s = a + b;
    Vec<double> bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}
// 0: sin, 1: cos, 2: tan; Float selects the shorter polynomials (float-accurate)
template <int Which, bool Float>
TP_INLINE Vec<double> trig_core(const Vec<double>& x) {
    using D = Vec<double>;
    const D magic(0x1.8p52);
    D t = mla(x, D(trig::twoopi), magic);
    D n = t - magic;
    Vec<int64_t> q = bitcast<int64_t>(t) - bitcast<int64_t>(magic);
    D ph, pl, wh, wl;
    two_prod(n, D(trig::pio2_1), ph, pl);
    two_prod(n, D(trig::pio2_2), wh, wl);
    D s1 = x - ph;                                   // exact (Sterbenz, or n == 0)
    D u, eu, rh, e2;
    two_sum(pl, wh, u, eu);
    two_sum(s1, -u, rh, e2);
    D rl = ((e2 - eu) - wl) - mul_nc(n, D(trig::pio2_3));
    D z = rh * rh;
    D S = Float ? horner(z, trig::sin_f) : horner(z, trig::sin_d);
    D C = Float ? horner(z, trig::cos_f) : horner(z, trig::cos_d);
    const D one(1.0), half(0.5);
    // sin(rh + rl) = rh + (rh z S + rl (1 - z/2));  cos(rh + rl) = w + ((1 - w) - z/2 + z^2 C - rh rl)
    D ts = mla(rh * z, S, mul_nc(rl, mla(-half, z, one)));
    D sn = rh + ts;
    D hz = mul_nc(half, z);
    D w = one - hz;
    D tc = ((one - w) - hz) + mla(z * z, C, -mul_nc(rh, rl));
    D cs = w + tc;
    const Vec<int64_t> one_i(int64_t(1)), two_i(int64_t(2)), zero_i(int64_t(0));
    auto odd = (q & one_i) != zero_i;
    if constexpr (Which == 2) {   // tan = sin/cos or -cos/sin, both as double-words, one rounding
        D sl = (rh - sn) + ts, cl = (w - cs) + tc;
        D nh = where(odd, -cs, sn), nl = where(odd, -cl, sl);
        D dh = where(odd, sn, cs), dl = where(odd, sl, cl);
        return div_dw(nh, nl, dh, dl, one / dh);
    } else {
        D res = where(odd, Which == 0 ? cs : sn, Which == 0 ? sn : cs);
        auto neg = ((Which == 0 ? q : q + one_i) & two_i) != zero_i;
        return where(neg, -res, res);
    }
}
template <int Which, typename T>
TP_INLINE Vec<T> trig(const Vec<T>& x) {
    Vec<T> r;
    if constexpr (std::is_same<T, float>::value) r = cast<float>(trig_core<Which, true>(cast<double>(x)));
    else r = trig_core<Which, false>(x);
    if constexpr (Which != 1) r = where(x == Vec<T>(T(0)), x, r);   // keeps -0
    auto big = abs(x) > Vec<T>(T(trig::big));
    if (any(big)) {
        Vec<T> slow = map(x, [](T v) {   // float lanes through double libm: still correctly rounded
            double d = double(v);
            return T(Which == 0 ? std::sin(d) : Which == 1 ? std::cos(d) : std::tan(d));
        });
        r = where(big, slow, r);
    }
    return r;
}
}  // namespace detail

template <typename T>
TP_INLINE detail::if_float<T> sin(const Vec<T>& x) { return detail::trig<0>(x); }
template <typename T>
TP_INLINE detail::if_float<T> cos(const Vec<T>& x) { return detail::trig<1>(x); }
template <typename T>
TP_INLINE detail::if_float<T> tan(const Vec<T>& x) { return detail::trig<2>(x); }

// ---- sinh, cosh, hypot ---------------------------------------------------------------------------
namespace detail {
// sinh(x) = x + x^3 S(x^2) for |x| < 1: Taylor coefficients 1/3!, 1/5!, ... (the truncation error
// is below 2^-29 (float) / 2^-57 (double) of |x|)
template <typename T> struct hyp;
template <> struct hyp<float> {
    static constexpr float sinh_p[] = {0x1.555556p-3f, 0x1.111112p-7f, 0x1.a01a02p-13f, 0x1.71de3ap-19f,
                                       0x1.ae6456p-26f};
};
template <> struct hyp<double> {
    static constexpr double sinh_p[] = {0x1.5555555555555p-3,  0x1.1111111111111p-7,  0x1.a01a01a01a01ap-13,
                                        0x1.71de3a556c734p-19, 0x1.ae64567f544e4p-26, 0x1.6124613a86d09p-33,
                                        0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49};
};
// e^|x| / 2 +- e^-|x| / 2 for |x| >= 0 with one final rounding: e^|x| = (h + l) 2^n (n >= 0) as in
// exp_dw_unscaled, e^-|x| = 2^-n r with r = 2^-2n/(h + l) rounded once (r <= h: Fast2Sum), then
// scaled by 2^(n-1).  |x| is clamped a little beyond the overflow threshold (inf comes out).
template <bool Plus, typename T>
TP_INLINE Vec<T> cosh_sinh_big(const Vec<T>& a0) {
    using F = fp<T>;
    using I = typename F::I;
    const Vec<T> one(T(1));
    Vec<T> a = clamp_keep_nan(a0, T(0), F::exp_hi + T(1));
    Vec<T> n, r, c;
    ivec<T> ni;
    exp_reduce(a, n, ni, r, c);
    Vec<T> h0 = one + r;
    Vec<T> l0 = ((one - h0) + r) + exp_tail(r, c);
    Vec<T> h = h0 + l0, l = l0 - (h - h0);
    // 2^-2n with n capped where the e^-|x| term no longer matters (keeps the exponent in range)
    const ivec<T> cap(I(F::mant / 2 + 4));
    Vec<T> p2 = pow2i<T>(-(where(ni < cap, ni, cap) + where(ni < cap, ni, cap)));
    Vec<T> rr = div_dw(p2, Vec<T>(T(0)), h, l, one / h);
    Vec<T> s = Plus ? h + rr : h - rr;
    Vec<T> t = (Plus ? (h - s) + rr : (h - s) - rr) + l;
    return ldexp_split(s + t, ni - ivec<T>(I(1)));
}
}  // namespace detail

template <typename T>
TP_INLINE detail::if_float<T> sinh(const Vec<T>& x) {
    Vec<T> small = detail::mla(x * (x * x), detail::horner(x * x, detail::hyp<T>::sinh_p), x);   // keeps -0
    Vec<T> big = copysign(detail::cosh_sinh_big<false>(abs(x)), x);
    return where(abs(x) < Vec<T>(T(1)), small, big);
}
template <typename T>
TP_INLINE detail::if_float<T> cosh(const Vec<T>& x) {
    return detail::cosh_sinh_big<true>(abs(x));
}
// hypot: float lanes exactly in double (x^2 + y^2 has one rounding, then sqrt: correctly rounded but
// for rare double roundings); double lanes scaled by a power of two so that the larger operand lies
// in [1, 2), a^2 + b^2 as a double-word and one corrected square root.  inf wins over NaN (IEEE).
template <typename T>
TP_INLINE detail::if_float<T> hypot(const Vec<T>& x, const Vec<T>& y) {
    Vec<T> r;
    if constexpr (std::is_same<T, float>::value) {
        Vec<double> a = cast<double>(x), b = cast<double>(y);
        r = cast<float>(sqrt(detail::mla(a, a, b * b)));   // a^2, b^2 exact: fma or not, same bits
    } else {
        using I = int64_t;
        Vec<double> ax = abs(x), ay = abs(y);
        Vec<double> a = maximum(ax, ay), b = minimum(ax, ay);
        // a = A 2^e, b = B 2^e with A in [1, 2) (e clamped to +-1000: subnormal a gives a smaller A,
        // inf/NaN stay inf/NaN); both scalings are exact or negligible (B^2 << ulp(A^2))
        Vec<I> e = detail::sra_c<52>(bitcast<I>(a)) - Vec<I>(I(1023));
        e = where(e > Vec<I>(I(1000)), Vec<I>(I(1000)), where(e < Vec<I>(I(-1000)), Vec<I>(I(-1000)), e));
        Vec<double> sc = detail::pow2i<double>(-e);
        Vec<double> A = a * sc, B = b * sc;
        Vec<double> ah, al, bh, bl;
        detail::two_prod(A, A, ah, al);
        detail::two_prod(B, B, bh, bl);
        Vec<double> sh = ah + bh;                       // ah >= bh: Fast2Sum
        Vec<double> sl = ((ah - sh) + bh) + (al + bl);
        Vec<double> q = sqrt(sh);                       // then one Newton correction with the
        Vec<double> qh, ql;                             // exact remainder sh + sl - q^2
        detail::two_prod(q, q, qh, ql);
        Vec<double> corr = (((sh - qh) - ql) + sl) / (q + q);
        r = where(b == Vec<double>(0.0), a, detail::ldexp_split(q + corr, e));
    }
    return where(isinf(x) | isinf(y), detail::infinity<T>(), r);
}

// ---- counter-based random numbers: Philox4x32-10 ----------------------------------------------
// Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC'11).  Philox is a
// keyed bijection of a 128-bit counter: ten rounds of two 32x32->64-bit multiplications and xors.
// Element `offset` (its row-major index) of random op `stream` of a graph whose run drew the
// 64-bit seed K is philox(counter = (offset_lo, offset_hi, stream_lo, stream_hi), key = (K_lo,
// K_hi)).  So
// a value depends on (K, stream, offset) only: it is the same at every vector width and thread
// count, in a fused or a separate kernel, and when two readers each recompute it (a dropout mask
// read by the output and by the saved mask).  Checked against Random123's known-answer vectors
// (test/stax/test_random.py).
namespace detail {
template <typename T>
TP_INLINE Vec<T> shr_u(const Vec<T>& a, int n) {   // logical shift right by a constant
    using U = typename chunk<uint_t<T>>::type;
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = (typename Vec<T>::chunk_type)((U)a.c[k] >> n);
    return r;
}
template <typename T>
TP_INLINE Vec<T> shl(const Vec<T>& a, int n) {
    using U = typename chunk<uint_t<T>>::type;
    Vec<T> r;
    for (int k = 0; k < Vec<T>::nchunks; ++k) r.c[k] = (typename Vec<T>::chunk_type)((U)a.c[k] << n);
    return r;
}
TP_INLINE Vec<int64_t> zext(const Vec<int32_t>& a) { return cast<int64_t>(a) & Vec<int64_t>(0xFFFFFFFFLL); }
// The 64-bit products of the lanes of one chunk x (unsigned) and m, as their high and low 32-bit
// halves.  AVX-512/AVX2: vpmuludq multiplies the even 32-bit lanes into 64-bit products; a second
// one multiplies the odd lanes (shifted down), and two blends sort the halves back into lanes.
template <typename C>
TP_INLINE void chunk_mulhilo(const C& x, uint32_t m, C& hi, C& lo) {
#if defined(__AVX512F__)
    if constexpr (sizeof(C) == 64) {
        const __m512i mm = _mm512_set1_epi32((int)m), v = (__m512i)x;
        const __m512i e = _mm512_mul_epu32(v, mm), o = _mm512_mul_epu32(_mm512_srli_epi64(v, 32), mm);
        lo = (C)_mm512_mask_blend_epi32(__mmask16(0xAAAA), e, _mm512_slli_epi64(o, 32));
        hi = (C)_mm512_mask_blend_epi32(__mmask16(0xAAAA), _mm512_srli_epi64(e, 32), o);
        return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (sizeof(C) == 32) {
        const __m256i mm = _mm256_set1_epi32((int)m), v = (__m256i)x;
        const __m256i e = _mm256_mul_epu32(v, mm), o = _mm256_mul_epu32(_mm256_srli_epi64(v, 32), mm);
        lo = (C)_mm256_blend_epi32(e, _mm256_slli_epi64(o, 32), 0xAA);
        hi = (C)_mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA);
        return;
    }
#endif
    constexpr int n = int(sizeof(C) / sizeof(int32_t));
    for (int i = 0; i < n; ++i) {
        const uint64_t p = (uint64_t)(uint32_t)x[i] * m;
        lo[i] = (int32_t)(uint32_t)p;
        hi[i] = (int32_t)(uint32_t)(p >> 32);
    }
}
TP_INLINE void mulhilo(const Vec<int32_t>& a, uint32_t m, Vec<int32_t>& hi, Vec<int32_t>& lo) {
    for (int k = 0; k < Vec<int32_t>::nchunks; ++k) chunk_mulhilo(a.c[k], m, hi.c[k], lo.c[k]);
}
struct Philox {
    Vec<int32_t> w[4];
};
TP_INLINE Philox philox(const Vec<int64_t>& seed, const Vec<int64_t>& offset, int64_t stream) {
    Vec<int32_t> c0 = cast<int32_t>(offset), c1 = cast<int32_t>(shr_u(offset, 32));
    Vec<int32_t> c2((int32_t)(uint32_t)stream), c3((int32_t)(uint32_t)((uint64_t)stream >> 32));
    Vec<int32_t> k0 = cast<int32_t>(seed), k1 = cast<int32_t>(shr_u(seed, 32));
    const Vec<int32_t> w0((int32_t)0x9E3779B9u), w1((int32_t)0xBB67AE85u);   // key schedule (Weyl)
    for (int round = 0; round < 10; ++round) {
        if (round) {
            k0 += w0;
            k1 += w1;
        }
        Vec<int32_t> hi0, lo0, hi1, lo1;
        mulhilo(c0, 0xD2511F53u, hi0, lo0);
        mulhilo(c2, 0xCD9E8D57u, hi1, lo1);
        const Vec<int32_t> n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return Philox{{c0, c1, c2, c3}};
}
// uniform on [0, 1): float from the top 24 bits of one word, double from 53 bits of two;
// `open0` adds one ulp of the grid, giving (0, 1] (the log argument of Box-Muller)
template <typename T>
TP_INLINE Vec<T> unit(const Vec<int32_t>& a, const Vec<int32_t>& b, bool open0) {
    if constexpr (std::is_same<T, float>::value) {
        Vec<int32_t> m = shr_u(a, 8);
        if (open0) m += Vec<int32_t>(1);
        return cast<float>(m) * Vec<float>(0x1.0p-24f);
    } else {
        Vec<int64_t> m = shl(zext(a), 21) | zext(shr_u(b, 11));
        if (open0) m += Vec<int64_t>(1);
        return cast<double>(m) * Vec<double>(0x1.0p-53);
    }
}
// cos(2 pi u) for a float u in [0, 1) that is a multiple of 2^-24 (a Box-Muller angle).  The
// reduction is exact: t = 4u, its quadrant q = floor(t) and f = t - q in [0, 1) are exact, and so
// is g = min(f, 1 - f) <= 1/2; then cos(2 pi u) is +-sin or +-cos of x = g pi/2 <= pi/4, by
// Taylor polynomials (truncation below 0.4 ulp there).  No pi/2 subtraction, no double precision:
// about half the cost of the general float cos, which reduces in double.
TP_INLINE Vec<float> cos_2pi_unit(const Vec<float>& u) {
    const Vec<float> t = u * Vec<float>(4.0f);
    const Vec<int32_t> q = cast<int32_t>(t);
    const Vec<float> f = t - cast<float>(q);
    const auto big = f > Vec<float>(0.5f);
    const Vec<float> x = where(big, Vec<float>(1.0f) - f, f) * Vec<float>(1.57079632679489662f);
    const Vec<float> x2 = x * x;
    const Vec<float> sn = x + x * x2 * (Vec<float>(-1.0f / 6) + x2 * (Vec<float>(1.0f / 120) + x2 * (
                              Vec<float>(-1.0f / 5040) + x2 * Vec<float>(1.0f / 362880))));
    const Vec<float> cs = Vec<float>(1.0f) + x2 * (Vec<float>(-0.5f) + x2 * (Vec<float>(1.0f / 24) + x2 * (
                              Vec<float>(-1.0f / 720) + x2 * (Vec<float>(1.0f / 40320) + x2 * Vec<float>(-1.0f / 3628800)))));
    // quadrant 0: cos x (f <= 1/2) or sin x; 1: -sin, -cos; 2: -cos, -sin; 3: sin, cos
    const auto odd = (q & Vec<int32_t>(1)) != Vec<int32_t>(0);
    const auto negative = ((q + Vec<int32_t>(1)) & Vec<int32_t>(2)) != Vec<int32_t>(0);
    const Vec<float> r = where(odd ^ big, sn, cs);
    return where(negative, -r, r);
}
}  // namespace detail

// lane i: uniform on [0, 1) for element offset[i] of stream `stream` under `seed`
template <typename T>
TP_INLINE Vec<T> philox_rand(const Vec<int64_t>& seed, const Vec<int64_t>& offset, int64_t stream) {
    const detail::Philox r = detail::philox(seed, offset, stream);
    return detail::unit<T>(r.w[0], r.w[1], false);
}
// standard normal by Box-Muller: sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1], u2 in [0, 1)
// (float: cos(2 pi u2) by detail::cos_2pi_unit)
template <typename T>
TP_INLINE Vec<T> philox_randn(const Vec<int64_t>& seed, const Vec<int64_t>& offset, int64_t stream) {
    const detail::Philox r = detail::philox(seed, offset, stream);
    const Vec<T> u1 = detail::unit<T>(r.w[0], r.w[1], true), u2 = detail::unit<T>(r.w[2], r.w[3], false);
    if constexpr (std::is_same<T, float>::value) {
        return sqrt(Vec<T>(T(-2)) * log(u1)) * detail::cos_2pi_unit(u2);
    } else {
        return sqrt(Vec<T>(T(-2)) * log(u1)) * cos(Vec<T>(T(6.283185307179586)) * u2);
    }
}
// integers uniform on [low, low + range), range >= 1 (as unsigned: up to 2^64 - 1): the
// multiply-shift of one 32-bit word for range <= 2^32 (bias < range / 2^32, like eager's 32-bit
// modulo), else 64 bits modulo range (bias < range / 2^64)
TP_INLINE Vec<int64_t> philox_randint(const Vec<int64_t>& seed, const Vec<int64_t>& offset, int64_t stream,
                                      int64_t low, uint64_t range) {
    const detail::Philox r = detail::philox(seed, offset, stream);
    Vec<int64_t> v;
    if (range <= 0x100000000ULL) {
        v = detail::shr_u(detail::zext(r.w[0]) * Vec<int64_t>((int64_t)range), 32);
    } else {
        const Vec<int64_t> bits = detail::shl(detail::zext(r.w[0]), 32) | detail::zext(r.w[1]);
        for (int i = 0; i < Vec<int64_t>::size; ++i) v.set(i, (int64_t)((uint64_t)bits[i] % range));
    }
    return Vec<int64_t>(low) + v;
}

// ---- per-lane libm (no vector version; see the table at the top) -----------------------------
#define TP_LIBM_UNARY(NAME)                                                               \
    template <typename T>                                                                 \
    inline detail::if_float<T> NAME(const Vec<T>& a) {                                    \
        return map(a, [](T v) { return std::NAME(v); });                                  \
    }
TP_LIBM_UNARY(asin)
TP_LIBM_UNARY(acos)
TP_LIBM_UNARY(atan)
TP_LIBM_UNARY(asinh)
TP_LIBM_UNARY(acosh)
TP_LIBM_UNARY(atanh)
TP_LIBM_UNARY(cbrt)
TP_LIBM_UNARY(lgamma)
#undef TP_LIBM_UNARY
#define TP_LIBM_BINARY(NAME)                                                              \
    template <typename T>                                                                 \
    inline detail::if_float<T> NAME(const Vec<T>& a, const Vec<T>& b) {                   \
        return map(a, b, [](T u, T v) { return std::NAME(u, v); });                       \
    }
TP_LIBM_BINARY(atan2)
TP_LIBM_BINARY(nextafter)
#undef TP_LIBM_BINARY

}  // namespace tp

#pragma GCC diagnostic pop
