// GpuOffloadRunner against the all-resident GpuRunner on the tiny models (label gpu; skipped
// without a device). Same dtype, same kernels, same weight bytes: with one micro-batch the
// GEMM shapes are identical too, so logits must be bitwise equal; with two micro-batches each
// GEMM has half the rows and cuBLAS may pick another kernel (another summation order), so
// logits are held to a tight relative tolerance (1e-3 of the row's peak) and greedy tokens
// must be equal. Also: every weight placement of the stream schedule (all streamed, none,
// no overlap), the bytes counted per step, the budget errors, and the cache and hidden
// states homed on the host (host attention, H2O there).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/generate.h"
#include "engine/bible_requests.h"
#include "engine/test_util.h"
#include "gpu/gpu_offload_runner.h"
#include "gpu/gpu_runner.h"
#include "gpu_fixture.h"
#include "kernels/cuda/cuda_probe.h"
#include "policies/kv_config.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;

class GpuOffloadTest : public test::GpuModelTest {};

gpu::GpuOffloadOptions options(double wg, int64_t gbs, int64_t ngb, bool overlap = true) {
  gpu::GpuOffloadOptions o;
  o.policy.w_gpu_percent = wg, o.policy.w_cpu_percent = 100 - wg;
  o.policy.gpu_batch_size = gbs, o.policy.num_gpu_batches = ngb;
  o.policy.overlap = overlap;
  return o;
}

std::vector<GenerationRequest> requests(const std::string& model, int64_t gen) {
  return test::bible_requests(model, gen);
}

std::vector<std::vector<int32_t>> tokens(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  return test::greedy_tokens(r, reqs);
}

// Prefill + teacher-forced decode through both runners; `exact`: bitwise equal logits.
void compare_steps(const std::string& name, const Model& m, StepRunner& ref, StepRunner& off, bool exact,
                   const std::string& what) {
  const ModelConfig& c = m.config();
  auto reqs = requests(name, 1);
  const int64_t B = int64_t(reqs.size()), steps = 5;
  test::PaddedBatch pb = test::left_pad(reqs, c.pad_id.value_or(0));
  const int64_t S = pb.S;
  std::vector<int32_t>&ids = pb.ids, &pos = pb.pos, &real = pb.real;
  ref.begin_batch(B, S + steps);
  off.begin_batch(B, S + steps);
  std::vector<float> lr, lo;
  std::vector<int32_t> next(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
  for (int64_t s = 0; s < steps; ++s) {
    if (s == 0) {
      ref.step(ids.data(), pos.data(), S, real.data(), lr);
      off.step(ids.data(), pos.data(), S, real.data(), lo);
    } else {
      ref.step(next.data(), next_pos.data(), 1, nullptr, lr);
      off.step(next.data(), next_pos.data(), 1, nullptr, lo);
    }
    ASSERT_EQ(lo.size(), lr.size());
    for (int64_t b = 0; b < B; ++b) {
      const float* r = lr.data() + b * c.vocab_size;
      const float* o = lo.data() + b * c.vocab_size;
      double peak = 0, worst = 0;
      for (int64_t j = 0; j < c.vocab_size; ++j) peak = std::max(peak, double(std::fabs(r[j])));
      for (int64_t j = 0; j < c.vocab_size; ++j) worst = std::max(worst, double(std::fabs(r[j] - o[j])));
      if (exact) EXPECT_EQ(worst, 0.0) << what << " step " << s << " seq " << b;
      else EXPECT_LE(worst, 1e-3 * peak + 1e-3) << what << " step " << s << " seq " << b;
      next[size_t(b)] = int32_t(std::max_element(r, r + c.vocab_size) - r);
      next_pos[size_t(b)] = real[size_t(b)] + int32_t(s);
    }
  }
}

TEST_P(GpuOffloadTest, OneMicroBatchIsBitwiseTheResidentRunner) {
  Model m = Model::load_dir(model_dir(GetParam()));
  gpu::GpuRunner ref(m, {4, nullptr, 0});
  gpu::GpuOffloadRunner off(m, options(30, 4, 1));
  compare_steps(GetParam(), m, ref, off, true, GetParam() + " 30/70, 1 micro-batch");
  const gpu::GpuOffloadReport r = off.report();
  EXPECT_GT(r.weight_device_bytes, 0u);
  EXPECT_GT(r.weight_host_bytes, 0u);
  EXPECT_GT(r.weight_bytes_moved, 0u);
  EXPECT_EQ(r.steps, 5);
}

TEST_P(GpuOffloadTest, TwoMicroBatchesMatchTheResidentRunnerClosely) {
  Model m = Model::load_dir(model_dir(GetParam()));
  gpu::GpuRunner ref(m, {4, nullptr, 0});
  gpu::GpuOffloadRunner off(m, options(30, 2, 2));
  compare_steps(GetParam(), m, ref, off, false, GetParam() + " 30/70, 2 micro-batches");
}

TEST_P(GpuOffloadTest, GreedyTokensEqualTheResidentRunnerForEveryPlacement) {
  Model m = Model::load_dir(model_dir(GetParam()));
  auto reqs = requests(GetParam(), 8);
  gpu::GpuRunner ref(m, {4, nullptr, 0});
  const auto want = tokens(ref, reqs);
  struct Case {
    double wg;
    int64_t gbs, ngb;
    bool overlap;
  };
  for (const Case& k : {Case{30, 4, 1, true}, Case{30, 2, 2, true}, Case{0, 2, 2, true}, Case{100, 4, 1, true},
                        Case{30, 1, 2, false}, Case{0, 3, 1, true}}) {
    gpu::GpuOffloadRunner off(m, options(k.wg, k.gbs, k.ngb, k.overlap));
    EXPECT_EQ(tokens(off, reqs), want) << GetParam() << " w_g " << k.wg << " block " << k.gbs << "x" << k.ngb
                                       << (k.overlap ? "" : " no overlap");
    if (k.wg == 100) {
      EXPECT_EQ(off.report().weight_bytes_moved, 0u);
    }
  }
}

TEST_P(GpuOffloadTest, TooSmallBudgetFailsNamingTheBytes) {
  Model m = Model::load_dir(model_dir(GetParam()));
  gpu::GpuOffloadOptions o = options(30, 4, 1);
  o.device_budget = size_t(1) << 20;  // less than the cuBLAS workspace alone
  try {
    gpu::GpuOffloadRunner r(m, o);
    FAIL() << "constructed within 1 MiB";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* s : {"weights homed on the GPU", "weight double buffer", "cuBLAS workspace", "budget is 1.0 MiB"})
      EXPECT_NE(msg.find(s), std::string::npos) << s << " in: " << msg;
  }
  // Room for the weights but not for a long batch's KV cache: refused at the prefill.
  o.device_budget = size_t(48) << 20;
  gpu::GpuOffloadRunner r(m, o);
  r.begin_batch(4, 2000);
  std::vector<int32_t> ids(4 * 1000, 1), pos(4 * 1000);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i % 1000);
  std::vector<float> logits;
  try {
    r.step(ids.data(), pos.data(), 1000, nullptr, logits);
    FAIL() << "a 4 x 2000 batch fit in 48 MiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache (4 x 2000 tokens)"), std::string::npos) << e.what();
  }
}

