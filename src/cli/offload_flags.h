// Offloading flags shared by the subcommands that run a model (FlexGen-compatible spellings:
// --percent, --gpu-batch-size, --num-gpu-batches, --cpu-cache-compute, --overlap,
// --offload-dir) plus tier budgets, a JSON policy file and the run-report section.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cpu_device.h"
#include "engine/offload_engine.h"
#include "planner/hardware.h"
#include "planner/planner.h"
#include "policies/kv_config.h"

namespace flexh2o::cli {

struct OffloadArgs {
  std::vector<double> percent;  // 6 numbers
  int64_t gpu_batch_size = 0, num_gpu_batches = 0;
  bool cpu_cache_compute = false, verify_store = true;
  // --overlap / --sep-layer / --pin-weight as given; empty when not given: a --policy file's
  // value then stands, else true (flag_bool_or).
  std::string overlap, sep_layer, pin_weight;
  std::string policy_file, offload_dir, gpu_mem, cpu_mem, disk_mem, io = "auto";
  std::string hardware;  // profile for --policy auto (name in configs/hardware or a path)
  std::string trace;     // --trace FILE: the schedule's steps as Chrome trace-event JSON
  // FlexGen's compression flags (Policy::compress_*); they apply in memory too, so they do not
  // ask for the offloading engine by themselves.
  bool compress_weight = false, compress_cache = false;
  bool allow_compress = false, no_compress = false;  // --policy auto: see search_compression()
  // Not a flag: the command's --progress, which placing the weights reports through (a
  // "[place weights]" line once it takes more than a second). "never" where no line belongs
  // (the workers of an mpirun job).
  std::string progress = "never";
};

void add_offload_flags(CLI::App* app, OffloadArgs& a);
// The value of a true/false flag (--overlap, --sep-layer, --pin-weight): true|1|on|yes or
// false|0|off|no; throws naming `flag` on anything else. add_offload_flags checks these words
// at parse time too (CLI11: flag_bool_check()), so a bad value fails in memory as well.
bool parse_flag_bool(const std::string& s, const char* flag);
// parse_flag_bool(s) where the flag was given (s not empty), else `otherwise`.
bool flag_bool_or(const std::string& s, bool otherwise, const char* flag);
CLI::Validator flag_bool_check();
// An integer option's check: refuses values below `min` with "must be at least MIN, got V"
// (CLI11's PositiveNumber prints a floating-point range instead).
CLI::Validator at_least(int64_t min);
// A size flag's check at parse time (parse_bytes' rules; "" is refused, not taken as unset).
CLI::Validator size_check(const std::string& flag);
// --threads of the CPU device: 0 (the default) for every hardware thread; more than the machine
// has, or a negative count, is refused at parse time.
CLI::Option* add_threads_flag(CLI::App* app, int& threads);
// True when any flag asks for the offloading engine (otherwise the in-memory path runs);
// --compress-weight / --compress-cache do not.
bool offload_requested(const OffloadArgs& a);
// Throws when --hardware is given where nothing reads it: without --policy auto, unless
// `balances_stages` (--pipeline-stages balances the layers by the profile).
void check_hardware_flag(const OffloadArgs& a, bool balances_stages);
// -b with offloading flags: the block is then -b sequences (--gpu-batch-size B, one micro-batch),
// unless --gpu-batch-size, --num-gpu-batches or --policy set it: then a conflict, refused where
// `refuse` (the CLI) and the flags' block otherwise (the Python LLM, whose batch_size lm-eval
// always passes). `flag` names the batch flag in that refusal (eval-choice has no -b).
void apply_batch_size_flag(bool batch_size_given, int64_t batch_size, OffloadArgs& a, bool refuse = true,
                           std::string_view flag = "-b/--batch-size");
// Policy from --policy FILE (if given) overridden by explicit flags; budgets; directory.
// kv_dtype is left to the caller (run_kv_dtype); policy.compress_* are set by the flags or the file.
// With --policy auto the policy fields are left at their defaults (see plan_auto_policy).
OffloadOptions make_offload_options(const OffloadArgs& a);
// What `flexh2o plan --json` records of the model it planned for ("model_shape"): the sizes that
// set its block and placement, not the name (a preset and a checkpoint directory differ in name).
nlohmann::json plan_model_shape(const ModelConfig& c);
// A --policy file that `flexh2o plan --json` wrote was sized for its "kv_policy", "model_shape"
// and sequence length. Throws, naming both, when the run's KV policy (`running`, after
// window_kv_policy) is another; warns on `log` when the model's shape is another (a pipeline
// stage compared as the whole model) or the run's prompts or sequences are longer than planned
// (the engine's budgets still decide what fits). A bare policy file carries none of these.
void check_plan_file(const OffloadArgs& a, const KvPolicyConfig& running, const Model& m, int64_t prompt_len,
                     int64_t gen_len, std::ostream& log);
// This machine as measured for one plan, kept by a host program that plans again (a Python
// Session): measuring takes seconds, and the rates do not change between calls.
struct MeasuredProfile {
  HardwareProfile profile;
  std::filesystem::path offload_dir;  // where its disk was measured; another is measured again
};

// --policy auto: the planner's best policy for this model and workload on the --hardware
// profile (this machine, measured, when none is given), with --gpu-mem / --cpu-mem /
// --disk-mem overriding the profile's capacities. Prints the choice and its prediction.
// The profile: --hardware, else this machine measured (CPU device), else on a GPU the shipped
// profile of that GPU (configs/hardware/h200.json on an H200). Without --cpu-mem, the host
// tier is at most what this process can take now (MemAvailable within its memory cgroup: a
// container's limit), and a memory cgroup that bounds it is named on `log`. `measured`
// (nullable) keeps the measured machine between calls: one it holds for the same offload
// directory is reused with its memory read again, else the machine is measured and kept there.
Policy plan_auto_policy(const OffloadArgs& a, const Model& m, const std::filesystem::path& configs_dir,
                        int64_t prompt_len, int64_t gen_len, const std::optional<KvPolicyConfig>& kv, DType kv_dtype,
                        int64_t requests, CpuDevice& cpu, const Device& dev, std::ostream& log,
                        std::optional<MeasuredProfile>* measured = nullptr);
// A warning line (empty: none) when the budgets given for RAM (--cpu-mem; on the CPU device
// --gpu-mem too, its memory being the same RAM) add up to more than this process can take now
// (available_host_memory: a container's limit included): the budget checks then pass what the
// kernel's OOM killer ends. Reads /proc and the cgroup files.
std::string budgets_beyond_memory(const OffloadArgs& a, DeviceKind kind);
// Its parts, which the pipeline's planning shares: the profile (as above, for a device of
// `kind` named `device_name`) and the search options (refusing the flags auto chooses).
HardwareProfile auto_profile(const OffloadArgs& a, const std::filesystem::path& configs_dir, CpuDevice& cpu,
                             DeviceKind kind, const std::string& device_name, std::ostream& log,
                             std::optional<MeasuredProfile>* measured = nullptr);
SearchOptions auto_search(const OffloadArgs& a, int64_t requests);
// --gpu-mem / --cpu-mem / --disk-mem (empty: not given) as the profile's tier capacities, as
// --policy auto and plan take them; on a shared-memory profile both --gpu-mem and --cpu-mem
// bound their own tiers, as the engine does.
void cap_profile_memory(const std::string& gpu_mem, const std::string& cpu_mem, const std::string& disk_mem,
                        HardwareProfile& hw);
// What a search (--policy auto, plan) may choose for compression, into `so`: on where asked
// (--compress-weight / --compress-cache); searched with --allow-compress (where the profile
// prices dequantization); otherwise off, since 4-bit is lossy and outputs would change unasked.
// Throws on contradicting flags (--no-compress, the default, is kept for scripts).
void search_compression(bool weight, bool cache, bool allow, bool no, SearchOptions& so);
// "16GiB", "512MB", "1.5G", "4096" -> bytes (K/M/G/T and KiB..TiB are powers of 1024, KB..TB
// of 1000, no unit is bytes). Throws naming `flag` and the accepted units on anything else: a
// fraction of a byte ("0.5"), less than one byte, more than 1 EiB, an unknown unit.
uint64_t parse_bytes(const std::string& text, const std::string& flag);
// The engine's report; with `since` (an earlier report() of the same engine), its counts —
// bytes and KV bytes moved, queue and wall times, token steps and the overlap efficiencies —
// are those of the interval after it. Peaks, budgets and placement facts are run-long, but
// with `placed_earlier` (a later call of a reused engine) the placement's counts are 0: weights
// written and reused, placement_disk_io_bytes.
nlohmann::json offload_report_json(const OffloadEngine& e, const OffloadReport* since = nullptr,
                                   bool placed_earlier = false);
// Writes --trace FILE (if given) from an engine built with it; throws when it cannot be written.
void write_trace_file(const OffloadArgs& a, const OffloadEngine& e, std::ostream& log);

}  // namespace flexh2o::cli
