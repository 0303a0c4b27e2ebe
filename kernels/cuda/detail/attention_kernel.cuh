// Private: the attention kernel of attention.h and its launcher, templated on the activation
// type TQ (q, out), the KV type TKV (k, v) and head_dim. Included only by the instantiation
// files attention_f16.cu / attention_bf16.cu (one per activation dtype, so nvcc runs them in
// parallel); attention.cu's dispatch point calls the explicit instantiations made there.
#pragma once

#include "kernels/cuda/attention.h"
#include "kernels/cuda/detail/common.cuh"

namespace flexh2o::gpu::detail {

constexpr int kAttnThreads = 128, kAttnWarps = kAttnThreads / 32;

// Pointers and sizes of AttentionArgs as a plain kernel parameter.
struct AttentionView {
  const void *q, *k, *v;
  void* out;
  float* key_scores;
  const int32_t* seq_keys;
  int64_t q_stride, out_stride, tq, n_heads, kv_heads, capacity, max_keys;
  float scale;
};

// One 128-thread block per (query row, head, sequence). The row's scores stay in shared
// memory (fp32), so one pass gives exact probabilities for key_scores; warps split the keys,
// each lane holds head_dim/32 consecutive elements of q and of the running output. K and V
// are widened to fp32 on load whatever TKV is.
// Correctness-first: a flash-decoding split over keys is the next step for long contexts.
// Shared memory: q [HD] | scores [max_keys] | per-warp output partials [warps][HD] | red[32].
template <class TQ, class TKV, int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttentionView a) {
  constexpr int E = HD / 32;  // elements per lane
  extern __shared__ float smem[];
  float* qs = smem;
  float* sc = qs + HD;
  float* part = sc + a.max_keys;
  float* red = part + kAttnWarps * HD;
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n_b = a.seq_keys[b];
  const int64_t slot = n_b - a.tq + t;
  TQ* out = static_cast<TQ*>(a.out) + (b * a.tq + t) * a.out_stride + h * HD;
  if (slot < 0 || n_b > a.max_keys) {  // padding row (zeros) or contract violation (NaN)
    const float fill = slot < 0 ? 0.f : NAN;
    for (int d = threadIdx.x; d < HD; d += kAttnThreads) out[d] = from_f<TQ>(fill);
    return;
  }
  const int64_t nk = slot + 1;
  const int64_t g = h / (a.n_heads / a.kv_heads);
  const TKV* kb = static_cast<const TKV*>(a.k) + (b * a.kv_heads + g) * a.capacity * HD;
  const TKV* vb = static_cast<const TKV*>(a.v) + (b * a.kv_heads + g) * a.capacity * HD;
  const TQ* q = static_cast<const TQ*>(a.q) + (b * a.tq + t) * a.q_stride + h * HD;
  for (int d = threadIdx.x; d < HD; d += kAttnThreads) qs[d] = to_f(q[d]);
  __syncthreads();

  // scores: warp w takes keys w, w+4, ...; lane covers elements [lane*E, lane*E+E)
  float qr[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = qs[lane * E + e];
  float mx = -INFINITY;
  for (int64_t j = warp; j < nk; j += kAttnWarps) {
    const TKV* kr = kb + j * HD + lane * E;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s += qr[e] * to_f(kr[e]);
    s = warp_sum(s) * a.scale;
    if (lane == 0) sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_reduce<true>(mx, red);  // (its __syncthreads also publishes sc)
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < nk; j += kAttnThreads) {
    const float p = expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  const float inv = 1.f / block_reduce<false>(sum, red);
  if (a.key_scores) {
    float* ks = a.key_scores + (b * a.n_heads + h) * a.capacity;
    for (int64_t j = threadIdx.x; j < nk; j += kAttnThreads) atomicAdd(ks + j, sc[j] * inv);
  }

  // output: warp w accumulates keys w, w+4, ... into E registers per lane, then warps combine
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t j = warp; j < nk; j += kAttnWarps) {
    const TKV* vr = vb + j * HD + lane * E;
    const float p = sc[j];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += p * to_f(vr[e]);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) part[warp * HD + lane * E + e] = acc[e];
  __syncthreads();
  for (int d = threadIdx.x; d < HD; d += kAttnThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += part[w * HD + d];
    out[d] = from_f<TQ>(o * inv);
  }
}

// Launches attention_kernel<TQ, TKV, HD> for arguments attention() has already checked.
template <class TQ, class TKV, int HD>
void launch_attention(const AttentionArgs& a, int64_t max_keys, cudaStream_t stream) {
  const size_t smem = sizeof(float) * size_t(HD + max_keys + kAttnWarps * HD + 32);
  int dev = 0, optin = 0;
  FH_CUDA_CHECK(cudaGetDevice(&dev));
  FH_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FH_CHECK(smem <= size_t(optin), "attention: ", max_keys, " keys need ", smem,
           " bytes of shared memory, more than this device's ", optin,
           " (long-context attention is not implemented on CUDA yet)");
  if (smem > 48 * 1024)
    FH_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<TQ, TKV, HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const AttentionView v{a.q,        a.k,        a.v,  a.out,     a.key_scores, a.seq_keys, a.q_stride,
                        a.out_stride, a.tq,     a.n_heads, a.kv_heads, a.capacity, max_keys,  a.scale};
  const dim3 grid(unsigned(a.tq), unsigned(a.n_heads), unsigned(a.batch));
  attention_kernel<TQ, TKV, HD><<<grid, kAttnThreads, smem, stream>>>(v);
  FH_CUDA_LAUNCH_CHECK("attention", stream);
}

}  // namespace flexh2o::gpu::detail
