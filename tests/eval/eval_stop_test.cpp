// eval-ppl and eval-choice stopped by a signal (Ctrl-C, a job's SIGTERM): the run ends within the
// step under way with the result over what it scored, marked "interrupted", and exits 128 + the
// signal, as generate does; before, the default action ended it with nothing printed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::read_text;
using flexh2o::test::TempDir;

// Runs flexh2o ARGS (split on spaces) with stdout to `out` and stderr to `err`; once `err` holds
// `ready`, sends `sig`; returns the wait status.
int run_and_signal(const std::string& args, const fs::path& out, const fs::path& err, const std::string& ready,
                   int sig) {
  fs::remove(err);  // not the last run's, which holds `ready` already
  const pid_t pid = flexh2o::test::spawn_flexh2o(args, out, err);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (read_text(err).find(ready) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ADD_FAILURE() << "flexh2o ended before it was signalled:\n" << read_text(err);
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(pid, sig);
  waitpid(pid, &status, 0);
  return status;
}

TEST(EvalStop, ChoiceEndsAtAnItemWithTheItemsScored) {
  TempDir tmp;
  const fs::path tasks = tmp.path() / "t.jsonl", out = tmp.path() / "out", err = tmp.path() / "err";
  {
    const std::string items = read_text(flexh2o::test::data_dir() / "tasks/bible_cloze.jsonl");
    std::ofstream o(tasks);
    for (int i = 0; i < 40; ++i) o << items;  // 2000 items: minutes, far more than the test waits
  }
  const int st = run_and_signal("eval-choice --model " + model_dir("tiny-opt").string() + " --tasks " +
                                    tasks.string() + " --json --device cpu --threads 1 --progress always",
                                out, err, "[eval-choice] ", SIGINT);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT) << read_text(err);
  const json j = json::parse(read_text(out));
  EXPECT_EQ(j["interrupted"], true) << j;
  EXPECT_EQ(j["items"], 2000);
  EXPECT_LT(j["count"].get<int64_t>(), 2000);
  if (j["count"] == 0)
    EXPECT_TRUE(j["acc"].is_null()) << j;
  else
    EXPECT_DOUBLE_EQ(j["acc"].get<double>(), j["correct"].get<double>() / j["count"].get<double>()) << j;
}

TEST(EvalStop, PerplexityEndsAtAStepOverTheTokensScored) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out", err = tmp.path() / "err";
  const std::string text = (model_dir("tiny-opt") / "reference/eval.txt").string();
  // Offloaded, so that a step takes long enough to be signalled amid the run (in memory 1024
  // streamed tokens take well under a second).
  const std::string disk = " --offload-dir " + (tmp.path() / "store").string();
  const std::vector<std::string> modes{"--percent 0 100 0 100 100 0 --streaming",
                                       "--percent 0 0 0 0 100 0 --streaming" + disk};
  for (const std::string& mode : modes) {
    SCOPED_TRACE(mode);
    const int st = run_and_signal("eval-ppl --model " + model_dir("tiny-opt").string() + " --max-tokens 1024 " +
                                      mode + " --json --device cpu --threads 1 --progress always " + text,
                                  out, err, "[eval-ppl] ", SIGTERM);
    ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
    EXPECT_EQ(WEXITSTATUS(st), 128 + SIGTERM) << read_text(err);
    const json j = json::parse(read_text(out));
    EXPECT_EQ(j["interrupted"], true) << j;
    EXPECT_LT(j["tokens"].get<int64_t>(), 1024) << j;
    EXPECT_GT(j["tokens"].get<int64_t>(), 0) << j;  // the step under way is finished first
    const double ppl = j["perplexity"];
    EXPECT_NEAR(std::exp(j["mean_nll"].get<double>()), ppl, 1e-9 * ppl);
  }
}

}  // namespace
