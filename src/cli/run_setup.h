// What generate, bench and the eval commands share: turning the device, offloading and KV-cache
// flags into a device and a runner — the in-memory reference (CPU device, no offloading flags)
// or the offloading engine on the CPU or CUDA device (--policy auto planned for the workload;
// on CUDA without offloading flags, everything resident) — and the JSON run report.
#pragma once

#include <atomic>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "cli/common.h"
#include "core/error.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "engine/compress.h"
#include "engine/generate.h"

namespace flexh2o::cli {

struct RunSetup {
  KvPolicyConfig kv_config;             // what runs: the flags', or window_kv_policy()'s
  std::string kv_config_note;           // why kv_config differs from the flags ("" when it does not)
  std::unique_ptr<KvPolicy> kv_policy;  // null for full
  DType kv_dtype = DType::F16;
  std::unique_ptr<CompressedWeights> compressed;  // in memory with --compress-weight (Forward reads it)
  std::unique_ptr<Device> owned;        // the CUDA device, on --device cuda
  Device* device = nullptr;             // what the runner computes on (null: no device opened, nothing ran)
  std::unique_ptr<StepRunner> runner;
  OffloadEngine* offload = nullptr;     // the runner, when it is the offloading engine
  bool compress_weight = false;         // unplaced_run_setup(): the flags ask for 4-bit weights
  // Seconds from the device's opening to a runner ready for its first step: the weights' copy to
  // the CUDA device, the offload store written or checked, 4-bit compression, --policy auto.
  double setup_seconds = 0;
  // A runner reused by another call (the Python API): the engine's report as that call began,
  // so run_report counts that call only (see offload_report_json). Unset: since construction.
  std::optional<OffloadReport> offload_since;
  void start_report() {
    if (offload) offload_since = offload->report();
  }
  // A later call of a runner an earlier call set up (the Python API): start_report(), and once a
  // report of this runner's was given (`reported`, set by its caller), its report counts no setup
  // and no placement of the weights (setup_seconds, weights_written, placement_disk_io_bytes: 0),
  // which that earlier report counted.
  bool reported = false;
  bool later_call = false;
  void start_later_call() {
    start_report();
    later_call = reported;
  }
};

// The engine flags that need no model, checked before one loads (a preset's dummy weights take
// minutes to build): the KV policy and its budgets (make_kv_config), --kv-dtype (and its
// agreement with --compress-cache), and the offloading flags (make_offload_options:
// percentages, sizes, a --policy file). Throws naming the flag.
void check_engine_flags(const OffloadArgs& off, const KvArgs& kv);

// What the flags ask for with no engine placed (a run with nothing to run, or one stopped while
// placing its weights), for run_report: the KV policy and dtype, whether weights are compressed;
// device, runner and offload stay null.
RunSetup unplaced_run_setup(const OffloadArgs& off, const KvArgs& kv, const Model& m);

// "cpu": `cpu` itself; "cuda": a CUDA device for `m` (F16, or BF16 for bf16 checkpoints), kept in `owned`;
// `cuda_index`: which GPU of the host.
Device& open_device(const std::string& device, const Model& m, CpuDevice& cpu, std::unique_ptr<Device>& owned,
                    int cuda_index = 0);

// The in-memory runner's weights from the flags: with --compress-weight the Q4 copy of the
// model's weights, which `fwd` now reads (null, and fwd unchanged, without the flag). The result
// must outlive fwd's steps. Throws UsageError for a flag only the offloading engine reads
// (--trace, --overlap, --io, ...): given without offloading flags it would do nothing.
std::unique_ptr<CompressedWeights> compress_in_memory(const OffloadArgs& off, const Model& m, Forward& fwd);

// The offloading engine's options from the flags (make_offload_options), everything resident
// in one micro-batch of batch_size when no flag asks for offloading (CUDA, a pipeline stage).
OffloadOptions engine_options(const OffloadArgs& off, int64_t batch_size);

// `fwd`, `cpu` and `model` must outlive the result. prompt_len / gen_len / requests describe
// the workload (for --policy auto); `device` is select_device()'s answer (on "cuda", GPU
// `cuda_index`). Logs the choice. With `stage`, `model` is a pipeline stage (see StageRun).
struct StageRun {
  // The stage's policy as rank 0's pipeline plan chose it (instead of the flags); unset: the
  // flags'. A stage always runs on the offloading engine (without offloading flags: everything
  // resident, one micro-batch).
  std::optional<Policy> policy;
};
// The offloading engine of `model` on `dev` under `o`, drawing a "[place weights]" progress line
// (--progress `progress`; none when placing takes under a second) while the weights are placed.
// Once `*stop` is set (a stop signal) it throws PlacementStopped at the next weight placed, or
// while it waits for another run's lock on the offload directory: writing a large store to disk
// takes minutes, and the files already written stay for the next run. Null: placing is not
// stopped. (Thrown too by a stop before any step ran: while the input is read or --output's
// results are scanned for --resume, or the model loads.)
struct PlacementStopped : Error {
  using Error::Error;
};
std::unique_ptr<OffloadEngine> place_engine(const Model& model, Device& dev, OffloadOptions o,
                                            const std::string& progress, bool stderr_is_tty,
                                            const std::atomic<bool>* stop = nullptr);

// The run's device, KV policy and runner from the flags. `requests`: how many sequences the run
// has, which caps the block --policy auto chooses (at least 1; kUncappedBlock: no cap).
// `before_placing`: OffloadOptions::before_placing, given the offloading engine before its weights
// are placed (not called for the in-memory runner, which places nothing).
constexpr int64_t kUncappedBlock = int64_t(1) << 40;
RunSetup make_run_setup(const OffloadArgs& off, const KvArgs& kv, int64_t batch_size, const Model& model,
                        Forward& fwd, CpuDevice& cpu, const Env& env, int64_t prompt_len, int64_t gen_len,
                        int64_t requests, const std::string& device, std::ostream& log, int cuda_index = 0,
                        const StageRun* stage = nullptr,
                        std::function<void(const OffloadEngine&)> before_placing = {});

// The run report (timings, tokens/s, memory; the device; the offload section when offloading).
nlohmann::json run_report(const LoadedModel& lm, const RunSetup& rs, const GenerateStats& st, const CpuDevice& cpu,
                          const std::string& device);
// The keys of GenerateStats in a run report (run_report()'s, and each rank's under mpirun).
nlohmann::json stats_json(const GenerateStats& st);
// The stats a run_report() holds (what an mpirun worker's report tells rank 0).
GenerateStats stats_of_report(const nlohmann::json& report);

}  // namespace flexh2o::cli
