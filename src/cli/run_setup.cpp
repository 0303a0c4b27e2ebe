// Runner construction from flags and the JSON run report, shared by generate and bench.
#include "cli/run_setup.h"

#include "core/error.h"
#include "gpu/memory_plan.h"
#include "kernels/cpu/isa.h"

namespace flexh2o::cli {
using nlohmann::json;

std::string cuda_unsupported_reason(const OffloadArgs& off) {
  OffloadArgs rest = off;
  rest.percent.clear();
  const bool resident = off.percent.empty() || off.percent == std::vector<double>{100, 0, 100, 0, 100, 0};
  if (resident && !offload_requested(rest)) return "";
  return "offloading on the CUDA device is not wired yet (only everything on the GPU: no offloading flags, "
         "or --percent 100 0 100 0 100 0)";
}

RunSetup make_run_setup(const OffloadArgs& off, const KvArgs& kv, int64_t batch_size, const Model& model,
                        Forward& fwd, CpuDevice& dev, const Env& env, int64_t prompt_len, int64_t gen_len,
                        int64_t requests, const std::string& device, std::ostream& log) {
  RunSetup rs;
  rs.kv_config = make_kv_config(kv);
  if (rs.kv_config.kind != KvPolicyKind::kFull) rs.kv_policy = make_policy(rs.kv_config);
  if (device == "cuda") {
    if (const std::string why = cuda_unsupported_reason(off); !why.empty()) FH_FAIL("--device cuda: ", why);
    auto g = std::make_unique<gpu::GpuRunner>(model, gpu::GpuRunnerOptions{batch_size, rs.kv_policy.get(), 0});
    const gpu::GpuRunInfo gi = g->info();
    log << "flexh2o: on " << gi.device_name << " (" << gpu::format_bytes(gi.device_total_bytes) << "): weights "
        << gi.dtype << " " << gpu::format_bytes(gi.weight_bytes) << " uploaded in " << gi.upload_seconds << " s\n";
    rs.gpu = g.get();
    rs.runner = std::move(g);
    return rs;
  }
  if (!offload_requested(off)) {
    rs.runner = std::make_unique<InMemoryRunner>(fwd, batch_size, rs.kv_policy.get());
    return rs;
  }
  OffloadOptions oo = make_offload_options(off);
  if (off.policy_file == "auto") {
    std::optional<KvPolicyConfig> kvc;
    if (rs.kv_policy) kvc = rs.kv_config;
    oo.policy = plan_auto_policy(off, model, env.configs_dir, std::max<int64_t>(1, prompt_len),
                                 std::max<int64_t>(1, gen_len), kvc, std::max<int64_t>(1, requests), dev, log);
  }
  oo.kv_policy = rs.kv_policy.get();
  auto eng = std::make_unique<OffloadEngine>(model, dev, oo);
  rs.offload = eng.get();
  log << "flexh2o: offloading with " << eng->options().policy.str() << " (block of " << eng->max_batch()
      << " sequences)\n";
  rs.runner = std::move(eng);
  return rs;
}

json run_report(const LoadedModel& lm, const RunSetup& rs, const GenerateStats& st, const CpuDevice& dev,
                const std::string& device) {
  const double total_s = st.prefill_seconds + st.decode_seconds;
  json report{{"model", lm.model->config().name},
              {"model_source", lm.source},
              {"device", device},
              {"threads", dev.threads()},
              {"cpu_isa", cpu::cpu_isa_name()},
              {"kv_policy", describe(rs.kv_config)},
              {"batch_size", rs.runner->max_batch()},
              {"batches", st.batches},
              {"prompt_tokens", st.prompt_tokens},
              {"padded_prompt_tokens", st.padded_prompt_tokens},
              {"generated_tokens", st.generated_tokens},
              {"load_seconds", lm.load_seconds},
              {"prefill_seconds", st.prefill_seconds},
              {"decode_seconds", st.decode_seconds},
              {"total_seconds", total_s},
              {"prefill_tokens_per_s", st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0},
              {"decode_tokens_per_s", st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0},
              {"tokens_per_s", total_s > 0 ? st.generated_tokens / total_s : 0.0},
              {"weight_bytes", lm.model->weight_bytes()},
              {"peak_kv_bytes", st.peak_kv_bytes},
              {"peak_rss_bytes", peak_rss_bytes()}};
  if (rs.offload) report["offload"] = offload_report_json(*rs.offload);
  if (rs.gpu) {
    const gpu::GpuRunInfo gi = rs.gpu->info();
    report["gpu"] = {{"name", gi.device_name},       {"memory_bytes", gi.device_total_bytes},
                     {"dtype", gi.dtype},            {"weight_bytes", gi.weight_bytes},
                     {"upload_seconds", gi.upload_seconds}};
  }
  return report;
}

}  // namespace flexh2o::cli
