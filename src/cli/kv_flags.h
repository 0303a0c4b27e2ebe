// KV-cache policy flags shared by the subcommands that run a model (generate, eval-ppl,
// eval-choice): --kv-policy, --heavy-ratio/--recent-ratio, --heavy-budget/--recent-budget,
// --sink-tokens, --kv-seed. Parsing only; the policies themselves live in policies/.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "model/weights.h"
#include "policies/kv_config.h"

namespace flexh2o::cli {

// Raw flag values; unset optionals mean "flag not given".
struct KvArgs {
  std::string policy = "full";          // --kv-policy full|local|sinks|h2o|random
  std::optional<double> heavy_ratio;    // --heavy-ratio  fraction of the prompt length, [0, 1]
  std::optional<double> recent_ratio;   // --recent-ratio fraction of the prompt length, [0, 1]
  std::optional<int64_t> heavy_budget;  // --heavy-budget tokens
  std::optional<int64_t> recent_budget; // --recent-budget tokens
  std::optional<int64_t> sink_tokens;   // --sink-tokens  tokens (sinks only; default 4)
  std::optional<uint64_t> seed;         // --kv-seed      (random only; default 0)
  std::string dtype = "auto";           // --kv-dtype     auto|f16|bf16|f32|q4
};

// Adds the flags above to `app` in the group "KV cache policy". `a` must outlive parsing.
// `ratio_base` says what the ratio flags are fractions of, in this command.
void add_kv_flags(CLI::App* app, KvArgs& a, const char* ratio_base = "the prompt length");

// The validated config. Throws flexh2o::Error naming the flag: unknown --kv-policy, a flag
// the policy does not read, out-of-range values, ratio and budget for the same part, zero total.
KvPolicyConfig make_kv_config(const KvArgs& a);

// --kv-dtype as given: F16, BF16, F32 or Q4, nullopt for auto. Throws naming the flag on anything
// else (needs no model, so commands check it before loading one).
std::optional<DType> kv_dtype_flag(const KvArgs& a);
// --kv-dtype: F16, BF16, F32 or Q4; auto is F16, or BF16 for a bf16 checkpoint (whose
// activations may exceed f16's range). Throws naming the flag on anything else.
DType kv_cache_dtype(const KvArgs& a, const Model& m);
DType kv_cache_dtype(const KvArgs& a, bool bf16_checkpoint);  // ... of a checkpoint known by its dtype
// Q4, the KV dtype of a run that compresses its cache; throws unless --kv-dtype is auto or q4.
DType compressed_kv_dtype(const KvArgs& a);
// The KV dtype of a run: Q4 when `compress_cache` (--compress-cache or a policy file's
// compress_cache; --kv-dtype must then be auto or q4), else kv_cache_dtype().
DType run_kv_dtype(const KvArgs& a, bool compress_cache, const Model& m);

// `cfg` with every ratio replaced by the absolute token budget it means for a reference length
// of `length` tokens (the policy's own rule: floor(ratio * length), raised to 1 when ratio > 0).
// eval-ppl uses this so that ratios are fractions of the tokens scored, not of the 1-token
// prefill. Budgets and non-budget fields are kept as given. `cfg` must be valid; length >= 1.
KvPolicyConfig ratios_to_budgets(const KvPolicyConfig& cfg, int64_t length);

}  // namespace flexh2o::cli
