// The zig-zag schedule as a value (order, queues, dependencies) and the executor that runs it
// (dependencies honoured under random delays, errors propagated, overlap off = in order).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/executor.h"
#include "engine/schedule.h"

namespace flexh2o {
namespace {

ScheduleShape shape(int layers, int K, bool stream, bool disk, bool prefill, bool kv_host, bool kv_disk, bool cpu,
                    bool act_host) {
  ScheduleShape s;
  s.units = layers + 2;
  s.micro_batches = K;
  s.unit_streams.assign(size_t(s.units), stream);
  s.unit_disk.assign(size_t(s.units), disk);
  s.prefill = prefill;
  s.kv_host = kv_host;
  s.kv_disk = kv_disk;
  s.cpu_attention = cpu;
  s.act_on_host = act_host;
  return s;
}

void expect_well_formed(const Schedule& s) {
  for (size_t i = 0; i < s.steps.size(); ++i)
    for (int d : s.steps[i].deps) {
      EXPECT_GE(d, 0);
      EXPECT_LT(size_t(d), i) << "step " << i << " depends on a later step\n" << s.str();
    }
}

TEST(Schedule, ZigZagOrderPrefetchesNextLayerAndBatch) {
  Schedule s = build_schedule(shape(2, 2, true, true, false, true, true, false, true));
  expect_well_formed(s);
  // Layer u+1's weights are requested before layer u computes its first micro-batch.
  for (int u = 0; u + 1 < 4; ++u) EXPECT_LT(s.find(StepKind::kLoadWeight, u + 1, 0), s.find(StepKind::kCompute, u, 0));
  // Micro-batch k+1's cache is requested before micro-batch k computes.
  EXPECT_LT(s.find(StepKind::kLoadCache, 1, 1), s.find(StepKind::kCompute, 1, 0));
  EXPECT_LT(s.find(StepKind::kLoadCacheDisk, 2, 0), s.find(StepKind::kCompute, 1, 1));
  // Compute waits on its layer's weights and its cache.
  const Step& c = s.steps[size_t(s.find(StepKind::kCompute, 2, 1))];
  auto has = [&](const Step& st, StepKind k, int u, int kk) {
    int id = s.find(k, u, kk);
    return std::find(st.deps.begin(), st.deps.end(), id) != st.deps.end();
  };
  EXPECT_TRUE(has(c, StepKind::kLoadWeight, 2, 0));
  EXPECT_TRUE(has(c, StepKind::kLoadCache, 2, 1));
  EXPECT_TRUE(has(c, StepKind::kLoadHidden, 2, 1));
  // The device weight slot of unit 3 is reused from unit 1: its load waits for unit 1's last compute.
  EXPECT_TRUE(has(s.steps[size_t(s.find(StepKind::kLoadWeight, 3, 0))], StepKind::kCompute, 1, 1));
  EXPECT_EQ(s.steps[size_t(s.find(StepKind::kStoreCacheDisk, 1, 0))].queue, Queue::kDiskWrite);
}

TEST(Schedule, StepsExistOnlyWhereThePlacementNeedsThem) {
  Schedule all_dev = build_schedule(shape(3, 2, false, false, false, false, false, false, false));
  expect_well_formed(all_dev);
  for (const Step& st : all_dev.steps) EXPECT_EQ(st.kind, StepKind::kCompute);
  EXPECT_EQ(all_dev.steps.size(), 5u * 2u);
  Schedule prefill = build_schedule(shape(3, 2, true, false, true, true, false, false, false));
  EXPECT_EQ(prefill.find(StepKind::kLoadCache, 1, 0), -1);  // nothing cached yet
  EXPECT_GE(prefill.find(StepKind::kStoreCache, 1, 0), 0);
  Schedule cpu = build_schedule(shape(3, 2, false, false, false, true, true, true, false));
  expect_well_formed(cpu);
  EXPECT_EQ(cpu.find(StepKind::kLoadCache, 1, 0), -1);  // attention runs where the KV lives
  EXPECT_EQ(cpu.find(StepKind::kStoreCache, 1, 0), -1);
  EXPECT_GE(cpu.find(StepKind::kLoadCacheDisk, 1, 0), 0);
  EXPECT_GE(cpu.find(StepKind::kStoreCacheDisk, 1, 0), 0);
}

TEST(Schedule, EveryShapeIsWellFormed) {
  for (int layers : {2, 3})
    for (int K : {1, 2, 3})
      for (int bits = 0; bits < 512; ++bits) {
        auto s = shape(layers, K, bits & 1, (bits & 1) && (bits & 2), bits & 4, bits & 8, bits & 16, bits & 32,
                       bits & 64);
        s.first_layer_loaded = bits & 128;
        s.prefetch_next = bits & 256;
        expect_well_formed(build_schedule(s));
      }
}

// Queues run in emission order, so the next micro-batch's KV is emitted before the next unit's
// weights (which may wait on the disk); and a step loads the next step's first layer into the
// last layer's slot once that layer is done here (never the head's: it computes last).
TEST(Schedule, KvBeforeNextWeightsAndCrossStepPrefetch) {
  for (int layers : {2, 3}) {
    ScheduleShape sh = shape(layers, 2, true, true, false, true, false, false, false);
    sh.prefetch_next = true;
    Schedule s = build_schedule(sh);
    expect_well_formed(s);
    EXPECT_LT(s.find(StepKind::kLoadCache, 1, 1), s.find(StepKind::kLoadWeight, 2, 0));
    const int next = sh.units;
    const int lw = s.find(StepKind::kLoadWeight, next, 0), lwd = s.find(StepKind::kLoadWeightDisk, next, 0);
    ASSERT_GE(lw, 0);
    ASSERT_GE(lwd, 0);
    const Step& st = s.steps[size_t(lw)];
    EXPECT_EQ(st.queue, Queue::kHostToDevice);
    const int last = sh.units - 2;  // the last layer
    EXPECT_NE(std::find(st.deps.begin(), st.deps.end(), s.find(StepKind::kCompute, last, 1)), st.deps.end());
    EXPECT_NE(std::find(st.deps.begin(), st.deps.end(), lwd), st.deps.end());
    const Step& sd = s.steps[size_t(lwd)];  // its host staging slot: last read by LW(last)
    EXPECT_NE(std::find(sd.deps.begin(), sd.deps.end(), s.find(StepKind::kLoadWeight, last, 0)), sd.deps.end());
    EXPECT_EQ(s.label(lw), "LW(1 next)");
    // The next step starts with it loaded: no LW(1)/LWD(1), and C(1,*) waits on no weight load.
    sh.first_layer_loaded = true;
    Schedule n = build_schedule(sh);
    EXPECT_EQ(n.find(StepKind::kLoadWeight, 1, 0), -1);
    EXPECT_EQ(n.find(StepKind::kLoadWeightDisk, 1, 0), -1);
    EXPECT_GE(n.find(StepKind::kLoadWeight, 2, 0), 0);
  }
  ScheduleShape resident = shape(3, 2, false, false, false, true, false, false, false);
  resident.prefetch_next = true;  // nothing streams: nothing to prefetch
  EXPECT_EQ(build_schedule(resident).find(StepKind::kLoadWeight, resident.units, 0), -1);
}

TEST(Executor, HonoursDependenciesUnderRandomDelays) {
  Schedule s = build_schedule(shape(4, 3, true, true, false, true, true, false, true));
  std::vector<std::atomic<int>> state(s.steps.size());
  std::atomic<int> violations{0};
  std::mt19937 rng(5);
  std::vector<int> delay_us(s.steps.size());
  for (auto& d : delay_us) d = int(rng() % 300);
  QueueTimes t = run_schedule(s, true, [&](const Step& st) {
    const size_t i = size_t(&st - s.steps.data());
    for (int d : st.deps)
      if (state[size_t(d)].load() != 2) ++violations;
    state[i] = 1;
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us[i]));
    state[i] = 2;
  });
  EXPECT_EQ(violations.load(), 0);
  for (auto& x : state) EXPECT_EQ(x.load(), 2);
  EXPECT_GT(t.busy[0], 0.0);
  EXPECT_GT(t.wall, 0.0);
}

TEST(Executor, ErrorsStopAllQueuesAndPropagate) {
  Schedule s = build_schedule(shape(4, 2, true, true, false, true, true, false, true));
  const int bad = s.find(StepKind::kCompute, 2, 1);
  std::atomic<int> after{0};
  EXPECT_THROW(run_schedule(s, true,
                            [&](const Step& st) {
                              const int i = int(&st - s.steps.data());
                              if (i == bad) FH_FAIL("injected");
                              if (st.kind == StepKind::kCompute && st.u == 4) ++after;
                            }),
               Error);
  EXPECT_EQ(after.load(), 0);  // nothing that depends on the failed step ran
}

TEST(Executor, OverlapOffRunsInScheduleOrder) {
  Schedule s = build_schedule(shape(2, 2, true, false, false, true, false, false, false));
  std::vector<int> order;
  run_schedule(s, false, [&](const Step& st) { order.push_back(int(&st - s.steps.data())); });
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], int(i));
}

}  // namespace
}  // namespace flexh2o
