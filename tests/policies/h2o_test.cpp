// H2O policy tests: a hand-computed multi-head decode script (true greedy rule, ties, prefill
// "recent"), a brute-force reference over awkward sizes (rows of any positions, and rows as the
// engine keeps them), and the budget >= n == full invariant.
#include <gtest/gtest.h>

#include "sim.h"

namespace flexh2o::test {
namespace {

KvPolicyConfig h2o_abs(int64_t heavy, int64_t recent) {
  KvPolicyConfig c;
  c.kind = KvPolicyKind::kH2o;
  c.heavy_budget = heavy;
  c.recent_budget = recent;
  return c;
}

// heavy = 2, recent = 2 -> B = 4; the engine keeps B - 1 = 3 after prefill and every step.
// Prompt of 6 tokens, two KV heads with different attention. All values are dyadic, so the
// float sums are exact. Expected survivors were computed by hand:
//  head 0  prefill sums 3, .375, 1.125, .875, .5, .125: recent = {5} (B-1 keeps R-1 = 1 recent),
//          heavy = top-2 of positions 0..4 = {0, 2}.
//   step 1 (+6): 0:3.25 2:1.25 5:.25 6:.5. Position 5 leaves the window with a score below
//          every heavy hitter, so IT goes (H2O-FlexGen would move it in and drop position 2).
//   step 2 (+7): 0:3.3125 2:1.25 6:1.3125 7:.125. Leaving token 6 beats heavy hitter 2: 2 goes.
//   step 3 (+8): 0:3.5625 6:1.5625 7:.375 8:.25: 7 goes.
//  head 1  prefill sums 1, 2, .25, 1, .75, 1: heavy = {1, 3}; 0 and 3 tie at 1.0, the older (0)
//          goes. step 1: 1:2.125 3:1.125 5:1.5 6:.25 -> 3 goes (head 0 dropped 5 here).
//          steps 2, 3 (uniform .25): the leaving token (6, then 7) goes.
struct Step {
  int32_t token;
  std::map<int32_t, float> probs[2];
  std::set<int32_t> victims[2], survivors[2];
};

class H2oScript : public ::testing::TestWithParam<Compaction> {};

TEST_P(H2oScript, HandComputedTwoHeads) {
  const auto policy = make_policy(h2o_abs(2, 2));
  const KvBudget b = policy->budget(6);
  ASSERT_EQ(b, (KvBudget{.sinks = 0, .heavy = 2, .recent = 2}));
  const int64_t keep = b.total() - 1;

  Row heads[2];
  heads[0].score = {3.0f, 0.375f, 1.125f, 0.875f, 0.5f, 0.125f};
  heads[1].score = {1.0f, 2.0f, 0.25f, 1.0f, 0.75f, 1.0f};
  for (auto& h : heads) h.pos = {0, 1, 2, 3, 4, 5};
  const std::set<int32_t> prefill_victims[2] = {{1, 3, 4}, {0, 2, 4}};
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(evict(*policy, b, heads[h], keep, GetParam()), prefill_victims[h]) << "head " << h;
  }
  EXPECT_EQ(heads[0].positions(), (std::set<int32_t>{0, 2, 5}));
  EXPECT_EQ(heads[1].positions(), (std::set<int32_t>{1, 3, 5}));

