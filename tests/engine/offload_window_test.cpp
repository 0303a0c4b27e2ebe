// The offloading engine's window cap (full_cache_window()): with the full cache, the sliding
// layers of a model whose other layers attend to everything (Gemma 2/3, a Qwen2 with
// use_sliding_window) keep only their window once sequences pass it. Checked against the
// in-memory full cache on every placement of the KV cache, step by step.
#include <gtest/gtest.h>

#include "arch_requests.h"
#include "engine/cpu_device.h"
#include "engine/kv_evict.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

struct Placement {
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool cpu_attention;
  int tier;  // where the KV homes are: 0 device, 1 host, 2 disk
};

const Placement kPlacements[] = {
    {"100 0 100 0 100 0", 2, 2, false, 0},
    {"0 100 0 100 100 0", 2, 2, false, 1},
    {"0 100 0 100 100 0", 3, 2, true, 1},   // host attention
    {"0 100 0 0 100 0", 2, 2, false, 2},
    {"50 50 0 0 0 100", 4, 1, true, 2},     // disk KV, host attention, activations on the host
    {"100 0 34 33 100 0", 3, 2, false, 2},  // device and disk KV (a third of 3 rounds to none on the host)
};

class WindowCapMixed : public ::testing::TestWithParam<const char*> {};

// Every step's logits are the uncapped in-memory full cache's to 1e-4 (the sliding layers'
// slots hold the same keys, reordered by the oldest leaving, so sums differ in the last bits),
// every placement gives the capped in-memory run's logits bit for bit, and the tier holding the
// KV holds less than the uncapped run's.
TEST_P(WindowCapMixed, SlidingLayersKeepTheWindowWithTheFullCachesLogits) {
  Model model = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = model.config();
  const int64_t n_sliding = count_sliding_layers(c);
  ASSERT_GT(n_sliding, 0);
  ASSERT_LT(n_sliding, c.n_layers) << "a model whose other layers attend to everything";
  const int64_t gen = 40;
  const auto reqs = test::arch_requests(GetParam(), c, gen);
  int64_t max_len = 0;
  for (const auto& r : reqs) max_len = std::max(max_len, int64_t(r.prompt_ids.size()) + gen);
  ASSERT_GT(max_len, c.sliding_window + 10) << "the run must pass the window";
  ASSERT_EQ(full_cache_window(c, false, max_len), c.sliding_window);
  CpuDevice dev(2);
  Forward fwd(model, dev);
  InMemoryRunner full(fwd, 6, nullptr, DType::F16, false), in_memory(fwd, 6, nullptr, DType::F16);
  const test::Run want = test::run_greedy(full, reqs);
  // The in-memory runner caps as the engine does (one rule), and holds less.
  const test::Run in_memory_capped = test::run_forced(in_memory, reqs, want.tokens);
  EXPECT_EQ(in_memory.window_cap(), c.sliding_window);
  EXPECT_LT(in_memory.kv_bytes(), full.kv_bytes());
  EXPECT_GT(test::expect_close_logits(in_memory_capped, want, 1e-4, 1e-4, "in memory"), 0.0);

  for (const Placement& pl : kPlacements) {
    const std::string what = std::string(GetParam()) + " [" + pl.percent + "]" + (pl.cpu_attention ? " cpu-attn" : "");
    auto run = [&](bool cap, test::Run* out) {
      test::TempDir dir;
      OffloadOptions o;
      o.policy = test::policy_of(pl.percent, pl.gbs, pl.ngb, pl.cpu_attention);
      o.offload_dir = dir.path() / "store";
      o.kv_dtype = DType::F16;
      o.window_cap = cap;
      OffloadEngine eng(model, dev, o);
      *out = test::run_forced(eng, reqs, want.tokens);
      EXPECT_EQ(eng.window_cap(), cap ? c.sliding_window : 0) << what;
      return eng.report().peak[size_t(pl.tier)];
    };
    test::Run capped, uncapped;
    const uint64_t held = run(true, &capped), held_full = run(false, &uncapped);
    const double worst = test::expect_close_logits(capped, want, 1e-4, 1e-4, what);
    EXPECT_GT(worst, 0.0) << what << ": the capped run evicted nothing";
    test::expect_same_logits(uncapped, want, what + " uncapped");
    EXPECT_LT(held, held_full) << what << ": the KV homes did not shrink";
    test::expect_same_logits(capped, in_memory_capped, what + " against the capped in-memory run");
  }
}

INSTANTIATE_TEST_SUITE_P(SomeLayersSlide, WindowCapMixed,
                         ::testing::Values("arch/gemma2", "arch/gemma3_text_linear", "arch/qwen2_window"),
                         [](const auto& info) { return std::string(info.param).substr(5); });

// A policy of the caller's, or sequences that never pass the window: no cap.
TEST(WindowCapMixed, OnlyTheFullCachePastTheWindowIsCapped) {
  Model model = Model::load_dir(model_dir("arch/gemma2"));
  const ModelConfig& c = model.config();
  EXPECT_EQ(full_cache_window(c, false, c.sliding_window), 0) << "never past the window";
  EXPECT_EQ(full_cache_window(c, false, c.sliding_window + 1), c.sliding_window);
  EXPECT_EQ(full_cache_window(c, true, 1000), 0) << "the caller's policy decides";
  ModelConfig unslid = c;
  unslid.sliding_layers.clear();
  EXPECT_EQ(full_cache_window(unslid, false, 1000), 0);
}

}  // namespace
}  // namespace flexh2o
