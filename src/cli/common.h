// Shared pieces of the flexh2o subcommands: the environment main() read, model and
// tokenizer resolution (directory, HF hub id, or preset name -> dummy weights), device
// selection, JSONL reading and writing with line numbers, progress lines and run-report helpers.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/host_memory.h"
#include "core/input_guard.h"
#include "loader/hub.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli {

// A wrong command line found after parsing (a value out of range, flags that contradict, a
// --policy file that is no policy): main() exits 2 for it, as for what the parser refuses.
struct UsageError : Error {
  using Error::Error;
};

// Runs checks of the command line's flags: the Error one throws is rethrown as a UsageError.
template <class F>
void check_flags(F&& f) {
  try {
    f();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

struct MeasuredProfile;  // offload_flags.h

struct Env {
  HubEnv hub;
  std::filesystem::path configs_dir;  // holds models/*.json presets
  bool stderr_is_tty = false;
  // The command is the whole process (MainOptions::handle_signals): it may change process-wide
  // state such as where standard output goes. False when a host program runs it in-process.
  bool owns_process = false;
  // Set by main() when SIGINT/SIGTERM/SIGHUP arrives (commands that stop cleanly poll it); null when
  // no handler is installed for this command.
  const std::atomic<bool>* stop = nullptr;
  const std::atomic<int>* stop_signal = nullptr;  // the signal that set stop (0 until then), null with it
  // The process is a rank of an mpirun job (main() saw mpirun's variables): generate runs data
  // parallel (dp_generate.h). False: MPI is never started.
  bool mpi = false;
  int mpi_ranks = 0;  // the job's ranks where the launcher says (OMPI_COMM_WORLD_SIZE, PMI_SIZE); 0: unknown
  // Where --policy auto keeps this machine measured across the runs a host program makes (a
  // Python Session, which owns it, outlives every run, and runs them one at a time under its
  // lock: it is read and written without one of its own); null: each plan measures it (a CLI
  // run plans once).
  std::optional<MeasuredProfile>* measured_profile = nullptr;
};

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // absent for presets unless --tokenizer given
  std::string source;                  // directory or "preset NAME (dummy weights)"
  std::filesystem::path dir;           // the model directory; empty for a preset
  double load_seconds = 0;
  // What a user should know about the checkpoint (unused_tensors_warning()), or empty; the
  // commands print it once (rank 0 of an mpirun job).
  std::string warning;
  const Tokenizer* tokenizer_or_null() const { return tokenizer ? &*tokenizer : nullptr; }
};

// "flexh2o: warning: ..." naming the checkpoint's tensors that no weight of the config reads
// (Model::unused_tensors()), a few of them by name; empty when there are none.
std::string unused_tensors_warning(const Model& m);

// " within this process's memory cgroups (tightest limit L; the machine has M available)" where
// the cgroups, not the machine, set `h.available()` (HostMemory::cgroup_binds); else empty.
std::string memory_cgroup_note(const HostMemory& h);

// Writes `text` to stderr in one write(2), after what std::cerr holds: an mpirun job merges its
// ranks' stderr, and a line written in pieces can be cut by another rank's line.
void write_stderr(const std::string& text);
// The parts (streamed as by <<) and a newline, in one write_stderr.
template <class... A>
void say(const A&... parts) {
  std::ostringstream os;
  (os << ... << parts) << '\n';
  write_stderr(os.str());
}

// Path of the preset config for `name` (e.g. "opt-1.3b"), if configs/models/NAME.json exists.
std::optional<std::filesystem::path> preset_path(const Env& env, const std::string& name);
// The checkpoint directory `spec` names (a directory or a hub id in the local cache); none for a
// preset. Throws Error naming what is missing.
std::optional<std::filesystem::path> model_dir(const Env& env, const std::string& spec);
// Config only (no weights): for `info` and planning.
ModelConfig resolve_config(const Env& env, const std::string& spec, std::string* source = nullptr);
// Throws Error when a workload of --prompt-len + --gen-len tokens is longer than a sequence of
// `c` (named `model`, as given) can grow: bench and plan, before any weights.
void check_workload_length(const ModelConfig& c, const std::string& model, int64_t prompt_len, int64_t gen_len);
// Loads weights (mmap or dummy) and, when present, the tokenizer (`tokenizer_dir` overrides).
// Making a preset's dummy weights draws a progress line (--progress `progress`) once it takes a
// second.
LoadedModel load_model(const Env& env, const std::string& spec, const std::string& tokenizer_dir,
                       uint64_t dummy_seed = 0, const std::string& progress = "never");

// --device cpu|cuda|auto -> "cpu" or "cuda". CUDA needs a usable GPU (probe_cuda()); without
// one, cuda throws with the reason and auto logs it and picks the CPU.
std::string select_device(const std::string& requested, std::ostream& log);
// Before the model loads (a preset's dummy weights can take a minute and 60 GB): throws what
// select_device would for --device cuda without a usable GPU or a word other than cpu/cuda/auto.
void check_device_early(const std::string& requested);
// The same for a loaded model: CUDA also needs the model to fit its kernels
// (gpu::cuda_unsupported); where it does not, cuda throws with the reason and auto picks the CPU.
std::string select_device(const std::string& requested, const Model& m, std::ostream& log);

// Calls fn(line_number, parsed_object) for each non-blank line; a line longer than
// max_line_bytes (skipped without being buffered), nested deeper than kMaxJsonDepth, not valid
// JSON or not an object calls on_error(line_number, message) instead, and the lines after it
// are still read. Returns the number of bad lines. Objects keep the line's key order (a chat's
// messages reach a template's tojson as given).
int64_t for_each_jsonl(std::istream& in, const std::function<void(int64_t, const nlohmann::ordered_json&)>& fn,
                       const std::function<void(int64_t, const std::string&)>& on_error,
                       size_t max_line_bytes = kMaxLineBytes);

// Standard input, whole, for a caller that reads it twice: its descriptor read in blocks
// (std::cin hands out a byte a call), each line as it came with a '\n' after it, but a line
// longer than max_line_bytes kept as only its first max_line_bytes + 1 bytes: a reader with the
// same cap still refuses that line, and no more of it is held. Throws Error on a read error.
std::string read_standard_input(size_t max_line_bytes = kMaxLineBytes);

// Peak resident set size of this process in bytes.
size_t peak_rss_bytes();

// Flushes std::cout and returns whether it has failed (a reader that closed its pipe: EPIPE, as
// run_main ignores SIGPIPE for generate; a full disk). On the first failure, when the results go
// to a file (`results_in_file`), says on stderr that the texts are no longer printed and, when
// the command is the process (`owns_process`: Env::owns_process), sends the rest of standard
// output to /dev/null, so the run finishes and its exit code speaks of its results; otherwise
// (after the same redirection) throws Error: the results themselves cannot be written.
bool standard_output_failed(bool results_in_file, bool owns_process);

// `j` as one JSONL line, newline included. Invalid UTF-8 in a string (an error message quoting
// a bad input line, a partial token's text) becomes U+FFFD instead of throwing.
std::string jsonl_line(const nlohmann::json& j);

// Writes `j` (pretty) to `path` durably (output_file.h: a temporary renamed into place); throws
// naming `flag` (when given) and the path if it cannot.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, const std::string& flag = "");

}  // namespace flexh2o::cli
