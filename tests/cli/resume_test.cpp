// Resumable batch jobs: a generate run stopped by SIGINT or SIGHUP (clean stop: exit 128 + it, report marked
// interrupted) or killed by SIGKILL, then finished with --resume, gives exactly the results of
// an uninterrupted run: the same ids, texts and tokens, no duplicate, no partial line. So does a
// run that failed midway (a disk that filled).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;

const std::string kOpt = model_dir("tiny-opt").string();
constexpr int kRequests = 48;

// Sampled (seeded) requests: a resumed run must reproduce them although its batches differ.
void write_requests(const fs::path& p) {
  const char* prompts[] = {"In the beginning God created", "And Jesus said unto them,", "The LORD is my shepherd;",
                           "Blessed are the meek:", "And God said, Let there be light"};
  std::ofstream f(p);
  for (int i = 0; i < kRequests; ++i)
    f << json{{"id", std::string("r").append(std::to_string(i))}, {"prompt", prompts[i % 5]},
              {"max_new_tokens", 8 + i % 9}}
      << "\n";
}

std::string gen_args(const fs::path& in, const fs::path& out) {
  return "generate -m " + kOpt + " -q -i " + in.string() + " -o " + out.string() + " --batch-size 2 --ignore-eos";
}

// The results file as id -> line; fails on a partial or duplicate line.
std::map<std::string, json> results_of(const fs::path& out) {
  const std::string bytes = read_text(out);
  EXPECT_TRUE(bytes.empty() || bytes.back() == '\n') << "partial last line in " << out;
  std::map<std::string, json> by_id;
  std::istringstream in(bytes);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    const std::string id = j["id"].get<std::string>();
    EXPECT_TRUE(by_id.emplace(id, j).second) << "duplicate id " << id;
  }
  return by_id;
}

pid_t spawn(const std::string& args, const fs::path& err, int ignored = 0) {
  return flexh2o::test::spawn_flexh2o(args, {}, err, ignored);
}

// Waits until `out` holds a complete line, then sends `sig` (`times` times back to back, the
// first to the last `gap_ms` apart); returns the wait status.
int interrupt_after_first_result(pid_t pid, const fs::path& out, int sig, int times = 1, double* gap_ms = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  while (read_text(out).find('\n') == std::string::npos) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ADD_FAILURE() << "flexh2o ended before its first result";
      return status;
    }
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto first = std::chrono::steady_clock::now();
  for (int i = 0; i < times; ++i) {
    // Apart by a few ms, so the first has been taken (a pending signal would absorb the next).
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    kill(pid, sig);
  }
  if (gap_ms) *gap_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first).count();
  waitpid(pid, &status, 0);
  return status;
}

class Resume : public ::testing::Test {
 protected:
  // The uninterrupted run, once per process (ctest runs each test in its own).
  static void SetUpTestSuite() {
    suite_tmp_ = new TempDir;
    const fs::path ref = suite_tmp_->path() / "ref.jsonl";
    write_requests(suite_tmp_->path() / "in.jsonl");
    RunResult r = flexh2o::test::run_flexh2o(gen_args(suite_tmp_->path() / "in.jsonl", ref));
    ASSERT_EQ(r.code, 0) << r.err;
    want_ = results_of(ref);
    ASSERT_EQ(want_.size(), size_t(kRequests));
  }
  static void TearDownTestSuite() {
    delete suite_tmp_;
    suite_tmp_ = nullptr;
  }
  void SetUp() override {
    in_ = tmp_.path() / "in.jsonl";
    write_requests(in_);
  }
  // Finishes `out` with --resume and compares it with the uninterrupted run.
  void resume_and_compare(const fs::path& out) {
    const std::string left = read_text(out);
    const size_t before = size_t(std::count(left.begin(), left.end(), '\n'));  // complete lines
    EXPECT_LT(before, size_t(kRequests)) << "the run finished before the signal: nothing to resume";
    RunResult r = flexh2o::test::run_flexh2o(gen_args(in_, out) + " --resume");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find(std::to_string(before) + " of " + std::to_string(kRequests) + " requests already in"),
              std::string::npos) << r.err;
    const auto got = results_of(out);
    ASSERT_EQ(got.size(), want_.size());
    for (const auto& [id, line] : want_) {
      ASSERT_TRUE(got.count(id)) << id;
      EXPECT_EQ(got.at(id)["token_ids"], line["token_ids"]) << id;
      EXPECT_EQ(got.at(id)["text"], line["text"]) << id;
    }
  }
  static inline TempDir* suite_tmp_ = nullptr;
  static inline std::map<std::string, json> want_;
  TempDir tmp_;
  fs::path in_;
};

