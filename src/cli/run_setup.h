// What generate and bench share: turning the device, offloading and KV-policy flags into a
// runner (in-memory Forward, OffloadEngine with --policy auto planned for the workload, or the
// all-resident GpuRunner on --device cuda), and the JSON run report from the generation stats.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli/common.h"
#include "cli/kv_flags.h"
#include "cli/offload_flags.h"
#include "engine/generate.h"
#include "gpu/gpu_offload_runner.h"
#include "gpu/gpu_runner.h"

namespace flexh2o::cli {

struct RunSetup {
  KvPolicyConfig kv_config;
  std::unique_ptr<KvPolicy> kv_policy;  // null for full
  std::unique_ptr<StepRunner> runner;
  OffloadEngine* offload = nullptr;     // the runner, when offloading
  gpu::GpuRunner* gpu = nullptr;        // the runner, on --device cuda (all resident)
  gpu::GpuOffloadRunner* gpu_offload = nullptr;  // the runner, on --device cuda with offloading flags
};

// Why these flags cannot run on the CUDA device ("" when they can). --device cuda: all resident
// (no offloading flags, or --percent 100 0 100 0 100 0) or weight offloading (--percent w_g w_c
// 100 0 100 0, w_g + w_c = 100; no disk, policy file or CPU attention). --device auto keeps
// offloading flags on the CPU device. Pass to select_device().
std::string cuda_unsupported_reason(const OffloadArgs& off, const std::string& requested = "cuda");

// `fwd`, `dev` and `model` must outlive the result. prompt_len / gen_len / requests describe
// the workload (for --policy auto); `device` is select_device()'s answer ("cuda": GpuRunner, or
// GpuOffloadRunner with offloading flags; both upload the weights now). Logs the choice to `log`.
RunSetup make_run_setup(const OffloadArgs& off, const KvArgs& kv, int64_t batch_size, const Model& model,
                        Forward& fwd, CpuDevice& dev, const Env& env, int64_t prompt_len, int64_t gen_len,
                        int64_t requests, const std::string& device, std::ostream& log);

// The run report (timings, tokens/s, memory; the offload section when offloading; the gpu
// section — device name and memory, dtype, weight bytes — on --device cuda).
nlohmann::json run_report(const LoadedModel& lm, const RunSetup& rs, const GenerateStats& st, const CpuDevice& dev,
                          const std::string& device);

}  // namespace flexh2o::cli
