// The planner and 4-bit compression (issue #12): compressed weight and KV sizes equal what
// placement and the engine's memory plan compute (one formula, checked against the Q4 record
// layout written out here by hand), compressed bytes on the links, the dequantization term,
// the search choosing compression only when it fits or wins, the profile's dequant field,
// policy files with the compression keys, and `flexh2o plan`'s compression output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "engine/cpu_device.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "engine/policy_of.h"
#include "engine/test_util.h"
#include "planner/planner.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {
using test::model_dir;

// Bytes of one Q4 row of `cols` values, from core/quant4.h's prose, not its functions: the
// codes (two per byte) padded to 4 bytes, then an fp16 {d, m} pair per group of 64.
uint64_t q4_row(int64_t cols) { return uint64_t((cols + 1) / 2 + 3) / 4 * 4 + 4 * uint64_t((cols + 63) / 64); }

HardwareProfile h200_cpu() {
  HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
  h.device = DeviceKind::kCpu;
  return h;
}

Policy make(const char* percent, int gbs, int ngb, bool cpu_attn, bool cw, bool ckv) {
  Policy p = test::policy_of(percent, gbs, ngb, cpu_attn);
  p.compress_weight = cw;
  p.compress_cache = ckv;
  return p;
}

TEST(PlannerCompressSizes, TwoDimensionalWeightsAreQ4RecordsOthersStayPlain) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    const ModelConfig c = Model::load_dir(model_dir(name)).config();
    const ModelShape s = ModelShape::from_config(c);
    std::vector<uint64_t> want_attn, want_mlp;
    for (const WeightSpec& w : weight_specs(c)) {
      if (w.layer != 0) continue;
      const uint64_t plain = uint64_t(w.shape.numel()) * dtype_size(c.dtype);
      const uint64_t q = w.shape.ndim == 2 ? uint64_t(w.shape[0]) * q4_row(w.shape[1]) : plain;
      (w.part == LayerPart::kMlp ? want_mlp : want_attn).push_back(q);
    }
    ASSERT_EQ(s.q4.attn.size(), want_attn.size()) << name;
    for (size_t i = 0; i < want_attn.size(); ++i) EXPECT_EQ(s.q4.attn[i], want_attn[i]) << name << " attn " << i;
    for (size_t i = 0; i < want_mlp.size(); ++i) EXPECT_EQ(s.q4.mlp[i], want_mlp[i]) << name << " mlp " << i;
    // The token table: vocab rows of q4_row(hidden) bytes.
    EXPECT_EQ(s.q4.embed[s.token_index], uint64_t(c.vocab_size) * q4_row(c.hidden)) << name;
    // FlexGen's "around 70% less" for fp16; f32 checkpoints shrink about 7x.
    const double ratio = double(s.total_bytes()) / double(s.q4.total(c.n_layers));
    const double want = dtype_size(c.dtype) == 2 ? 3.5 : 7.0;
    EXPECT_GT(ratio, want * 0.9) << name;
    EXPECT_LT(ratio, want * 1.02) << name;
  }
}

// --sep-layer changes what streams together, not where a weight lives: FlexGen places a
// TransformerLayer's attention and MLP each by the midpoint rule over its own bytes
// (TransformerLayer.init_weight), as with separate units. A whole layer's rule moved OPT-125M at
// 50/50 from 158/155 MiB to 185/128 MiB on device/host.
TEST(PlannerCompressSizes, SepLayerFalsePlacesEveryWeightWhereSeparateUnitsDo) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model model = Model::load_dir(model_dir(name));
    for (const char* pct : {"50 50 100 0 100 0", "20 80 0 100 0 100", "30 30 100 0 100 0", "10 40 0 100 100 0"}) {
      for (bool cw : {false, true}) {
        Policy sep = make(pct, 2, 1, false, cw, false), whole = sep;
        whole.sep_layer = false;
        const WeightPlacement a = place_weights(model, sep), b = place_weights(model, whole);
        EXPECT_EQ(a.bytes, b.bytes) << name << " " << pct << " " << cw;
        std::map<std::string, Tier> tier_of;
        for (const UnitPlacement& u : a.units)
          for (const PlacedTensor& t : u.tensors) tier_of[t.name] = t.tier;
        for (const UnitPlacement& u : b.units)
          for (const PlacedTensor& t : u.tensors)
            EXPECT_EQ(t.tier, tier_of.at(t.name)) << name << " " << pct << " " << t.name;
        // The halves stream together: a whole layer's slot holds both.
        EXPECT_EQ(b.units[1].slot_bytes, a.units[1].slot_bytes + a.units[2].slot_bytes) << name << " " << pct;
      }
    }
  }
}

