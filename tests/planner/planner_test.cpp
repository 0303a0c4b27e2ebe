// The planner: the cost model's bytes per link equal what OffloadEngine counts (tiny-opt,
// tiny-llama and the MoE models, a grid of policies; a full cache capped at a sliding window), its placement and memory equal the
// engine's, a MoE's compute counts the chosen experts, the search
// respects every budget, infeasible requests and bad profiles fail with clear errors, and the
// t4-paper profile reproduces FlexGen's published cost-model anchors.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/cpu_device.h"
#include "engine/generate.h"
#include "engine/kv_evict.h"
#include "engine/offload_engine.h"
#include "engine/test_util.h"
#include "engine/policy_of.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "quick_profile.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {
using test::model_dir;

Policy make(const char* percent, int gbs, int ngb, bool cpu_attn, bool overlap = true) {
  Policy p = test::policy_of(percent, gbs, ngb, cpu_attn);
  p.overlap = overlap;
  return p;
}

// The H200 profile's capacities and rates, with the CPU device's activations (fp32) so that
// bytes compare with the engine on the CPU device.
HardwareProfile big_profile() {
  HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
  h.device = DeviceKind::kCpu;
  return h;
}

struct BytesCase {
  const char* model;
  const char* percent;
  int gbs, ngb;
  bool cpu_attn;
};

class PlannerBytes : public ::testing::TestWithParam<BytesCase> {};

