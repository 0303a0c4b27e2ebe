// Device and runner construction from flags, and the JSON run report, shared by the commands
// that run a model.
#include "cli/run_setup.h"

#include <chrono>
#include <set>

#include "cli/progress.h"
#include "core/error.h"
#include "engine/kv_evict.h"
#include "engine/memory_plan.h"
#include "gpu/cuda_device.h"
#include "kernels/cpu/isa.h"

namespace flexh2o::cli {
using nlohmann::json;

void check_engine_flags(const OffloadArgs& off, const KvArgs& kv) {
  (void)make_kv_config(kv);
  (void)kv_dtype_flag(kv);
  if (make_offload_options(off).policy.compress_cache) (void)compressed_kv_dtype(kv);
}

RunSetup unplaced_run_setup(const OffloadArgs& off, const KvArgs& kv, const Model& m) {
  RunSetup rs;
  rs.kv_config = make_kv_config(kv);
  const Policy asked = make_offload_options(off).policy;  // the flags and a --policy file's
  rs.kv_dtype = run_kv_dtype(kv, asked.compress_cache, m);
  rs.compress_weight = asked.compress_weight;
  return rs;
}

Device& open_device(const std::string& device, const Model& m, CpuDevice& cpu, std::unique_ptr<Device>& owned,
                    int cuda_index) {
  if (device != "cuda") return cpu;
  gpu::CudaDeviceOptions co;
  co.device = cuda_index;
  co.compute = gpu::compute_dtype(m);
  co.host_threads = cpu.threads();
  owned = gpu::make_cuda_device(co);
  return *owned;
}

std::unique_ptr<CompressedWeights> compress_in_memory(const OffloadArgs& off, const Model& m, Forward& fwd) {
  const std::pair<bool, const char*> engine_only[] = {
      {!off.trace.empty(), "--trace"},          {!off.overlap.empty(), "--overlap"},
      {!off.sep_layer.empty(), "--sep-layer"},  {!off.pin_weight.empty(), "--pin-weight"},
      {off.io != "auto", "--io"},               {!off.verify_store, "--trust-store"},
      {off.allow_compress, "--allow-compress"}, {off.no_compress, "--no-compress"}};
  for (const auto& [given, flag] : engine_only)
    if (given)
      throw UsageError(detail::concat(flag, " is the offloading engine's, and this run is in memory (no offloading "
                                      "flag, the CPU device): drop it, or run the engine with offloading flags "
                                      "(e.g. --percent 100 0 100 0 100 0)"));
  if (!off.compress_weight) return nullptr;
  auto cw = std::make_unique<CompressedWeights>(m);
  fwd.use_weights(&cw->weights());
  return cw;
}

OffloadOptions engine_options(const OffloadArgs& off, int64_t batch_size) {
  OffloadOptions oo = make_offload_options(off);
  if (!offload_requested(off)) {  // CUDA or a stage without offloading flags: all resident, one micro-batch
    oo.policy.gpu_batch_size = batch_size;
    oo.policy.num_gpu_batches = 1;
  }
  return oo;
}

std::unique_ptr<OffloadEngine> place_engine(const Model& model, Device& dev, OffloadOptions o,
                                            const std::string& progress, bool stderr_is_tty,
                                            const std::atomic<bool>* stop) {
  Progress place = startup_progress("place weights", progress, stderr_is_tty);
  o.on_place = [&](uint64_t done, uint64_t total) {
    place.update(int64_t(done), int64_t(total));
    if (stop && stop->load(std::memory_order_relaxed) && done < total)
      throw PlacementStopped(detail::concat("stopped while placing the weights (", human_bytes(done), " of ",
                                            human_bytes(total), " placed); the store files written stay for the "
                                            "next run"));
  };
  o.while_waiting = [stop] {
    if (stop && stop->load(std::memory_order_relaxed))
      throw PlacementStopped("stopped while waiting for another run's lock on the offload directory");
  };
  auto eng = std::make_unique<OffloadEngine>(model, dev, o);
  place.finish();
  return eng;
}

RunSetup make_run_setup(const OffloadArgs& off, const KvArgs& kv, int64_t batch_size, const Model& model,
                        Forward& fwd, CpuDevice& cpu, const Env& env, int64_t prompt_len, int64_t gen_len,
                        int64_t requests, const std::string& device, std::ostream& log, int cuda_index,
                        const StageRun* stage, std::function<void(const OffloadEngine&)> before_placing) {
  RunSetup rs;
  rs.kv_config = make_kv_config(kv);
  const int64_t max_len = std::max<int64_t>(1, prompt_len) + std::max<int64_t>(1, gen_len);
  if (window_caps_full_cache(model.config(), max_len) && rs.kv_config.kind == KvPolicyKind::kFull) {
    const ModelConfig& c = model.config();
    rs.kv_config_note = detail::concat("full cache: every layer attends to its last ", c.sliding_window,
                                       " positions only, so a sequence keeps those (sequences reach ", max_len, ")");
    log << "flexh2o: " << c.name << ": " << rs.kv_config_note << "\n";
  }
  rs.kv_config = window_kv_policy(model.config(), rs.kv_config, max_len);
  check_plan_file(off, rs.kv_config, model, std::max<int64_t>(1, prompt_len), std::max<int64_t>(1, gen_len),
                  log);
  if (rs.kv_config.kind != KvPolicyKind::kFull) rs.kv_policy = make_policy(rs.kv_config);
  // Both runners cap the full cache of a model whose other layers attend to everything.
  if (const int64_t w = full_cache_window(model.config(), rs.kv_policy != nullptr, max_len)) {
    const ModelConfig& c = model.config();
    rs.kv_config_note = detail::concat("full cache: the ", count_sliding_layers(c), " sliding layers of ", c.n_layers,
                                       " attend to their last ", w, " positions only, so they keep those; the others "
                                       "keep every token (sequences reach ", max_len, ")");
    log << "flexh2o: " << c.name << ": " << rs.kv_config_note << "\n";
  }
  rs.kv_dtype = run_kv_dtype(kv, off.compress_cache, model);
  const auto t0 = std::chrono::steady_clock::now();
  auto since_t0 = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  rs.device = &open_device(device, model, cpu, rs.owned, cuda_index);
  if (device != "cuda" && !stage && !offload_requested(off)) {
    rs.compressed = compress_in_memory(off, model, fwd);
    rs.runner = std::make_unique<InMemoryRunner>(fwd, batch_size, rs.kv_policy.get(), rs.kv_dtype);
    rs.setup_seconds = since_t0();
    return rs;
  }
  OffloadOptions oo = engine_options(off, batch_size);
  log << budgets_beyond_memory(off, device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu);
  rs.kv_dtype = run_kv_dtype(kv, oo.policy.compress_cache, model);
  if (stage && stage->policy) {
    oo.policy = *stage->policy;
  } else if (off.policy_file == "auto") {
    std::optional<KvPolicyConfig> kvc;
    if (rs.kv_policy) kvc = rs.kv_config;
    oo.policy = plan_auto_policy(off, model, env.configs_dir, std::max<int64_t>(1, prompt_len),
                                 std::max<int64_t>(1, gen_len), kvc, rs.kv_dtype, std::max<int64_t>(1, requests), cpu,
                                 *rs.device, log, env.measured_profile);
    oo.policy.compress_weight = oo.policy.compress_weight || off.compress_weight;  // asked for: kept
    oo.policy.compress_cache = oo.policy.compress_cache || off.compress_cache;
  }
  oo.kv_policy = rs.kv_policy.get();
  oo.kv_dtype = rs.kv_dtype;
  oo.before_placing = std::move(before_placing);
  auto eng = place_engine(model, *rs.device, oo, off.progress, env.stderr_is_tty, env.stop);
  rs.offload = eng.get();
  rs.kv_dtype = eng->options().kv_dtype;  // Q4 when the policy compresses the cache
  // Whole tensors are placed (FlexGen's midpoint rule), so the split is said as it came out.
  const auto& homed = eng->placement().bytes;
  log << "flexh2o: on " << rs.device->name() << ": " << eng->options().policy.str() << " (block of "
      << eng->max_batch() << " sequences), KV cache " << dtype_name(rs.kv_dtype) << "; weights homed: "
      << human_bytes(homed[0]) << " device, " << human_bytes(homed[1]) << " host, " << human_bytes(homed[2])
      << " disk\n";
  rs.runner = std::move(eng);
  rs.setup_seconds = since_t0();
  return rs;
}

namespace {

// The weights' bytes as the run holds them: 4-bit where compressed, an offloading engine's
// placement dtype (a tied lm_head once).
size_t held_weight_bytes(const Model& m, const RunSetup& rs) {
  size_t n = 0;
  if (rs.offload) {
    std::set<const void*> seen;
    for (const UnitPlacement& u : rs.offload->placement().units)
      for (const PlacedTensor& t : u.tensors)
        if (seen.insert(t.source.data).second) n += t.bytes;
    return n;
  }
  const bool q4 = rs.compress_weight || rs.compressed;
  for (const BoundTensor& t : m.tensors()) n += held_bytes(t.view, held_dtype(t.view, q4, std::nullopt));
  return n;
}

}  // namespace

json stats_json(const GenerateStats& st) {
  const double total_s = st.prefill_seconds + st.decode_seconds;
  return {{"batches", st.batches},
          {"continuous", st.continuous},
          {"refills", st.refills},
          {"refilled_sequences", st.refilled_sequences},
          {"decode_steps", st.decode_steps},
          {"prompt_tokens", st.prompt_tokens},
          {"padded_prompt_tokens", st.padded_prompt_tokens},
          {"generated_tokens", st.generated_tokens},
          {"prefill_seconds", st.prefill_seconds},
          {"decode_seconds", st.decode_seconds},
          {"total_seconds", total_s},
          {"output_seconds", st.output_seconds},
          {"prefill_tokens_per_s", st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0},
          {"decode_tokens", st.decode_tokens},
          {"decode_tokens_per_s", st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0.0},
          {"tokens_per_s", total_s > 0 ? st.generated_tokens / total_s : 0.0},
          {"peak_kv_bytes", st.peak_kv_bytes}};
}

json run_report(const LoadedModel& lm, const RunSetup& rs, const GenerateStats& st, const CpuDevice& cpu,
                const std::string& device) {
  json report{{"model", lm.model->config().name},
              {"model_source", lm.source},
              {"device", device},
              {"device_name", rs.device ? rs.device->name() : ""},  // none: nothing ran
              {"threads", cpu.threads()},
              {"cpu_isa", cpu::cpu_isa_name()},
              {"kv_policy", describe(rs.kv_config)},
              {"kv_policy_note", rs.kv_config_note},
              {"kv_dtype", dtype_name(rs.kv_dtype)},
              {"compress_weight", rs.compress_weight || rs.compressed != nullptr ||
                                      (rs.offload && rs.offload->options().policy.compress_weight)},
              {"compress_cache", rs.kv_dtype == DType::Q4},  // --compress-cache is --kv-dtype q4
              {"batch_size", rs.runner ? rs.runner->max_batch() : 0},
              {"load_seconds", lm.load_seconds},
              {"setup_seconds", rs.later_call ? 0.0 : rs.setup_seconds},
              {"weight_bytes", held_weight_bytes(*lm.model, rs)},
              {"checkpoint_weight_bytes", lm.model->weight_bytes()},
              {"peak_rss_bytes", peak_rss_bytes()}};
  report.update(stats_json(st));
  if (rs.offload)
    report["offload"] =
        offload_report_json(*rs.offload, rs.offload_since ? &*rs.offload_since : nullptr, rs.later_call);
  return report;
}

GenerateStats stats_of_report(const json& j) {
  GenerateStats s;
  s.generated_tokens = j.value("generated_tokens", int64_t(0));
  s.decode_tokens = j.value("decode_tokens", int64_t(0));
  s.prompt_tokens = j.value("prompt_tokens", int64_t(0));
  s.padded_prompt_tokens = j.value("padded_prompt_tokens", int64_t(0));
  s.batches = j.value("batches", int64_t(0));
  s.decode_steps = j.value("decode_steps", int64_t(0));
  s.prefill_seconds = j.value("prefill_seconds", 0.0);
  s.decode_seconds = j.value("decode_seconds", 0.0);
  s.output_seconds = j.value("output_seconds", 0.0);
  s.peak_kv_bytes = j.value("peak_kv_bytes", size_t(0));
  return s;
}

}  // namespace flexh2o::cli
