// KV-cache kernels of attention.h: write_kv (converting to the cache dtype), attention
// (templated on activation type, KV type and head_dim; one dispatch point) and kv_gather.
#include <algorithm>
#include <type_traits>

#include "core/quant4.h"
#include "core/tensor.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/q4_math.h"
#include "kernels/cuda/q4.h"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

// ---- write_kv ---------------------------------------------------------------------------

template <class S, class D>
__global__ void write_kv_kernel(const S* src, int64_t src_stride, int64_t B, int64_t T_, int64_t kvh,
                                int64_t hd, D* cache, int64_t capacity, const int32_t* seq_keys) {
  const int64_t row = kvh * hd, n = B * T_ * row;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int64_t e = i % row, bt = i / row, b = bt / T_, t = bt % T_;
    const int64_t slot = int64_t(seq_keys[b]) - T_ + t;
    if (slot < 0 || slot >= capacity) continue;
    const int64_t h = e / hd, d = e % hd;
    cache[((b * kvh + h) * capacity + slot) * hd + d] = detail::convert_elem<D>(src[bt * src_stride + e]);
  }
}

// ---- attention --------------------------------------------------------------------------

constexpr int kAttnThreads = 128, kAttnWarps = kAttnThreads / 32;

// Tag type of a Q4 cache (core/quant4.h records of head_dim) in the attention templates.
struct Q4Kv {};

// One cache row (slot) as the attention kernel reads it: kBytes per row; load() widens lane's
// HD/32 consecutive elements to fp32 (a Q4 row decodes them in registers with the format's
// fmaf: the cache is never materialised in another dtype).
template <class TKV, int HD>
struct KvRow {
  static constexpr int64_t kBytes = int64_t(sizeof(TKV)) * HD;
  __device__ static void load(const std::byte* row, int lane, float (&x)[HD / 32]) {
    const TKV* r = reinterpret_cast<const TKV*>(row) + lane * (HD / 32);
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) x[e] = to_f(r[e]);
  }
};
template <int HD>
struct KvRow<Q4Kv, HD> {
  static_assert(HD % 64 == 0, "a lane's elements stay inside one group");
  static constexpr int64_t kBytes = q4::row_bytes(HD);
  __device__ static void load(const std::byte* row, int lane, float (&x)[HD / 32]) {
    constexpr int E = HD / 32;
    const auto* rec = reinterpret_cast<const uint8_t*>(row);
    const int k0 = lane * E;  // E is even: whole code bytes
    const uint32_t md = detail::q4m::load32(rec + q4::meta_offset(HD) + 4 * (k0 / int(q4::kGroup)));
    const float d = detail::f16_bits_to_f32(uint16_t(md & 0xffffu)), m = detail::f16_bits_to_f32(uint16_t(md >> 16));
#pragma unroll
    for (int p = 0; p < E / 2; ++p) {
      const uint32_t byte = rec[k0 / 2 + p];
      x[2 * p] = detail::q4m::decode(byte & 15u, d, m);
      x[2 * p + 1] = detail::q4m::decode(byte >> 4, d, m);
    }
  }
};

// Pointers and sizes of AttentionArgs as a plain kernel parameter.
struct AttentionView {
  const void *q, *k, *v;
  void* out;
  float* key_scores;
  const int32_t* seq_keys;
  int64_t q_stride, out_stride, tq, n_heads, kv_heads, capacity, max_keys, window;
  float scale, softcap;
};

// What one attention block (grid: query row, head, sequence) works on: the query row of
// sequence b at head h sees keys [lo, nk) of its KV head's rows kb / vb. The prologue of both
// kernels below.
template <class TQ, class TKV, int HD>
struct AttnRow {
  using Row = KvRow<TKV, HD>;
  const std::byte *kb, *vb;
  const TQ* q;
  TQ* out;
  int64_t lo, nk;
  bool skip;  // padding row or contract violation: out already filled, nothing else to do

  int64_t b, h;  // the block's sequence and query head (its query row is blockIdx.x)
  int lane, warp;

