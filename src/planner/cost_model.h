// Cost model of OUR offloading engine (src/engine): for a Policy on a HardwareProfile and a
// workload, the bytes each link carries (exactly what OffloadEngine counts), the time of
// prefill and decode, memory per tier, throughput and the bottleneck resource.
// Time: every schedule step gets a duration (bytes / link rate, FLOPs / compute rate) and
// the engine's own zig-zag Schedule (build_schedule) is list-scheduled the way the executor
// runs it — one in-order worker per queue, a step starts when its queue is free and its
// dependencies are done; with overlap off, all steps run in order on one thread. Plain C++.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/memory_plan.h"
#include "engine/offload_engine.h"
#include "engine/schedule.h"
#include "planner/hardware.h"
#include "policies/kv_config.h"

namespace flexh2o {

struct Workload {
  int64_t prompt_len = 512, gen_len = 32;  // every sequence; gen_len counts the prefill's token
  std::optional<KvPolicyConfig> kv;        // a KV policy (h2o, ...): the cache keeps its budget only
  DType kv_dtype = DType::F16;             // of the KV cache in every tier (Q4 with compress_cache)
};
// The KV cache's dtype under a policy, as the engine decides it (offload_kv_dtype): Q4
// records when p.compress_cache, else w.kv_dtype.
DType kv_dtype_of(const Workload& w, const Policy& p);
// The activations' dtype on a device kind, as its Device gives it (CUDA: F16, the CPU: F32).
inline DType act_dtype_of(DeviceKind d) { return d == DeviceKind::kCuda ? DType::F16 : DType::F32; }

// Bytes of each weight tensor of the kinds of unit (all layers are alike), in the order
// place_weights() walks them; a layer is its attention tensors then its MLP tensors (`layer`
// is both, for whole-layer units); a tied lm_head is the last entry of `head`.
struct UnitSizes {
  std::vector<size_t> embed, attn, mlp, layer, head;
  uint64_t total(int64_t n_layers) const;  // all units, tied head counted twice (as the engine streams it)
};
// The model's units as stored plain (the base) and with Policy::compress_weight (`q4`), both
// sized by held_dtype() / held_bytes() (engine/placement.h), as placement sizes them.
struct ModelShape : UnitSizes {
  ModelConfig config;
  UnitSizes q4;
  size_t token_index = 0;  // which of `embed` is the token table (vocab rows)
  // From the config alone, weights in config.dtype (presets, dummy weights).
  static ModelShape from_config(const ModelConfig& c);
  // From a loaded model: the checkpoint's dtypes, or every tensor at `as` (what a CUDA device holds).
  static ModelShape from_model(const Model& m, std::optional<DType> as = std::nullopt);
  const UnitSizes& units(const Policy& p) const { return p.compress_weight ? q4 : *this; }
  uint64_t total_bytes() const { return total(config.n_layers); }  // uncompressed
  uint64_t total_bytes(const Policy& p) const { return units(p).total(config.n_layers); }
  // total_bytes(p) with a tied lm_head counted once: the weights a placement stores.
  uint64_t weight_bytes(const Policy& p) const;
  // One pipeline stage of this model: `layers` layers (config.n_layers = layers), with the
  // embedding only when `embed` and the final norm + lm_head only when `head`; a unit left out
  // has no weights and no compute (its schedule steps keep their fixed overheads).
  ModelShape stage(int64_t layers, bool embed, bool head) const;
};
// Per-tier bytes the embedding unit moves in a step of `rows` token rows: a host- or disk-homed
// token table moves only min(rows, vocab) of its rows (the engine gathers them).
std::array<uint64_t, 3> embed_moved(const ModelShape& m, const Policy& p, uint64_t rows);

struct Estimate {
  Policy policy;
  int64_t block = 0;                         // sequences per run (gbs x num_gpu_batches)
  std::array<uint64_t, kNumLinks> bytes{};   // whole run, indexed by Link
  std::array<double, kNumQueues> busy{};     // seconds each resource works, whole run
  double prefill_s = 0, decode_s = 0;        // whole run
  double prefill_layer_s = 0, decode_layer_s = 0;  // one layer, steady state (decode: mean length)
  double throughput = 0;                     // generated tokens / (prefill + decode), tokens/s
  std::string bottleneck;                    // queue_name() of the busiest resource
  std::array<uint64_t, 3> memory{};          // bytes per tier (home + working set), plan_memory()
  bool fits = true;                          // memory within every tier's usable capacity
  std::string memory_note;                   // which tier overflows and by how much, when !fits
  int64_t kv_tokens = 0;                     // KV rows a sequence keeps between steps (prompt+gen; a budget B: B - 1)
};

// Not thread-safe (caches schedules). Cheap to construct.
class CostModel {
 public:
  CostModel(ModelShape m, HardwareProfile hw, Workload w);

