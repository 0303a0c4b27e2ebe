// Runner construction from flags and the JSON run report, shared by generate and bench.
#include "cli/run_setup.h"

#include "core/error.h"
#include "gpu/memory_plan.h"
#include "kernels/cpu/isa.h"

namespace flexh2o::cli {
using nlohmann::json;

namespace {
// No offloading flags, or exactly --percent 100 0 100 0 100 0: the all-resident GpuRunner.
bool all_resident(const OffloadArgs& off) {
  OffloadArgs rest = off;
  rest.percent.clear();
  const bool resident = off.percent.empty() || off.percent == std::vector<double>{100, 0, 100, 0, 100, 0};
  return resident && !offload_requested(rest);
}
}  // namespace

std::string cuda_unsupported_reason(const OffloadArgs& off, const std::string& requested) {
  if (all_resident(off)) return "";
  if (requested != "cuda") return "offloading flags run on the CPU device unless --device cuda is given";
  const std::vector<double>& pc = off.percent;
  auto is = [&](size_t i, double g, double c) { return pc.empty() ? g == 100 : pc[i] == g && pc[i + 1] == c; };
  const bool cache_gpu = is(2, 100, 0), cache_host = is(2, 0, 100) && off.cpu_cache_compute;
  const bool act_whole = is(4, 100, 0) || is(4, 0, 100);
  const bool no_disk = pc.empty() || pc[0] + pc[1] >= 100 - 1e-9;
  if ((cache_gpu || cache_host) && act_whole && no_disk && off.policy_file.empty() && off.offload_dir.empty() &&
      off.disk_mem.empty())
    return "";
  return "this offloading policy is not wired on CUDA yet: --device cuda takes --percent w_g w_c c_g c_c a_g a_c "
         "with w_g + w_c = 100 (no weights on disk), the cache wholly on the GPU (100 0) or wholly on the host "
         "with --cpu-cache-compute (0 100), the activations wholly on either (100 0 or 0 100), and no --policy, "
         "--offload-dir or --disk-mem";
}

RunSetup make_run_setup(const OffloadArgs& off, const KvArgs& kv, int64_t batch_size, const Model& model,
                        Forward& fwd, CpuDevice& dev, const Env& env, int64_t prompt_len, int64_t gen_len,
                        int64_t requests, const std::string& device, std::ostream& log) {
  RunSetup rs;
  rs.kv_config = make_kv_config(kv);
  if (rs.kv_config.kind != KvPolicyKind::kFull) rs.kv_policy = make_policy(rs.kv_config);
  if (device == "cuda") {
    if (const std::string why = cuda_unsupported_reason(off); !why.empty()) FH_FAIL("--device cuda: ", why);
    if (!all_resident(off)) {
      const OffloadOptions oo = make_offload_options(off);
      gpu::GpuOffloadOptions go{oo.policy, size_t(oo.device_mem), size_t(oo.host_mem), rs.kv_policy.get()};
      auto g = std::make_unique<gpu::GpuOffloadRunner>(model, go);
      const gpu::GpuOffloadReport r = g->report();
      log << "flexh2o: on " << r.device_name << ": offloading with " << r.policy << " (block of "
          << g->max_batch() << "): " << r.dtype << " weights " << gpu::format_bytes(r.weight_device_bytes)
          << " on the GPU, " << gpu::format_bytes(r.weight_host_bytes) << " streamed from pinned host memory; budget "
          << gpu::format_bytes(r.budget_bytes) << "; set up in " << r.upload_seconds << " s\n";
      rs.gpu_offload = g.get();
      rs.runner = std::move(g);
      return rs;
    }
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
  if (rs.gpu_offload) {
    const gpu::GpuOffloadReport r = rs.gpu_offload->report();
    report["gpu"] = {{"name", r.device_name},  {"memory_bytes", r.device_total_bytes},
                     {"dtype", r.dtype},       {"weight_bytes", r.weight_device_bytes},
                     {"upload_seconds", r.upload_seconds}};
    report["offload"] = {
        {"policy", r.policy},
        {"bytes_moved", {{"host_to_device", r.host_to_device_bytes}, {"device_to_host", r.device_to_host_bytes}}},
        {"weight_bytes_moved", r.weight_bytes_moved},
        {"weights_device_bytes", r.weight_device_bytes},
        {"weights_host_bytes", r.weight_host_bytes},
        {"weights_host_pinned_in_place_bytes", r.host_registered_bytes},
        {"weight_slot_bytes", r.slot_bytes},
        {"device_budget_bytes", r.budget_bytes},
        {"device_peak_bytes", r.arena_peak_bytes},
        {"token_steps", r.steps},
        {"step_seconds", r.step_seconds},
        {"stream_busy_seconds",
         {{"compute", r.stream_busy_seconds[0]},
          {"host_to_device", r.stream_busy_seconds[1]},
          {"device_to_host", r.stream_busy_seconds[2]}}},
        {"host_attention_seconds", r.host_attention_seconds},
        {"overlap_efficiency", r.overlap_efficiency()},
        {"mean_step_seconds", r.steps ? r.step_seconds / double(r.steps) : 0.0}};
  }
  return report;
}

}  // namespace flexh2o::cli
