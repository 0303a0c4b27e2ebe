// Applying a KV-cache policy to a left-aligned cache segment after a step's attention:
// accumulate each slot's attention (H2O scores; query heads sharing a KV head are summed),
// record token positions, ask the policy for victims per (sequence, KV head) and compact the
// rows in place. Reports which slots changed so slower tiers can be updated with just those.
// Plain CPU code shared by the in-memory and offloading paths. Not thread-safe per state.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/unit_args.h"
#include "model/config.h"
#include "policies/kv_config.h"
#include "policies/kv_policy.h"

namespace flexh2o {

// Policy state of n sequences of one layer: score and token position of every slot.
struct KvPolicyState {
  int64_t n_seq = 0, kv_heads = 0, capacity = 0;
  std::vector<float> acc;    // [n_seq, kv_heads, capacity]
  std::vector<int32_t> pos;  // [n_seq, kv_heads, capacity]
  void reset(int64_t n, int64_t heads, int64_t cap) {
    n_seq = n, kv_heads = heads, capacity = cap;
    acc.assign(size_t(n * heads * cap), 0.f);
    pos.assign(size_t(n * heads * cap), 0);
  }
  size_t bytes() const { return acc.size() * sizeof(float) + pos.size() * sizeof(int32_t); }
  // bytes() after reset(n, heads, cap).
  static uint64_t bytes_for(int64_t n, int64_t heads, int64_t cap) {
    return uint64_t(n * heads * cap) * (sizeof(float) + sizeof(int32_t));
  }
};

struct EvictArgs {
  const KvPolicy* policy = nullptr;
  const ModelConfig* config = nullptr;
  KvSegment seg;                  // K/V rows of seg.n_seq sequences (and optional key_scores)
  int64_t score_capacity = 0;     // row stride of seg.key_scores (0: seg.capacity)
  int64_t state_first = 0;        // index of seg's first sequence inside `state` (its capacity >= seg's)
  KvPolicyState* state = nullptr;  // null: every budget is unbounded (nothing evicts, nothing to keep)
  const int32_t* len_before = nullptr;  // [seg.n_seq] cached tokens before the step
  int32_t* len_after = nullptr;         // [seg.n_seq] in: before + new rows; out: after eviction
  const int32_t* seen_before = nullptr; // [seg.n_seq] tokens the sequence had seen before the step
  const KvBudget* budgets = nullptr;    // [seg.n_seq]
  bool prefill = false;                 // stable compaction (prefill) or move-last (decode)
  uint64_t salt = 0;                    // mixed into random's per-row salt (the layer)
  // Out, [seg.n_seq * kv_heads]: slots [lo, hi) of each row were written by this step
  // (new rows that survived, or rows moved into victims' slots); empty when lo >= hi.
  std::vector<int32_t>* dirty_lo = nullptr;
  std::vector<int32_t>* dirty_hi = nullptr;
};

// A sliding-window layer's segment (a.seg.window > 0) first drops every slot outside the window
// of the next query, then lets the policy choose among the rest; so every layer keeps the same
// count. Throws if fewer than that lie in the window: check_window_budgets() refuses such
// budgets before a batch starts.
// Decides and applies: decide_kv_policy() below, then moves the K/V rows of a.seg in place.
void apply_kv_policy(const EvictArgs& a);

// Receives one (sequence b of the segment, KV head h) row's compaction: new slot i gets old
// slot keep[i] for i < keep.size(); keep[i] >= i (apply in ascending i, or in any order for
// move-last). Called only for rows that evict; the span is valid during the call only. Called
// concurrently for different sequences b (never for one b at once).
using KvKeepFn = std::function<void(int64_t b, int64_t h, std::span<const int32_t> keep)>;

// The policy's decision without touching K/V (a.seg.k / a.seg.v are not read, may be null):
// updates a.state (new slots' positions, scores accumulated from a.seg.key_scores, acc/pos
// compacted), a.len_after and the dirty ranges exactly as apply_kv_policy does, and hands each
// evicting row's keep list to `move`. The offloading engine hands the lists to Device::kv_gather.
void decide_kv_policy(const EvictArgs& a, const KvKeepFn& move);

// How many of a segment's n_seq sequences decide_kv_policy decides at once (given enough threads),
// with `slots` policy-state slots per (sequence, KV head) row: 1 below the size that pays for
// TBB's tasks, else n_seq. The cost model prices the decisions with the same rule.
int64_t kv_decision_parallelism(int64_t n_seq, int64_t kv_heads, int64_t slots);

// Throws (naming the flags to change) if a sequence that may reach max_len tokens has a bounded
// budget above the model's sliding window: its sliding-window layers could not keep that many
// tokens while its other layers do. Called by the engines' check_batch and at each batch's
// prefill. `lengths` (optional): what each budget is a share of (the prompt), named in the message.
void check_window_budgets(const ModelConfig& c, std::span<const KvBudget> budgets, int64_t max_len,
                          std::span<const int64_t> lengths = {});

// The KV policy of a run whose sequences may reach max_len tokens: `kv` as asked, except that the
// full cache of a model whose every layer slides (Mistral v0.1, Phi-3-mini, Qwen with
// use_sliding_window from layer 0) becomes `local` at the window's width once max_len passes the
// window. No layer of such a model looks further back, so the tokens are the full cache's, and a
// sequence holds `sliding_window` slots instead of max_len. The one rule that the runs (cli
// make_run_setup) and the planner (CostModel) both apply.
KvPolicyConfig window_kv_policy(const ModelConfig& c, const KvPolicyConfig& kv, int64_t max_len);
// Whether window_kv_policy() replaces the full cache of this run.
bool window_caps_full_cache(const ModelConfig& c, int64_t max_len);

// The full cache of a model with sliding layers: the slots those layers keep in a run whose
// sequences may reach max_len tokens. Without a KV policy, once max_len passes the window, a
// sliding layer keeps `local`'s window (c.sliding_window, the incoming token included) while the
// others keep everything, so each layer attends to the tokens the full cache gives it (Gemma 2/3
// and Qwen's windows mix the two; a model whose every layer slides is usually capped for the
// whole run by window_kv_policy() before this sees it). 0 (every layer keeps everything)
// otherwise. The one rule that both runners (each batch: OffloadEngine, InMemoryRunner) and the
// planner (CostModel) apply.
int64_t full_cache_window(const ModelConfig& c, bool kv_policy, int64_t max_len);
// Layers of c that slide (attention_window(l) > 0).
int64_t count_sliding_layers(const ModelConfig& c);
// Whether any of these budgets is bounded: a layer under them evicts, and keeps policy state.
bool any_bounded(std::span<const KvBudget> budgets);
// `local` at c.sliding_window, the incoming token included: a query's window. What a capped
// sliding layer keeps (window_kv_policy, full_cache_window).
KvPolicyConfig window_local_policy(const ModelConfig& c);

}  // namespace flexh2o
