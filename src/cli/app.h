// The flexh2o command line as a library function: the flexh2o binary and the Python front end
// (`python -m flexh2o`) both run every subcommand through run_main(), so flags, messages and
// exit codes are the same. The caller reads the process environment and passes it in.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "loader/hub.h"

namespace flexh2o::cli {

struct MainOptions {
  HubEnv hub;                                 // $HF_HUB_CACHE, $HF_HOME, $HOME, read by the caller
  std::filesystem::path default_configs_dir;  // presets when --configs is not given
  bool stderr_is_tty = false;
  // generate / tokenize / detokenize stop cleanly on SIGINT/SIGTERM/SIGHUP (StopSignals, signals.h:
  // the signals are taken over for the rest of the process). False: those signals keep
  // whatever disposition the process has.
  bool handle_signals = true;
  // Started by mpirun (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE is set): Env::mpi; the
  // job's ranks where OMPI_COMM_WORLD_SIZE or PMI_SIZE says, else 0: Env::mpi_ranks.
  bool mpi = false;
  int mpi_ranks = 0;
  // Renders an OpenAI chat body with the chat template found in `template_dir` (the
  // --tokenizer directory, else the model directory; empty for a preset) into prompt text.
  // Installed as GenerateArgs::render_chat; null in the flexh2o binary. Called on the thread
  // that runs run_main.
  std::function<std::string(const std::filesystem::path& template_dir, const nlohmann::ordered_json& body)> render_chat;
};

// Parses argv (argv[0] is the program name) and runs the subcommand. Returns the process exit
// code: 0 ok, 1 error or bad input lines, 2 usage error, 128 + signal after SIGINT/SIGTERM/SIGHUP
// stopped a command that stops cleanly. Messages go to std::cout / std::cerr as the binary's.
int run_main(int argc, const char* const* argv, const MainOptions& opts);

// The release ("0.1.0": CMake's project version, the one the Python package reports too).
const char* version();
// What --version prints: the release, the build type, the CPU kernel variant this machine runs
// and the CUDA toolkit compiled in (or that none is). Lines, no trailing newline.
std::string version_text();

// The sentence printed for std::bad_alloc while running `command` (the Python front end raises it).
std::string out_of_memory_message(const std::string& command);

}  // namespace flexh2o::cli