// The planner's units and memory with compression are what place_weights and the engine's
// memory plan give for the same policy.
TEST(PlannerCompressSizes, UnitsAndMemoryEqualTheEngine) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model model = Model::load_dir(model_dir(name));
    const ModelShape shape = ModelShape::from_model(model);
    CpuDevice dev(2);
    Workload w;
    w.prompt_len = 33;
    w.gen_len = 9;
    CostModel cm(shape, h200_cpu(), w);
    for (const char* pct : {"0 100 0 100 100 0", "20 30 0 50 0 100", "55 25 34 33 100 0", "0 0 0 0 100 0"}) {
      for (bool sep : {true, false}) {
        for (auto [cw, ckv] : {std::pair{true, false}, {false, true}, {true, true}}) {
          Policy p = make(pct, 3, 2, false, cw, ckv);
          p.sep_layer = sep;
          const WeightPlacement wp = place_weights(model, p);
          const UnitSizes& u = shape.units(p);
          auto tiers = [](const UnitPlacement& x) { return std::array<uint64_t, 3>{x.bytes[0], x.bytes[1], x.bytes[2]}; };
          EXPECT_EQ(place_unit(u.embed, p), tiers(wp.units[0]));
          EXPECT_EQ(sep ? place_unit(u.attn, p) : whole_layer_bytes(u.attn, u.mlp, p).tier, tiers(wp.units[1]))
              << name << " " << p.str();
          EXPECT_EQ(place_unit(u.head, p), tiers(wp.units.back())) << name << " " << p.str();
          OffloadOptions o;
          o.policy = p;
          o.kv_dtype = DType::F16;  // compress_cache alone makes the engine's KV Q4
          BatchDims d;
          d.rows = w.prompt_len, d.capacity = w.prompt_len + w.gen_len;
          const MemoryPlan plan = offload_memory_plan(model, dev, o, d);
          EXPECT_EQ(cm.memory(p), plan.bytes) << name << " " << p.str() << "\n" << plan.breakdown();
          // The KV homes hold Q4 records of head_dim values.
          const uint64_t kv_row = ckv ? q4_row(model.config().head_dim) : uint64_t(model.config().head_dim) * 2;
          EXPECT_EQ(plan.kv_home_seq, 2 * uint64_t(model.config().n_kv_heads) * kv_row * uint64_t(plan.cap_h));
        }
      }
    }
  }
}

// Runs one block through the engine on the CPU device with compression and compares its link
// counters with the cost model's.
struct CompressCase {
  const char* model;
  const char* percent;
  int gbs, ngb;
  bool cpu_attn, cw, ckv;
};

class PlannerCompressEngine : public ::testing::TestWithParam<CompressCase> {};

