// Private: row conversions fp32 <-> f16/bf16 over a vector-traits type T, instantiated per
// ISA; the TBB driver is convert.cpp. Every element is converted on its own, bit-identical
// to the scalar reference in core/dtype.h (incl. subnormals, inf, NaN payloads).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/detail/rows_impl.h"

namespace flexh2o::cpu::detail {

template <class T>
inline typename T::V load_exact(const bf16_t* p) { return T::load(p); }  // a shift: exact
template <class T>
inline typename T::V load_exact(const half_t* p) { return T::load_exact(p); }
template <class T>
inline typename T::V load_exact(const float* p) { return T::load(p); }

// dst[i] = convert(src[i]) for i < n. The tail goes through a zero-padded local vector, so
// no memory outside [0, n) is touched and every element takes the same path.
template <class T, class S, class D>
void convert_run(const S* src, int64_t n, D* dst) {
  constexpr int L = T::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) T::store(dst + i, load_exact<T>(src + i));
  if (i < n) {
    S in[L] = {};
    D out[L];
    std::memcpy(in, src + i, size_t(n - i) * sizeof(S));
    T::store(out, load_exact<T>(in));
    std::memcpy(dst + i, out, size_t(n - i) * sizeof(D));
  }
}

// dtype is F32, F16 or BF16 (checked by the driver). F32 -> F32 is a copy (keeps NaN bits).
template <class T>
void to_f32(DType dtype, const void* src, int64_t n, float* dst) {
  switch (dtype) {
    case DType::F16: return convert_run<T>(static_cast<const half_t*>(src), n, dst);
    case DType::BF16: return convert_run<T>(static_cast<const bf16_t*>(src), n, dst);
    default: std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
}

template <class T>
void from_f32(const float* src, int64_t n, DType dtype, void* dst) {
  switch (dtype) {
    case DType::F16: return convert_run<T>(src, n, static_cast<half_t*>(dst));
    case DType::BF16: return convert_run<T>(src, n, static_cast<bf16_t*>(dst));
    default: std::memcpy(dst, src, size_t(n) * sizeof(float));
  }
}

// Q4 records [rows] of cols -> fp32 rows at dst + r*dst_stride, each element as the linear
// and attention loads decode it (so bit-identical to q4::decode_rows).
template <class T>
void q4_decode(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  const Q4Row first = first_row<q4_t>(src, cols);
  for (int64_t r = 0; r < rows; ++r) q4_decode_span<T>(row_at(first, r, cols), 0, cols, dst + r * dst_stride);
}

}  // namespace flexh2o::cpu::detail
