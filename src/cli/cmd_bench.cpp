// `flexh2o bench`: a FlexGen-style throughput run — N synthetic prompts of a fixed length,
// a fixed number of generated tokens each (EOS ignored), any placement and KV policy —
// printing tokens/s and writing the run report. Works with presets (dummy weights).
#include <chrono>
#include <iostream>
#include <random>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/progress.h"
#include "cli/run_setup.h"
#include "cli/sampling_flags.h"
#include "core/error.h"
#include "engine/generate.h"

namespace flexh2o::cli {
using nlohmann::json;

void register_bench(CLI::App& app, BenchArgs& a) {
  auto* b = app.add_subcommand("bench", "Throughput benchmark: N prompts of --prompt-len, --gen-len tokens each");
  b->add_option("--model,-m", a.model, "Model directory, hub id, or preset name (dummy weights, e.g. opt-1.3b)")
      ->required();
  b->add_option("--prompt-len", a.prompt_len, "Prompt tokens per sequence")->capture_default_str()
      ->check(at_least(1));
  b->add_option("--gen-len", a.gen_len, "Generated tokens per sequence (EOS ignored)")->capture_default_str()
      ->check(at_least(1));
  b->add_option("--num-prompts", a.num_prompts, "Sequences (default: one block, or --batch-size; with --policy auto, the block it plans)")
      ->check(at_least(1));
  b->add_option("--batch-size,-b", a.batch_size,
                "Sequences in a batch. With offloading flags the batch is the policy's block "
                "(--gpu-batch-size, default 4, x --num-gpu-batches, default 1); -b given there is "
                "--gpu-batch-size B and contradicts --gpu-batch-size, --num-gpu-batches and --policy")
      ->capture_default_str()->check(at_least(1))->each([&a](const std::string&) { a.batch_size_given = true; });
  b->add_option("--seed", a.seed, "Seed of the synthetic prompt ids (and of sequence i's draws: seed + i)")
      ->capture_default_str()
      ->check(seed_check());
  b->add_option("--temperature", a.temperature,
                "Sampling temperature: 0 is greedy (FlexGen's benchmark); > 0 times sampled decoding too")
      ->capture_default_str();
  b->add_option("--top-k", a.top_k, "With --temperature: keep the k most likely tokens (0 = off)")->capture_default_str();
  b->add_option("--top-p", a.top_p, "With --temperature: nucleus mass (1 = off)")->capture_default_str();
  b->add_flag("--warmup", a.warmup,
              "First run the first block's prefill alone, untimed, as FlexGen's benchmark does: the timed run "
              "then reuses the buffers it allocated and pinned (a job of several blocks pays that once). The "
              "report's warmup_seconds holds it; its offload section counts the timed run only");
  b->add_option("--report", a.report, "Write the JSON run report here");
  b->add_option("--device", a.device,
                "cpu, cuda (the offloading engine on the GPU: everything resident, or placed by the offloading "
                "flags) or auto (cuda when a GPU is usable)")
      ->capture_default_str();
  add_threads_flag(b, a.threads);
  add_progress_flag(*b, a.progress);
  add_offload_flags(b, a.offload);
  add_kv_flags(b, a.kv);
}

namespace {
// Sequence i's sampling: the flags, with seed + i.
SamplingParams sampling(const BenchArgs& a, uint64_t i) {
  SamplingParams s;
  s.temperature = a.temperature;
  s.top_k = a.top_k;
  s.top_p = a.top_p;
  s.seed = a.seed + i;
  return s;
}
}  // namespace

int run_bench(const BenchArgs& a, const Env& env) {
  check_can_write({"--report", a.report});
  check_can_write({"--trace", a.offload.trace});  // output paths: exit 1, not a flag's mistake
  OffloadArgs off = a.offload;
  check_flags([&] {
    validate(sampling(a, 0));  // before a preset's weights
    if (a.temperature == 0 && (a.top_k != 0 || a.top_p != 1))
      FH_FAIL(a.top_k != 0 ? "--top-k" : "--top-p", " shapes sampled decoding and --temperature is 0 (greedy, the "
              "default): give --temperature > 0 with it, or leave it out");
    check_hardware_flag(a.offload, false);
    check_engine_flags(a.offload, a.kv);
    apply_batch_size_flag(a.batch_size_given, a.batch_size, off);
  });
  check_device_early(a.device);  // --device cuda without a GPU: not the command line's fault
  check_workload_length(resolve_config(env, a.model), a.model, a.prompt_len, a.gen_len);  // before weights
  LoadedModel lm = load_model(env, a.model, "", 0, a.progress);
  std::cerr << lm.warning;
  const std::string device = select_device(a.device, *lm.model, std::cerr);
  const ModelConfig& c = lm.model->config();
  CpuDevice dev(a.threads);
  Forward fwd(*lm.model, dev);
  // --policy auto without a count plans the block uncapped and runs one (FlexGen's benchmark).
  const int64_t guess = a.num_prompts ? a.num_prompts : off.policy_file == "auto" ? kUncappedBlock : a.batch_size;
  off.progress = a.progress;
  int64_t n = 0;
  std::vector<GenerationRequest> reqs;
  auto make_requests = [&](const StepRunner& runner) {  // once the block is known
    n = a.num_prompts ? a.num_prompts : runner.max_batch();
    std::mt19937_64 rng(a.seed);
    reqs.resize(size_t(n));
    for (size_t i = 0; i < reqs.size(); ++i) {
      GenerationRequest& r = reqs[i];
      r.prompt_ids.resize(size_t(a.prompt_len));
      for (auto& id : r.prompt_ids) id = int32_t(rng() % uint64_t(c.vocab_size));
      if (c.bos_id) r.prompt_ids[0] = *c.bos_id;
      r.max_new_tokens = a.gen_len;
      r.sampling = sampling(a, uint64_t(i));
    }
    check_batches(runner, reqs, GenerateOptions{});  // a batch that does not fit, before the weights are placed
  };
  RunSetup rs = make_run_setup(off, a.kv, a.batch_size, *lm.model, fwd, dev, env, a.prompt_len, a.gen_len,
                               guess, device, std::cerr, 0, nullptr, make_requests);
  if (reqs.empty()) make_requests(*rs.runner);
  GenerateOptions go;
  go.ignore_eos = true;
  go.pad_id = c.pad_id.value_or(0);
  Progress progress("bench", "tokens", parse_progress_mode(a.progress), env.stderr_is_tty, rs.offload);
  go.on_progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
  // SIGINT/SIGTERM/SIGHUP (timeout(1) at a time cap) stop within the token step under way: the report
  // then holds the tokens and seconds so far, a measurement of the part that ran.
  go.stop = env.stop;
  double warmup_s = 0;
  if (a.warmup && !(go.stop && go.stop->load())) {
    // The first block as it will run (the same prompts, lengths and capacity: the same buffers),
    // ended after its prefill's token.
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<GenerationRequest> w(reqs.begin(), reqs.begin() + std::min<int64_t>(n, rs.runner->max_batch()));
    GenerateOptions wo = go;
    wo.on_progress = nullptr;
    wo.ends_at = [](size_t, const GenerationResult&) { return true; };
    generate(*rs.runner, w, wo);
    warmup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rs.start_report();
  }
  GenerateStats st;
  generate(*rs.runner, reqs, go, &st);
  progress.finish();
  json report = run_report(lm, rs, st, dev, device);
  report["interrupted"] = st.interrupted;
  report["warmup_seconds"] = warmup_s;
  report["workload"] = {{"prompts", n},           {"prompt_len", a.prompt_len}, {"gen_len", a.gen_len},
                        {"temperature", a.temperature}, {"top_k", a.top_k},      {"top_p", a.top_p}};
  if (!a.report.empty()) write_json_file(a.report, report);
  if (rs.offload) write_trace_file(a.offload, *rs.offload, std::cerr);
  std::cout << c.name << " " << a.prompt_len << "+" << a.gen_len << " x " << n << " sequences: "
            << report["tokens_per_s"].get<double>() << " tok/s (prefill " << st.prefill_seconds << " s, decode "
            << st.decode_seconds << " s; block " << rs.runner->max_batch() << "; KV policy "
            << report["kv_policy"].get<std::string>() << ")" << (st.interrupted ? "; interrupted: the part that ran" : "")
            << "\n";
  if (rs.offload) {
    const auto& off = report["offload"];
    std::cout << "device: " << off["device"].get<std::string>() << "; KV " << off["kv_dtype"].get<std::string>()
              << ", activations " << off["activation_dtype"].get<std::string>() << "; " << off["policy"].dump() << "\n";
    std::cout << "bytes moved: " << off["bytes_moved"].dump() << "; KV " << off["kv_bytes_moved"].get<uint64_t>()
              << "; queue busy " << off["queue_busy_seconds"].dump() << " s; " << off["token_steps"].get<int64_t>()
              << " token steps, mean " << off["mean_step_seconds"].get<double>() << " s; overlap efficiency "
              << off["overlap_efficiency"].get<double>() << " (per step " << off["step_overlap_efficiency"].get<double>()
              << ")\n";
  }
  return st.interrupted ? kInterrupted : 0;
}

}  // namespace flexh2o::cli