  // Full estimate. Throws flexh2o::Error for an invalid policy.
  Estimate estimate(const Policy& p);
  // Faster estimate for the search: decode simulated at the mean length only; no bytes.
  Estimate quick(const Policy& p);
  // Bytes per tier: plan_memory() (engine/memory_plan.h), what the engine allocates.
  std::array<uint64_t, 3> memory(const Policy& p) const;
  // With `groups` blocks in flight at once (pipeline groups: every group's KV cache, hidden
  // states and step buffers live together): the plan of p with num_gpu_batches x groups.
  std::array<uint64_t, 3> memory(const Policy& p, int64_t groups) const;
  // plan_memory()'s breakdown text for this policy.
  std::string memory_breakdown(const Policy& p) const;
  // Bytes per link over the whole run; exactly what OffloadEngine counts for `block`
  // sequences of prompt_len tokens generating gen_len tokens each.
  std::array<uint64_t, kNumLinks> bytes(const Policy& p) const;

  // KV bytes of one token, all layers, K and V (Q4 records with p.compress_cache).
  uint64_t kv_token_bytes(const Policy& p) const;

  const ModelShape& shape() const { return m_; }
  const HardwareProfile& hardware() const { return hw_; }
  const Workload& workload() const { return w_; }
  // KV rows a sequence keeps after a step: min(prompt+gen, budget-1) under a bounded KV
  // policy (the engine leaves room for the incoming token), else prompt+gen.
  int64_t kv_keep() const { return keep_; }
  // Under a window cap (full_cache_window()): the window, and the rows each sliding layer keeps.
  int64_t window_cap() const { return window_; }
  // KV slots per sequence of the host/disk homes, as the engine sizes them (prompt+gen without
  // a bounded KV policy, else the budget); device-side buffers: device_capacity().
  int64_t capacity() const;
  int64_t device_capacity() const { return cap_w_; }
  DType act_dtype() const { return act_; }  // of the profile's device kind (CUDA: F16, CPU: F32)

 private:
  MemoryPlan plan(const Policy& p) const;
  struct Sim {
    double t = 0;
    std::array<double, kNumQueues> busy{};
  };
  Sim token_step(const Policy& p, bool prefill, int64_t len_before);
  // KV rows a decode step with `tokens` cached tokens before it reads per layer: the mean over
  // the layers (a window cap keeps fewer in its sliding layers; the simulated layers are alike).
  int64_t kv_len(int64_t tokens) const;
  Sim simulate(const Policy& p, bool prefill, int64_t len_before, int layers);
  Estimate finish(const Policy& p, double prefill, const std::array<double, kNumQueues>& busy, double decode,
                  double pl, double dl);
  const Schedule& schedule(const ScheduleShape& s, uint64_t key);

  ModelShape m_;
  HardwareProfile hw_;
  Workload w_;
  int64_t keep_ = 0, cap_w_ = 0, cap_h_ = 0, budget_max_ = 0;
  int64_t window_ = 0, window_layers_ = 0, keep_window_ = 0;  // the window cap, its layers and their rows
  DType act_ = DType::F32;
  std::map<uint64_t, Schedule> schedules_;
};

}  // namespace flexh2o