TEST_P(PlannerCompressEngine, BytesPerLinkEqualTheEngineCounters) {
  const CompressCase& cc = GetParam();
  Model model = Model::load_dir(model_dir(cc.model));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = make(cc.percent, cc.gbs, cc.ngb, cc.cpu_attn, cc.cw, cc.ckv);
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  const Workload w{7, 5, {}};
  std::vector<GenerationRequest> reqs(size_t(o.policy.block_size()));
  for (auto& r : reqs) {
    r.prompt_ids.assign(size_t(w.prompt_len), 100);
    r.max_new_tokens = w.gen_len;
    r.sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  CostModel cm(ModelShape::from_model(model), h200_cpu(), w);
  const auto want = eng.report().bytes, got = cm.bytes(o.policy);
  for (int l = 0; l < kNumLinks; ++l)
    EXPECT_EQ(got[size_t(l)], want[size_t(l)]) << link_name(Link(l)) << " for " << o.policy.str();
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PlannerCompressEngine,
    ::testing::Values(CompressCase{"tiny-opt", "0 100 0 100 100 0", 2, 2, false, true, true},
                      CompressCase{"tiny-opt", "20 30 0 50 0 100", 2, 2, false, true, false},
                      CompressCase{"tiny-opt", "0 50 0 0 0 100", 4, 2, true, true, true},
                      CompressCase{"tiny-opt", "100 0 34 33 100 0", 3, 3, false, false, true},
                      CompressCase{"tiny-llama", "30 30 100 0 100 0", 2, 2, false, true, false},
                      CompressCase{"tiny-llama", "0 0 0 100 0 100", 3, 2, true, false, true},
                      CompressCase{"tiny-llama", "0 0 0 0 100 0", 3, 1, false, true, true}));

TEST(PlannerCompressBytes, KvLinksCarryQ4Rows) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  const ModelConfig& c = model.config();
  CostModel cm(ModelShape::from_model(model), h200_cpu(), Workload{20, 6, {}});
  // Weights and activations on the device, KV on the host: host->device carries only KV rows
  // and device->host only KV rows, so both scale by exactly the row ratio.
  const Policy plain = make("100 0 0 100 100 0", 2, 2, false, false, false);
  const Policy q = make("100 0 0 100 100 0", 2, 2, false, false, true);
  const auto a = cm.bytes(plain), b = cm.bytes(q);
  const uint64_t f16_row = uint64_t(c.head_dim) * 2, q_row = q4_row(c.head_dim);
  for (Link l : {Link::kHostToDevice, Link::kDeviceToHost}) {
    ASSERT_GT(a[size_t(l)], 0u);
    EXPECT_EQ(a[size_t(l)] / f16_row * q_row, b[size_t(l)]) << link_name(l);
    EXPECT_EQ(a[size_t(l)] % f16_row, 0u);
  }
  EXPECT_EQ(cm.kv_token_bytes(q), uint64_t(c.n_layers) * 2 * uint64_t(c.n_kv_heads) * q_row);
}

TEST(PlannerCompressBytes, WeightLinksCarryQ4Records) {
  Model model = Model::load_dir(model_dir("tiny-llama"));
  const ModelShape s = ModelShape::from_model(model);
  const Workload w{20, 6, {}};
  CostModel cm(s, h200_cpu(), w);
  // Every weight homed on the host, KV and activations on the device: host->device carries the
  // weights once per token step (the token table only the step's rows).
  const Policy q = make("0 100 100 0 100 0", 2, 2, false, true, false);
  uint64_t want = 0;
  const uint64_t B = uint64_t(q.block_size());
  for (int64_t i = 0; i < w.gen_len; ++i) {
    want += uint64_t(s.config.n_layers) * (std::accumulate(s.q4.layer.begin(), s.q4.layer.end(), uint64_t(0))) +
            std::accumulate(s.q4.head.begin(), s.q4.head.end(), uint64_t(0));
    const uint64_t rows = B * uint64_t(i == 0 ? w.prompt_len : 1);
    for (size_t k = 0; k < s.q4.embed.size(); ++k)
      want += k == s.token_index ? rows * q4_row(s.config.hidden) : s.q4.embed[k];
  }
  EXPECT_EQ(cm.bytes(q)[size_t(Link::kHostToDevice)], want);
}

// Compression's compute: with a dequant rate the estimate is slower than with dequantization
// free, by at least the Q4 weight bytes the decode GEMMs read divided by the rate.
TEST(PlannerCompressTime, DequantizationCostsTime) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  HardwareProfile free = h200_cpu(), slow = h200_cpu();
  free.device_dequant = 1e18;
  slow.device_dequant = 1e9;
  const Workload w{16, 4, {}};
  CostModel cf(ModelShape::from_model(model), free, w), cs(ModelShape::from_model(model), slow, w);
  const Policy p = make("100 0 100 0 100 0", 2, 1, false, true, false);
  const Estimate ef = cf.estimate(p), es = cs.estimate(p);
  const UnitSizes& u = cf.shape().units(p);  // what the decode GEMMs read (not the embedding)
  const double q4_weights = double(model.config().n_layers) * double(std::accumulate(u.layer.begin(), u.layer.end(), size_t(0))) +
                            double(std::accumulate(u.head.begin(), u.head.end(), size_t(0)));
  EXPECT_GE(es.decode_s - ef.decode_s, 0.9 * double(w.gen_len - 1) * q4_weights / slow.device_dequant);
  // Cache compression: the attention reads Q4 rows.
  const Policy k = make("100 0 100 0 100 0", 2, 1, false, false, true);
  EXPECT_GT(cs.estimate(k).decode_s, cf.estimate(k).decode_s);
}

