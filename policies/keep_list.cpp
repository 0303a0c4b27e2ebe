// make_keep_list (keep_list.h): victims -> keep list for stable or move-last compaction.
// O(n) for kStable, O(#victims) + O(n - m) for kMoveLast. No allocation beyond `keep`.
#include "policies/keep_list.h"

#include <limits>

namespace flexh2o {

void make_keep_list(int64_t n, std::span<const int32_t> victims, Compaction mode,
                    std::vector<int32_t>& keep) {
  FH_CHECK(n >= 0 && n <= std::numeric_limits<int32_t>::max(), "row size ", n, " out of range");
  const auto v = static_cast<int64_t>(victims.size());
  FH_CHECK(v <= n, v, " victims for a row of ", n, " slots");
  for (int64_t j = 0; j < v; ++j) {
    FH_CHECK(victims[j] >= 0 && victims[j] < n, "victim slot ", victims[j], " outside [0, ", n,
             ")");
    FH_CHECK(j == 0 || victims[j - 1] < victims[j], "victims must be sorted ascending and unique");
  }
  const int64_t m = n - v;
  keep.clear();
  keep.reserve(static_cast<size_t>(m));

  if (mode == Compaction::kStable) {
    int64_t j = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (j < v && victims[j] == i) {
        ++j;
        continue;
      }
      keep.push_back(i);
    }
    return;
  }

  // kMoveLast: identity below m, then fill the holes (victims < m) with survivors >= m, the
  // first hole with the last survivor.
  for (int32_t i = 0; i < m; ++i) keep.push_back(i);
  int64_t hi = v - 1;           // victims[hi] is the largest victim not yet skipped
  int64_t src = n - 1;          // next candidate survivor, scanned downwards
  for (int64_t j = 0; j < v && victims[j] < m; ++j) {
    while (hi >= 0 && victims[hi] == src) {  // skip victims in the tail
      --hi;
      --src;
    }
    FH_CHECK(src >= m, "internal: ran out of tail survivors");
    keep[static_cast<size_t>(victims[j])] = static_cast<int32_t>(src--);
  }
}

}  // namespace flexh2o
