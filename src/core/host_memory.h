// The host memory this process could still take: what a planner fills and what a check before
// a large allocation compares with. Linux only (/proc/meminfo).
#pragma once

#include <cstdint>
#include <optional>

namespace flexh2o {

// MemAvailable of /proc/meminfo in bytes (free memory plus the page cache the kernel can drop);
// nullopt when it cannot be read. Thread-safe; reads a file each call.
std::optional<uint64_t> available_host_memory();

}  // namespace flexh2o
