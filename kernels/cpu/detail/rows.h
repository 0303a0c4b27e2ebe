// Private helpers shared by the portable (non-ISA) ops: parallel-over-rows and conversion
// of small parameter vectors (gamma, beta, bias) to fp32. Baseline-ISA code only.
#pragma once

#include <tbb/parallel_for.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/quant4.h"
#include "core/tensor.h"

namespace flexh2o::cpu::detail {

// Runs f(row) for row in [0, rows); in parallel when rows*cost_per_row is large.
template <typename F>
void for_rows(int64_t rows, int64_t cost_per_row, F&& f) {
  if (rows * cost_per_row < (int64_t(1) << 15) || rows < 2) {
    for (int64_t r = 0; r < rows; ++r) f(r);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) f(i);
  });
}

inline float load_f32(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.as<float>()[i];
    case DType::F16: return f16_to_f32(t.as<uint16_t>()[i]);
    case DType::BF16: return bf16_to_f32(t.as<uint16_t>()[i]);
    default: FH_FAIL("tensor dtype ", dtype_name(t.dtype), " is not a float type");
  }
}

// Converts row `row` (of length n) of a 2-D float or Q4 tensor into out[0, n).
inline void row_to_f32(const TensorView& t, int64_t row, int64_t n, float* out) {
  const int64_t base = row * n;
  switch (t.dtype) {
    case DType::Q4:
      return q4::decode_rows(t.as<uint8_t>() + row * q4::row_bytes(n), 1, n, out, n);
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) out[i] = t.as<float>()[base + i];
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(t.as<uint16_t>()[base + i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(t.as<uint16_t>()[base + i]);
      return;
    default: FH_FAIL("tensor dtype ", dtype_name(t.dtype), " is not a float type");
  }
}

inline std::vector<float> vec_to_f32(const TensorView& t, int64_t n, const char* what) {
  FH_CHECK(t.data && t.numel() == n, what, " has ", t.numel(), " elements, expected ", n);
  std::vector<float> out(static_cast<size_t>(n));
  row_to_f32(t, 0, n, out.data());
  return out;
}

}  // namespace flexh2o::cpu::detail
