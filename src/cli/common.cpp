// Model/tokenizer resolution, device selection, JSONL iteration and small helpers.
#include "cli/common.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <iostream>
#include <istream>
#include <ostream>

#include "cli/output_file.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/input_guard.h"
#include "engine/generate.h"
#include "engine/memory_plan.h"
#include "gpu/cuda_device.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::cli {
namespace fs = std::filesystem;

void write_stderr(const std::string& text) {
  std::cerr.flush();
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing to tell
    at += size_t(n);
  }
}

std::optional<fs::path> preset_path(const Env& env, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return std::nullopt;
  fs::path p = env.configs_dir / "models" / (name + ".json");
  if (fs::is_regular_file(p)) return p;
  return std::nullopt;
}

namespace {

// The directory of `spec`, which is no preset. A bare name that is no directory either (no '/':
// no hub id) is most likely a preset mistyped, or one of a configs directory that was not found:
// the error lists the presets there.
fs::path local_or_hub_dir(const Env& env, const std::string& spec) {
  std::error_code ec;
  if (spec.empty() || spec.find('/') != std::string::npos || fs::exists(spec, ec))
    return resolve_model_dir(spec, env.hub);
  const fs::path models = env.configs_dir / "models";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(models, ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  FH_FAIL("no such model directory or preset: ", spec, " (",
          names.empty() ? models.string() + " holds no presets: give --configs DIR before the command"
                        : "presets in " + models.string() + ": " + known,
          "; or a hub id like ORG/NAME[@REVISION])");
}

}  // namespace

void check_workload_length(const ModelConfig& c, const std::string& model, int64_t prompt_len, int64_t gen_len) {
  if (prompt_len + gen_len > max_sequence_tokens(c))
    FH_FAIL("--prompt-len ", prompt_len, " + --gen-len ", gen_len, " is longer than a sequence of ", model,
            " can grow (", c.max_positions, " positions: ", max_sequence_tokens(c),
            " tokens, the last drawn from the last position); generate would stop each sequence there");
}

ModelConfig resolve_config(const Env& env, const std::string& spec, std::string* source) {
  if (!fs::is_directory(spec)) {
    if (auto p = preset_path(env, spec)) {
      if (source) *source = "preset " + spec;
      ModelConfig c = ModelConfig::from_file(*p);
      c.name = spec;
      return c;
    }
  }
  fs::path dir = local_or_hub_dir(env, spec);
  if (source) *source = dir.string();
  return ModelConfig::from_file(dir / "config.json");
}

std::optional<fs::path> model_dir(const Env& env, const std::string& spec) {
  if (!fs::is_directory(spec) && preset_path(env, spec)) return std::nullopt;
  return local_or_hub_dir(env, spec);
}

LoadedModel load_model(const Env& env, const std::string& spec, const std::string& tokenizer_dir,
                       uint64_t dummy_seed, const std::string& progress) {
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel lm;
  const std::optional<fs::path> dir = model_dir(env, spec);
  if (!dir) {
    ModelConfig c = resolve_config(env, spec);
    // Made in RAM whatever the placement: more than there is would end in the OOM killer.
    const uint64_t need = Model::dummy_bytes(c);
    // Beside them a run holds its buffers and the program (a 1.3B preset's smallest bench run
    // took 150 MiB more): a share of the weights and a fixed part.
    const uint64_t with_run = need + need / 32 + (uint64_t(64) << 20);
    const HostMemory host = read_host_memory();
    if (const std::optional<uint64_t> avail = host.available(); avail && with_run > *avail)
      FH_FAIL("preset ", spec, ": its dummy weights take ", human_bytes(need),
              " of host memory (they are made in RAM whatever the placement), ", human_bytes_beside(with_run, *avail),
              " with a run's buffers, and ", human_bytes_beside(*avail, with_run), " is available",
              memory_cgroup_note(host), "; use a smaller preset or a machine with more memory");
    Progress made = startup_progress("dummy weights", progress, env.stderr_is_tty);
    lm.model = std::make_unique<Model>(
        Model::dummy(c, dummy_seed, [&](uint64_t done, uint64_t total) { made.update(int64_t(done), int64_t(total)); }));
    lm.source = "preset " + spec + " (dummy weights: timings are real, text is meaningless)";
  } else {
    lm.model = std::make_unique<Model>(Model::load_dir(*dir));
    lm.source = dir->string();
    lm.dir = *dir;
  }
  if (!tokenizer_dir.empty()) {
    lm.tokenizer.emplace(Tokenizer::load(tokenizer_dir));
  } else if (dir) {
    lm.tokenizer = Tokenizer::load_if_present(*dir);
  }
  lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lm.warning = unused_tensors_warning(*lm.model);
  // A table padded past the tokenizer is common (OPT: 50272 rows, 50265 tokens; Qwen2.5: 99.8%);
  // far fewer tokens than rows is another model's tokenizer, whose text would be wrong.
  const int64_t rows = lm.model->config().vocab_size;
  if (lm.tokenizer && int64_t(lm.tokenizer->vocab_size()) * 100 < rows * 99)
    lm.warning += detail::concat("flexh2o: warning: the tokenizer has ", lm.tokenizer->vocab_size(),
                                 " tokens and the model's vocabulary ", rows, " (the ids past the tokenizer's decode "
                                 "to no text); is it this model's tokenizer (--tokenizer)?\n");
  return lm;
}

std::string memory_cgroup_note(const HostMemory& h) {
  if (!h.cgroup_binds()) return {};
  return detail::concat(" within this process's memory cgroups (tightest limit ", human_bytes(*h.cgroup_limit),
                        h.mem_available ? "; the machine has " + human_bytes(*h.mem_available) + " available" : "",
                        ")");
}

std::string unused_tensors_warning(const Model& m) {
  const std::vector<std::string>& unused = m.unused_tensors();
  if (unused.empty()) return {};
  constexpr size_t kNamed = 4;
  std::ostringstream os;
  os << "flexh2o: warning: " << unused.size() << " tensor(s) of the checkpoint are not read by its config (model_type "
     << m.config().model_type << "): ";
  for (size_t i = 0; i < std::min(unused.size(), kNamed); ++i) os << (i ? ", " : "") << unused[i];
  if (unused.size() > kNamed) os << " and " << unused.size() - kNamed << " more";
  os << "; the checkpoint may be of a variant this config does not describe, and its outputs wrong\n";
  return os.str();
}

std::string select_device(const std::string& requested, std::ostream& log) {
  if (requested == "cpu") return "cpu";
  if (requested != "cuda" && requested != "auto")
    throw UsageError(detail::concat("--device must be cpu, cuda or auto, got \"", requested, "\""));
  CudaProbe p = probe_cuda();
  const std::string why = p.available ? "" : p.reason;
  if (why.empty()) {
    if (requested == "auto") log << "flexh2o: --device auto: using the GPU (" << p.device_name << ")\n";
    return "cuda";
  }
  if (requested == "cuda") FH_FAIL("--device cuda: no usable GPU (", why, "); use --device cpu");
  log << "flexh2o: --device auto: using the CPU (no usable GPU: " << why << ")\n";
  return "cpu";
}

void check_device_early(const std::string& requested) {
  if (requested == "cpu" || requested == "auto") return;  // nothing to refuse before the model
  std::ostringstream quiet;
  (void)select_device(requested, quiet);
}

std::string select_device(const std::string& requested, const Model& m, std::ostream& log) {
  std::ostringstream quiet;  // auto's "using the GPU" is said once the model is known to fit
  const std::string device = select_device(requested, requested == "auto" ? quiet : log);
  const std::string why = device == "cuda" ? gpu::cuda_unsupported(m.config(), gpu::compute_dtype(m)) : "";
  if (why.empty()) {
    log << quiet.str();
    return device;
  }
  if (requested == "cuda") FH_FAIL("--device cuda: ", why, "; use --device cpu");
  log << "flexh2o: --device auto: using the CPU (" << why << ")\n";
  return "cpu";
}

std::string read_standard_input(size_t max_line_bytes) {
  LineReader reader(STDIN_FILENO, max_line_bytes, "standard input");
  std::string all, line;
  for (;;) {
    const LineReader::Result r = reader.next(line);
    if (r == LineReader::Result::kEnd) return all;
    if (r == LineReader::Result::kTooLong) all.append(max_line_bytes + 1, ' ');
    else all += line;
    all += '\n';
  }
}

int64_t for_each_jsonl(std::istream& in, const std::function<void(int64_t, const nlohmann::ordered_json&)>& fn,
                       const std::function<void(int64_t, const std::string&)>& on_error, size_t max_line_bytes) {
  // std::cin synced with stdio hands out one byte per call; its descriptor is read directly.
  LineReader reader = &in == &std::cin ? LineReader(STDIN_FILENO, max_line_bytes, "standard input")
                                       : LineReader(in, max_line_bytes);
  std::string line;
  int64_t bad = 0;
  for (;;) {
    const LineReader::Result r = reader.next(line);
    if (r == LineReader::Result::kEnd) break;
    const int64_t lineno = reader.line_number();
    if (r == LineReader::Result::kTooLong) {
      ++bad;
      on_error(lineno, detail::concat("line is longer than ", max_line_bytes, " bytes; it was skipped"));
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // Bounded before parsing: callers print values of the line in messages (dump() recurses).
    if (const Status st = check_json_depth(line, kMaxJsonDepth, "the line"); !st.ok()) {
      ++bad;
      on_error(lineno, "invalid JSON: " + st.message());
      continue;
    }
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      ++bad;
      on_error(lineno, "invalid JSON: " + json_error_text(e));
      continue;
    }
    if (!j.is_object()) {
      ++bad;
      on_error(lineno, "expected a JSON object");
      continue;
    }
    fn(lineno, j);
  }
  return bad;
}

bool standard_output_failed(bool results_in_file, bool owns_process) {
  errno = 0;
  std::cout.flush();
  if (std::cout.good() && !std::ferror(stdout)) return false;
  const int err = errno ? errno : EIO;
  if (owns_process) {  // said once, here; an embedding process's standard output is its own
    if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::close(null);
    }
    std::clearerr(stdout);
    std::cout.clear();
  }
  if (!results_in_file)
    FH_FAIL("cannot write standard output (", std::strerror(err), "): the results printed there stop here; give "
            "--output FILE to keep them whatever reads standard output");
  std::cerr << "flexh2o: standard output failed (" << std::strerror(err)
            << "): the texts are no longer printed there; the results still go to --output\n";
  return true;
}

size_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string jsonl_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_json_file(const fs::path& path, const nlohmann::json& j, const std::string& flag) {
  write_text_file({flag, path}, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace flexh2o::cli
