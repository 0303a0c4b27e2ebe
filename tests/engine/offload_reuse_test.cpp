// The offloading engine keeps a batch's pinned host buffers (KV homes, staging, activations) for
// the next batch of the same sizes: reused bytes are reported, and a reused engine's logits equal
// a fresh engine's bit for bit (stale contents from the batch before never show).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "bible_requests.h"
#include "engine/cpu_device.h"
#include "engine/kv_evict.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

struct ReuseCase {
  const char* percent;
  bool cpu_attention;
  bool h2o;
};

class OffloadReuse : public ::testing::TestWithParam<ReuseCase> {};

TEST_P(OffloadReuse, EqualBatchesReusePinnedBuffersAndMatchAFreshEngine) {
  const ReuseCase& rc = GetParam();
  const std::string what = std::string(rc.percent) + (rc.cpu_attention ? " cpu-attn" : "") + (rc.h2o ? " h2o" : "");
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  std::unique_ptr<KvPolicy> kv;
  if (rc.h2o) {
    KvPolicyConfig k;
    k.kind = KvPolicyKind::kH2o;
    k.heavy_budget = 4, k.recent_budget = 3;
    kv = make_policy(k);
  }
  test::TempDir dir, fresh_dir;
  OffloadOptions o;
  o.policy = test::policy_of(rc.percent, 2, 2, rc.cpu_attention);
  o.offload_dir = dir.path();
  o.kv_policy = kv.get();
  OffloadEngine eng(model, dev, o);
  // The same four prompts in the other order: the same longest prompt and capacity (so the same
  // buffer sizes), other contents in every sequence's slots.
  const auto a = test::bible_requests("tiny-opt", 6);
  auto b = a;
  std::reverse(b.begin(), b.end());
  (void)test::run_greedy(eng, a);
  EXPECT_EQ(eng.report().batch_buffers_reused_bytes, 0u) << what;
  EXPECT_GT(eng.report().batch_setup_seconds, 0.0) << what;
  o.offload_dir = fresh_dir.path();
  OffloadEngine fresh(model, dev, o);
  const test::Run ref_b = test::run_greedy(fresh, b);
  const test::Run got_b = test::run_forced(eng, b, ref_b.tokens);
  EXPECT_GT(eng.report().batch_buffers_reused_bytes, 0u)
      << what << ": a second batch of the same sizes reuses the first's pinned buffers";
  test::expect_same_logits(got_b, test::run_forced(fresh, b, ref_b.tokens), what + ", reused");
  // A longer batch after them: new sizes, the same logits as a fresh engine's.
  auto c = test::bible_requests("tiny-opt", 9);
  c[1].prompt_ids.insert(c[1].prompt_ids.end(), a[0].prompt_ids.begin() + 1, a[0].prompt_ids.end());
  const test::Run ref_c = test::run_greedy(fresh, c);
  test::expect_same_logits(test::run_forced(eng, c, ref_c.tokens), test::run_forced(fresh, c, ref_c.tokens),
                           what + ", longer batch");
}

INSTANTIATE_TEST_SUITE_P(Placements, OffloadReuse,
                         ::testing::Values(ReuseCase{"0 100 0 100 0 100", true, false},
                                           ReuseCase{"20 30 34 33 0 100", true, true},
                                           ReuseCase{"50 50 0 100 100 0", false, true},
                                           ReuseCase{"100 0 0 50 100 0", false, false}));

}  // namespace
}  // namespace flexh2o
