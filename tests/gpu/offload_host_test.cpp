// Host-side plan of the CUDA offloading runner, tested without a GPU: the stream/event mapping
// of build_schedule() steps (every dependency honoured, cross-stream ones by an event wait,
// same-stream ones by stream order; also with the cache and hidden states on the host), the
// weights' device layout and the device-memory need, which policies the runner takes, and the
// CLI gate (wired policies reach the runner; a split cache, disk, ... get a clear error).
#include <gtest/gtest.h>

#include "cli/run_setup.h"
#include "cli_run.h"
#include "engine/placement.h"
#include "engine/schedule.h"
#include "engine/test_util.h"
#include "gpu/gpu_offload_runner.h"
#include "gpu/memory_plan.h"
#include "gpu/offload_plan.h"
#include "kernels/cuda/cuda_probe.h"

namespace flexh2o {
namespace {
using test::model_dir;

ScheduleShape shape(int layers, int K, const std::vector<bool>& streams, bool prefill, bool loaded, bool next) {
  ScheduleShape s;
  s.units = layers + 2;
  s.micro_batches = K;
  s.unit_streams = streams;
  s.unit_disk.assign(size_t(s.units), false);
  s.prefill = prefill;
  s.first_layer_loaded = loaded;
  s.prefetch_next = next;
  return s;
}

// Every dependency is honoured: on the same stream by order (and then never waited on), on
// another stream by a wait on a step of that stream at or after it; waits are deps only.
void expect_plan_honours(const Schedule& s, const gpu::StreamPlan& p, const std::string& what) {
  ASSERT_EQ(p.stream.size(), s.steps.size());
  ASSERT_EQ(p.waits.size(), s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    EXPECT_EQ(p.stream[i], st.queue == Queue::kCompute ? 0 : st.queue == Queue::kHostToDevice ? 1 : 2)
        << what << " " << s.label(int(i));
    for (int w : p.waits[i]) {
      EXPECT_NE(p.stream[size_t(w)], p.stream[i]) << what << " " << s.label(int(i)) << " waits on its own stream";
      EXPECT_NE(std::find(st.deps.begin(), st.deps.end(), w), st.deps.end()) << what << " waits on a non-dep";
    }
    for (int d : st.deps) {
      ASSERT_LT(size_t(d), i) << what;
      if (p.stream[size_t(d)] == p.stream[i]) continue;  // stream order
      bool covered = false;
      for (int w : p.waits[i]) covered = covered || (p.stream[size_t(w)] == p.stream[size_t(d)] && w >= d);
      EXPECT_TRUE(covered) << what << ": " << s.label(int(i)) << " does not wait for " << s.label(d);
    }
  }
}

TEST(GpuStreamPlan, EveryDependencyIsAnEventWaitOrStreamOrder) {
  const int L = 4, U = L + 2;
  const std::vector<std::vector<bool>> streams = {std::vector<bool>(U, true),
                                                  {false, true, false, true, true, false},
                                                  std::vector<bool>(U, false),
                                                  {true, false, true, true, false, true}};
  int cross = 0;
  for (const auto& st : streams)
    for (int K : {1, 2, 3})
      for (bool prefill : {true, false})
        for (bool loaded : {false, true})
          for (bool next : {false, true}) {
            const Schedule s = build_schedule(shape(L, K, st, prefill, loaded, next));
            const gpu::StreamPlan p = gpu::plan_streams(s);
            expect_plan_honours(s, p, "K=" + std::to_string(K) + (prefill ? " prefill" : " decode"));
            for (const auto& w : p.waits) cross += int(w.size());
            const gpu::StreamPlan serial = gpu::plan_streams(s, false);  // --overlap false
            for (size_t i = 0; i < s.steps.size(); ++i) {
              EXPECT_EQ(serial.stream[i], 0);
              EXPECT_TRUE(serial.waits[i].empty());
            }
          }
  EXPECT_GT(cross, 0);  // streamed weights make compute wait on the copy stream
}

TEST(GpuStreamPlan, StreamedLayerComputeWaitsForItsLoadAndLoadsWaitForTheSlotsReader) {
  const Schedule s = build_schedule(shape(4, 2, std::vector<bool>(6, true), false, false, true));
  const gpu::StreamPlan p = gpu::plan_streams(s);
  const int c3 = s.find(StepKind::kCompute, 3, 0), lw3 = s.find(StepKind::kLoadWeight, 3, 0);
  ASSERT_GE(c3, 0);
  ASSERT_GE(lw3, 0);
  EXPECT_EQ(p.waits[size_t(c3)], std::vector<int>{lw3});
  // LW(3) reuses slot 1 after unit 1's last micro-batch computed.
  EXPECT_EQ(p.waits[size_t(lw3)], std::vector<int>{s.find(StepKind::kCompute, 1, 1)});
  // C(3,1) follows C(3,0) on the compute stream and LW(3) through C(3,0): no wait.
  EXPECT_TRUE(p.waits[size_t(s.find(StepKind::kCompute, 3, 1))].empty() ||
              p.waits[size_t(s.find(StepKind::kCompute, 3, 1))] == std::vector<int>{lw3});
}

TEST(GpuStreamPlan, DiskQueuesAreRefused) {
  ScheduleShape sh = shape(2, 1, std::vector<bool>(4, true), true, false, false);
  sh.unit_disk.assign(4, true);
  EXPECT_THROW(gpu::plan_streams(build_schedule(sh)), Error);
}

Policy weights_split(double wg, double wc) {
  Policy p;
  p.w_gpu_percent = wg, p.w_cpu_percent = wc;
  return p;
}

TEST(GpuOffloadLayout, HomesPlusStreamedCoverTheWeightsAndSlotsFitTheLargestUnit) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {
    Model m = Model::load_dir(model_dir(name));
    const size_t all = gpu::gpu_weight_bytes(m, DType::F16);
    for (double wg : {0.0, 30.0, 100.0}) {
      const WeightPlacement wp = place_weights(m, weights_split(wg, 100 - wg));
      const gpu::DeviceLayout l = gpu::device_layout(wp, DType::F16);
      // A tied lm_head is one tensor in gpu_weight_bytes; here a host-homed copy counts twice.
      EXPECT_GE(l.home_bytes + l.host_bytes, all) << name << " " << wg;
      EXPECT_LE(l.home_bytes + l.host_bytes, all + wp.units.back().tensors.back().bytes) << name << " " << wg;
      size_t largest = 0;
      for (size_t u = 0; u < wp.units.size(); ++u) {
        largest = std::max(largest, l.unit_streamed[u]);
        for (size_t i = 0; i < l.offset[u].size(); ++i) {
          EXPECT_EQ(l.offset[u][i] % gpu::kTensorAlign, 0u);
          EXPECT_EQ(l.streamed[u][i], wp.units[u].tensors[i].tier == Tier::kHost);
        }
      }
      EXPECT_EQ(l.slot_bytes, largest);
      if (wg == 100) {
        EXPECT_EQ(l.slot_bytes, 0u) << name;
      } else if (wg == 0) {
        EXPECT_EQ(l.home_bytes, 0u) << name;
      } else {
        EXPECT_GT(l.home_bytes, 0u) << name;
        EXPECT_GT(l.slot_bytes, 0u) << name;
      }
    }
    EXPECT_THROW(gpu::device_layout(place_weights(m, weights_split(0, 50)), DType::F16), Error) << name;
  }
}

TEST(GpuOffloadNeed, CountsEveryItemAndTheBudgetErrorNamesThem) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  const ModelConfig& c = m.config();
  const gpu::DeviceLayout l = gpu::device_layout(place_weights(m, weights_split(30, 70)), DType::F16);
  const gpu::GpuOffloadNeed fixed = gpu::gpu_offload_need(c, l, 0, 4, 1, 1);
  EXPECT_EQ(fixed.total(), l.home_bytes + 2 * l.slot_bytes + gpu::kCublasWorkspaceBytes);
  const int64_t B = 3, gbs = 2, T = 17, cap = 40;
  const gpu::GpuOffloadNeed need = gpu::gpu_offload_need(c, l, B, gbs, T, cap);
  const gpu::BatchBuffers b = gpu::batch_buffers(c, DType::F16, B, gbs, T, cap);
  EXPECT_EQ(need.total(), fixed.total() + b.total());
  EXPECT_EQ(b.kv(), gpu::gpu_kv_bytes(c, DType::F16, B, cap));  // 40 slots x 64 dims x 2 B: aligned already
  EXPECT_EQ(b.scratch, gpu::gpu_scratch_bytes(c, DType::F16, gbs * T, gbs));  // one micro-batch at a time
  EXPECT_EQ(b.inputs, size_t(3 * B * T + B) * 4);
  EXPECT_EQ(gpu::budget_error(need, need.total(), "x"), "");
  const std::string e = gpu::budget_error(need, need.total() - 1, "a batch of 3");
  for (const char* s : {"a batch of 3 needs", "weights homed on the GPU", "weight double buffer", "KV cache",
                        "compute scratch", "cuBLAS workspace", "budget is", "--gpu-mem"})
    EXPECT_NE(e.find(s), std::string::npos) << s << " in: " << e;
}