  __device__ explicit AttnRow(const AttentionView& a)
      : b(blockIdx.z), h(blockIdx.y), lane(threadIdx.x & 31), warp(threadIdx.x >> 5) {
    const int64_t t = blockIdx.x;
    const int64_t n_b = a.seq_keys[b];
    const int64_t slot = n_b - a.tq + t;
    out = static_cast<TQ*>(a.out) + (b * a.tq + t) * a.out_stride + h * HD;
    skip = slot < 0 || n_b > a.max_keys;
    if (skip) {  // padding row (zeros) or contract violation (NaN)
      const float fill = slot < 0 ? 0.f : NAN;
      for (int d = threadIdx.x; d < HD; d += kAttnThreads) out[d] = from_f<TQ>(fill);
      return;
    }
    nk = slot + 1;
    lo = a.window > 0 && nk > a.window ? nk - a.window : 0;  // a window hides [0, lo)
    const int64_t g = h / (a.n_heads / a.kv_heads);
    kb = static_cast<const std::byte*>(a.k) + (b * a.kv_heads + g) * a.capacity * Row::kBytes;
    vb = static_cast<const std::byte*>(a.v) + (b * a.kv_heads + g) * a.capacity * Row::kBytes;
    q = static_cast<const TQ*>(a.q) + (b * a.tq + t) * a.q_stride + h * HD;
  }
  // The lane's E elements of q, staged through shared memory qs [HD]. Call from all threads.
  __device__ void load_q(float* qs, float (&qr)[HD / 32]) const {
    for (int d = threadIdx.x; d < HD; d += kAttnThreads) qs[d] = to_f(q[d]);
    __syncthreads();
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) qr[e] = qs[lane * (HD / 32) + e];
  }
  // The scaled (and capped) score of key j against the lane's E elements of q; every lane of
  // the warp gets it. Both kernels and both passes of the streamed one compute scores here.
  __device__ float score(const AttentionView& a, const float (&qr)[HD / 32], int64_t j) const {
    float kr[HD / 32];
    Row::load(kb + j * Row::kBytes, lane, kr);
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) s += qr[e] * kr[e];
    s = detail::warp_sum(s) * a.scale;
    if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    return s;
  }
  __device__ void add_value(int64_t j, float p, float (&acc)[HD / 32]) const {
    float vr[HD / 32];
    Row::load(vb + j * Row::kBytes, lane, vr);
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) acc[e] += p * vr[e];
  }
  // Warps' partial outputs (part: [warps][HD] floats of shared memory) summed, times inv.
  __device__ void write_out(const float (&acc)[HD / 32], float inv, float* part) const {
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) part[warp * HD + lane * (HD / 32) + e] = acc[e];
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += kAttnThreads) {
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) o += part[w * HD + d];
      out[d] = from_f<TQ>(o * inv);
    }
  }
};

