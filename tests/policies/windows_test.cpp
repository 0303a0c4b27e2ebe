// Tests of the score-free policies: full, local (recent window), sinks (StreamingLLM) and
// random (ablation, its draws consistent however many victims a call asks), over awkward sizes.
#include <gtest/gtest.h>

#include "sim.h"

namespace flexh2o::test {
namespace {

KvPolicyConfig cfg(KvPolicyKind k) {
  KvPolicyConfig c;
  c.kind = k;
  return c;
}

// Decode loop with a fixed budget: prompt 0..prompt-1, then `gen` steps; returns the row.
Row run(const KvPolicy& p, int64_t prompt, int64_t gen, Compaction mode, uint64_t salt = 0) {
  const KvBudget b = p.budget(prompt);
  Row row;
  row.salt = salt;
  for (int32_t t = 0; t < prompt; ++t) {
    row.pos.push_back(t);
    row.score.push_back(1.f);
  }
  for (int32_t t = static_cast<int32_t>(prompt); t <= prompt + gen; ++t) {
    evict(p, b, row, b.total() - 1, mode);
    if (t == prompt + gen) break;
    row.pos.push_back(t);
    row.score.push_back(1.f);
  }
  return row;
}

TEST(Full, NeverEvictsAndRefusesToShrink) {
  const auto p = make_policy(cfg(KvPolicyKind::kFull));
  EXPECT_EQ(p->name(), "full");
  EXPECT_FALSE(p->needs_scores());
  const KvBudget b = p->budget(5);
  EXPECT_TRUE(b.unbounded);
  EXPECT_EQ(b.total(), KvBudget::kUnbounded);
  Row row{{0, 1, 2}, {}};
  std::vector<int32_t> v{42};
  p->select_victims(row.view(), b, 3, v);
  EXPECT_TRUE(v.empty());
  expect_error([&] { p->select_victims(row.view(), b, 2, v); }, {"never evicts"});
}

TEST(Policies, OnlyH2oNeedsScores) {
  auto c = cfg(KvPolicyKind::kLocal);
  c.recent_budget = 4;
  EXPECT_FALSE(make_policy(c)->needs_scores());
  c.kind = KvPolicyKind::kSinks;
  EXPECT_FALSE(make_policy(c)->needs_scores());
  c.kind = KvPolicyKind::kRandom;
  EXPECT_FALSE(make_policy(c)->needs_scores());
  EXPECT_EQ(make_policy(c)->name(), "random");
  c.kind = KvPolicyKind::kH2o;
  EXPECT_TRUE(make_policy(c)->needs_scores());
}

class WindowSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(WindowSizes, LocalKeepsExactlyTheMostRecentPositions) {
  const int64_t w = GetParam();
  auto c = cfg(KvPolicyKind::kLocal);
  c.recent_budget = w;
  const auto p = make_policy(c);
  ASSERT_EQ(p->budget(1000), (KvBudget{.recent = w}));
  for (auto mode : {Compaction::kStable, Compaction::kMoveLast}) {
    for (int64_t prompt : {int64_t{1}, w, 3 * w + 2}) {
      const Row row = run(*p, prompt, 11, mode);
      const auto end = static_cast<int32_t>(prompt + 11);
      EXPECT_EQ(row.positions(), range_set(std::max<int32_t>(0, end - static_cast<int32_t>(w) + 1), end))
          << "prompt " << prompt;
    }
  }
}

TEST_P(WindowSizes, SinksKeepTheFirstTokensPlusTheWindow) {
  const int64_t w = GetParam();
  auto c = cfg(KvPolicyKind::kSinks);
  c.recent_budget = w;
  c.sink_tokens = 3;
  const auto p = make_policy(c);
  ASSERT_EQ(p->budget(50), (KvBudget{.sinks = 3, .recent = w}));
  for (auto mode : {Compaction::kStable, Compaction::kMoveLast}) {
    const Row row = run(*p, 2 * w + 5, 23, mode);
    const auto end = static_cast<int32_t>(2 * w + 5 + 23);
    std::set<int32_t> want = range_set(end - static_cast<int32_t>(w) + 1, end);
    for (int32_t s = 0; s < 3; ++s) want.insert(s);
    EXPECT_EQ(row.positions(), want);
  }
}

TEST_P(WindowSizes, SinksDefaultToFourAndSurviveAShortfall) {
  auto c = cfg(KvPolicyKind::kSinks);
  c.recent_budget = GetParam();
  const auto p = make_policy(c);
  const KvBudget b = p->budget(10);
  EXPECT_EQ(b.sinks, kDefaultSinkTokens);
  // keep 2 < sinks: the two lowest positions stay, whatever the slot order.
  Row row{{9, 4, 7, 1, 3, 8}, {}};
  std::vector<int32_t> v;
  p->select_victims(row.view(), b, 2, v);
  EXPECT_EQ(v, (std::vector<int32_t>{0, 1, 2, 5}));
}

TEST_P(WindowSizes, RandomIsDeterministicAndNeverEvictsRecentTokens) {
  const int64_t n = GetParam();
  auto c = cfg(KvPolicyKind::kRandom);
  c.heavy_budget = n / 2 + 1;
  c.recent_budget = n / 3 + 1;
  c.seed = 1234;
  const auto p = make_policy(c);
  const KvBudget b = p->budget(n);
  std::mt19937 rng(static_cast<uint32_t>(n));
  std::vector<int32_t> v1, v2;
  for (int trial = 0; trial < 20; ++trial) {
    Row row = random_row(n + b.total(), rng);  // larger than the budget: must evict
    row.score.clear();                         // random does not read scores
    row.salt = static_cast<uint64_t>(trial);
    const int64_t keep = b.total() - 1;
    p->select_victims(row.view(), b, keep, v1);
    ASSERT_EQ(static_cast<int64_t>(v1.size()), static_cast<int64_t>(row.pos.size()) - keep);
    // Recent = the keep - heavy highest positions are never victims.
    std::vector<int32_t> sorted = row.pos;
    std::sort(sorted.begin(), sorted.end());
    const int64_t r = keep - b.heavy;
    const int32_t recent_floor =
        r > 0 ? sorted[sorted.size() - static_cast<size_t>(r)] : std::numeric_limits<int32_t>::max();
    std::set<int32_t> gone;
    for (int32_t s : v1) {
      EXPECT_LT(row.pos[s], recent_floor);
      gone.insert(row.pos[s]);
    }
    // Same call again, and with the slots shuffled: same victim positions.
    p->select_victims(row.view(), b, keep, v2);
    EXPECT_EQ(v1, v2);
    Row shuffled = row;
    std::shuffle(shuffled.pos.begin(), shuffled.pos.end(), rng);
    p->select_victims(shuffled.view(), b, keep, v2);
    std::set<int32_t> gone2;
    for (int32_t s : v2) gone2.insert(shuffled.pos[s]);
    EXPECT_EQ(gone, gone2);
  }
}

TEST_P(WindowSizes, RandomVictimsNestAsFewerAreKept) {
  // Keeping fewer than heavy leaves no recent quota, so every slot is a candidate and the victims
  // are the lowest draws: each keep's victims hold the next larger keep's. The policy finds up to
  // 8 victims in one pass, and more by partitioning a candidate list, so this ties the two.
  const int64_t n = GetParam();
  auto c = cfg(KvPolicyKind::kRandom);
  c.heavy_budget = n;
  c.recent_budget = 1;
  c.seed = 99;
  const auto p = make_policy(c);
  const KvBudget b = p->budget(n);
  std::mt19937 rng(static_cast<uint32_t>(5 + n));
  std::vector<int32_t> v;
  for (int trial = 0; trial < 5; ++trial) {
    Row row = random_row(n, rng);
    row.salt = static_cast<uint64_t>(trial);
    std::set<int32_t> larger;  // victims of keep + 1
    for (int64_t keep = n - 1; keep >= 0; --keep) {
      p->select_victims(row.view(), b, keep, v);
      ASSERT_EQ(static_cast<int64_t>(v.size()), n - keep);
      ASSERT_TRUE(std::is_sorted(v.begin(), v.end()));
      std::set<int32_t> gone;
      for (int32_t s : v) gone.insert(row.pos[s]);
      ASSERT_EQ(gone.size(), v.size());
      ASSERT_TRUE(std::includes(gone.begin(), gone.end(), larger.begin(), larger.end())) << "keep " << keep;
      larger = gone;
    }
  }
}

TEST_P(WindowSizes, RandomProtectsTheRecentAndDrawsInOneOrder) {
  // A row's draws do not depend on the budget, so a budget with no recent quota (heavy n) yields
  // their whole order: the victims of keep k - 1 are those of k plus the next draw. A budget with
  // a recent quota must then evict the first draws outside the recent positions, for every keep,
  // on rows of ranges (one pass, or a candidate list) and on rows with gaps (the general path).
  const int64_t n = GetParam();
  auto c = cfg(KvPolicyKind::kRandom);
  c.seed = 7;
  c.heavy_budget = n;
  c.recent_budget = 1;
  const auto all = make_policy(c);
  c.heavy_budget = n / 2 + 1;
  c.recent_budget = n / 3 + 1;
  const auto some = make_policy(c);
  const KvBudget ba = all->budget(n), bs = some->budget(n);
  std::mt19937 rng(static_cast<uint32_t>(31 + n));
  std::vector<int32_t> v;
  for (int trial = 0; trial < 8; ++trial) {
    Row row = trial % 2 ? random_row(n, rng) : row_of_ranges(n, bs.recent, 0, rng);
    row.score.clear();
    row.salt = static_cast<uint64_t>(trial);
    std::vector<int32_t> order;  // positions, lowest draw first
    std::set<int32_t> larger;
    for (int64_t keep = n - 1; keep >= 0; --keep) {
      all->select_victims(row.view(), ba, keep, v);
      std::set<int32_t> gone;
      for (int32_t s : v) gone.insert(row.pos[s]);
      ASSERT_EQ(static_cast<int64_t>(gone.size()), n - keep);
      for (int32_t p : gone)
        if (!larger.count(p)) order.push_back(p);
      ASSERT_EQ(static_cast<int64_t>(order.size()), n - keep);
      larger = gone;
    }
    std::vector<int32_t> sorted = row.pos;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t keep = 0; keep <= std::min(n, bs.total()); ++keep) {
      const int64_t recent = std::max<int64_t>(0, keep - bs.heavy);  // the quota split: recent shrinks first
      const int32_t floor = recent > 0 ? sorted[size_t(n - recent)] : std::numeric_limits<int32_t>::max();
      std::set<int32_t> want;
      for (int32_t p : order)
        if (p < floor && int64_t(want.size()) < n - keep) want.insert(p);
      some->select_victims(row.view(), bs, keep, v);
      std::set<int32_t> got;
      for (int32_t s : v) got.insert(row.pos[s]);
      ASSERT_EQ(got, want) << "trial " << trial << " keep " << keep;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AwkwardSizes, WindowSizes, ::testing::ValuesIn(kSizes));

TEST(Random, SeedAndSaltChangeTheDrawAndStepsDrawAfresh) {
  auto c = cfg(KvPolicyKind::kRandom);
  c.heavy_budget = 8;
  c.recent_budget = 2;
  auto run_seed = [&](uint64_t seed, uint64_t salt) {
    c.seed = seed;
    return run(*make_policy(c), 64, 40, Compaction::kMoveLast, salt).positions();
  };
  const auto base = run_seed(1, 0);
  EXPECT_EQ(base, run_seed(1, 0));
  EXPECT_NE(base, run_seed(2, 0));
  EXPECT_NE(base, run_seed(1, 99));
  // Final row: keep = B - 1 = 9, i.e. recent {103} + 8 heavy drawn at random. Not degenerate:
  // neither the oldest nor the newest candidates.
  EXPECT_EQ(base.size(), 9u);
  EXPECT_EQ(base.count(103), 1u);
  std::set<int32_t> oldest = range_set(0, 8);
  oldest.insert(103);
  EXPECT_NE(base, oldest);
  EXPECT_NE(base, range_set(95, 104));
}

}  // namespace
}  // namespace flexh2o::test
