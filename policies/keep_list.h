// Turning a policy's victims into a "keep list" for in-place compaction of one cache row, plus a
// host reference of that compaction (the CPU path and tests use it; GPU kernels reimplement it).
// Keep list: new slot i receives old slot keep[i], for i in [0, n - #victims); keep[i] >= i.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"

namespace flexh2o {

enum class Compaction {
  // Survivors keep their relative order: keep = survivors ascending. In place, copies must run
  // in ascending i (a source slot keep[i] >= i is never overwritten before it is read).
  // Moves every slot after the first victim.
  kStable,
  // Survivors below m = n - #victims stay put (keep[i] = i); each victim slot below m receives
  // a survivor from [m, n): the first hole gets the last survivor, and so on ("move the last
  // slot into the victim"). Sources are i itself or >= m, never written, so every copy is
  // independent: any order, fully parallel. Moves at most #victims slots; permutes order.
  kMoveLast,
};

// `victims`: sorted ascending, unique, each in [0, n) (checked; throws Error otherwise).
// Writes n - victims.size() entries to `keep` (caller-owned, cleared first).
void make_keep_list(int64_t n, std::span<const int32_t> victims, Compaction mode,
                    std::vector<int32_t>& keep);

// Reference in-place compaction of one row: row[i] = row[keep[i]] in ascending i. Entries from
// keep.size() on are left as they were (stale). Requires keep[i] >= i and keep[i] < row.size().
template <typename T>
void compact_in_place(std::span<T> row, std::span<const int32_t> keep) {
  FH_CHECK(keep.size() <= row.size(), "keep list longer than the row");
  for (size_t i = 0; i < keep.size(); ++i) {
    const auto src = static_cast<size_t>(keep[i]);
    FH_CHECK(src >= i && src < row.size(), "keep list entry ", i, " -> ", keep[i], " invalid");
    if (src != i) row[i] = row[src];
  }
}

}  // namespace flexh2o
