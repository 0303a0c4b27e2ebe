// The transformer forward pass on the CPU device (OPT and LLaMA), one step at a time:
// T new tokens for each of B sequences, appended to a KvCache. Prefill is a step with T =
// padded prompt length; decode is a step with T = 1. The layer function is separate so the
// offloading scheduler can drive layers one by one. Not thread-safe: one Forward per driver.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cpu_device.h"
#include "engine/kv_cache.h"
#include "model/weights.h"

namespace flexh2o {

enum class LogitsRows { kLast, kAll };

class Forward {
 public:
  // `model` and `dev` must outlive the Forward.
  Forward(const Model& model, CpuDevice& dev) : model_(model), dev_(dev) {}

  // ids, positions: [B, T] row-major (B = cache.batch()). Appends K/V at slots
  // [cache.length(), +T) and advances cache.length(). Logits (fp32) are written to `logits`:
  // kLast -> [B, vocab] for each sequence's last row; kAll -> [B, T, vocab].
  void step(const int32_t* ids, const int32_t* positions, int64_t T, KvCache& cache, LogitsRows rows,
            std::vector<float>& logits);

  const Model& model() const { return model_; }
  CpuDevice& device() { return dev_; }

 private:
  void layer(int i, int64_t B, int64_t T, const int32_t* positions, KvCache& cache);

  const Model& model_;
  CpuDevice& dev_;
  // Scratch, grown on demand and reused across steps.
  std::vector<float> hidden_, normed_, q_, k_, v_, attn_, ffn_a_, ffn_b_, last_;
};

}  // namespace flexh2o
