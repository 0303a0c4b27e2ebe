// KV-cache eviction policies: the one interface (KvPolicy) and its value types.
// A policy only DECIDES which cache slots of one (layer, sequence, KV head) row to drop; the
// engine owns the data and moves it (see keep_list.h for turning victims into a compaction plan).
// Plain C++: no CUDA, no engine dependency. Choices the papers leave open are listed below and in
// policies/README.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "policies/kv_config.h"

namespace flexh2o {

// ---------------------------------------------------------------------------------------------
// Documented choices (the H2O paper leaves these open; H2O's code differs between its versions):
//  * Score = raw accumulated attention probability of a token, summed over every query that saw
//    it (prefill column sums, then + each decode step). No normalisation by the number of
//    queries and no decay, exactly like H2O: earlier tokens are favoured.
//  * GQA/MQA: the engine sums the probabilities of all query heads sharing a KV head before it
//    accumulates; a policy sees one score row per KV head.
//  * Ties: the lower score is evicted first; on equal scores the OLDER token (smaller position)
//    goes. An older token had more steps to collect the same total, so its mean attention is
//    lower; this leans against the raw-sum bias and is independent of slot order. NaN scores
//    count as -inf (evicted first).
//  * Greedy rule (the paper's, not H2O-FlexGen's): the token that just left the recent window is
//    an ordinary candidate; the lowest-scoring non-protected token goes, whichever it is.
//  * "Recent" = the highest POSITIONS present in the row (slot order is irrelevant; compaction
//    may permute slots). At prefill that is the last prompt tokens. Sinks = the lowest positions.
//  * keep < budget.total(): the engine reserves room for the incoming token (keep = B - 1). The
//    shortfall comes out of the recent quota first (then heavy, then sinks), because the
//    incoming token is itself the most recent one: once it is appended, attention sees exactly
//    `sinks` sink tokens + `heavy` heavy hitters + `recent` recent tokens (new one included).
//    So `--heavy-ratio x --recent-ratio x` is H2O-FlexGen's `--hh-ratio x` (2*hh_k rows).
//  * random: each non-protected candidate gets a key = hash(seed, salt, clock, position), where
//    clock = the largest position in the row (one fresh draw per step); the lowest keys go. The
//    result is a pure function of the row's contents, so it does not depend on slot order,
//    thread scheduling or call order. Recent tokens and sinks are never evicted.
// ---------------------------------------------------------------------------------------------

// Token budget of one sequence (fixed at prefill; it does not grow while decoding).
struct KvBudget {
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  int64_t sinks = 0;   // first tokens always kept (StreamingLLM attention sinks)
  int64_t heavy = 0;   // tokens chosen by score (h2o) or at random (random)
  int64_t recent = 0;  // most recent tokens always kept, the incoming one included
  bool unbounded = false;  // full cache: never evicts
  // Max tokens attention may see, the incoming one included; kUnbounded when unbounded.
  int64_t total() const { return unbounded ? kUnbounded : sinks + heavy + recent; }
  // KV rows a sequence of n rows keeps after a step: all when unbounded, else at most total() - 1,
  // which leaves room for the next token (the engine's compaction and the cost model both).
  int64_t kept(int64_t n) const { return unbounded ? n : std::min<int64_t>(n, std::max<int64_t>(total() - 1, 0)); }
  bool operator==(const KvBudget&) const = default;
};

// The n slots [0, n) of one (layer, sequence, KV head) row. Borrowed for the call only.
struct SlotView {
  std::span<const float> scores;      // accumulated score per slot (may be empty if !needs_scores())
  std::span<const int32_t> positions; // 0-based token position per slot; unique within the row
  uint64_t salt = 0;  // caller's id of the row, e.g. hash(layer, seq, head); only `random` uses it
};

// Immutable after construction: every method is const, touches no shared state, and may be
// called concurrently from any number of threads (each with its own `victims` vector).
class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  virtual KvPolicyKind kind() const = 0;
  virtual std::string_view name() const = 0;
  // False for full/local/sinks/random: the engine may skip emitting attention probabilities.
  virtual bool needs_scores() const = 0;
  // Budget of a sequence whose prompt has `prompt_len` tokens (>= 0). Ratios are of the prompt
  // length: part = floor(ratio * prompt_len) computed in double, bit-identical to Python's
  // int(prompt_len * ratio) as H2O does (so 0.29 * 100 -> 28), then raised to 1 if ratio > 0.
  // Absolute counts are used as given. Full returns {.unbounded = true}.
  virtual KvBudget budget(int64_t prompt_len) const = 0;
  // Picks slots to evict so that at most `keep` of the n = s.positions.size() slots remain
  // (exactly max(0, n - keep) victims). Writes their slot indices to `victims`, sorted ascending
  // and unique. `victims` is caller-owned; it is cleared and also used as scratch (n entries),
  // so reusing one vector per thread means no allocation in steady state. O(n) expected time.
  // Throws Error on misuse: keep < 0, scores/positions size mismatch, n > INT32_MAX, or
  // keep > budget.total() when eviction is needed (full throws whenever n > keep).
  // Precondition (unchecked): positions are unique within the row.
  virtual void select_victims(const SlotView& s, const KvBudget& budget, int64_t keep,
                              std::vector<int32_t>& victims) const = 0;
};

// Validates `cfg` (throws Error naming the offending flag) and builds the policy.
std::unique_ptr<KvPolicy> make_policy(const KvPolicyConfig& cfg);

}  // namespace flexh2o
