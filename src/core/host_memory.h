// The host memory this process could still take: what a planner fills and what a check before
// a large allocation compares with. Linux only: /proc/meminfo's MemAvailable, bounded by the
// memory cgroup the process runs in (a container's limit, which /proc/meminfo does not show).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace flexh2o {

// Where read_host_memory() looks; the defaults are the kernel's files. Tests point them at a
// tree of their own. Mount points read from `mountinfo` are taken under `root`.
struct HostMemoryFiles {
  std::filesystem::path meminfo = "/proc/meminfo";
  std::filesystem::path cgroup = "/proc/self/cgroup";
  std::filesystem::path mountinfo = "/proc/self/mountinfo";
  std::filesystem::path root = "/";
};

// Bytes. A field is nullopt when its files are absent or unreadable (no cgroup memory
// controller, no limit set: every limit of the chain is "max" or v1's unlimited sentinel).
struct HostMemory {
  std::optional<uint64_t> mem_available;  // MemAvailable: free memory plus page cache the kernel can drop
  // The tightest memory limit of the process's cgroup and its ancestors (v2: memory.max, or
  // memory.high where lower; v1: memory.limit_in_bytes), and the least room a level leaves: its
  // limit less its usage, where usage does not count the page cache (active and inactive file
  // pages, which the kernel reclaims first, as MemAvailable counts them; a level whose usage
  // cannot be read counts as empty). The room may come from another level than the limit. Swap
  // is not counted.
  std::optional<uint64_t> cgroup_limit;
  std::optional<uint64_t> cgroup_room;
  std::string cgroup_dir;  // the cgroup directory read (for messages); empty without one

  // The smaller of mem_available and cgroup_room; nullopt when neither is known.
  std::optional<uint64_t> available() const;
  // The cgroup, not the machine, sets available(): its room is known and less than MemAvailable
  // (or MemAvailable is unknown).
  bool cgroup_binds() const;
};

// Reads the files each call; thread-safe. Never throws for a malformed or missing file: what
// cannot be read is left nullopt.
HostMemory read_host_memory(const HostMemoryFiles& files = {});

// read_host_memory().available().
std::optional<uint64_t> available_host_memory();

}  // namespace flexh2o
