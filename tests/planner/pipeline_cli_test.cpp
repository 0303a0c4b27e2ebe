// `flexh2o plan` as a user runs it: with --pipeline-stages S the JSON plan agrees with itself
// (bounds, stages, bubble), the text names every stage, and misused flags fail with clear
// messages; memory caps replace the profile's capacities.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {
using flexh2o::test::run_flexh2o;
using nlohmann::json;

TEST(PipelineCli, JsonPlanOfThreeStages) {
  const auto r = run_flexh2o("plan -m opt-1.3b --hardware h200 --prompt-len 256 --gen-len 16 --pipeline-stages 3 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["pipeline_stages"], 3);
  const std::vector<int64_t> b = j["bounds"];
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b.front(), 0);
  EXPECT_EQ(b.back(), 24);
  ASSERT_EQ(j["stages"].size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    const json& st = j["stages"][s];
    EXPECT_EQ(st["first_layer"], b[s]);
    EXPECT_EQ(st["end_layer"], b[s + 1]);
    EXPECT_EQ(st["embedding"], s == 0);
    EXPECT_EQ(st["lm_head"], s == 2);
    EXPECT_GT(st["decode_step_s"].get<double>(), 0);
    EXPECT_FALSE(st["policy_flags"].get<std::string>().empty());
  }
  EXPECT_EQ(j["stage_link"]["kind"], "nvlink");  // h200.json's stage_link
  const int64_t rows = j["sequences_per_group"];
  EXPECT_EQ(j["bytes_between_stages_per_group_step"]["decode"], rows * 2048 * 2);
  EXPECT_EQ(j["bytes_between_stages_per_group_step"]["prefill"], rows * 256 * 2048 * 2);
  EXPECT_GE(j["groups"].get<int64_t>(), 1);
  const double bubble = j["bubble_fraction"];
  EXPECT_GT(bubble, 0);
  EXPECT_LT(bubble, 1);
  EXPECT_NEAR(j["throughput_tokens_per_s"].get<double>(),
              double(j["groups"].get<int64_t>() * rows * 16) / j["wall_s"].get<double>(), 1e-6);
}

