// KV policies inside the engine: H2O with a budget covering the sequence equals full, the
// cache never exceeds the budget, eviction is per sequence (padding and batching do not
// change results), and small budgets really change what attention sees.
#include <gtest/gtest.h>

#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "policies/kv_policy.h"
#include "bible_requests.h"
#include "policy_of.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;

std::unique_ptr<KvPolicy> policy(KvPolicyKind kind, int64_t heavy, int64_t recent, int64_t sinks = 0) {
  KvPolicyConfig c;
  c.kind = kind;
  if (kind == KvPolicyKind::kH2o || kind == KvPolicyKind::kRandom) c.heavy_budget = heavy;
  if (kind != KvPolicyKind::kFull) c.recent_budget = recent;
  if (kind == KvPolicyKind::kSinks) c.sink_tokens = sinks;
  return make_policy(c);
}

std::vector<GenerationRequest> requests(const std::string& model, int64_t gen) {
  return test::bible_requests(model, gen);
}

std::vector<std::vector<int32_t>> run(const Model& m, const KvPolicy* p, const std::vector<GenerationRequest>& reqs,
                                      int64_t batch) {
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner r(fwd, batch, p);
  GenerateOptions o;
  o.ignore_eos = true;
  std::vector<std::vector<int32_t>> out;
  for (auto& g : generate(r, reqs, o)) out.push_back(g.tokens);
  return out;
}

class KvPolicyEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(KvPolicyEngine, H2oWithBudgetCoveringTheSequenceIsExactlyFull) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 12);
  auto full = run(m, nullptr, reqs, 4);
  auto big = policy(KvPolicyKind::kH2o, 200, 200);
  EXPECT_EQ(run(m, big.get(), reqs, 4), full);
  auto full_policy = policy(KvPolicyKind::kFull, 0, 0);
  EXPECT_EQ(run(m, full_policy.get(), reqs, 4), full);
}

TEST_P(KvPolicyEngine, SmallBudgetsChangeResultsButNotAcrossBatching) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 16);
  auto full = run(m, nullptr, reqs, 4);
  for (KvPolicyKind kind : {KvPolicyKind::kH2o, KvPolicyKind::kLocal, KvPolicyKind::kSinks, KvPolicyKind::kRandom}) {
    auto p = policy(kind, 3, 3, 2);
    auto batched = run(m, p.get(), reqs, 4);
    auto alone = run(m, p.get(), reqs, 1);
    EXPECT_EQ(batched, alone) << kv_policy_name(kind);  // padding and batch mates do not matter
    EXPECT_NE(batched, full) << kv_policy_name(kind);   // a 6-token budget must change something
  }
}

TEST_P(KvPolicyEngine, CacheNeverHoldsMoreThanTheBudget) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  CpuDevice dev(2);
  Forward fwd(m, dev);
  auto p = policy(KvPolicyKind::kH2o, 4, 3);  // budget 7: attention sees <= 7 tokens
  std::vector<int32_t> ids{int32_t(c.bos_id.value_or(0)), 44, 81, 262, 2313, 401, 3557, 262, 789, 271, 262, 656};
  const int64_t S = int64_t(ids.size());
  KvCache cache(c, 1, S);
  cache.enable_policy(c, {p->budget(S)});
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  std::vector<float> logits;
  fwd.step(ids.data(), pos.data(), S, nullptr, cache, LogitsRows::kLast, logits, p.get());
  EXPECT_EQ(cache.length(0), 6);  // budget - 1: room for the next token
  for (int i = 0; i < 20; ++i) {
    int32_t tok = 262, position = int32_t(S + i);
    fwd.step(&tok, &position, 1, nullptr, cache, LogitsRows::kLast, logits, p.get());
    EXPECT_EQ(cache.length(0), 6);
    EXPECT_EQ(cache.seen()[0], S + i + 1);
    // The most recent tokens (recent - 1 of them) always survive; positions stay unique.
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const int32_t* pp = cache.state(0)->pos.data() + h * cache.capacity();
      std::vector<int32_t> kept(pp, pp + 6);
      std::sort(kept.begin(), kept.end());
      EXPECT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end());
      EXPECT_EQ(kept.back(), S + i);
      EXPECT_EQ(kept[4], S + i - 1);
    }
  }
}

