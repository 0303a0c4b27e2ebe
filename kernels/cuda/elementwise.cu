// Row-wise and element-wise CUDA ops of ops.h: embedding, add_embedding, scale, layernorm,
// rmsnorm (+ rmsnorm_add), rotary, silu_mul, gelu_tanh_mul, softcap_f32. fp32 math on fp16/bf16
// storage; grid-stride loops with 64-bit indices;
// norms use one block per row with two block reductions.
#include <algorithm>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/ops.h"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

template <class T, bool kAdd>
__global__ void embedding_kernel(const int32_t* ids, int64_t T_, const T* table, int64_t V, int64_t D,
                                 T* out) {
  const int64_t n = T_ * D;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int64_t t = i / D, d = i % D;
    const int64_t id = ids[t];
    const float e = (id >= 0 && id < V) ? to_f(table[id * D + d]) : 0.f;
    out[i] = from_f<T>(kAdd ? to_f(out[i]) + e : e);
  }
}

// One block per row (grid-stride over rows). Each thread reads x[i] and writes y[i] for the
// same i after both reductions, so x and y may alias (not with kAdd: y += norm(x)). RMSNorm
// multiplies by goff + gamma (Gemma: 1).
template <class T, bool kLayer, bool kAdd>
__global__ void norm_kernel(const T* x, int64_t M, int64_t D, const T* gamma, const T* beta,
                            float eps, float goff, T* y) {
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < M; r += gridDim.x) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float mean = 0.f;
    if (kLayer) {
      float s = 0.f;
      for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += to_f(xr[i]);
      mean = detail::block_reduce<false>(s, red) / float(D);
    }
    float s2 = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = to_f(xr[i]) - mean;
      s2 += v * v;
    }
    const float inv = 1.f / sqrtf(detail::block_reduce<false>(s2, red) / float(D) + eps);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      float v = (to_f(xr[i]) - mean) * inv * (goff + to_f(gamma[i]));
      if (kLayer) v += to_f(beta[i]);
      yr[i] = from_f<T>(kAdd ? to_f(yr[i]) + v : v);
    }
  }
}

template <class T>
__global__ void rotary_kernel(T* x, int64_t T_, int64_t n_heads, int64_t head_dim, int64_t row_stride,
                              const int32_t* positions, const RotaryTable table) {
  const int64_t half = table.dims / 2, n = T_ * n_heads * half;
  for (int64_t idx = detail::global_tid(); idx < n; idx += detail::grid_stride()) {
    const int64_t i = idx % half, h = (idx / half) % n_heads, t = idx / (half * n_heads);
    const double ang = double(positions[t]) * table.inv_freq[i];
    const float c = float(cos(ang) * table.attention_factor), s = float(sin(ang) * table.attention_factor);
    T* p = x + t * row_stride + h * head_dim;
    const float x1 = to_f(p[i]), x2 = to_f(p[i + half]);
    p[i] = from_f<T>(x1 * c - x2 * s);
    p[i + half] = from_f<T>(x2 * c + x1 * s);
  }
}

template <class T>
__global__ void silu_mul_kernel(T* gate, const T* up, int64_t n) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const float g = to_f(gate[i]);
    gate[i] = from_f<T>(g / (1.f + expf(-g)) * to_f(up[i]));
  }
}

// 0.5 g (1 + tanh(a)), a = sqrt(2/pi) (g + 0.044715 g^3), as g / (1 + exp(-2a)) (the CPU op's form).
template <class T>
__global__ void gelu_tanh_mul_kernel(T* gate, const T* up, int64_t n) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const float g = to_f(gate[i]);
    const float e = expf(-1.5957691216057308f * fmaf(0.044715f * g * g, g, g));
    gate[i] = from_f<T>(g / (1.f + e) * to_f(up[i]));
  }
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) x[i] = from_f<T>(to_f(x[i]) * s);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) x[i] = cap * tanhf(x[i] / cap);
}

template <bool kAdd>
void embedding_impl(const char* op, DType dt, const int32_t* ids, int64_t T, const void* table,
                    int64_t V, int64_t D, void* out, cudaStream_t stream) {
  FH_CHECK(T >= 0 && V > 0 && D > 0, op, ": bad sizes T=", T, " V=", V, " D=", D);
  if (T == 0) return;
  FH_CHECK(ids && table && out, op, ": null pointer");
  detail::dispatch_half(dt, op, [&](auto tag) {
    using E = decltype(tag);
    embedding_kernel<E, kAdd><<<detail::grid_size_1d(T * D), detail::kThreads, 0, stream>>>(
        ids, T, static_cast<const E*>(table), V, D, static_cast<E*>(out));
    FH_CUDA_LAUNCH_CHECK(op, stream);
  });
}

template <bool kLayer, bool kAdd = false>
void norm_impl(const char* op, DType dt, const void* x, int64_t M, int64_t D, const void* gamma,
               const void* beta, float eps, float goff, void* y, cudaStream_t stream) {
  FH_CHECK(M >= 0 && D > 0, op, ": bad sizes M=", M, " D=", D);
  if (M == 0) return;
  FH_CHECK(x && gamma && y && (!kLayer || beta), op, ": null pointer");
  FH_CHECK(!kAdd || x != y, op, ": x and y alias");
  const unsigned grid = unsigned(M < 65536 ? M : 65536);
  detail::dispatch_half(dt, op, [&](auto tag) {
    using E = decltype(tag);
    norm_kernel<E, kLayer, kAdd><<<grid, detail::kThreads, 0, stream>>>(
        static_cast<const E*>(x), M, D, static_cast<const E*>(gamma), static_cast<const E*>(beta), eps, goff,
        static_cast<E*>(y));
    FH_CUDA_LAUNCH_CHECK(op, stream);
  });
}

}  // namespace