// SIGINT (Ctrl-C) and SIGHUP (the terminal closed: an ssh session without nohup) stop alike.
TEST_F(Resume, SigintOrSighupKeepsFinishedResultsAndResumeCompletesTheRun) {
  for (const int sig : {SIGINT, SIGHUP}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGHUP");
    const fs::path out = tmp_.path() / ("out" + std::to_string(sig) + ".jsonl"), rep = tmp_.path() / "run.json",
                   err = tmp_.path() / "err";
    const pid_t pid = spawn(gen_args(in_, out) + " --report " + rep.string(), err);
    const int st = interrupt_after_first_result(pid, out, sig);
    ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
    EXPECT_EQ(WEXITSTATUS(st), 128 + sig) << read_text(err);
    EXPECT_NE(read_text(err).find("rerun with --resume"), std::string::npos) << read_text(err);
    const json report = json::parse(read_text(rep));
    EXPECT_TRUE(report["interrupted"].get<bool>());
    EXPECT_EQ(report["finished_requests"].get<size_t>(), results_of(out).size());
    int64_t kept = 0;  // the tokens of the results written, not those of the requests dropped
    for (const auto& [id, line] : results_of(out)) kept += int64_t(line["token_ids"].size());
    EXPECT_EQ(report["kept_tokens"].get<int64_t>(), kept);
    EXPECT_GE(report["generated_tokens"].get<int64_t>(), kept);
    resume_and_compare(out);
  }
}

// Under nohup (SIGHUP ignored) a closed terminal does not stop the run: it finishes, exit 0.
TEST_F(Resume, UnderNohupSighupIsIgnored) {
  const fs::path out = tmp_.path() / "out.jsonl", err = tmp_.path() / "err";
  const int st = interrupt_after_first_result(spawn(gen_args(in_, out), err, SIGHUP), out, SIGHUP);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 0) << read_text(err);
  EXPECT_EQ(results_of(out).size(), size_t(kRequests));
}

// One signal delivered twice at once (timeout(1) signals the process and then its group) is one
// stop: the run ends in order, with its report, not by the signal's default action.
TEST_F(Resume, ASignalDeliveredTwiceAtOnceStopsInOrder) {
  const fs::path out = tmp_.path() / "out.jsonl", rep = tmp_.path() / "run.json", err = tmp_.path() / "err";
  double gap_ms = 0;
  const int st = interrupt_after_first_result(spawn(gen_args(in_, out) + " --report " + rep.string(), err), out,
                                              SIGTERM, 2, &gap_ms);
  if (gap_ms > 80) GTEST_SKIP() << "the two signals went " << gap_ms << " ms apart on this loaded machine";
  ASSERT_TRUE(WIFEXITED(st)) << "ended by the signal itself: " << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 143) << read_text(err);
  EXPECT_TRUE(json::parse(read_text(rep))["interrupted"].get<bool>());
  resume_and_compare(out);
}

