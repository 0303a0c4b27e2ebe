// The offloading engine on the CPU device against the in-memory reference: logits bit for bit
// over a grid of policies (weights / KV / activations on device, host, disk and split;
// micro-batches; overlap; CPU attention; whole layers or attention/MLP units; every KV policy;
// f16 and f32 KV), the hazard-checking device (no access without its dependency, and dropping
// one is caught), the activation-rounding device (the CUDA engine's link numerics), and the
// cross-step prefetch.
#include <gtest/gtest.h>

#include <sstream>

#include "arch_requests.h"
#include "bible_requests.h"
#include "engine/compress.h"
#include "engine/cpu_device.h"
#include "engine/kv_evict.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

struct Case {
  const char* model;
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool overlap = true, cpu_attention = false, sep = true;
  KvPolicyKind kv = KvPolicyKind::kFull;
  DType kv_dtype = DType::F16;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.model << " [" << c.percent << "] " << c.gbs << "x" << c.ngb << (c.overlap ? "" : " no-overlap")
            << (c.cpu_attention ? " cpu-attn" : "") << (c.sep ? "" : " whole-layers") << " "
            << kv_policy_name(c.kv) << " " << dtype_name(c.kv_dtype);
}

Policy make_policy(const Case& c) {
  Policy p = test::policy_of(c.percent, c.gbs, c.ngb, c.cpu_attention);
  p.overlap = c.overlap;
  p.sep_layer = c.sep;
  return p;
}

std::unique_ptr<KvPolicy> kv_policy(KvPolicyKind kind) {
  if (kind == KvPolicyKind::kFull) return nullptr;
  KvPolicyConfig k;
  k.kind = kind;
  if (kind == KvPolicyKind::kH2o || kind == KvPolicyKind::kRandom) k.heavy_budget = 4;
  k.recent_budget = 3;
  if (kind == KvPolicyKind::kSinks) k.sink_tokens = 2;
  return make_policy(k);
}

// 7 prompts of different lengths, greedy, 6-8 new tokens each: several batches, left padding.
std::vector<GenerationRequest> requests(const std::string& model) {
  std::vector<GenerationRequest> reqs = test::bible_requests(model, 6);
  const auto more = test::bible_requests(model, 8);
  reqs.insert(reqs.end(), more.begin(), more.begin() + 3);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].max_new_tokens = 6 + int64_t(i % 3);
  return reqs;
}

class OffloadGrid : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadGrid, LogitsBitIdenticalToInMemory) {
  const Case& c = GetParam();
  Model model = Model::load_dir(model_dir(c.model));
  CpuDevice dev(2);
  const auto policy = kv_policy(c.kv);
  const auto reqs = requests(c.model);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = make_policy(c);
  o.offload_dir = dir.path() / "store";
  o.kv_policy = policy.get();
  o.kv_dtype = c.kv_dtype;
  OffloadEngine eng(model, dev, o);
  Forward fwd(model, dev);
  InMemoryRunner ref(fwd, eng.max_batch(), policy.get(), c.kv_dtype);
  std::ostringstream what;
  what << c;
  test::expect_same_logits(test::run_greedy(eng, reqs), test::run_greedy(ref, reqs), what.str());
}

