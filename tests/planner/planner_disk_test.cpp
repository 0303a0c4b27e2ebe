// The cost model prices disk-homed KV as OffloadEngine's disk_kv moves it: whole 4096-byte pages
// of a packed file, touching runs merged into one request. A decode step's new rows cost a page
// per (sequence, KV head, K|V) where a head's slots span a page, the whole file where they do not;
// and the pages the engine's offload directory actually moved agree with the prices.
#include <gtest/gtest.h>

#include "engine/cpu_device.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "engine/policy_of.h"
#include "engine/test_util.h"
#include "planner/planner.h"
#include "planner/profile.h"

namespace flexh2o {
namespace {

// Only disk I/O priced, at one second a byte (bytes: busy seconds are bytes moved) or one second
// a request.
HardwareProfile disk_only(bool bytes) {
  HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
  h.device = DeviceKind::kCpu;
  h.host_to_disk_cache = h.disk_to_host_cache = bytes ? 1 : 1e30;
  h.disk_write_request = h.disk_read_request = bytes ? 0 : 1;
  h.schedule_step_overhead = 0;
  return h;
}

const Policy kAllKvOnDisk = test::policy_of("100 0 0 0 100 0", 2, 1);  // both sequences' KV on disk

Estimate estimate(const Model& m, int64_t prompt, int64_t gen, bool bytes) {
  Workload w;
  w.prompt_len = prompt;
  w.gen_len = gen;
  return CostModel(ModelShape::from_model(m), disk_only(bytes), w).estimate(kAllKvOnDisk);
}

TEST(PlannerDiskKv, StepsArePricedInPagesAndMergedRuns) {
  Model model = Model::load_dir(test::model_dir("tiny-opt"));
  const ModelConfig& c = model.config();
  ASSERT_EQ(c.head_dim, 64);  // an f16 slot of one head: 128 bytes
  const double L = double(c.n_layers), runs = 2 * double(c.n_kv_heads) * 2, token = 2 * double(c.n_kv_heads) * 128;
  const size_t W = size_t(Queue::kDiskWrite), R = size_t(Queue::kDiskRead);
  auto file = [&](double cap) { return 2 * cap * token; };  // both sequences' K and V
  // 48 slots a head (6 KiB): new rows a page each (their pages touch: one request a step); the
  // prefill's and loads' runs merge (the unused slots span less than two pages): the whole file.
  Estimate e = estimate(model, 40, 8, true);
  EXPECT_DOUBLE_EQ(e.busy[W], L * (file(48) + 7 * runs * (4096 + 128)));
  EXPECT_DOUBLE_EQ(e.busy[R], L * 7 * file(48));
  EXPECT_DOUBLE_EQ(estimate(model, 40, 8, false).busy[W], L * (1 + 7));
  // 12 slots (1.5 KiB): heads share pages, so a step writes every page of the file.
  EXPECT_DOUBLE_EQ(estimate(model, 8, 4, true).busy[W], L * 4 * file(12));
  // 108 slots (13.5 KiB): a step's new rows are a request each.
  EXPECT_DOUBLE_EQ(estimate(model, 100, 8, false).busy[W], L * (1 + 7 * runs));
  // 80 slots, 10 cached: the unused 70 span two pages, so a load is a run per head.
  const double w = 69.0 / 4;  // the model's trapezoid over decode steps 1, 35 and 69
  EXPECT_DOUBLE_EQ(estimate(model, 10, 70, true).busy[R], L * (w * runs * (10 * 128 + 4096) + 3 * w * file(80)));
}

// The pages the run moved (DiskStore's counters) against the prices: within 5% (a model row
// straddles a page boundary on average; f16 rows never do; the files' headers are written too).
TEST(PlannerDiskKv, PricesMatchThePagesTheEngineMoves) {
  Model model = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = kAllKvOnDisk;
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  std::vector<GenerationRequest> reqs(2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int64_t t = 0; t < 40; ++t) reqs[i].prompt_ids.push_back(int32_t(100 + 7 * t + int64_t(i)));
    reqs[i].max_new_tokens = 8;
    reqs[i].sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  const OffloadReport r = eng.report();
  const Estimate e = estimate(model, 40, 8, true);
  EXPECT_NEAR(double(r.disk_written), e.busy[size_t(Queue::kDiskWrite)], 0.05 * double(r.disk_written));
  EXPECT_NEAR(double(r.disk_read), e.busy[size_t(Queue::kDiskRead)], 0.05 * double(r.disk_read));
  // The rows alone are far fewer bytes: a decode step writes 128 of them per page.
  EXPECT_LT(r.bytes[size_t(Link::kHostToDisk)] * 2, r.disk_written);
}

}  // namespace
}  // namespace flexh2o
