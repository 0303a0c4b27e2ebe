// GpuRunner: the all-resident StepRunner on a CUDA GPU — weights (GpuModel), KV cache
// (F16/BF16, left-aligned [B, kv_heads, capacity, head_dim] per layer) and activations on the
// device; logits come back as fp32. With a KV policy, each layer's fp32 key scores are
// downloaded after the step, the host policy code (engine/kv_evict.h) decides, and the keep
// lists are applied on the device with gpu::kv_gather: the same slots as the CPU runner.
// No CUDA headers here: in a build without CUDA the constructor throws (gpu_runner_stub.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_evict.h"
#include "engine/runner.h"
#include "model/weights.h"
#include "policies/kv_policy.h"

namespace flexh2o::gpu {

struct GpuRunnerOptions {
  int64_t max_batch = 8;
  const KvPolicy* policy = nullptr;  // null: full cache; must outlive the runner
  // > 0: the weights may use at most this many device bytes (tests; default: what is free).
  size_t max_weight_bytes = 0;
};

// What the run report says about the device.
struct GpuRunInfo {
  std::string device_name;
  size_t device_total_bytes = 0;
  std::string dtype;          // compute dtype of weights, activations and KV ("F16" / "BF16")
  size_t weight_bytes = 0;    // on the device
  double upload_seconds = 0;  // host -> device weight upload, conversion included
};

class GpuRunner final : public StepRunner {
 public:
  // Uploads `model` to device 0 (blocking). `model` must outlive the runner (config).
  // Throws Error when CUDA is not compiled in, no GPU is usable, the weights do not fit, or
  // the model needs what the CUDA kernels lack (head_dim other than 64/128).
  GpuRunner(const Model& model, const GpuRunnerOptions& options);
  ~GpuRunner() override;
  GpuRunner(const GpuRunner&) = delete;
  GpuRunner& operator=(const GpuRunner&) = delete;

  const ModelConfig& config() const override;
  int64_t max_batch() const override;
  void begin_batch(int64_t B, int64_t capacity) override;
  // Blocking: returns once the logits are on the host (and the policy's keep lists queued).
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override;
  // Device K/V bytes of the current batch plus the host-side policy state.
  size_t kv_bytes() const override;

  GpuRunInfo info() const;
  // For tests and debugging: tokens cached per sequence of the current batch, and layer
  // `layer`'s policy state (the token position and score of every slot); null without a policy.
  std::vector<int32_t> lengths() const;
  const KvPolicyState* policy_state(int64_t layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexh2o::gpu
