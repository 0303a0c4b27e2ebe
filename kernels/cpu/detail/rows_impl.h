// Private: row handles, so one kernel template reads rows of f32/f16/bf16 elements and Q4
// records (core/quant4.h) alike: a plain row is a pointer to its first element, a Q4 row a
// Q4Row. Loads take the element offset k; for Q4, k is a multiple of the vector width L
// (which divides q4::kGroup), so a vector never straddles two groups and reads one {d, m}.
#pragma once

#include <cstdint>

#include "core/quant4.h"
#include "kernels/cpu/detail/isa.h"

namespace flexh2o::cpu::detail {

// RowOf<E>: the row handle type for element type E, and the handle of row 0 of a buffer.
template <class E>
struct RowOf {
  using R = const E*;
  static R first(const void* p, int64_t) { return static_cast<const E*>(p); }
};
template <>
struct RowOf<q4_t> {
  using R = Q4Row;
  static R first(const void* p, int64_t cols) { return {static_cast<const uint8_t*>(p), cols}; }
};
template <class E>
inline typename RowOf<E>::R first_row(const void* p, int64_t cols) { return RowOf<E>::first(p, cols); }

// Row j after `base` (rows of cols elements, contiguous).
template <class W>
inline const W* row_at(const W* base, int64_t j, int64_t cols) { return base + j * cols; }
inline Q4Row row_at(const Q4Row& base, int64_t j, int64_t cols) {
  return {base.rec + j * q4::row_bytes(cols), cols};
}

// Bytes of one row of cols elements, and the address (for prefetching) of element k.
template <class E>
inline int64_t row_size(int64_t cols) { return cols * int64_t(sizeof(E)); }
template <>
inline int64_t row_size<q4_t>(int64_t cols) { return q4::row_bytes(cols); }
template <class W>
inline const void* elem_addr(const W* row, int64_t k) { return row + k; }
inline const void* elem_addr(const Q4Row& row, int64_t k) { return row.rec + k / 2; }

// L elements from k (all in the row); load_tail: n in [1, L) elements, lanes >= n are 0.
template <class T, class W>
inline typename T::V wload(const W* row, int64_t k) { return T::load(row + k); }
template <class T, class W>
inline typename T::V wload_tail(const W* row, int64_t k, int n) { return T::load_tail(row + k, n); }
template <class T>
inline typename T::V wload(const Q4Row& row, int64_t k) {
  const uint8_t* meta = row.rec + q4::meta_offset(row.cols) + 4 * (k / q4::kGroup);
  return T::load_q4(row.rec + k / 2, meta);
}
template <class T>
inline typename T::V wload_tail(const Q4Row& row, int64_t k, int n) {
  const uint8_t* meta = row.rec + q4::meta_offset(row.cols) + 4 * (k / q4::kGroup);
  return T::load_q4_tail(row.rec + k / 2, meta, n);
}

}  // namespace flexh2o::cpu::detail
