// layernorm() and rmsnorm(): fp32, one row at a time, parallel over rows when large.
// Row sums use 8 fixed partial lanes then a fixed tree, so a row's bits never depend on
// the other rows. Portable code (no ISA variants): these are a tiny share of a step.
#include <cmath>

#include "kernels/cpu/detail/rows.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {
namespace {

// Sum of f(x[i]) for i < n in a fixed order: 8 lane chains, then ((0+4)+(2+6))+((1+5)+(3+7)).
template <typename F>
float lane_sum(const float* x, int64_t n, F f) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += f(x[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] += f(x[i + l]);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace

void layernorm(const float* x, int64_t M, int64_t D, const TensorView& gamma,
               const TensorView& beta, float eps, float* y) {
  FH_CHECK(D > 0 && M >= 0, "layernorm: bad sizes M=", M, " D=", D);
  const std::vector<float> g = detail::vec_to_f32(gamma, D, "layernorm gamma");
  const std::vector<float> bt = detail::vec_to_f32(beta, D, "layernorm beta");
  detail::for_rows(M, D, [&](int64_t r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const float mean = lane_sum(xr, D, [](float v) { return v; }) / float(D);
    const float var = lane_sum(xr, D, [mean](float v) { return (v - mean) * (v - mean); }) / float(D);
    const float inv = 1.f / std::sqrt(var + eps);
    for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] - mean) * inv * g[i] + bt[i];
  });
}

namespace {

// y[r] (add: y[r] +=) x[r] / sqrt(mean(x[r]^2) + eps) * (gamma + offset) for each row r.
template <bool kAdd>
void rms_rows(const float* x, int64_t M, int64_t D, const TensorView& gamma, float eps, float offset, float* y) {
  FH_CHECK(D > 0 && M >= 0, "rmsnorm: bad sizes M=", M, " D=", D);
  std::vector<float> g = detail::vec_to_f32(gamma, D, "rmsnorm gamma");
  if (offset != 0.f)
    for (float& v : g) v = offset + v;
  detail::for_rows(M, D, [&](int64_t r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const float ms = lane_sum(xr, D, [](float v) { return v * v; }) / float(D);
    const float inv = 1.f / std::sqrt(ms + eps);
    for (int64_t i = 0; i < D; ++i) {
      if constexpr (kAdd)
        yr[i] += xr[i] * inv * g[i];
      else
        yr[i] = xr[i] * inv * g[i];
    }
  });
}

}  // namespace

void rmsnorm(const float* x, int64_t M, int64_t D, const TensorView& gamma, float eps, float* y, float gamma_offset) {
  rms_rows<false>(x, M, D, gamma, eps, gamma_offset, y);
}

void rmsnorm_add(const float* x, int64_t M, int64_t D, const TensorView& gamma, float eps, float gamma_offset,
                 float* y) {
  FH_CHECK(x != y || M == 0, "rmsnorm_add: x and y alias");
  rms_rows<true>(x, M, D, gamma, eps, gamma_offset, y);
}

}  // namespace flexh2o::cpu