// Runs one block of `w` through the engine and compares its counters with the cost model.
void expect_bytes_equal(const char* model_name, const Policy& policy, const Workload& w) {
  Model model = Model::load_dir(model_dir(model_name));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = policy;
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  std::vector<GenerationRequest> reqs(size_t(o.policy.block_size()));
  for (auto& r : reqs) {
    r.prompt_ids.assign(size_t(w.prompt_len), 100);
    r.max_new_tokens = w.gen_len;
    r.sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  CostModel cm(ModelShape::from_model(model), big_profile(), w);
  const auto want = eng.report().bytes;
  const auto got = cm.bytes(o.policy);
  for (int l = 0; l < kNumLinks; ++l)
    EXPECT_EQ(got[size_t(l)], want[size_t(l)]) << link_name(Link(l)) << " for " << o.policy.str();
  const Estimate e = cm.estimate(o.policy);
  EXPECT_EQ(e.bytes, got);
  EXPECT_GT(e.throughput, 0);
}

TEST_P(PlannerBytes, EqualTheEngineCounters) {
  const BytesCase& bc = GetParam();
  Workload w;
  w.prompt_len = 7;
  w.gen_len = 5;
  expect_bytes_equal(bc.model, make(bc.percent, bc.gbs, bc.ngb, bc.cpu_attn), w);
}

// A streamed token table moves only a step's rows, unless the step has at least vocab rows
// (8 x 520 > tiny-opt's 4096): then the prefill moves the whole table.
TEST(PlannerBytesEmbedding, WholeTableWhenAStepHasVocabRows) {
  Workload w;
  w.prompt_len = 520;
  w.gen_len = 2;
  for (const char* percent : {"0 0 100 0 100 0", "0 100 100 0 100 0"})
    expect_bytes_equal("tiny-opt", make(percent, 4, 2, false), w);
  ModelShape m = ModelShape::from_model(Model::load_dir(model_dir("tiny-opt")));
  const Policy disk = make("0 0 100 0 100 0", 4, 2, false);
  const uint64_t table = m.embed[m.token_index], row = table / uint64_t(m.config.vocab_size);
  EXPECT_EQ(embed_moved(m, disk, 3)[2] - embed_moved(m, disk, 1)[2], 2 * row);
  EXPECT_EQ(embed_moved(m, disk, 4096)[2], embed_moved(m, disk, 100000)[2]);
  EXPECT_GE(embed_moved(m, disk, 4096)[2], table);
}

INSTANTIATE_TEST_SUITE_P(Policies, PlannerBytes,
                         ::testing::Values(BytesCase{"tiny-opt", "0 100 0 100 100 0", 2, 2, false},
                                           BytesCase{"tiny-opt", "0 100 0 100 100 0", 2, 2, true},
                                           BytesCase{"tiny-opt", "20 30 0 50 0 100", 2, 2, false},
                                           BytesCase{"tiny-opt", "0 50 0 0 0 100", 4, 2, true},
                                           BytesCase{"tiny-opt", "100 0 34 33 100 0", 3, 3, false},
                                           BytesCase{"tiny-opt", "100 0 34 33 0 100", 3, 3, true},
                                           BytesCase{"tiny-opt", "0 0 0 0 100 0", 3, 1, false},
                                           BytesCase{"tiny-opt", "100 0 100 0 100 0", 2, 3, false},
                                           BytesCase{"tiny-llama", "30 30 100 0 100 0", 2, 2, false},
                                           BytesCase{"tiny-llama", "0 0 0 100 0 100", 3, 2, true},
                                           BytesCase{"tiny-llama", "50 0 34 33 100 0", 2, 3, false},
                                           BytesCase{"tiny-llama", "0 0 0 0 100 0", 3, 1, false},
                                           BytesCase{"tiny-llama", "0 100 0 0 0 100", 1, 2, true},
                                           BytesCase{"arch/mixtral", "30 30 100 0 100 0", 2, 2, false},
                                           BytesCase{"arch/qwen3_moe", "0 0 0 100 0 100", 3, 2, true},
                                           BytesCase{"arch/qwen2_moe", "0 50 0 100 100 0", 2, 2, false}));

// With a KV policy the engine keeps min(len, budget - 1) rows per sequence: prefill stores the
// kept rows, each decode step loads them and stores one row per (sequence, KV head).
struct KvBytesCase {
  const char* model;
  const char* percent;
  int gbs, ngb;
  bool cpu_attn;
  KvPolicyKind kind;
  int64_t heavy, recent;  // budgets in tokens (h2o: both; local: recent)
  int64_t prompt, gen;
};

class PlannerKvBytes : public ::testing::TestWithParam<KvBytesCase> {};

TEST_P(PlannerKvBytes, EqualTheEngineCounters) {
  const KvBytesCase& bc = GetParam();
  Model model = Model::load_dir(model_dir(bc.model));
  CpuDevice dev(2);
  test::TempDir dir;
  KvPolicyConfig kc;
  kc.kind = bc.kind;
  if (bc.kind == KvPolicyKind::kH2o) kc.heavy_budget = bc.heavy;
  kc.recent_budget = bc.recent;
  const auto policy = make_policy(kc);
  OffloadOptions o;
  o.policy = make(bc.percent, bc.gbs, bc.ngb, bc.cpu_attn);
  o.offload_dir = dir.path();
  o.kv_policy = policy.get();
  OffloadEngine eng(model, dev, o);
  Workload w;
  w.prompt_len = bc.prompt;
  w.gen_len = bc.gen;
  w.kv = kc;
  std::vector<GenerationRequest> reqs(size_t(o.policy.block_size()));
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int64_t t = 0; t < w.prompt_len; ++t) reqs[i].prompt_ids.push_back(int32_t(100 + 7 * t + int64_t(i)));
    reqs[i].max_new_tokens = w.gen_len;
    reqs[i].sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  CostModel cm(ModelShape::from_model(model), big_profile(), w);
  EXPECT_EQ(cm.kv_keep(), std::min(bc.prompt + bc.gen, bc.heavy + bc.recent - 1));
  const OffloadReport rep = eng.report();
  const auto got = cm.bytes(o.policy);
  for (int l = 0; l < kNumLinks; ++l)
    EXPECT_EQ(got[size_t(l)], rep.bytes[size_t(l)]) << link_name(Link(l)) << " for " << o.policy.str() << " "
                                                    << describe(kc);
  // The memory too, the policy's per-slot state included.
  for (int t = 1; t < 3; ++t)
    EXPECT_EQ(cm.memory(o.policy)[size_t(t)], rep.peak[size_t(t)])
        << tier_name(Tier(t)) << " for " << o.policy.str() << " " << describe(kc) << "\n"
        << cm.memory_breakdown(o.policy);
  // Without the policy the cache grows to prompt+gen: strictly more KV bytes when anything is offloaded.
  Workload full = w;
  full.kv.reset();
  CostModel cf(ModelShape::from_model(model), big_profile(), full);
  const auto fb = cf.bytes(o.policy);
  if (o.policy.cache_gpu_percent < 100 && !bc.cpu_attn) {
    EXPECT_LT(got[size_t(Link::kHostToDevice)], fb[size_t(Link::kHostToDevice)]);
  }
  const Estimate e = cm.estimate(o.policy);
  EXPECT_EQ(e.bytes, got);
  EXPECT_EQ(e.kv_tokens, cm.kv_keep());
  EXPECT_GT(e.throughput, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PlannerKvBytes,
    ::testing::Values(
        // h2o, prompt longer than the budget: prefill evicts, every decode step evicts.
        KvBytesCase{"tiny-opt", "0 100 0 100 100 0", 2, 2, false, KvPolicyKind::kH2o, 3, 2, 12, 6},
        KvBytesCase{"tiny-opt", "0 100 0 100 100 0", 2, 2, true, KvPolicyKind::kH2o, 3, 2, 12, 6},
        KvBytesCase{"tiny-opt", "20 30 0 50 0 100", 2, 2, false, KvPolicyKind::kH2o, 2, 2, 12, 6},
        KvBytesCase{"tiny-opt", "0 50 0 0 0 100", 4, 2, true, KvPolicyKind::kH2o, 3, 3, 12, 6},
        KvBytesCase{"tiny-opt", "100 0 34 33 100 0", 3, 3, false, KvPolicyKind::kH2o, 3, 2, 12, 6},
        KvBytesCase{"tiny-opt", "100 0 100 0 100 0", 2, 3, false, KvPolicyKind::kH2o, 3, 2, 12, 6},
        // budget above the prompt: the cache grows first, then evicts.
        KvBytesCase{"tiny-opt", "0 100 0 0 100 0", 2, 2, false, KvPolicyKind::kH2o, 4, 6, 7, 8},
        KvBytesCase{"tiny-opt", "0 100 34 33 0 100", 3, 2, true, KvPolicyKind::kLocal, 0, 9, 7, 8},
        KvBytesCase{"tiny-opt", "0 0 0 0 100 0", 3, 1, false, KvPolicyKind::kLocal, 0, 5, 12, 6},
        KvBytesCase{"tiny-llama", "30 30 0 100 100 0", 2, 2, false, KvPolicyKind::kH2o, 3, 2, 12, 6},
        KvBytesCase{"tiny-llama", "0 0 0 100 0 100", 3, 2, true, KvPolicyKind::kH2o, 3, 2, 12, 6},
        KvBytesCase{"tiny-llama", "50 0 34 33 100 0", 2, 3, false, KvPolicyKind::kH2o, 4, 6, 7, 8},
        KvBytesCase{"tiny-llama", "0 0 0 0 100 0", 3, 1, false, KvPolicyKind::kLocal, 0, 5, 12, 6},
        KvBytesCase{"tiny-llama", "0 100 0 0 0 100", 1, 2, true, KvPolicyKind::kLocal, 0, 9, 7, 8}));

// The offloading engine on the CPU device under policy p (and a KV policy, or none), after a
// greedy run of n prompts of w.prompt_len synthetic ids below `vocab`, w.gen_len tokens each
// with EOS ignored: the run whose bytes and memory the planner predicts.
struct EngineRun {
  OffloadReport report;
  int64_t window_cap = 0;
};
EngineRun run_synthetic(const Model& model, const Policy& p, const KvPolicy* kv, const Workload& w, int64_t n,
                        int32_t vocab) {
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = p;
  o.offload_dir = dir.path();
  o.kv_policy = kv;
  OffloadEngine eng(model, dev, o);
  std::vector<GenerationRequest> reqs(static_cast<size_t>(n));
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int64_t t = 0; t < w.prompt_len; ++t) reqs[i].prompt_ids.push_back(int32_t((3 + 5 * t + int64_t(i)) % vocab));
    reqs[i].max_new_tokens = w.gen_len;
    reqs[i].sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  return {eng.report(), eng.window_cap()};
}

