// Vectors: Vec<T> and VecMask<W>, loads and stores (streaming, strided, partial), select and
// conversions, the basic elementwise functions of every dtype.
// Part of the Stax vector library: include cpp_prelude.h (the umbrella, which sets the width macros
// and the standard headers first), not this file.
#pragma once

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
// the widest SIMD register of the target (bytes): what one asm operand can hold
#if defined(__AVX512F__)
constexpr int kRegBytes = 64;
#elif defined(__AVX__)
constexpr int kRegBytes = 32;
#elif defined(__SSE2__)
constexpr int kRegBytes = 16;
#else
constexpr int kRegBytes = 0;
#endif
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
        Vec r = load(t);
        // Opaque to the optimiser: GCC 12.2 (x86-64, AVX-512 with 512-bit vectors preferred, e.g.
        // -march=native on a CPU it tunes generically) folds a comparison of a constant iota with a
        // constant -- a tail mask of a compile-time length -- into a wrong all-true select
        // (`where(iota < 4, 1, 0)` became 16 ones).  Hiding the lanes keeps the comparison at run time.
        for (int k = 0; k < nchunks; ++k) {
#if defined(__x86_64__) || defined(__i386__)
            // in its SIMD register when one holds the chunk (a wider chunk -- TP_VEC_BYTES above the
            // ISA's width, or TP_SCALAR -- through memory)
            constexpr int reg = detail::kRegBytes;
            if constexpr (sizeof(chunk_type) > sizeof(T) && (int)sizeof(chunk_type) <= reg) asm("" : "+x"(r.c[k]));
            else asm("" : "+m"(r.c[k]));
#else
            asm("" : "+m"(r.c[k]));
#endif
        }
        return r;
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

}  // namespace tp