// One 128-thread block per (query row, head, sequence). The row's scores stay in shared
// memory (fp32), so one pass gives exact probabilities for key_scores; warps split the keys,
// each lane holds head_dim/32 consecutive elements of q and of the running output. K and V
// are widened to fp32 on load whatever TKV is.
// Shared memory: q [HD] | scores [max_keys] | per-warp output partials [warps][HD] | red[32].
template <class TQ, class TKV, int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttentionView a) {
  constexpr int E = HD / 32;  // elements per lane
  extern __shared__ float smem[];
  float* qs = smem;
  float* sc = qs + HD;
  float* part = sc + a.max_keys;
  float* red = part + kAttnWarps * HD;
  const AttnRow<TQ, TKV, HD> r(a);
  if (r.skip) return;
  const int lane = r.lane, warp = r.warp;
  // scores: warp w takes keys w, w+4, ...; lane covers elements [lane*E, lane*E+E)
  float qr[E];
  r.load_q(qs, qr);
  float mx = -INFINITY;
  for (int64_t j = r.lo + warp; j < r.nk; j += kAttnWarps) {
    const float s = r.score(a, qr, j);
    if (lane == 0) sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = detail::block_reduce<true>(mx, red);  // (its __syncthreads also publishes sc)
  float sum = 0.f;
  for (int64_t j = r.lo + threadIdx.x; j < r.nk; j += kAttnThreads) {
    const float p = expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  const float inv = 1.f / detail::block_reduce<false>(sum, red);
  if (a.key_scores) {
    float* ks = a.key_scores + (r.b * a.n_heads + r.h) * a.capacity;
    for (int64_t j = r.lo + threadIdx.x; j < r.nk; j += kAttnThreads) atomicAdd(ks + j, sc[j] * inv);
  }

  // output: warp w accumulates keys w, w+4, ... into E registers per lane, then warps combine
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t j = r.lo + warp; j < r.nk; j += kAttnWarps) r.add_value(j, sc[j], acc);
  r.write_out(acc, inv, part);
}

// The same attention for rows whose scores do not fit in shared memory (long contexts): no
// score row is kept. Pass 1 finds the row's max and softmax denominator (each warp an online
// softmax over its keys, then the warps combined); pass 2 recomputes every score the same
// way, adds its probability to key_scores and accumulates the output. Twice the
// q.k work of attention_kernel, the same V reads, shared memory independent of the keys.
template <class TQ, class TKV, int HD>
__global__ void __launch_bounds__(kAttnThreads) attention_streamed_kernel(AttentionView a) {
  constexpr int E = HD / 32;
  __shared__ float qs[HD], part[kAttnWarps * HD], wmax[kAttnWarps], wsum[kAttnWarps];
  const AttnRow<TQ, TKV, HD> r(a);
  if (r.skip) return;
  const int lane = r.lane, warp = r.warp;
  float qr[E];
  r.load_q(qs, qr);

  // pass 1: warp w's keys w, w+4, ...: running max m and sum l of exp(s - m)
  float m = -INFINITY, l = 0.f;
  for (int64_t j = r.lo + warp; j < r.nk; j += kAttnWarps) {
    const float s = r.score(a, qr, j);
    if (s > m) {
      l = l * expf(m - s) + 1.f;  // exp(-inf) = 0 on the first key
      m = s;
    } else {
      l += expf(s - m);
    }
  }
  if (lane == 0) {
    wmax[warp] = m;
    wsum[warp] = l;
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, wmax[w]);
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w)
    if (wsum[w] > 0.f) sum += wsum[w] * expf(wmax[w] - mx);  // a warp without keys adds nothing
  const float inv = 1.f / sum;

  // pass 2: probabilities, key scores and the output
  float* ks = a.key_scores ? a.key_scores + (r.b * a.n_heads + r.h) * a.capacity : nullptr;
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t j = r.lo + warp; j < r.nk; j += kAttnWarps) {
    const float p = expf(r.score(a, qr, j) - mx);
    if (ks && lane == 0) atomicAdd(ks + j, p * inv);
    r.add_value(j, p, acc);
  }
  r.write_out(acc, inv, part);
}

// Bytes of shared memory attention_kernel needs for rows of up to max_keys keys.
size_t shared_path_bytes(int64_t head_dim, int64_t max_keys) {
  return sizeof(float) * size_t(head_dim + max_keys + kAttnWarps * head_dim + 32);
}

int shared_memory_optin() {
  int dev = 0, optin = 0;
  FH_CUDA_CHECK(cudaGetDevice(&dev));
  FH_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return optin;
}