// The cache on the host with the decode attention there (FlexGen's OPT-30B shape), with the
// hidden states on the GPU or on the host: the q/k/v rows go down in F16 and the attention
// output comes up in F16, exactly the roundings the resident runner makes on the device, so
// logits stay within the two-micro-batch tolerance and greedy tokens are equal.
gpu::GpuOffloadOptions host_cache(double wg, int64_t gbs, int64_t ngb, bool act_host, const KvPolicy* kv = nullptr) {
  gpu::GpuOffloadOptions o = options(wg, gbs, ngb);
  o.policy.cache_gpu_percent = 0, o.policy.cache_cpu_percent = 100;
  o.policy.cpu_cache_compute = true;
  if (act_host) o.policy.act_gpu_percent = 0, o.policy.act_cpu_percent = 100;
  o.kv_policy = kv;
  return o;
}

TEST_P(GpuOffloadTest, HostCacheWithHostAttentionMatchesTheResidentRunner) {
  Model m = Model::load_dir(model_dir(GetParam()));
  gpu::GpuRunner ref(m, {4, nullptr, 0});
  gpu::GpuOffloadRunner one(m, host_cache(20, 4, 1, false));
  compare_steps(GetParam(), m, ref, one, false, GetParam() + " host cache, 1 micro-batch");
  const gpu::GpuOffloadReport r = one.report();
  EXPECT_GT(r.host_attention_seconds, 0.0);
  EXPECT_GT(r.stream_busy_seconds[0], 0.0);
  EXPECT_GT(r.overlap_efficiency(), 0.0);
  EXPECT_LE(r.overlap_efficiency(), 1.0 + 1e-6);
  auto reqs = requests(GetParam(), 8);
  gpu::GpuRunner ref8(m, {4, nullptr, 0});
  const auto want = tokens(ref8, reqs);
  struct Case {
    double wg;
    int64_t gbs, ngb;
    bool act_host;
  };
  for (const Case& k : {Case{20, 4, 1, false}, Case{20, 2, 2, true}, Case{0, 1, 3, true}, Case{100, 3, 1, false}}) {
    gpu::GpuOffloadRunner off(m, host_cache(k.wg, k.gbs, k.ngb, k.act_host));
    EXPECT_EQ(tokens(off, reqs), want) << GetParam() << " host cache, w_g " << k.wg << " block " << k.gbs << "x"
                                       << k.ngb << (k.act_host ? " act host" : "");
    EXPECT_EQ(off.kv_bytes() > 0, true);
  }
}

TEST_P(GpuOffloadTest, H2oOnTheHostCacheMatchesTheResidentRunnersH2o) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const auto pol = test::h2o_policy(4, 4);
  auto reqs = requests(GetParam(), 8);
  gpu::GpuRunner ref(m, {4, pol.get(), 0});
  const auto want = tokens(ref, reqs);
  for (int64_t gbs : {int64_t(4), int64_t(2)}) {
    gpu::GpuOffloadRunner off(m, host_cache(20, gbs, 4 / gbs, true, pol.get()));
    EXPECT_EQ(tokens(off, reqs), want) << GetParam() << " h2o 4+4 on the host cache, micro-batches of " << gbs;
    for (int32_t n : off.lengths()) EXPECT_LE(n, 7) << "the budget holds";
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, GpuOffloadTest, ::testing::Values("tiny-opt", "tiny-llama"));

}  // namespace
}  // namespace flexh2o
