// Resident bytes of one mapping of this process, read from /proc/self/smaps: for tests that
// check checkpoint pages are let go once copied (MappedFile::release, Model::release_pages).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace flexh2o::test {

// The "Rss:" of the mapping (VMA) that holds `p`, in bytes; -1 when no mapping holds it.
inline int64_t mapping_rss_bytes(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto at = uintptr_t(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(' ') > line.find('-')) {
      inside = at >= lo && at < hi;
      continue;
    }
    long kib = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kib) == 1) return int64_t(kib) * 1024;
  }
  return -1;
}

}  // namespace flexh2o::test
