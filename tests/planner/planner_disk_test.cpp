// The cost model prices disk-homed KV as OffloadEngine's disk_kv moves it: whole 4096-byte pages
// of a packed file, so a decode step's new rows cost a page per (sequence, KV head, K|V) where a
// head's slots span a page, and fewer pages where heads share them.
#include <gtest/gtest.h>

#include "engine/policy_of.h"
#include "engine/test_util.h"
#include "planner/planner.h"
#include "planner/profile.h"

namespace flexh2o {
namespace {

// Disk writes priced at one second a byte and nothing else: busy seconds are bytes written.
HardwareProfile writes_only() {
  HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
  h.device = DeviceKind::kCpu;
  h.host_to_disk_cache = 1;
  h.disk_write_request = 0;
  h.schedule_step_overhead = 0;
  return h;
}

TEST(PlannerDiskKv, DecodeStepsWriteWholePages) {
  Model model = Model::load_dir(test::model_dir("tiny-opt"));
  const ModelConfig& c = model.config();
  ASSERT_EQ(c.head_dim, 64);  // an f16 slot of one head: 128 bytes
  const Policy p = test::policy_of("100 0 0 0 100 0", 2, 1);  // both sequences' KV on disk
  const double runs = 2 * double(c.n_kv_heads) * 2, token = 2 * double(c.n_kv_heads) * 128;
  struct Case {
    int64_t prompt, gen;
    double pages;  // written by each decode step, per layer
  };
  // 48 slots a head (6 KiB): a page per run; 12 slots (1.5 KiB): the runs share 6 pages.
  for (const Case& k : {Case{40, 8, runs}, Case{8, 4, 6}}) {
    Workload w;
    w.prompt_len = k.prompt;
    w.gen_len = k.gen;
    CostModel cm(ModelShape::from_model(model), writes_only(), w);
    const Estimate e = cm.estimate(p);
    const double want = double(c.n_layers) * (2 * double(k.prompt) * token + double(k.gen - 1) * k.pages * 4096);
    EXPECT_DOUBLE_EQ(e.busy[size_t(Queue::kDiskWrite)], want) << k.prompt << "+" << k.gen;
    // The link bytes stay the rows moved, as the engine counts them.
    EXPECT_EQ(e.bytes[size_t(Link::kHostToDisk)],
              uint64_t(double(c.n_layers) * (2 * double(k.prompt) * token + double(k.gen - 1) * 2 * token)));
  }
}

}  // namespace
}  // namespace flexh2o
