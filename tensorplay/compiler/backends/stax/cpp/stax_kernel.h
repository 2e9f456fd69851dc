// Helpers the Stax code generator emits on top of cpp_prelude.h (the vector library):
// bool values live in registers as 0/1 int32 lanes; bool tensors are 1 byte per element.
// Strided (non-unit-stride) loads and stores and tails of bool data go lane by lane.
#pragma once
#include "cpp_prelude.h"
#include <cstdint>
#include <limits>
#include <vector>

// A row scratch array of a symbolic length (a row with no declared upper bound): one heap buffer
// per thread and slot, grown to the longest row seen, so a kernel allocates only when rows grow.
template <typename T>
inline T* tp_row_scratch(int slot, int64_t n) {
  thread_local std::vector<T> bufs[8];
  std::vector<T>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

template <typename M>
inline tp::Vec<int32_t> tp_bool_from_mask(const M& m) {
  alignas(64) int32_t t[tp::Vec<int32_t>::size];
  for (int k = 0; k < tp::Vec<int32_t>::size; ++k) t[k] = (m[k] != 0) ? 1 : 0;
  return tp::Vec<int32_t>::load(t);
}

template <typename T>
inline auto tp_mask_from_bool(const tp::Vec<int32_t>& b) {
  return tp::cast<T>(b) != tp::Vec<T>(T(0));
}

template <typename T>
inline auto tp_tail_mask(int n) {
  return tp::Vec<T>::iota(T(0)) < tp::Vec<T>(T(n));
}

template <typename T>
inline tp::Vec<T> tp_gather(const T* p, int64_t stride, int n) {
  if (n == tp::Vec<T>::size) return tp::Vec<T>::load_strided(p, stride);
  alignas(64) T t[tp::Vec<T>::size] = {};
  for (int k = 0; k < n; ++k) t[k] = p[k * stride];
  return tp::Vec<T>::load(t);
}

template <typename T>
inline void tp_scatter(T* p, int64_t stride, const tp::Vec<T>& v, int n) {
  for (int k = 0; k < n; ++k) p[k * stride] = v[k];
}

inline tp::Vec<int32_t> tp_load_bool(const bool* p, int64_t stride, int n) {
  alignas(64) int32_t t[tp::Vec<int32_t>::size] = {};
  for (int k = 0; k < n; ++k) t[k] = p[k * stride] ? 1 : 0;
  return tp::Vec<int32_t>::load(t);
}

inline void tp_store_bool(bool* p, int64_t stride, const tp::Vec<int32_t>& v, int n) {
  for (int k = 0; k < n; ++k) p[k * stride] = v[k] != 0;
}

// ---- run-time errors (integer division by zero) ---------------------------------------------
// A kernel that divides integers checks its divisors and calls tp_report_error(message); the
// library's tp_kernel_take_error() hands the first message to the Python side, which raises it
// after the call (async_compile.CppKernelFuture).  One kernel per library: the static is its own.
static const char* tp_kernel_error_msg = nullptr;
inline void tp_report_error(const char* msg) {
  const char* expected = nullptr;
  __atomic_compare_exchange_n(&tp_kernel_error_msg, &expected, msg, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
extern "C" __attribute__((weak)) const char* tp_kernel_take_error() {
  return __atomic_exchange_n(&tp_kernel_error_msg, (const char*)nullptr, __ATOMIC_RELAXED);
}

// ==== masked and indirect loads (ops.masked, ops.indirect_indexing; see bounds.py) ============
#include <cstdio>
// The 0/1 lanes of a comparison in one select (picked over the lane loop of the generic
// tp_bool_from_mask above for tp::VecMask arguments: it is more specialised).
template <int W>
inline tp::Vec<int32_t> tp_bool_from_mask(const tp::VecMask<W>& m) {
  return tp::where(m, tp::Vec<int32_t>(1), tp::Vec<int32_t>(0));
}

// A lane k is *active* if k < n and m[k] != 0 (m: the enclosing mask as 0/1 int32 lanes).  Only
// active lanes read memory; inactive lanes are 0.  A contiguous, fully active vector is one
// vector load; anything else goes lane by lane.
template <typename T>
inline tp::Vec<T> tp_masked_load(const T* p, int64_t base, int64_t stride, const tp::Vec<int32_t>& m, int n) {
  if (n == tp::Vec<T>::size && tp::reduce_min(m) != 0) {
    if (stride == 1) return tp::Vec<T>::load(p + base);
    if (stride == 0) return tp::Vec<T>(p[base]);
  }
  alignas(64) T t[tp::Vec<T>::size] = {};
  for (int k = 0; k < n; ++k)
    if (m[k]) t[k] = p[base + (int64_t)k * stride];
  return tp::Vec<T>::load(t);
}

inline tp::Vec<int32_t> tp_masked_load_bool(const bool* p, int64_t base, int64_t stride, const tp::Vec<int32_t>& m,
                                            int n) {
  alignas(64) int32_t t[tp::Vec<int32_t>::size] = {};
  for (int k = 0; k < n; ++k)
    if (m[k]) t[k] = p[base + (int64_t)k * stride] ? 1 : 0;
  return tp::Vec<int32_t>::load(t);
}

// p[off[k]] for the active lanes (off: per-lane element offsets, e.g. from checked indices); a
// fully active run of consecutive offsets (repeat/tile inside one period) is one vector load
template <typename T>
inline tp::Vec<T> tp_gather_off(const T* p, const tp::Vec<int64_t>& off, const tp::Vec<int32_t>& m, int n) {
  if (n == tp::Vec<T>::size && tp::reduce_min(m) != 0 &&
      tp::all(off - tp::Vec<int64_t>(off[0]) == tp::Vec<int64_t>::iota(0)))
    return tp::Vec<T>::load(p + off[0]);
  alignas(64) T t[tp::Vec<T>::size] = {};
  for (int k = 0; k < n; ++k)
    if (m[k]) t[k] = p[off[k]];
  return tp::Vec<T>::load(t);
}

// p[P[k]] for the first n lanes, P a compile-time lane pattern with 0 <= P[k] < 16: the lanes of
// a Mod/floor index of the vector variable inside one period (nearest upsampling floor(o/2): 0 0 1
// 1 2 2 ...; tile Mod(o, 3): 0 1 2 0 1 2 ...).  The generated code tests that the vector starts a
// period.  AVX-512: one masked load of the span the lanes use (it never touches memory past it)
// and one lane permute (two of each for 8-byte elements); a lane loop otherwise.
template <typename T, int... P>
inline tp::Vec<T> tp_pattern_load(const T* p, int n) {
  static_assert(sizeof...(P) == 16 && tp::Vec<T>::size <= 16, "a lane pattern has 16 entries");
  alignas(64) static constexpr int32_t pat[16] = {P...};
  int span = 0;
  for (int k = 0; k < n; ++k) span = pat[k] + 1 > span ? pat[k] + 1 : span;
#if defined(__AVX512F__)
  if constexpr (tp::Vec<T>::size == 16 && sizeof(T) == 4) {
    const __m512 a = _mm512_maskz_loadu_ps(__mmask16((1u << span) - 1u), p);
    tp::Vec<T> r;
    const __m512 v = _mm512_permutexvar_ps(_mm512_load_si512(pat), a);
    std::memcpy(&r, &v, sizeof(v));
    return r;
  }
  if constexpr (tp::Vec<T>::size == 16 && sizeof(T) == 8) {
    const unsigned m = (1u << span) - 1u;
    const __m512d lo = _mm512_maskz_loadu_pd(__mmask8(m & 0xFF), p), hi = _mm512_maskz_loadu_pd(__mmask8(m >> 8), p + 8);
    const __m512d v0 = _mm512_permutex2var_pd(lo, _mm512_cvtepi32_epi64(_mm256_load_si256((const __m256i*)pat)), hi);
    const __m512d v1 = _mm512_permutex2var_pd(lo, _mm512_cvtepi32_epi64(_mm256_load_si256((const __m256i*)(pat + 8))), hi);
    tp::Vec<T> r;
    std::memcpy(&r, &v0, sizeof(v0));
    std::memcpy(reinterpret_cast<char*>(&r) + sizeof(v0), &v1, sizeof(v1));
    return r;
  }
#endif
  (void)span;
  alignas(64) T t[tp::Vec<T>::size] = {};
  for (int k = 0; k < n; ++k) t[k] = p[pat[k]];
  return tp::Vec<T>::load(t);
}

inline tp::Vec<int32_t> tp_gather_off_bool(const bool* p, const tp::Vec<int64_t>& off, const tp::Vec<int32_t>& m,
                                           int n) {
  alignas(64) int32_t t[tp::Vec<int32_t>::size] = {};
  for (int k = 0; k < n; ++k)
    if (m[k]) t[k] = p[off[k]] ? 1 : 0;
  return tp::Vec<int32_t>::load(t);
}

// A data-dependent index checked against [0, size) (after adding size to negative values when
// wrap != 0).  Every bad lane becomes 0, so the load that follows stays inside the buffer
// (bounds.py proves it for indices in [0, size)); a bad *active* lane sets .bad and .value, and
// the kernel reports it: if (c.bad) tp_report_error(tp_index_text("IndexError: ...%lld...", c.value)).
struct TpIndexCheck {
  tp::Vec<int64_t> idx;
  bool bad;
  int64_t value;
};

template <typename T>
inline TpIndexCheck tp_check_index(const tp::Vec<T>& v, int64_t size, int wrap, const tp::Vec<int32_t>& m, int n) {
  alignas(64) int64_t t[tp::Vec<int64_t>::size];
  TpIndexCheck r{tp::Vec<int64_t>(), false, 0};
  for (int k = 0; k < tp::Vec<int64_t>::size; ++k) {
    const int64_t x = (int64_t)v[k];
    const int64_t y = (wrap && x < 0) ? x + size : x;
    const bool ok = y >= 0 && y < size;
    if (!ok && !r.bad && k < n && m[k] != 0) {
      r.bad = true;
      r.value = x;
    }
    t[k] = ok ? y : 0;
  }
  r.idx = tp::Vec<int64_t>::load(t);
  return r;
}

// The same index in every lane (a broadcast load): one scalar check
inline TpIndexCheck tp_check_index1(int64_t x, int64_t size, int wrap) {
  const int64_t y = (wrap && x < 0) ? x + size : x;
  const bool ok = y >= 0 && y < size;
  return TpIndexCheck{tp::Vec<int64_t>(ok ? y : 0), !ok, x};
}

// The error message of a bad index (fmt has one %lld), in a per-thread buffer that outlives the
// kernel call (tp_report_error keeps the pointer; the first report of a call wins).
inline const char* tp_index_text(const char* fmt, int64_t value) {
  static thread_local char text[384];
  std::snprintf(text, sizeof text, fmt, (long long)value);
  return text;
}
