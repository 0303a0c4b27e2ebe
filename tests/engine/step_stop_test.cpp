// A stop flag set while a step runs (as the signal thread sets it during a long prefill): the
// step ends at its next layer (in memory) or schedule unit (offloading engine) by throwing
// StepStopped, the runner's next batch gives the logits of an untouched runner, and the drivers
// turn the stop into an interrupted run (generation) or ScoringStopped / a partial perplexity.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "engine/evaluate.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "engine/perplexity.h"
#include "runner_compare.h"
#include "step_stop.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;
using test::StoppingPolicy;
using test::stop_requests;

TEST(StepStop, InMemoryStepEndsBeforeItsNextLayer) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::atomic<bool> stop{false};
  StoppingPolicy policy(stop);
  InMemoryRunner run(fwd, 4, &policy), fresh(fwd, 4, &policy);
  test::expect_stops_within_a_layer(run, fresh, policy, stop, "in memory", test::expect_same_logits);
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
    test::expect_stops_within_a_layer(run, fresh, policy, stop, name, test::expect_same_logits);
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
      const std::vector<GenerationResult> out = generate(run, stop_requests(), o, &st);
      EXPECT_EQ(run.stopped, 1) << what;
      EXPECT_EQ(run.steps, at + 1) << what;
      EXPECT_TRUE(st.interrupted) << what;
      EXPECT_EQ(st.generated_tokens, 2 * at) << what;  // the batch's 2 sequences, a token each step before
      // A prefill stopped midway prefilled no prompt token (a rate over them would be inflated).
      EXPECT_EQ(st.prompt_tokens, at == 0 ? 0 : 16) << what;  // 2 prompts of 8 tokens
      EXPECT_EQ(st.padded_prompt_tokens, at == 0 ? 0 : 16) << what;
      EXPECT_EQ(st.continuous, continuous) << what;  // known before the first step ends
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_FALSE(out[i].finished) << what << " request " << i;
        EXPECT_EQ(out[i].tokens.size(), i < 2 ? size_t(at) : 0u) << what << " request " << i;
      }
      // The stop belonged to that run: the runner's later steps run whole though the flag is set.
      const test::PaddedPrompts p = test::pad_prompts(stop_requests());
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
  for (const GenerationRequest& r : stop_requests()) lr.push_back({r.prompt_ids, {17, 262, 401}});
  {
    InMemoryRunner inner(fwd, 4);
    std::atomic<bool> stop{false};
    StopDuring run(inner, stop, 0);
    EXPECT_THROW(loglikelihoods(run, lr, kScoringLogitsBytes, &stop), ScoringStopped);
    EXPECT_EQ(run.stopped, 1);
  }
  for (bool streamed : {false, true}) {  // eval-choice's item: its choices' steps
    InMemoryRunner inner(fwd, 4);
    std::atomic<bool> stop{false};
    StopDuring run(inner, stop, 0);
    EXPECT_THROW(streamed ? score_choices_streamed(run, lr, &stop) : score_choices(run, lr, &stop), ScoringStopped);
    EXPECT_EQ(run.stopped, 1) << streamed;
  }
  // Perplexity a token a step: stopped in its 4th step, it is the mean of the 3 tokens before.
  const std::vector<int32_t> ids = stop_requests()[0].prompt_ids;
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
  // Stopped in its first step, nothing is scored: no mean, and it says so.
  InMemoryRunner first_inner(fwd, 1);
  std::atomic<bool> first_stop{false};
  StopDuring first(first_inner, first_stop, 0);
  const PerplexityResult none = streaming_perplexity(first, ids, nullptr, {}, 0, &first_stop);
  EXPECT_TRUE(none.interrupted);
  EXPECT_EQ(none.tokens, 0);
  EXPECT_TRUE(std::isnan(none.mean_nll));
  // The in-memory perplexity's chunk ends at its next layer too (a chunk of 256 is one step).
  std::atomic<bool> set{true};
  const PerplexityResult chunk = perplexity(fwd, ids, 256, DType::F16, {}, &set);
  EXPECT_TRUE(chunk.interrupted);
  EXPECT_EQ(chunk.tokens, 0);
}

}  // namespace
}  // namespace flexh2o
