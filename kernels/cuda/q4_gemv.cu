// q4_gemv (q4.h): the fused small-M linear on Q4 weights. One warp per output column n: the
// lanes walk n's record in 8-element chunks (a 32-bit word of codes each, so a warp reads 128
// contiguous bytes per step), decode the chunk in registers with the format's fmaf, and
// accumulate it against the M rows of x in fp32 (MT accumulators per lane, MT = M rounded up
// to a power of two); a warp sum and one rounding per output. The weight is read once, 4-bit.
#include "core/quant4.h"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/q4_math.h"
#include "kernels/cuda/q4.h"

namespace flexh2o::gpu {
namespace {

using detail::from_f;
using detail::to_f;

constexpr int kGemvWarps = 4;

// Eight consecutive x values as fp32; `vec`: one 16-byte load (p 16-byte aligned).
template <class T>
__device__ __forceinline__ void load8(const T* p, bool vec, int n, float (&o)[8]) {
  if (vec) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = to_f(h[e]);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = e < n ? to_f(p[e]) : 0.f;
}

template <class T>
__device__ __forceinline__ T to_out(float v) {
  return from_f<T>(v);
}
template <>
__device__ __forceinline__ float to_out<float>(float v) {
  return v;
}

template <class T, class O, int MT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    q4_gemv_kernel(const T* __restrict__ x, int M, int64_t K, const uint8_t* __restrict__ w, int64_t N,
                   const T* __restrict__ bias, O* __restrict__ y, Epilogue ep, bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps leave; no block-wide synchronisation follows
  const int64_t moff = q4::meta_offset(K), C = detail::q4m::chunks(K);
  const uint8_t* rec = w + n * q4::row_bytes(K);
  float acc[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i] = 0.f;
  // Unrolled so each lane has several 4-byte weight loads in flight (nothing in the loop
  // stores, so the compiler may hoist them): one word per lane would leave HBM underused.
#pragma unroll 4
  for (int64_t c = lane; c < C; c += 32) {
    const detail::q4m::Chunk wv = detail::q4m::decode_chunk(rec, moff, c);
    const int ne = int(min(int64_t(8), K - 8 * c));
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < M) {
        float xv[8];
        load8(x + i * K + 8 * c, vec, ne, xv);
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += xv[e] * wv.v[e];  // xv is 0 past K: padding codes drop out
        acc[i] += s;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i] = detail::warp_sum(acc[i]);
  if (lane != 0) return;
  const float b = bias ? to_f(bias[n]) : 0.f;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i >= M) break;
    float v = acc[i] + b;
    O* out = y + i * N + n;
    if (ep == Epilogue::kAccumulate) v += to_f(*out);
    if (ep == Epilogue::kRelu) v = fmaxf(v, 0.f);
    *out = to_out<O>(v);
  }
}

template <class T, class O>
void launch_gemv(const T* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, const T* bias, O* y, Epilogue ep,
                 cudaStream_t stream) {
  const bool vec = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const dim3 grid(unsigned(detail::ceil_div(N, kGemvWarps)));
  const int m = int(M);
  auto go = [&](auto mt) {
    q4_gemv_kernel<T, O, decltype(mt)::value><<<grid, kGemvWarps * 32, 0, stream>>>(x, m, K, w, N, bias, y, ep, vec);
  };
  if (M <= 1) go(std::integral_constant<int, 1>{});
  else if (M <= 2) go(std::integral_constant<int, 2>{});
  else if (M <= 4) go(std::integral_constant<int, 4>{});
  else if (M <= 8) go(std::integral_constant<int, 8>{});
  else go(std::integral_constant<int, 16>{});
  FH_CUDA_LAUNCH_CHECK("q4_gemv", stream);
}

}  // namespace

void q4_gemv(DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N, const void* bias, void* y,
             DType y_dtype, Epilogue ep, cudaStream_t stream) {
  FH_CHECK(M >= 0 && M <= 16 && K > 0 && N > 0, "q4_gemv: bad sizes M=", M, " (at most 16) K=", K, " N=", N);
  FH_CHECK(N <= int64_t(UINT32_MAX) * kGemvWarps, "q4_gemv: N=", N, " exceeds the grid");
  if (M == 0) return;
  FH_CHECK(x && w && y, "q4_gemv: null pointer");
  FH_CHECK(x != y, "q4_gemv: x and y must not alias");
  FH_CHECK(reinterpret_cast<uintptr_t>(w) % 4 == 0, "q4_gemv: Q4 records must start 4-byte aligned");
  FH_CHECK(y_dtype == dt || y_dtype == DType::F32, "q4_gemv: y dtype ", dtype_name(y_dtype), " is neither ",
           dtype_name(dt), " nor F32");
  detail::dispatch_half(dt, "q4_gemv", [&](auto tag) {
    using T = decltype(tag);
    const auto* wb = static_cast<const uint8_t*>(w);
    if (y_dtype == DType::F32)
      launch_gemv<T, float>(static_cast<const T*>(x), M, K, wb, N, static_cast<const T*>(bias),
                            static_cast<float*>(y), ep, stream);
    else
      launch_gemv<T, T>(static_cast<const T*>(x), M, K, wb, N, static_cast<const T*>(bias), static_cast<T*>(y), ep,
                        stream);
  });
}

}  // namespace flexh2o::gpu
