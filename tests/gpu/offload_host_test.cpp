// Host-side plan of the CUDA offloading runner, tested without a GPU: the stream/event mapping
// of build_schedule() steps (every dependency honoured, cross-stream ones by an event wait,
// same-stream ones by stream order), the weights' device layout and the device-memory need,
// and the CLI gate (weight offloading reaches the runner; KV/activation/disk offloading on
// CUDA gets the clear "not wired" error).
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

TEST(CudaGate, WeightOffloadingMayUseCudaKvActivationAndDiskMayNot) {
  cli::OffloadArgs off;
  off.percent = {30, 70, 100, 0, 100, 0};
  EXPECT_EQ(cli::cuda_unsupported_reason(off), "");
  off.gpu_mem = "16GiB";
  off.gpu_batch_size = 8;
  EXPECT_EQ(cli::cuda_unsupported_reason(off), "");
  EXPECT_NE(cli::cuda_unsupported_reason(off, "auto"), "");  // auto keeps offloading on the CPU device
  for (std::vector<double> bad : {std::vector<double>{30, 70, 0, 100, 100, 0}, {30, 70, 100, 0, 0, 100},
                                  {30, 50, 100, 0, 100, 0}}) {
    off.percent = bad;
    EXPECT_NE(cli::cuda_unsupported_reason(off).find("not wired yet"), std::string::npos);
  }
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
  test::RunResult kv = test::run_flexh2o(base + " --percent 30 70 0 100 100 0");
  EXPECT_EQ(kv.code, 1);
  EXPECT_NE(kv.err.find("KV/activation offloading and the disk tier on CUDA are not wired yet"), std::string::npos)
      << kv.err;
  EXPECT_NE(kv.err.find("use --device cpu"), std::string::npos) << kv.err;
}

TEST(GpuOffloadRunnerWithoutGpu, RefusesKvOffloadingFirstThenSaysWhy) {
  Model m = Model::load_dir(model_dir("tiny-opt"));
  gpu::GpuOffloadOptions o;
  o.policy.cache_gpu_percent = 0, o.policy.cache_cpu_percent = 100;
  try {
    gpu::GpuOffloadRunner r(m, o);
    FAIL() << "constructed with the KV cache on the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not wired yet"), std::string::npos) << e.what();
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

}  // namespace
}  // namespace flexh2o
