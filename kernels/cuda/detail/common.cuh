// Private to kernels/cuda .cu files: element conversions, launch-geometry helpers, block
// reductions and the dtype dispatch helpers. Device code; never include from a public header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/detail/convert_math.h"

namespace flexh2o::gpu::detail {

// ---- conversions ------------------------------------------------------------------------
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(float x) { return x; }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Storage conversions bit-identical to the host ones in src/core/dtype.h, NaN payloads
// included (detail/convert_math.h): write_kv and convert use these, not the cvt intrinsics.
__device__ __forceinline__ float exact_f(__half x) { return f16_bits_to_f32(__half_as_ushort(x)); }
__device__ __forceinline__ float exact_f(__nv_bfloat16 x) { return bf16_bits_to_f32(__bfloat16_as_ushort(x)); }
__device__ __forceinline__ float exact_f(float x) { return x; }
template <class D>
__device__ __forceinline__ D round_f(float x);
template <>
__device__ __forceinline__ __half round_f<__half>(float x) { return __ushort_as_half(f32_to_f16_bits(x)); }
template <>
__device__ __forceinline__ __nv_bfloat16 round_f<__nv_bfloat16>(float x) {
  return __ushort_as_bfloat16(f32_to_bf16_bits(x));
}
template <>
__device__ __forceinline__ float round_f<float>(float x) { return x; }
// S -> D: a plain copy when the types match, else widen exactly and round once (RNE).
template <class D, class S>
__device__ __forceinline__ D convert_elem(S x) {
  if constexpr (std::is_same_v<D, S>)
    return x;
  else
    return round_f<D>(exact_f(x));
}

// ---- launch geometry --------------------------------------------------------------------
constexpr int kThreads = 256;
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned grid_size_1d(int64_t n, int threads = kThreads) {
  const int64_t g = ceil_div(n, threads);
  return unsigned(g < 1 ? 1 : (g > (int64_t(1) << 20) ? (int64_t(1) << 20) : g));
}
__device__ __forceinline__ int64_t global_tid() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// ---- reductions -------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (or max) over the block; every thread gets the result. `red` holds >= 32 floats.
// Contains __syncthreads: call from all threads.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // red may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? warp_max(r) : warp_sum(r);
}

// ---- dispatch ---------------------------------------------------------------------------
// The one dtype dispatch point: calls f(T{}) with T = __half or __nv_bfloat16.
template <class F>
void dispatch_half(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F16: f(__half{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    default:
      FH_FAIL(op, ": unsupported dtype ", dtype_name(dt), " on CUDA (supported: F16, BF16)");
  }
}

// Maps F32 / F16 / BF16 to f(float{}), f(__half{}), f(__nv_bfloat16{}) and returns true;
// false for any other dtype. A helper for the dispatch points of families that take F32
// (each family states its own supported list and error).
template <class F>
bool dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: f(float{}); return true;
    case DType::F16: f(__half{}); return true;
    case DType::BF16: f(__nv_bfloat16{}); return true;
    default: return false;
  }
}

inline void check_i32(int64_t v, const char* what, const char* op) {
  FH_CHECK(v >= 0 && v <= INT32_MAX, op, ": ", what, "=", v, " is outside [0, 2^31)");
}

}  // namespace flexh2o::gpu::detail