using K = KvPolicyKind;
constexpr DType F32 = DType::F32, BF16 = DType::BF16;
INSTANTIATE_TEST_SUITE_P(
    Policies, OffloadGrid,
    ::testing::Values(Case{"tiny-opt", "100 0 100 0 100 0", 2, 2}, Case{"tiny-opt", "0 100 100 0 100 0", 2, 2},
                      Case{"tiny-opt", "0 0 100 0 100 0", 3, 1}, Case{"tiny-opt", "30 30 100 0 100 0", 1, 3},
                      Case{"tiny-opt", "30 30 100 0 100 0", 1, 3, true, false, false},
                      Case{"tiny-opt", "100 0 0 100 100 0", 2, 2}, Case{"tiny-opt", "100 0 0 100 100 0", 2, 2, true, true},
                      Case{"tiny-opt", "100 0 0 0 100 0", 3, 2}, Case{"tiny-opt", "100 0 0 0 100 0", 3, 2, true, true},
                      Case{"tiny-opt", "100 0 34 33 100 0", 3, 3}, Case{"tiny-opt", "100 0 34 33 100 0", 3, 3, false, true},
                      Case{"tiny-opt", "100 0 100 0 0 100", 2, 3}, Case{"tiny-opt", "100 0 100 0 0 100", 2, 3, false},
                      Case{"tiny-opt", "100 0 100 0 0 100", 3, 1}, Case{"tiny-opt", "0 100 100 0 0 100", 2, 3, false},
                      Case{"tiny-opt", "20 30 0 50 0 100", 2, 2, false}, Case{"tiny-opt", "0 50 0 0 0 100", 4, 2, true, true},
                      Case{"tiny-opt", "0 50 0 0 0 100", 4, 2, true, true, false},
                      Case{"tiny-opt", "0 100 0 100 0 100", 3, 2, true, true, true, K::kFull, F32},
                      Case{"tiny-opt", "20 30 34 33 0 100", 3, 2, true, false, true, K::kFull, BF16},
                      Case{"tiny-llama", "30 30 100 0 100 0", 2, 2}, Case{"tiny-llama", "0 0 0 100 0 100", 3, 2, true, true},
                      Case{"tiny-llama", "50 0 34 33 100 0", 2, 3}, Case{"tiny-llama", "0 100 0 0 100 0", 1, 2, false},
                      Case{"tiny-llama", "50 0 34 33 100 0", 2, 3, true, true, false, K::kFull, F32},
                      // KV policies on every tier, device attention and host attention.
                      Case{"tiny-opt", "100 0 100 0 100 0", 2, 2, true, false, true, K::kH2o},
                      Case{"tiny-opt", "30 30 34 33 0 100", 3, 2, true, false, true, K::kH2o},
                      Case{"tiny-opt", "30 30 34 33 0 100", 3, 2, true, true, true, K::kH2o},
                      Case{"tiny-opt", "0 100 0 0 100 0", 3, 2, true, true, false, K::kH2o, F32},
                      Case{"tiny-opt", "50 50 34 33 100 0", 3, 2, false, false, true, K::kSinks},
                      Case{"tiny-opt", "50 50 0 50 100 0", 3, 2, true, true, true, K::kRandom},
                      Case{"tiny-llama", "100 0 34 33 100 0", 3, 2, true, false, true, K::kH2o},
                      Case{"tiny-llama", "0 100 0 0 0 100", 3, 2, true, true, true, K::kH2o},
                      Case{"tiny-llama", "30 30 100 0 100 0", 2, 2, true, false, false, K::kLocal},
                      Case{"tiny-llama", "0 0 50 0 100 0", 2, 2, true, false, true, K::kRandom, F32}));

// The checking device: every buffer access of every step must be ordered after its writer by
// the events its queue waited on (vector clocks, exact whatever the timing), under random
// delays. Placements that use every kind of step.
TEST(OffloadHazards, TheScheduleCoversEveryAccess) {
  const Case cases[] = {{"tiny-opt", "20 30 34 33 0 100", 3, 2, true, false, true, K::kH2o},
                        {"tiny-opt", "20 30 34 33 0 100", 3, 2, true, true, true, K::kH2o},
                        {"tiny-llama", "0 50 0 50 0 100", 2, 3, true, true, false},
                        {"tiny-llama", "30 0 50 0 100 0", 2, 2, true, false, true, K::kSinks}};
  for (const Case& c : cases) {
    Model model = Model::load_dir(model_dir(c.model));
    CpuDeviceOptions co;
    co.threads = 2, co.check_hazards = true, co.max_delay_us = 200;
    CpuDevice dev(co);
    const auto policy = kv_policy(c.kv);
    test::TempDir dir;
    OffloadOptions o;
    o.policy = make_policy(c);
    o.offload_dir = dir.path();
    o.kv_policy = policy.get();
    OffloadEngine eng(model, dev, o);
    auto reqs = requests(c.model);
    reqs.resize(4);
    EXPECT_NO_THROW(test::run_greedy(eng, reqs)) << c;
  }
}

