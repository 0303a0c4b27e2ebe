// Placement plan: which tier homes each weight tensor and each sequence's KV cache, as a
// plain value the executor consumes and tests inspect.
// Weights are grouped in units (0 = embeddings, 1..L = layers, L+1 = head) and each unit's
// tensors are placed whole by FlexGen's midpoint rule (PAPERS.md §3.3): a tensor goes to
// the tier where the midpoint of its bytes falls on the unit's cumulative axis, ordered
// [disk, host, device]. The KV cache of a micro-batch is split by whole sequences.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/policy.h"
#include "model/weights.h"
#include "offload/tier.h"

namespace flexh2o {

struct PlacedTensor {
  std::string name;   // HF name; the head's tied lm_head is "lm_head.weight (tied)"
  TensorView source;  // where the loaded model holds the bytes
  Tier tier = Tier::kDevice;
  size_t bytes = 0;
};

struct UnitPlacement {
  std::vector<PlacedTensor> tensors;
  std::array<size_t, 3> bytes{};  // per tier
  size_t streamed_bytes() const { return bytes[1] + bytes[2]; }  // cross to the device each step
};

struct WeightPlacement {
  std::vector<UnitPlacement> units;  // n_layers + 2
  std::array<size_t, 3> bytes{};     // per tier, all units
  size_t max_streamed = 0;           // largest unit's host+disk bytes (device double buffer)
  size_t max_disk = 0;               // largest unit's disk bytes (host staging double buffer)
};

// Tier chosen by the midpoint rule for a tensor whose byte midpoint sits at `mid_percent`.
Tier midpoint_tier(double mid_percent, double w_gpu_percent, double w_cpu_percent);

WeightPlacement place_weights(const Model& m, const Policy& p);

// Sequences of one micro-batch per tier: the first n_device on the device, the next n_host
// on the host, the rest on disk (FlexGen: floor of the percentages, remainder to the last).
struct KvSplit {
  int64_t n_device = 0, n_host = 0, n_disk = 0;
};
KvSplit split_kv(int64_t gpu_batch_size, const Policy& p);

}  // namespace flexh2o
