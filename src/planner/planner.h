// Policy search: the Policy (batch shape and tier percentages) that maximises predicted
// throughput of our engine under the tiers' usable memory, by exact search over a grid with
// pruning (see planner.cpp for why a grid and not FlexGen's LP). Plain C++; no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace flexh2o {

struct SearchOptions {
  std::vector<int64_t> gpu_batch_sizes;  // empty: 1, 2, 4, 8, 12, ..., 512
  int64_t max_num_gpu_batches = 64;
  int64_t max_block = 0;          // cap on gbs x num_gpu_batches (0: none), e.g. the request count
  int weight_step = 5;            // percent grid of the weight split
  int cache_step = 10;            // percent grid of the KV split
  bool allow_cpu_cache_compute = true;
  bool allow_act_on_host = true;
  bool allow_disk = true;         // weights / KV may be homed on disk
  bool overlap = true, sep_layer = true;  // fixed, not searched
  // 4-bit compression (Policy::compress_weight / compress_cache): a value fixes it; unset
  // searches both settings when the profile prices dequantization (prices_compression()),
  // else leaves it off.
  std::optional<bool> compress_weight, compress_cache;
  // Blocks whose memory lives at once (pipeline groups, planner/pipeline.h): a policy fits when
  // CostModel::memory(p, groups) does.
  int64_t groups = 1;
};

struct PlanResult {
  Estimate best;              // full estimate of the chosen policy
  int64_t evaluated = 0;      // policies whose time was predicted
  int64_t rejected_memory = 0;
};

// The block shapes a search tries: for each gpu batch size of o.gpu_batch_sizes (empty: 1, 2, 4,
// 8, 12, ..., 512), num_gpu_batches from 1 up to o.max_num_gpu_batches (gbs x ngb within
// o.max_block), until `eval(gbs, ngb)` returns nullopt (nothing fits: larger blocks fit less) or
// its throughput has not grown by more than the factor `min_gain` for 3 steps in a row.
void for_each_block_shape(const SearchOptions& o, double min_gain,
                          const std::function<std::optional<double>(int64_t gbs, int64_t ngb)>& eval);

// The smallest run a search can offer: batch 1, weights and KV offloaded (to disk, or to the
// host when `allow_disk` is false), for the numbers of an "infeasible" message.
Policy smallest_policy(bool allow_disk);
// What an "infeasible" message says of that run's `memory` on `hw`: " does not: <overflow_note>",
// or " fits, but no block shape of the search does".
std::string smallest_run_verdict(const HardwareProfile& hw, const std::array<uint64_t, 3>& memory);

// Searches. Throws flexh2o::Error when nothing fits, stating the shortfall (bytes the smallest
// run needs vs the usable capacity of all tiers together, or of the tier that overflows).
PlanResult search_policy(CostModel& cm, const SearchOptions& opts = {});

// The best placement (weight, KV and activation split, CPU attention, compression as `opts`
// allows) of the fixed batch shape gbs x ngb, by quick() estimates; nullopt when none fits.
// Counts into `stats` when given.
std::optional<Estimate> best_placement(CostModel& cm, const SearchOptions& opts, int64_t gbs, int64_t ngb,
                                       PlanResult* stats = nullptr);

// The entry point for `generate --policy auto`: the best policy for `c` on `hw`.
// `weights_from` (optional) supplies the checkpoint's dtypes; presets use c.dtype.
Policy plan_policy(const ModelConfig& c, const HardwareProfile& hw, const Workload& w,
                   const SearchOptions& opts = {});
// `as`: the dtype the device holds every weight in (a CUDA device), else the checkpoint's. The
// chosen policy with its predicted throughput and bottleneck (what `--policy auto` reports).
Estimate plan_policy(const Model& m, const HardwareProfile& hw, const Workload& w, const SearchOptions& opts = {},
                     std::optional<DType> as = std::nullopt);

// FlexGen's own published cost model (PAPERS.md §4, experimental/cost_model.py) evaluated for
// a policy: fp16 weights and KV (weight bytes / 4 with compress_weight, FlexGen's rough factor;
// it models no cache compression), its fitted constants taken from `hw`. Returns tokens/s.
// For comparison only: it models FlexGen's scheduler, not ours.
double flexgen_reference_throughput(const ModelConfig& c, const HardwareProfile& hw, const Workload& w,
                                    const Policy& p);

}  // namespace flexh2o
