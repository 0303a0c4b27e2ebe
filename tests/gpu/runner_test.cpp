// GpuRunner against the CPU InMemoryRunner on the tiny models (label gpu; skipped without a
// device): logits of a left-padded batch within fp16 tolerance over prefill and teacher-forced
// decode steps, equal greedy tokens over a short horizon, H2O keeping the same slots (token
// positions per layer, sequence and KV head), and the "does not fit" error.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generate.h"
#include "engine/bible_requests.h"
#include "engine/test_util.h"
#include "gpu/gpu_runner.h"
#include "gpu_fixture.h"
#include "kernels/cuda/cuda_probe.h"
#include "policies/kv_policy.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;

class GpuRunnerTest : public test::GpuModelTest {};

std::vector<GenerationRequest> requests(const std::string& model, int64_t gen) {
  return test::bible_requests(model, gen);
}

std::unique_ptr<KvPolicy> h2o(int64_t heavy, int64_t recent) { return test::h2o_policy(heavy, recent); }

std::vector<std::vector<int32_t>> tokens(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  return test::greedy_tokens(r, reqs);
}

// Per row of `vocab` logits: normalised squared error and the worst element relative to the
// row's largest magnitude (fp16 activations, fp32 logits).
void expect_logits_close(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t vocab,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t r = 0; r < cpu.size() / size_t(vocab); ++r) {
    double err = 0, ref = 0, worst = 0, peak = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double g = gpu[r * size_t(vocab) + size_t(j)], c = cpu[r * size_t(vocab) + size_t(j)];
      ASSERT_FALSE(std::isnan(g)) << what << " row " << r;
      err += (g - c) * (g - c);
      ref += c * c;
      worst = std::max(worst, std::fabs(g - c));
      peak = std::max(peak, std::fabs(c));
    }
    EXPECT_LT(err / std::max(ref, 1e-30), 1e-4) << what << " row " << r << ": NMSE";
    EXPECT_LT(worst, 0.02 * peak + 0.02) << what << " row " << r << ": max |gpu - cpu| " << worst
                                         << " (largest |logit| " << peak << ")";
  }
}

TEST_P(GpuRunnerTest, LeftPaddedLogitsMatchCpuOverPrefillAndDecode) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  auto reqs = requests(GetParam(), 1);
  const int64_t B = int64_t(reqs.size()), steps = 6;
  test::PaddedBatch pb = test::left_pad(reqs, c.pad_id.value_or(0));
  const int64_t S = pb.S;
  std::vector<int32_t>&ids = pb.ids, &pos = pb.pos, &real = pb.real;
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner cpu(fwd, B);
  gpu::GpuRunner gpu(m, {B, nullptr, 0});
  cpu.begin_batch(B, S + steps);
  gpu.begin_batch(B, S + steps);
  std::vector<float> lc, lg;
  cpu.step(ids.data(), pos.data(), S, real.data(), lc);
  gpu.step(ids.data(), pos.data(), S, real.data(), lg);
  expect_logits_close(lg, lc, c.vocab_size, GetParam() + " prefill");
  std::vector<int32_t> next(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
  for (int64_t s = 0; s < steps - 1; ++s) {  // teacher-forced with the CPU's greedy tokens
    for (int64_t b = 0; b < B; ++b) {
      const float* row = lc.data() + b * c.vocab_size;
      next[size_t(b)] = int32_t(std::max_element(row, row + c.vocab_size) - row);
      next_pos[size_t(b)] = real[size_t(b)] + int32_t(s);
    }
    cpu.step(next.data(), next_pos.data(), 1, nullptr, lc);
    gpu.step(next.data(), next_pos.data(), 1, nullptr, lg);
    expect_logits_close(lg, lc, c.vocab_size, GetParam() + " decode step " + std::to_string(s));
  }
  ASSERT_EQ(gpu.lengths().size(), size_t(B));
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(gpu.lengths()[size_t(b)], real[size_t(b)] + steps - 1);
}

