// Math: division helpers with torch semantics, the vectorised transcendental functions (the accuracy
// contract at the top of cpp_prelude.h) and the per-lane libm ones.
// Part of the Stax vector library: include cpp_prelude.h (the umbrella, which sets the width macros
// and the standard headers first), not this file.
#pragma once
#include "tp_vec.h"

namespace tp {
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
