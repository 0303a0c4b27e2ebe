// Running the flexh2o program from a test: captures stdout, stderr and the exit code; or starts
// it in the background (spawn_flexh2o) for a test that signals it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "engine/test_util.h"

namespace flexh2o::test {

struct RunResult {
  int code = -1;
  std::string out, err;
};

// Runs `env flexh2o args` with no standard input.
inline RunResult run_flexh2o(const std::string& args, const std::string& env = "") {
  TempDir tmp;
  const std::filesystem::path out = tmp.path() / "out", err = tmp.path() / "err";
  std::string cmd = env + " " + std::string(FLEXH2O_BINARY_DIR) + "/flexh2o " + args + " >" + out.string() + " 2>" +
                    err.string() + " </dev/null";
  RunResult r;
  int st = std::system(cmd.c_str());
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// Starts flexh2o ARGS (split on spaces) with stdin on /dev/null, stdout to `out` (empty:
// /dev/null), stderr to `err`, and the stop signals at their default (a suite run in the
// background or under nohup would pass its ignored ones on), but `ignored` (0: none) ignored, as
// nohup leaves SIGHUP. Returns its pid, for waitpid.
inline pid_t spawn_flexh2o(const std::string& args, const std::filesystem::path& out,
                           const std::filesystem::path& err, int ignored = 0) {
  std::vector<std::string> words{std::string(FLEXH2O_BINARY_DIR) + "/flexh2o"};
  std::istringstream ss(args);
  for (std::string w; ss >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_RDWR);
    const int o = out.empty() ? null : open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(null, 0);
    dup2(o, 1);
    dup2(e, 2);
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, sig == ignored ? SIG_IGN : SIG_DFL);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace flexh2o::test
