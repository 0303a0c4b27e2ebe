// GpuOffloadRunner: FlexGen-style offloading on a CUDA GPU, driven by the engine's Schedule
// value (engine/schedule.h). Weights are homed by place_weights() (midpoint rule): device-homed
// tensors uploaded once as F16/BF16, host-homed ones kept in pinned host memory (converted
// once, or the model's own bytes page-locked in place when already in the compute dtype) and
// copied per step into one of two device weight slots on a copy stream, overlapped with
// compute through one CUDA event per schedule step. The KV cache is either on the GPU (cache
// 100 0) or on the host (cache 0 100 with --cpu-cache-compute: HostKv, decode attention on the
// CPU, KV policies such as H2O applied there, FlexGen's OPT-30B policy); hidden states either
// stay on the GPU (act 100 0) or go to pinned host memory between units (act 0 100). Weights
// on disk are refused. The streamed token table (unit 0) is copied whole, not row-gathered
// like the CPU engine. No CUDA headers here: without CUDA the constructor throws
// (gpu_offload_runner_stub.cpp).
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
  Policy policy;             // see check_gpu_offload_policy (offload_plan.h) for what is wired
  size_t device_budget = 0;  // bytes for everything on the device (--gpu-mem); 0: free memory
  size_t host_budget = 0;    // host-homed weights + host KV cache (--cpu-mem); 0: unlimited
  const KvPolicy* kv_policy = nullptr;  // only with the cache on the host; must outlive the runner
};

struct GpuOffloadReport {
  std::string device_name, dtype, policy;
  size_t device_total_bytes = 0, budget_bytes = 0, arena_peak_bytes = 0;
  size_t weight_device_bytes = 0, weight_host_bytes = 0, slot_bytes = 0;
  size_t host_registered_bytes = 0;  // of weight_host_bytes: the model's bytes pinned in place
  uint64_t host_to_device_bytes = 0, weight_bytes_moved = 0, device_to_host_bytes = 0;
  int64_t steps = 0;
  double step_seconds = 0, upload_seconds = 0;  // all token steps (host wall), weight setup
  // Per stream (compute, host->device, device->host): seconds between each step's start and end
  // events, summed (the compute stream's include the host attention it waits for); the sum
  // over token steps of the busiest stream's; and the host attention (HostKv::attend) alone.
  std::array<double, 3> stream_busy_seconds{};
  double busiest_stream_seconds = 0, host_attention_seconds = 0;
  // Sum over token steps of the busiest stream / their wall time: 1 = perfect overlap.
  double overlap_efficiency() const { return step_seconds > 0 ? busiest_stream_seconds / step_seconds : 0; }
};

class GpuOffloadRunner final : public StepRunner {
 public:
  // Places and uploads `model`'s weights (blocking); `model` must outlive the runner. Throws
  // Error when CUDA is not compiled in, no GPU is usable, the policy is not wired on CUDA
  // (check_gpu_offload_policy), or the weights and slots do not fit the budget (every item's
  // bytes and the budget in the message).
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
