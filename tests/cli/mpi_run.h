// Running flexh2o as an mpirun job from a test: the whole job (exit code, stdout, stderr), and a
// job in the background whose rank R gets a signal once its output holds a first line (to test
// that a rank that dies or hangs ends the job). Needs FLEXH2O_MPIEXEC (mpirun's path).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_run.h"

namespace flexh2o::test {

// CI runs as root: Open MPI refuses root unless told, and the tests run more ranks than cores.
inline std::string mpirun_prefix(int ranks) {
  return std::string(FLEXH2O_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " +
         FLEXH2O_BINARY_DIR + "/flexh2o ";
}

inline RunResult mpirun(int ranks, const std::string& args) {
  TempDir tmp;
  const std::filesystem::path out = tmp.path() / "out", err = tmp.path() / "err";
  const std::string cmd = mpirun_prefix(ranks) + args + " >" + out.string() + " 2>" + err.string() + " </dev/null";
  RunResult r;
  const int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> v;
  for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

inline void write_lines(const std::filesystem::path& p, const std::vector<nlohmann::json>& lines) {
  std::ofstream f(p);
  for (const nlohmann::json& l : lines) f << l.dump() << "\n";
}

// Every line of `got` is the line of `want` at the same place (id, text, token ids, finish).
inline void expect_same_lines(const std::vector<nlohmann::json>& got, const std::vector<nlohmann::json>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]["id"], want[i]["id"]) << what << " line " << i;
    EXPECT_EQ(got[i]["token_ids"], want[i]["token_ids"]) << what << " line " << i;
    EXPECT_EQ(got[i]["text"], want[i]["text"]) << what << " line " << i;
    EXPECT_EQ(got[i]["finish_reason"], want[i]["finish_reason"]) << what << " line " << i;
    EXPECT_EQ(got[i].value("logprobs", nlohmann::json()), want[i].value("logprobs", nlohmann::json()))
        << what << " line " << i;
    EXPECT_EQ(got[i].value("top_logprobs", nlohmann::json()), want[i].value("top_logprobs", nlohmann::json()))
        << what << " line " << i;
  }
}

// The pid of the rank `rank` among mpirun `parent`'s children (OMPI_COMM_WORLD_RANK), or -1.
inline pid_t rank_pid(pid_t parent, int rank) {
  DIR* d = opendir("/proc");
  pid_t found = -1;
  for (dirent* e; d && (e = readdir(d)) && found < 0;) {
    const pid_t p = pid_t(std::atoi(e->d_name));
    if (p <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string s((std::istreambuf_iterator<char>(stat)), {});
    const size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(s.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != parent) continue;
    std::ifstream env("/proc/" + std::string(e->d_name) + "/environ");
    std::string all((std::istreambuf_iterator<char>(env)), {});
    if (all.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos) found = p;
  }
  if (d) closedir(d);
  return found;
}

struct Signalled {
  int code = -1;
  double seconds_after_signal = 0;
  std::string err;
};

// Starts `mpirun -np ranks flexh2o args` (stderr to `err`); once `out` holds a line, sends `sig`
// to rank `rank`, then waits up to 60 s for the job to end (killing it after that, so a hang
// fails the test instead of hanging it).
inline Signalled run_and_signal(int ranks, const std::string& args, const std::filesystem::path& out,
                                const std::filesystem::path& err, int rank, int sig) {
  using Clock = std::chrono::steady_clock;
  namespace fs = std::filesystem;
  const std::string cmd = "exec " + mpirun_prefix(ranks) + args + " 2>" + err.string() + " </dev/null";
  Signalled f;
  const pid_t job = fork();
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto waited = [&](int* st) { return waitpid(job, st, WNOHANG) == job; };
  int st = 0;
  bool ended = false;
  const auto start = Clock::now();
  while (!(ended = waited(&st)) && (!fs::exists(out) || fs::file_size(out) == 0) &&
         Clock::now() - start < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(ended) << "the job ended before the signal: " << read_text(err);
  const pid_t victim = ended ? -1 : rank_pid(job, rank);
  EXPECT_GT(victim, 0);
  if (victim > 0) kill(victim, sig);
  const auto signalled = Clock::now();
  while (!ended && Clock::now() - signalled < std::chrono::seconds(60)) {
    ended = waited(&st);
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  f.seconds_after_signal = std::chrono::duration<double>(Clock::now() - signalled).count();
  if (!ended) {
    kill(job, SIGKILL);
    if (victim > 0) kill(victim, SIGKILL);
    waitpid(job, &st, 0);
  }
  f.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  f.err = read_text(err);
  return f;
}

}  // namespace flexh2o::test