HardwareProfile tiny_tiers(double dev, double host, double disk) {
  HardwareProfile h = h200_cpu();
  h.device_memory = dev, h.host_memory = host, h.disk_memory = disk;
  h.usable_fraction = 1;
  return h;
}

SearchOptions small_search() {
  SearchOptions so;
  so.gpu_batch_sizes = {1, 2, 4, 8};
  so.max_num_gpu_batches = 4;
  return so;
}

// The smallest run's memory (batch 1, everything on the host) with and without compressed
// weights; a host between the two holds only the compressed model.
TEST(PlannerCompressSearch, ChoosesCompressionWhenUncompressedDoesNotFit) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  const Workload w{16, 4, {}};
  CostModel probe(ModelShape::from_model(model), h200_cpu(), w);
  const auto need = [&](bool cw, int tier) {
    return double(probe.memory(make("0 100 0 100 100 0", 1, 1, false, cw, false))[size_t(tier)]);
  };
  ASSERT_LT(need(true, 1), need(false, 1));
  HardwareProfile h = tiny_tiers(need(true, 0) * 1.05, (need(true, 1) + need(false, 1)) / 2, 0);
  CostModel cm(ModelShape::from_model(model), h, w);
  SearchOptions so = small_search();
  so.allow_disk = false;
  const PlanResult r = search_policy(cm, so);
  EXPECT_TRUE(r.best.policy.compress_weight) << r.best.policy.str();
  EXPECT_TRUE(r.best.fits);
  // Fixed off by the caller, or not priced by the profile: nothing fits.
  so.compress_weight = false;
  EXPECT_THROW(search_policy(cm, so), Error);
  h.device_dequant = 0;
  CostModel unpriced(ModelShape::from_model(model), h, w);
  EXPECT_THROW(search_policy(unpriced, small_search()), Error);
}

// The weights must stream over a slow link: compressing them moves ~7x fewer bytes, and with
// cheap dequantization that wins.
TEST(PlannerCompressSearch, ChoosesCompressionWhenItIsFaster) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  HardwareProfile h = tiny_tiers(6e6, 1e9, 0);
  h.host_to_device = 0.2e9;
  h.device_dequant = 1e13;
  CostModel cm(ModelShape::from_model(model), h, Workload{16, 4, {}});
  SearchOptions so = small_search();
  so.allow_disk = false;
  const PlanResult r = search_policy(cm, so);
  EXPECT_TRUE(r.best.policy.compress_weight) << r.best.policy.str();
  so.compress_weight = so.compress_cache = false;
  EXPECT_GT(r.best.throughput, search_policy(cm, so).best.throughput);
}

// Everything fits on the device uncompressed and dequantization is slow: no compression.
TEST(PlannerCompressSearch, NotWhenTheModelFitsAndDequantizationCostsMore) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  HardwareProfile h = h200_cpu();
  h.device_dequant = 1e8;
  CostModel cm(ModelShape::from_model(model), h, Workload{16, 4, {}});
  const PlanResult r = search_policy(cm, small_search());
  EXPECT_FALSE(r.best.policy.compress_weight) << r.best.policy.str();
  EXPECT_FALSE(r.best.policy.compress_cache) << r.best.policy.str();
  EXPECT_EQ(r.best.policy.w_gpu_percent, 100);
  // ... and compression really is predicted slower there.
  Policy q = r.best.policy;
  q.compress_weight = q.compress_cache = true;
  EXPECT_LT(cm.estimate(q).throughput, r.best.throughput);
}

