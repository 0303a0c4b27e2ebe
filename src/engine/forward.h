// The in-memory forward pass (everything resident, one device): T new tokens for each of B
// sequences, appended to a KvCache. Prefill is a step with T = padded prompt length; decode
// a step with T = 1. The offloading executor runs the same LayerCompute unit by unit.
// Not thread-safe: one Forward per driver thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/cpu_device.h"
#include "engine/kv_cache.h"
#include "engine/layer_compute.h"
#include "model/weights.h"

namespace flexh2o {

// The rows a step returns logits of: every row ([B, T, vocab]), or each sequence's last `last`
// rows ([last, B, vocab], block i the rows T - last + i; last 1: [B, vocab]).
struct LogitsRows {
  bool all = false;
  int64_t last = 1;
  static LogitsRows last_rows(int64_t n) { return {false, n}; }
  static const LogitsRows kLast, kAll;
};
inline const LogitsRows LogitsRows::kLast{false, 1};
inline const LogitsRows LogitsRows::kAll{true, 0};

// Thrown by a step that a stop flag ended before its last layer (Forward::step's `stop`,
// StepRunner::stop_steps_on()): the step's cache is left unusable (a new cache, or
// StepRunner::begin_batch(), before the next step); nothing else is.
struct StepStopped : Error {
  StepStopped() : Error("step stopped") {}
};

class Forward {
 public:
  // `model` and `dev` must outlive the Forward.
  Forward(const Model& model, CpuDevice& dev) : model_(model), dev_(dev), weights_(&model.weights()) {}
  // The weights as held for this run (CompressedWeights::weights() for a compressed run; must
  // outlive their use), or null for the model's own.
  void use_weights(const ModelWeights* w) { weights_ = w ? w : &model_.weights(); }

  // ids, positions: [B, T] row-major (B = cache.batch()), left-padded: sequence b's last
  // real_rows[b] rows are tokens (null: all T). Appends their K/V after each sequence's
  // cached tokens. Logits of the rows `rows` names (1 <= rows.last <= T).
  // With `policy` (and cache.enable_policy() done), each layer's cache is cut back to the
  // sequence's budget right after its attention (see kv_evict.h). Once `*stop` is set (optional;
  // a stop signal), it throws StepStopped before the next layer.
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, KvCache& cache,
            LogitsRows rows, std::vector<float>& logits, const KvPolicy* policy = nullptr,
            const std::atomic<bool>* stop = nullptr);

  const Model& model() const { return model_; }
  CpuDevice& device() { return dev_; }

 private:
  const Model& model_;
  CpuDevice& dev_;
  const ModelWeights* weights_;
  LayerCompute compute_;
  std::vector<float> hidden_;
  std::array<std::vector<int32_t>, 2> seq_keys_, evicted_;  // [class of layers][B]
  std::vector<int32_t> dirty_lo_, dirty_hi_;
  std::vector<float> scores_;
};

}  // namespace flexh2o
