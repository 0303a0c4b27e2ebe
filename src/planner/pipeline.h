// Pipeline plans for `mpirun -np S flexh2o generate --pipeline-stages S`: the layer split across
// S stages (balanced by the cost model, not by count), each stage's own placement policy within
// its own memory, the number of groups in flight (FlexGen's num_inner_iterations), and the
// job's predicted throughput and bubble fraction. Plain C++: no MPI, no I/O; values only.
// Not thread-safe per call (each call builds its own cost models); the functions share nothing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/hardware.h"
#include "planner/planner.h"

namespace flexh2o {

// S + 1 layer boundaries of n_layers split by count (the first n_layers % S stages get one more).
// Throws flexh2o::Error unless 1 <= stages <= n_layers.
std::vector<int64_t> even_bounds(int64_t n_layers, int64_t stages);

// The contiguous split of layer_cost.size() layers into stage_extra.size() stages (each >= 1
// layer) that minimises the largest stage cost, stage s costing
//   stage_extra[s] + stage_scale[s] * (sum of layer_cost over its layers)
// (stage_scale empty: all 1). stage_extra is what a stage costs besides its layers (the
// embedding on stage 0, the final norm + lm_head and sampling on the last); stage_scale lets
// stages on different hardware run a layer at different speeds. Exact (dynamic programming,
// O(S x L^2)); of equal splits the one whose boundaries come first. Returns S + 1 boundaries.
// Throws flexh2o::Error unless 1 <= S <= layers, sizes agree and every cost is finite, >= 0.
std::vector<int64_t> balance_layers(const std::vector<double>& layer_cost, const std::vector<double>& stage_extra,
                                    const std::vector<double>& stage_scale = {});

// The cost-balanced split for one given policy run on every stage (`generate --pipeline-stages
// S` with a fixed policy): each stage's time for one group's whole run by the cost model (its
// per-layer time and what it costs besides its layers: embedding on stage 0, final norm +
// lm_head on the last), balanced by balance_layers. `hw`: one profile, or one per stage.
// Throws flexh2o::Error for an invalid policy or S outside [1, n_layers].
std::vector<int64_t> balance_stages(const ModelShape& m, const std::vector<HardwareProfile>& hw, const Workload& w,
                                    int64_t stages, const Policy& p);

// What the pipeline's time depends on, seconds. Steps: t = 0 the prefill, t = 1..T-1 decode.
struct PipelineTiming {
  std::vector<double> prefill_s, decode_s;          // per stage: one group's prefill step / decode step
  std::vector<double> prefill_hop_s, decode_hop_s;  // per boundary s -> s+1 (S - 1): one group's hidden states
  double return_s = 0;                              // last stage -> stage 0: one group's next token ids (0 when S = 1)
  int64_t groups = 1;                               // G, groups in flight
  int64_t gen_len = 1;                              // T, token steps per sequence (the prefill's included)
};

// THE pipeline formula (the runtime bench prints it as "predicted" beside its measurement).
// Each stage runs every group's step t in group order; c_s(t) = prefill_s / decode_s of stage
// s, x_b(t) the hop of boundary b, r = return_s, G groups, T steps, S stages:
//   busy_s  = G * sum_t c_s(t)
//   chain   = (G-1) c_0(0) + sum_t [ sum_s c_s(t) + sum_b x_b(t) ] + (T-1) r
//             (the last group's own dependency chain: each step waits for its previous token)
//   res_s   = sum_{j<s} (c_j(0) + x_j(0)) + busy_s + sum_{j>s} (x_{j-1}(T-1) + c_j(T-1))
//             (stage s waits for the first group to reach it, works busy_s, and the last
//             group then still crosses the later stages)
//   link_b  = the same for boundary b as a resource busy G * sum_t x_b(t)
//   wall    = max(chain, max_s res_s, max_b link_b)
//   bubble  = 1 - sum_s busy_s / (S * wall)     (the runtime measures 1 - stage busy / wall)
// Limits: S = 1 gives bubble 0 for any G; with G at least groups_to_hide() the chain is hidden
// and only fill and drain remain: equal stages c and no link time give (S-1) / (G T + S - 1),
// which goes to 0 as G grows. All throw flexh2o::Error for inconsistent sizes or G, T < 1.
double pipeline_wall_s(const PipelineTiming& t);
double stage_busy_s(const PipelineTiming& t, size_t stage);
double bubble_fraction(const PipelineTiming& t);
// The smallest G in [1, max_groups] whose chain is hidden (chain <= max(res, link): the
// bottleneck never waits for a group's round trip through the stages and links); max_groups
// if none. Uses t's times with t.groups replaced.
int64_t groups_to_hide(const PipelineTiming& t, int64_t max_groups);

struct PipelineOptions {
  int64_t stages = 1;
  int64_t groups = 0;      // G; 0: groups_to_hide(), lowered to what every stage's memory holds
  int64_t max_groups = 64;
  SearchOptions search;    // each stage's placement search (search.groups is set by the planner)
  std::optional<StageLink> link;  // every boundary; unset: the sending stage's between_stages()
  std::vector<int64_t> bounds;    // S + 1 boundaries to use as given; empty: cost-balanced
};

struct StagePlan {
  int64_t first = 0, end = 0;  // layers [first, end)
  bool embed = false, head = false;
  std::string hardware;        // the stage's profile name
  Estimate estimate;           // full estimate of ONE group on this stage (its memory: one group)
  double prefill_step_s = 0, decode_step_s = 0;  // one group's prefill step / mean decode step
  std::array<uint64_t, 3> memory{};              // bytes per tier with all G groups
};

struct PipelinePlan {
  std::vector<int64_t> bounds;        // S + 1 layer boundaries
  int64_t groups = 1;                 // G chosen (or given)
  int64_t groups_to_hide = 1;         // what hiding the transfers and the fill asked for
  bool groups_capped = false;         // memory allowed fewer than groups_to_hide
  int64_t block = 0;                  // sequences per group (gpu_batch_size x num_gpu_batches, all stages)
  std::vector<StagePlan> stages;
  std::vector<StageLink> links;       // per boundary
  // Bytes per group step: hidden states across one boundary (rows x hidden x activation
  // dtype; rows = block x prompt at the prefill, block at decode), and the driver's token ids
  // + positions to stage 0 (3 int32 per row, decode).
  uint64_t prefill_hop_bytes = 0, decode_hop_bytes = 0, return_bytes = 0;
  PipelineTiming timing;
  double wall_s = 0;                  // one job of G groups, pipeline_wall_s()
  double throughput = 0;              // generated tokens / wall (G x block x gen_len)
  double decode_throughput = 0;       // decode tokens / (wall - the wall of the prefill alone)
  double bubble = 0;                  // bubble_fraction()
};

// For `generate --pipeline-stages S --policy auto`: plan.bounds, plan.groups and each
// plan.stages[s].estimate.policy are what the ranks run.
// Plans the pipeline of `m` on per-stage profiles (one: every stage on that; else one per
// stage). All stages share one batch shape (gpu_batch_size x num_gpu_batches: a group is one
// engine batch on every stage); each has its own placement searched on its own layers within
// its own memory for G groups at once. Steps: the best shape on the starting split (even, or
// given) with G = o.groups or S; then (when not given) the split re-balanced by the stages'
// cost-model times (per-layer cost and extra cost of each stage, balance_layers) while the
// slowest stage improves; then G = groups_to_hide() when not given, lowered until every stage
// fits. Throws flexh2o::Error naming the stage, its layers and profile when one cannot fit
// (or not with G groups), and for bad options (S outside [1, n_layers], bounds, G < 0).
PipelinePlan plan_pipeline(const ModelShape& m, const std::vector<HardwareProfile>& hw, const Workload& w,
                           const PipelineOptions& o);
PipelinePlan plan_pipeline(const ModelConfig& c, const std::vector<HardwareProfile>& hw, const Workload& w,
                           const PipelineOptions& o);

}  // namespace flexh2o
