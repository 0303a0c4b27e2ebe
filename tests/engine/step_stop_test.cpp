// A stop flag set while a step runs (as the signal thread sets it during a long prefill): the
// step ends at its next layer (in memory) or schedule unit (offloading engine) by throwing
// StepStopped, the runner's next batch gives the logits of an untouched runner, and the drivers
// turn the stop into an interrupted run (generation) or ScoringStopped / a partial perplexity.
#include <gtest/gtest.h>

#include <atomic>

#include "engine/evaluate.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

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

std::vector<GenerationRequest> reqs(int n = 4) {
  std::vector<GenerationRequest> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    r[size_t(i)].prompt_ids = {2, int32_t(44 + i), 81, 262, 2313, int32_t(401 + i), 3557, 262};
    r[size_t(i)].max_new_tokens = 4;
    r[size_t(i)].sampling.temperature = 0;
  }
  return r;
}

// The prefill of reqs() with the policy armed: it must throw StepStopped having evicted in at
// most one layer (a whole step evicts in every layer); then, disarmed and with the flag clear,
// the runner's next batch must give the logits of `fresh` (an untouched runner).
void expect_stops_within_a_layer(StepRunner& run, StepRunner& fresh, StoppingPolicy& policy,
                                 std::atomic<bool>& stop, const std::string& what) {
  const ModelConfig& c = run.config();
  const test::PaddedPrompts p = test::pad_prompts(reqs());
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
  test::expect_same_logits(test::run_greedy(run, reqs()), test::run_greedy(fresh, reqs()), what + ", the next batch");
}

TEST(StepStop, InMemoryStepEndsBeforeItsNextLayer) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::atomic<bool> stop{false};
  StoppingPolicy policy(stop);
  InMemoryRunner run(fwd, 4, &policy), fresh(fwd, 4, &policy);
  expect_stops_within_a_layer(run, fresh, policy, stop, "in memory");
}

TEST(StepStop, OffloadedStepEndsAtItsNextUnit) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model m = Model::load_dir(model_dir(name));
    CpuDevice dev(2);
    std::atomic<bool> stop{false};
    StoppingPolicy policy(stop);
    OffloadOptions o;
    o.policy.w_gpu_percent = 0;  // weights streamed from the host, a unit at a time
    o.policy.w_cpu_percent = 100;
    o.policy.cache_gpu_percent = 0;
    o.policy.cache_cpu_percent = 100;
    o.policy.gpu_batch_size = 2;
    o.policy.num_gpu_batches = 2;
    o.kv_policy = &policy;
    OffloadEngine run(m, dev, o), fresh(m, dev, o);
    expect_stops_within_a_layer(run, fresh, policy, stop, name);
  }
}

// Sets *stop while its `at`-th step (0: the prefill) runs, before the inner runner runs it, and
// counts the steps the inner runner ended early.
class StopDuring final : public ForwardingRunner {
 public:
  StopDuring(StepRunner& inner, std::atomic<bool>& stop, int at) : ForwardingRunner(inner), stop_(stop), at_(at) {}
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    step_rows(ids, positions, T, real_rows, 1, logits);
  }
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override {
    if (steps++ == at_) stop_ = true;
    try {
      inner().step_rows(ids, positions, T, real_rows, rows, logits);
    } catch (const StepStopped&) {
      ++stopped;
      throw;
    }
  }
  int steps = 0, stopped = 0;

 private:
  std::atomic<bool>& stop_;
  int at_;
};

TEST(StepStop, GenerationEndsInTheStepUnderWay) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  for (bool continuous : {false, true}) {
    for (int at : {0, 2}) {  // the prefill; the second decode step
      const std::string what = std::string(continuous ? "continuous" : "static") + ", stop in step " +
                               std::to_string(at);
      InMemoryRunner inner(fwd, 2);
      std::atomic<bool> stop{false};
      StopDuring run(inner, stop, at);
      GenerateOptions o;
      o.stop = &stop;
      o.continuous = continuous;
      o.ignore_eos = true;
      GenerateStats st;
      const std::vector<GenerationResult> out = generate(run, reqs(), o, &st);
      EXPECT_EQ(run.stopped, 1) << what;
      EXPECT_EQ(run.steps, at + 1) << what;
      EXPECT_TRUE(st.interrupted) << what;
      EXPECT_EQ(st.generated_tokens, 2 * at) << what;  // the batch's 2 sequences, a token each step before
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_FALSE(out[i].finished) << what << " request " << i;
        EXPECT_EQ(out[i].tokens.size(), i < 2 ? size_t(at) : 0u) << what << " request " << i;
      }
      // The stop belonged to that run: the runner's later steps run whole though the flag is set.
      const test::PaddedPrompts p = test::pad_prompts(reqs());
      std::vector<float> logits;
      inner.begin_batch(p.B, p.S + 1);
      EXPECT_NO_THROW(inner.step(p.ids.data(), p.pos.data(), p.S, p.real.data(), logits)) << what;
    }
  }
}

TEST(StepStop, ScoringEndsInTheStepUnderWay) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::vector<LoglikRequest> lr;
  for (const GenerationRequest& r : reqs()) lr.push_back({r.prompt_ids, {17, 262, 401}});
  {
    InMemoryRunner inner(fwd, 4);
    std::atomic<bool> stop{false};
    StopDuring run(inner, stop, 0);
    EXPECT_THROW(loglikelihoods(run, lr, kScoringLogitsBytes, &stop), ScoringStopped);
    EXPECT_EQ(run.stopped, 1);
  }
  // Perplexity a token a step: stopped in its 4th step, it is the mean of the 3 tokens before.
  const std::vector<int32_t> ids = reqs()[0].prompt_ids;
  InMemoryRunner whole_run(fwd, 1);
  std::vector<double> nll;
  const PerplexityResult whole = streaming_perplexity(whole_run, ids, &nll, {}, 0);
  ASSERT_FALSE(whole.interrupted);
  InMemoryRunner inner(fwd, 1);
  std::atomic<bool> stop{false};
  StopDuring run(inner, stop, 3);
  const PerplexityResult cut = streaming_perplexity(run, ids, nullptr, {}, 0, &stop);
  EXPECT_EQ(run.stopped, 1);
  EXPECT_TRUE(cut.interrupted);
  ASSERT_EQ(cut.tokens, 3);
  const double want = (nll[0] + nll[1] + nll[2]) / 3;
  EXPECT_NEAR(cut.mean_nll, want, 1e-12 * std::abs(want));
}

}  // namespace
}  // namespace flexh2o
