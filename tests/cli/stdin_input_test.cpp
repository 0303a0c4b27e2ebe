// read_standard_input: `generate -i -` keeps standard input to read it twice; an over-long line is
// kept only as far as the cap (it held the whole line, twice over, read a byte at a time: a
// 300 MB line took 50 s and 650 MB), and a reader with the same cap refuses it as the same line.
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

}  // namespace
