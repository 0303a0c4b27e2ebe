// The transformers-written arch models (tests/data/arch: each rope type, Phi-3's fused
// projections and partial rotary, Qwen3's q/k norms, the mixtures of experts; head_dim 64, and
// Phi-3-mini's 96) on the CUDA device (label gpu; skipped without one): teacher-forced logits of
// every step within f16 tolerance of the CPU device's in-memory run, everything resident and
// with weights and KV cache in host memory; a 4-bit cache of head_dim 96 refused before any work.
#include <gtest/gtest.h>

#include <sstream>

#include "core/error.h"
#include "engine/arch_requests.h"
#include "engine/cpu_device.h"
#include "engine/offload_engine.h"
#include "engine/runner_compare.h"
#include "gpu/cuda_device.h"
#include "gpu/skip_without_gpu.h"

namespace flexh2o {
namespace {
using test::model_dir;

class GpuArch : public test::SkipWithoutGpu<::testing::TestWithParam<const char*>> {};

TEST_P(GpuArch, LogitsWithinF16ToleranceOfTheCpuDevice) {
  Model model = Model::load_dir(model_dir(GetParam()));
  const auto reqs = test::arch_requests(GetParam(), model.config(), 4);
  CpuDevice cpu(0);
  Forward fwd(model, cpu);
  InMemoryRunner ref(fwd, int64_t(reqs.size()), nullptr, DType::F16);
  const test::Run want = test::run_greedy(ref, reqs);
  const test::Run forced = test::run_forced(ref, reqs, want.tokens);
  auto dev = gpu::make_cuda_device({});
  for (const char* percent : {"100 0 100 0 100 0", "0 100 0 100 100 0"}) {
    OffloadOptions o;
    std::istringstream is(percent);
    is >> o.policy.w_gpu_percent >> o.policy.w_cpu_percent >> o.policy.cache_gpu_percent >>
        o.policy.cache_cpu_percent >> o.policy.act_gpu_percent >> o.policy.act_cpu_percent;
    o.policy.gpu_batch_size = int64_t(reqs.size());
    o.policy.num_gpu_batches = 1;
    o.kv_dtype = DType::F16;
    test::TempDir dir;
    o.offload_dir = dir.path();
    OffloadEngine eng(model, *dev, o);
    // The logits span about +-4 (random weights, 2 layers). The CPU device rounding its
    // activations to f16 (CpuDeviceOptions::act_dtype) lands within 0.0035 of fp32 on every model.
    test::expect_close_logits(test::run_forced(eng, reqs, want.tokens), forced, 0.06, 0.02,
                              std::string(GetParam()) + " [" + percent + "]");
  }
}

class GpuKvDtype : public test::SkipWithoutGpu<> {};

TEST_F(GpuKvDtype, AFourBitCacheOfHeadDim96IsRefusedBeforeAnyWork) {
  Model model = Model::load_dir(model_dir("arch/phi3_hd96"));
  auto dev = gpu::make_cuda_device({});
  OffloadOptions o;
  o.policy.gpu_batch_size = 2;
  o.policy.num_gpu_batches = 1;
  o.policy.compress_cache = true;
  test::TempDir dir;
  o.offload_dir = dir.path();
  try {
    OffloadEngine eng(model, *dev, o);
    ADD_FAILURE() << "a Q4 cache of head_dim 96 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4-bit KV cache (--compress-cache) for head_dim 64, 128 and 256"),
              std::string::npos)
        << e.what();
  }
  o.policy.compress_cache = false;
  EXPECT_NO_THROW(OffloadEngine(model, *dev, o));
}

INSTANTIATE_TEST_SUITE_P(Transformers, GpuArch, ::testing::ValuesIn(test::arch_models()),
                         [](const auto& info) { return std::string(info.param).substr(5); });

}  // namespace
}  // namespace flexh2o
