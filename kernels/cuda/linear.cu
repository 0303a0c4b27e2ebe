// linear(): cublasGemmEx (fp16/bf16 in and out, fp32 compute, tensor cores) followed by one
// element-wise pass for bias and ReLU. Row-major y[M,N] = x[M,K] w[N,K]^T is the column-major
// product y^T[N,M] = op_T(w as [K,N]) * (x as [K,M]).
#include <cublas_v2.h>

#include <climits>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/ops.h"

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

}  // namespace

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