// ... and it is not vacuous: the same run without one dependency of the schedule fails.
TEST(OffloadHazards, DroppingOneDependencyFails) {
  struct Drop {
    Case c;
    StepKind step, dep;
  };
  const Drop drops[] = {
      {{"tiny-opt", "0 100 100 0 100 0", 2, 2}, StepKind::kCompute, StepKind::kLoadWeight},
      {{"tiny-opt", "100 0 0 100 100 0", 2, 2}, StepKind::kCompute, StepKind::kLoadCache},
      {{"tiny-opt", "100 0 0 0 100 0", 2, 2, true, true}, StepKind::kHostAttention, StepKind::kLoadCacheDisk},
      {{"tiny-opt", "100 0 100 0 0 100", 2, 2}, StepKind::kLoadHidden, StepKind::kStoreHidden},
  };
  for (const Drop& d : drops) {
    Model model = Model::load_dir(model_dir(d.c.model));
    CpuDeviceOptions co;
    co.threads = 2, co.check_hazards = true, co.max_delay_us = 50;
    CpuDevice dev(co);
    test::TempDir dir;
    OffloadOptions o;
    o.policy = make_policy(d.c);
    o.offload_dir = dir.path();
    o.edit_schedule = [&](Schedule& s) {
      for (Step& st : s.steps) {
        if (st.kind != d.step) continue;
        std::erase_if(st.deps, [&](int i) { return s.steps[size_t(i)].kind == d.dep; });
      }
    };
    OffloadEngine eng(model, dev, o);
    auto reqs = requests(d.c.model);
    reqs.resize(4);
    try {
      test::run_greedy(eng, reqs);
      ADD_FAILURE() << "no hazard reported without " << step_name(d.step) << " <- " << step_name(d.dep);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("hazard"), std::string::npos) << e.what();
    }
  }
}

// Activations in F16 on the CPU device round every value where it crosses a link, exactly
// where the CUDA device does: an offloaded run equals the resident run with the same rounding
// bit for bit, and stays close to the fp32 reference.
TEST(OffloadActRounding, LinkCrossingsRoundLikeTheCudaDevice) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model model = Model::load_dir(model_dir(name));
    CpuDeviceOptions co;
    co.threads = 2;
    co.act_dtype = DType::F16;
    CpuDevice dev16(co);
    CpuDevice dev32(2);
    auto reqs = requests(name);
    reqs.resize(4);
    Forward fwd(model, dev32);
    InMemoryRunner ref(fwd, 4, nullptr, DType::F16);
    const test::Run want = test::run_greedy(ref, reqs);
    OffloadOptions resident;
    resident.policy.gpu_batch_size = 4;
    OffloadEngine all(model, dev16, resident);
    const test::Run r16 = test::run_forced(all, reqs, want.tokens);
    for (const char* pct : {"0 100 0 100 0 100", "30 70 50 50 0 100"}) {
      OffloadOptions o;
      o.policy = make_policy(Case{name, pct, 2, 2, true, true});
      OffloadEngine eng(model, dev16, o);
      test::expect_same_logits(test::run_forced(eng, reqs, want.tokens), r16, std::string(name) + " " + pct);
    }
    // f16 hidden states, q/k/v and attention rows against fp32 ones, same inputs.
    const double worst = test::expect_close_logits(r16, test::run_forced(ref, reqs, want.tokens), 0.08, 0.02, name);
    EXPECT_GT(worst, 0.0) << "rounding changed nothing: the mode is not on";
  }
}

