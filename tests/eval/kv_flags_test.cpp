// cli/kv_flags.h: flag parsing through CLI11, validation errors that name the flag, and the
// ratio -> absolute budget conversion eval-ppl uses.
#include <gtest/gtest.h>

#include "cli/kv_flags.h"
#include "core/error.h"
#include "policies/kv_policy.h"

namespace flexh2o::cli {
namespace {

KvPolicyConfig parse(std::vector<std::string> args) {
  CLI::App app;
  KvArgs a;
  add_kv_flags(&app, a);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  app.parse(rev);
  return make_kv_config(a);
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(KvFlags, DefaultIsFull) {
  EXPECT_EQ(parse({}).kind, KvPolicyKind::kFull);
}

TEST(KvFlags, ParsesEveryPolicy) {
  KvPolicyConfig c = parse({"--kv-policy", "h2o", "--heavy-ratio", "0.1", "--recent-budget", "20"});
  EXPECT_EQ(c.kind, KvPolicyKind::kH2o);
  EXPECT_EQ(c.heavy_ratio, 0.1);
  EXPECT_EQ(c.recent_budget, 20);
  c = parse({"--kv-policy", "sinks", "--sink-tokens", "2", "--recent-ratio", "0.5"});
  EXPECT_EQ(c.kind, KvPolicyKind::kSinks);
  EXPECT_EQ(c.sink_tokens, 2);
  c = parse({"--kv-policy", "random", "--heavy-budget", "8", "--kv-seed", "42"});
  EXPECT_EQ(c.kind, KvPolicyKind::kRandom);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(parse({"--kv-policy", "local", "--recent-budget", "5"}).kind, KvPolicyKind::kLocal);
}

TEST(KvFlags, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({"--kv-policy", "lru"}).find("--kv-policy"), std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "h2o", "--heavy-ratio", "1.5"}).find("--heavy-ratio"), std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "h2o", "--recent-budget", "-3"}).find("--recent-budget"), std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "local", "--heavy-budget", "3", "--recent-budget", "3"}).find("--heavy-budget"),
            std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "h2o", "--heavy-ratio", "0.1", "--heavy-budget", "3"}).find("--heavy-ratio"),
            std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "local"}).find("--recent-"), std::string::npos);
  EXPECT_NE(error_of({"--kv-policy", "h2o", "--recent-budget", "4", "--kv-seed", "1"}).find("--kv-seed"),
            std::string::npos);
  EXPECT_NE(error_of({"--heavy-ratio", "0.1"}).find("--heavy-ratio"), std::string::npos);  // full reads none
  EXPECT_NE(error_of({"--kv-policy", "h2o", "--heavy-ratio", "abc"}).find("--heavy-ratio"), std::string::npos);
}

TEST(KvFlags, RatiosBecomeAbsoluteBudgets) {
  KvPolicyConfig c = parse({"--kv-policy", "h2o", "--heavy-ratio", "0.1", "--recent-ratio", "0.29"});
  KvPolicyConfig b = ratios_to_budgets(c, 100);
  EXPECT_FALSE(b.heavy_ratio);
  EXPECT_FALSE(b.recent_ratio);
  EXPECT_EQ(b.heavy_budget, 10);
  EXPECT_EQ(b.recent_budget, 28);  // int(100 * 0.29) = 28, as H2O computes it
  EXPECT_EQ(make_policy(b)->budget(1).total(), 38);
  b = ratios_to_budgets(parse({"--kv-policy", "local", "--recent-ratio", "0.001"}), 100);
  EXPECT_EQ(b.recent_budget, 1);  // raised to 1 when the ratio is > 0
  b = ratios_to_budgets(parse({"--kv-policy", "sinks", "--recent-ratio", "0.5"}), 1024);
  EXPECT_EQ(b.recent_budget, 512);
  EXPECT_EQ(make_policy(b)->budget(1).total(), 516);
  c = parse({"--kv-policy", "h2o", "--heavy-budget", "7", "--recent-budget", "9"});
  EXPECT_EQ(ratios_to_budgets(c, 1000), c);  // budgets untouched
}

}  // namespace
}  // namespace flexh2o::cli