TEST(PlannerCompressProfile, DequantFieldParsedNamedAndRoundTripped) {
  const std::filesystem::path cfg = FLEXH2O_SOURCE_CONFIGS;
  const HardwareProfile t4 = HardwareProfile::load(cfg / "hardware" / "t4-paper.json");
  EXPECT_TRUE(t4.prices_compression());
  EXPECT_GT(t4.host_dequant, 0);
  const HardwareProfile back = HardwareProfile::from_json(t4.to_json(), "back.json");
  EXPECT_DOUBLE_EQ(back.device_dequant, t4.device_dequant);
  EXPECT_DOUBLE_EQ(back.host_dequant, t4.host_dequant);
  nlohmann::json j = t4.to_json();
  j["dequant_gbps"]["device"] = -1;
  try {
    HardwareProfile::from_json(j, "p.json");
    ADD_FAILURE() << "accepted a negative dequant rate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dequant_gbps.device"), std::string::npos) << e.what();
  }
  j.erase("dequant_gbps");
  EXPECT_FALSE(HardwareProfile::from_json(j, "p.json").prices_compression());
}

// A policy file with the compression keys round-trips and is estimated as the policy it names.
TEST(PlannerCompressPolicyFile, CompressionKeysRoundTrip) {
  test::TempDir tmp;
  const std::filesystem::path f = tmp.path() / "policy.json";
  std::ofstream(f) << R"({"percent": [0, 100, 0, 100, 100, 0], "gpu_batch_size": 2, "num_gpu_batches": 2,
                          "compress_weight": true, "compress_cache": true})";
  const Policy p = policy_from_json(test::read_json(f), f.string());
  EXPECT_TRUE(p.compress_weight);
  EXPECT_TRUE(p.compress_cache);
  const Policy back = policy_from_json(policy_to_json(p), "back");
  EXPECT_EQ(back.str(), p.str());
  EXPECT_NE(p.str().find("--compress-weight"), std::string::npos) << p.str();
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CostModel cm(ModelShape::from_model(model), h200_cpu(), Workload{16, 4, {}});
  EXPECT_EQ(cm.estimate(back).bytes, cm.estimate(p).bytes);
  EXPECT_LT(cm.memory(p)[1], cm.memory(make("0 100 0 100 100 0", 2, 2, false, false, false))[1]);
  EXPECT_THROW(policy_from_json(nlohmann::json{{"compress_weights", true}}, "typo.json"), Error);
}

TEST(PlannerCompressCli, PlanJsonCarriesTheCompressionFields) {
  const std::string base = "plan --model opt-30b --hardware t4-paper --percent 0 100 0 100 0 100 "
                           "--gpu-batch-size 64 --num-gpu-batches 8 --json";
  const test::RunResult plain = test::run_flexh2o(base), q = test::run_flexh2o(base + " --compress-cache");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(q.code, 0) << q.err;
  const nlohmann::json a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(q.out);
  EXPECT_FALSE(b["compression"]["weight"].get<bool>());
  EXPECT_TRUE(b["compression"]["cache"].get<bool>());
  EXPECT_TRUE(b["policy"]["compress_cache"].get<bool>());
  EXPECT_TRUE(b["compression"]["dequant_priced"].get<bool>());
  EXPECT_EQ(a["compression"]["weight_bytes"], b["compression"]["weight_bytes"]);
  // OPT-30B: 48 layers, 56 heads of 128: f16 rows of 256 B, Q4 rows of 72 B.
  EXPECT_EQ(a["compression"]["kv_bytes_per_token"].get<uint64_t>(), 48ull * 2 * 56 * 256);
  EXPECT_EQ(b["compression"]["kv_bytes_per_token"].get<uint64_t>(), 48ull * 2 * 56 * 72);
  EXPECT_LT(b["bytes_per_link"]["host_to_device"].get<uint64_t>(), a["bytes_per_link"]["host_to_device"].get<uint64_t>());
  EXPECT_LT(b["memory_bytes"]["host"].get<uint64_t>(), a["memory_bytes"]["host"].get<uint64_t>());
  const test::RunResult bad = test::run_flexh2o("plan --model opt-125m --hardware t4-paper --no-compress --compress-weight");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--no-compress"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace flexh2o
