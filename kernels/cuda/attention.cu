// KV-cache kernels of attention.h: write_kv, attention and kv_gather.
// attention: one 128-thread block per (query row, head, sequence). The row's scores stay in
// shared memory (fp32), so one pass gives exact probabilities for key_scores; warps split the
// keys, each lane holds head_dim/32 consecutive elements of q and of the running output.
// Correctness-first: a flash-decoding split over keys is the next step for long contexts.
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/detail/common.cuh"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

constexpr int kAttnThreads = 128, kAttnWarps = kAttnThreads / 32;

// ---- write_kv ---------------------------------------------------------------------------

template <class T>
__global__ void write_kv_kernel(const T* src, int64_t src_stride, int64_t B, int64_t T_, int64_t kvh,
                                int64_t hd, T* cache, int64_t capacity, const int32_t* seq_keys) {
  const int64_t row = kvh * hd, n = B * T_ * row;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int64_t e = i % row, bt = i / row, b = bt / T_, t = bt % T_;
    const int64_t slot = int64_t(seq_keys[b]) - T_ + t;
    if (slot < 0 || slot >= capacity) continue;
    const int64_t h = e / hd, d = e % hd;
    cache[((b * kvh + h) * capacity + slot) * hd + d] = src[bt * src_stride + e];
  }
}

// ---- attention --------------------------------------------------------------------------

// Shared memory: q*scale [HD] | scores [max_keys] | per-warp output partials [warps][HD] | red[32].
template <class T, int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttentionArgs a, int64_t max_keys) {
  constexpr int E = HD / 32;  // elements per lane
  extern __shared__ float smem[];
  float* qs = smem;
  float* sc = qs + HD;
  float* part = sc + max_keys;
  float* red = part + kAttnWarps * HD;
  const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n_b = a.seq_keys[b];
  const int64_t slot = n_b - a.tq + t;
  T* out = static_cast<T*>(a.out) + (b * a.tq + t) * a.out_stride + h * HD;
  if (slot < 0 || n_b > max_keys) {  // padding row (zeros) or contract violation (NaN)
    const float fill = slot < 0 ? 0.f : NAN;
    for (int d = threadIdx.x; d < HD; d += kAttnThreads) out[d] = from_f<T>(fill);
    return;
  }
  const int64_t nk = slot + 1;
  const int64_t g = h / (a.n_heads / a.kv_heads);
  const T* kb = static_cast<const T*>(a.k) + (b * a.kv_heads + g) * a.capacity * HD;
  const T* vb = static_cast<const T*>(a.v) + (b * a.kv_heads + g) * a.capacity * HD;
  const T* q = static_cast<const T*>(a.q) + (b * a.tq + t) * a.q_stride + h * HD;
  for (int d = threadIdx.x; d < HD; d += kAttnThreads) qs[d] = to_f(q[d]);
  __syncthreads();

  // scores: warp w takes keys w, w+4, ...; lane covers elements [lane*E, lane*E+E)
  float qr[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = qs[lane * E + e];
  float mx = -INFINITY;
  for (int64_t j = warp; j < nk; j += kAttnWarps) {
    const T* kr = kb + j * HD + lane * E;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s += qr[e] * to_f(kr[e]);
    s = detail::warp_sum(s) * a.scale;
    if (lane == 0) sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = detail::block_reduce<true>(mx, red);  // (its __syncthreads also publishes sc)
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < nk; j += kAttnThreads) {
    const float p = expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  const float inv = 1.f / detail::block_reduce<false>(sum, red);
  if (a.key_scores) {
    float* ks = a.key_scores + (b * a.n_heads + h) * a.capacity;
    for (int64_t j = threadIdx.x; j < nk; j += kAttnThreads) atomicAdd(ks + j, sc[j] * inv);
  }

  // output: warp w accumulates keys w, w+4, ... into E registers per lane, then warps combine
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t j = warp; j < nk; j += kAttnWarps) {
    const T* vr = vb + j * HD + lane * E;
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
    out[d] = from_f<T>(o * inv);
  }
}

template <class T, int HD>
void launch_attention(const AttentionArgs& a, int64_t max_keys, cudaStream_t stream) {
  const size_t smem = sizeof(float) * size_t(HD + max_keys + kAttnWarps * HD + 32);
  int dev = 0, optin = 0;
  FH_CUDA_CHECK(cudaGetDevice(&dev));
  FH_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FH_CHECK(smem <= size_t(optin), "attention: ", max_keys, " keys need ", smem,
           " bytes of shared memory, more than this device's ", optin,
           " (long-context attention is not implemented on CUDA yet)");
  if (smem > 48 * 1024)
    FH_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<T, HD>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(a.tq), unsigned(a.n_heads), unsigned(a.batch));
  attention_kernel<T, HD><<<grid, kAttnThreads, smem, stream>>>(a, max_keys);
  FH_CUDA_LAUNCH_CHECK("attention", stream);
}

// The one dispatch point of the attention family: dtype x head_dim, explicit list.
template <class F>
bool dispatch_attention(DType dt, int64_t head_dim, F&& f) {
  auto by_dim = [&](auto tag) {
    using T = decltype(tag);
    switch (head_dim) {
      case 64: f(T{}, std::integral_constant<int, 64>{}); return true;
      case 128: f(T{}, std::integral_constant<int, 128>{}); return true;
      default: return false;
    }
  };
  switch (dt) {
    case DType::F16: return by_dim(__half{});
    case DType::BF16: return by_dim(__nv_bfloat16{});
    default: return false;
  }
}

