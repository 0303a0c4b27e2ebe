// Stop strings on flexh2o lines and --prompt (`"stop"`, `--stop`): a sequence ends at the token
// whose text completes one, its text is cut before it, finish_reason "stop"; a line's own
// "stop" overrides --stop; static, continuous and offloaded runs agree; bad values are refused.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;

const std::string kOpt = model_dir("tiny-opt").string();
// tiny-opt, greedy: ", and the LORD, and the LORD, ..." (tokens 15 271 262 341, repeated).
const std::string kPrompt = "In the beginning God created";
const std::vector<int> kGreedy = {15, 271, 262, 341, 15, 271, 262, 341, 15, 271, 262, 341};

std::vector<json> run_lines(const TempDir& tmp, const std::vector<json>& lines, const std::string& flags,
                            int code = 0) {
  static int n = 0;
  const fs::path in = tmp.path() / ("in" + std::to_string(++n) + ".jsonl"),
                 out = tmp.path() / ("out" + std::to_string(n) + ".jsonl");
  {
    std::ofstream f(in);
    for (const json& l : lines) f << l.dump() << "\n";
  }
  const RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() +
                                                 " -n 12 --greedy --ignore-eos --progress never -b 2 " + flags);
  EXPECT_EQ(r.code, code) << r.err;
  return flexh2o::test::read_jsonl(out);
}

std::vector<int> first(size_t n) { return {kGreedy.begin(), kGreedy.begin() + long(n)}; }

TEST(CliStop, LineStopStringsEndSequencesAndCutTheText) {
  TempDir tmp;
  const std::vector<json> lines = {
      {{"id", "lord"}, {"prompt", kPrompt}, {"stop", " LORD"}},
      {{"id", "list"}, {"prompt", kPrompt}, {"stop", {"xyz", ", and"}}},  // the second token completes it
      {{"id", "flag"}, {"prompt", kPrompt}},                              // --stop's
      {{"id", "null"}, {"prompt", kPrompt}, {"stop", nullptr}},           // also --stop's
      {{"id", "never"}, {"prompt", kPrompt}, {"stop", {"xyz"}}},          // overrides --stop: runs to the end
      {{"id", "span"}, {"prompt", kPrompt}, {"stop", "D, a"}},            // across tokens " LORD" and ","
      {{"id", "last"}, {"prompt", kPrompt}, {"stop", " LORD"}, {"max_new_tokens", 4}},  // a stop, not length
      {{"id", "none"}, {"prompt", kPrompt}, {"stop", json::array()}},     // no stop strings, not --stop's
  };
  for (const std::string& flags : {std::string(), std::string("--continuous"),
                                   "--percent 0 100 0 100 0 100 --offload-dir " + (tmp.path() / "s").string()}) {
    SCOPED_TRACE(flags);
    const std::vector<json> got = run_lines(tmp, lines, "--stop 'the L' " + flags);
    ASSERT_EQ(got.size(), lines.size());
    auto expect = [&](size_t i, const char* text, size_t tokens, const char* reason) {
      EXPECT_EQ(got[i]["id"], lines[i]["id"]);
      EXPECT_EQ(got[i]["text"], text) << got[i].dump();
      EXPECT_EQ(got[i]["token_ids"], json(first(tokens))) << got[i].dump();
      EXPECT_EQ(got[i]["finish_reason"], reason) << got[i].dump();
    };
    expect(0, ", and the", 4, "stop");
    expect(1, "", 2, "stop");  // ", and" needs the second token
    expect(2, ", and ", 4, "stop");
    expect(3, ", and ", 4, "stop");
    expect(4, ", and the LORD, and the LORD, and the LORD", 12, "length");
    expect(5, ", and the LOR", 6, "stop");
    expect(6, ", and the", 4, "stop");
    expect(7, ", and the LORD, and the LORD, and the LORD", 12, "length");
  }
}

TEST(CliStop, PromptTakesTheStopFlag) {
  const RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " -p '" + kPrompt +
                                                 "' -n 12 --greedy --ignore-eos --stop xyz --stop ' LORD' -o -");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["text"], ", and the");
  EXPECT_EQ(j["token_ids"], json(first(4)));
  EXPECT_EQ(j["finish_reason"], "stop");
}

TEST(CliStop, BadStopValuesAreRefused) {
  TempDir tmp;
  const std::vector<json> got = run_lines(
      tmp, {{{"prompt", kPrompt}, {"stop", 5}}, {{"prompt", kPrompt}, {"stop", {"a", ""}}},
            {{"prompt", kPrompt}, {"stop", {"a", 1}}}, {{"prompt", kPrompt}, {"stop", "e"}}},
      "", 1);  // exit 1: some lines failed
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0]["error"], "field \"stop\" must be a string or an array of strings, got 5");
  EXPECT_EQ(got[1]["error"], "field \"stop\": an empty string would stop every sequence at once");
  EXPECT_EQ(got[2]["error"], "field \"stop\" must be a string or an array of strings, got [\"a\",1]");
  EXPECT_EQ(got[3]["text"], ", and th");  // the others still run
  const RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " -p x --stop ''");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--stop: an empty string would stop every sequence at once"), std::string::npos) << r.err;
}

}  // namespace