// The full cache of a model whose every layer slides, past the window (arch/mistral: window 20,
// 24 + 12 tokens): the planner prices what the run does (window_kv_policy's `local` at 20), so
// its bytes per link and memory equal the engine's, and the same shapes without a window grow
// the cache to prompt + gen.
TEST(PlannerWindow, AFullCachePastAnAllSlidingWindowIsPricedAtTheWindow) {
  Model model = Model::load_dir(model_dir("arch/mistral"));
  Workload w;
  w.prompt_len = 24;
  w.gen_len = 12;
  const KvPolicyConfig kc = window_kv_policy(model.config(), KvPolicyConfig{}, w.prompt_len + w.gen_len);
  ASSERT_EQ(kc.kind, KvPolicyKind::kLocal);
  const auto policy = make_policy(kc);
  const Policy p = make("0 100 0 100 100 0", 2, 2, false);
  const OffloadReport rep = run_synthetic(model, p, policy.get(), w, p.block_size(), 128).report;
  CostModel cm(ModelShape::from_model(model), big_profile(), w);  // w.kv unset: the full cache
  EXPECT_EQ(cm.kv_keep(), model.config().sliding_window - 1);
  const auto got = cm.bytes(p);
  for (int l = 0; l < kNumLinks; ++l) EXPECT_EQ(got[size_t(l)], rep.bytes[size_t(l)]) << link_name(Link(l));
  EXPECT_EQ(cm.memory(p)[1], rep.peak[1]) << "host";
  ModelShape unslid = ModelShape::from_model(model);
  unslid.config.sliding_window = 0;
  unslid.config.sliding_layers.clear();
  CostModel cf(unslid, big_profile(), w);
  EXPECT_EQ(cf.kv_keep(), w.prompt_len + w.gen_len);
  EXPECT_LT(cm.memory(p)[1], cf.memory(p)[1]);
}

