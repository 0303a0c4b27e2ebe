// Tests of KvPolicyConfig: names, validation messages that name the flag, describe(), and how
// budgets are derived from ratios (H2O's int(prompt_len * ratio), minimum 1) or counts.
#include <gtest/gtest.h>

#include "sim.h"

namespace flexh2o::test {
namespace {

KvPolicyConfig make(KvPolicyKind k) {
  KvPolicyConfig c;
  c.kind = k;
  return c;
}

TEST(Config, NamesRoundTripAndUnknownListsTheValidOnes) {
  for (auto k : {KvPolicyKind::kFull, KvPolicyKind::kLocal, KvPolicyKind::kSinks,
                 KvPolicyKind::kH2o, KvPolicyKind::kRandom})
    EXPECT_EQ(parse_kv_policy_kind(kv_policy_name(k)), k);
  expect_error([] { parse_kv_policy_kind("H2O-ish"); },
               {"--kv-policy", "'H2O-ish'", "full, local, sinks, h2o, random"});
}

TEST(Config, DefaultIsFullAndValid) {
  EXPECT_NO_THROW(validate(KvPolicyConfig{}));
  EXPECT_EQ(describe(KvPolicyConfig{}), "full");
}

TEST(Config, RatiosOutOfRangeNameTheFlag) {
  for (double bad : {-0.1, 1.5, std::nan(""), double{INFINITY}}) {
    auto c = make(KvPolicyKind::kH2o);
    c.heavy_ratio = bad;
    c.recent_ratio = 0.1;
    expect_error([&] { validate(c); }, {"--heavy-ratio", "[0, 1]"});
    c.heavy_ratio = 0.1;
    c.recent_ratio = bad;
    expect_error([&] { make_policy(c); }, {"--recent-ratio", "[0, 1]"});
  }
}

TEST(Config, NegativeCountsNameTheFlag) {
  auto c = make(KvPolicyKind::kH2o);
  c.heavy_budget = -3;
  c.recent_budget = 4;
  expect_error([&] { validate(c); }, {"--heavy-budget", ">= 0", "-3"});
  c.heavy_budget = 4;
  c.recent_budget = -1;
  expect_error([&] { validate(c); }, {"--recent-budget", ">= 0"});
  auto s = make(KvPolicyKind::kSinks);
  s.recent_budget = 8;
  s.sink_tokens = -4;
  expect_error([&] { validate(s); }, {"--sink-tokens", ">= 0"});
}

TEST(Config, RatioAndBudgetAreExclusive) {
  auto c = make(KvPolicyKind::kH2o);
  c.heavy_ratio = 0.1;
  c.heavy_budget = 10;
  expect_error([&] { validate(c); }, {"--heavy-ratio and --heavy-budget", "mutually exclusive"});
  c = make(KvPolicyKind::kLocal);
  c.recent_ratio = 0.1;
  c.recent_budget = 10;
  expect_error([&] { validate(c); }, {"--recent-ratio and --recent-budget"});
}

TEST(Config, FlagsThePolicyDoesNotUseAreRejected) {
  auto c = make(KvPolicyKind::kFull);
  c.heavy_ratio = 0.1;
  expect_error([&] { validate(c); }, {"--heavy-ratio does not apply to --kv-policy full"});
  c = make(KvPolicyKind::kLocal);
  c.recent_budget = 8;
  c.heavy_budget = 8;
  expect_error([&] { validate(c); }, {"--heavy-budget does not apply to --kv-policy local"});
  c = make(KvPolicyKind::kH2o);
  c.heavy_budget = 8;
  c.sink_tokens = 4;
  expect_error([&] { validate(c); }, {"--sink-tokens does not apply to --kv-policy h2o"});
}

TEST(Config, ZeroTotalBudgetsAreRejected) {
  for (auto k : {KvPolicyKind::kH2o, KvPolicyKind::kRandom}) {
    auto c = make(k);
    expect_error([&] { validate(c); }, {"nonzero total budget", "--heavy-ratio", "--recent-budget"});
    c.heavy_ratio = 0.0;
    c.recent_budget = 0;
    expect_error([&] { validate(c); }, {"nonzero total budget"});
    c.recent_budget = 1;
    EXPECT_NO_THROW(validate(c));
  }
  for (auto k : {KvPolicyKind::kLocal, KvPolicyKind::kSinks}) {
    auto c = make(k);
    expect_error([&] { validate(c); }, {"nonzero window", "--recent-ratio", "--recent-budget"});
    c.recent_ratio = 0.0;
    expect_error([&] { make_policy(c); }, {"nonzero window"});
  }
}

TEST(Config, Describe) {
  auto c = make(KvPolicyKind::kH2o);
  c.heavy_ratio = 0.1;
  c.recent_budget = 32;
  EXPECT_EQ(describe(c), "h2o heavy=0.1*prompt recent=32");
  c = make(KvPolicyKind::kSinks);
  c.recent_budget = 1020;
  EXPECT_EQ(describe(c), "sinks sinks=4 recent=1020");
  c = make(KvPolicyKind::kRandom);
  c.heavy_budget = 5;
  c.seed = 9;
  EXPECT_EQ(describe(c), "random heavy=5 seed=9");
}

struct Rounding {
  double ratio;
  int64_t prompt_len;
  int64_t tokens;
};

class RatioRounding : public ::testing::TestWithParam<Rounding> {};

TEST_P(RatioRounding, MatchesPythonIntOfProductWithMinimumOne) {
  const Rounding r = GetParam();
  auto c = make(KvPolicyKind::kH2o);
  c.heavy_ratio = r.ratio;
  c.recent_budget = 5;
  const KvBudget b = make_policy(c)->budget(r.prompt_len);
  EXPECT_EQ(b.heavy, r.tokens) << r.ratio << " * " << r.prompt_len;
  EXPECT_EQ(b.recent, 5);  // absolute counts do not depend on the prompt length
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RatioRounding,
    ::testing::Values(Rounding{0.1, 512, 51}, Rounding{0.2, 512, 102}, Rounding{0.3, 512, 153},
                      Rounding{0.29, 100, 28},  // 28.999999999999996 in double, as in Python
                      Rounding{0.5, 7, 3}, Rounding{0.2, 13, 2}, Rounding{1.0, 97, 97},
                      Rounding{0.001, 10, 1},  // 0.01 -> raised to the minimum of 1
                      Rounding{0.5, 1, 1}, Rounding{0.5, 0, 1}, Rounding{0.0, 251, 0}));

TEST(Config, HhRatioEquivalence) {
  // H2O-FlexGen --hh-ratio 0.1 on a 512-token prompt: 2 * hh_k = 102 rows.
  auto c = make(KvPolicyKind::kH2o);
  c.heavy_ratio = 0.1;
  c.recent_ratio = 0.1;
  EXPECT_EQ(make_policy(c)->budget(512).total(), 102);
  expect_error([&] { make_policy(c)->budget(-1); }, {"prompt_len"});
}

}  // namespace
}  // namespace flexh2o::test
