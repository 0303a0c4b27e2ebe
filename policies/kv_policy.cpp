// The five KV policies (full, local, sinks, h2o, random) and make_policy (kv_policy.h).
// All non-full policies share one O(n) selection: protect sinks (lowest positions) and recent
// tokens (highest positions), then keep the best `heavy` of the rest by score or random key.
#include "policies/kv_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace flexh2o {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared selection

enum class Rank { kScore, kRandom };

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Quotas {
  int64_t sinks, heavy, recent;
};

// Splits `keep` (<= b.total()) into quotas; the shortfall comes out of recent, then heavy, then
// sinks (see "keep < budget.total()" in kv_policy.h).
Quotas split_keep(const KvBudget& b, int64_t keep) {
  const int64_t s = std::min(b.sinks, keep);
  const int64_t h = std::min(b.heavy, keep - s);
  return {s, h, keep - s - h};
}

void check_view(const SlotView& v, int64_t keep, bool need_scores) {
  FH_CHECK(keep >= 0, "keep must be >= 0, got ", keep);
  FH_CHECK(v.positions.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "row of ", v.positions.size(), " slots exceeds int32 slot indices");
  FH_CHECK(!need_scores || v.scores.size() == v.positions.size(), "SlotView has ",
           v.scores.size(), " scores for ", v.positions.size(), " positions");
}

void select(const SlotView& v, const KvBudget& b, int64_t keep, Rank rank, uint64_t seed,
            std::vector<int32_t>& victims) {
  check_view(v, keep, rank == Rank::kScore);
  victims.clear();
  const auto n = static_cast<int64_t>(v.positions.size());
  if (n <= keep) return;
  FH_CHECK(keep <= b.total(), "asked to keep ", keep, " slots but the budget is ", b.total());

  const Quotas q = split_keep(b, keep);
  const int64_t nv = n - keep;
  victims.resize(static_cast<size_t>(n));
  std::iota(victims.begin(), victims.end(), 0);
  const auto pos = v.positions;
  auto by_pos = [pos](int32_t a, int32_t c) { return pos[a] < pos[c]; };

  auto first = victims.begin();
  auto last = victims.end();
  if (q.sinks > 0) {  // the q.sinks lowest positions go to [begin, first)
    std::nth_element(first, first + q.sinks, last, by_pos);
    first += q.sinks;
  }
  if (q.recent > 0) {  // the q.recent highest positions go to [last, end)
    std::nth_element(first, last - q.recent, last, by_pos);
    last -= q.recent;
  }
  FH_CHECK(last - first - q.heavy == nv, "internal: quota arithmetic");
  // Candidates [first, last): the nv worst go to the front. With no heavy quota all go.
  if (q.heavy > 0) {
    if (rank == Rank::kScore) {
      const auto sc = v.scores;
      auto key = [sc](int32_t i) { return std::isnan(sc[i]) ? -INFINITY : sc[i]; };
      std::nth_element(first, first + nv, last, [&](int32_t a, int32_t c) {
        const float ka = key(a), kc = key(c);
        return ka < kc || (ka == kc && pos[a] < pos[c]);  // ties: the older token goes
      });
    } else {
      int32_t clock = 0;
      for (int32_t p : pos) clock = std::max(clock, p);
      const uint64_t base = splitmix64(splitmix64(splitmix64(seed) ^ v.salt) ^
                                       static_cast<uint64_t>(static_cast<uint32_t>(clock)));
      auto key = [base](int32_t p) { return splitmix64(base ^ static_cast<uint32_t>(p)); };
      std::nth_element(first, first + nv, last, [&](int32_t a, int32_t c) {
        const uint64_t ka = key(pos[a]), kc = key(pos[c]);
        return ka < kc || (ka == kc && pos[a] < pos[c]);
      });
    }
  }
  if (first != victims.begin()) std::copy(first, first + nv, victims.begin());
  victims.resize(static_cast<size_t>(nv));
  std::sort(victims.begin(), victims.end());
}

// ---------------------------------------------------------------------------------------------
// Policies

class FullPolicy final : public KvPolicy {
 public:
  KvPolicyKind kind() const override { return KvPolicyKind::kFull; }
  std::string_view name() const override { return "full"; }
  bool needs_scores() const override { return false; }
  KvBudget budget(int64_t prompt_len) const override {
    FH_CHECK(prompt_len >= 0, "prompt_len must be >= 0, got ", prompt_len);
    return {.unbounded = true};
  }
  void select_victims(const SlotView& s, const KvBudget&, int64_t keep,
                      std::vector<int32_t>& victims) const override {
    check_view(s, keep, false);
    victims.clear();
    FH_CHECK(static_cast<int64_t>(s.positions.size()) <= keep, "the full policy never evicts, ",
             "but was asked to keep ", keep, " of ", s.positions.size(), " slots");
  }
};

// A part of the budget: a ratio of the prompt length, or an absolute count.
struct Part {
  std::optional<double> ratio;
  int64_t count = 0;
  int64_t tokens(int64_t prompt_len) const {
    if (!ratio) return count;
    // Python's int(prompt_len * ratio): double product, truncated (H2O's rounding).
    const auto t = static_cast<int64_t>(static_cast<double>(prompt_len) * *ratio);
    return *ratio > 0.0 ? std::max<int64_t>(t, 1) : t;
  }
};

class WindowedPolicy final : public KvPolicy {
 public:
  WindowedPolicy(KvPolicyKind kind, Part heavy, Part recent, int64_t sinks, uint64_t seed)
      : kind_(kind), heavy_(heavy), recent_(recent), sinks_(sinks), seed_(seed) {}
  KvPolicyKind kind() const override { return kind_; }
  std::string_view name() const override { return kv_policy_name(kind_); }
  bool needs_scores() const override { return kind_ == KvPolicyKind::kH2o; }
  KvBudget budget(int64_t prompt_len) const override {
    FH_CHECK(prompt_len >= 0, "prompt_len must be >= 0, got ", prompt_len);
    KvBudget b{.sinks = sinks_, .heavy = heavy_.tokens(prompt_len),
               .recent = recent_.tokens(prompt_len)};
    FH_CHECK(b.total() > 0, "internal: zero KV budget for prompt_len ", prompt_len);
    return b;
  }
  void select_victims(const SlotView& s, const KvBudget& b, int64_t keep,
                      std::vector<int32_t>& victims) const override {
    select(s, b, keep, kind_ == KvPolicyKind::kH2o ? Rank::kScore : Rank::kRandom, seed_,
           victims);
  }

 private:
  KvPolicyKind kind_;
  Part heavy_, recent_;
  int64_t sinks_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<KvPolicy> make_policy(const KvPolicyConfig& c) {
  validate(c);
  const Part heavy{c.heavy_ratio, c.heavy_budget.value_or(0)};
  const Part recent{c.recent_ratio, c.recent_budget.value_or(0)};
  switch (c.kind) {
    case KvPolicyKind::kFull: return std::make_unique<FullPolicy>();
    case KvPolicyKind::kLocal:
      return std::make_unique<WindowedPolicy>(c.kind, Part{}, recent, 0, c.seed);
    case KvPolicyKind::kSinks:
      return std::make_unique<WindowedPolicy>(c.kind, Part{}, recent,
                                              c.sink_tokens.value_or(kDefaultSinkTokens), c.seed);
    case KvPolicyKind::kH2o:
    case KvPolicyKind::kRandom:
      return std::make_unique<WindowedPolicy>(c.kind, heavy, recent, 0, c.seed);
  }
  FH_FAIL("invalid KvPolicyKind ", static_cast<int>(c.kind));
}

}  // namespace flexh2o