TEST(PipelineCli, TextPlanAndFixedGroupsAndLinkPreset) {
  const auto r = run_flexh2o(
      "plan -m opt-1.3b --hardware h200 --prompt-len 256 --gen-len 16 --pipeline-stages 2 --groups 5 --stage-link "
      "ethernet-10g");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {"pipeline   2 stages, 5 groups in flight", "link       ethernet-10g (network, 1.1 GB/s",
                           "stage 0    layers 0..", "+ embedding", "+ lm_head", "throughput ", "bubble     "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

// plan takes --gpu-mem / --cpu-mem / --disk-mem as --policy auto does, so what auto decides under
// them can be planned: OPT-30B on the h200 profile fits its GPU whole; under 16 GiB it streams.
TEST(PlanCli, MemoryCapsReplaceTheProfilesCapacities) {
  const std::string plan = "plan -m opt-30b --hardware h200 --prompt-len 512 --gen-len 32 --json";
  const auto whole = run_flexh2o(plan), capped = run_flexh2o(plan + " --gpu-mem 16GiB --cpu-mem 100GiB");
  ASSERT_EQ(whole.code, 0) << whole.err;
  ASSERT_EQ(capped.code, 0) << capped.err;
  const json w = json::parse(whole.out), c = json::parse(capped.out);
  const double gpu = 16.0 * (1ull << 30), cpu = 100.0 * (1ull << 30);
  EXPECT_GT(w["memory_bytes"]["device"].get<double>(), gpu) << "uncapped, the search must use more than the cap";
  EXPECT_LE(c["memory_bytes"]["device"].get<double>(), gpu);
  EXPECT_LE(c["memory_bytes"]["host"].get<double>(), cpu);
  const auto bad = run_flexh2o(plan + " --gpu-mem lots");
  EXPECT_EQ(bad.code, 2);  // refused as the flags are parsed
  EXPECT_NE(bad.err.find("--gpu-mem"), std::string::npos) << bad.err;
}

// On a profile whose device and host share RAM (the CPU device's), --gpu-mem and --cpu-mem given
// together split it: each bounds its own tier, as the engine bounds them; one alone still bounds
// both tiers together. --compress-cache beside another --kv-dtype is refused, as generate does.
TEST(PlanCli, BothBudgetsOnASharedMachineBoundTheirOwnTiers) {
  flexh2o::test::TempDir tmp;
  json h = json::parse(std::ifstream(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json"));
  h["shared_memory"] = true;
  const std::filesystem::path prof = tmp.path() / "shared.json";
  std::ofstream(prof) << h.dump();
  const std::string plan = "plan -m opt-1.3b --hardware " + prof.string() +
                           " --prompt-len 8 --gen-len 2 --percent 60 40 100 0 100 0 --gpu-batch-size 2 "
                           "--num-gpu-batches 1 --cpu-mem 2GiB --json";
  const auto both = run_flexh2o(plan + " --gpu-mem 2GiB"), host_only = run_flexh2o(plan);
  ASSERT_EQ(both.code, 0) << both.err;
  ASSERT_EQ(host_only.code, 0) << host_only.err;
  EXPECT_TRUE(json::parse(both.out)["fits"].get<bool>()) << both.out;
  EXPECT_FALSE(json::parse(host_only.out)["fits"].get<bool>()) << host_only.out;  // 2.6 GB of weights in 2 GiB
  const auto q4 = run_flexh2o("plan -m opt-125m --hardware h200 --kv-dtype bf16 --compress-cache");
  EXPECT_EQ(q4.code, 1);
  EXPECT_NE(q4.err.find("--kv-dtype bf16 was given; drop one"), std::string::npos) << q4.err;
}

TEST(PipelineCli, MisusedFlagsFailClearly) {
  auto expect_fail = [](const std::string& args, const std::string& msg) {
    const auto r = run_flexh2o(args);
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_NE(r.err.find(msg), std::string::npos) << args << "\n" << r.err;
  };
  expect_fail("plan -m opt-125m --hardware h200 --groups 3", "--groups and --stage-link need --pipeline-stages");
  expect_fail("plan -m opt-125m --hardware h200 --heavy-ratio 0.2", "--heavy-ratio does not apply to --kv-policy full");
  expect_fail("plan -m opt-125m --hardware h200 --pipeline-stages 2 --percent 100 0 100 0 100 0",
              "with --pipeline-stages each stage's policy is searched");
  expect_fail("plan -m opt-125m --hardware h200 --pipeline-stages 13", "--pipeline-stages must be in [1, 12]");
  expect_fail("plan -m opt-125m --hardware h200 --pipeline-stages 2 --stage-link token-ring",
              "stage link \"token-ring\" is neither a file nor a name in");
}

// Lengths, stages and groups below 1 are refused as usage errors naming the flag (a zero length
// ended in an internal check's source location; zero stages silently planned one process);
// generate's name for the groups, --pipeline-groups, is taken too.
TEST(PlanCli, ValuesBelowOneAreRefusedNamingTheFlag) {
  const std::string plan = "plan -m opt-1.3b --hardware h200 ";
  for (const std::string bad : {"--prompt-len 0", "--gen-len 0", "--prompt-len -5", "--pipeline-stages 0",
                                "--pipeline-stages -1", "--pipeline-stages 2 --groups 0"}) {
    const auto r = run_flexh2o(plan + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    EXPECT_NE(r.err.find(bad.substr(bad.rfind("--"), bad.rfind(' ') - bad.rfind("--"))), std::string::npos)
        << bad << "\n" << r.err;
    EXPECT_EQ(r.err.find(".cpp:"), std::string::npos) << bad << "\n" << r.err;
  }
  const auto r = run_flexh2o(plan + "--pipeline-stages 2 --pipeline-groups 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("pipeline   2 stages, 5 groups in flight"), std::string::npos) << r.out;
}

}  // namespace
