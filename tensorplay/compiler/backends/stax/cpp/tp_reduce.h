// Horizontal reductions (a fixed pairwise tree) and the accumulators of the Stax code generator
// (argmax/argmin, Welford).
// Part of the Stax vector library: include cpp_prelude.h (the umbrella, which sets the width macros
// and the standard headers first), not this file.
#pragma once
#include "tp_vec.h"

namespace tp {
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

}  // namespace tp