// Offloaded runs with a policy equal the in-memory run with the same policy, on every tier.
TEST_P(KvPolicyEngine, OffloadedRunsWithAPolicyEqualInMemory) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 14);
  for (KvPolicyKind kind : {KvPolicyKind::kH2o, KvPolicyKind::kSinks, KvPolicyKind::kRandom}) {
    auto p = policy(kind, 4, 3, 2);
    auto want = run(m, p.get(), reqs, 4);
    const char* percents[][2] = {{"100 0 100 0 100 0", "0"}, {"0 100 0 100 100 0", "0"}, {"30 30 34 33 0 100", "0"},
                                 {"0 100 0 0 100 0", "1"}, {"50 50 34 33 100 0", "1"}};
    for (auto& [pct, cpu] : percents) {
      test::TempDir dir;
      OffloadOptions o;
      std::istringstream is(pct);
      is >> o.policy.w_gpu_percent >> o.policy.w_cpu_percent >> o.policy.cache_gpu_percent >>
          o.policy.cache_cpu_percent >> o.policy.act_gpu_percent >> o.policy.act_cpu_percent;
      o.policy.gpu_batch_size = 3;
      o.policy.num_gpu_batches = 2;
      o.policy.cpu_cache_compute = std::string(cpu) == "1";
      o.offload_dir = dir.path();
      o.kv_policy = p.get();
      CpuDevice dev(2);
      OffloadEngine e(m, dev, o);
      GenerateOptions go;
      go.ignore_eos = true;
      std::vector<std::vector<int32_t>> got;
      for (auto& g : generate(e, reqs, go)) got.push_back(g.tokens);
      EXPECT_EQ(got, want) << kv_policy_name(kind) << " with --percent " << pct << (cpu[0] == '1' ? " --cpu" : "");
    }
  }
}

// peak_kv_bytes counts K/V slots alike in memory and offloaded with the cache on the device
// (the prompt's slots, at the prefill), not H2O's score state; homed on the host, the budget's.
TEST_P(KvPolicyEngine, PeakKvBytesCountTheSameSlotsInMemoryAndOffloaded) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  auto reqs = requests(GetParam(), 6);
  auto p = policy(KvPolicyKind::kH2o, 4, 3);
  GenerateOptions go;
  go.ignore_eos = true;
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner mem(fwd, 6, p.get());
  GenerateStats want;
  (void)generate(mem, reqs, go, &want);
  int64_t longest = 0;
  for (const auto& r : reqs) longest = std::max<int64_t>(longest, int64_t(r.prompt_ids.size()));
  const uint64_t slot = uint64_t(c.kv_bytes_per_token(DType::F16));
  EXPECT_EQ(want.peak_kv_bytes, slot * uint64_t(longest) * reqs.size());
  for (const char* pct : {"100 0 100 0 100 0", "0 100 0 100 100 0"}) {
    OffloadOptions o;
    o.policy = test::policy_of(pct, 6, 1);
    o.kv_policy = p.get();
    OffloadEngine e(m, dev, o);
    GenerateStats got;
    (void)generate(e, reqs, go, &got);
    EXPECT_EQ(got.peak_kv_bytes, pct[0] == '1' ? want.peak_kv_bytes : slot * 7 * reqs.size()) << pct;
  }
}

// KV bytes moved per decode step stop growing with context: they follow the budget.
TEST_P(KvPolicyEngine, KvBytesMovedShrinkAsTheBudgetPredicts) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  const int64_t prompt = 40, gen = 12;
  std::vector<GenerationRequest> reqs(2);
  for (auto& r : reqs) {
    r.prompt_ids.assign(size_t(prompt), 262);
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
  }
  auto kv_moved = [&](const KvPolicy* p) {
    OffloadOptions o;
    o.policy.cache_gpu_percent = 0;
    o.policy.cache_cpu_percent = 100;  // KV on the host, attention on the device: rows cross each step
    o.policy.gpu_batch_size = 2;
    o.kv_policy = p;
    CpuDevice dev(2);
    OffloadEngine e(m, dev, o);
    GenerateOptions go;
    go.ignore_eos = true;
    generate(e, reqs, go);
    return e.report().kv_bytes;
  };
  const uint64_t row = uint64_t(2 * c.n_kv_heads * c.head_dim) * 2 * uint64_t(c.n_layers);  // f16 KV
  // Full: prefill stores 40 rows; decode step j loads 40 + j rows and stores 1.
  uint64_t full = 0;
  for (int64_t j = 0; j < gen - 1; ++j) full += uint64_t(prompt + j + 1) * row;
  full += uint64_t(prompt) * row;
  EXPECT_EQ(kv_moved(nullptr), 2 * full);
  // H2O 5 + 5 (budget 10): prefill stores 9 rows; each decode step loads 9 rows and stores 1.
  auto h2o = policy(KvPolicyKind::kH2o, 5, 5);
  const uint64_t small = uint64_t(9) * row + uint64_t(gen - 1) * uint64_t(9 + 1) * row;
  EXPECT_EQ(kv_moved(h2o.get()), 2 * small);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, KvPolicyEngine, ::testing::Values("tiny-opt", "tiny-llama"));

}  // namespace
}  // namespace flexh2o
