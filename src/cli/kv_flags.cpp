// Parsing of the KV-cache policy flags (kv_flags.h) into a validated KvPolicyConfig.
#include "cli/kv_flags.h"

#include <algorithm>

#include "core/error.h"
#include "policies/kv_policy.h"

namespace flexh2o::cli {

void add_kv_flags(CLI::App* app, KvArgs& a, const char* ratio_base) {
  const char* g = "KV cache policy";
  app->add_option("--kv-policy", a.policy,
                  "KV cache policy: full, local, sinks, h2o, random (full: every token the model attends to; a "
                  "sliding-window layer keeps only its window once sequences pass it)")
      ->capture_default_str()->group(g);
  app->add_option("--heavy-ratio", a.heavy_ratio,
                  std::string("Heavy hitters (h2o) or random picks (random), fraction of ") + ratio_base)
      ->group(g);
  app->add_option("--recent-ratio", a.recent_ratio, std::string("Recent window, fraction of ") + ratio_base)->group(g);
  app->add_option("--heavy-budget", a.heavy_budget, "Heavy hitters / random picks, tokens")->group(g);
  app->add_option("--recent-budget", a.recent_budget, "Recent window, tokens")->group(g);
  app->add_option("--sink-tokens", a.sink_tokens, "Attention-sink tokens kept by --kv-policy sinks (default 4)")
      ->group(g);
  app->add_option("--kv-seed", a.seed, "Seed of --kv-policy random")->group(g);
  app->add_option("--kv-dtype", a.dtype,
                  "KV cache element type in every tier: f16, bf16, f32, q4 (4-bit groups of 64, the same as "
                  "--compress-cache), or auto (f16; bf16 for bf16 checkpoints)")
      ->capture_default_str()->group(g);
}

std::optional<DType> kv_dtype_flag(const KvArgs& a) {
  if (a.dtype == "f16") return DType::F16;
  if (a.dtype == "bf16") return DType::BF16;
  if (a.dtype == "f32") return DType::F32;
  if (a.dtype == "q4") return DType::Q4;
  if (a.dtype != "auto") FH_FAIL("--kv-dtype must be auto, f16, bf16, f32 or q4, got \"", a.dtype, "\"");
  return std::nullopt;
}

DType kv_cache_dtype(const KvArgs& a, bool bf16_checkpoint) {
  if (const std::optional<DType> d = kv_dtype_flag(a)) return *d;
  return bf16_checkpoint ? DType::BF16 : DType::F16;
}

DType kv_cache_dtype(const KvArgs& a, const Model& m) {
  const auto& ts = m.tensors();
  const bool bf16 = std::any_of(ts.begin(), ts.end(), [](const BoundTensor& t) { return t.view.dtype == DType::BF16; });
  return kv_cache_dtype(a, bf16);
}

DType compressed_kv_dtype(const KvArgs& a) {
  if (a.dtype != "auto" && a.dtype != "q4")
    FH_FAIL("--compress-cache stores the KV cache as q4, but --kv-dtype ", a.dtype, " was given; drop one");
  return DType::Q4;
}

DType run_kv_dtype(const KvArgs& a, bool compress_cache, const Model& m) {
  return compress_cache ? compressed_kv_dtype(a) : kv_cache_dtype(a, m);
}

KvPolicyConfig make_kv_config(const KvArgs& a) {
  KvPolicyConfig c;
  c.kind = parse_kv_policy_kind(a.policy);
  c.heavy_ratio = a.heavy_ratio;
  c.recent_ratio = a.recent_ratio;
  c.heavy_budget = a.heavy_budget;
  c.recent_budget = a.recent_budget;
  c.sink_tokens = a.sink_tokens;
  c.seed = a.seed.value_or(0);
  if (a.seed && c.kind != KvPolicyKind::kRandom)
    FH_FAIL("--kv-seed does not apply to --kv-policy ", kv_policy_name(c.kind));
  validate(c);
  return c;
}

KvPolicyConfig ratios_to_budgets(const KvPolicyConfig& cfg, int64_t length) {
  FH_CHECK(length >= 1, "reference length must be >= 1, got ", length);
  if (!cfg.heavy_ratio && !cfg.recent_ratio) return cfg;
  const KvBudget b = make_policy(cfg)->budget(length);
  KvPolicyConfig out = cfg;
  if (cfg.heavy_ratio) out.heavy_budget = b.heavy, out.heavy_ratio.reset();
  if (cfg.recent_ratio) out.recent_budget = b.recent, out.recent_ratio.reset();
  validate(out);
  return out;
}

}  // namespace flexh2o::cli