// The cross-step prefetch puts the next step's first layer in the last layer unit's slot and
// shifts the slot parity (every step when the unit count is even, never when odd).
TEST(OffloadPrefetch, OddAndEvenUnitCountsMatchInMemory) {
  ModelConfig c = Model::load_dir(model_dir("tiny-opt")).config();
  for (int layers : {3, 4}) {
    for (bool sep : {false, true}) {
      c.n_layers = layers;
      Model model = Model::dummy(c, 5);
      CpuDevice dev(2);
      Forward fwd(model, dev);
      auto reqs = requests("tiny-opt");
      for (const char* percent : {"0 100 100 0 100 0", "30 0 100 0 100 0"}) {
        test::TempDir dir;
        OffloadOptions o;
        o.policy = make_policy(Case{"tiny-opt", percent, 2, 1, true, false, sep});
        o.offload_dir = dir.path();
        OffloadEngine eng(model, dev, o);
        InMemoryRunner ref(fwd, eng.max_batch());
        test::expect_same_logits(test::run_greedy(eng, reqs), test::run_greedy(ref, reqs),
                                 std::to_string(layers) + " layers " + percent);
      }
    }
  }
}

// The transformers-written arch models through the offloading engine, weights on the disk tier
// (and, for every other model, H2O on a host KV cache): Phi-3's fused views, Qwen3's q/k norms
// and each rope type as streamed units, bit-identical to the in-memory run.
class OffloadArch : public ::testing::TestWithParam<const char*> {};

