// quantize_4bit / dequantize_4bit kernels (layout in quant.h). Quantise: one thread per
// (outer, group, inner), two passes over its group (min/max, then codes); consecutive threads
// take consecutive `inner`, so weight groups (group_dim 0) read coalesced. Dequantise: one
// thread per output element.
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/quant_math.h"
#include "kernels/cuda/quant.h"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

template <class T>
__global__ void quantize_kernel(const QuantLayout l, int64_t G, const T* x, uint8_t* codes, __half* meta) {
  const int64_t gs = l.group_size, half = G * gs / 2;
  const int64_t n = l.outer * G * l.inner;
  for (int64_t idx = detail::global_tid(); idx < n; idx += detail::grid_stride()) {
    const int64_t i = idx % l.inner, g = (idx / l.inner) % G, o = idx / (l.inner * G);
    auto at = [&](int64_t k) {
      const int64_t li = g * gs + k;
      return li < l.len ? detail::exact_f(x[(o * l.len + li) * l.inner + i]) : 0.f;
    };
    float mn = at(0), mx = mn;
    for (int64_t k = 1; k < gs; ++k) {
      const float v = at(k);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    // Bit-level widening and rounding as in core/dtype.h, not the cvt intrinsics: they agree
    // except on NaN, which cvt makes canonical (a NaN first element makes mn NaN, and its meta).
    const __half sh = detail::round_f<__half>(detail::quant_scale(mn, mx)), mh = detail::round_f<__half>(mn);
    const float sc = __half2float(sh), m = __half2float(mh);
    meta[((o * G + g) * 2 + 0) * l.inner + i] = sh;
    meta[((o * G + g) * 2 + 1) * l.inner + i] = mh;
    for (int64_t k = 0; k < gs; k += 2) {
      const uint32_t hi = detail::quant_code(at(k), sc, m), lo = detail::quant_code(at(k + 1), sc, m);
      codes[(o * half + (g * gs + k) / 2) * l.inner + i] = uint8_t(hi << 4 | lo);
    }
  }
}

template <class T>
__global__ void dequantize_kernel(const QuantLayout l, int64_t G, const uint8_t* codes, const __half* meta,
                                  T* out) {
  const int64_t half = G * l.group_size / 2;
  const int64_t n = l.outer * l.len * l.inner;
  for (int64_t idx = detail::global_tid(); idx < n; idx += detail::grid_stride()) {
    const int64_t i = idx % l.inner, li = (idx / l.inner) % l.len, o = idx / (l.inner * l.len);
    const int64_t g = li / l.group_size;
    const uint32_t byte = codes[(o * half + li / 2) * l.inner + i];
    const uint32_t q = (li & 1) ? (byte & 15u) : (byte >> 4);
    const float sc = __half2float(meta[((o * G + g) * 2 + 0) * l.inner + i]);
    const float m = __half2float(meta[((o * G + g) * 2 + 1) * l.inner + i]);
    out[idx] = from_f<T>(detail::dequant_code(q, sc, m));
  }
}

void check_layout(const QuantLayout& l, const char* op) {
  FH_CHECK(l.outer >= 0 && l.len >= 0 && l.inner >= 0, op, ": bad layout");
  FH_CHECK(l.group_size > 0 && l.group_size % 2 == 0, op, ": group_size ", l.group_size,
           " must be positive and even");
}

}  // namespace

void quantize_4bit(const QuantLayout& l, DType dt, const void* x, uint8_t* codes, void* meta,
                   cudaStream_t stream) {
  check_layout(l, "quantize_4bit");
  const int64_t n = l.outer * l.groups() * l.inner;
  if (n == 0) return;
  FH_CHECK(x && codes && meta, "quantize_4bit: null pointer");
  detail::dispatch_half(dt, "quantize_4bit", [&](auto tag) {
    using E = decltype(tag);
    quantize_kernel<E><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
        l, l.groups(), static_cast<const E*>(x), codes, static_cast<__half*>(meta));
    FH_CUDA_LAUNCH_CHECK("quantize_4bit", stream);
  });
}

void dequantize_4bit(const QuantLayout& l, const uint8_t* codes, const void* meta, DType dt, void* out,
                     cudaStream_t stream) {
  check_layout(l, "dequantize_4bit");
  const int64_t n = l.numel();
  if (n == 0) return;
  FH_CHECK(codes && meta && out, "dequantize_4bit: null pointer");
  detail::dispatch_half(dt, "dequantize_4bit", [&](auto tag) {
    using E = decltype(tag);
    dequantize_kernel<E><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
        l, l.groups(), codes, static_cast<const __half*>(meta), static_cast<E*>(out));
    FH_CUDA_LAUNCH_CHECK("dequantize_4bit", stream);
  });
}

}  // namespace flexh2o::gpu
