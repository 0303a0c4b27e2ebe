// Policy: how a run is placed and scheduled, with FlexGen's fields and meaning (PAPERS.md §1).
// A plain value object: the planner emits it, the CLI parses it (flags or a JSON file), the
// schedule builder and executor consume it. Percentages are of bytes; disk gets the rest.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace flexh2o {

struct Policy {
  int64_t gpu_batch_size = 4;   // sequences per micro-batch (one compute call)
  int64_t num_gpu_batches = 1;  // micro-batches sharing one load of a layer's weights
  // Placement, percent of bytes on the compute device / host; the disk gets the rest.
  double w_gpu_percent = 100, w_cpu_percent = 0;          // weights, per layer (midpoint rule)
  double cache_gpu_percent = 100, cache_cpu_percent = 0;  // KV cache, split by whole sequences
  double act_gpu_percent = 100, act_cpu_percent = 0;      // hidden states: one tier only
  bool overlap = true;            // pipeline transfers with compute (false: one queue, in order)
  bool sep_layer = true;          // attention and MLP stream as separate units (each placed alike either way)
  bool pin_weight = true;         // host-homed weights in pinned memory (CUDA device)
  bool cpu_cache_compute = false; // decode attention runs on the host where the KV lives
  // FlexGen's compression (core/quant4.h: 4 bits, groups of 64): weights (2-D tensors) stored
  // and moved compressed in every tier; the KV cache stored compressed in every home (Q4 KV).
  bool compress_weight = false;
  bool compress_cache = false;

  int64_t block_size() const { return gpu_batch_size * num_gpu_batches; }
  double w_disk_percent() const { return 100 - w_gpu_percent - w_cpu_percent; }
  double cache_disk_percent() const { return 100 - cache_gpu_percent - cache_cpu_percent; }
  double act_disk_percent() const { return 100 - act_gpu_percent - act_cpu_percent; }
  // FlexGen's --percent order: w_gpu w_cpu cache_gpu cache_cpu act_gpu act_cpu (6 numbers).
  void set_percent(std::span<const double, 6> percent);

  // Throws flexh2o::Error with the reason when the policy cannot work (a percentage outside
  // [0, 100], a pair summing over 100, a split activation placement, batch sizes < 1).
  void validate() const;
  // "--percent 20 80 0 100 0 100 --gpu-batch-size 48 --num-gpu-batches 3 --cpu-cache-compute"
  std::string str() const;
};

// JSON: the field names above, plus "percent": [w_g, w_c, c_g, c_c, a_g, a_c]. Unknown keys
// are rejected with their name (a typo must not silently fall back to a default).
Policy policy_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json policy_to_json(const Policy& p);

}  // namespace flexh2o