// The full cache of a model where only some layers slide (arch/gemma2: window 20, one sliding
// and one full layer; 24 + 12 tokens): the engine caps the sliding layer at the window
// (full_cache_window), and the planner prices the same: its bytes per link, and the host's and
// the disk's memory, equal the engine's with the KV cache on the host, on the disk, or split.
TEST(PlannerWindow, MixedSlidingLayersArePricedAsTheEngineRunsThem) {
  Model model = Model::load_dir(model_dir("arch/gemma2"));
  Workload w;
  w.prompt_len = 24;
  w.gen_len = 12;
  CostModel cm(ModelShape::from_model(model), big_profile(), w);
  ASSERT_EQ(cm.window_cap(), model.config().sliding_window);
  EXPECT_EQ(cm.kv_keep(), w.prompt_len + w.gen_len) << "the full layer keeps everything";
  for (const char* percent :
       {"100 0 0 100 100 0", "100 0 0 0 100 0", "100 0 50 50 100 0", "100 0 0 100 0 100", "0 100 0 100 100 0"}) {
    const Policy p = make(percent, 2, 2, false);
    const EngineRun run = run_synthetic(model, p, nullptr, w, p.block_size(), 128);
    ASSERT_EQ(run.window_cap, model.config().sliding_window) << percent;
    const OffloadReport& rep = run.report;
    const auto got = cm.bytes(p);
    for (int l = 0; l < kNumLinks; ++l)
      EXPECT_EQ(got[size_t(l)], rep.bytes[size_t(l)]) << percent << " " << link_name(Link(l));
    const auto mem = cm.memory(p);
    for (int t = 1; t < 3; ++t) EXPECT_EQ(mem[size_t(t)], rep.peak[size_t(t)]) << percent << " " << tier_name(Tier(t));
  }
}

