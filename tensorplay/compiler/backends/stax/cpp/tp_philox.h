// Counter-based random numbers: Philox4x32-10.
// Part of the Stax vector library: include cpp_prelude.h (the umbrella, which sets the width macros
// and the standard headers first), not this file.
#pragma once
#include "tp_vec.h"
#include "tp_math.h"

namespace tp {
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

}  // namespace tp
