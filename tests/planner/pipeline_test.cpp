// Pipeline plans (planner/pipeline.h): the cost-balanced split against brute force (awkward S
// and layer counts), the pipeline formula's limits, groups growing with the link time, memory
// refusals naming the stage, and the hardware profile's stage_link parsing and presets.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "planner/pipeline.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
const fs::path kConfigs = FLEXH2O_SOURCE_CONFIGS;

// Every split of L layers into S non-empty stages.
void each_split(int64_t L, int64_t S, const std::function<void(const std::vector<int64_t>&)>& f) {
  std::vector<int64_t> b{0};
  std::function<void()> rec = [&] {
    const int64_t done = int64_t(b.size()) - 1;
    if (done == S - 1) {
      b.push_back(L);
      f(b);
      b.pop_back();
      return;
    }
    for (int64_t e = b.back() + 1; e <= L - (S - 1 - done); ++e) {
      b.push_back(e);
      rec();
      b.pop_back();
    }
  };
  rec();
}

double max_cost(const std::vector<int64_t>& b, const std::vector<double>& layer, const std::vector<double>& extra,
                const std::vector<double>& scale) {
  double m = 0;
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    double c = 0;
    for (int64_t i = b[s]; i < b[s + 1]; ++i) c += layer[size_t(i)];
    m = std::max(m, extra[s] + (scale.empty() ? 1.0 : scale[s]) * c);
  }
  return m;
}

void expect_valid_bounds(const std::vector<int64_t>& b, int64_t L, int64_t S) {
  ASSERT_EQ(int64_t(b.size()), S + 1);
  EXPECT_EQ(b.front(), 0);
  EXPECT_EQ(b.back(), L);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_GT(b[i], b[i - 1]) << "stage " << i - 1 << " is empty";
}

TEST(PipelineBalance, EqualsBruteForceOnSmallCases) {
  // Deterministic but uneven costs; S = 1, S = L, S not dividing L.
  for (int64_t L = 1; L <= 9; ++L) {
    std::vector<double> layer;
    for (int64_t i = 0; i < L; ++i) layer.push_back(1.0 + double((i * 7) % 5) * 0.37);
    for (int64_t S = 1; S <= L; ++S) {
      std::vector<double> extra(static_cast<size_t>(S), 0.0), scale;
      extra.front() += 0.8;  // the embedding
      extra.back() += 2.9;   // the head
      for (int64_t s = 0; s < S; ++s) scale.push_back(1.0 + 0.25 * double(s % 3));
      for (bool scaled : {false, true}) {
        const std::vector<double> sc = scaled ? scale : std::vector<double>{};
        double best = std::numeric_limits<double>::infinity();
        each_split(L, S, [&](const std::vector<int64_t>& b) { best = std::min(best, max_cost(b, layer, extra, sc)); });
        const std::vector<int64_t> got = balance_layers(layer, extra, sc);
        expect_valid_bounds(got, L, S);
        EXPECT_DOUBLE_EQ(max_cost(got, layer, extra, sc), best) << "L=" << L << " S=" << S << " scaled=" << scaled;
      }
    }
  }
}

