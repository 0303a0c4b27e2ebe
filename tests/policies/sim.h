// Test helpers for policies_test: a one-row KV "cache" (positions + scores) driven the way the
// engine drives it (select victims, compact with a keep list, append, accumulate), a brute-force
// reference selection, and an exception-message matcher. Not a test by itself.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "policies/keep_list.h"
#include "policies/kv_policy.h"

namespace flexh2o::test {

struct Row {
  std::vector<int32_t> pos;
  std::vector<float> score;
  uint64_t salt = 0;
  SlotView view() const { return {score, pos, salt}; }
  std::set<int32_t> positions() const { return {pos.begin(), pos.end()}; }
};

// Evicts down to `keep` slots and compacts the row in place; returns the evicted positions.
inline std::set<int32_t> evict(const KvPolicy& p, const KvBudget& b, Row& row, int64_t keep,
                               Compaction mode) {
  std::vector<int32_t> victims, kl;
  p.select_victims(row.view(), b, keep, victims);
  std::set<int32_t> gone;
  for (int32_t v : victims) gone.insert(row.pos[v]);
  make_keep_list(static_cast<int64_t>(row.pos.size()), victims, mode, kl);
  compact_in_place(std::span<int32_t>(row.pos), std::span<const int32_t>(kl));
  compact_in_place(std::span<float>(row.score), std::span<const int32_t>(kl));
  row.pos.resize(kl.size());
  row.score.resize(kl.size());
  return gone;
}

// Decode step: append token `p` (score 0), then add this step's probabilities, keyed by position;
// the keys must be exactly the tokens attention sees.
inline void attend(Row& row, int32_t p, const std::map<int32_t, float>& probs) {
  row.pos.push_back(p);
  row.score.push_back(0.0f);
  std::set<int32_t> keys;
  for (const auto& [k, v] : probs) keys.insert(k);
  ASSERT_EQ(keys, row.positions()) << "script does not match the visible tokens";
  for (size_t i = 0; i < row.pos.size(); ++i) row.score[i] += probs.at(row.pos[i]);
}

// Brute force: sort everything. Victim POSITIONS for sinks/heavy/recent with the documented
// quota split (recent shrinks first), ties on score evict the older token, NaN = -inf.
inline std::set<int32_t> reference_victims(const Row& row, const KvBudget& b, int64_t keep) {
  const auto n = static_cast<int64_t>(row.pos.size());
  if (n <= keep) return {};
  const int64_t s = std::min(b.sinks, keep), h = std::min(b.heavy, keep - s), r = keep - s - h;
  std::vector<size_t> idx(row.pos.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t c) { return row.pos[a] < row.pos[c]; });
  std::vector<size_t> mid(idx.begin() + s, idx.end() - r);
  auto key = [&](size_t i) { return std::isnan(row.score[i]) ? -INFINITY : row.score[i]; };
  std::sort(mid.begin(), mid.end(), [&](size_t a, size_t c) {  // best first
    return key(a) > key(c) || (key(a) == key(c) && row.pos[a] > row.pos[c]);
  });
  std::set<int32_t> gone;
  for (size_t j = static_cast<size_t>(h); j < mid.size(); ++j) gone.insert(row.pos[mid[j]]);
  return gone;
}

// n distinct positions with gaps in [0, 4n), in shuffled slot order; scores on a 0.25 grid in
// [0, 2] so that ties are common.
inline Row random_row(int64_t n, std::mt19937& rng) {
  std::vector<int32_t> all(static_cast<size_t>(4 * n));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  Row row;
  row.pos.assign(all.begin(), all.begin() + n);
  std::uniform_int_distribution<int> q(0, 8);
  for (int64_t i = 0; i < n; ++i) row.score.push_back(0.25f * static_cast<float>(q(rng)));
  return row;
}

// A row as the engine keeps it: positions 0..sinks-1, the `recent` newest positions without a
// gap, the rest scattered between, in shuffled slot order. Scores mix ties, both zeros, both
// infinities and NaN.
inline Row row_of_ranges(int64_t n, int64_t recent, int64_t sinks, std::mt19937& rng) {
  const auto newest = static_cast<int32_t>(4 * n + 10);
  std::vector<int32_t> middle(static_cast<size_t>(newest - recent + 1 - sinks));
  std::iota(middle.begin(), middle.end(), static_cast<int32_t>(sinks));
  std::shuffle(middle.begin(), middle.end(), rng);
  Row row;
  for (int64_t i = 0; i < sinks; ++i) row.pos.push_back(static_cast<int32_t>(i));
  row.pos.insert(row.pos.end(), middle.begin(), middle.begin() + (n - recent - sinks));
  for (int64_t i = 0; i < recent; ++i) row.pos.push_back(static_cast<int32_t>(newest - i));
  std::shuffle(row.pos.begin(), row.pos.end(), rng);
  const float special[] = {NAN, -INFINITY, INFINITY, -0.f, 0.f, -0.5f};
  std::uniform_int_distribution<int> q(0, 11);
  for (int64_t i = 0; i < n; ++i) {
    const int k = q(rng);
    row.score.push_back(k < 6 ? special[k] : 0.25f * static_cast<float>(k - 6));
  }
  return row;
}

inline std::set<int32_t> range_set(int32_t lo, int32_t hi) {  // [lo, hi)
  std::set<int32_t> s;
  for (int32_t i = lo; i < hi; ++i) s.insert(i);
  return s;
}

// Expects fn() to throw flexh2o::Error whose message contains every string in `parts`.
inline void expect_error(const std::function<void()>& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

// Awkward sizes: 1, small primes, a larger prime.
inline const std::vector<int64_t> kSizes = {1, 2, 3, 5, 7, 13, 31, 97, 251};

}  // namespace flexh2o::test
