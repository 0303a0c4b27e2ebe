// GpuModel: a loaded Model's weights copied into one device arena as F16 (BF16 for bf16
// checkpoints), converted on the host from f32/f16/bf16 through a pinned staging buffer.
// Refuses up front, naming the bytes needed and free, when the weights do not fit. Owns the
// device memory; hands out a GpuModelWeights view. Move-only; not thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "gpu/weights_view.h"
#include "kernels/cuda/resources.h"
#include "model/weights.h"

namespace flexh2o::gpu {

class GpuModel {
 public:
  // Uploads every tensor of `m` to the current device (blocking; `m` may be dropped after).
  // `max_bytes` > 0 caps the device memory it may use below what is free (tests, budgets).
  // Throws Error when the weights do not fit (bytes needed, free and total in the message)
  // or on a CUDA failure.
  explicit GpuModel(const Model& m, size_t max_bytes = 0);
  GpuModel(GpuModel&&) noexcept = default;
  GpuModel& operator=(GpuModel&&) noexcept = default;

  const GpuModelWeights& weights() const { return w_; }
  DType dtype() const { return w_.dtype; }
  size_t bytes() const { return arena_.used(); }  // device bytes the weights occupy
  double upload_seconds() const { return upload_s_; }

 private:
  DeviceArena arena_;
  GpuModelWeights w_;
  double upload_s_ = 0;
};

}  // namespace flexh2o::gpu