void embedding(DType dt, const int32_t* ids, int64_t T, const void* table, int64_t V, int64_t D,
               void* out, cudaStream_t stream) {
  embedding_impl<false>("embedding", dt, ids, T, table, V, D, out, stream);
}
void add_embedding(DType dt, const int32_t* rows, int64_t T, const void* table, int64_t V, int64_t D,
                   void* out, cudaStream_t stream) {
  embedding_impl<true>("add_embedding", dt, rows, T, table, V, D, out, stream);
}

void layernorm(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, const void* beta,
               float eps, void* y, cudaStream_t stream) {
  norm_impl<true>("layernorm", dt, x, M, D, gamma, beta, eps, 0.f, y, stream);
}
void rmsnorm(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, float eps, void* y,
             cudaStream_t stream, float gamma_offset) {
  norm_impl<false>("rmsnorm", dt, x, M, D, gamma, nullptr, eps, gamma_offset, y, stream);
}
void rmsnorm_add(DType dt, const void* x, int64_t M, int64_t D, const void* gamma, float eps, float gamma_offset,
                 void* y, cudaStream_t stream) {
  norm_impl<false, true>("rmsnorm_add", dt, x, M, D, gamma, nullptr, eps, gamma_offset, y, stream);
}

void rotary(DType dt, void* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t row_stride,
            const int32_t* positions, const RotaryTable& table, cudaStream_t stream) {
  FH_CHECK(table.dims > 0 && table.dims % 2 == 0 && table.dims <= head_dim, "rotary: table.dims ", table.dims,
           " must be even and within head_dim ", head_dim);
  FH_CHECK(T >= 0 && n_heads > 0, "rotary: bad sizes T=", T, " n_heads=", n_heads);
  FH_CHECK(row_stride >= n_heads * head_dim, "rotary: row_stride ", row_stride, " < n_heads*head_dim");
  if (T == 0) return;
  FH_CHECK(x && positions, "rotary: null pointer");
  detail::dispatch_half(dt, "rotary", [&](auto tag) {
    using E = decltype(tag);
    rotary_kernel<E><<<detail::grid_size_1d(T * n_heads * table.dims / 2), detail::kThreads, 0, stream>>>(
        static_cast<E*>(x), T, n_heads, head_dim, row_stride, positions, table);
    FH_CUDA_LAUNCH_CHECK("rotary", stream);
  });
}

RotaryTable rotary_table(const double* inv_freq, int64_t half, float attention_factor) {
  FH_CHECK(half > 0 && half <= RotaryTable::kMaxHalf, "rotary: ", 2 * half, " rotary dimensions are not in [2, ",
           2 * RotaryTable::kMaxHalf, "]");
  FH_CHECK(inv_freq, "rotary: null inv_freq");
  RotaryTable t;
  std::copy(inv_freq, inv_freq + half, t.inv_freq);
  t.dims = 2 * half;
  t.attention_factor = attention_factor;
  return t;
}

void silu_mul(DType dt, void* gate, const void* up, int64_t n, cudaStream_t stream) {
  FH_CHECK(n >= 0, "silu_mul: bad size ", n);
  if (n == 0) return;
  FH_CHECK(gate && up, "silu_mul: null pointer");
  detail::dispatch_half(dt, "silu_mul", [&](auto tag) {
    using E = decltype(tag);
    silu_mul_kernel<E><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
        static_cast<E*>(gate), static_cast<const E*>(up), n);
    FH_CUDA_LAUNCH_CHECK("silu_mul", stream);
  });
}

void gelu_tanh_mul(DType dt, void* gate, const void* up, int64_t n, cudaStream_t stream) {
  FH_CHECK(n >= 0, "gelu_tanh_mul: bad size ", n);
  if (n == 0) return;
  FH_CHECK(gate && up, "gelu_tanh_mul: null pointer");
  detail::dispatch_half(dt, "gelu_tanh_mul", [&](auto tag) {
    using E = decltype(tag);
    gelu_tanh_mul_kernel<E><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
        static_cast<E*>(gate), static_cast<const E*>(up), n);
    FH_CUDA_LAUNCH_CHECK("gelu_tanh_mul", stream);
  });
}

void scale(DType dt, void* x, int64_t n, float s, cudaStream_t stream) {
  FH_CHECK(n >= 0, "scale: bad size ", n);
  if (n == 0) return;
  FH_CHECK(x, "scale: null pointer");
  detail::dispatch_half(dt, "scale", [&](auto tag) {
    using E = decltype(tag);
    scale_kernel<E><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(static_cast<E*>(x), n, s);
    FH_CUDA_LAUNCH_CHECK("scale", stream);
  });
}

void softcap_f32(float* x, int64_t n, float cap, cudaStream_t stream) {
  FH_CHECK(n >= 0 && cap > 0, "softcap_f32: bad size ", n, " or cap ", cap);
  if (n == 0) return;
  FH_CHECK(x, "softcap_f32: null pointer");
  softcap_kernel<<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(x, n, cap);
  FH_CUDA_LAUNCH_CHECK("softcap_f32", stream);
}

}  // namespace flexh2o::gpu