// The output's own disk fills mid-run (a file-size limit of 2 or 4 KiB, sh's or bash's blocks, of
// the ~7.4 KB the results take): the write's error ends the run, nothing is written after it (a
// retried line could land twice), the run says how many results the file holds and that --resume
// finishes it, the report counts those (not the results the engine finished, nor the torn one),
// and --resume (cutting the torn last line) completes the run.
TEST_F(Resume, AnOutputThatFillsMidRunFailsAndResumeFinishes) {
  const fs::path out = tmp_.path() / "out.jsonl", rep = tmp_.path() / "run.json";
  RunResult r = flexh2o::test::run_flexh2o(gen_args(in_, out) + " --report " + rep.string(), "ulimit -f 4;");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot write --output"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("finished before the error below"), std::string::npos) << r.err;
  const std::string left = read_text(out);
  const size_t lines = size_t(std::count(left.begin(), left.end(), '\n'));
  EXPECT_NE(r.err.find("holds " + std::to_string(lines) + " of the " + std::to_string(kRequests) +
                       " requests' results"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("with --resume finishes the run"), std::string::npos) << r.err;
  const json report = json::parse(read_text(rep));
  EXPECT_EQ(report["finished_requests"].get<size_t>(), lines);
  int64_t kept = 0;
  for (size_t at = 0, nl; (nl = left.find('\n', at)) != std::string::npos; at = nl + 1)
    kept += int64_t(json::parse(left.substr(at, nl - at))["token_ids"].size());
  EXPECT_EQ(report["kept_tokens"].get<int64_t>(), kept);
  resume_and_compare(out);
}

// --resume of a finished run has nothing to run: it places no weight (the offload directory stays
// empty), keeps the output as it was and still writes the report; so does an input whose every
// line fails (their error lines written, exit 1).
TEST_F(Resume, NothingToRunPlacesNoWeights) {
  const fs::path out = tmp_.path() / "out.jsonl", rep = tmp_.path() / "run.json", store = tmp_.path() / "store";
  fs::copy_file(suite_tmp_->path() / "ref.jsonl", out);
  const std::string before = read_text(out);
  fs::create_directory(store);
  const std::string offload = " --percent 0 0 100 0 100 0 --compress-weight --offload-dir " + store.string();
  RunResult r =
      flexh2o::test::run_flexh2o(gen_args(in_, out) + " --resume --report " + rep.string() + offload);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("no request to run; the weights are not placed"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(store));
  EXPECT_EQ(read_text(out), before);
  json report = json::parse(read_text(rep));
  EXPECT_EQ(report["resumed_requests"], kRequests);
  EXPECT_EQ(report["finished_requests"], 0);
  EXPECT_EQ(report["generated_tokens"], 0);
  EXPECT_EQ(report["compress_weight"], true);  // what was asked, though nothing ran
  const fs::path bad = tmp_.path() / "bad.jsonl", bad_out = tmp_.path() / "bad_out.jsonl";
  std::ofstream(bad) << R"({"prompt_ids": [2, 999999]})" "\n" R"({"prompt": 5})" "\n";
  r = flexh2o::test::run_flexh2o(gen_args(bad, bad_out) + " --report " + rep.string() + offload);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("no request to run; the weights are not placed"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(store));
  const auto lines = flexh2o::test::read_jsonl(bad_out);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].contains("error") && lines[1].contains("error"));
  report = json::parse(read_text(rep));
  EXPECT_EQ(report["failed_requests"], 2);
}

// A file-size limit below a page (sh's ulimit -f 1: 512 bytes) makes the offload directory's test
// write short: the error says so, instead of "not writable" with a stale errno.
TEST(ResumePlacement, AShortTestWriteInTheOffloadDirectoryIsNamed) {
  TempDir tmp;
  RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --percent 0 0 0 0 100 0 --offload-dir " +
                                               (tmp.path() / "s").string(),
                                           "ulimit -f 1;");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("-byte test write: is its disk full, or a file-size limit (ulimit -f) set?"), std::string::npos)
      << r.err;
}

