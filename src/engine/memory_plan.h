// The bytes an offloaded run holds per tier, item by item: the one formula the engine
// allocates by (offload_batch.cpp sizes every buffer from a MemoryPlan) and the planner
// predicts with (cost_model.cpp), so the two cannot drift. Plain C++; no allocation here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/device.h"
#include "engine/placement.h"
#include "engine/policy.h"
#include "offload/tier.h"

namespace flexh2o {

// Weight bytes per tier as the device holds them, and the largest streamed / disk unit.
struct WeightBytes {
  std::array<uint64_t, 3> homed{};
  uint64_t max_streamed = 0, max_disk = 0;
  static WeightBytes of(const WeightPlacement& wp);
};

// Scoring steps (many rows of logits a sequence) run the head over many rows a call: each call
// reads the whole lm_head, so one a row made the head most of an offloaded scoring step. Their
// device logits slot may grow to this many bytes for it (planned; an engine whose device budget
// lacks them falls back to the generation slot).
inline constexpr uint64_t kHeadLogitsBytes = uint64_t(16) << 20;

// Rows of each of n sequences one head call computes in a step that returns logit_rows rows a
// sequence, with `slot_bytes` of fp32 logits on the device: as many as fit, 1 to logit_rows.
int64_t head_rows_per_call(int64_t vocab, int64_t n, int64_t logit_rows, uint64_t slot_bytes);

// What sizes a batch.
struct BatchDims {
  int64_t rows = 1;          // T of the longest step per sequence (the prefill's padded prompt)
  int64_t capacity = 1;      // KV slots a sequence may need without a policy (prompt + generated)
  int64_t budget_max = 0;    // largest bounded KV-policy budget of the batch; 0 = none
  bool kv_policy = false;    // a KV policy runs (decisions on the host)
  bool scores = false;       // ... and needs attention scores
  int64_t logit_rows = 1;    // rows of logits a sequence a step returns (StepRunner::step_rows)
  // Device logits a step of logit_rows > 1 may use so that one head call computes many rows
  // (head_rows_per_call); 0: the generation slot's (a row a sequence of the block) only.
  uint64_t head_logits_bytes = kHeadLogitsBytes;
  // A pipeline stage (Model::stage): after the first it reads hidden rows instead of token ids,
  // before the last it returns hidden rows instead of logits ([B * rows, hidden] in act).
  bool hidden_in = false, hidden_out = false;
  // A window cap (full_cache_window(): the full cache of a model with sliding layers): its
  // `window_layers` sliding layers keep `window` slots a sequence; 0: none.
  int64_t window = 0, window_layers = 0;
  // Sequences of this batch when fewer than the policy's block: micro-batches of gpu_batch_size,
  // the last one the rest (what the engine allocates); 0: the whole block.
  int64_t batch = 0;

  bool operator==(const BatchDims&) const = default;
};

// Run-wide constants of a plan.
struct PlanDtypes {
  DeviceKind device = DeviceKind::kCpu;
  DType kv = DType::F16, act = DType::F32;
};

struct MemoryItem {
  Tier tier = Tier::kDevice;
  std::string what;
  uint64_t bytes = 0;
};

// KV slots per (sequence, head) of a class of layers: device-side buffers (the prefill attends
// the whole prompt) and homes on the host or disk (a bounded policy's budget); and the K+V bytes
// of one sequence at each. A disk home has the host home's layout, packed (kv_disk_stage_bytes).
struct KvSlots {
  int64_t cap_w = 0, cap_h = 0;
  uint64_t device_seq = 0, home_seq = 0;
};

struct MemoryPlan {
  // Every layer's KV slots, or under a window cap the full-attention layers' (the widest: the
  // staging slots, scores and keep lists are sized by them).
  int64_t cap_w = 0, cap_h = 0;
  KvSplit split;  // of one full micro-batch
  // Bytes of one buffer of each kind (the engine allocates exactly these; 0 = not allocated).
  uint64_t kv_device_seq = 0, kv_home_seq = 0;  // K+V of one sequence: cap_w / cap_h slots
  // Under a window cap (BatchDims::window), the sliding layers' slots; else the same as above.
  KvSlots window;
  KvSlots slots(bool windowed) const {
    return windowed ? window : KvSlots{cap_w, cap_h, kv_device_seq, kv_home_seq};
  }
  uint64_t hidden = 0;                                 // one micro-batch's hidden states
  uint64_t qkv_rows = 0, attn_rows = 0;                // per row: q|k|v and attention output
  uint64_t scores = 0;                                 // one score slot (micro-batch, fp32)
  uint64_t keep = 0;                                   // one keep-list slot (int32, a micro-batch)
  uint64_t inputs = 0;                                 // a block's step inputs
  uint64_t logits = 0;       // device fp32 logits: a row a sequence, or head_rows rows of a micro-batch if more
  uint64_t logits_host = 0;  // ... on the host: BatchDims::logit_rows a sequence
  int64_t head_rows = 1;     // rows of each sequence a head call computes (head_rows_per_call)
  uint64_t hidden_in = 0, hidden_out = 0;              // a stage's hidden rows in / out (a block)
  std::vector<MemoryItem> items;
  std::array<uint64_t, 3> bytes{};
  std::string breakdown() const;  // "  device: weights homed 1.2 GiB\n  ..."
};

// Bytes of the host staging of n disk-homed sequences of seq_bytes (KvSlots::home_seq) each:
// their file's layout, rounded up to whole 4096-byte pages, as disk rows move in whole pages
// that may span heads and sequences.
uint64_t kv_disk_stage_bytes(int64_t n, uint64_t seq_bytes);

MemoryPlan plan_memory(const ModelConfig& c, const WeightBytes& w, const Policy& p, const BatchDims& d,
                       const PlanDtypes& t);

// 1536 -> "1.5 KiB" (binary units).
std::string human_bytes(uint64_t b);
// human_bytes(b), with the exact count added where it would read the same as human_bytes(other):
// a budget one byte short of a need should not read "10 MiB is too small ... needs 10 MiB".
std::string human_bytes_beside(uint64_t b, uint64_t other);

}  // namespace flexh2o
