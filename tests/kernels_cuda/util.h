// Test helpers for the CUDA kernels: the GpuTest fixture (skips without a device and owns a
// stream and a device arena), dtype-aware (F32/F16/BF16) uploads/downloads, rounding to a
// dtype, the host conversion of raw bits, and the element-wise check
// |x-ref| <= atol + rtol*|ref| in which any NaN fails.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_probe.h"
#include "kernels/cuda/resources.h"
#include "tolerance.h"

namespace flexh2o::gpu::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// 16-bit dtypes (F16, BF16) as raw bits.
inline uint16_t to_bits(float f, DType dt) { return dt == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f); }
inline float from_bits(uint16_t h, DType dt) { return dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h); }
// Values rounded to dt (F32: unchanged).
inline std::vector<float> round_to(std::vector<float> v, DType dt) {
  if (dt == DType::F32) return v;
  for (auto& x : v) x = from_bits(to_bits(x, dt), dt);
  return v;
}

// Raw bits of one F32/F16/BF16 element (16-bit dtypes in the low half) converted from `src`
// to `dst` by the host conversions of src/core/dtype.h; equal dtypes keep the bits.
inline uint32_t host_convert_bits(uint32_t bits, DType src, DType dst) {
  if (src == dst) return bits;
  float f;
  if (src == DType::F32)
    std::memcpy(&f, &bits, 4);
  else
    f = from_bits(uint16_t(bits), src);
  if (dst != DType::F32) return to_bits(f, dst);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// n random raw bit patterns of an F32/F16/BF16 element (NaNs, infs, subnormals included).
inline std::vector<uint32_t> random_bits(size_t n, DType dt, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = dt == DType::F32 ? uint32_t(g()) : uint32_t(g() & 0xffffu);
  return v;
}
inline std::vector<uint16_t> to_bits(const std::vector<float>& v, DType dt) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = to_bits(v[i], dt);
  return b;
}
inline const char* dt_str(DType dt) {
  return dt == DType::F16 ? "f16" : dt == DType::BF16 ? "bf16" : dt == DType::F32 ? "f32" : "other";
}

// Tolerances for outputs stored in dt (one rounding of the output plus fp32 accumulation): f16's,
// else bf16's, which an f32 output also gets (a bound, not its own rounding: give f32 its own).
struct Tol {
  float atol, rtol;
};
inline Tol tol_for(DType dt, float scale = 1.f) {
  return dt == DType::F16 ? Tol{2e-3f * scale, 4e-3f} : Tol{1.6e-2f * scale, 1.6e-2f};
}

// Counts elements failing within_tolerance (tolerance.h); reports a few.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, Tol t,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float x = got[i], r = ref[i];
    const bool ok = flexh2o::test::within_tolerance(x, r, t.atol, t.rtol);
    if (!ok && ++bad <= 5) ADD_FAILURE() << what << ": element " << i << " got " << x << " want " << r;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

// Bit-for-bit comparison of raw element bits; reports a few mismatches in hex.
inline void expect_bits_equal(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << std::hex << " got 0x" << got[i] << " want 0x" << want[i];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// Base fixture of every GPU test: skips (with the probe's reason) when no device is usable.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe p = probe_cuda();
    if (!p.available) GTEST_SKIP() << "no CUDA device: " << p.reason;
    stream_.emplace();
    DeviceArena::create(size_t(256) << 20, &arena_).throw_if_error();
  }
  cudaStream_t stream() const { return stream_->get(); }
  void sync() { stream_->synchronize(); }

  template <class T>
  T* alloc(size_t n) {
    T* p = nullptr;
    arena_.allocate_n(n ? n : 1, &p).throw_if_error();
    return p;
  }
  template <class T>
  T* upload_raw(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    // On the test's stream and waited for: a plain cudaMemcpy from pageable memory may return
    // before its DMA lands, and kernels on the non-blocking stream would not wait for it.
    if (!v.empty()) {
      FH_CUDA_CHECK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream()));
      sync();
    }
    return p;
  }
  template <class T>
  std::vector<T> download_raw(const T* p, size_t n) {
    sync();
    std::vector<T> v(n);
    if (n) FH_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // fp32 values -> dt (F32, F16 or BF16) on the device (values are rounded to dt).
  void* upload(const std::vector<float>& v, DType dt) {
    if (dt == DType::F32) return upload_raw(v);
    return upload_raw(to_bits(v, dt));
  }
  std::vector<float> download(const void* p, size_t n, DType dt) {
    if (dt == DType::F32) return download_raw(static_cast<const float*>(p), n);
    auto bits = download_raw(static_cast<const uint16_t*>(p), n);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = from_bits(bits[i], dt);
    return v;
  }
  // Raw bits (as from random_bits / host_convert_bits) <-> dt elements on the device.
  void* upload_bits(const std::vector<uint32_t>& b, DType dt) {
    if (dtype_size(dt) == 4) return upload_raw(b);
    return upload_raw(std::vector<uint16_t>(b.begin(), b.end()));
  }
  std::vector<uint32_t> download_bits(const void* p, size_t n, DType dt) {
    if (dtype_size(dt) == 4) return download_raw(static_cast<const uint32_t*>(p), n);
    auto h = download_raw(static_cast<const uint16_t*>(p), n);
    return std::vector<uint32_t>(h.begin(), h.end());
  }

  std::optional<Stream> stream_;
  DeviceArena arena_;
};

}  // namespace flexh2o::gpu::test