TEST(PipelineBalance, TheHeadStageGetsFewerLayersWhenItCostsMore) {
  const std::vector<double> layer(10, 1.0);
  EXPECT_EQ(balance_layers(layer, {0, 0}), (std::vector<int64_t>{0, 5, 10}));
  EXPECT_EQ(balance_layers(layer, {0, 4}), (std::vector<int64_t>{0, 7, 10}));  // 7 vs 3 + 4
  EXPECT_EQ(balance_layers(std::vector<double>(11, 1.0), {2, 0, 2}), (std::vector<int64_t>{0, 3, 8, 11}));
  EXPECT_EQ(even_bounds(10, 3), (std::vector<int64_t>{0, 4, 7, 10}));
  EXPECT_EQ(even_bounds(4, 4), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(PipelineBalance, RefusesBadInput) {
  EXPECT_THROW(balance_layers({1, 1}, {0, 0, 0}), Error);  // more stages than layers
  EXPECT_THROW(balance_layers({1, 1}, {}), Error);
  EXPECT_THROW(balance_layers({1, -1}, {0}), Error);
  EXPECT_THROW(balance_layers({1, NAN}, {0}), Error);
  EXPECT_THROW(balance_layers({1, 1}, {0, 0}, {1}), Error);
  EXPECT_THROW(even_bounds(3, 0), Error);
  EXPECT_THROW(even_bounds(3, 4), Error);
  try {  // a user's --pipeline-stages: said as the flag, without a source location
    (void)even_bounds(3, 5);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--pipeline-stages must be in [1, 3] (one layer or more each: the model has 3 "
                                     "layers), got 5");
  }
}

PipelineTiming equal_stages(int64_t S, double c, int64_t G, int64_t T, double hop = 0, double ret = 0) {
  PipelineTiming t;
  t.prefill_s.assign(size_t(S), c);
  t.decode_s.assign(size_t(S), c);
  t.prefill_hop_s.assign(size_t(S - 1), hop);
  t.decode_hop_s.assign(size_t(S - 1), hop);
  t.return_s = ret;
  t.groups = G;
  t.gen_len = T;
  return t;
}

TEST(PipelineFormula, OneStageHasNoBubble) {
  for (int64_t G : {1, 2, 7}) {
    for (int64_t T : {1, 2, 32}) {
      PipelineTiming t = equal_stages(1, 0.5, G, T, 0, 3.0);  // a return time means nothing with S = 1
      t.prefill_s = {4.0};
      EXPECT_DOUBLE_EQ(bubble_fraction(t), 0) << "G=" << G << " T=" << T;
      EXPECT_DOUBLE_EQ(pipeline_wall_s(t), double(G) * (4.0 + double(T - 1) * 0.5));
    }
  }
}

TEST(PipelineFormula, EnoughGroupsLeaveOnlyTheFill) {
  for (int64_t S : {2, 3, 5}) {
    for (int64_t T : {2, 8, 32}) {
      EXPECT_EQ(groups_to_hide(equal_stages(S, 1.0, 1, T), 64), S);
      double last = 1;
      for (int64_t G = S; G <= 4096; G *= 2) {
        const double b = bubble_fraction(equal_stages(S, 1.0, G, T));
        // GPipe's fill over G x T micro-steps.
        EXPECT_NEAR(b, double(S - 1) / double(G * T + S - 1), 1e-12) << "S=" << S << " T=" << T << " G=" << G;
        EXPECT_LT(b, last);
        last = b;
      }
      EXPECT_LT(last, 1e-3);  // G -> large: the bubble -> 0
      // Too few groups: the round trip shows, above the fill alone.
      if (S > 1) {
        const double few = bubble_fraction(equal_stages(S, 1.0, 1, T));
        EXPECT_NEAR(few, 1 - 1.0 / double(S), 1e-12);  // one group: one stage works at a time
        EXPECT_GT(few, double(S - 1) / double(T + S - 1));
      }
    }
  }
}

// While a hop takes less than a stage's step (a slower link makes the link the bottleneck,
// which then needs fewer groups to stay busy).
TEST(PipelineFormula, GroupsGrowWithTheLinkTime) {
  int64_t last = 0;
  bool grew = false;
  for (double hop : {0.0, 0.01, 0.1, 0.3, 0.6, 0.9}) {
    const int64_t g = groups_to_hide(equal_stages(4, 1.0, 1, 32, hop, hop / 10), 64);
    EXPECT_GE(g, last) << "hop " << hop;
    grew |= last > 0 && g > last;
    last = g;
    // At that G the chain is hidden: more groups add work, not waiting.
    PipelineTiming t = equal_stages(4, 1.0, g, 32, hop, hop / 10);
    PipelineTiming more = t;
    more.groups = g + 1;
    EXPECT_NEAR(pipeline_wall_s(more) - pipeline_wall_s(t), 32.0 * std::max(1.0, hop), 1e-9) << "hop " << hop;
  }
  EXPECT_TRUE(grew);
  EXPECT_GT(last, 4);
}

TEST(PipelineFormula, RefusesInconsistentTiming) {
  PipelineTiming t = equal_stages(3, 1, 2, 4);
  t.decode_hop_s.pop_back();
  EXPECT_THROW(bubble_fraction(t), Error);
  t = equal_stages(3, 1, 0, 4);
  EXPECT_THROW(pipeline_wall_s(t), Error);
  t = equal_stages(3, 1, 1, 0);
  EXPECT_THROW(pipeline_wall_s(t), Error);
}

ModelConfig preset(const char* name) {
  ModelConfig c = ModelConfig::from_file(kConfigs / "models" / (std::string(name) + ".json"));
  c.name = name;
  return c;
}

HardwareProfile h200() { return HardwareProfile::load(kConfigs / "hardware" / "h200.json"); }

PipelineOptions small_search(int64_t S) {
  PipelineOptions o;
  o.stages = S;
  o.search.gpu_batch_sizes = {8};
  o.search.max_num_gpu_batches = 1;
  o.search.compress_weight = o.search.compress_cache = false;
  return o;
}

double slowest_stage(const PipelinePlan& p) {
  double m = 0;
  for (const StagePlan& s : p.stages) m = std::max(m, s.estimate.prefill_s + s.estimate.decode_s);
  return m;
}

// The planner's split against every split of OPT-125M's 12 layers (its lm_head, 50272 x 768,
// costs several layers): the slowest stage is within one layer's cost of the best possible.
TEST(PipelinePlan, SplitIsWithinOneLayerOfTheBest) {
  const ModelConfig c = preset("opt-125m");
  const Workload w{128, 8, {}};
  for (int64_t S : {1, 2, 3, 5, 12}) {
    PipelineOptions o = small_search(S);
    o.groups = 2;
    const PipelinePlan got = plan_pipeline(c, {h200()}, w, o);
    expect_valid_bounds(got.bounds, 12, S);
    double best = std::numeric_limits<double>::infinity(), layer = 0;
    if (S <= 5) {
      each_split(12, S, [&](const std::vector<int64_t>& b) {
        PipelineOptions g = o;
        g.bounds = b;
        best = std::min(best, slowest_stage(plan_pipeline(c, {h200()}, w, g)));
      });
    } else {
      best = slowest_stage(got);  // one split only
    }
    // One layer's cost: a middle stage's per-layer time (2 layers minus 1 layer).
    const ModelShape m = ModelShape::from_config(c);
    CostModel one(m.stage(1, false, false), h200(), w), two(m.stage(2, false, false), h200(), w);
    const Policy& p = got.stages[0].estimate.policy;
    const Estimate e1 = one.estimate(p), e2 = two.estimate(p);
    layer = (e2.prefill_s + e2.decode_s) - (e1.prefill_s + e1.decode_s);
    ASSERT_GT(layer, 0);
    EXPECT_LE(slowest_stage(got), best + layer) << "S=" << S;
    if (S == 2) {
      EXPECT_GT(got.bounds[1], 6) << "the lm_head stage should get fewer layers";
    }
  }
}

// A fixed policy on every stage (generate --pipeline-stages with --percent): OPT-125M's
// lm_head stage gets fewer layers, and the split is the best of all splits by the same times.
TEST(PipelinePlan, BalanceStagesForAGivenPolicy) {
  const ModelConfig c = preset("opt-125m");
  const ModelShape m = ModelShape::from_config(c);
  const Workload w{128, 8, {}};
  Policy p;
  p.gpu_batch_size = 8;
  for (int64_t S : {1, 2, 3, 4}) {
    const std::vector<int64_t> got = balance_stages(m, {h200()}, w, S, p);
    expect_valid_bounds(got, 12, S);
    auto slowest = [&](const std::vector<int64_t>& b) {
      double v = 0;
      for (int64_t s = 0; s < S; ++s) {
        CostModel cm(m.stage(b[size_t(s) + 1] - b[size_t(s)], s == 0, s == S - 1), h200(), w);
        const Estimate e = cm.estimate(p);
        v = std::max(v, e.prefill_s + e.decode_s);
      }
      return v;
    };
    double best = std::numeric_limits<double>::infinity();
    each_split(12, S, [&](const std::vector<int64_t>& b) { best = std::min(best, slowest(b)); });
    EXPECT_LE(slowest(got), best * (1 + 1e-9)) << "S=" << S;
    if (S >= 2) {
      EXPECT_LT(got[size_t(S)] - got[size_t(S) - 1], 12 / S) << "the lm_head stage should get fewer layers";
    }
  }
  EXPECT_THROW(balance_stages(m, {h200()}, w, 13, p), Error);
}

TEST(PipelinePlan, OneStageIsTheSingleDevicePlan) {
  const ModelConfig c = preset("opt-125m");
  const Workload w{128, 8, {}};
  PipelineOptions o = small_search(1);
  const PipelinePlan p = plan_pipeline(c, {h200()}, w, o);
  EXPECT_EQ(p.bounds, (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(p.groups, 1);
  EXPECT_DOUBLE_EQ(p.bubble, 0);
  EXPECT_EQ(p.prefill_hop_bytes, 0u);
  CostModel cm(ModelShape::from_config(c), h200(), w);
  const Estimate e = cm.estimate(p.stages[0].estimate.policy);
  EXPECT_NEAR(p.throughput, e.throughput, 1e-9 * e.throughput);
}

double slowest_decode_step(const PipelinePlan& p) {
  double m = 0;
  for (const StagePlan& s : p.stages) m = std::max(m, s.decode_step_s);
  return m;
}

TEST(PipelinePlan, BytesBetweenStagesAndGroupsFollowTheLink) {
  const ModelConfig c = preset("opt-1.3b");
  const Workload w{128, 8, {}};
  PipelineOptions o = small_search(3);
  o.link = StageLink{StageLink::Kind::kNvlink, 300e9, 0, "fast", ""};
  const PipelinePlan a = plan_pipeline(c, {h200()}, w, o);
  // CUDA device: f16 hidden states, 2048 wide, 8 sequences.
  EXPECT_EQ(a.prefill_hop_bytes, 8u * 128 * 2048 * 2);
  EXPECT_EQ(a.decode_hop_bytes, 8u * 2048 * 2);
  EXPECT_EQ(a.return_bytes, 8u * 12);
  EXPECT_EQ(a.groups, a.groups_to_hide);
  EXPECT_LE(a.groups, 4);  // S, or S + 1 to hide the hops' microseconds
  // A link whose messages take 60% of the slowest stage's step: not the bottleneck, but the
  // round trip is longer, so more groups are needed to hide it.
  const StageLink slow{StageLink::Kind::kNetwork, 300e9, 0.6 * slowest_decode_step(a), "slow", ""};
  o.link = slow;
  const PipelinePlan b = plan_pipeline(c, {h200()}, w, o);
  EXPECT_DOUBLE_EQ(b.timing.decode_hop_s[0], slow.seconds(b.decode_hop_bytes));
  EXPECT_GT(b.groups, a.groups);
  EXPECT_GT(b.groups, 3);
  EXPECT_EQ(b.groups, b.groups_to_hide);
  for (const PipelinePlan* p : {&a, &b}) EXPECT_DOUBLE_EQ(p->bubble, bubble_fraction(p->timing));
  // The CPU device's activations are f32.
  HardwareProfile cpu = h200();
  cpu.device = DeviceKind::kCpu;
  const PipelinePlan f = plan_pipeline(c, {cpu}, w, o);
  EXPECT_EQ(f.decode_hop_bytes, uint64_t(f.block) * 2048 * 4);
  EXPECT_EQ(f.prefill_hop_bytes, uint64_t(f.block) * 128 * 2048 * 4);
}

TEST(PipelinePlan, RefusesAStageThatCannotFit) {
  const ModelConfig c = preset("opt-175b");
  HardwareProfile small = h200();
  small.name = "small";
  small.device_memory = 16e9;
  small.host_memory = 60e9;
  small.disk_memory = 20e9;
  small.usable_fraction = 1;
  PipelineOptions o;
  o.stages = 2;  // ~175 GB of weights per stage: more than 96 GB of tiers
  o.search.compress_weight = o.search.compress_cache = false;
  try {
    plan_pipeline(c, {small}, Workload{512, 32, {}}, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("pipeline infeasible"), std::string::npos) << m;
    EXPECT_NE(m.find("stage 0 (layers 0..47, embedding) of opt-175b on small"), std::string::npos) << m;
    EXPECT_NE(m.find("its smallest run (batch 1, everything offloaded) does not: disk needs "), std::string::npos)
        << m;
    EXPECT_NE(m.find("usable 20 GB (short by "), std::string::npos) << m;
  }
  // 16 stages fit (6 layers, ~22 GB each); 16 stages with 4096 groups of KV do not.
  o.stages = 16;
  o.search.gpu_batch_sizes = {4};
  o.search.max_num_gpu_batches = 1;
  EXPECT_NO_THROW(plan_pipeline(c, {small}, Workload{512, 32, {}}, o));
  o.groups = 4096;
  try {
    plan_pipeline(c, {small}, Workload{512, 32, {}}, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("with 4096 groups in flight"), std::string::npos) << e.what();
  }
}

TEST(PipelinePlan, ChosenGroupsAreLoweredToWhatMemoryHolds) {
  const ModelConfig c = preset("opt-1.3b");
  const Workload w{512, 32, {}};
  PipelineOptions o = small_search(3);
  o.search.allow_disk = false;
  o.link = StageLink{StageLink::Kind::kNvlink, 300e9, 0, "fast", ""};
  const double step = slowest_decode_step(plan_pipeline(c, {h200()}, w, o));
  o.link = StageLink{StageLink::Kind::kNetwork, 300e9, 0.6 * step, "slow", ""};
  const PipelinePlan roomy = plan_pipeline(c, {h200()}, w, o);
  ASSERT_GT(roomy.groups, 3);
  EXPECT_FALSE(roomy.groups_capped);
  // Tiers that hold every stage's weights and two groups' KV, all on the device, but not more.
  HardwareProfile tight = h200();
  tight.name = "tight";
  tight.usable_fraction = 1;
  tight.device_memory = tight.host_memory = 0;
  for (const StagePlan& s : roomy.stages) {
    CostModel cm(ModelShape::from_config(c).stage(s.end - s.first, s.embed, s.head), h200(), w);
    const auto m2 = cm.memory(s.estimate.policy, 2);
    tight.device_memory = std::max(tight.device_memory, double(m2[0]) * 1.02);
    tight.host_memory = std::max(tight.host_memory, double(m2[1]) * 1.02);
  }
  const PipelinePlan p = plan_pipeline(c, {tight}, w, o);
  EXPECT_TRUE(p.groups_capped);
  EXPECT_LT(p.groups, p.groups_to_hide);
  EXPECT_GE(p.groups, 2);
  for (const StagePlan& s : p.stages)
    for (int t = 0; t < 3; ++t) EXPECT_LE(double(s.memory[size_t(t)]), tight.usable(t)) << "tier " << t;
}

TEST(PipelinePlan, RefusesBadOptions) {
  const ModelConfig c = preset("opt-125m");
  PipelineOptions o = small_search(13);
  EXPECT_THROW(plan_pipeline(c, {h200()}, Workload{}, o), Error);
  o = small_search(2);
  o.bounds = {0, 12, 12};
  EXPECT_THROW(plan_pipeline(c, {h200()}, Workload{}, o), Error);
  o.bounds = {0, 5};
  EXPECT_THROW(plan_pipeline(c, {h200()}, Workload{}, o), Error);
  o.bounds.clear();
  EXPECT_THROW(plan_pipeline(c, {h200(), h200(), h200()}, Workload{}, o), Error);
  o.groups = -1;
  EXPECT_THROW(plan_pipeline(c, {h200()}, Workload{}, o), Error);
}

// ---- stage links in the hardware profile ---------------------------------------------

void expect_refused(const nlohmann::json& profile, const std::string& needle) {
  try {
    HardwareProfile::from_json(profile, "p.json");
    ADD_FAILURE() << "accepted " << profile["stage_link"].dump();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
  }
}

TEST(StageLinkProfile, ParsesRoundTripsAndDefaults) {
  const HardwareProfile h = h200();
  ASSERT_TRUE(h.stage_link_given);
  EXPECT_EQ(h.stage_link.kind, StageLink::Kind::kNvlink);
  EXPECT_DOUBLE_EQ(h.stage_link.bandwidth, 350e9);
  EXPECT_DOUBLE_EQ(h.stage_link.latency, 10e-6);
  EXPECT_DOUBLE_EQ(h.stage_link.seconds(350'000'000), 10e-6 + 1e-3);
  const HardwareProfile back = HardwareProfile::from_json(h.to_json(), "back.json");
  EXPECT_EQ(back.stage_link.kind, h.stage_link.kind);
  EXPECT_DOUBLE_EQ(back.stage_link.bandwidth, h.stage_link.bandwidth);
  EXPECT_DOUBLE_EQ(back.stage_link.latency, h.stage_link.latency);
  nlohmann::json j = h.to_json();
  j.erase("stage_link");
  const HardwareProfile d = HardwareProfile::from_json(j, "p.json");
  EXPECT_FALSE(d.stage_link_given);
  const StageLink l = d.between_stages();
  EXPECT_EQ(l.kind, StageLink::Kind::kPcieHost);
  EXPECT_DOUBLE_EQ(l.bandwidth, 1 / (1 / 50e9 + 1 / 48e9));  // staged through host memory
  EXPECT_DOUBLE_EQ(l.latency, 10e-6);
  EXPECT_FALSE(d.to_json().contains("stage_link"));
}

TEST(StageLinkProfile, BadValuesAreRefusedNamingTheField) {
  const nlohmann::json good = h200().to_json();
  nlohmann::json j = good;
  j["stage_link"]["kind"] = "carrier-pigeon";
  expect_refused(j, "\"stage_link.kind\" must be \"pcie_host\", \"nvlink\" or \"network\", got \"carrier-pigeon\"");
  j = good;
  j["stage_link"]["gbps"] = 0;
  expect_refused(j, "\"stage_link.gbps\" must be > 0, got 0");
  j = good;
  j["stage_link"]["gbps"] = "fast";
  expect_refused(j, "\"stage_link.gbps\" must be a number, got \"fast\"");
  j = good;
  j["stage_link"].erase("gbps");
  expect_refused(j, "\"stage_link.gbps\" is missing");
  j = good;
  j["stage_link"]["latency_us"] = -1;
  expect_refused(j, "\"stage_link.latency_us\" must be >= 0, got -1");
  j = good;
  j["stage_link"].erase("kind");
  expect_refused(j, "\"stage_link.kind\" is missing");
  j = good;
  j["stage_link"]["gbs"] = 3;
  expect_refused(j, "\"stage_link.gbs\" is not known");
  j = good;
  j["stage_link"] = 12;
  expect_refused(j, "\"stage_link\" must be an object, got 12");
  j = good;
  j["stage_link"]["name"] = 7;
  expect_refused(j, "\"stage_link.name\" must be a string, got 7");
}

TEST(StageLinkProfile, EveryPresetLoads) {
  int n = 0;
  for (const auto& f : fs::directory_iterator(kConfigs / "hardware" / "links")) {
    const StageLink l = StageLink::load(f.path());
    EXPECT_GT(l.bandwidth, 0) << f.path();
    EXPECT_FALSE(l.source.empty()) << f.path();
    EXPECT_EQ(l.name, f.path().stem().string());
    ++n;
  }
  EXPECT_GE(n, 5);
  EXPECT_EQ(resolve_stage_link("infiniband-hdr", kConfigs).kind, StageLink::Kind::kNetwork);
  try {
    resolve_stage_link("token-ring", kConfigs);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage link \"token-ring\" is neither a file nor a name in"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(HardwareProfile::load(kConfigs / "hardware" / "t4-paper.json").stage_link_given);
}

}  // namespace
}  // namespace flexh2o
