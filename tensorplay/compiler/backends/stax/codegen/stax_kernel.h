// Helpers the Stax code generator emits on top of cpp_prelude.h (the vector library):
// bool values live in registers as 0/1 int32 lanes; bool tensors are 1 byte per element.
// Strided (non-unit-stride) loads and stores and tails of bool data go lane by lane.
#pragma once
#include "cpp_prelude.h"
#include <cstdint>
#include <limits>

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