// A tied lm_head shares the embedding's home on the device or the host (the engine keeps one
// copy), so the placement and the planner count the table once there; on the disk it is a file
// of its own. The memory predicted is the engine's peak on each tier.
TEST(PlannerPlacement, ATiedHeadSharesTheEmbeddingsHome) {
  for (const char* name : {"tiny-opt", "arch/gemma"}) {
    Model model = Model::load_dir(model_dir(name));
    ASSERT_TRUE(model.config().tie_embeddings) << name;
    Workload w;
    w.prompt_len = 12;
    w.gen_len = 4;
    CostModel cm(ModelShape::from_model(model), big_profile(), w);
    for (const char* percent : {"100 0 100 0 100 0", "0 100 0 100 100 0", "0 0 0 100 100 0"}) {
      const Policy p = make(percent, 2, 1, false);
      const OffloadReport rep = run_synthetic(model, p, nullptr, w, 2, 64).report;
      const auto mem = cm.memory(p);
      for (int t = 0; t < 3; ++t)
        EXPECT_EQ(mem[size_t(t)], rep.peak[size_t(t)]) << name << " [" << percent << "] " << tier_name(Tier(t));
    }
  }
}

TEST(PlannerPlacement, UnitsAndMemoryEqualTheEngine) {
  for (const char* name : {"tiny-opt", "tiny-llama", "arch/mixtral", "arch/qwen3_moe", "arch/qwen2_moe"}) {
    Model model = Model::load_dir(model_dir(name));
    const ModelShape from_model = ModelShape::from_model(model);
    const ModelShape from_config = ModelShape::from_config(model.config());
    CpuDevice dev(2);
    for (bool sep : {true, false}) {
      for (const KvPolicyKind kind : {KvPolicyKind::kFull, KvPolicyKind::kH2o}) {
        Workload w;
        w.prompt_len = 33;
        w.gen_len = 9;
        KvPolicyConfig kc;
        kc.kind = kind;
        kc.heavy_budget = 5, kc.recent_budget = 4;
        if (kind != KvPolicyKind::kFull) w.kv = kc;
        CostModel cm(from_model, big_profile(), w);
        for (const char* pct : {"0 100 0 100 100 0", "20 30 0 50 0 100", "55 25 34 33 100 0", "0 0 0 0 100 0"}) {
          for (int gbs : {1, 3, 8}) {
            Policy p = make(pct, gbs, 2, false);
            p.sep_layer = sep;
            const WeightPlacement wp = place_weights(model, p);
            auto tiers = [](const UnitPlacement& u) { return std::array<uint64_t, 3>{u.bytes[0], u.bytes[1], u.bytes[2]}; };
            EXPECT_EQ(place_unit(from_model.embed, p), tiers(wp.units[0]));
            EXPECT_EQ(sep ? place_unit(from_model.attn, p) : whole_layer_bytes(from_model.attn, from_model.mlp, p).tier,
                      tiers(wp.units[1]))
                << name << " " << pct;
            if (sep) {
              EXPECT_EQ(place_unit(from_model.mlp, p), tiers(wp.units[2])) << name << " " << pct;
            }
            EXPECT_EQ(place_unit(from_model.head, p), tiers(wp.units.back())) << name << " " << pct;
            // The memory the planner predicts is the plan the engine allocates by.
            OffloadOptions o;
            o.policy = p;
            const auto kvp = w.kv ? make_policy(*w.kv) : nullptr;
            BatchDims d;
            d.rows = w.prompt_len, d.capacity = w.prompt_len + w.gen_len;
            d.kv_policy = kvp != nullptr, d.scores = kvp && kvp->needs_scores();
            if (kvp) d.budget_max = kvp->budget(w.prompt_len).total();
            const MemoryPlan plan = offload_memory_plan(model, dev, o, d);
            EXPECT_EQ(cm.memory(p), plan.bytes) << name << " " << pct << " sep " << sep;
          }
        }
      }
    }
    EXPECT_EQ(from_config.layer.size(), from_model.layer.size());
    EXPECT_EQ(from_config.attn.size() + from_config.mlp.size(), from_model.layer.size());
    EXPECT_EQ(from_config.head.size(), from_model.head.size());
  }
}