TEST(CudaGate, WholeTiersWithoutDiskMayUseCudaSplitsAndDiskMayNot) {
  cli::OffloadArgs off;
  off.percent = {30, 70, 100, 0, 100, 0};
  EXPECT_EQ(cli::cuda_unsupported_reason(off), "");
  off.gpu_mem = "16GiB";
  off.gpu_batch_size = 8;
  EXPECT_EQ(cli::cuda_unsupported_reason(off), "");
  EXPECT_NE(cli::cuda_unsupported_reason(off, "auto"), "");  // auto keeps offloading on the CPU device
  for (std::vector<double> ok : {std::vector<double>{30, 70, 100, 0, 0, 100}, {20, 80, 0, 100, 0, 100},
                                 {0, 100, 0, 100, 100, 0}}) {
    off.percent = ok;
    off.cpu_cache_compute = ok[3] == 100;
    EXPECT_EQ(cli::cuda_unsupported_reason(off), "") << ok[2] << " " << ok[4];
  }
  off.cpu_cache_compute = false;
  // The host cache without host attention; a split cache (even with it); activations on disk;
  // weights on disk. The last number: --cpu-cache-compute.
  for (std::vector<double> bad : {std::vector<double>{30, 70, 0, 100, 100, 0, 0}, {30, 70, 50, 50, 100, 0, 1},
                                  {30, 70, 100, 0, 0, 0, 0}, {30, 50, 100, 0, 100, 0, 0}}) {
    off.cpu_cache_compute = bad.back() > 0;
    bad.pop_back();
    off.percent = bad;
    EXPECT_NE(cli::cuda_unsupported_reason(off).find("not wired on CUDA yet"), std::string::npos) << bad[2];
  }
  off.cpu_cache_compute = false;
  off.percent = {30, 70, 100, 0, 100, 0};
  off.offload_dir = "/tmp";
  EXPECT_NE(cli::cuda_unsupported_reason(off), "");
}

