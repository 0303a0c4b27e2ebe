// The weight split where the device and the host share RAM (the CPU device, a measured
// profile): a device budget larger than the RAM must never turn a plan that fits into a refusal,
// since a lower device share leaves the host the room it needs.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "planner/planner.h"

namespace flexh2o {
namespace {

HardwareProfile shared_ram(double device_gb, double ram_gb) {
  HardwareProfile h = HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
  h.device = DeviceKind::kCpu;
  h.shared_memory = true;
  h.device_memory = device_gb * 1e9;  // --gpu-mem, which may promise more than the RAM
  h.host_memory = ram_gb * 1e9;       // the RAM both tiers take from
  h.disk_memory = 100e9;
  h.usable_fraction = 0.8;
  return h;
}

// OPT-1.3B (2.63 GB of f16 weights) in 1.5 GB of RAM: part of the weights on the device, the
// rest on disk. With a device budget of 2 or 8 GB (`--gpu-mem 2G` in a 1.5 GiB container) the
// first device share that budget holds leaves no host share room beside it in the RAM: the
// search must go on to lower shares rather than call the model infeasible.
TEST(PlannerSharedMemory, ALargerDeviceBudgetStillFindsTheSplitThatFitsTheRam) {
  ModelConfig c = ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "opt-1.3b.json");
  c.name = "opt-1.3b";
  const Workload w{32, 2, {}};
  SearchOptions so;
  so.compress_weight = so.compress_cache = false;
  so.allow_disk = true;
  so.gpu_batch_sizes = {1, 4};  // a few block shapes: the split, not the shape, is what is checked
  so.max_num_gpu_batches = 2;
  for (const double device_gb : {1.5, 2.0, 8.0}) {
    SCOPED_TRACE(device_gb);
    CostModel cm(ModelShape::from_config(c), shared_ram(device_gb, 1.5), w);
    PlanResult r;
    ASSERT_NO_THROW(r = search_policy(cm, so));
    EXPECT_TRUE(r.best.fits);
    EXPECT_LT(r.best.policy.w_gpu_percent, 100) << r.best.policy.str();
    const auto m = cm.memory(r.best.policy);
    EXPECT_LE(double(m[0] + m[1]), 0.8 * 1.5e9) << r.best.policy.str();
  }
}

}  // namespace
}  // namespace flexh2o