// A MoE row costs its chosen experts' FLOPs: with everything on the device, 8 experts of which
// 2 run prefill in the time of 2 dense-sized experts (the router aside), and taking all 8 costs
// more by the MLP's share.
TEST(PlannerMoe, PrefillComputeCountsTheChosenExperts) {
  auto prefill = [](int64_t experts, int64_t chosen) {
    ModelConfig c =
        ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "mixtral-8x7b.json");
    c.n_layers = 2, c.n_experts = experts, c.experts_per_token = chosen;
    HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
    CostModel cm(ModelShape::from_config(c), h, Workload{512, 8, {}});
    return cm.estimate(make("100 0 100 0 100 0", 8, 1, false)).prefill_s;
  };
  const double sparse = prefill(8, 2), dense_sized = prefill(2, 2), all = prefill(8, 8);
  EXPECT_NEAR(sparse, dense_sized, 0.02 * dense_sized);
  EXPECT_GT(all, 2.0 * sparse);
}

HardwareProfile small_profile(double dev_mb, double host_mb, double disk_mb) {
  HardwareProfile h = big_profile();
  h.name = "small";
  h.device_memory = dev_mb * 1e6;
  h.host_memory = host_mb * 1e6;
  h.disk_memory = disk_mb * 1e6;
  h.usable_fraction = 1;
  return h;
}

TEST(PlannerSearch, NeverViolatesABudget) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  Workload w;
  w.prompt_len = 64;
  w.gen_len = 16;
  for (auto [d, h, k] : {std::tuple{8.0, 64.0, 1000.0}, {7.0, 12.0, 1000.0}, {12.0, 6.0, 100.0}, {200.0, 200.0, 0.0}}) {
    CostModel cm(ModelShape::from_model(model), small_profile(d, h, k), w);
    SearchOptions so;
    so.gpu_batch_sizes = {1, 2, 4, 8, 16, 32};
    so.max_num_gpu_batches = 16;
    const PlanResult r = search_policy(cm, so);
    EXPECT_GT(r.evaluated, 0);
    const auto m = cm.memory(r.best.policy);
    for (int t = 0; t < 3; ++t)
      EXPECT_LE(double(m[size_t(t)]), cm.hardware().usable(t)) << "tier " << t << " " << r.best.policy.str();
    EXPECT_TRUE(r.best.fits);
    EXPECT_NO_THROW(r.best.policy.validate());
  }
}

// A shared pool (the CPU device's measured profile): device and host together stay within the
// host's capacity; the same capacities counted as two pools would place more than that.
TEST(PlannerSearch, ASharedPoolBoundsDeviceAndHostTogether) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  Workload w;
  w.prompt_len = 64;
  w.gen_len = 16;
  HardwareProfile h = small_profile(5.0, 5.0, 1000.0);
  SearchOptions so;
  so.gpu_batch_sizes = {1, 2, 4, 8, 16, 32};
  so.max_num_gpu_batches = 16;
  so.allow_disk = true;
  CostModel apart(ModelShape::from_model(model), h, w);
  const auto two = apart.memory(search_policy(apart, so).best.policy);
  EXPECT_GT(double(two[0] + two[1]), 5e6) << "two pools of 5 MB must place more than 8 MB, or this checks nothing";
  h.shared_memory = true;
  CostModel shared(ModelShape::from_model(model), h, w);
  const PlanResult r = search_policy(shared, so);
  const auto m = shared.memory(r.best.policy);
  EXPECT_LE(double(m[0] + m[1]), 5e6) << r.best.policy.str();
  EXPECT_TRUE(r.best.fits);
  EXPECT_FALSE(shared.estimate(search_policy(apart, so).best.policy).fits);
  EXPECT_TRUE(HardwareProfile::from_json(h.to_json(), "round trip").shared_memory);
}

