// Sliding windows through the program: the full cache keeps only a window that every layer, or
// only the sliding layers, attend to, offloaded and in memory; the log, the report and `plan` say so.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args, ""); }

// The full cache of a model whose every layer slides (arch/mistral: window 20), run past the
// window: the run says so, keeps the window (`local` at 20, in the report with the reason), and
// `plan` prices the same; within the window nothing changes.
TEST(Cli, TheFullCachePastAnAllSlidingWindowKeepsTheWindow) {
  TempDir tmp;
  const fs::path in = tmp.path() / "ids.jsonl", out = tmp.path() / "out.jsonl", rep = tmp.path() / "r.json";
  {
    std::ofstream f(in);
    f << R"({"prompt_ids": [3,4,5,6,7,8,9,10,11,12,13,14]})" << "\n";
  }
  const std::string run = "generate -m " + model_dir("arch/mistral").string() + " --input " + in.string() +
                          " --output " + out.string() + " --overwrite --report " + rep.string() + " -n ";
  RunResult past = flexh2o(run + "12");
  ASSERT_EQ(past.code, 0) << past.err;
  EXPECT_NE(past.err.find("every layer attends to its last 20 positions only"), std::string::npos) << past.err;
  json r = json::parse(std::ifstream(rep));
  EXPECT_EQ(r["kv_policy"], "local recent=20") << r.dump();
  EXPECT_NE(r["kv_policy_note"].get<std::string>().find("sequences reach 24"), std::string::npos) << r.dump();
  RunResult within = flexh2o(run + "8");
  ASSERT_EQ(within.code, 0) << within.err;
  r = json::parse(std::ifstream(rep));
  EXPECT_EQ(r["kv_policy"], "full") << r.dump();
  EXPECT_EQ(r["kv_policy_note"], "") << r.dump();
  const std::string t4 = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json").string();
  RunResult plan = flexh2o("plan -m " + model_dir("arch/mistral").string() + " --hardware " + t4 +
                           " --prompt-len 30 --gen-len 10");
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("KV local recent=20"), std::string::npos) << plan.out;
}

// Where only some layers slide (arch/gemma2: one of two, window 20), the full cache keeps only the
// window in the sliding layer once sequences pass it, offloaded and in memory; the log and
// report say so, and both give the same greedy tokens.
TEST(Cli, TheFullCacheKeepsTheWindowInSlidingLayers) {
  TempDir tmp;
  const fs::path in = tmp.path() / "ids.jsonl", out = tmp.path() / "out.jsonl", mem = tmp.path() / "mem.jsonl";
  const fs::path rep = tmp.path() / "r.json";
  {
    std::ofstream f(in);
    f << R"({"prompt_ids": [3,4,5,6,7,8,9,10,11,12,13,14]})" << "\n" << R"({"prompt_ids": [9,8,7]})" << "\n";
  }
  const std::string run = "generate -m " + model_dir("arch/gemma2").string() + " --input " + in.string() +
                          " --overwrite -n 30 --report " + rep.string();
  RunResult offloaded = flexh2o(run + " --output " + out.string() + " --percent 0 100 0 100 100 0");
  ASSERT_EQ(offloaded.code, 0) << offloaded.err;
  EXPECT_NE(offloaded.err.find("the 1 sliding layers of 2 attend to their last 20 positions only"), std::string::npos)
      << offloaded.err;
  json r = json::parse(std::ifstream(rep));
  EXPECT_EQ(r["kv_policy"], "full") << r.dump();
  EXPECT_NE(r["kv_policy_note"].get<std::string>().find("sequences reach 42"), std::string::npos) << r.dump();
  RunResult in_memory = flexh2o(run + " --output " + mem.string());
  ASSERT_EQ(in_memory.code, 0) << in_memory.err;
  EXPECT_NE(in_memory.err.find("sliding layers"), std::string::npos) << in_memory.err;
  auto tokens = [](const fs::path& p) {
    std::vector<json> v;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) v.push_back(json::parse(line)["token_ids"]);
    return v;
  };
  EXPECT_EQ(tokens(out), tokens(mem));
}

}  // namespace
