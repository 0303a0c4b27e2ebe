// Test helpers for a stop flag set while a step runs (tests/engine/step_stop_test.cpp on the CPU
// device, tests/gpu/engine_test.cpp on CUDA): a KV policy that sets the flag from inside a step,
// and the check that the step ends within a layer and leaves the runner usable.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "engine/runner.h"
#include "policies/kv_policy.h"
#include "runner_compare.h"

namespace flexh2o::test {

// `local` with 4 recent tokens that, armed, sets *stop at its first eviction (a prefill whose
// prompts are longer than 4 evicts in every layer) and counts the rows it evicts from.
class StoppingPolicy final : public KvPolicy {
 public:
  explicit StoppingPolicy(std::atomic<bool>& stop) : stop_(stop) {
    KvPolicyConfig c;
    c.kind = KvPolicyKind::kLocal;
    c.recent_budget = 4;
    local_ = make_policy(c);
  }
  KvPolicyKind kind() const override { return local_->kind(); }
  std::string_view name() const override { return local_->name(); }
  bool needs_scores() const override { return local_->needs_scores(); }
  KvBudget budget(int64_t prompt_len) const override { return local_->budget(prompt_len); }
  void select_victims(const SlotView& s, const KvBudget& budget, int64_t keep,
                      std::vector<int32_t>& victims) const override {
    if (armed) stop_ = true;
    ++rows;
    local_->select_victims(s, budget, keep, victims);
  }
  bool armed = false;
  mutable std::atomic<int64_t> rows{0};

 private:
  std::atomic<bool>& stop_;
  std::unique_ptr<KvPolicy> local_;
};

inline std::vector<GenerationRequest> stop_requests(int n = 4) {
  std::vector<GenerationRequest> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    r[size_t(i)].prompt_ids = {2, int32_t(44 + i), 81, 262, 2313, int32_t(401 + i), 3557, 262};
    r[size_t(i)].max_new_tokens = 4;
    r[size_t(i)].sampling.temperature = 0;
  }
  return r;
}

// The prefill of stop_requests() with the policy armed: it must throw StepStopped having evicted
// in at most one layer (a whole step evicts in every layer); then, disarmed and with the flag
// clear, the runner's next batch must give the logits of `fresh` (an untouched runner), as
// `compare` (got, want, what) judges.
template <class Compare>
void expect_stops_within_a_layer(StepRunner& run, StepRunner& fresh, StoppingPolicy& policy,
                                 std::atomic<bool>& stop, const std::string& what, Compare compare) {
  const ModelConfig& c = run.config();
  const test::PaddedPrompts p = pad_prompts(stop_requests());
  std::vector<float> logits;
  policy.rows = 0;
  run.begin_batch(p.B, p.S + 4);
  run.step(p.ids.data(), p.pos.data(), p.S, p.real.data(), logits);  // the whole step, as counted
  const int64_t whole = policy.rows.load();
  ASSERT_GT(whole, 0) << what << ": the prompts must pass the policy's budget";
  ASSERT_EQ(whole % c.n_layers, 0) << what;
  policy.rows = 0;
  policy.armed = true;
  run.stop_steps_on(&stop);
  run.begin_batch(p.B, p.S + 4);
  EXPECT_THROW(run.step(p.ids.data(), p.pos.data(), p.S, p.real.data(), logits), StepStopped) << what;
  EXPECT_GT(policy.rows.load(), 0) << what;
  EXPECT_LE(policy.rows.load(), whole / c.n_layers) << what << ": more than one layer ran after the stop";
  policy.armed = false;
  stop = false;
  compare(run_greedy(run, stop_requests()), run_greedy(fresh, stop_requests()), what + ", the next batch");
}

}  // namespace flexh2o::test
