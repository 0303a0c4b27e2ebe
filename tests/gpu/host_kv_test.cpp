// HostKv (the CUDA offloading runner's cache on the host) with the CPU kernels standing in
// for the device: an emulated runner does what GpuOffloadRunner does with --percent .. 0 100
// .. --cpu-cache-compute: the prefill runs whole on the "device" over a staging segment whose
// rows (rounded to F16/BF16, as they cross the link) go to HostKv::store_rows with the
// prefill's scores; later steps hand the rounded q/k/v to HostKv::attend and finish on its
// rounded output. Greedy tokens must equal the all-fp32 InMemoryRunner's, with and without KV
// policies, over micro-batches that start mid-batch; budgets hold after every step.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "engine/bible_requests.h"
#include "engine/generate.h"
#include "engine/layer_compute.h"
#include "engine/test_util.h"
#include "gpu/host_kv.h"
#include "policies/kv_config.h"

namespace flexh2o {
namespace {
using test::model_dir;

std::vector<uint16_t> rounded(DType dt, const float* x, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  gpu::from_f32(dt, x, n, out.data());
  return out;
}

class EmulatedHostKvRunner final : public StepRunner {
 public:
  EmulatedHostKvRunner(const Model& m, DType dt, const KvPolicy* p, int64_t gbs)
      : m_(m), c_(m.config()), dt_(dt), policy_(p), gbs_(gbs), kv_(c_, dt, p) {}
  const ModelConfig& config() const override { return c_; }
  int64_t max_batch() const override { return 64; }
  void begin_batch(int64_t B, int64_t capacity) override {
    B_ = B, cap_ = capacity, started_ = false;
  }
  size_t kv_bytes() const override { return kv_.bytes(); }
  const gpu::HostKv& kv() const { return kv_; }

  void step(const int32_t* ids, const int32_t* pos, int64_t T, const int32_t* real, std::vector<float>& logits) override {
    const bool prefill = !started_;
    if (prefill) kv_.begin(B_, cap_, T, real);
    started_ = true;
    std::vector<int32_t> keys(static_cast<size_t>(B_));
    for (int64_t b = 0; b < B_; ++b) keys[size_t(b)] = kv_.lengths()[size_t(b)] + int32_t(real ? real[b] : T);
    kv_.begin_step(keys.data());
    const int64_t H = c_.hidden, V = c_.vocab_size, kvh = c_.n_kv_heads, hd = c_.head_dim;
    logits.assign(static_cast<size_t>(B_ * V), 0.f);
    for (int64_t first = 0; first < B_; first += gbs_) {
      const int64_t n = std::min(gbs_, B_ - first), M = n * T;
      const StepShape s{n, T, pos + first * T, keys.data() + first};
      std::vector<float> h(static_cast<size_t>(M * H));
      lc_.embed(c_, m_.weights(), ids + first * T, s, h.data());
      for (int64_t l = 0; l < c_.n_layers; ++l) {
        const LayerWeights& L = m_.weights().layers[size_t(l)];
        if (prefill) {
          std::vector<float> sk(static_cast<size_t>(n * kvh * T * hd)), sv(sk.size());
          std::vector<float> sc(policy_ && policy_->needs_scores() ? size_t(n * c_.n_heads * T) : 0);
          const KvSegment seg{sk.data(), sv.data(), 0, n, T, sc.empty() ? nullptr : sc.data()};
          lc_.layer(c_, L, s, h.data(), {&seg, 1});
          const auto k16 = rounded(dt_, sk.data(), int64_t(sk.size()));
          const auto v16 = rounded(dt_, sv.data(), int64_t(sv.size()));
          kv_.store_rows(l, first, n, T, k16.data(), v16.data(), sc.empty() ? nullptr : sc.data());
        } else {
          lc_.qkv(c_, L, s, h.data());
          const auto q16 = rounded(dt_, lc_.q(), M * c_.q_dim());
          const auto k16 = rounded(dt_, lc_.k(), M * c_.kv_dim());
          const auto v16 = rounded(dt_, lc_.v(), M * c_.kv_dim());
          std::vector<uint16_t> out16(static_cast<size_t>(M * c_.q_dim()));
          kv_.attend(l, first, n, T, q16.data(), k16.data(), v16.data(), out16.data());
          std::vector<float> out(out16.size());
          gpu::to_f32(dt_, out16.data(), int64_t(out16.size()), out.data());
          lc_.load_attn(c_, s, out.data());
          lc_.finish(c_, L, s, h.data());
        }
      }
      std::vector<float> lg;
      lc_.head(c_, m_.weights(), s, h.data(), true, lg);
      std::copy(lg.begin(), lg.end(), logits.begin() + first * V);
    }
    kv_.end_step();
  }

