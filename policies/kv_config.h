// KvPolicyConfig: the user's KV-policy choice as parsed from CLI flags, plus its validation.
// This file does not parse argv (the CLI binds CLI11 options to the fields); it names the flags
// so that every error message tells the user which flag to fix.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace flexh2o {

enum class KvPolicyKind { kFull, kLocal, kSinks, kH2o, kRandom };

// "full, local, sinks, h2o, random" (for --help text and errors).
inline constexpr std::string_view kKvPolicyNames = "full, local, sinks, h2o, random";
// StreamingLLM's default number of attention-sink tokens (start_size = 4).
inline constexpr int64_t kDefaultSinkTokens = 4;

// Unset optionals mean "flag not given". Which flags apply:
//   full    none
//   local   recent (ratio xor budget), > 0
//   sinks   recent (ratio xor budget), > 0; sink_tokens (default kDefaultSinkTokens)
//   h2o     heavy and/or recent (each ratio xor budget); total > 0
//   random  as h2o, plus seed
struct KvPolicyConfig {
  KvPolicyKind kind = KvPolicyKind::kFull;  // --kv-policy full|local|sinks|h2o|random
  std::optional<double> heavy_ratio;        // --heavy-ratio   in [0, 1], of the prompt length
  std::optional<double> recent_ratio;       // --recent-ratio  in [0, 1], of the prompt length
  std::optional<int64_t> heavy_budget;      // --heavy-budget  tokens, >= 0
  std::optional<int64_t> recent_budget;     // --recent-budget tokens, >= 0
  std::optional<int64_t> sink_tokens;       // --sink-tokens   tokens, >= 0 (sinks only)
  uint64_t seed = 0;                        // --kv-seed       (random only; any value)
  bool operator==(const KvPolicyConfig&) const = default;
};

// "h2o" -> kH2o (exact, lower case). Throws Error "unknown --kv-policy 'x' (valid: full, ...)".
KvPolicyKind parse_kv_policy_kind(std::string_view name);
std::string_view kv_policy_name(KvPolicyKind kind);

// Throws Error naming the flag: negative or non-finite values, ratios > 1, ratio and budget
// given for the same part, a flag the chosen policy does not use, or a zero total budget.
void validate(const KvPolicyConfig& cfg);

// One line for logs, e.g. "h2o heavy=0.1*prompt recent=0.1*prompt" or "sinks sinks=4 recent=1020".
std::string describe(const KvPolicyConfig& cfg);

}  // namespace flexh2o