  const std::vector<Step> script = {
      {6,
       {{{0, .25f}, {2, .125f}, {5, .125f}, {6, .5f}}, {{1, .125f}, {3, .125f}, {5, .5f}, {6, .25f}}},
       {{5}, {3}},
       {{0, 2, 6}, {1, 5, 6}}},
      {7,
       {{{0, .0625f}, {2, 0.f}, {6, .8125f}, {7, .125f}}, {{1, .25f}, {5, .25f}, {6, .25f}, {7, .25f}}},
       {{2}, {6}},
       {{0, 6, 7}, {1, 5, 7}}},
      {8,
       {{{0, .25f}, {6, .25f}, {7, .25f}, {8, .25f}}, {{1, .25f}, {5, .25f}, {7, .25f}, {8, .25f}}},
       {{7}, {7}},
       {{0, 6, 8}, {1, 5, 8}}},
  };
  for (const Step& s : script) {
    for (int h = 0; h < 2; ++h) {
      SCOPED_TRACE(::testing::Message() << "token " << s.token << " head " << h);
      attend(heads[h], s.token, s.probs[h]);
      EXPECT_EQ(evict(*policy, b, heads[h], keep, GetParam()), s.victims[h]);
      EXPECT_EQ(heads[h].positions(), s.survivors[h]);
    }
  }
  EXPECT_FLOAT_EQ(heads[0].score[std::find(heads[0].pos.begin(), heads[0].pos.end(), 0) -
                                 heads[0].pos.begin()],
                  3.5625f);
}

INSTANTIATE_TEST_SUITE_P(Compactions, H2oScript,
                         ::testing::Values(Compaction::kStable, Compaction::kMoveLast));

TEST(H2o, LeavingTokenBelowEveryHeavyHitterIsTheVictim) {
  // heavy 3, recent 2, keep 4: slots hold heavy {0, 1, 2}, recent {10, 11}(new). Position 10
  // leaves the window with 0.01; the weakest heavy hitter has 4.0. True greedy drops 10.
  const auto p = make_policy(h2o_abs(3, 2));
  const KvBudget b = p->budget(100);
  Row row{{0, 1, 2, 10, 11}, {6.f, 5.f, 4.f, .01f, .5f}};
  std::vector<int32_t> v;
  p->select_victims(row.view(), b, b.total() - 1, v);
  EXPECT_EQ(v, (std::vector<int32_t>{3}));
}

TEST(H2o, TiesEvictTheOlderTokenRegardlessOfSlotOrder) {
  const auto p = make_policy(h2o_abs(1, 2));
  const KvBudget b = p->budget(10);
  // keep B - 1 = 2: recent {9}, one heavy hitter among 7, 3, 5 (all score 1): the newest, 7.
  Row row{{7, 9, 3, 5}, {1.f, 0.f, 1.f, 1.f}};
  std::vector<int32_t> v;
  p->select_victims(row.view(), b, b.total() - 1, v);
  EXPECT_EQ(v, (std::vector<int32_t>{2, 3}));  // positions 3 and 5
}

TEST(H2o, NanScoresAreEvictedFirst) {
  const auto p = make_policy(h2o_abs(2, 1));
  Row row{{0, 1, 2, 3}, {NAN, 0.1f, 0.2f, 5.f}};
  std::vector<int32_t> v;
  p->select_victims(row.view(), p->budget(10), 2, v);  // keep B - 1 = 2: heavy 2, recent 0
  EXPECT_EQ(v, (std::vector<int32_t>{0, 1}));
}

TEST(H2o, SignedZerosTieAndNanTiesMinusInfinity) {
  // One victim of a decode step (recent {10}); float == has -0 == +0 and NaN counts as -inf, so
  // each pair ties and the older token goes, whichever value it holds.
  const auto p = make_policy(h2o_abs(3, 2));
  const KvBudget b = p->budget(10);
  std::vector<int32_t> v;
  for (const auto& [older, newer] : {std::pair{0.f, -0.f}, std::pair{-0.f, 0.f}, std::pair{NAN, -INFINITY},
                                      std::pair{-INFINITY, NAN}}) {
    Row row{{10, 6, 2, 4, 9}, {0.f, 1.f, older, newer, 0.5f}};
    p->select_victims(row.view(), b, b.total() - 1, v);
    EXPECT_EQ(v, (std::vector<int32_t>{2})) << older << " at 2, " << newer << " at 4";
  }
}

TEST(H2o, PrefillProtectsTheLastRecentMinusOnePromptTokens) {
  // Like H2O-FlexGen prefill with hh_k = 3: heavy = top-3 of positions [0, s - hh_k + 1),
  // recent = the last hh_k - 1 prompt tokens. The huge scores of 8 and 9 do not matter.
  const auto p = make_policy(h2o_abs(3, 3));
  const KvBudget b = p->budget(10);
  Row row{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {9, 1, 8, 2, 7, 3, 0, 0.5f, 100, 100}};
  evict(*p, b, row, b.total() - 1, Compaction::kStable);
  EXPECT_EQ(row.positions(), (std::set<int32_t>{0, 2, 4, 8, 9}));
}

TEST(H2o, ZeroRecentMeansTheNewTokenIsAnOrdinaryCandidate) {
  const auto p = make_policy(h2o_abs(2, 0));
  const KvBudget b = p->budget(10);
  Row row{{0, 1, 2}, {3.f, 2.f, 0.1f}};  // 2 is the new token, lowest score
  std::vector<int32_t> v;
  p->select_victims(row.view(), b, b.total() - 1, v);
  EXPECT_EQ(v, (std::vector<int32_t>{1, 2}));
}

TEST(H2o, MisuseThrows) {
  const auto p = make_policy(h2o_abs(2, 2));
  const KvBudget b = p->budget(10);
  Row row{{0, 1, 2, 3, 4, 5}, {1, 1, 1, 1, 1, 1}};
  std::vector<int32_t> v;
  expect_error([&] { p->select_victims(row.view(), b, 5, v); }, {"keep 5", "budget is 4"});
  expect_error([&] { p->select_victims(row.view(), b, -1, v); }, {"keep must be >= 0"});
  Row bad{{0, 1, 2}, {1.f}};
  expect_error([&] { p->select_victims(bad.view(), b, 1, v); }, {"1 scores for 3 positions"});
}

// ---------------------------------------------------------------------------------------------
// Reference comparison over awkward sizes and every keep in [0, n].

// The policy's victims of `row` at `keep`: n - keep distinct slots, ascending, whose positions are
// the brute force's.
void expect_brute_force(const KvPolicy& p, const Row& row, const KvBudget& b, int64_t keep) {
  std::vector<int32_t> v;
  p.select_victims(row.view(), b, keep, v);
  const auto n = static_cast<int64_t>(row.pos.size());
  ASSERT_EQ(static_cast<int64_t>(v.size()), std::max<int64_t>(0, n - keep));
  ASSERT_TRUE(std::is_sorted(v.begin(), v.end()));
  ASSERT_TRUE(std::adjacent_find(v.begin(), v.end()) == v.end());
  std::set<int32_t> got;
  for (int32_t s : v) got.insert(row.pos[s]);
  ASSERT_EQ(got, reference_victims(row, b, keep));
}

class H2oSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(H2oSizes, MatchesBruteForceForEveryKeepAndSplit) {
  const int64_t n = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(1000 + n));
  for (int trial = 0; trial < 4; ++trial) {
    Row row = random_row(n, rng);
    for (int64_t heavy : {int64_t{0}, int64_t{1}, n / 2, n}) {
      for (int64_t recent : {int64_t{0}, int64_t{1}, n / 3 + 1}) {
        if (heavy + recent == 0) continue;
        const auto p = make_policy(h2o_abs(heavy, recent));
        const KvBudget b = p->budget(n);
        for (int64_t keep = 0; keep <= std::min(n, b.total()); ++keep) {
          SCOPED_TRACE(::testing::Message() << "heavy " << heavy << " recent " << recent
                                            << " keep " << keep);
          ASSERT_NO_FATAL_FAILURE(expect_brute_force(*p, row, b, keep));
        }
      }
    }
  }
}