// A stop signal while another run holds the offload directory's lock (building a large store
// takes minutes): the wait ends at once, exit 130, the output untouched.
TEST(ResumePlacement, AStopWhileWaitingForAnotherRunsLockEndsTheWait) {
  TempDir tmp;
  const fs::path store = tmp.path() / "s", out = tmp.path() / "out.jsonl", err = tmp.path() / "err";
  fs::create_directories(store);
  const int lock = open((store / "flexh2o.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);  // another run's lock, held until the end of the test
  const pid_t pid = spawn("generate -m " + kOpt + " --prompt hi -n 2 -o " + out.string() +
                              " --percent 0 0 0 0 100 0 --offload-dir " + store.string(),
                          err);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_text(err).find("waiting for another run") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto sent = std::chrono::steady_clock::now();
  kill(pid, SIGINT);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0 && std::chrono::steady_clock::now() - sent < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  close(lock);  // a run that still waits gets the lock now, and ends
  if (waited >= 20) waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  EXPECT_EQ(WEXITSTATUS(st), 130) << read_text(err);
  EXPECT_NE(read_text(err).find("stopped while waiting for another run's lock"), std::string::npos) << read_text(err);
  // The wait names whose lock it is (this test's, taken above).
  EXPECT_NE(read_text(err).find("waiting for another run (pid " + std::to_string(getpid()) + ") that holds"),
            std::string::npos)
      << read_text(err);
  EXPECT_LT(waited, 20.0) << "the stop waited for the lock";
  EXPECT_FALSE(fs::exists(out));
}

// A stop signal while the weights are placed (a large store takes minutes to write): exit 130,
// and --report says that nothing ran and why, for a harness that always reads it.
TEST(ResumePlacement, AStopWhilePlacingTheWeightsStillWritesTheReport) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", rep = tmp.path() / "run.json",
                 err = tmp.path() / "err";
  std::ofstream(in) << "{\"prompt_ids\": [2, 100, 200]}\n{\"prompt_ids\": [2, 300]}\n";  // a preset: no tokenizer
  // opt-125m's dummy weights, all on disk: some 250 MB to write after the "loaded" line.
  const pid_t pid = spawn("generate -m opt-125m -q -i " + in.string() + " -o " + out.string() + " --report " +
                              rep.string() + " --kv-dtype f32 --percent 0 0 100 0 100 0 --offload-dir " +
                              (tmp.path() / "s").string(),
                          err);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (read_text(err).find(" s\n") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "flexh2o: model opt-125m (...), loaded in T s"
  // The two input lines are read next (a stop there ends the run before the placement): leave
  // them time, as the placement takes seconds.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st)) << read_text(err);
  if (read_text(err).find("weights homed") != std::string::npos)  // printed once the placement is done
    GTEST_SKIP() << "the placement ended before the signal: " << read_text(err);
  if (read_text(err).find("stopped while reading the input") != std::string::npos)
    GTEST_SKIP() << "the signal came before the placement: " << read_text(err);
  ASSERT_EQ(WEXITSTATUS(st), 130) << read_text(err);
  ASSERT_NE(read_text(err).find("stopped while placing the weights"), std::string::npos) << read_text(err);
  const json report = json::parse(read_text(rep));
  EXPECT_TRUE(report["interrupted"].get<bool>());
  EXPECT_EQ(report["kv_dtype"], "F32");  // the flags', though no engine was made
  EXPECT_EQ(report["finished_requests"], 0);
  EXPECT_EQ(report["requests"], 2);
  EXPECT_NE(report["interrupted_while"].get<std::string>().find("stopped while placing the weights"), std::string::npos)
      << report.dump();
}

TEST_F(Resume, SigkillThenResumeCompletesTheRun) {
  const fs::path out = tmp_.path() / "out.jsonl", err = tmp_.path() / "err";
  const int st = interrupt_after_first_result(spawn(gen_args(in_, out), err), out, SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(st));
  resume_and_compare(out);
}

TEST_F(Resume, PartialLastLineIsCutAndForeignFilesAreRefused) {
  // What a kill in the middle of a write leaves: complete lines, then part of one.
  const fs::path out = tmp_.path() / "out.jsonl";
  {
    std::ofstream f(out, std::ios::binary);
    for (const char* id : {"r0", "r5", "r1"}) f << want_.at(id).dump() << "\n";
    f << want_.at("r2").dump().substr(0, 20);
  }
  resume_and_compare(out);

  const fs::path foreign = tmp_.path() / "notes.txt";
  std::ofstream(foreign) << "my notes\n";
  RunResult r = flexh2o::test::run_flexh2o(gen_args(in_, foreign) + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("notes.txt:1 is not a result line"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(foreign), "my notes\n");
  const fs::path other = tmp_.path() / "other.jsonl";
  std::ofstream(other) << json{{"id", "x9"}, {"text", ""}, {"token_ids", json::array()}}.dump() << "\n";
  r = flexh2o::test::run_flexh2o(gen_args(in_, other) + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("has id \"x9\", which is not in"), std::string::npos) << r.err;
  // A line damaged between results (a disk error, an editor) is named as such, not as a file
  // flexh2o did not write; deleting it lets --resume finish.
  const fs::path damaged = tmp_.path() / "damaged.jsonl";
  std::ofstream(damaged) << want_.at("r0").dump() << "\n" << want_.at("r1").dump().substr(0, 20) << "\n"
                         << want_.at("r2").dump() << "\n";
  r = flexh2o::test::run_flexh2o(gen_args(in_, damaged) + " --resume");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("damaged.jsonl:2 is not valid JSON, after result lines: a damaged line"), std::string::npos)
      << r.err;
  std::ofstream(damaged) << want_.at("r0").dump() << "\n" << want_.at("r2").dump() << "\n";
  resume_and_compare(damaged);
}

// --resume with another model or other flags than the run that wrote --output is refused, naming
// each difference: it finished the run with the new settings, and the file mixed both runs'
// results. The identity lives in an extended attribute of the file (user.flexh2o.run).
TEST_F(Resume, AnotherModelOrOtherSettingsAreRefused) {
  const fs::path out = tmp_.path() / "out.jsonl", first = tmp_.path() / "first.jsonl";
  {
    std::ifstream in(in_);
    std::ofstream f(first);
    std::string line;
    for (int i = 0; i < 5 && std::getline(in, line); ++i) f << line << "\n";
  }
  const std::string tail = " -q -o " + out.string() + " --batch-size 2 --ignore-eos";
  ASSERT_EQ(flexh2o::test::run_flexh2o("generate -m " + kOpt + " -i " + first.string() + tail).code, 0);
  if (::getxattr(out.c_str(), "user.flexh2o.run", nullptr, 0) < 0)
    GTEST_SKIP() << "no user extended attributes on this filesystem: " << std::strerror(errno);
  struct Case {
    std::string flags, says;
  };
  const std::string llama = model_dir("tiny-llama").string();
  for (const Case& c : {Case{"-m " + kOpt + " --temperature 0.5", "temperature 1 there, 0.5 in this run"},
                        Case{"-m " + llama, "model tiny-opt (opt, "},
                        // --greedy overrides the lines' own temperatures, which --temperature 0 does not
                        Case{"-m " + kOpt + " --greedy", "greedy false there, true in this run"},
                        Case{"-m " + kOpt + " --kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1",
                             "kv_policy full"}}) {
    const RunResult r = flexh2o::test::run_flexh2o("generate " + c.flags + " -i " + in_.string() + tail + " --resume");
    EXPECT_EQ(r.code, 1) << c.flags << "\n" << r.err;
    EXPECT_NE(r.err.find("holds the results of a run with other settings (" ), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(results_of(out).size(), 5u) << c.flags;
  }
  resume_and_compare(out);  // the same model and flags finish it
}

// Ids key --resume, so a file whose ids repeat (explicitly, or an explicit id equal to another
// line's index), or whose id is neither a string nor a number, is refused before any work and
// before --output is touched, naming the lines.
TEST(ResumeIds, RepeatedIdsAreRefusedBeforeTheRun) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out.jsonl";
  struct Case {
    std::string lines, says;
  };
  for (const Case& c : {Case{R"({"id": "a", "prompt": "x"})" "\n" R"({"id": "a", "prompt": "y"})" "\n",
                             ":2 repeats id \"a\" of line 1"},
                        Case{R"({"prompt": "x"})" "\n\n" R"({"id": 0, "prompt": "y"})" "\n",
                             ":3 repeats id 0 of line 1"},
                        // A Batch line refused for a field keeps its custom_id.
                        Case{R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": )"
                             R"({"prompt": "x", "stream": true}})" "\n"
                             R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": )"
                             R"({"prompt": "y"}})" "\n",
                             ":2 repeats custom_id \"a\" of line 1"},
                        // A line read whole but wrong (a misspelt field) keeps the id it gives.
                        Case{R"({"id": 0, "prompt": "x", "temprature": 1})" "\n" R"({"id": 0, "prompt": "y"})" "\n",
                             ":2 repeats id 0 of line 1"},
                        // A line that cannot be read has its index as its id: the message says so.
                        Case{R"({"id": "big", "prompt": "x")" "\n" R"({"id": 0, "prompt": "y"})" "\n",
                             ":2 repeats id 0 of line 1; ids must be unique, as --resume finds results by them (a line "
                             "without \"id\" has its 0-based index as its id). Line 1 could not be read (invalid JSON"},
                        // Ids --resume could not find again: refused before the run too.
                        Case{R"({"id": {"x": 1}, "prompt": "x"})" "\n", ":1: \"id\" must be a string or a number"},
                        Case{R"({"id": 1, "prompt": "x"})" "\n" R"({"id": null, "prompt": "y"})" "\n",
                             ":2: \"id\" must be a string or a number, as --resume finds results by it; got null"},
                        Case{R"({"id": true, "prompt": "x"})" "\n", "got boolean"}}) {
    const fs::path in = tmp.path() / "in.jsonl";
    std::ofstream(in) << c.lines;
    RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " -q -i " + in.string() + " -o " + out.string());
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    if (c.says.find("repeats") != std::string::npos) {
      EXPECT_NE(r.err.find("ids must be unique"), std::string::npos) << r.err;
      // Only a line that could not be read is said to have its index as its id.
      const bool unread = c.says.find("could not be read") != std::string::npos;
      EXPECT_EQ(r.err.find("could not be read") != std::string::npos, unread) << r.err;
    }
    EXPECT_FALSE(fs::exists(out) && fs::file_size(out) > 0);
  }
  // An id and a string of its digits are two ids.
  const fs::path in = tmp.path() / "ok.jsonl";
  std::ofstream(in) << R"({"id": 1, "prompt": "x"})" "\n" R"({"id": "1", "prompt": "y"})" "\n";
  RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " -q -n 2 -i " + in.string() + " -o " + out.string());
  EXPECT_EQ(r.code, 0) << r.err;
}