TEST(CudaGate, CliSendsWeightOffloadingToTheGpuRunnerAndRefusesTheRest) {
  if (probe_cuda().available) GTEST_SKIP() << "a GPU is present (gpu_runner_test covers the run)";
  const std::string base = "bench -m " + model_dir("tiny-opt").string() + " --prompt-len 4 --gen-len 2 --device cuda";
  test::RunResult ok = test::run_flexh2o(base + " --percent 30 70 100 0 100 0");
  EXPECT_EQ(ok.code, 1);
  EXPECT_NE(ok.err.find(probe_cuda().reason), std::string::npos) << ok.err;  // past the gate: no GPU here
  EXPECT_EQ(ok.err.find("not wired"), std::string::npos) << ok.err;
  // FlexGen's OPT-30B shape (cache and activations on the host, host attention): past the gate.
  test::RunResult fg = test::run_flexh2o(base + " --percent 20 80 0 100 0 100 --cpu-cache-compute --kv-policy h2o");
  EXPECT_EQ(fg.code, 1);
  EXPECT_NE(fg.err.find(probe_cuda().reason), std::string::npos) << fg.err;
  test::RunResult kv = test::run_flexh2o(base + " --percent 30 70 0 100 100 0");
  EXPECT_EQ(kv.code, 1);
  EXPECT_NE(kv.err.find("this offloading policy is not wired on CUDA yet"), std::string::npos) << kv.err;
  EXPECT_NE(kv.err.find("--cpu-cache-compute"), std::string::npos) << kv.err;
}

TEST(GpuOffloadRunnerWithoutGpu, RefusesAnUnwiredPolicyFirstThenSaysWhy) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  gpu::GpuOffloadOptions o;
  o.policy.cache_gpu_percent = 0, o.policy.cache_cpu_percent = 100;
  try {
    gpu::GpuOffloadRunner r(m, o);
    FAIL() << "constructed with the KV cache on the host and no host attention";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add --cpu-cache-compute"), std::string::npos) << e.what();
  }
  if (probe_cuda().available) GTEST_SKIP() << "a GPU is present";
  o.policy = weights_split(30, 70);
  try {
    gpu::GpuOffloadRunner r(m, o);
    FAIL() << "constructed without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use --device cpu"), std::string::npos) << e.what();
  }
}

Policy tiers(double wg, double cg, double ag, bool cpu_attention) {
  Policy p;
  p.w_gpu_percent = wg, p.w_cpu_percent = 100 - wg;
  p.cache_gpu_percent = cg, p.cache_cpu_percent = 100 - cg;
  p.act_gpu_percent = ag, p.act_cpu_percent = 100 - ag;
  p.cpu_cache_compute = cpu_attention;
  return p;
}