 private:
  const Model& m_;
  const ModelConfig& c_;
  DType dt_;
  const KvPolicy* policy_;
  int64_t gbs_, B_ = 0, cap_ = 0;
  bool started_ = false;
  gpu::HostKv kv_;
  LayerCompute lc_;
};

std::vector<std::vector<int32_t>> tokens(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  return test::greedy_tokens(r, reqs);
}

std::unique_ptr<KvPolicy> h2o(int64_t heavy, int64_t recent) { return test::h2o_policy(heavy, recent); }

class HostKvEmulated : public ::testing::TestWithParam<std::string> {};

TEST_P(HostKvEmulated, GreedyTokensEqualTheInMemoryRunnerWithAndWithoutH2o) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const auto reqs = test::bible_requests(GetParam(), 8);
  ASSERT_GE(reqs.size(), 3u);
  CpuDevice dev(2);
  Forward fwd(m, dev);
  const auto pol = h2o(4, 4);
  for (const KvPolicy* p : {static_cast<const KvPolicy*>(nullptr), static_cast<const KvPolicy*>(pol.get())}) {
    InMemoryRunner ref(fwd, 64, p);
    const auto want = tokens(ref, reqs);
    for (int64_t gbs : {int64_t(1), int64_t(2), int64_t(64)}) {
      EmulatedHostKvRunner emu(m, DType::F16, p, gbs);
      EXPECT_EQ(tokens(emu, reqs), want) << GetParam() << (p ? " h2o 4+4" : " full") << ", micro-batches of "
                                         << gbs;
      if (p) {
        for (int32_t n : emu.kv().lengths()) EXPECT_LE(n, 7) << "the budget (8 with the incoming token) holds";
        ASSERT_NE(emu.kv().state(0), nullptr);
      } else {
        EXPECT_EQ(emu.kv().state(0), nullptr);
      }
    }
  }
  EmulatedHostKvRunner bf(m, DType::BF16, nullptr, 2);  // BF16 rounds more: the run completes
  EXPECT_EQ(tokens(bf, reqs).size(), reqs.size());
}

INSTANTIATE_TEST_SUITE_P(TinyModels, HostKvEmulated, ::testing::Values("tiny-opt", "tiny-llama"));

TEST(HostKv, CapacityFollowsThePolicyAndBadCallsFailClearly) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  const ModelConfig& c = m.config();
  gpu::HostKv full(c, DType::F16, nullptr);
  EXPECT_EQ(full.begin(3, 50, 7, nullptr), 50);
  EXPECT_EQ(full.bytes(), size_t(2 * c.n_layers * 3 * c.n_kv_heads * 50 * c.head_dim) * sizeof(float));
  const auto pol = h2o(4, 4);
  gpu::HostKv small(c, DType::F16, pol.get());
  EXPECT_EQ(small.begin(2, 50, 5, nullptr), 8);   // the budget is larger than the prompt
  EXPECT_EQ(small.begin(2, 50, 20, nullptr), 8);   // the prefill is evicted before it is stored
  EXPECT_EQ(small.bytes(), size_t(2 * c.n_layers * 2 * c.n_kv_heads * 8 * c.head_dim) * sizeof(float));
  const std::vector<int32_t> prompt = {20, 3};
  small.begin_step(prompt.data());  // 20 rows in the prefill's block: evicted to 7 when stored
  small.end_step();
  EXPECT_EQ(small.lengths(), (std::vector<int32_t>{7, 3}));
  const std::vector<int32_t> over = {9, 4};
  EXPECT_THROW(small.begin_step(over.data()), Error);  // 9 slots > 8
  EXPECT_THROW(gpu::HostKv(c, DType::F32, nullptr), Error);
  EXPECT_THROW(full.begin(2, 10, 11, nullptr), Error);  // prompt longer than the capacity
  // A cache no machine holds: a clear error naming the bytes, not std::bad_alloc.
  try {
    full.begin(int64_t(1) << 20, int64_t(1) << 20, 1, nullptr);
    FAIL() << "allocated an impossible host cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host KV cache"), std::string::npos) << e.what();
  }
  // The object stays usable after the failure.
  EXPECT_EQ(full.begin(1, 4, 2, nullptr), 4);
  const std::vector<int32_t> two = {2};
  full.begin_step(two.data());
  std::vector<uint16_t> rows(size_t(c.n_kv_heads * 1 * c.head_dim));
  EXPECT_THROW(full.store_rows(0, 0, 1, 1, rows.data(), rows.data(), nullptr), Error);  // 2 tokens in 1 row
}

}  // namespace
}  // namespace flexh2o
