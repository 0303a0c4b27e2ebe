// read_standard_input: `generate -i -` keeps standard input to read it twice; an over-long line is
// kept only as far as the cap (it held the whole line, twice over, read a byte at a time: a
// 300 MB line took 50 s and 650 MB), and a reader with the same cap refuses it as the same line.
// The evaluations read "-" as standard input too, with the file's results and its errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::TempDir;

// read_standard_input(cap) with `path` as standard input.
std::string read_as_stdin(const fs::path& path, size_t cap) {
  const int saved = dup(STDIN_FILENO);
  const int fd = open(path.c_str(), O_RDONLY);
  EXPECT_TRUE(saved >= 0 && fd >= 0);
  dup2(fd, STDIN_FILENO);
  close(fd);
  std::string all;
  try {
    all = flexh2o::cli::read_standard_input(cap);
  } catch (...) {
    dup2(saved, STDIN_FILENO);
    close(saved);
    throw;
  }
  dup2(saved, STDIN_FILENO);
  close(saved);
  return all;
}

// Each line's number and what for_each_jsonl makes of it: its "id", or its error.
std::vector<std::string> lines_of(std::istream& in, size_t cap) {
  std::vector<std::string> seen;
  flexh2o::cli::for_each_jsonl(
      in, [&](int64_t n, const nlohmann::ordered_json& j) { seen.push_back(std::to_string(n) + " " + j["id"].dump()); },
      [&](int64_t n, const std::string& why) { seen.push_back(std::to_string(n) + " error: " + why); }, cap);
  return seen;
}

TEST(StandardInput, AnOverLongLineIsKeptOnlyToTheCapAndRefusedAsThatLine) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  constexpr size_t kCap = 64;
  const std::string longest = R"({"id": "big", "prompt": ")" + std::string(5000, 'x') + "\"}";
  const std::string at_cap = R"({"id": "c", "prompt": ")" + std::string(kCap - 25, 'y') + "\"}";
  ASSERT_EQ(at_cap.size(), kCap);
  const std::string mixed = R"({"id": "a"})" "\n" + longest + "\n\n" + at_cap + "\n" + longest + "\r\n{\"id\": 7}";
  for (const std::string& text : {mixed, longest, std::string(), std::string("\n\n"), at_cap + "\n"}) {
    std::ofstream(in, std::ios::binary) << text;
    const std::string kept = read_as_stdin(in, kCap);
    std::ifstream file(in, std::ios::binary);
    std::istringstream piped(kept);
    EXPECT_EQ(lines_of(piped, kCap), lines_of(file, kCap)) << text.substr(0, 100);
    // No more of a line than the cap and one byte, and its '\n'.
    size_t bound = 0;
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) bound += std::min(l.size(), kCap + 1) + 1;
    EXPECT_LE(kept.size(), bound) << text.substr(0, 100);
  }
}

// flexh2o ARGS with standard input redirected from `in` (run_flexh2o gives it /dev/null).
flexh2o::test::RunResult run_with_stdin(const std::string& args, const fs::path& in) {
  return flexh2o::test::run_flexh2o(args, "sh -c 'exec \"$0\" \"$@\" <\"" + in.string() + "\"'");
}

// eval-choice --tasks - and eval-ppl - give what the file gives; an error names standard input.
TEST(StandardInput, TheEvaluationsReadDashAsStandardInput) {
  const std::string m = " -m " + flexh2o::test::model_dir("tiny-opt").string();
  const fs::path tasks = flexh2o::test::data_dir() / "tasks/bible_cloze.jsonl";
  const auto file = flexh2o::test::run_flexh2o("eval-choice" + m + " --tasks " + tasks.string());
  ASSERT_EQ(file.code, 0) << file.err;
  const auto piped = run_with_stdin("eval-choice" + m + " --tasks -", tasks);
  ASSERT_EQ(piped.code, 0) << piped.err;
  EXPECT_EQ(piped.out, file.out);
  TempDir tmp;
  const fs::path bad = tmp.path() / "bad.jsonl", text = tmp.path() / "t.txt";
  std::ofstream(bad) << R"({"context": "a", "choices": [" b", " c"], "label": 0})" "\n" R"({"context": "a"})" "\n";
  const auto refused = run_with_stdin("eval-choice" + m + " --tasks -", bad);
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("standard input:2: \"choices\" must be an array"), std::string::npos) << refused.err;

  std::ofstream(text) << "In the beginning God created the heaven and the earth.";
  const auto ppl_file = flexh2o::test::run_flexh2o("eval-ppl" + m + " " + text.string());
  ASSERT_EQ(ppl_file.code, 0) << ppl_file.err;
  const auto ppl_piped = run_with_stdin("eval-ppl" + m + " -", text);
  ASSERT_EQ(ppl_piped.code, 0) << ppl_piped.err;
  EXPECT_EQ(ppl_piped.out, ppl_file.out);
  std::ofstream(text, std::ios::trunc).flush();
  const auto empty = run_with_stdin("eval-ppl" + m + " -", text);
  EXPECT_EQ(empty.code, 1);
  EXPECT_NE(empty.err.find("standard input: no tokens to score"), std::string::npos) << empty.err;
  // A standard input that cannot be read is an error of its own, not an empty text.
  const auto closed = flexh2o::test::run_flexh2o("eval-ppl" + m + " -", "sh -c 'exec \"$0\" \"$@\" <&-'");
  EXPECT_EQ(closed.code, 1);
  EXPECT_NE(closed.err.find("cannot read standard input: Bad file descriptor"), std::string::npos) << closed.err;
  const auto dir = run_with_stdin("eval-ppl" + m + " -", tmp.path());
  EXPECT_EQ(dir.code, 1);
  EXPECT_NE(dir.err.find("cannot read standard input: Is a directory"), std::string::npos) << dir.err;
}

}  // namespace
