// The zig-zag schedule as a value (order, queues, dependencies), checked against the buffers
// each step touches: every conflicting pair of accesses must be ordered by the dependencies and
// the queues' order, over every shape; and the executor that runs it on a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/cpu_device.h"
#include "engine/executor.h"
#include "engine/schedule.h"

namespace flexh2o {
namespace {

struct Flags {
  int layers = 2, K = 2;
  bool sep = false, stream = true, disk = false, prefill = false;
  bool kv_device = false, kv_host = true, kv_disk = false, cpu = false, act_host = false, policy = false;
  bool first_loaded = false, prefetch = false;
};

ScheduleShape shape(const Flags& f) {
  ScheduleShape s;
  s.kinds = unit_kinds(f.layers, f.sep);
  s.micro_batches = f.K;
  s.unit_streams.assign(s.kinds.size(), f.stream);
  s.unit_disk.assign(s.kinds.size(), f.stream && f.disk);
  s.prefill = f.prefill;
  s.kv_device = f.kv_device;
  s.kv_host = f.kv_host;
  s.kv_disk = f.kv_disk;
  s.cpu_attention = f.cpu;
  s.act_on_host = f.act_host;
  s.kv_policy = f.policy;
  s.first_layer_loaded = f.first_loaded;
  s.prefetch_next = f.prefetch;
  return s;
}

// "" when every conflicting pair of accesses is ordered (by dependencies and the order of each
// queue, transitively); else the first unordered pair.
std::string unordered_hazard(const ScheduleShape& sh, const Schedule& s) {
  const size_t n = s.steps.size(), words = (n + 63) / 64;
  // before[j]: bitset of the steps that finish before j starts.
  std::vector<uint64_t> before(n * words, 0);
  std::map<Queue, int> last_on_queue;
  for (size_t j = 0; j < n; ++j) {
    std::vector<int> preds(s.steps[j].deps.begin(), s.steps[j].deps.end());
    if (auto it = last_on_queue.find(s.steps[j].queue); it != last_on_queue.end()) preds.push_back(it->second);
    for (int p : preds) {
      before[j * words + size_t(p) / 64] |= uint64_t(1) << (size_t(p) % 64);
      for (size_t w = 0; w < words; ++w) before[j * words + w] |= before[size_t(p) * words + w];
    }
    last_on_queue[s.steps[j].queue] = int(j);
  }
  auto ordered = [&](size_t i, size_t j) { return (before[j * words + i / 64] >> (i % 64)) & 1; };
  std::map<std::pair<int, int>, std::vector<std::pair<size_t, bool>>> by_buffer;
  for (size_t i = 0; i < n; ++i)
    for (const Access& a : schedule_accesses(sh, s, int(i))) by_buffer[{int(a.buf), a.id}].push_back({i, a.write});
  for (const auto& [key, v] : by_buffer)
    for (size_t x = 0; x < v.size(); ++x)
      for (size_t y = x + 1; y < v.size(); ++y) {
        const auto [i, wi] = v[x];
        const auto [j, wj] = v[y];
        if (i == j || !(wi || wj) || ordered(i, j)) continue;
        return s.label(int(i)) + (wi ? " writes" : " reads") + " buffer " + std::to_string(key.first) + "/" +
               std::to_string(key.second) + ", " + s.label(int(j)) + (wj ? " writes" : " reads") + " it, unordered";
      }
  return "";
}

std::vector<Flags> all_shapes() {
  std::vector<Flags> out;
  for (int layers : {2, 3})
    for (int K : {1, 2, 3})
      for (int bits = 0; bits < (1 << 12); ++bits) {
        Flags f;
        f.layers = layers, f.K = K;
        f.sep = bits & 1, f.stream = bits & 2, f.disk = bits & 4, f.prefill = bits & 8;
        f.kv_device = bits & 16, f.kv_host = bits & 32, f.kv_disk = bits & 64, f.cpu = bits & 128;
        f.act_host = bits & 256, f.policy = bits & 512, f.first_loaded = bits & 1024, f.prefetch = bits & 2048;
        if (!f.kv_device && !f.kv_host && !f.kv_disk) continue;  // a micro-batch has sequences somewhere
        if (!f.stream && f.disk) continue;
        out.push_back(f);
      }
  return out;
}

// Every step the shape implies is there (a step that is never emitted cannot be caught by the
// ordering check: nothing it should have written is accessed).
std::string missing_step(const Flags& f, const ScheduleShape& sh, const Schedule& s) {
  const int U = sh.units(), K = f.K;
  int kv_units = 0;
  for (int u = 0; u < U; ++u) kv_units += sh.has_kv(u) ? 1 : 0;
  std::map<StepKind, int> n;
  for (const Step& st : s.steps) ++n[st.kind];
  const bool host_attn = sh.host_attention(), offloaded = sh.offloaded();
  const bool kept = f.prefill && f.policy && offloaded;
  std::map<StepKind, int> want;
  want[StepKind::kCompute] = U * K;
  want[StepKind::kComputeRest] = host_attn ? kv_units * K : 0;
  want[StepKind::kStoreQkv] = want[StepKind::kHostAttention] = want[StepKind::kLoadAttn] = want[StepKind::kComputeRest];
  want[StepKind::kLoadHidden] = want[StepKind::kStoreHidden] = f.act_host ? (U - 1) * K : 0;
  want[StepKind::kLoadCacheDisk] = !f.prefill && f.kv_disk ? kv_units * K : 0;
  want[StepKind::kLoadCache] = !f.prefill && offloaded && !f.cpu ? kv_units * K : 0;
  want[StepKind::kStoreCache] = (offloaded && !host_attn) || (f.policy && f.kv_device) ? kv_units * K : 0;
  want[StepKind::kUpdateCache] = f.policy && (f.kv_device || (offloaded && !host_attn)) ? kv_units * K : 0;
  want[StepKind::kGatherCache] = f.policy && (f.kv_device || kept) ? kv_units * K : 0;
  want[StepKind::kStoreKept] = kept ? kv_units * K : 0;
  want[StepKind::kStoreCacheDisk] = f.kv_disk ? kv_units * K : 0;
  for (const auto& [kind, count] : want)
    if (n[kind] != count)
      return std::string(step_name(kind)) + ": " + std::to_string(n[kind]) + " steps, expected " + std::to_string(count);
  return "";
}

TEST(Schedule, EveryConflictingAccessIsOrderedInEveryShape) {
  size_t checked = 0;
  for (const Flags& f : all_shapes()) {
    const ScheduleShape sh = shape(f);
    const Schedule s = build_schedule(sh);
    for (size_t i = 0; i < s.steps.size(); ++i)
      for (int d : s.steps[i].deps) ASSERT_LT(size_t(d), i) << s.str();
    const std::string h = unordered_hazard(sh, s) + missing_step(f, sh, s);
    ASSERT_EQ(h, "") << "layers " << f.layers << " K " << f.K << " sep " << f.sep << " prefill " << f.prefill
                     << " kv " << f.kv_device << f.kv_host << f.kv_disk << " cpu " << f.cpu << " act_host "
                     << f.act_host << " policy " << f.policy << "\n"
                     << s.str();
    ++checked;
  }
  EXPECT_GT(checked, 15000u);
}

// The checker is not vacuous: dropping a dependency the builder emits for a data or slot
// hazard is caught, for each kind of hazard the schedule guards.
TEST(Schedule, DroppingADependencyIsCaught) {
  struct Drop {
    Flags f;
    StepKind step, dep;
  };
  auto f = [](auto set) {
    Flags x;
    set(x);
    return x;
  };
  const Drop drops[] = {
      {f([](Flags& x) { x.K = 2; }), StepKind::kCompute, StepKind::kLoadWeight},
      {f([](Flags& x) { x.K = 2; }), StepKind::kCompute, StepKind::kLoadCache},
      {f([](Flags& x) { x.K = 1; }), StepKind::kLoadWeight, StepKind::kCompute},  // slot reuse (WAR)
      {f([](Flags& x) { x.kv_disk = true, x.kv_host = false; }), StepKind::kLoadCache, StepKind::kLoadCacheDisk},
      {f([](Flags& x) { x.kv_disk = true, x.kv_host = false; }), StepKind::kStoreCacheDisk, StepKind::kStoreCache},
      {f([](Flags& x) { x.act_host = true; }), StepKind::kLoadHidden, StepKind::kStoreHidden},
      {f([](Flags& x) { x.cpu = true, x.K = 3; }), StepKind::kHostAttention, StepKind::kStoreQkv},
      {f([](Flags& x) { x.cpu = true, x.K = 3; }), StepKind::kComputeRest, StepKind::kLoadAttn},
      {f([](Flags& x) { x.policy = true, x.kv_device = true, x.kv_host = false; }), StepKind::kGatherCache,
       StepKind::kUpdateCache},
      {f([](Flags& x) { x.policy = true, x.prefill = true, x.kv_host = true, x.K = 2; }), StepKind::kStoreKept,
       StepKind::kGatherCache},
  };
  for (const Drop& d : drops) {
    const ScheduleShape sh = shape(d.f);
    Schedule s = build_schedule(sh);
    ASSERT_EQ(unordered_hazard(sh, s), "");
    bool dropped = false;
    for (size_t i = 0; i < s.steps.size() && !dropped; ++i) {
      if (s.steps[i].kind != d.step) continue;
      Schedule t = s;
      std::erase_if(t.steps[i].deps, [&](int dep) { return s.steps[size_t(dep)].kind == d.dep; });
      dropped = t.steps[i].deps.size() < s.steps[i].deps.size() && !unordered_hazard(sh, t).empty();
    }
    EXPECT_TRUE(dropped) << step_name(d.step) << " <- " << step_name(d.dep) << " is never load-bearing\n" << s.str();
  }
}

TEST(Schedule, ZigZagOrderPrefetchesNextUnitAndBatch) {
  Flags fl;
  fl.disk = true, fl.kv_disk = true, fl.act_host = true;
  const Schedule s = build_schedule(shape(fl));
  // Unit u+1's weights are requested before unit u computes its first micro-batch.
  for (int u = 0; u + 1 < 4; ++u) EXPECT_LT(s.find(StepKind::kLoadWeight, u + 1, 0), s.find(StepKind::kCompute, u, 0));
  // Micro-batch k+1's cache is requested before micro-batch k computes.
  EXPECT_LT(s.find(StepKind::kLoadCache, 1, 1), s.find(StepKind::kCompute, 1, 0));
  EXPECT_LT(s.find(StepKind::kLoadCacheDisk, 2, 0), s.find(StepKind::kCompute, 1, 1));
  EXPECT_EQ(s.steps[size_t(s.find(StepKind::kStoreCacheDisk, 1, 0))].queue, Queue::kDiskWrite);
}

TEST(Schedule, SepLayerSplitsEveryLayerInAttentionAndMlpUnits) {
  Flags fl;
  fl.sep = true;
  const ScheduleShape sh = shape(fl);
  ASSERT_EQ(sh.units(), 2 * 2 + 2);
  const Schedule s = build_schedule(sh);
  EXPECT_GE(s.find(StepKind::kLoadCache, 1, 0), 0);  // attention units carry the KV cache
  EXPECT_EQ(s.find(StepKind::kLoadCache, 2, 0), -1);  // MLP units do not
  EXPECT_GE(s.find(StepKind::kLoadWeight, 2, 0), 0);  // but stream their own weights
  EXPECT_EQ(kv_pair(sh, 3, 1), 1 * 2 + 1);
  EXPECT_EQ(kv_pair(sh, 2, 0), -1);
}

// With the cache on the host and host attention, micro-batch k+1's q/k/v are computed before
// the device finishes micro-batch k, so the host attends while the device computes.
TEST(Schedule, HostAttentionIsPipelinedAcrossMicroBatches) {
  Flags fl;
  fl.cpu = true, fl.K = 3, fl.stream = false;
  const Schedule s = build_schedule(shape(fl));
  for (int k = 0; k + 1 < 3; ++k) {
    EXPECT_LT(s.find(StepKind::kCompute, 1, k + 1), s.find(StepKind::kComputeRest, 1, k));
    EXPECT_EQ(s.steps[size_t(s.find(StepKind::kHostAttention, 1, k))].queue, Queue::kHost);
  }
  EXPECT_EQ(s.find(StepKind::kLoadCache, 1, 0), -1);  // the device never loads the offloaded cache
  EXPECT_EQ(s.find(StepKind::kStoreCache, 1, 0), -1);
}

TEST(Schedule, KvUnitsWithAPolicyDecideOnTheHostAndCompactOnTheDevice) {
  Flags fl;
  fl.policy = true, fl.kv_device = true, fl.kv_host = false, fl.stream = false;
  const Schedule s = build_schedule(shape(fl));
  const int ku = s.find(StepKind::kUpdateCache, 1, 0), kg = s.find(StepKind::kGatherCache, 1, 0);
  ASSERT_GE(ku, 0);
  ASSERT_GE(kg, 0);
  EXPECT_EQ(s.steps[size_t(ku)].queue, Queue::kHost);
  EXPECT_EQ(s.steps[size_t(kg)].queue, Queue::kCompute);
  // The compaction goes after the next pair's compute (the decision had that long) and before
  // the compute that reuses its slots.
  EXPECT_GT(kg, s.find(StepKind::kCompute, 1, 1));
  EXPECT_LT(kg, s.find(StepKind::kCompute, 2, 0));
  // A prefill with the cache offloaded compacts the staging slot, then stores only what it kept.
  fl.prefill = true, fl.kv_host = true;
  const Schedule p = build_schedule(shape(fl));
  EXPECT_LT(p.find(StepKind::kGatherCache, 1, 0), p.find(StepKind::kStoreKept, 1, 0));
  EXPECT_EQ(p.steps[size_t(p.find(StepKind::kStoreKept, 1, 0))].queue, Queue::kDeviceToHost);
}

TEST(Schedule, CrossStepPrefetchOfTheFirstLayer) {
  for (int layers : {2, 3}) {
    Flags fl;
    fl.layers = layers, fl.disk = true, fl.prefetch = true;
    const ScheduleShape sh = shape(fl);
    const Schedule s = build_schedule(sh);
    const int next = sh.units();
    const int lw = s.find(StepKind::kLoadWeight, next, 0), lwd = s.find(StepKind::kLoadWeightDisk, next, 0);
    ASSERT_GE(lw, 0);
    ASSERT_GE(lwd, 0);
    EXPECT_EQ(s.label(lw), "LW(1 next)");
    fl.first_loaded = true;
    const Schedule n = build_schedule(shape(fl));
    EXPECT_EQ(n.find(StepKind::kLoadWeight, 1, 0), -1);
    EXPECT_EQ(n.find(StepKind::kLoadWeightDisk, 1, 0), -1);
  }
  Flags resident;
  resident.stream = false, resident.prefetch = true;
  EXPECT_EQ(build_schedule(shape(resident)).find(StepKind::kLoadWeight, shape(resident).units(), 0), -1);
}

TEST(Executor, HonoursDependenciesUnderRandomDelays) {
  Flags fl;
  fl.layers = 4, fl.K = 3, fl.disk = true, fl.kv_disk = true, fl.act_host = true;
  const Schedule s = build_schedule(shape(fl));
  CpuDevice dev(2);
  std::vector<std::atomic<int>> state(s.steps.size());
  std::atomic<int> violations{0};
  std::mt19937 rng(5);
  std::vector<int> delay_us(s.steps.size());
  for (auto& d : delay_us) d = int(rng() % 300);
  QueueTimes t = run_schedule(dev, s, true, [&](const Step& st) {
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
  Flags fl;
  fl.layers = 4, fl.disk = true, fl.kv_disk = true, fl.act_host = true;
  const Schedule s = build_schedule(shape(fl));
  CpuDevice dev(2);
  const int bad = s.find(StepKind::kCompute, 2, 1);
  std::atomic<int> after{0};
  EXPECT_THROW(run_schedule(dev, s, true,
                            [&](const Step& st) {
                              const int i = int(&st - s.steps.data());
                              if (i == bad) FH_FAIL("injected");
                              if (st.kind == StepKind::kCompute && st.u == 4) ++after;
                            }),
               Error);
  EXPECT_EQ(after.load(), 0);  // nothing that depends on the failed step ran
}

// The idle hook runs on the calling thread while the queues work (a pipeline stage's MPI
// progress), and an exception from it ends the schedule with that error, every queue joined.
TEST(Executor, IdleRunsOnTheCallingThreadWhileStepsRun) {
  Flags fl;
  fl.layers = 4, fl.K = 2, fl.disk = true;
  const Schedule s = build_schedule(shape(fl));
  CpuDevice dev(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> running{0}, idle_during{0}, idle_calls{0}, elsewhere{0};
  auto slow = [&](const Step&) {
    ++running;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --running;
  };
  auto idle = [&] {
    ++idle_calls;
    if (std::this_thread::get_id() != caller) ++elsewhere;
    if (running.load() > 0) ++idle_during;
  };
  for (bool overlap : {true, false}) {
    idle_calls = 0, idle_during = 0;
    (void)run_schedule(dev, s, overlap, slow, false, idle);
    EXPECT_GT(idle_calls.load(), 0) << "overlap " << overlap;
    if (overlap) {
      EXPECT_GT(idle_during.load(), 0);
    } else {
      EXPECT_EQ(idle_calls.load(), int(s.steps.size()));  // once after each step
    }
  }
  EXPECT_EQ(elsewhere.load(), 0);
  int calls = 0;
  EXPECT_THROW(run_schedule(dev, s, true, slow, false,
                            [&] {
                              if (++calls == 3) FH_FAIL("idle failed");
                            }),
               Error);
}

// Two queues each waiting for the other's later step would hang their threads for good; the
// executor refuses the schedule instead, with or without overlap.
TEST(Executor, RefusesADependencyOnALaterStep) {
  Schedule s;
  s.steps.push_back({StepKind::kCompute, Queue::kCompute, 1, 0, {1}});
  s.steps.push_back({StepKind::kLoadWeight, Queue::kHostToDevice, 1, 0, {0}});
  CpuDevice dev(2);
  int ran = 0;
  for (bool overlap : {true, false})
    EXPECT_THROW(run_schedule(dev, s, overlap, [&](const Step&) { ++ran; }), Error) << "overlap " << overlap;
  EXPECT_EQ(ran, 0);
}

TEST(Executor, OverlapOffRunsInScheduleOrder) {
  const Schedule s = build_schedule(shape(Flags{}));
  CpuDevice dev(2);
  std::vector<int> order;
  run_schedule(dev, s, false, [&](const Step& st) { order.push_back(int(&st - s.steps.data())); });
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], int(i));
}

}  // namespace
}  // namespace flexh2o
