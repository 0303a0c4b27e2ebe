// The host memory a run plans with, through the program: --policy auto inside a memory cgroup
// (a container's limit, which /proc/meminfo does not show) plans within it and says so, a preset
// too large for the cgroup is refused naming it, and a given profile's host memory is capped at
// what this machine has.
#include <gtest/gtest.h>

#include <regex>

#include "cli_run.h"
#include "core/host_memory.h"
#include "memory_cgroup.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
constexpr uint64_t kMiB = uint64_t(1) << 20;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// The measured profile of a run in a 1 GiB cgroup has the cgroup's room, not the machine's
// MemAvailable, and the run says so.
TEST(HostMemoryCli, PolicyAutoInAMemoryCgroupPlansWithinIt) {
  std::string why;
  const auto cg = flexh2o::test::MemoryCgroup::make(1024 * kMiB, &why);
  if (!cg) GTEST_SKIP() << why;
  TempDir tmp;
  const RunResult r = flexh2o::test::run_flexh2o(
      "generate -m " + model_dir("tiny-opt").string() + " --prompt hi -n 2 --device cpu --policy auto --offload-dir " +
          (tmp.path() / "off").string(),
      cg->prefix());
  ASSERT_EQ(r.code, 0) << r.err;
  // "the host tier is the 812 MiB measured within this process's memory cgroups (tightest limit 1 GiB; ..."
  const std::regex line(R"(the host tier is the ([0-9.]+) MiB measured within this process's memory cgroups )"
                        R"(\(tightest limit 1 GiB; the machine has )");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, line)) << r.err;
  EXPECT_GT(std::stod(m[1]), 0);
  EXPECT_LT(std::stod(m[1]), 1024);
  // --cpu-mem sets the host tier: the cgroup is not what bounds it then.
  const RunResult given = flexh2o::test::run_flexh2o(
      "generate -m " + model_dir("tiny-opt").string() + " --prompt hi -n 2 --device cpu --policy auto --offload-dir " +
          (tmp.path() / "off").string() + " --cpu-mem 256MiB",
      cg->prefix());
  ASSERT_EQ(given.code, 0) << given.err;
  EXPECT_EQ(given.err.find("memory cgroups"), std::string::npos) << given.err;
}

// `profile` (and so --policy auto's measuring) in a 384 MiB cgroup fits its probes to a quarter
// of the room; unfitted, two 128 MiB disk buffers and a GEMV matrix of twice the last-level cache
// (512 MiB on a VM that reports 256 MiB of L3) are more than a 512 MiB cgroup holds.
TEST(HostMemoryCli, ProfileInASmallCgroupFitsItsProbes) {
  std::string why;
  const auto cg = flexh2o::test::MemoryCgroup::make(384 * kMiB, &why);
  if (!cg) GTEST_SKIP() << why;
  TempDir tmp;
  const RunResult r = flexh2o::test::run_flexh2o("profile --offload-dir " + tmp.path().string(), cg->prefix());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex fitted(R"(probes made smaller to fit the memory at hand \(each at most ([0-9]+) MiB\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, fitted)) << r.out;
  EXPECT_LE(std::stoi(m[1]), 96);
  EXPECT_GE(std::stoi(m[1]), 8);
}

// Dummy weights are made in RAM: a preset larger than the cgroup's room is refused before any is
// made (not left to the kernel's OOM killer), and the message names the cgroup's limit.
TEST(HostMemoryCli, APresetLargerThanTheCgroupIsRefusedNamingIt) {
  std::string why;
  const auto cg = flexh2o::test::MemoryCgroup::make(512 * kMiB, &why);
  if (!cg) GTEST_SKIP() << why;
  const RunResult r =
      flexh2o::test::run_flexh2o("bench -m opt-1.3b --device cpu --prompt-len 8 --gen-len 2", cg->prefix());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "preset opt-1.3b: its dummy weights take 2.45 GiB");
  EXPECT_HAS(r.err, "within this process's memory cgroups (tightest limit 512 MiB; the machine has ");
}

// Budgets given for RAM beyond what the cgroup leaves pass the budget checks, so the run says
// so first: --cpu-mem, and on the CPU device --gpu-mem with it (the same RAM).
TEST(HostMemoryCli, RamBudgetsBeyondTheCgroupAreWarnedOf) {
  std::string why;
  const auto cg = flexh2o::test::MemoryCgroup::make(512 * kMiB, &why);
  if (!cg) GTEST_SKIP() << why;
  const std::string run = "generate -m " + model_dir("tiny-opt").string() +
                          " --prompt hi -n 1 --device cpu --percent 100 0 100 0 100 0 ";
  const RunResult over = flexh2o::test::run_flexh2o(run + "--cpu-mem 400MiB --gpu-mem 200MiB", cg->prefix());
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_HAS(over.err, "warning: the RAM budgets given (--cpu-mem 400MiB with --gpu-mem 200MiB) come to 600 MiB, "
                       "more than the ");
  EXPECT_HAS(over.err, "within this process's memory cgroups (tightest limit 512 MiB");
  const RunResult within = flexh2o::test::run_flexh2o(run + "--cpu-mem 100MiB --gpu-mem 100MiB", cg->prefix());
  ASSERT_EQ(within.code, 0) << within.err;
  EXPECT_EQ(within.err.find("RAM budgets"), std::string::npos) << within.err;
}

// A given profile (h200: 137.4 GB of host memory) plans the host tier with what this process can
// take now unless --cpu-mem says otherwise.
TEST(HostMemoryCli, AGivenProfilesHostMemoryIsCappedAtWhatThisMachineHas) {
  const std::optional<uint64_t> avail = flexh2o::available_host_memory();
  if (!avail || double(*avail) >= 137.4e9) GTEST_SKIP() << "this machine has as much host memory as the h200 profile";
  const std::string run = "generate -m " + model_dir("tiny-opt").string() +
                          " --prompt hi -n 1 --device cpu --policy auto --hardware h200 --gpu-mem 8MiB";
  const RunResult capped = flexh2o::test::run_flexh2o(run);
  ASSERT_EQ(capped.code, 0) << capped.err;
  EXPECT_HAS(capped.err, "--policy auto: the host tier is the ");
  EXPECT_HAS(capped.err, "this process can take now, less than the profile's (give --cpu-mem to set it)");
  const RunResult given = flexh2o::test::run_flexh2o(run + " --cpu-mem 200GiB");
  ASSERT_EQ(given.code, 0) << given.err;
  EXPECT_EQ(given.err.find("the host tier is the"), std::string::npos) << given.err;
}

}  // namespace