TEST_P(H2oSizes, BudgetAtLeastSequenceLengthIsExactlyFull) {
  // Budget B >= prompt + generated + 1: nothing is ever evicted, like the full policy.
  const int64_t prompt = GetParam(), gen = 17;
  const auto p = make_policy(h2o_abs(prompt + gen, 1));
  const auto full = make_policy(KvPolicyConfig{});
  const KvBudget b = p->budget(prompt), fb = full->budget(prompt);
  EXPECT_TRUE(fb.unbounded);
  Row row, frow;
  for (int32_t t = 0; t < prompt; ++t) {
    row.pos.push_back(t);
    row.score.push_back(static_cast<float>(t % 3));
  }
  frow = row;
  for (int32_t t = static_cast<int32_t>(prompt); t < prompt + gen; ++t) {
    EXPECT_TRUE(evict(*p, b, row, b.total() - 1, Compaction::kMoveLast).empty());
    EXPECT_TRUE(evict(*full, fb, frow, fb.total() - 1, Compaction::kMoveLast).empty());
    row.pos.push_back(t);
    row.score.push_back(0.f);
    frow.pos.push_back(t);
    frow.score.push_back(0.f);
  }
  EXPECT_EQ(row.positions(), range_set(0, static_cast<int32_t>(prompt + gen)));
  EXPECT_EQ(row.pos, frow.pos);
}

