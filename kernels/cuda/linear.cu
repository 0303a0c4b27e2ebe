// linear(): cublasGemmEx (fp16/bf16 in and out, fp32 compute, tensor cores) followed by one
// element-wise pass for bias and ReLU. Row-major y[M,N] = x[M,K] w[N,K]^T is the column-major
// product y^T[N,M] = op_T(w as [K,N]) * (x as [K,M]). linear_q4*: the same with a Q4 weight,
// fused (q4_gemv) for small M, else decoded tile by tile of output columns into scratch; a tile
// [n0, n0+nt) of y^T is y + n0 with leading dimension N, so each tile is one plain GEMM.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>

#include "core/quant4.h"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/q4.h"

namespace flexh2o::gpu {
namespace {

template <class T>
__global__ void bias_act_kernel(T* y, const T* bias, int64_t M, int64_t N, bool relu) {
  const int64_t n = M * N;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    float v = detail::to_f(y[i]);
    if (bias) v += detail::to_f(bias[i % N]);
    if (relu) v = fmaxf(v, 0.f);
    y[i] = detail::from_f<T>(v);
  }
}

// linear_q4 / linear_q4_f32out: y_dt is dt (with bias/epilogue) or F32 (lm_head: no bias, kStore).
void linear_q4_impl(const char* op, CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w,
                    int64_t N, const void* bias, void* y, DType y_dt, Epilogue ep, void* scratch,
                    size_t scratch_bytes, cudaStream_t stream) {
  FH_CHECK(M >= 0 && K > 0 && N > 0, op, ": bad sizes M=", M, " K=", K, " N=", N);
  FH_CHECK(M <= INT_MAX && K <= INT_MAX && N <= INT_MAX, op, ": sizes must fit in int for cuBLAS");
  if (M == 0) return;
  FH_CHECK(x && w && y, op, ": null pointer");
  FH_CHECK(x != y, op, ": x and y must not alias");
  if (M <= kQ4FusedMaxRows) {
    q4_gemv(dt, x, M, K, w, N, bias, y, y_dt, ep, stream);
    return;
  }
  const size_t es = dtype_size(dt), row = size_t(K) * es;
  FH_CHECK(scratch && scratch_bytes >= row, op, ": the dequantization scratch (", scratch_bytes,
           " bytes) holds no weight row of ", row, " bytes");
  const int64_t tile = std::min<int64_t>(N, int64_t(scratch_bytes / row));
  const size_t rb = size_t(q4::row_bytes(K)), ys = y_dt == DType::F32 ? 4 : es;
  detail::dispatch_half(dt, op, [&](auto tag) {
    using T = decltype(tag);
    const cudaDataType_t ct = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
    const cudaDataType_t yt = y_dt == DType::F32 ? CUDA_R_32F : ct;
    const float alpha = 1.f, beta = ep == Epilogue::kAccumulate ? 1.f : 0.f;
    cublas.bind(stream);
    for (int64_t n0 = 0; n0 < N; n0 += tile) {  // in stream order: a tile is decoded after the last GEMM read it
      const int64_t nt = std::min(tile, N - n0);
      q4_decode_rows(static_cast<const std::byte*>(w) + size_t(n0) * rb, nt, K, dt, scratch, K, stream);
      FH_CUDA_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(nt), int(M), int(K), &alpha, scratch,
                                 ct, int(K), x, ct, int(K), &beta, static_cast<std::byte*>(y) + size_t(n0) * ys, yt,
                                 int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    const bool relu = ep == Epilogue::kRelu;
    if (y_dt != DType::F32 && (bias || relu)) {
      bias_act_kernel<T><<<detail::grid_size_1d(M * N), detail::kThreads, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(bias), M, N, relu);
      FH_CUDA_LAUNCH_CHECK("linear_q4 bias/relu", stream);
    }
  });
}

}  // namespace

void linear_q4(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N,
               const void* bias, void* y, Epilogue ep, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  linear_q4_impl("linear_q4", cublas, dt, x, M, K, w, N, bias, y, dt, ep, scratch, scratch_bytes, stream);
}

void linear_q4_f32out(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w, int64_t N,
                      float* y, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  linear_q4_impl("linear_q4_f32out", cublas, dt, x, M, K, w, N, nullptr, y, DType::F32, Epilogue::kStore, scratch,
                 scratch_bytes, stream);
}

bool dtype_supported(DType dt) { return dt == DType::F16 || dt == DType::BF16; }

void linear(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w,
            int64_t N, const void* bias, void* y, Epilogue ep, cudaStream_t stream) {
  FH_CHECK(M >= 0 && K > 0 && N > 0, "linear: bad sizes M=", M, " K=", K, " N=", N);
  FH_CHECK(M <= INT_MAX && K <= INT_MAX && N <= INT_MAX, "linear: sizes must fit in int for cuBLAS");
  if (M == 0) return;
  FH_CHECK(x && w && y, "linear: null pointer");
  FH_CHECK(x != y, "linear: x and y must not alias");
  detail::dispatch_half(dt, "linear", [&](auto tag) {
    using T = decltype(tag);
    const cudaDataType_t ct = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.f, beta = ep == Epilogue::kAccumulate ? 1.f : 0.f;
    cublas.bind(stream);
    FH_CUDA_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                               w, ct, int(K), x, ct, int(K), &beta, y, ct, int(N),
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const bool relu = ep == Epilogue::kRelu;
    if (bias || relu) {
      bias_act_kernel<T><<<detail::grid_size_1d(M * N), detail::kThreads, 0, stream>>>(
          static_cast<T*>(y), static_cast<const T*>(bias), M, N, relu);
      FH_CUDA_LAUNCH_CHECK("linear bias/relu", stream);
    }
  });
}

void linear_f32out(CublasHandle& cublas, DType dt, const void* x, int64_t M, int64_t K, const void* w,
                   int64_t N, float* y, cudaStream_t stream) {
  FH_CHECK(M >= 0 && K > 0 && N > 0, "linear_f32out: bad sizes M=", M, " K=", K, " N=", N);
  FH_CHECK(M <= INT_MAX && K <= INT_MAX && N <= INT_MAX, "linear_f32out: sizes must fit in int for cuBLAS");
  if (M == 0) return;
  FH_CHECK(x && w && y, "linear_f32out: null pointer");
  detail::dispatch_half(dt, "linear_f32out", [&](auto tag) {
    using T = decltype(tag);
    const cudaDataType_t ct = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.f, beta = 0.f;
    cublas.bind(stream);
    FH_CUDA_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                               w, ct, int(K), x, ct, int(K), &beta, y, CUDA_R_32F, int(N),
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
}

}  // namespace flexh2o::gpu
