// The five KV policies (full, local, sinks, h2o, random) and make_policy (kv_policy.h).
// All non-full policies share one O(n) selection: protect sinks (lowest positions) and recent
// tokens (highest positions), then keep the best `heavy` of the rest by score or random key.
#include "policies/kv_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <type_traits>

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

// Random's key of the row's slots: one fresh draw per step (clock = the row's largest position).
uint64_t random_base(uint64_t seed, uint64_t salt, int32_t clock) {
  return splitmix64(splitmix64(splitmix64(seed) ^ salt) ^ static_cast<uint64_t>(static_cast<uint32_t>(clock)));
}
uint64_t random_key(uint64_t base, int32_t p) { return splitmix64(base ^ static_cast<uint32_t>(p)); }
float score_key(float s) { return std::isnan(s) ? -INFINITY : s; }

// A score's order as an int32: the magnitude's bits, negated for negatives (so -0 and +0 are
// equal, as float == has them), NaN as -inf. Every score maps within +-0x7f800000, below
// kProtected. Masks rather than branches here and below: GCC vectorizes these loops only so.
int32_t ordered(float s) {
  const auto u = std::bit_cast<int32_t>(s);
  const int32_t mag = u & 0x7fffffff, sign = u >> 31;  // sign: 0 or -1
  const int32_t key = (mag ^ sign) - sign, nan = -int32_t(mag > 0x7f800000);
  return (key & ~nan) | (-0x7f800000 & nan);
}
constexpr int32_t kProtected = std::numeric_limits<int32_t>::max();

// select_few's one-victim H2O row (every decode step): the lowest score, then the oldest position,
// among the slots in [sinks_to, recent_from). Counts the slots outside it (recent at or above,
// sinks below); -1 if none is inside.
int32_t worst_scored(const SlotView& v, int64_t recent_from, int64_t sinks_to, int64_t& recent, int64_t& sinks) {
  const int32_t* pos = v.positions.data();
  const float* sc = v.scores.data();
  const auto n = static_cast<int64_t>(v.positions.size());
  const auto rf = int32_t(std::min<int64_t>(recent_from, kProtected));
  const auto st = int32_t(std::clamp<int64_t>(sinks_to, 0, kProtected));
  int32_t min_key = kProtected, nr = 0, ns = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int32_t p = pos[s], r = -int32_t(p >= rf), k = -int32_t(p < st), out = r | k;
    nr -= r, ns -= k;
    const int32_t key = (ordered(sc[s]) & ~out) | (kProtected & out);
    min_key = key < min_key ? key : min_key;
  }
  recent = nr, sinks = ns;
  if (min_key == kProtected) return -1;
  int32_t min_pos = kProtected;
  for (int64_t s = 0; s < n; ++s) {
    const int32_t p = pos[s], in = -int32_t(p < rf) & -int32_t(p >= st) & -int32_t(ordered(sc[s]) == min_key);
    const int32_t cp = (p & in) | (kProtected & ~in);
    min_pos = cp < min_pos ? cp : min_pos;
  }
  for (int64_t s = 0; s < n; ++s)
    if (pos[s] == min_pos) return int32_t(s);
  return -1;
}

// A row "of ranges" has its protected positions as whole ranges at its ends, as every row the
// engine keeps has: the recent window holds the newest positions without a gap (each was protected
// since it arrived), the sinks the oldest. With positions unique, the r highest form a range iff
// exactly r lie in [max - r + 1, max] (likewise the sinks), so a count checks it: the protected
// are then the positions at or above recent_from, or below sinks_to. The two ranges cannot meet
// where the counts check out, as n unique positions span n >= r + s + 1 values. hi: the largest
// position (random's clock).
struct Ranges {
  int64_t recent_from, sinks_to;
  int32_t hi;
};

Ranges protected_ranges(std::span<const int32_t> pos, const Quotas& q) {
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = 0;
  for (const int32_t p : pos) lo = std::min(lo, p), hi = std::max(hi, p);
  return {int64_t(hi) - q.recent + 1, int64_t(lo) + q.sinks, hi};
}

// A row of ranges decided with no index array: after protected_ranges' min/max pass, a decode
// step's one H2O victim in worst_scored's passes; up to kFewVictims victims (a step of a few rows:
// a scoring chunk, a refill) in one pass with a short sorted list; with no heavy quota (local,
// sinks) every candidate, whatever their count. (key, position) orders the candidates totally, so
// the victims are the general selection's. Returns false, victims cleared, for more victims with
// a heavy quota, or where the row is not of ranges.
constexpr int64_t kFewVictims = 8;

