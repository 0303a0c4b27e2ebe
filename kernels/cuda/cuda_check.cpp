// Out-of-line parts of cuda_check.h: status text, throwing, logging, the post-launch check.
#include "kernels/cuda/cuda_check.h"

#include <cstdio>

#include "core/error.h"

namespace flexh2o::gpu::detail {
namespace {
std::string short_file(const char* file) {
  std::string f = file;
  if (auto pos = f.rfind("/kernels/"); pos != std::string::npos) return f.substr(pos + 1);
  if (auto pos = f.rfind('/'); pos != std::string::npos) return f.substr(pos + 1);
  return f;
}
}  // namespace

std::string status_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string status_text(cublasStatus_t s) {
  return std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s);
}

void throw_status(const char* expr, const std::string& text, const char* file, int line) {
  throw Error(flexh2o::detail::concat(expr, " failed: ", text, " (", short_file(file), ":", line, ")"));
}

void log_status(const char* expr, const std::string& text, const char* file, int line) noexcept {
  try {
    std::fprintf(stderr, "flexh2o: %s failed: %s (%s:%d)\n", expr, text.c_str(),
                 short_file(file).c_str(), line);
  } catch (...) {  // string allocation failed: nothing more we can do
  }
}

void check_launch(const char* what, cudaStream_t stream, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_status(what, status_text(e), file, line);
#ifdef FLEXH2O_SYNC_CHECK
  const cudaError_t s = cudaStreamSynchronize(stream);
  if (s != cudaSuccess) throw_status(what, status_text(s), file, line);
#else
  (void)stream;
#endif
}

}  // namespace flexh2o::gpu::detail