TEST(GpuOffloadPolicy, WholeTiersAreWiredSplitsAndDiskAreNot) {
  EXPECT_NO_THROW(gpu::check_gpu_offload_policy(tiers(30, 100, 100, false), false));
  EXPECT_NO_THROW(gpu::check_gpu_offload_policy(tiers(20, 0, 0, true), true));  // FlexGen 30B, + H2O
  EXPECT_NO_THROW(gpu::check_gpu_offload_policy(tiers(0, 0, 100, true), false));
  EXPECT_NO_THROW(gpu::check_gpu_offload_policy(tiers(100, 100, 0, false), false));
  auto refused = [](const Policy& p, bool kv, const char* why) {
    try {
      gpu::check_gpu_offload_policy(p, kv);
      ADD_FAILURE() << p.str() << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(tiers(20, 0, 100, false), false, "add --cpu-cache-compute");
  refused(tiers(20, 50, 100, true), false, "a split cache");
  Policy act_disk = tiers(20, 100, 0, false);
  act_disk.act_cpu_percent = 0;
  refused(act_disk, false, "activations cannot be homed on disk");  // Policy::validate()
  refused(tiers(20, 100, 100, false), true, "KV policies on the CUDA offloading runner need the cache on the host");
  Policy disk = tiers(20, 100, 100, false);
  disk.w_cpu_percent = 30;
  refused(disk, false, "disk tier");
  const gpu::OffloadModes m = gpu::offload_modes(tiers(20, 0, 0, true), true);
  EXPECT_TRUE(m.kv_host && m.act_host && m.scores);
  EXPECT_FALSE(gpu::offload_modes(tiers(20, 100, 100, false), true).scores);  // scores only travel for the host cache
}

TEST(GpuOffloadNeed, HostCacheAndHostActivationsShrinkTheDeviceBuffers) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  const ModelConfig& c = m.config();
  const int64_t B = 5, gbs = 2, T = 17, cap = 400;
  const gpu::BatchBuffers dev = gpu::batch_buffers(c, DType::F16, B, gbs, T, cap);
  gpu::OffloadModes md;
  md.kv_host = md.act_host = md.scores = true;
  const gpu::BatchBuffers host = gpu::batch_buffers(c, DType::F16, B, gbs, T, cap, md);
  // The device keeps two staging slots of K and V for one micro-batch's prefill, not the cache.
  EXPECT_EQ(host.kv_stage, size_t(gbs * c.n_kv_heads * T * c.head_dim) * 2);
  EXPECT_EQ(host.scores_stage, size_t(gbs * c.n_heads * T) * 4);
  EXPECT_GE(host.kv(), 4 * host.kv_stage + 2 * host.scores_stage);
  EXPECT_LT(host.kv(), 4 * host.kv_stage + 2 * host.scores_stage + 6 * gpu::kTensorAlign);
  EXPECT_EQ(dev.kv(), gpu::gpu_kv_bytes(c, DType::F16, B, cap));
  EXPECT_LT(host.kv(), dev.kv());
  // Two hidden slots of one micro-batch instead of the whole batch's.
  EXPECT_EQ(host.hidden, size_t(gbs * T * c.hidden) * 2);
  EXPECT_EQ(dev.hidden, size_t(B * T * c.hidden) * 2);
  EXPECT_EQ(host.hidden_total(), 2 * host.hidden);
  const gpu::DeviceLayout l = gpu::device_layout(place_weights(m, weights_split(30, 70)), DType::F16);
  const gpu::GpuOffloadNeed need = gpu::gpu_offload_need(c, l, B, gbs, T, cap, md);
  EXPECT_EQ(need.total(), gpu::gpu_offload_need(c, l, 0, gbs, T, cap).total() + host.total());
  EXPECT_NE(need.str().find("prefill KV staging"), std::string::npos) << need.str();
}

TEST(GpuStreamPlan, HostCacheAndHostActivationSchedulesMapToTheThreeStreams) {
  for (bool prefill : {true, false})
    for (bool act : {false, true})
      for (int K : {1, 3}) {
        ScheduleShape sh = shape(3, K, {true, true, false, true, true}, prefill, false, true);
        sh.kv_host = sh.cpu_attention = true;
        sh.act_on_host = act;
        const Schedule s = build_schedule(sh);
        const std::string what = std::string(prefill ? "prefill" : "decode") + (act ? " act host" : "") + " K " +
                                 std::to_string(K);
        expect_plan_honours(s, gpu::plan_streams(s), what);
        int stores = 0, hidden = 0;
        for (const Step& st : s.steps) {
          EXPECT_NE(st.kind, StepKind::kLoadCache) << what;  // host attention: the cache never goes up
          stores += st.kind == StepKind::kStoreCache;
          hidden += st.kind == StepKind::kLoadHidden || st.kind == StepKind::kStoreHidden;
        }
        EXPECT_EQ(stores, prefill ? 3 * K : 0) << what;  // the prefill's rows come down once
        EXPECT_EQ(hidden > 0, act) << what;
      }
}

}  // namespace
}  // namespace flexh2o