// An OpenAI Batch file killed midway and resumed: the lines keyed on custom_id match an
// uninterrupted run (choices and usage; the batch_req_/request ids are fresh on every run).
TEST(ResumeBatch, SigkillThenResumeCompletesABatchFile) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", ref = tmp.path() / "ref.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < kRequests; ++i)
      f << json{{"custom_id", "b" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"},
                {"body", {{"model", "m"}, {"prompt", "And God said"}, {"max_tokens", 6 + i % 5}, {"n", 1 + i % 2}}}}
        << "\n";
  }
  auto by_custom_id = [](const fs::path& p) {
    const std::string bytes = read_text(p);
    EXPECT_TRUE(bytes.empty() || bytes.back() == '\n') << "partial last line in " << p;
    std::map<std::string, json> m;
    std::istringstream ss(bytes);
    for (std::string line; std::getline(ss, line);) {
      json j = json::parse(line);
      EXPECT_TRUE(m.emplace(j["custom_id"].get<std::string>(), j).second) << "duplicate " << line;
    }
    return m;
  };
  RunResult r = flexh2o::test::run_flexh2o(gen_args(in, ref));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto want = by_custom_id(ref);
  ASSERT_EQ(want.size(), size_t(kRequests));
  const int st = interrupt_after_first_result(spawn(gen_args(in, out), tmp.path() / "err"), out, SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(st));
  const size_t before = by_custom_id(out).size();
  EXPECT_LT(before, size_t(kRequests)) << "the run finished before the signal: nothing to resume";
  r = flexh2o::test::run_flexh2o(gen_args(in, out) + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(std::to_string(before) + " of " + std::to_string(kRequests) + " requests already in"),
            std::string::npos) << r.err;
  const auto got = by_custom_id(out);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, line] : want) {
    ASSERT_TRUE(got.count(id)) << id;
    const json &g = got.at(id)["response"]["body"], &w = line["response"]["body"];
    EXPECT_EQ(g["choices"], w["choices"]) << id;
    EXPECT_EQ(g["usage"], w["usage"]) << id;
    EXPECT_NE(got.at(id)["id"], line["id"]) << id;
  }
}

