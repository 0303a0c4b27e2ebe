// bench_pipeline_plan: the planner's pipeline predictions for OPT-175B (dummy-weight preset) on
// 1, 2, 4 and 8 T4 machines against FlexGen's published distributed results. Source: FlexGen
// paper (Sheng et al., ICML 2023, arXiv 2303.06865), Sec. 6.1 Table 3: 4 GCP machines with one
// T4 each, prompt 512, 32 generated tokens, no compression — generation throughput (prefill +
// decode) FlexGen (1) 0.69, FlexGen (4) 2.33 tokens/s; decoding throughput (decode time only)
// 0.83 and 3.86. FlexGen publishes no 2- or 8-machine OPT-175B numbers ("-" below). Its 4-machine
// run (benchmark/flexgen/bench_175b_4x1.sh): --gpu-batch-size 40, --num-inner-iterations 4,
// --percent 0 100 0 100 0 100, --cpu (CPU attention), --comm-device cpu, layers split evenly.
// Rows: "searched" = plan_pipeline's own choice; "FlexGen's policy" = our cost model timing
// FlexGen's 4x1 policy on our engine (even split, 4 groups). Profile: configs/hardware/t4-paper.json,
// its stage_link gcp-t4-network (an assumption: see that file). Prints a table; --json FILE too.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/pipeline.h"

using namespace flexh2o;

namespace {

struct Published {
  int64_t gpus;
  double generation, decoding;  // tokens/s; < 0: not published
};
const Published kPublished[] = {{1, 0.69, 0.83}, {2, -1, -1}, {4, 2.33, 3.86}, {8, -1, -1}};

std::string num(double v, const char* fmt = "%.3g") {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// Our cost model timing a given policy on every stage of an even split with G groups.
PipelinePlan fixed_policy(const ModelShape& m, const HardwareProfile& hw, const Workload& w, int64_t S, int64_t G,
                          const Policy& p) {
  PipelinePlan plan;
  plan.bounds = even_bounds(m.config.n_layers, S);
  plan.groups = G;
  plan.block = p.block_size();
  PipelineTiming& t = plan.timing;
  t.groups = G;
  t.gen_len = w.gen_len;
  const StageLink link = hw.between_stages();
  for (int64_t s = 0; s < S; ++s) {
    CostModel cm(m.stage(plan.bounds[size_t(s) + 1] - plan.bounds[size_t(s)], s == 0, s == S - 1), hw, w);
    const Estimate e = cm.estimate(p);
    StagePlan sp;
    sp.estimate = e;
    sp.memory = cm.memory(p, G);
    plan.stages.push_back(sp);
    t.prefill_s.push_back(e.prefill_s);
    t.decode_s.push_back(e.decode_s / double(w.gen_len - 1));
    if (s + 1 < S) {
      t.prefill_hop_s.push_back(link.seconds(uint64_t(plan.block * w.prompt_len * m.config.hidden * 2)));
      t.decode_hop_s.push_back(link.seconds(uint64_t(plan.block * m.config.hidden * 2)));
    }
  }
  t.return_s = S > 1 ? link.seconds(uint64_t(plan.block) * 12) : 0;
  plan.wall_s = pipeline_wall_s(t);
  plan.throughput = double(G * plan.block * w.gen_len) / plan.wall_s;
  PipelineTiming pre = t;
  pre.gen_len = 1;
  plan.decode_throughput = double(G * plan.block * (w.gen_len - 1)) / (plan.wall_s - pipeline_wall_s(pre));
  plan.bubble = bubble_fraction(t);
  return plan;
}

bool fits(const PipelinePlan& p, const HardwareProfile& hw) {
  for (const StagePlan& s : p.stages)
    if (!hw.fits(s.memory)) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_pipeline_plan [--json FILE]\n");
      return 2;
    }
  }
  try {
    const std::filesystem::path cfg = FLEXH2O_SOURCE_CONFIGS;
    ModelConfig c = ModelConfig::from_file(cfg / "models" / "opt-175b.json");
    c.name = "opt-175b";
    const HardwareProfile hw = HardwareProfile::load(cfg / "hardware" / "t4-paper.json");
    const Workload w{512, 32, {}};
    const ModelShape m = ModelShape::from_config(c);
    Policy fg;  // bench_175b_4x1.sh
    fg.w_gpu_percent = 0, fg.w_cpu_percent = 100, fg.cache_gpu_percent = 0, fg.cache_cpu_percent = 100;
    fg.act_gpu_percent = 0, fg.act_cpu_percent = 100;
    fg.gpu_batch_size = 40, fg.num_gpu_batches = 1, fg.cpu_cache_compute = true;

    const StageLink link = hw.between_stages();
    std::printf("OPT-175B, prompt 512 + gen 32, fp16 (no compression), profile %s, stage link %s (%.3g GB/s, %.0f us)\n",
                hw.name.c_str(), link.name.c_str(), link.bandwidth / 1e9, link.latency * 1e6);
    std::printf("published: FlexGen paper (ICML 2023) Table 3, 4 GCP machines x 1 T4; '-' = not published\n\n");
    std::printf("%-5s %-17s %-24s %6s %7s %9s %9s %6s %9s %9s %6s\n", "GPUs", "policy", "bounds", "G", "bubble",
                "gen tok/s", "published", "ratio", "dec tok/s", "published", "ratio");
    nlohmann::json rows = nlohmann::json::array();
    for (const Published& pub : kPublished) {
      const int64_t S = pub.gpus;
      for (int which = 0; which < 2; ++which) {
        PipelinePlan p;
        std::string label;
        if (which == 0) {
          PipelineOptions o;
          o.stages = S;
          o.search.compress_weight = o.search.compress_cache = false;
          p = plan_pipeline(m, {hw}, w, o);
          label = "searched";
        } else {
          const int64_t G = S == 1 ? 1 : 4;
          p = fixed_policy(m, hw, w, S, G, fg);
          label = fits(p, hw) ? "FlexGen's 40x1" : "FlexGen's (OOM)";
        }
        std::string b;
        for (int64_t v : p.bounds) b += (b.empty() ? "" : ",") + std::to_string(v);
        const double rg = pub.generation > 0 ? p.throughput / pub.generation : -1;
        const double rd = pub.decoding > 0 ? p.decode_throughput / pub.decoding : -1;
        std::printf("%-5lld %-17s %-24s %6lld %7.3f %9s %9s %6s %9s %9s %6s\n", (long long)S, label.c_str(), b.c_str(),
                    (long long)p.groups, p.bubble, num(p.throughput).c_str(), num(pub.generation).c_str(),
                    num(rg, "%.2f").c_str(), num(p.decode_throughput).c_str(), num(pub.decoding).c_str(),
                    num(rd, "%.2f").c_str());
        if (which == 0)
          std::printf("      stage policies: %s (block %lld)\n", p.stages[0].estimate.policy.str().c_str(),
                      (long long)p.block);
        rows.push_back({{"gpus", S},
                        {"policy", label},
                        {"stage0_policy", p.stages[0].estimate.policy.str()},
                        {"bounds", p.bounds},
                        {"groups", p.groups},
                        {"block", p.block},
                        {"bubble", p.bubble},
                        {"generation_tokens_per_s", p.throughput},
                        {"decoding_tokens_per_s", p.decode_throughput},
                        {"published_generation", pub.generation > 0 ? nlohmann::json(pub.generation) : nlohmann::json()},
                        {"published_decoding", pub.decoding > 0 ? nlohmann::json(pub.decoding) : nlohmann::json()}});
      }
    }
    if (!json_out.empty()) std::ofstream(json_out) << rows.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline_plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