TEST_P(OffloadArch, DiskTierLogitsBitIdenticalToInMemory) {
  Model model = Model::load_dir(model_dir(GetParam()));
  const auto reqs = test::arch_requests(GetParam(), model.config(), 4);
  const bool h2o = std::string(GetParam()).find('_') != std::string::npos;
  const auto policy = kv_policy(h2o ? KvPolicyKind::kH2o : KvPolicyKind::kFull);
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = make_policy(Case{GetParam(), "0 0 0 100 100 0", 2, 2});
  o.offload_dir = dir.path() / "store";
  o.kv_policy = policy.get();
  o.kv_dtype = DType::F16;
  o.window_cap = false;  // as the in-memory reference, every layer keeps every token (WindowCap*: the cap)
  OffloadEngine eng(model, dev, o);
  Forward fwd(model, dev);
  InMemoryRunner ref(fwd, eng.max_batch(), policy.get(), DType::F16, false);
  test::expect_same_logits(test::run_greedy(eng, reqs), test::run_greedy(ref, reqs), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Transformers, OffloadArch, ::testing::ValuesIn(test::arch_models()),
                         [](const auto& info) { return std::string(info.param).substr(5); });

// The full cache of a model whose every layer slides, run past the window as the CLI runs it
// (window_kv_policy: `local` at the window's width). Every step's logits are the uncapped full
// cache's: the slots hold the same keys, but the oldest leaving reorders them, so sums differ in
// the last bits. Offloaded with the cache on the host, the capped run is the in-memory capped
// run bit for bit, and its KV homes hold the window's slots instead of prompt + generated.
class WindowCap : public ::testing::TestWithParam<const char*> {};

TEST_P(WindowCap, TheFullCacheKeepsTheWindowWithTheUncappedLogits) {
  Model model = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = model.config();
  const int64_t gen = 40;
  const auto reqs = test::arch_requests(GetParam(), c, gen);
  int64_t max_len = 0;
  for (const auto& r : reqs) max_len = std::max(max_len, int64_t(r.prompt_ids.size()) + gen);
  ASSERT_TRUE(window_caps_full_cache(c, max_len)) << "every layer must slide, and the run pass the window";
  const KvPolicyConfig kc = window_kv_policy(c, KvPolicyConfig{}, max_len);
  ASSERT_EQ(kc.kind, KvPolicyKind::kLocal);
  ASSERT_EQ(kc.recent_budget, c.sliding_window);
  const auto capped_policy = make_policy(kc);
  CpuDevice dev(2);
  Forward fwd(model, dev);
  InMemoryRunner full(fwd, 4, nullptr, DType::F16, false), capped(fwd, 4, capped_policy.get(), DType::F16);
  const test::Run want = test::run_greedy(full, reqs);
  const test::Run got = test::run_forced(capped, reqs, want.tokens);
  const double worst = test::expect_close_logits(got, want, 1e-4, 1e-4, GetParam());
  EXPECT_GT(worst, 0.0) << "the capped run evicted nothing";
  EXPECT_LT(capped.kv_bytes(), full.kv_bytes());

  auto offloaded = [&](const KvPolicy* policy, test::Run* run) {
    test::TempDir dir;
    OffloadOptions o;
    o.policy = make_policy(Case{GetParam(), "0 100 0 100 100 0", 2, 2, true, true});
    o.offload_dir = dir.path() / "store";
    o.kv_policy = policy;
    o.kv_dtype = DType::F16;
    o.window_cap = policy != nullptr;  // the uncapped full cache to compare with
    OffloadEngine eng(model, dev, o);
    *run = test::run_forced(eng, reqs, want.tokens);
    return eng.report().peak[1];
  };
  test::Run on_host, on_host_full;
  const uint64_t host_capped = offloaded(capped_policy.get(), &on_host);
  const uint64_t host_full = offloaded(nullptr, &on_host_full);
  test::expect_same_logits(on_host, got, std::string(GetParam()) + " offloaded");
  EXPECT_LT(host_capped, host_full) << "the host's KV homes did not shrink to the window";
}

INSTANTIATE_TEST_SUITE_P(EveryLayerSlides, WindowCap, ::testing::Values("arch/mistral", "arch/phi3"),
                         [](const auto& info) { return std::string(info.param).substr(5); });

// Mixtures of experts with 4-bit weights (router and experts) and KV, weights split over device,
// host and disk, CPU attention and H2O: the in-memory compressed run's logits bit for bit, on the
// hazard-checking device too (every access of an expert ordered after its load).
class OffloadMoe : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(OffloadMoe, CompressedSplitRunMatchesInMemory) {
  const auto [name, check] = GetParam();
  Model model = Model::load_dir(model_dir(name));
  ASSERT_TRUE(model.config().moe());
  const auto reqs = test::arch_requests(name, model.config(), 4);
  const auto policy = kv_policy(KvPolicyKind::kH2o);
  CpuDeviceOptions co;
  co.threads = 2, co.check_hazards = check, co.max_delay_us = check ? 200 : 0;
  CpuDevice dev(co);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = make_policy(Case{name, "30 30 34 33 0 100", 2, 2, true, true});
  o.policy.compress_weight = o.policy.compress_cache = true;
  o.offload_dir = dir.path() / "store";
  o.kv_policy = policy.get();
  OffloadEngine eng(model, dev, o);
  CompressedWeights cw(model);
  Forward fwd(model, dev);
  fwd.use_weights(&cw.weights());
  InMemoryRunner ref(fwd, eng.max_batch(), policy.get(), DType::Q4);
  test::expect_same_logits(test::run_greedy(eng, reqs), test::run_greedy(ref, reqs), name);
  EXPECT_EQ(eng.report().weight_dtype, "Q4");
}

INSTANTIATE_TEST_SUITE_P(Experts, OffloadMoe,
                         ::testing::Combine(::testing::Values("arch/mixtral", "arch/qwen3_moe", "arch/qwen2_moe",
                                                              "arch/olmoe"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)).substr(5) +
                                  (std::get<1>(info.param) ? "_hazards" : "");
                         });

}  // namespace
}  // namespace flexh2o
