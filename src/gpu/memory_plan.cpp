// Device byte counts and the fit message of the GPU runner (host-only arithmetic).
#include "gpu/memory_plan.h"

#include <cstdio>

namespace flexh2o::gpu {
namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

DType gpu_compute_dtype(const Model& m) {
  bool bf16 = false, f16 = false;
  for (const BoundTensor& t : m.tensors()) {
    bf16 = bf16 || t.view.dtype == DType::BF16;
    f16 = f16 || t.view.dtype == DType::F16;
  }
  if (bf16) return DType::BF16;
  if (!f16 && m.config().dtype == DType::BF16) return DType::BF16;
  return DType::F16;
}

size_t gpu_weight_bytes(const Model& m, DType dt) {
  size_t total = 0;
  for (const BoundTensor& t : m.tensors())
    total += align_up(size_t(t.view.numel()) * dtype_size(dt), kTensorAlign);
  return total;
}

size_t gpu_kv_bytes(const ModelConfig& c, DType dt, int64_t batch, int64_t capacity) {
  return size_t(2 * c.n_layers * batch * c.n_kv_heads * capacity * c.head_dim) * dtype_size(dt);
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string fit_error(const std::string& what, size_t need, size_t available, size_t total,
                      const std::string& device, const std::string& hint) {
  if (need <= available) return "";
  std::string s = what + " need " + format_bytes(need) + " on the GPU, but only " + format_bytes(available) +
                  " of " + format_bytes(total) + " is free on " + device;
  if (!hint.empty()) s += "; " + hint;
  return s;
}

}  // namespace flexh2o::gpu