// `flexh2o profile` (and --policy auto without --hardware) measures MemAvailable, which other
// processes share: a search on a measured profile leaves a fifth of it free, where a profile
// that let it fill everything would take more.
TEST(PlannerSearch, AMeasuredProfileLeavesAFifthOfTheMemoryFree) {
  CpuDevice dev(1);
  const ProfileOptions o = test::quick_profile_options();
  const HardwareProfile measured = measure_profile(dev, o);
  HardwareProfile h = big_profile();  // fixed speeds: measured ones (and the policy) vary with load
  h.usable_fraction = measured.usable_fraction, h.shared_memory = measured.shared_memory;
  h.device_memory = h.host_memory = 40e6;  // tiny-opt's scale: a search can fill it
  Model model = Model::load_dir(model_dir("tiny-opt"));
  Workload w;
  w.prompt_len = 64;
  w.gen_len = 16;
  SearchOptions so;
  so.gpu_batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  so.max_num_gpu_batches = 32;
  so.compress_weight = so.compress_cache = false;
  auto used = [&](const HardwareProfile& p) {
    CostModel cm(ModelShape::from_model(model), p, w);
    const auto m = cm.memory(search_policy(cm, so).best.policy);
    return double(m[0] + m[1]);
  };
  EXPECT_LE(used(h), 0.8 * 40e6);
  HardwareProfile all = h;
  all.usable_fraction = 1;
  EXPECT_GT(used(all), 0.8 * 40e6) << "the whole pool would be filled past the fraction, or this checks nothing";
}

TEST(PlannerSearch, AllOnDeviceWhenEverythingFits) {
  CostModel cm(ModelShape::from_config(Model::load_dir(model_dir("tiny-opt")).config()), big_profile(), Workload{64, 16, {}});
  SearchOptions so;
  so.gpu_batch_sizes = {4, 8};
  so.max_num_gpu_batches = 4;
  const Policy p = search_policy(cm, so).best.policy;
  EXPECT_EQ(p.w_gpu_percent, 100);
  EXPECT_EQ(p.cache_gpu_percent, 100);
}

// The outright-infeasible check takes the least any placement needs: weights resident on the
// device need no streaming buffers, so a shared-memory machine (the CPU device) whose RAM holds
// them once, but not with the buffers of streaming them from the host, runs them resident
// (opt-125m: the check used to refuse it). Short of even that, the message says what 4 bits need.
TEST(PlannerSearch, TheLeastAPlacementNeedsDecidesFeasibility) {
  ModelConfig c = ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "opt-125m.json");
  c.name = "opt-125m";
  const Workload w{16, 4, {}};
  auto need = [&](const HardwareProfile& h, int w_gpu, bool q4) {
    Policy p = test::policy_of(w_gpu ? "100 0 0 0 100 0" : "0 100 0 0 100 0", 1, 1, false);
    p.compress_weight = p.compress_cache = q4;
    const auto m = CostModel(ModelShape::from_config(c), h, w).memory(p);
    return double(m[0] + m[1] + m[2]);
  };
  HardwareProfile h = small_profile(0, 0, 1);
  h.shared_memory = true;
  const double resident = need(h, 100, false), streamed = need(h, 0, false);
  ASSERT_LT(resident, streamed - 1e6);
  h.device_memory = h.host_memory = (resident + streamed) / 2;
  SearchOptions full;
  full.compress_weight = full.compress_cache = false;
  CostModel cm(ModelShape::from_config(c), h, w);
  EXPECT_EQ(search_policy(cm, full).best.policy.w_gpu_percent, 100);
  h.device_memory = h.host_memory = (need(h, 100, true) + resident) / 2;
  CostModel small(ModelShape::from_config(c), h, w);
  try {
    search_policy(small, full);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4-bit weights and KV cache"), std::string::npos) << e.what();
  }
}

TEST(PlannerSearch, InfeasibleStatesTheShortfall) {
  ModelConfig c = ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "opt-175b.json");
  c.name = "opt-175b";
  // 90 GB in all: short even of the 4-bit weights (~98 GB), which the h200 profile may choose.
  CostModel cm(ModelShape::from_config(c), small_profile(16e3, 64e3, 10e3), Workload{512, 32, {}});
  try {
    search_policy(cm);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("infeasible"), std::string::npos) << m;
    EXPECT_NE(m.find("short by"), std::string::npos) << m;
    EXPECT_NE(m.find("opt-175b"), std::string::npos) << m;
  }
  // Without a disk (no offload directory) the disk counts for nothing and the smallest run homes
  // everything on the host: the message names the shortfall and the way to a disk, whether the
  // tiers are short together (OPT-175B here) or no policy fits them (tiny-opt: 2 MB of host).
  SearchOptions no_disk;
  no_disk.allow_disk = false;
  no_disk.compress_weight = no_disk.compress_cache = false;
  CostModel tiny(ModelShape::from_config(Model::load_dir(model_dir("tiny-opt")).config()), small_profile(2.6, 13.4, 10e3),
                 Workload{64, 16, {}});
  for (CostModel* m_ : {&cm, &tiny}) {
    try {
      search_policy(*m_, no_disk);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("short by"), std::string::npos) << m;
      EXPECT_NE(m.find("needs an offload directory (--offload-dir)"), std::string::npos) << m;
      if (m_ == &tiny) {
        EXPECT_NE(m.find("everything offloaded to the host: no disk is allowed)"), std::string::npos) << m;
      }
    }
  }
  EXPECT_NO_THROW(search_policy(tiny));  // with the disk
}

