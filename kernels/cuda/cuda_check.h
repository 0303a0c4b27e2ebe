// FH_CUDA_CHECK: the one check macro for CUDA runtime (cudaError_t) and cuBLAS / cuBLASLt
// (cublasStatus_t) codes. On failure it throws flexh2o::Error naming the expression, the
// error's name and text, and file:line. Not for destructors: use FH_CUDA_LOG there (never throws).
// FH_CUDA_LAUNCH_CHECK(stream) follows every <<<>>> launch; with FLEXH2O_SYNC_CHECK defined
// it also synchronises the stream so a fault points at the kernel that caused it.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

namespace flexh2o::gpu::detail {

inline bool status_ok(cudaError_t e) { return e == cudaSuccess; }
inline bool status_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
std::string status_text(cudaError_t e);     // "cudaErrorInvalidValue: invalid argument"
std::string status_text(cublasStatus_t s);  // "CUBLAS_STATUS_NOT_SUPPORTED: ..."

[[noreturn]] void throw_status(const char* expr, const std::string& text, const char* file, int line);
// Writes one line to stderr; never throws (destructors, cleanup).
void log_status(const char* expr, const std::string& text, const char* file, int line) noexcept;
// cudaGetLastError() after a launch (+ stream sync under FLEXH2O_SYNC_CHECK); throws on error.
void check_launch(const char* what, cudaStream_t stream, const char* file, int line);

}  // namespace flexh2o::gpu::detail

#define FH_CUDA_CHECK(expr)                                                                      \
  do {                                                                                           \
    const auto fh_status_ = (expr);                                                              \
    if (!::flexh2o::gpu::detail::status_ok(fh_status_))                                          \
      ::flexh2o::gpu::detail::throw_status(#expr, ::flexh2o::gpu::detail::status_text(fh_status_), \
                                           __FILE__, __LINE__);                                  \
  } while (0)

#define FH_CUDA_LOG(expr)                                                                      \
  do {                                                                                         \
    const auto fh_status_ = (expr);                                                            \
    if (!::flexh2o::gpu::detail::status_ok(fh_status_))                                        \
      ::flexh2o::gpu::detail::log_status(#expr, ::flexh2o::gpu::detail::status_text(fh_status_), \
                                         __FILE__, __LINE__);                                  \
  } while (0)

#define FH_CUDA_LAUNCH_CHECK(what, stream) \
  ::flexh2o::gpu::detail::check_launch(what, stream, __FILE__, __LINE__)
