// `generate --continuous`: the same output lines as static batches (in memory and offloaded,
// flexh2o lines of mixed lengths and Batch lines whose stop strings end them early), in fewer
// token steps with refills in the report; under a KV policy it says it ran static batches.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

std::vector<json> lines_of(const fs::path& p) { return flexh2o::test::read_jsonl(p); }

struct Out {
  std::vector<json> lines;
  json report;
  std::string err;
};

Out run(const TempDir& tmp, const fs::path& in, const std::string& flags) {
  static int n = 0;
  const std::string k = std::to_string(++n);
  const fs::path out = tmp.path() / ("out" + k + ".jsonl"), rep = tmp.path() / ("r" + k + ".json");
  RunResult r = flexh2o::test::run_flexh2o("generate -m " + model_dir("tiny-opt").string() + " --input " + in.string() +
                                           " --output " + out.string() + " --report " + rep.string() +
                                           " -b 3 --seed 3 --temperature 0.8 --progress never --quiet " + flags);
  EXPECT_EQ(r.code, 0) << r.err;
  return {lines_of(out), json::parse(std::ifstream(rep)), r.err};
}

fs::path mixed_lines(const TempDir& tmp) {
  const fs::path in = tmp.path() / "in.jsonl";
  std::ofstream f(in);
  for (int i = 0; i < 12; ++i) {
    f << R"({"id": "r)" << i << R"(", "prompt_ids": [)";
    const int len = 3 + (7 * i) % 20;
    for (int t = 0; t < len; ++t) f << (t ? "," : "") << 3 + (5 * i + t) % 90;
    f << R"(], "max_new_tokens": )" << (i % 4 == 0 ? 24 : 2 + i % 5) << ", \"logprobs\": 1}\n";
  }
  return in;
}

TEST(Cli, ContinuousKeepsTheOutputInFewerSteps) {
  TempDir tmp;
  const fs::path in = mixed_lines(tmp);
  const std::string offloaded =
      " --percent 0 100 50 50 100 0 --offload-dir " + (tmp.path() / "store").string();  // -b 3: blocks of 3
  // FlexGen's OPT-30B shape: KV on the host, attention there.
  const std::string host_attention =
      " --percent 20 80 0 100 100 0 --cpu-cache-compute --offload-dir " + (tmp.path() / "store").string();
  for (const std::string& place : {std::string(), offloaded, host_attention}) {
    const Out base = run(tmp, in, place);
    const Out cont = run(tmp, in, "--continuous" + place);
    ASSERT_EQ(base.lines.size(), 12u);
    EXPECT_EQ(cont.lines, base.lines) << place;
    EXPECT_TRUE(cont.report["continuous"].get<bool>()) << place;
    EXPECT_GT(cont.report["refills"].get<int64_t>(), 0) << place;
    EXPECT_EQ(cont.report["refilled_sequences"], 9) << place;  // all but the first batch's 3
    EXPECT_LT(cont.report["decode_steps"].get<int64_t>(), base.report["decode_steps"].get<int64_t>()) << place;
    EXPECT_FALSE(base.report["continuous"].get<bool>());
    EXPECT_EQ(cont.err.find("static batches"), std::string::npos) << cont.err;
  }
}

TEST(Cli, ContinuousKeepsBatchLinesWhoseStopStringsEndThem) {
  TempDir tmp;
  const fs::path in = tmp.path() / "batch.jsonl";
  {
    std::ofstream f(in);
    const char* prompts[] = {"In the beginning God created the heaven and the earth. And the earth was", "And",
                             "Then God said", "Blessed", "And the LORD spake unto Moses, saying, Speak unto", "For"};
    for (int i = 0; i < 6; ++i)
      f << json{{"custom_id", "c" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"},
                {"body", {{"model", "m"}, {"prompt", prompts[i]}, {"max_tokens", 12 + i}, {"n", 1 + i % 2},
                          {"stop", json::array({" the", ","})}, {"seed", 7 + i}}}}
               .dump()
        << "\n";
  }
  const Out base = run(tmp, in, "");
  const Out cont = run(tmp, in, "--continuous");
  ASSERT_EQ(base.lines.size(), 6u);
  ASSERT_EQ(cont.lines.size(), 6u);
  for (size_t i = 0; i < base.lines.size(); ++i) {
    json a = base.lines[i]["response"]["body"], b = cont.lines[i]["response"]["body"];
    for (json* j : {&a, &b}) j->erase("id"), j->erase("created");
    EXPECT_EQ(b, a) << i;
  }
  EXPECT_GT(cont.report["refills"].get<int64_t>(), 0);
}

TEST(Cli, ContinuousUnderAKvPolicyRunsStaticBatchesAndSaysSo) {
  TempDir tmp;
  const fs::path in = mixed_lines(tmp);
  const Out base = run(tmp, in, "--kv-policy h2o --heavy-ratio 0.3 --recent-ratio 0.3");
  const Out cont = run(tmp, in, "--kv-policy h2o --heavy-ratio 0.3 --recent-ratio 0.3 --continuous");
  EXPECT_EQ(cont.lines, base.lines);
  EXPECT_FALSE(cont.report["continuous"].get<bool>());
  EXPECT_EQ(cont.report["refills"], 0);
  EXPECT_NE(cont.err.find("--continuous: this run runs static batches"), std::string::npos) << cont.err;
}

}  // namespace
