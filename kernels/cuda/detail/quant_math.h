// Private: the per-group 4-bit quantisation math shared bit-for-bit by the host reference
// (quant_host.cpp) and the CUDA kernels (quant.cu). Plain float operations only, in a fixed
// order, with no contractible multiply-add, so host and device round identically.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define FH_HD __host__ __device__ __forceinline__
#else
#define FH_HD inline
#endif

namespace flexh2o::gpu::detail {

constexpr float kQuantMaxScale = 65504.f;           // largest finite fp16
constexpr float kQuantMinScale = 6.103515625e-05f;  // smallest normal fp16, 2^-14

// 15/(mx-mn), clamped so it stays a finite, normal fp16 (mx == mn -> kQuantMaxScale).
FH_HD float quant_scale(float mn, float mx) {
  const float r = mx - mn;
  if (!(r > 0.f)) return kQuantMaxScale;
  const float s = 15.f / r;
  return s > kQuantMaxScale ? kQuantMaxScale : (s < kQuantMinScale ? kQuantMinScale : s);
}
// round-half-even(clamp((x - mn) * scale, 0, 15)); NaN -> 0.
FH_HD uint32_t quant_code(float x, float scale, float mn) {
  float q = (x - mn) * scale;
  if (!(q >= 0.f)) q = 0.f;
  if (q > 15.f) q = 15.f;
  return uint32_t(rintf(q));
}
FH_HD float dequant_code(uint32_t q, float scale, float mn) { return float(q) / scale + mn; }

}  // namespace flexh2o::gpu::detail