template <Rank R>
bool select_few(const SlotView& v, const Quotas& q, int64_t nv, uint64_t seed, std::vector<int32_t>& victims) {
  if (nv > kFewVictims && q.heavy > 0) return false;
  const auto pos = v.positions;
  const auto n = static_cast<int64_t>(pos.size());
  const Ranges rg = protected_ranges(pos, q);
  const int64_t recent_from = rg.recent_from, sinks_to = rg.sinks_to;
  int64_t recent = 0, sinks = 0;
  if (R == Rank::kScore && nv == 1 && q.heavy > 0) {
    const int32_t slot = worst_scored(v, recent_from, sinks_to, recent, sinks);
    if (slot >= 0) victims.push_back(slot);
  } else if (q.heavy == 0) {  // every candidate goes, in slot order
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p = pos[s];
      if (p >= recent_from) ++recent;
      else if (p < sinks_to) ++sinks;
      else victims.push_back(int32_t(s));
    }
  } else {
    using Key = std::conditional_t<R == Rank::kScore, float, uint64_t>;
    struct Cand {
      Key key;
      int32_t pos, slot;
      bool before(const Cand& o) const { return key < o.key || (key == o.key && pos < o.pos); }  // older goes
    };
    Cand worst[kFewVictims];  // the nv worst so far, worst first
    int64_t held = 0;
    const uint64_t base = R == Rank::kRandom ? random_base(seed, v.salt, rg.hi) : 0;
    for (int64_t s = 0; s < n; ++s) {
      const int32_t p = pos[s];
      if (p >= recent_from) {
        ++recent;
        continue;
      }
      if (p < sinks_to) {
        ++sinks;
        continue;
      }
      Cand c;
      if constexpr (R == Rank::kScore)
        c.key = score_key(v.scores[size_t(s)]);
      else
        c.key = random_key(base, p);
      c.pos = p, c.slot = int32_t(s);
      if (held == nv && !c.before(worst[held - 1])) continue;
      int64_t i = held < nv ? held++ : held - 1;  // when full, the list's best makes room
      for (; i > 0 && c.before(worst[i - 1]); --i) worst[i] = worst[i - 1];
      worst[i] = c;
    }
    for (int64_t i = 0; i < held; ++i) victims.push_back(worst[i].slot);
    std::sort(victims.begin(), victims.end());
  }
  if (recent != q.recent || sinks != q.sinks) {
    victims.clear();
    return false;
  }
  FH_CHECK(int64_t(victims.size()) == nv, "internal: ", victims.size(), " victims of ", nv);
  return true;
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
  if (rank == Rank::kScore ? select_few<Rank::kScore>(v, q, nv, seed, victims)
                            : select_few<Rank::kRandom>(v, q, nv, seed, victims))
    return;
  // The candidates. A row of ranges (see Ranges) has them in one pass, in slot order; others
  // put the protected to the ends by position.
  victims.resize(static_cast<size_t>(n));
  const auto pos = v.positions;
  const Ranges rg = protected_ranges(pos, q);
  int64_t nc = 0, recent = 0, sinks = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t p = pos[size_t(s)];
    if (p >= rg.recent_from) ++recent;
    else if (p < rg.sinks_to) ++sinks;
    else victims[size_t(nc++)] = int32_t(s);
  }
  const bool ranged = recent == q.recent && sinks == q.sinks;
  auto first = victims.begin();
  auto last = victims.begin() + nc;
  if (!ranged) {
    std::iota(victims.begin(), victims.end(), 0);
    auto by_pos = [pos](int32_t a, int32_t c) { return pos[a] < pos[c]; };
    last = victims.end();
    if (q.sinks > 0) {  // the q.sinks lowest positions go to [begin, first)
      std::nth_element(first, first + q.sinks, last, by_pos);
      first += q.sinks;
    }
    if (q.recent > 0) {  // the q.recent highest positions go to [last, end)
      std::nth_element(first, last - q.recent, last, by_pos);
      last -= q.recent;
    }
  }
  FH_CHECK(last - first - q.heavy == nv, "internal: quota arithmetic");
  // Candidates [first, last): the nv worst go to the front. With no heavy quota all go.
  if (q.heavy > 0) {
    if (rank == Rank::kScore) {
      const auto sc = v.scores;
      auto key = [sc](int32_t i) { return score_key(sc[i]); };
      std::nth_element(first, first + nv, last, [&](int32_t a, int32_t c) {
        const float ka = key(a), kc = key(c);
        return ka < kc || (ka == kc && pos[a] < pos[c]);  // ties: the older token goes
      });
    } else {
      const uint64_t base = random_base(seed, v.salt, rg.hi);
      auto key = [base](int32_t p) { return random_key(base, p); };
      std::nth_element(first, first + nv, last, [&](int32_t a, int32_t c) {
        const uint64_t ka = key(pos[a]), kc = key(pos[c]);
        return ka < kc || (ka == kc && pos[a] < pos[c]);
      });
    }
  }
  if (ranged && q.heavy > 0 && q.heavy < nv) {
    // Fewer keepers than victims (a prefill): sort the keepers [nv, nc) and list the other
    // candidates in slot order. The list's writes stay below nv, clear of the keepers.
    std::sort(first + nv, last);
    auto kept = first + nv;
    int64_t out = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p = pos[size_t(s)];
      if (p >= rg.recent_from || p < rg.sinks_to) continue;
      if (kept != last && *kept == s) {
        ++kept;
        continue;
      }
      victims[size_t(out++)] = int32_t(s);
    }
    FH_CHECK(out == nv, "internal: ", out, " victims of ", nv);
    victims.resize(static_cast<size_t>(nv));
    return;
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
