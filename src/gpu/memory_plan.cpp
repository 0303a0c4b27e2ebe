// Device byte counts and the fit message of the GPU runner (host-only arithmetic).
#include "gpu/memory_plan.h"

#include <cstdio>
#include <cstring>

#include "core/error.h"

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

std::array<int64_t, 8> gpu_scratch_elems(const ModelConfig& c, int64_t M, int64_t B) {
  const bool llama = c.arch == Arch::kLlama;
  return {M * c.hidden, M * c.q_dim(), M * c.kv_dim(), M * c.kv_dim(), M * c.q_dim(),
          M * c.ffn_dim, llama ? M * c.ffn_dim : 0, B * c.hidden};
}

size_t gpu_scratch_bytes(const ModelConfig& c, DType dt, int64_t M, int64_t B) {
  size_t n = 0;
  for (int64_t e : gpu_scratch_elems(c, M, B)) n += align_up(size_t(e) * dtype_size(dt) + 1, kTensorAlign);
  return n;
}

void convert_weights(const TensorView& v, int64_t off, int64_t n, DType dt, uint16_t* out) {
  if (v.dtype == dt) {
    std::memcpy(out, static_cast<const uint16_t*>(v.data) + off, size_t(n) * sizeof(uint16_t));
    return;
  }
  const bool to_f16 = dt == DType::F16;
  switch (v.dtype) {
    case DType::F32: {
      const float* s = v.as<float>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = to_f16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
      return;
    }
    case DType::F16: {  // -> BF16
      const uint16_t* s = v.as<uint16_t>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f16_to_f32(s[i]));
      return;
    }
    case DType::BF16: {  // -> F16
      const uint16_t* s = v.as<uint16_t>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(bf16_to_f32(s[i]));
      return;
    }
    default:
      FH_FAIL("GPU upload: unsupported weight dtype ", dtype_name(v.dtype));
  }
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
