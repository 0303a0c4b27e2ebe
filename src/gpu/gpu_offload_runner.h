// GpuOffloadRunner: FlexGen-style weight offloading on a CUDA GPU, driven by the engine's
// Schedule value (engine/schedule.h). Weights are homed by place_weights() (midpoint rule):
// device-homed tensors uploaded once as F16/BF16, host-homed ones kept in pinned host memory
// (converted once, or the model's own bytes page-locked in place when already in the compute
// dtype) and copied per step into one of two device weight slots on a copy stream, overlapped
// with compute through one CUDA event per schedule step. KV cache and activations stay on the
// GPU (--percent w_g w_c 100 0 100 0, w_g + w_c = 100). The streamed token table (unit 0) is
// copied whole, not row-gathered like the CPU engine. No KV policy yet (refused). No CUDA
// headers here: without CUDA the constructor throws (gpu_offload_runner_stub.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/policy.h"
#include "engine/runner.h"
#include "model/weights.h"
#include "policies/kv_policy.h"

namespace flexh2o::gpu {

struct GpuOffloadOptions {
  Policy policy;             // cache_gpu = act_gpu = 100, no disk share of the weights
  size_t device_budget = 0;  // bytes for everything on the device (--gpu-mem); 0: free memory
  size_t host_budget = 0;    // pinned host-homed weights (--cpu-mem); 0: unlimited
  const KvPolicy* kv_policy = nullptr;  // must be null: KV policies are not wired here yet
};

struct GpuOffloadReport {
  std::string device_name, dtype, policy;
  size_t device_total_bytes = 0, budget_bytes = 0, arena_peak_bytes = 0;
  size_t weight_device_bytes = 0, weight_host_bytes = 0, slot_bytes = 0;
  size_t host_registered_bytes = 0;  // of weight_host_bytes: the model's bytes pinned in place
  uint64_t host_to_device_bytes = 0, weight_bytes_moved = 0, device_to_host_bytes = 0;
  int64_t steps = 0;
  double step_seconds = 0, upload_seconds = 0;  // all token steps (host wall), weight setup
};

class GpuOffloadRunner final : public StepRunner {
 public:
  // Places and uploads `model`'s weights (blocking); `model` must outlive the runner. Throws
  // Error when CUDA is not compiled in, no GPU is usable, the policy offloads the KV cache or
  // activations or homes weights on disk, a KV policy is given, or the weights and slots do not
  // fit the budget (every item's bytes and the budget in the message).
  GpuOffloadRunner(const Model& model, const GpuOffloadOptions& options);
  ~GpuOffloadRunner() override;
  GpuOffloadRunner(const GpuOffloadRunner&) = delete;
  GpuOffloadRunner& operator=(const GpuOffloadRunner&) = delete;

  const ModelConfig& config() const override;
  int64_t max_batch() const override;  // the policy's block: gpu_batch_size x num_gpu_batches
  void begin_batch(int64_t B, int64_t capacity) override;
  // Blocking once: returns when the logits are on the host. The first step of a batch sizes
  // its buffers and fails (items and budget) when they do not fit.
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override;
  size_t kv_bytes() const override;
  void expect_more_steps(bool more) override;

  GpuOffloadReport report() const;
  std::vector<int32_t> lengths() const;  // tokens cached per sequence (tests)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexh2o::gpu