// A disk that fills mid-run (here: a file-size limit, so that the long prompts' KV files fail
// after the short ones' batches finished): the finished results stay, the error says how far
// the run got and that --resume finishes it, the report records the error, and --resume gives
// the results of an uninterrupted run.
TEST(ResumeAfterFailure, ADiskThatFillsMidRunKeepsTheResultsAndResumeFinishes) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", ref = tmp.path() / "ref.jsonl", out = tmp.path() / "out.jsonl",
                 rep = tmp.path() / "run.json", kv = tmp.path() / "kv";
  fs::create_directory(kv);
  {
    std::ofstream f(in);
    for (int i = 0; i < 12; ++i)  // KV files of 2 x 2 x 4 heads x 12 slots x 128 B: 24 KiB
      f << json{{"id", "s" + std::to_string(i)}, {"prompt", "The LORD is my shepherd;"}, {"max_new_tokens", 4}} << "\n";
    std::string long_prompt;  // ~900 tokens: KV files of 1.8 MB
    for (int i = 0; i < 100; ++i) long_prompt += "And God said, Let there be light. ";
    for (int i = 0; i < 4; ++i)
      f << json{{"id", "l" + std::to_string(i)}, {"prompt", long_prompt}, {"max_new_tokens", 4}} << "\n";
  }
  const std::string args = "generate -m " + kOpt + " -q -i " + in.string() + " --percent 100 0 0 0 100 0 " +
                           "--gpu-batch-size 2 --ignore-eos --offload-dir " + kv.string() + " -o ";
  RunResult r = flexh2o::test::run_flexh2o(args + ref.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto want = results_of(ref);
  ASSERT_EQ(want.size(), 16u);
  // 1000 blocks: 512 000 bytes (sh) or 1 024 000 (bash); flexh2o ignores SIGXFSZ, so EFBIG.
  r = flexh2o::test::run_flexh2o(args + out.string() + " --report " + rep.string(), "ulimit -f 1000;");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("12 of 16 requests finished before the error below; their results are in " + out.string() +
                       ", and the same command with --resume finishes the run"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_EQ(results_of(out).size(), 12u);
  const json report = json::parse(read_text(rep));
  EXPECT_NE(report["error"].get<std::string>().find("File too large"), std::string::npos) << report.dump();
  EXPECT_EQ(report["finished_requests"].get<int>(), 12);
  EXPECT_EQ(report["generated_tokens"].get<int>(), 12 * 4);  // the steps before the failure are counted
  EXPECT_FALSE(report["interrupted"].get<bool>());
  EXPECT_EQ(report["batches"].get<int>(), 7);  // six of two short requests, and the one that failed
  // Run with --overwrite, the hint names what replaces it.
  r = flexh2o::test::run_flexh2o(args + out.string() + " --overwrite", "ulimit -f 1000;");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("the same command with --resume in place of --overwrite finishes the run"), std::string::npos)
      << r.err;
  EXPECT_EQ(results_of(out).size(), 12u);
  r = flexh2o::test::run_flexh2o(args + out.string() + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("12 of 16 requests already in"), std::string::npos) << r.err;
  const auto got = results_of(out);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, line] : want) {
    ASSERT_TRUE(got.count(id)) << id;
    EXPECT_EQ(got.at(id)["token_ids"], line["token_ids"]) << id;
  }
}

}  // namespace