// Launches attention_kernel<TQ, TKV, HD> (scores in shared memory) when the rows fit, else
// attention_streamed_kernel, for arguments attention() has already checked.
template <class TQ, class TKV, int HD>
void launch_attention(const AttentionArgs& a, int64_t max_keys, cudaStream_t stream) {
  const size_t smem = shared_path_bytes(HD, max_keys);
  const int optin = shared_memory_optin();
  const bool fits = smem <= size_t(optin);
  FH_CHECK(fits || a.path != AttentionPath::kShared, "attention: ", max_keys, " keys need ", smem,
           " bytes of shared memory on the shared path, more than this device's ", optin);
  const bool shared = a.path == AttentionPath::kShared || (a.path == AttentionPath::kAuto && fits);
  const AttentionView v{a.q, a.k, a.v, a.out, a.key_scores, a.seq_keys, a.q_stride, a.out_stride,
                        a.tq, a.n_heads, a.kv_heads, a.capacity, max_keys, a.window, a.scale, a.softcap};
  const dim3 grid(unsigned(a.tq), unsigned(a.n_heads), unsigned(a.batch));
  if (shared) {
    // The kernel's limit is raised to the device's whole opt-in, never to this launch's size: a
    // launch on another thread between this set and this launch can then only keep it as high.
    if (smem > 48 * 1024)
      FH_CUDA_CHECK(
          cudaFuncSetAttribute(attention_kernel<TQ, TKV, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    attention_kernel<TQ, TKV, HD><<<grid, kAttnThreads, smem, stream>>>(v);
  } else {
    attention_streamed_kernel<TQ, TKV, HD><<<grid, kAttnThreads, 0, stream>>>(v);
  }
  FH_CUDA_LAUNCH_CHECK("attention", stream);
}

// The one dispatch point of the attention family: act {F16, BF16} x kv {F16, BF16, F32, Q4} x
// head_dim {64, 128, 256}, and head_dim 96 with kv {F16, BF16, F32}: 30 instantiations. Returns
// false otherwise.
template <class F>
bool dispatch_attention(DType act, DType kv, int64_t head_dim, F&& f) {
  auto by_dim = [&](auto tq, auto tkv) {
    switch (head_dim) {
      case 64: f(tq, tkv, std::integral_constant<int, 64>{}); return true;
      case 96:  // Phi-3-mini; a Q4 row's groups of 64 would straddle a lane's elements
        if constexpr (std::is_same_v<decltype(tkv), Q4Kv>) return false;
        else f(tq, tkv, std::integral_constant<int, 96>{});
        return true;
      case 128: f(tq, tkv, std::integral_constant<int, 128>{}); return true;
      case 256: f(tq, tkv, std::integral_constant<int, 256>{}); return true;  // Gemma 2 2B/9B, Gemma 3 1B-12B
      default: return false;
    }
  };
  auto by_kv = [&](auto tq) {
    switch (kv) {
      case DType::F16: return by_dim(tq, __half{});
      case DType::BF16: return by_dim(tq, __nv_bfloat16{});
      case DType::F32: return by_dim(tq, float{});
      case DType::Q4: return by_dim(tq, Q4Kv{});
      default: return false;
    }
  };
  switch (act) {
    case DType::F16: return by_kv(__half{});
    case DType::BF16: return by_kv(__nv_bfloat16{});
    default: return false;
  }
}

// The one dispatch point of write_kv: src {F16, BF16} x cache {F16, BF16, F32}.
template <class F>
bool dispatch_write_kv(DType src, DType cache, F&& f) {
  auto to_cache = [&](auto s) { return detail::dispatch_float(cache, [&](auto d) { f(s, d); }); };
  switch (src) {
    case DType::F16: return to_cache(__half{});
    case DType::BF16: return to_cache(__nv_bfloat16{});
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

void write_kv(DType src_dtype, const void* src, int64_t src_stride, int64_t B, int64_t T,
              int64_t kv_heads, int64_t head_dim, void* cache, DType cache_dtype, int64_t capacity,
              const int32_t* seq_keys, cudaStream_t stream) {
  if (cache_dtype == DType::Q4) {
    q4_write_kv(src_dtype, src, src_stride, B, T, kv_heads, head_dim, cache, capacity, seq_keys, stream);
    return;
  }
  FH_CHECK(dispatch_write_kv(src_dtype, cache_dtype, [](auto, auto) {}), "write_kv: unsupported dtypes ",
           dtype_name(src_dtype), " -> ", dtype_name(cache_dtype),
           " on CUDA (supported: src F16, BF16 -> cache F16, BF16, F32, Q4)");
  FH_CHECK(B >= 0 && T >= 0 && kv_heads > 0 && head_dim > 0 && capacity >= 0,
           "write_kv: bad sizes");
  FH_CHECK(src_stride >= kv_heads * head_dim, "write_kv: src_stride ", src_stride,
           " < kv_heads*head_dim");
  if (B == 0 || T == 0) return;
  FH_CHECK(src && cache && seq_keys, "write_kv: null pointer");
  dispatch_write_kv(src_dtype, cache_dtype, [&](auto s, auto d) {
    using S = decltype(s);
    using D = decltype(d);
    write_kv_kernel<S, D><<<detail::grid_size_1d(B * T * kv_heads * head_dim), detail::kThreads, 0, stream>>>(
        static_cast<const S*>(src), src_stride, B, T, kv_heads, head_dim, static_cast<D*>(cache),
        capacity, seq_keys);
    FH_CUDA_LAUNCH_CHECK("write_kv", stream);
  });
}

void write_kv(DType dt, const void* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, void* cache, int64_t capacity, const int32_t* seq_keys,
              cudaStream_t stream) {
  write_kv(dt, src, src_stride, B, T, kv_heads, head_dim, cache, dt, capacity, seq_keys, stream);
}

bool attention_supported(DType act, DType kv, int64_t head_dim) {
  return dispatch_attention(act, kv, head_dim, [](auto, auto, auto) {});
}
bool attention_supported(DType dt, int64_t head_dim) { return attention_supported(dt, dt, head_dim); }

void attention(const AttentionArgs& a, cudaStream_t stream) {
  FH_CHECK(a.batch >= 0 && a.tq >= 0 && a.n_heads > 0 && a.kv_heads > 0 && a.head_dim > 0,
           "attention: bad sizes");
  FH_CHECK(a.n_heads % a.kv_heads == 0, "attention: n_heads ", a.n_heads,
           " is not a multiple of kv_heads ", a.kv_heads);
  FH_CHECK(a.window >= 0, "attention: window must be >= 0, got ", a.window);
  FH_CHECK(a.batch <= 65535 && a.n_heads <= 65535 && a.tq <= INT32_MAX,
           "attention: grid limits (batch, n_heads <= 65535)");
  const int64_t max_keys = a.max_keys > 0 ? a.max_keys : a.capacity;
  FH_CHECK(max_keys <= a.capacity, "attention: max_keys ", max_keys, " > capacity ", a.capacity);
  const DType kv = a.kv_dtype.value_or(a.dtype);
  FH_CHECK(attention_supported(a.dtype, kv, a.head_dim), "attention: unsupported dtype ",
           dtype_name(a.dtype), " / kv_dtype ", dtype_name(kv), " / head_dim ", a.head_dim,
           " on CUDA (supported: dtype F16, BF16 x kv_dtype F16, BF16, F32, Q4 x head_dim 64, 128, 256; head_dim 96 "
           "without Q4)");
  if (a.batch == 0 || a.tq == 0) return;
  FH_CHECK(a.q && a.k && a.v && a.out && a.seq_keys, "attention: null pointer");
  FH_CHECK(a.q_stride >= a.n_heads * a.head_dim && a.out_stride >= a.n_heads * a.head_dim,
           "attention: row stride smaller than n_heads*head_dim");
  FH_CHECK(kv != DType::Q4 || (reinterpret_cast<uintptr_t>(a.k) % 4 == 0 && reinterpret_cast<uintptr_t>(a.v) % 4 == 0),
           "attention: Q4 caches must start 4-byte aligned");
  dispatch_attention(a.dtype, kv, a.head_dim, [&](auto tq, auto tkv, auto hd) {
    launch_attention<decltype(tq), decltype(tkv), decltype(hd)::value>(a, max_keys, stream);
  });
}

void kv_gather(DType dt, void* buf, int64_t B, int64_t heads, int64_t capacity, int64_t row_elems,
               const int32_t* keep, int64_t keep_stride, const int32_t* keep_count, cudaStream_t stream) {
  FH_CHECK(B >= 0 && heads > 0 && capacity >= 0 && row_elems > 0, "kv_gather: bad sizes");
  FH_CHECK(keep_stride >= 0, "kv_gather: negative keep_stride");
  if (B == 0 || capacity == 0 || keep_stride == 0) return;
  FH_CHECK(buf && keep && keep_count, "kv_gather: null pointer");
  FH_CHECK(dt == DType::Q4 || dtype_size(dt) == 2 || dtype_size(dt) == 4, "kv_gather: unsupported dtype ",
           dtype_name(dt), " (2- or 4-byte elements, or Q4 records)");
  // A slot moves as raw words: a Q4 record is a multiple of 4 bytes (core/quant4.h).
  const size_t slot = row_nbytes(dt, row_elems), unit = slot % 4 == 0 ? 4 : 2;
  const int64_t rows = B * heads, row = int64_t(slot / unit);
  const unsigned grid = detail::grid_size_1d(rows * row);
  if (unit == 2)
    kv_gather_kernel<uint16_t><<<grid, detail::kThreads, 0, stream>>>(
        static_cast<uint16_t*>(buf), rows, capacity, row, keep, keep_stride, keep_count);
  else
    kv_gather_kernel<uint32_t><<<grid, detail::kThreads, 0, stream>>>(
        static_cast<uint32_t*>(buf), rows, capacity, row, keep, keep_stride, keep_count);
  FH_CUDA_LAUNCH_CHECK("kv_gather", stream);
}

}  // namespace flexh2o::gpu
