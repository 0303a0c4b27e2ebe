// flexh2o command-line entry point: reads the environment once and runs the command line
// (cli/app.h: every subcommand, exit codes 0 ok, 1 error or bad input, 2 usage error,
// 128 + signal after SIGINT/SIGTERM/SIGHUP stopped a command that stops cleanly).
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "cli/app.h"

#ifndef FLEXH2O_SOURCE_CONFIGS
#define FLEXH2O_SOURCE_CONFIGS ""
#endif

namespace {
namespace fs = std::filesystem;

std::optional<fs::path> env_path(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return fs::path(v);
}

// configs/ next to the installed binary (share/flexh2o/configs) or the source tree's.
fs::path default_configs_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p : {exe.parent_path() / "../share/flexh2o/configs", exe.parent_path() / "../configs"})
      if (fs::is_directory(p / "models")) return fs::weakly_canonical(p);
  }
  return FLEXH2O_SOURCE_CONFIGS;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write then fails with EFBIG, which the run reports and
  // recovers from like a full disk; the default action would kill it without a report.
  ::signal(SIGXFSZ, SIG_IGN);
  flexh2o::cli::MainOptions o;
  o.hub.hf_hub_cache = env_path("HF_HUB_CACHE");
  o.hub.hf_home = env_path("HF_HOME");
  o.hub.home = env_path("HOME");
  o.default_configs_dir = default_configs_dir();
  o.stderr_is_tty = isatty(STDERR_FILENO) != 0;
  o.mpi = env_path("OMPI_COMM_WORLD_SIZE") || env_path("PMIX_RANK") || env_path("PMI_SIZE");
  for (const char* size : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(size); v && o.mpi_ranks == 0) o.mpi_ranks = std::atoi(v);
  return flexh2o::cli::run_main(argc, argv, o);
}
