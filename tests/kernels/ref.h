// Test helpers for the CPU kernels: deterministic random data, typed weight buffers,
// tolerance checks (|x-ref| <= atol + rtol*|ref|, NaN fails) and the ISA variants to cover.
// The references themselves are written next to each test in double precision.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/detail/isa.h"
#include "tolerance.h"

namespace flexh2o::cpu::test {

using detail::Isa;

inline std::vector<Isa> available_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (detail::isa_supported(i)) v.push_back(i);
  return v;
}
inline const char* isa_str(Isa i) { return i == Isa::kAvx512 ? "avx512" : i == Isa::kAvx2 ? "avx2" : "scalar"; }

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A weight tensor stored in `dt`, plus its exact fp32 values (after rounding to dt).
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  TensorView view;
};
inline Weights make_weights(DType dt, std::vector<int64_t> shape, uint32_t seed, float scale = 1.f) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  Weights w;
  w.values = randn(size_t(n), seed, scale);
  w.bytes.resize(size_t(n) * dtype_size(dt));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::F32) {
      std::memcpy(&w.bytes[size_t(i) * 4], &w.values[size_t(i)], 4);
    } else {
      uint16_t h = dt == DType::F16 ? f32_to_f16(w.values[size_t(i)]) : f32_to_bf16(w.values[size_t(i)]);
      w.values[size_t(i)] = dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      std::memcpy(&w.bytes[size_t(i) * 2], &h, 2);
    }
  }
  w.view.data = w.bytes.data();
  w.view.dtype = dt;
  w.view.shape.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) w.view.shape.dims[i] = shape[i];
  return w;
}

// Every element within_tolerance (tolerance.h). Reports the first few failures.
inline void expect_close(const float* x, const double* ref, size_t n, double atol, double rtol,
                         const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool ok = flexh2o::test::within_tolerance(x[i], ref[i], atol, rtol);
    if (!ok && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " = " << x[i] << ", reference " << ref[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements out of tolerance";
}

inline bool bit_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

}  // namespace flexh2o::cpu::test
