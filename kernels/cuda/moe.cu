// Mixture-of-experts CUDA ops of ops.h: routing (as cpu::moe_route), grouping the chosen
// (row, weight) pairs by expert, and the weighted scatter-add of an expert's output rows into an
// fp32 sum (and a shared expert's, gated), then that sum into the hidden rows. One thread per row for the routing (a row's
// logits are few); counting and placing use atomics, so the order within an expert's group is
// not fixed (each row's result does not depend on it).
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/ops.h"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

constexpr int64_t kMaxExperts = 1024, kMaxChosen = 64;

// Softmax of row r's logits, then k rounds of picking the largest unchosen p (strictly larger
// wins, so ties go to the lower expert; NaN only when nothing else is left).
__global__ void moe_route_kernel(const float* logits, int64_t M, int64_t E, int64_t k, bool normalize,
                                 int32_t* experts, float* weights) {
  for (int64_t r = detail::global_tid(); r < M; r += detail::grid_stride()) {
    const float* l = logits + r * E;
    float mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - mx);
    uint32_t chosen[kMaxExperts / 32] = {};
    float ps[kMaxChosen];
    float chosen_sum = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      float bp = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        if (chosen[e / 32] >> (e % 32) & 1u) continue;
        const float p = expf(l[e] - mx) / sum;
        if (best < 0 || (!isnan(p) && (isnan(bp) || p > bp))) best = e, bp = p;
      }
      chosen[best / 32] |= 1u << (best % 32);
      experts[r * k + j] = int32_t(best);
      ps[j] = bp;
      chosen_sum += bp;
    }
    for (int64_t j = 0; j < k; ++j) weights[r * k + j] = normalize ? ps[j] / chosen_sum : ps[j];
  }
}

__global__ void moe_count_kernel(const int32_t* experts, int64_t n, int32_t* counts) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) atomicAdd(&counts[experts[i]], 1);
}

// Exclusive prefix sum of counts into offsets (one thread: E is at most 1024).
__global__ void moe_offsets_kernel(const int32_t* counts, int64_t E, int32_t* offsets) {
  if (detail::global_tid() != 0) return;
  int32_t at = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e] = at, at += counts[e];
}

__global__ void moe_place_kernel(const int32_t* experts, const float* weights, int64_t n, int64_t k,
                                 const int32_t* offsets, int32_t* cursor, int32_t* rows, float* row_w) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int32_t e = experts[i];
    const int32_t at = offsets[e] + atomicAdd(&cursor[e], 1);
    rows[at] = int32_t(i / k);
    row_w[at] = weights[i];
  }
}

template <class T>
__global__ void moe_scatter_add_kernel(const T* y, const int32_t* rows, const float* row_w, int64_t n, int64_t H,
                                       float* sum) {
  const int64_t total = n * H;
  for (int64_t i = detail::global_tid(); i < total; i += detail::grid_stride()) {
    const int64_t g = i / H, d = i % H;
    sum[int64_t(rows[g]) * H + d] += row_w[g] * to_f(y[i]);
  }
}

template <class T>
__global__ void moe_gated_add_kernel(const T* y, const float* gate, int64_t M, int64_t H, float* sum) {
  const int64_t n = M * H;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride())
    sum[i] += to_f(y[i]) / (1.f + expf(-gate[i / H]));
}

template <class T>
__global__ void add_f32_kernel(T* x, const float* sum, int64_t n) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) x[i] = from_f<T>(to_f(x[i]) + sum[i]);
}

}  // namespace

