// Running the flexh2o program from a test: captures stdout, stderr and the exit code.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

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

}  // namespace flexh2o::test