TEST(PlannerAnchors, FlexGenReferenceOnT4Paper) {
  const std::filesystem::path cfg = FLEXH2O_SOURCE_CONFIGS;
  const HardwareProfile t4 = HardwareProfile::load(cfg / "hardware" / "t4-paper.json");
  const ModelConfig c = ModelConfig::from_file(cfg / "models" / "opt-30b.json");
  // PAPERS.md §9.1: 20/80 weights, KV + activations on CPU, 48 x 3, CPU attention: measured 7.32.
  const double fg = flexgen_reference_throughput(c, t4, Workload{512, 32, {}}, make("20 80 0 100 0 100", 48, 3, true));
  EXPECT_GT(fg, 6.0);
  EXPECT_LT(fg, 9.0);
  // H2O 10% + 10%, 0/100 weights, 52 x 14: measured 12.66.
  KvPolicyConfig kv;
  kv.kind = KvPolicyKind::kH2o;
  kv.heavy_ratio = 0.1;
  kv.recent_ratio = 0.1;
  const double h2o = flexgen_reference_throughput(c, t4, Workload{512, 32, kv}, make("0 100 0 100 0 100", 52, 14, true));
  EXPECT_GT(h2o, 9.0);
  EXPECT_LT(h2o, 18.0);
}

// With f16 KV and attention / MLP as separate units, the papers' own OPT-30B policies fit the
// T4 machine by our memory model, as they ran there (PAPERS.md §9.1).
TEST(PlannerAnchors, PaperPoliciesFitOnT4Paper) {
  const std::filesystem::path cfg = FLEXH2O_SOURCE_CONFIGS;
  const HardwareProfile t4 = HardwareProfile::load(cfg / "hardware" / "t4-paper.json");
  ModelConfig c = ModelConfig::from_file(cfg / "models" / "opt-30b.json");
  c.name = "opt-30b";
  CostModel flexgen(ModelShape::from_config(c), t4, Workload{512, 32, {}});
  const Estimate f = flexgen.estimate(make("20 80 0 100 0 100", 48, 3, true));
  EXPECT_TRUE(f.fits) << f.memory_note << "\n" << flexgen.memory_breakdown(f.policy);
  KvPolicyConfig kv;
  kv.kind = KvPolicyKind::kH2o;
  kv.heavy_ratio = 0.1;
  kv.recent_ratio = 0.1;
  // H2O's 52 x 14 block with 20% of the cache: within the machine's 208 GB of host memory,
  // though just over FlexGen's planning fraction (0.8) of it.
  CostModel h2o(ModelShape::from_config(c), t4, Workload{512, 32, kv});
  const Estimate e = h2o.estimate(make("0 100 0 100 0 100", 52, 14, true));
  EXPECT_LE(double(e.memory[1]), t4.host_memory) << h2o.memory_breakdown(e.policy);
  EXPECT_LE(double(e.memory[0]), t4.usable(0)) << h2o.memory_breakdown(e.policy);
  // Whole layers (FlexGen's search picks sep_layer false) place each half as FlexGen does, so the
  // 20/80 policy still fits.
  Policy whole = make("20 80 0 100 0 100", 48, 3, true);
  whole.sep_layer = false;
  const Estimate w = flexgen.estimate(whole);
  EXPECT_TRUE(w.fits) << w.memory_note << "\n" << flexgen.memory_breakdown(w.policy);
}

}  // namespace
}  // namespace flexh2o