void moe_route(const float* logits, int64_t M, int64_t E, int64_t k, bool normalize, int32_t* experts,
               float* weights, cudaStream_t stream) {
  FH_CHECK(M >= 0 && E >= 1 && E <= kMaxExperts && k >= 1 && k <= E && k <= kMaxChosen, "moe_route: ", k, " of ", E,
           " experts over ", M, " rows (at most ", kMaxExperts, " experts, ", kMaxChosen, " chosen)");
  if (M == 0) return;
  FH_CHECK(logits && experts && weights, "moe_route: null pointer");
  moe_route_kernel<<<detail::grid_size_1d(M), detail::kThreads, 0, stream>>>(logits, M, E, k, normalize, experts,
                                                                              weights);
  FH_CUDA_LAUNCH_CHECK("moe_route", stream);
}

void moe_group(const int32_t* experts, const float* weights, int64_t M, int64_t k, int64_t E, int32_t* counts,
               int32_t* work, int32_t* rows, float* row_w, cudaStream_t stream) {
  FH_CHECK(M >= 0 && k >= 1 && E >= 1 && E <= kMaxExperts, "moe_group: bad sizes M=", M, " k=", k, " E=", E);
  FH_CHECK(experts && weights && counts && work && rows && row_w, "moe_group: null pointer");
  const int64_t n = M * k;
  FH_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * sizeof(int32_t), stream));
  FH_CUDA_CHECK(cudaMemsetAsync(work, 0, size_t(2 * E) * sizeof(int32_t), stream));
  if (n == 0) return;
  int32_t *offsets = work, *cursor = work + E;
  moe_count_kernel<<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(experts, n, counts);
  FH_CUDA_LAUNCH_CHECK("moe_group (count)", stream);
  moe_offsets_kernel<<<1, 32, 0, stream>>>(counts, E, offsets);
  FH_CUDA_LAUNCH_CHECK("moe_group (offsets)", stream);
  moe_place_kernel<<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(experts, weights, n, k, offsets, cursor,
                                                                              rows, row_w);
  FH_CUDA_LAUNCH_CHECK("moe_group (place)", stream);
}

void moe_scatter_add(DType dt, const void* y, const int32_t* rows, const float* row_w, int64_t n, int64_t H,
                     float* sum, cudaStream_t stream) {
  FH_CHECK(n >= 0 && H > 0, "moe_scatter_add: bad sizes n=", n, " H=", H);
  if (n == 0) return;
  FH_CHECK(y && rows && row_w && sum, "moe_scatter_add: null pointer");
  detail::dispatch_half(dt, "moe_scatter_add", [&](auto tag) {
    using T = decltype(tag);
    moe_scatter_add_kernel<T><<<detail::grid_size_1d(n * H), detail::kThreads, 0, stream>>>(
        static_cast<const T*>(y), rows, row_w, n, H, sum);
    FH_CUDA_LAUNCH_CHECK("moe_scatter_add", stream);
  });
}

void moe_gated_add(DType dt, const void* y, const float* gate, int64_t M, int64_t H, float* sum, cudaStream_t stream) {
  FH_CHECK(M >= 0 && H > 0, "moe_gated_add: bad sizes M=", M, " H=", H);
  if (M == 0) return;
  FH_CHECK(y && gate && sum, "moe_gated_add: null pointer");
  detail::dispatch_half(dt, "moe_gated_add", [&](auto tag) {
    using T = decltype(tag);
    moe_gated_add_kernel<T><<<detail::grid_size_1d(M * H), detail::kThreads, 0, stream>>>(static_cast<const T*>(y),
                                                                                          gate, M, H, sum);
    FH_CUDA_LAUNCH_CHECK("moe_gated_add", stream);
  });
}

void add_f32(DType dt, void* x, const float* sum, int64_t n, cudaStream_t stream) {
  FH_CHECK(n >= 0, "add_f32: bad size ", n);
  if (n == 0) return;
  FH_CHECK(x && sum, "add_f32: null pointer");
  detail::dispatch_half(dt, "add_f32", [&](auto tag) {
    using T = decltype(tag);
    add_f32_kernel<T><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(static_cast<T*>(x), sum, n);
    FH_CUDA_LAUNCH_CHECK("add_f32", stream);
  });
}

}  // namespace flexh2o::gpu
