// What the ranks of an mpirun job share or split, in both modes (dp_generate.h): --rank-timeout,
// a rank's CPU threads and GPU, and the terms of the job every rank must agree on.
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/dp_generate.h"
#include "core/error.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o::cli {

using nlohmann::json;

void add_data_parallel_flags(CLI::App& g, double& rank_timeout_s) {
  g.add_option("--rank-timeout", rank_timeout_s,
               "Under mpirun (data or pipeline parallel): a rank that sends nothing for this many seconds is taken "
               "as hung and the job ends (finished results are kept; --resume finishes it). Ranks send a heartbeat "
               "after every token step, so this must exceed the longest step (a batch's prefill) and a model's load")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& s) {  // seconds, not an integer; inf waits for ever, nan is no time
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (end == s.c_str() || *end != '\0' || !(v > 0)) return "must be a positive number of seconds, got " + s;
            return std::string();
          },
          "SECONDS"));
}

int rank_threads_of(int requested, int usable, int cores, int local_ranks) {
  if (requested > 0) return requested;
  // A binding narrower than the share (a core a rank) bounds it; ranks bound to one socket each
  // (mpirun beyond 2 ranks) may share it, so never more than the share either.
  const int share = std::max(1, cores / std::max(1, local_ranks));
  return usable > 0 ? std::max(1, std::min(usable, share)) : share;
}

int rank_threads(const dist::Comm& comm, int requested) {
  cpu_set_t set;
  const int usable = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  return rank_threads_of(requested, usable, int(std::max(1u, std::thread::hardware_concurrency())),
                         comm.local_size());
}

int rank_cuda_index(const dist::Comm& comm, const std::string& device) {
  if (device != "cuda") return 0;
  const int n = probe_cuda().device_count;
  return n > 0 ? comm.local_rank() % n : 0;
}

std::string job_terms(const ModelConfig& c, const GenerateArgs& a) {
  json j = plan_model_shape(c);
  j["dtype"] = dtype_name(c.dtype);
  j["kv_policy"] = describe(make_kv_config(a.kv));
  // Resolved, so that flags meaning the same (--kv-dtype auto and f16 on an f16 checkpoint;
  // --compress-cache and --kv-dtype q4) agree.
  j["kv_dtype"] = dtype_name(a.offload.compress_cache ? compressed_kv_dtype(a.kv)
                                                      : kv_cache_dtype(a.kv, c.dtype == DType::BF16));
  j["compress_weight"] = a.offload.compress_weight;
  return j.dump();
}

void check_job_terms(const std::string& root, const std::string& mine, const std::string& rank) {
  if (root == mine) return;
  const json r = json::parse(root, nullptr, false), m = json::parse(mine, nullptr, false);
  std::string diff;
  if (r.is_object() && m.is_object())
    for (const auto& item : m.items()) {
      const json was = r.value(item.key(), json());
      if (was != item.value())
        diff += (diff.empty() ? "" : ", ") + item.key() + " " + was.dump() + " on rank 0, " + item.value().dump() + " here";
    }
  FH_FAIL(rank, " runs another job than rank 0 (", diff.empty() ? root + " against " + mine : diff,
          "): its tokens would not be the job's. Give every rank the same model (the same checkpoint at the same "
          "path on each machine) and the same KV and compression flags");
}

}  // namespace flexh2o::cli