TEST_P(GpuRunnerTest, GreedyTokensEqualCpuBatchedAndAlone) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 8);
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner cpu(fwd, 4);
  gpu::GpuRunner batched(m, {4, nullptr, 0});
  gpu::GpuRunner alone(m, {1, nullptr, 0});
  const auto want = tokens(cpu, reqs);
  EXPECT_EQ(tokens(batched, reqs), want);
  EXPECT_EQ(tokens(alone, reqs), want);
}

TEST_P(GpuRunnerTest, H2oKeepsTheSameSlotsAsTheCpu) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  auto reqs = requests(GetParam(), 6);
  auto policy = h2o(4, 4);
  // CPU reference driven step by step so its cache can be inspected: the same left-padded
  // batch as generate() builds, then greedy decode.
  const int64_t B = int64_t(reqs.size()), gen = 6;
  test::PaddedBatch pb = test::left_pad(reqs, c.pad_id.value_or(0));
  const int64_t S = pb.S;
  std::vector<int32_t>&ids = pb.ids, &pos = pb.pos, &real = pb.real;
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::vector<KvBudget> budgets;
  int64_t need = S;
  for (int64_t b = 0; b < B; ++b) {
    budgets.push_back(policy->budget(real[size_t(b)]));
    need = std::max(need, budgets.back().total());
  }
  KvCache cache(c, B, std::min(S + gen, need));
  cache.enable_policy(c, budgets);
  gpu::GpuRunner gpu(m, {B, policy.get(), 0});
  gpu.begin_batch(B, S + gen);
  std::vector<float> lc, lg;
  fwd.step(ids.data(), pos.data(), S, real.data(), cache, LogitsRows::kLast, lc, policy.get());
  gpu.step(ids.data(), pos.data(), S, real.data(), lg);
  std::vector<int32_t> next(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
  for (int64_t s = 0;; ++s) {
    // Same slots: per layer, sequence and KV head, the token position held by every slot.
    ASSERT_EQ(gpu.lengths(), cache.lengths()) << "step " << s;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const KvPolicyState* gs = gpu.policy_state(l);
      ASSERT_NE(gs, nullptr);
      const KvPolicyState& cs = cache.state(int(l));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < c.n_kv_heads; ++h) {
          const int32_t* gp = gs->pos.data() + (b * c.n_kv_heads + h) * gs->capacity;
          const int32_t* cp = cs.pos.data() + (b * c.n_kv_heads + h) * cs.capacity;
          EXPECT_EQ(std::vector<int32_t>(gp, gp + cache.length(b)), std::vector<int32_t>(cp, cp + cache.length(b)))
              << "step " << s << " layer " << l << " seq " << b << " kv head " << h;
        }
    }
    if (s == gen - 1) break;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = lc.data() + b * c.vocab_size;
      next[size_t(b)] = int32_t(std::max_element(row, row + c.vocab_size) - row);
      next_pos[size_t(b)] = real[size_t(b)] + int32_t(s);
    }
    fwd.step(next.data(), next_pos.data(), 1, nullptr, cache, LogitsRows::kLast, lc, policy.get());
    gpu.step(next.data(), next_pos.data(), 1, nullptr, lg);
    expect_logits_close(lg, lc, c.vocab_size, GetParam() + " h2o decode step " + std::to_string(s));
  }
}

TEST_P(GpuRunnerTest, H2oWithABudgetCoveringTheSequenceIsFull) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 8);
  auto big = h2o(200, 200);
  gpu::GpuRunner full(m, {4, nullptr, 0});
  gpu::GpuRunner covered(m, {4, big.get(), 0});
  EXPECT_EQ(tokens(covered, reqs), tokens(full, reqs));
}

TEST_P(GpuRunnerTest, ModelTooBigForTheBudgetIsAClearError) {
  Model m = Model::load_dir(model_dir(GetParam()));
  try {
    gpu::GpuRunner r(m, {4, nullptr, size_t(1) << 20});  // 1 MiB for the weights
    FAIL() << "the weights should not fit in 1 MiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the weights of " + m.config().name), std::string::npos) << msg;
    EXPECT_NE(msg.find("need "), std::string::npos) << msg;
    EXPECT_NE(msg.find("but only 1.0 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use --device cpu"), std::string::npos) << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GpuRunnerTest, ::testing::Values("tiny-opt", "tiny-llama"));

}  // namespace
}  // namespace flexh2o