// ---- kv_gather --------------------------------------------------------------------------

// One thread per (row, element) walks i upwards: with i <= keep[i], slot keep[i] has not been
// written yet when it is read (writes so far went to slots < i), so every read sees old data.
template <class U>
__global__ void kv_gather_kernel(U* buf, int64_t rows, int64_t capacity, int64_t row,
                                 const int32_t* keep, int64_t keep_stride, const int32_t* keep_count) {
  const int64_t n = rows * row;
  for (int64_t idx = detail::global_tid(); idx < n; idx += detail::grid_stride()) {
    const int64_t e = idx % row, r = idx / row;
    U* base = buf + r * capacity * row + e;
    const int32_t* kp = keep + r * keep_stride;
    const int64_t m = min(int64_t(keep_count[r]), min(capacity, keep_stride));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t s = kp[i];
      if (s > i && s < capacity) base[i * row] = base[s * row];
    }
  }
}

}  // namespace

void write_kv(DType dt, const void* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, void* cache, int64_t capacity, const int32_t* seq_keys,
              cudaStream_t stream) {
  FH_CHECK(B >= 0 && T >= 0 && kv_heads > 0 && head_dim > 0 && capacity >= 0,
           "write_kv: bad sizes");
  FH_CHECK(src_stride >= kv_heads * head_dim, "write_kv: src_stride ", src_stride,
           " < kv_heads*head_dim");
  if (B == 0 || T == 0) return;
  FH_CHECK(src && cache && seq_keys, "write_kv: null pointer");
  detail::dispatch_half(dt, "write_kv", [&](auto tag) {
    using E = decltype(tag);
    write_kv_kernel<E><<<detail::grid_size_1d(B * T * kv_heads * head_dim), detail::kThreads, 0, stream>>>(
        static_cast<const E*>(src), src_stride, B, T, kv_heads, head_dim, static_cast<E*>(cache),
        capacity, seq_keys);
    FH_CUDA_LAUNCH_CHECK("write_kv", stream);
  });
}

bool attention_supported(DType dt, int64_t head_dim) {
  return dispatch_attention(dt, head_dim, [](auto, auto) {});
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
  FH_CHECK(a.batch >= 0 && a.tq >= 0 && a.n_heads > 0 && a.kv_heads > 0 && a.head_dim > 0,
           "attention: bad sizes");
  FH_CHECK(a.n_heads % a.kv_heads == 0, "attention: n_heads ", a.n_heads,
           " is not a multiple of kv_heads ", a.kv_heads);
  FH_CHECK(a.batch <= 65535 && a.n_heads <= 65535 && a.tq <= INT32_MAX,
           "attention: grid limits (batch, n_heads <= 65535)");
  const int64_t max_keys = a.max_keys > 0 ? a.max_keys : a.capacity;
  FH_CHECK(max_keys <= a.capacity, "attention: max_keys ", max_keys, " > capacity ", a.capacity);
  FH_CHECK(attention_supported(a.dtype, a.head_dim), "attention: unsupported dtype ",
           dtype_name(a.dtype), " / head_dim ", a.head_dim, " on CUDA (supported: F16, BF16 x 64, 128)");
  if (a.batch == 0 || a.tq == 0) return;
  FH_CHECK(a.q && a.k && a.v && a.out && a.seq_keys, "attention: null pointer");
  FH_CHECK(a.q_stride >= a.n_heads * a.head_dim && a.out_stride >= a.n_heads * a.head_dim,
           "attention: row stride smaller than n_heads*head_dim");
  dispatch_attention(a.dtype, a.head_dim, [&](auto tag, auto hd) {
    launch_attention<decltype(tag), decltype(hd)::value>(a, max_keys, stream);
  });
}

void kv_gather(DType dt, void* buf, int64_t B, int64_t heads, int64_t capacity, int64_t row_elems,
               const int32_t* keep, int64_t keep_stride, const int32_t* keep_count, cudaStream_t stream) {
  FH_CHECK(B >= 0 && heads > 0 && capacity >= 0 && row_elems > 0, "kv_gather: bad sizes");
  FH_CHECK(keep_stride >= 0, "kv_gather: negative keep_stride");
  if (B == 0 || capacity == 0 || keep_stride == 0) return;
  FH_CHECK(buf && keep && keep_count, "kv_gather: null pointer");
  const size_t es = dtype_size(dt);
  FH_CHECK(es == 2 || es == 4, "kv_gather: unsupported dtype ", dtype_name(dt),
           " (2- or 4-byte elements)");
  const int64_t rows = B * heads;
  const unsigned grid = detail::grid_size_1d(rows * row_elems);
  if (es == 2)
    kv_gather_kernel<uint16_t><<<grid, detail::kThreads, 0, stream>>>(
        static_cast<uint16_t*>(buf), rows, capacity, row_elems, keep, keep_stride, keep_count);
  else
    kv_gather_kernel<uint32_t><<<grid, detail::kThreads, 0, stream>>>(
        static_cast<uint32_t*>(buf), rows, capacity, row_elems, keep, keep_stride, keep_count);
  FH_CUDA_LAUNCH_CHECK("kv_gather", stream);
}

}  // namespace flexh2o::gpu
