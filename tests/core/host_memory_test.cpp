// read_host_memory() on trees of cgroup files made here (v1, v2, nested limits, a container's
// namespace, malformed files), and once on the kernel's own files: this process moved into a
// memory cgroup made for the test, whose limit must be what is read.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "core/host_memory.h"
#include "memory_cgroup.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = uint64_t(1) << 20, kGiB = uint64_t(1) << 30;

class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    root_ = fs::temp_directory_path() / ("flexh2o-hostmem-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(root_ / "proc");
    files_.meminfo = root_ / "proc/meminfo";
    files_.cgroup = root_ / "proc/cgroup";
    files_.mountinfo = root_ / "proc/mountinfo";
    files_.root = root_;
    write("proc/meminfo", "MemTotal:       24000000 kB\nMemAvailable:   20971520 kB\n");  // 20 GiB
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  // A v2 hierarchy mounted at /sys/fs/cgroup, the process in `path`.
  void v2(const std::string& path) {
    write("proc/cgroup", "0::" + path + "\n");
    write("proc/mountinfo", "24 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
                            "31 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  }
  fs::path root_;
  HostMemoryFiles files_;
};

TEST_F(FakeHost, NoCgroupFilesLeaveMemAvailable) {
  const HostMemory h = read_host_memory(files_);
  ASSERT_TRUE(h.mem_available);
  EXPECT_EQ(*h.mem_available, 20 * kGiB);
  EXPECT_FALSE(h.cgroup_limit);
  EXPECT_FALSE(h.cgroup_room);
  EXPECT_EQ(h.available(), 20 * kGiB);
}

TEST_F(FakeHost, V2AncestorLimitBoundsAndThePageCacheDoesNotCount) {
  v2("/jobs/run7");
  write("sys/fs/cgroup/jobs/run7/memory.max", "max\n");
  write("sys/fs/cgroup/jobs/run7/memory.current", std::to_string(kGiB) + "\n");
  write("sys/fs/cgroup/jobs/memory.max", std::to_string(2 * kGiB) + "\n");
  write("sys/fs/cgroup/jobs/memory.current", std::to_string(1536 * kMiB) + "\n");
  write("sys/fs/cgroup/jobs/memory.stat", "anon 100\nfile 900\nshmem 7\nactive_file " + std::to_string(200 * kMiB) +
                                             "\ninactive_file " + std::to_string(312 * kMiB) + "\n");
  const HostMemory h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_dir, (root_ / "sys/fs/cgroup/jobs/run7").string());
  ASSERT_TRUE(h.cgroup_limit && h.cgroup_room);
  EXPECT_EQ(*h.cgroup_limit, 2 * kGiB);
  EXPECT_EQ(*h.cgroup_room, kGiB);  // 2 GiB less (1.5 GiB used less 0.5 GiB of active and inactive file pages)
  EXPECT_EQ(h.available(), kGiB);
}

TEST_F(FakeHost, V2RoomComesFromTheFullestLevelNotTheTightestLimit) {
  v2("/a/b");
  write("sys/fs/cgroup/a/b/memory.max", std::to_string(1536 * kMiB));
  write("sys/fs/cgroup/a/b/memory.current", std::to_string(256 * kMiB));
  write("sys/fs/cgroup/a/memory.max", std::to_string(2 * kGiB));
  write("sys/fs/cgroup/a/memory.current", std::to_string(1536 * kMiB));  // a sibling holds the rest
  const HostMemory h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_limit, 1536 * kMiB);
  EXPECT_EQ(h.cgroup_room, 512 * kMiB);
}

TEST_F(FakeHost, UsageOverTheLimitLeavesNoRoomAndDoesNotWrap) {
  v2("/a");
  write("sys/fs/cgroup/a/memory.max", std::to_string(kGiB));
  write("sys/fs/cgroup/a/memory.current", std::to_string(kGiB + 4096));
  EXPECT_EQ(read_host_memory(files_).available(), 0u);
}

TEST_F(FakeHost, TheMemAvailableBoundsAGenerousLimit) {
  v2("/a");
  write("sys/fs/cgroup/a/memory.max", std::to_string(64 * kGiB));
  write("sys/fs/cgroup/a/memory.current", "0");
  EXPECT_EQ(read_host_memory(files_).available(), 20 * kGiB);
}

TEST_F(FakeHost, V1UnlimitedSentinelIsNoLimitAndHierarchicalTotalsAreRead) {
  write("proc/cgroup", "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/abc\n0::/\n");
  write("proc/mountinfo", "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                          "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                          "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  write("sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", std::to_string(2 * kGiB) + "\n");
  write("sys/fs/cgroup/memory/process_api/abc/memory.stat",
        "cache 5\nactive_file 3\ninactive_file 7\ntotal_active_file " + std::to_string(256 * kMiB) +
            "\ntotal_inactive_file " + std::to_string(768 * kMiB) + "\n");
  const HostMemory h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_dir, (root_ / "sys/fs/cgroup/memory/process_api/abc").string());
  EXPECT_EQ(h.cgroup_limit, 3 * kGiB);
  EXPECT_EQ(h.cgroup_room, 2 * kGiB);
}

TEST_F(FakeHost, AContainersMountShowsItsOwnCgroupAsTheRoot) {
  // Docker without a cgroup namespace: the container's cgroup is mounted, and /proc/self/cgroup
  // names it by its path in the host's hierarchy.
  write("proc/cgroup", "6:memory:/docker/f00d\n");
  write("proc/mountinfo", "40 30 0:33 /docker/f00d /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(8 * kGiB));
  write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(kGiB));
  const HostMemory h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_dir, (root_ / "sys/fs/cgroup/memory").string());
  EXPECT_EQ(h.cgroup_room, 7 * kGiB);

  // A path outside what is mounted says nothing about this process's cgroup.
  write("proc/cgroup", "6:memory:/other\n");
  EXPECT_FALSE(read_host_memory(files_).cgroup_limit);
}