TEST_P(H2oSizes, DecodeLoopIsIndependentOfCompactionOrder) {
  // Stable and move-last compaction permute slots differently; survivors must not change.
  const int64_t prompt = GetParam();
  const auto p = make_policy(h2o_abs(prompt / 3 + 1, prompt / 4 + 1));
  const KvBudget b = p->budget(prompt);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> q(0, 4);
  Row a;
  for (int32_t t = 0; t < prompt; ++t) {
    a.pos.push_back(t);
    a.score.push_back(0.25f * static_cast<float>(q(rng)));
  }
  Row c = a;
  for (int32_t t = static_cast<int32_t>(prompt); t < prompt + 40; ++t) {
    ASSERT_EQ(evict(*p, b, a, b.total() - 1, Compaction::kStable),
              evict(*p, b, c, b.total() - 1, Compaction::kMoveLast));
    ASSERT_EQ(a.positions(), c.positions());
    std::map<int32_t, float> probs;
    for (int32_t pos : a.pos) probs[pos] = 0.125f * static_cast<float>(q(rng));
    probs[t] = 0.125f;
    attend(a, t, probs);
    attend(c, t, probs);
    ASSERT_LE(static_cast<int64_t>(a.pos.size()), b.total());
  }
}

// Rows as the engine keeps them (row_of_ranges), which the policy decides in one or two passes
// (few victims) or from one pass's candidate list (many). The brute force sorts everything. Sinks
// beside a heavy quota come only through the budget here (no policy makes both), to cover
// select_victims' whole contract.
TEST_P(H2oSizes, RowsOfRangesMatchBruteForceForEveryKeep) {
  const int64_t n = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(77 + n));
  const auto p = make_policy(h2o_abs(1, 1));
  for (int trial = 0; trial < 6; ++trial) {
    for (int64_t sinks : {int64_t{0}, int64_t{2}}) {
      for (int64_t recent : {int64_t{1}, int64_t{2}, n / 4 + 1, n / 2 + 1}) {
        if (sinks + recent > n) continue;
        const Row row = row_of_ranges(n, recent, sinks, rng);
        for (int64_t heavy : {int64_t{1}, int64_t{3}, n / 8 + 1, n / 2, n}) {
          const KvBudget b{.sinks = sinks, .heavy = heavy, .recent = recent};
          for (int64_t keep = 0; keep <= std::min(n, b.total()); ++keep) {
            SCOPED_TRACE(::testing::Message() << "sinks " << sinks << " heavy " << heavy << " recent " << recent
                                              << " keep " << keep);
            ASSERT_NO_FATAL_FAILURE(expect_brute_force(*p, row, b, keep));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AwkwardSizes, H2oSizes, ::testing::ValuesIn(kSizes));

}  // namespace
}  // namespace flexh2o::test
