// `generate --sort-window`: batches of like prompt lengths give the same output, line for line
// in input order (flexh2o lines and OpenAI Batch lines with several choices and stop strings),
// with less padding in the report; 1 runs input order.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

std::vector<json> lines_of(const fs::path& p) { return flexh2o::test::read_jsonl(p); }

// A run's output and report with --sort-window `w`.
std::pair<std::vector<json>, json> run(const TempDir& tmp, const fs::path& in, const std::string& w,
                                       const std::string& more = "") {
  const fs::path out = tmp.path() / ("out" + w + ".jsonl"), rep = tmp.path() / ("r" + w + ".json");
  RunResult r = flexh2o::test::run_flexh2o("generate -m " + model_dir("tiny-llama").string() + " --input " +
                                           in.string() + " --output " + out.string() + " --report " + rep.string() +
                                           " -b 2 --seed 3 --temperature 0.8 --progress never --quiet --sort-window " +
                                           w + more);
  EXPECT_EQ(r.code, 0) << r.err;
  return {lines_of(out), json::parse(std::ifstream(rep))};
}

TEST(Cli, SortWindowKeepsTheOutputAndPadsLess) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < 10; ++i) {
      f << R"({"id": "r)" << i << R"(", "prompt_ids": [)";
      const int len = i % 2 ? 2 + i : 30 - 2 * i;
      for (int t = 0; t < len; ++t) f << (t ? "," : "") << 3 + (5 * i + t) % 90;
      f << R"(], "max_new_tokens": )" << 2 + i % 3 << ", \"logprobs\": 1}\n";
    }
  }
  const auto [plain, plain_report] = run(tmp, in, "1");
  const auto [sorted, sorted_report] = run(tmp, in, "8");
  ASSERT_EQ(plain.size(), 10u);
  EXPECT_EQ(sorted, plain);  // the same lines, in input order
  EXPECT_EQ(sorted_report["prompt_tokens"], plain_report["prompt_tokens"]);
  EXPECT_LT(sorted_report["padded_prompt_tokens"].get<int64_t>(), plain_report["padded_prompt_tokens"].get<int64_t>());
  EXPECT_EQ(sorted_report["sort_window"], 8);
}

TEST(Cli, SortWindowKeepsBatchLinesWithChoicesAndStops) {
  TempDir tmp;
  const fs::path in = tmp.path() / "batch.jsonl";
  {
    std::ofstream f(in);
    const char* prompts[] = {"In the beginning God created the heaven and the earth. And the earth was", "And",
                             "Then God said", "Blessed", "And the LORD spake unto Moses, saying, Speak unto"};
    for (int i = 0; i < 5; ++i)
      f << json{{"custom_id", "c" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"},
                {"body", {{"model", "m"}, {"prompt", prompts[i]}, {"max_tokens", 6 + i}, {"n", 1 + i % 2},
                          {"stop", json::array({" the"})}, {"seed", 7 + i}}}}
               .dump()
        << "\n";
  }
  auto [plain, pr] = run(tmp, in, "1");
  auto [sorted, sr] = run(tmp, in, "4");
  ASSERT_EQ(plain.size(), 5u);
  ASSERT_EQ(sorted.size(), 5u);
  for (size_t i = 0; i < plain.size(); ++i) {
    json a = plain[i]["response"]["body"], b = sorted[i]["response"]["body"];
    for (json* j : {&a, &b}) j->erase("id"), j->erase("created");
    EXPECT_EQ(sorted[i]["custom_id"], plain[i]["custom_id"]);
    EXPECT_EQ(b, a) << i;
  }
  EXPECT_LT(sr["padded_prompt_tokens"].get<int64_t>(), pr["padded_prompt_tokens"].get<int64_t>());
}

TEST(Cli, SortWindowMustBePositive) {
  RunResult r = flexh2o::test::run_flexh2o("generate -m " + model_dir("tiny-llama").string() +
                                           " --prompt hi --sort-window 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--sort-window"), std::string::npos) << r.err;
}

}  // namespace