TEST_F(FakeHost, HybridMachineReadsTheV1MemoryController) {
  write("proc/cgroup", "4:memory:/m\n0::/u\n");
  write("proc/mountinfo", "31 1 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
                          "35 1 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  write("sys/fs/cgroup/unified/u/memory.max", std::to_string(kGiB));
  write("sys/fs/cgroup/memory/m/memory.limit_in_bytes", std::to_string(5 * kGiB));
  EXPECT_EQ(read_host_memory(files_).cgroup_limit, 5 * kGiB);
}

TEST_F(FakeHost, V2MemoryHighBelowMaxIsTheLimit) {
  v2("/svc");
  write("sys/fs/cgroup/svc/memory.max", std::to_string(4 * kGiB));
  write("sys/fs/cgroup/svc/memory.high", std::to_string(3 * kGiB));
  write("sys/fs/cgroup/svc/memory.current", std::to_string(kGiB));
  HostMemory h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_limit, 3 * kGiB);
  EXPECT_EQ(h.cgroup_room, 2 * kGiB);
  write("sys/fs/cgroup/svc/memory.max", "max\n");  // a high watermark alone bounds too
  write("sys/fs/cgroup/svc/memory.high", std::to_string(2 * kGiB));
  h = read_host_memory(files_);
  EXPECT_EQ(h.cgroup_limit, 2 * kGiB);
  EXPECT_TRUE(h.cgroup_binds());
}

// A container that mounts the host's hierarchy over its own (systemd in Docker): the mount listed
// last at a point hides the earlier one, and a mount whose root does not hold the path is passed
// over for one that does.
TEST_F(FakeHost, TheMountThatShowsThePathIsChosen) {
  write("proc/cgroup", "0::/ct/app\n");
  write("proc/mountinfo", "31 1 0:26 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
                          "32 1 0:26 / /mnt/all rw - cgroup2 cgroup2 rw\n");
  write("mnt/all/ct/app/memory.max", std::to_string(kGiB));
  write("sys/fs/cgroup/ct/app/memory.max", std::to_string(5 * kGiB));
  EXPECT_EQ(read_host_memory(files_).cgroup_limit, kGiB);

  write("proc/mountinfo", "31 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
                          "40 31 0:50 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                          "41 1 0:26 / /mnt/all rw - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(read_host_memory(files_).cgroup_dir, (root_ / "mnt/all/ct/app").string());
}

TEST_F(FakeHost, DotsInsideANameAreNotAParentStep) {
  v2("/a..b");
  write("sys/fs/cgroup/a..b/memory.max", std::to_string(kGiB));
  EXPECT_EQ(read_host_memory(files_).cgroup_limit, kGiB);
  v2("/a/../b");
  EXPECT_FALSE(read_host_memory(files_).cgroup_limit);
}

TEST_F(FakeHost, EscapedMountPointIsDecoded) {
  write("proc/cgroup", "0::/j\n");
  write("proc/mountinfo", "31 1 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n");
  write("sys/fs/my cgroup/j/memory.max", std::to_string(kGiB));
  EXPECT_EQ(read_host_memory(files_).cgroup_limit, kGiB);
}

TEST_F(FakeHost, MalformedFilesAreIgnoredNotThrown) {
  write("proc/meminfo", "MemAvailable: lots kB\n");
  write("proc/cgroup", "garbage\n::\n0::/a\n");
  write("proc/mountinfo", "no dash here\n1 2 3\n31 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  write("sys/fs/cgroup/a/memory.max", "12abc\n");
  write("sys/fs/cgroup/memory.max", "99999999999999999999999\n");
  HostMemory h;
  ASSERT_NO_THROW(h = read_host_memory(files_));
  EXPECT_FALSE(h.mem_available);
  EXPECT_FALSE(h.cgroup_limit);
  EXPECT_FALSE(h.available());

  write("sys/fs/cgroup/a/memory.max", std::to_string(kGiB));  // readable limit, unreadable usage
  write("sys/fs/cgroup/a/memory.current", "-5\n");
  EXPECT_EQ(read_host_memory(files_).cgroup_room, kGiB);
}

// The kernel's files: this process moves into a new child of its memory cgroup limited to
// 256 MiB, reads, and moves back (skipped where no cgroup can be made: memory_cgroup.h).
TEST(HostMemoryKernel, AMemoryCgroupsLimitIsRead) {
  ASSERT_TRUE(read_host_memory().mem_available) << "/proc/meminfo has no MemAvailable";
  std::string why;
  const auto cg = test::MemoryCgroup::make(256 * kMiB, &why);
  if (!cg) GTEST_SKIP() << why;
  if (!cg->join()) GTEST_SKIP() << "cannot move this process into " << cg->dir();
  const HostMemory in = read_host_memory();
  EXPECT_EQ(in.cgroup_dir, cg->dir().string());
  ASSERT_TRUE(in.cgroup_limit && in.cgroup_room);
  EXPECT_EQ(*in.cgroup_limit, 256 * kMiB);
  EXPECT_LE(*in.cgroup_room, 256 * kMiB);
  EXPECT_GT(*in.cgroup_room, 0u);  // this test's own usage, charged since it joined, is far less
  EXPECT_EQ(in.available(), std::min(*in.cgroup_room, in.mem_available.value_or(*in.cgroup_room)));
}

}  // namespace
}  // namespace flexh2o
