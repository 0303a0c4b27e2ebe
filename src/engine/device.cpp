// Buffer ownership and the scratch formula shared by the devices and the planner.
#include "engine/device.h"

#include <algorithm>

#include "engine/layer_compute.h"

namespace flexh2o {

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::kCuda ? "cuda" : "cpu"; }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    dev_ = o.dev_, data_ = o.data_, size_ = o.size_, kind_ = o.kind_;
    charge_ = std::move(o.charge_);
    o.dev_ = nullptr, o.data_ = nullptr, o.size_ = 0;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (data_ && dev_) dev_->release(kind_, data_, size_);
  dev_ = nullptr, data_ = nullptr, size_ = 0;
  charge_ = TierCharge();
}

Buffer Device::make_buffer(std::byte* p, size_t bytes, MemKind kind, TierCharge charge) {
  const bool aligned = kind == MemKind::kDevice || reinterpret_cast<uintptr_t>(p) % kHostAlign == 0;
  if (!aligned) release(kind, p, bytes);  // not leaked by the throw below
  FH_CHECK(aligned, name(), ": host buffer ", static_cast<const void*>(p), " (", bytes, " bytes) is not ", kHostAlign,
           "-byte aligned");
  Buffer b;
  b.dev_ = this, b.data_ = p, b.size_ = bytes, b.kind_ = kind;
  b.charge_ = std::move(charge);
  return b;
}

uint64_t device_scratch_bytes(DeviceKind kind, const ModelConfig& c, DType act, int64_t rows) {
  if (kind == DeviceKind::kCpu) {
    uint64_t b = uint64_t(LayerCompute::unit_scratch_bytes(c, rows));
    if (act != DType::F32) b += uint64_t(rows * (c.hidden + 2 * c.q_dim() + 2 * c.kv_dim())) * 4;
    return b;
  }
  return cuda_scratch(c, act, rows).total();
}

// The tile is counted whether or not the weights are compressed: nothing here says, and it is
// at most 64 MiB.
CudaScratch cuda_scratch(const ModelConfig& c, DType act, int64_t rows) {
  const uint64_t es = dtype_size(act), chunk = uint64_t(std::min(rows, kMlpChunkRows));
  auto al = [](uint64_t n) { return (n + 255) / 256 * 256; };
  CudaScratch s;
  s.normed = al(uint64_t(rows * c.hidden) * es);
  s.ffn_chunk = al(chunk * uint64_t(c.ffn_scratch_dim()) * es);
  s.dequant = al(q4_dequant_tile_bytes(c, act));
  s.cublas_workspace = kCublasWorkspaceBytes;
  if (c.moe()) {
    s.moe_logits = al(chunk * uint64_t(c.n_experts + 1) * 4);  // and the shared expert's gate
    s.moe_list = al(chunk * uint64_t(c.experts_per_token) * 4);
    s.moe_counts = al(3 * uint64_t(c.n_experts) * 4);
    s.moe_x = s.moe_out = al(chunk * uint64_t(c.hidden) * es);
    s.moe_sum = al(chunk * uint64_t(c.hidden) * 4);
  }
  return s;
}

uint64_t q4_dequant_tile_bytes(const ModelConfig& c, DType act) {
  const uint64_t largest = uint64_t(c.hidden) * uint64_t(std::max({c.q_dim(), c.ffn_scratch_dim(), c.vocab_size}));
  return std::min(largest * dtype_size(act), uint64_t(64) << 20);
}

}  // namespace flexh2o
