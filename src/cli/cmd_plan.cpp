// `flexh2o plan`: predicts our engine's throughput for a model on a hardware profile — the
// best policy found by the search, or the one given with --percent/--gpu-batch-size/... —
// with memory per tier, bytes per link, 4-bit compression (searched when the profile prices
// dequantization, or given), the bottleneck, and FlexGen's own cost model beside it; with
// --pipeline-stages, a pipeline plan (per stage: layers, policy, memory, step times; then the
// job's throughput, the groups in flight and the bubble fraction).
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/kv_evict.h"
#include "planner/pipeline.h"
#include "planner/planner.h"

namespace flexh2o::cli {

void register_plan(CLI::App& app, PlanArgs& a) {
  CLI::App* s = app.add_subcommand("plan", "Predict throughput and pick a policy (cost model of this engine)");
  s->add_option("-m,--model", a.model, "Model directory or preset name (opt-6.7b, opt-30b, ...)")->required();
  s->add_option("--hardware", a.hardware, "Hardware profile file or name in configs/hardware (t4-paper, h200)")
      ->required();
  s->add_option("--prompt-len", a.prompt_len, "Prompt tokens per sequence")->capture_default_str()->check(at_least(1));
  s->add_option("--gen-len", a.gen_len, "Generated tokens per sequence")->capture_default_str()->check(at_least(1));
  add_kv_flags(s, a.kv);  // as generate takes them; each policy is priced at its budget
  s->add_option("--percent", a.percent, "Evaluate this placement: w_g w_c c_g c_c a_g a_c")->expected(6);
  s->add_option("--gpu-batch-size", a.gpu_batch_size, "With --percent")->check(at_least(1));
  s->add_option("--num-gpu-batches", a.num_gpu_batches, "With --percent")->check(at_least(1));
  s->add_flag("--cpu-cache-compute", a.cpu_cache_compute, "With --percent: decode attention on the host");
  s->add_option("--overlap", a.overlap, "Overlap transfers with compute (true|false)")
      ->capture_default_str()->check(flag_bool_check());
  s->add_option("--sep-layer", a.sep_layer,
                "Attention and MLP stream as separate units (true|false; placed alike either way)")
      ->capture_default_str()->check(flag_bool_check());
  s->add_flag("--compress-weight", a.compress_weight,
              "4-bit weights (FlexGen's flag): with --percent, evaluate it; without, fix it in the search");
  s->add_flag("--compress-cache", a.compress_cache,
              "4-bit KV cache (FlexGen's flag): with --percent, evaluate it; without, fix it in the search");
  s->add_flag("--allow-compress", a.allow_compress,
              "Let the search choose 4-bit weights / KV cache where the profile prices dequantization (lossy; "
              "--policy auto takes the same flag)");
  s->add_flag("--no-compress", a.no_compress, "Search without compression (the default)");
  s->add_option("--pipeline-stages", a.pipeline_stages,
                 "Plan a pipeline of this many stages (one rank and device each; layers split by the cost model)")
      ->check(at_least(1));
  s->add_option("--groups,--pipeline-groups", a.groups,
                "With --pipeline-stages: groups in flight (default: the fewest that hide the transfers)")
      ->check(at_least(1));
  s->add_option("--stage-link", a.stage_link,
                "With --pipeline-stages: link between stages, a name in configs/hardware/links or a file "
                "(default: the profile's stage_link)");
  s->add_option("--gpu-mem", a.gpu_mem, "Device memory instead of the profile's (e.g. 16GiB), as --policy auto takes it; the search keeps to "
                "the profile's usable_fraction of it, as of the profile's own")
      ->check(size_check("--gpu-mem"));
  s->add_option("--cpu-mem", a.cpu_mem, "Host memory instead of the profile's (its usable_fraction planned, too)")
      ->check(size_check("--cpu-mem"));
  s->add_option("--disk-mem", a.disk_mem, "Disk instead of the profile's (its usable_fraction planned, too)")
      ->check(size_check("--disk-mem"));
  s->add_flag("--json", a.json, "One JSON object on stdout");
}

namespace {

nlohmann::json estimate_json(const Estimate& e, const CostModel& cm) {
  nlohmann::json j;
  j["policy"] = policy_to_json(e.policy);
  j["policy_flags"] = e.policy.str();
  j["throughput_tokens_per_s"] = e.throughput;
  j["effective_batch"] = e.block;
  j["bottleneck"] = e.bottleneck;
  j["prefill_s"] = e.prefill_s;
  j["decode_s"] = e.decode_s;
  j["prefill_layer_s"] = e.prefill_layer_s;
  j["decode_layer_s"] = e.decode_layer_s;
  j["memory_bytes"] = {{"device", e.memory[0]}, {"host", e.memory[1]}, {"disk", e.memory[2]}};
  j["fits"] = e.fits;
  if (!e.fits) j["memory_note"] = e.memory_note;
  nlohmann::json b, busy;
  for (int l = 0; l < kNumLinks; ++l) b[link_name(Link(l))] = e.bytes[size_t(l)];
  for (int q = 0; q < kNumQueues; ++q) busy[queue_name(Queue(q))] = e.busy[size_t(q)];
  j["bytes_per_link"] = b;
  j["busy_s"] = busy;
  j["kv_tokens_per_sequence"] = e.kv_tokens;
  j["compression"] = {{"weight", e.policy.compress_weight},
                      {"cache", e.policy.compress_cache},
                      {"weight_bytes", cm.shape().weight_bytes(e.policy)},
                      {"weight_bytes_uncompressed", cm.shape().weight_bytes(Policy{})},
                      {"kv_bytes_per_token", cm.kv_token_bytes(e.policy)},
                      {"dequant_priced", cm.hardware().prices_compression()}};
  return j;
}

std::string gb(double bytes) {
  std::ostringstream os;
  os << std::setprecision(4) << bytes / 1e9 << " GB";
  return os.str();
}

int run_pipeline_plan(const PlanArgs& a, const Env& env, const ModelConfig& c, const HardwareProfile& hw,
                      const Workload& w) {
  if (!a.percent.empty())
    FH_FAIL("plan: --percent gives one policy; with --pipeline-stages each stage's policy is searched");
  PipelineOptions o;
  o.stages = a.pipeline_stages;
  o.groups = a.groups;
  o.search.overlap = parse_flag_bool(a.overlap, "--overlap");
  o.search.sep_layer = parse_flag_bool(a.sep_layer, "--sep-layer");
  search_compression(a.compress_weight, a.compress_cache, a.allow_compress, a.no_compress, o.search);
  if (!a.stage_link.empty()) o.link = resolve_stage_link(a.stage_link, env.configs_dir);
  const PipelinePlan p = plan_pipeline(c, {hw}, w, o);
  const StageLink link = p.links.empty() ? hw.between_stages() : p.links[0];
  if (a.json) {
    nlohmann::json j;
    j["model"] = c.name;
    j["model_shape"] = plan_model_shape(c);
    j["hardware"] = hw.name;
    j["prompt_len"] = w.prompt_len;
    j["gen_len"] = w.gen_len;
    j["kv_policy"] = w.kv ? describe(*w.kv) : "full";
    j["pipeline_stages"] = p.stages.size();
    j["bounds"] = p.bounds;
    j["groups"] = p.groups;
    j["groups_to_hide"] = p.groups_to_hide;
    j["groups_capped_by_memory"] = p.groups_capped;
    j["sequences_per_group"] = p.block;
    j["stage_link"] = link.to_json();
    j["bytes_between_stages_per_group_step"] = {
        {"prefill", p.prefill_hop_bytes}, {"decode", p.decode_hop_bytes}, {"token_ids_to_stage_0", p.return_bytes}};
    nlohmann::json st = nlohmann::json::array();
    for (const StagePlan& s : p.stages) {
      st.push_back({{"first_layer", s.first},
                    {"end_layer", s.end},
                    {"embedding", s.embed},
                    {"lm_head", s.head},
                    {"policy", policy_to_json(s.estimate.policy)},
                    {"policy_flags", s.estimate.policy.str()},
                    {"memory_bytes", {{"device", s.memory[0]}, {"host", s.memory[1]}, {"disk", s.memory[2]}}},
                    {"prefill_step_s", s.prefill_step_s},
                    {"decode_step_s", s.decode_step_s},
                    {"bottleneck", s.estimate.bottleneck}});
    }
    j["stages"] = st;
    j["wall_s"] = p.wall_s;
    j["throughput_tokens_per_s"] = p.throughput;
    j["decode_throughput_tokens_per_s"] = p.decode_throughput;
    j["bubble_fraction"] = p.bubble;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << std::setprecision(4) << "model      " << c.name << "\n"
            << "hardware   " << hw.name << " (every stage)\n"
            << "workload   prompt " << w.prompt_len << " + gen " << w.gen_len << ", KV "
            << (w.kv ? describe(*w.kv) : std::string("full")) << ", " << device_kind_name(hw.device) << " device\n"
            << "pipeline   " << p.stages.size() << " stages, " << p.groups << (p.groups == 1 ? " group" : " groups") << " in flight of " << p.block
            << " sequences (" << p.groups_to_hide << " hide the transfers and the fill"
            << (p.groups_capped ? "; memory holds fewer" : "") << ")\n"
            << "link       " << link.name << " (" << stage_link_kind_name(link.kind) << ", " << link.bandwidth / 1e9
            << " GB/s, " << link.latency * 1e6 << " us/message); per group step between stages: prefill "
            << gb(double(p.prefill_hop_bytes)) << ", decode " << gb(double(p.decode_hop_bytes)) << "\n";
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    std::cout << "stage " << i << "    layers " << s.first << ".." << s.end - 1 << " (" << s.end - s.first << ")"
              << (s.embed ? " + embedding" : "") << (s.head ? " + lm_head" : "") << "\n"
              << "           policy " << s.estimate.policy.str() << "\n"
              << "           memory device " << gb(double(s.memory[0])) << ", host " << gb(double(s.memory[1]))
              << ", disk " << gb(double(s.memory[2])) << " (" << p.groups << " groups)\n"
              << "           step   prefill " << s.prefill_step_s << " s, decode " << s.decode_step_s
              << " s per group; bottleneck " << s.estimate.bottleneck << "\n";
  }
  std::cout << "throughput " << p.throughput << " tokens/s (decode alone " << p.decode_throughput << " tokens/s; "
            << p.groups * p.block << " sequences x " << w.gen_len << " tokens in " << p.wall_s << " s)\n"
            << "bubble     " << p.bubble << " (predicted 1 - stage busy / wall, mean over stages)\n";
  return 0;
}

}  // namespace

int run_plan(const PlanArgs& a, const Env& env) {
  std::string source;
  ModelConfig c = resolve_config(env, a.model, &source);
  if (c.name.empty()) c.name = a.model;
  HardwareProfile hw = resolve_profile(a.hardware, env.configs_dir);
  cap_profile_memory(a.gpu_mem, a.cpu_mem, a.disk_mem, hw);
  check_workload_length(c, a.model, a.prompt_len, a.gen_len);
  if (a.percent.empty() && (a.gpu_batch_size != 0 || a.num_gpu_batches != 0 || a.cpu_cache_compute))
    FH_FAIL("--gpu-batch-size, --num-gpu-batches and --cpu-cache-compute evaluate a placement given with --percent; "
            "without it the planner searches them");
  Workload w;
  w.prompt_len = a.prompt_len;
  w.gen_len = a.gen_len;
  // As generate decides them: the checkpoint's dtype is the config's here (a preset has no other).
  w.kv_dtype = a.compress_cache ? compressed_kv_dtype(a.kv) : kv_cache_dtype(a.kv, c.dtype == DType::BF16);
  {  // validated for the full cache too: --heavy-ratio without --kv-policy h2o is a mistake, not a no-op
    const KvPolicyConfig kv = make_kv_config(a.kv);
    if (kv.kind != KvPolicyKind::kFull) w.kv = kv;
  }
  // As the run would (window_kv_policy): what the lines below print is what the planner prices.
  if (window_caps_full_cache(c, w.prompt_len + w.gen_len) && !w.kv)
    w.kv = window_kv_policy(c, KvPolicyConfig{}, w.prompt_len + w.gen_len);
  if (a.pipeline_stages > 0) return run_pipeline_plan(a, env, c, hw, w);
  if (a.groups != 0 || !a.stage_link.empty()) FH_FAIL("plan: --groups and --stage-link need --pipeline-stages");
  // Dummy presets use config.dtype; a checkpoint directory is planned with the same shapes.
  CostModel cm(ModelShape::from_config(c), hw, w);
  Estimate e;
  int64_t evaluated = 0;
  const bool given = !a.percent.empty();
  if (given) {
    Policy p;
    FH_CHECK(a.percent.size() == 6, "--percent takes 6 numbers, got ", a.percent.size());
    p.set_percent(std::span<const double, 6>(a.percent.data(), 6));
    if (a.gpu_batch_size > 0) p.gpu_batch_size = a.gpu_batch_size;
    if (a.num_gpu_batches > 0) p.num_gpu_batches = a.num_gpu_batches;
    p.cpu_cache_compute = a.cpu_cache_compute;
    p.overlap = parse_flag_bool(a.overlap, "--overlap");
    p.sep_layer = parse_flag_bool(a.sep_layer, "--sep-layer");
    p.compress_weight = a.compress_weight;
    p.compress_cache = a.compress_cache || w.kv_dtype == DType::Q4;
    e = cm.estimate(p);
  } else {
    SearchOptions so;
    so.overlap = parse_flag_bool(a.overlap, "--overlap");
    so.sep_layer = parse_flag_bool(a.sep_layer, "--sep-layer");
    search_compression(a.compress_weight, a.compress_cache, a.allow_compress, a.no_compress, so);
    PlanResult r = search_policy(cm, so);
    e = r.best;
    evaluated = r.evaluated;
  }
  // FlexGen's model has a dense FFN's weight bytes and FLOPs: a MoE's are neither.
  const std::optional<double> fg =
      c.moe() ? std::nullopt : std::optional<double>(flexgen_reference_throughput(c, hw, w, e.policy));
  if (a.json) {
    nlohmann::json j = estimate_json(e, cm);
    j["model"] = c.name;
    j["model_shape"] = plan_model_shape(c);
    j["hardware"] = hw.name;
    j["prompt_len"] = w.prompt_len;
    j["gen_len"] = w.gen_len;
    j["kv_policy"] = w.kv ? describe(*w.kv) : "full";
    j["kv_window_slots"] = cm.window_cap();  // the sliding layers' slots under a window cap, 0: none
    j["kv_dtype"] = dtype_name(kv_dtype_of(w, e.policy));
    j["device"] = device_kind_name(hw.device);
    j["searched"] = !given;
    j["policies_evaluated"] = evaluated;
    j["flexgen_cost_model_tokens_per_s"] = fg ? nlohmann::json(*fg) : nlohmann::json(nullptr);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << std::setprecision(4) << "model      " << c.name << " (" << source << ")\n"
            << "hardware   " << hw.name << "\n"
            << "workload   prompt " << w.prompt_len << " + gen " << w.gen_len << ", KV "
            << (w.kv ? describe(*w.kv) : std::string("full")) << " (" << e.kv_tokens << " tokens kept/sequence"
            << (cm.window_cap() ? "; " + std::to_string(count_sliding_layers(c)) + " sliding layers keep " +
                                      std::to_string(cm.window_cap())
                                : std::string()) << ", "
            << dtype_name(kv_dtype_of(w, e.policy)) << "), " << device_kind_name(hw.device) << " device\n"
            << "policy     " << e.policy.str() << (given ? "  (given)" : "  (searched, " + std::to_string(evaluated) + " policies timed)") << "\n"
            << "throughput " << e.throughput << " tokens/s (effective batch " << e.block << "; prefill " << e.prefill_s
            << " s, decode " << e.decode_s << " s)\n"
            << "per layer  prefill " << e.prefill_layer_s * 1e3 << " ms, decode " << e.decode_layer_s * 1e3 << " ms\n"
            << "compress   weight " << (e.policy.compress_weight ? "4-bit" : "off") << ", cache "
            << (e.policy.compress_cache ? "4-bit" : "off") << (hw.prices_compression() ? "" : given ? " (dequantization not priced by this profile)" : " (not searched: the profile has no dequant_gbps)")
            << "; weights " << double(cm.shape().weight_bytes(e.policy)) / 1e9 << " GB (uncompressed "
            << double(cm.shape().weight_bytes(Policy{})) / 1e9 << " GB), KV " << double(cm.kv_token_bytes(e.policy)) / 1e6
            << " MB/token\n"
            << "bottleneck " << e.bottleneck << "\n"
            << "memory     device " << double(e.memory[0]) / 1e9 << " GB, host " << double(e.memory[1]) / 1e9
            << " GB, disk " << double(e.memory[2]) / 1e9 << " GB; fits: "
            << (e.fits ? std::string("true") : "false (" + e.memory_note + ")") << "\n"
            << "link bytes ";
  for (int l = 0; l < kNumLinks; ++l) std::cout << link_name(Link(l)) << " " << double(e.bytes[size_t(l)]) / 1e9 << " GB  ";
  std::cout << "\nbusy       ";
  for (int q = 0; q < kNumQueues; ++q) std::cout << queue_name(Queue(q)) << " " << e.busy[size_t(q)] << " s  ";
  if (fg)
    std::cout << "\nFlexGen's published cost model for this policy: " << *fg
              << " tokens/s (FlexGen's scheduler; ours list-schedules our own queues and steps)\n";
  else
    std::cout << "\nFlexGen's published cost model: not shown (it models a dense FFN, not a mixture of experts)\n";
  return 0;
}

}  // namespace flexh2o::cli
