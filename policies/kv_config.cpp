// KvPolicyConfig parsing helpers and validation (kv_config.h). Errors are user-facing sentences
// that name the offending flag; nothing here knows about argv or CLI11.
#include "policies/kv_config.h"

#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace flexh2o {
namespace {

struct KindName {
  KvPolicyKind kind;
  std::string_view name;
};
constexpr std::array<KindName, 5> kKinds = {{{KvPolicyKind::kFull, "full"},
                                             {KvPolicyKind::kLocal, "local"},
                                             {KvPolicyKind::kSinks, "sinks"},
                                             {KvPolicyKind::kH2o, "h2o"},
                                             {KvPolicyKind::kRandom, "random"}}};

// Which budget flags a policy reads.
struct Uses {
  bool heavy = false, recent = false, sinks = false;
};
Uses uses(KvPolicyKind k) {
  switch (k) {
    case KvPolicyKind::kFull: return {};
    case KvPolicyKind::kLocal: return {.recent = true};
    case KvPolicyKind::kSinks: return {.recent = true, .sinks = true};
    case KvPolicyKind::kH2o:
    case KvPolicyKind::kRandom: return {.heavy = true, .recent = true};
  }
  FH_FAIL("invalid KvPolicyKind ", static_cast<int>(k));
}

template <typename T>
void check_applies(bool used, const std::optional<T>& v, std::string_view flag,
                   KvPolicyKind kind) {
  if (v && !used)
    FH_FAIL(flag, " does not apply to --kv-policy ", kv_policy_name(kind));
}

void check_ratio(const std::optional<double>& r, std::string_view flag) {
  if (r && !(std::isfinite(*r) && *r >= 0.0 && *r <= 1.0))
    FH_FAIL(flag, " must be a fraction of the prompt length in [0, 1], got ", *r);
}

// Slot indices are int32, so no sequence holds more tokens; the bound also keeps the sum of the
// budgets (KvBudget::total) from overflowing.
void check_count(const std::optional<int64_t>& c, std::string_view flag) {
  if (c && *c < 0) FH_FAIL(flag, " must be >= 0 tokens, got ", *c);
  if (c && *c > std::numeric_limits<int32_t>::max())
    FH_FAIL(flag, " must be at most ", std::numeric_limits<int32_t>::max(), " tokens (no sequence is longer), got ", *c);
}

void check_exclusive(const std::optional<double>& r, const std::optional<int64_t>& c,
                     std::string_view part) {
  if (r && c)
    FH_FAIL("--", part, "-ratio and --", part, "-budget are mutually exclusive; give one");
}

bool positive(const std::optional<double>& r, const std::optional<int64_t>& c) {
  return (r && *r > 0.0) || (c && *c > 0);
}

}  // namespace

KvPolicyKind parse_kv_policy_kind(std::string_view name) {
  for (const auto& k : kKinds)
    if (k.name == name) return k.kind;
  FH_FAIL("unknown --kv-policy '", name, "' (valid: ", kKvPolicyNames, ")");
}

std::string_view kv_policy_name(KvPolicyKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  FH_FAIL("invalid KvPolicyKind ", static_cast<int>(kind));
}

void validate(const KvPolicyConfig& c) {
  const Uses u = uses(c.kind);
  check_applies(u.heavy, c.heavy_ratio, "--heavy-ratio", c.kind);
  check_applies(u.heavy, c.heavy_budget, "--heavy-budget", c.kind);
  check_applies(u.recent, c.recent_ratio, "--recent-ratio", c.kind);
  check_applies(u.recent, c.recent_budget, "--recent-budget", c.kind);
  check_applies(u.sinks, c.sink_tokens, "--sink-tokens", c.kind);

  check_ratio(c.heavy_ratio, "--heavy-ratio");
  check_ratio(c.recent_ratio, "--recent-ratio");
  check_count(c.heavy_budget, "--heavy-budget");
  check_count(c.recent_budget, "--recent-budget");
  check_count(c.sink_tokens, "--sink-tokens");
  check_exclusive(c.heavy_ratio, c.heavy_budget, "heavy");
  check_exclusive(c.recent_ratio, c.recent_budget, "recent");

  const std::string_view name = kv_policy_name(c.kind);
  switch (c.kind) {
    case KvPolicyKind::kFull: break;
    case KvPolicyKind::kLocal:
    case KvPolicyKind::kSinks:
      if (!positive(c.recent_ratio, c.recent_budget))
        FH_FAIL("--kv-policy ", name,
                " needs a nonzero window: set --recent-ratio (> 0) or --recent-budget (> 0)");
      break;
    case KvPolicyKind::kH2o:
    case KvPolicyKind::kRandom:
      if (!positive(c.heavy_ratio, c.heavy_budget) && !positive(c.recent_ratio, c.recent_budget))
        FH_FAIL("--kv-policy ", name,
                " needs a nonzero total budget: set --heavy-ratio/--heavy-budget and/or "
                "--recent-ratio/--recent-budget (> 0)");
      break;
  }
}

std::string describe(const KvPolicyConfig& c) {
  std::ostringstream os;
  os << kv_policy_name(c.kind);
  auto part = [&](std::string_view label, const std::optional<double>& r,
                  const std::optional<int64_t>& n) {
    if (r) os << ' ' << label << '=' << *r << "*prompt";
    if (n) os << ' ' << label << '=' << *n;
  };
  const Uses u = uses(c.kind);
  if (u.sinks) os << " sinks=" << c.sink_tokens.value_or(kDefaultSinkTokens);
  if (u.heavy) part("heavy", c.heavy_ratio, c.heavy_budget);
  if (u.recent) part("recent", c.recent_ratio, c.recent_budget);
  if (c.kind == KvPolicyKind::kRandom) os << " seed=" << c.seed;
  return os.str();
}

}  // namespace flexh2o
