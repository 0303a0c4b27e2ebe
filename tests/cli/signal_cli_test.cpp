// Stop signals at the edges of a run: before it began (reading a large input; --overwrite must
// not have emptied --output), a second signal (the process ends at once and says so), and SIGINT
// that came ignored (a script's background job) still stopping a run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::read_text;
using flexh2o::test::spawn_flexh2o;
using flexh2o::test::TempDir;
using nlohmann::json;

// Waits (up to 120 s) until `err` holds `said`.
void wait_for(const fs::path& err, const std::string& said) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (read_text(err).find(said) == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A stop before the run began (while a large input is read and tokenized: a million lines take
// seconds; or while the model loads), under --overwrite: nothing ran, so the results --output
// held stay, and the run says where it stopped.
TEST(CliSignal, AStopBeforeTheRunLeavesOverwrittenResultsAsTheyWere) {
  TempDir tmp;
  const fs::path small = tmp.path() / "small.jsonl", in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl",
                 err = tmp.path() / "err";
  std::ofstream(small) << "{\"id\": 0, \"prompt\": \"In the beginning\"}\n";
  const std::string args = "generate -m " + model_dir("tiny-opt").string() + " -q -n 1 -o " + out.string() + " -i ";
  ASSERT_EQ(flexh2o::test::run_flexh2o(args + small.string()).code, 0);
  const std::string before = read_text(out);
  ASSERT_FALSE(before.empty());
  {
    std::ofstream f(in);
    for (int i = 0; i < 300000; ++i)
      f << "{\"id\": " << i << ", \"prompt\": \"In the beginning God created the heaven and the earth.\"}\n";
  }
  const pid_t pid = spawn_flexh2o(args + in.string() + " --overwrite", {}, err);
  wait_for(err, "loaded in");  // the model's line: the input is read next
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  if (WEXITSTATUS(st) == 0) GTEST_SKIP() << "the run ended before the signal: " << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 143) << read_text(err);
  const std::string said = read_text(err);
  EXPECT_TRUE(said.find("stopped while reading the input (line ") != std::string::npos ||
              said.find("stopped before the run began; --output is as it was") != std::string::npos)
      << said;
  EXPECT_EQ(read_text(out), before) << "a stopped --overwrite emptied the results";
}

// A second signal 300 ms after the first, both while opt-1.3b's dummy weights are made (seconds,
// which nothing stops): the process ends by the signal at once, having said so and what stays.
TEST(CliSignal, ASecondSignalEndsTheProcessAndSaysSo) {
  TempDir tmp;
  const fs::path err = tmp.path() / "err";
  const pid_t pid = spawn_flexh2o("bench -m opt-1.3b --prompt-len 4 --gen-len 2 --device cpu", {}, err);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the signals are taken from the start
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFEXITED(st)) GTEST_SKIP() << "the load ended before the second signal: " << read_text(err);
  ASSERT_TRUE(WIFSIGNALED(st)) << read_text(err);
  EXPECT_EQ(WTERMSIG(st), SIGTERM);
  EXPECT_NE(read_text(err).find("a second stop signal: ending at once, without a report; the results written so "
                                "far stay (generate --resume finishes the run)"),
            std::string::npos)
      << read_text(err);
}

// SIGINT stops a run even where it came ignored (a non-interactive shell's `cmd &`), so that
// `kill -INT` works as `serve` makes it work (SIGHUP under nohup stays ignored: resume_test).
TEST(CliSignal, AnInheritedIgnoredSigintStillStops) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", err = tmp.path() / "err";
  constexpr int kLines = 40;  // 20 batches of 300 tokens: some 3 s after the first result
  {
    std::ofstream f(in);
    for (int i = 0; i < kLines; ++i) f << "{\"id\": " << i << ", \"prompt_ids\": [2, " << 100 + i << "]}\n";
  }
  const std::string args = "generate -m " + model_dir("tiny-opt").string() + " -q -n 300 --ignore-eos -b 2 -i " +
                           in.string() + " -o " + out.string();
  auto lines = [&] {
    const std::string text = read_text(out);
    return std::count(text.begin(), text.end(), '\n');
  };
  const pid_t pid = spawn_flexh2o(args, {}, err, SIGINT);  // SIGINT comes ignored
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines() == 0 && std::chrono::steady_clock::now() < deadline)  // under way
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 130) << read_text(err);
  EXPECT_LT(lines(), kLines);
}

}  // namespace
