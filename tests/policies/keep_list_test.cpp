// Tests of make_keep_list / compact_in_place: keep[i] >= i, the surviving set, stable order,
// move-last independence of copies, and rejection of malformed victim lists.
#include <gtest/gtest.h>

#include "sim.h"

namespace flexh2o::test {
namespace {

TEST(KeepList, SmallExamples) {
  std::vector<int32_t> keep;
  const std::vector<int32_t> victims = {1, 4};
  make_keep_list(6, victims, Compaction::kStable, keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 3, 5}));
  make_keep_list(6, victims, Compaction::kMoveLast, keep);  // m = 4: hole 1 <- last survivor 5
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 5, 2, 3}));
  make_keep_list(7, std::vector<int32_t>{0, 2, 6}, Compaction::kMoveLast, keep);  // holes 0, 2
  EXPECT_EQ(keep, (std::vector<int32_t>{5, 1, 4, 3}));
  make_keep_list(3, std::vector<int32_t>{0, 1, 2}, Compaction::kMoveLast, keep);
  EXPECT_TRUE(keep.empty());
  make_keep_list(0, std::vector<int32_t>{}, Compaction::kStable, keep);
  EXPECT_TRUE(keep.empty());
}

TEST(KeepList, RejectsMalformedVictims) {
  std::vector<int32_t> keep;
  expect_error([&] { make_keep_list(5, std::vector<int32_t>{3, 1}, Compaction::kStable, keep); },
               {"sorted ascending"});
  expect_error([&] { make_keep_list(5, std::vector<int32_t>{1, 1}, Compaction::kMoveLast, keep); },
               {"unique"});
  expect_error([&] { make_keep_list(5, std::vector<int32_t>{5}, Compaction::kStable, keep); },
               {"outside [0, 5)"});
  expect_error([&] { make_keep_list(-1, std::vector<int32_t>{}, Compaction::kStable, keep); },
               {"row size -1"});
}

TEST(KeepList, CompactInPlaceRejectsBadLists) {
  std::vector<int> row = {1, 2, 3};
  expect_error([&] { compact_in_place(std::span<int>(row), std::vector<int32_t>{1, 0}); },
               {"entry 1"});
}

class KeepListSizes : public ::testing::TestWithParam<std::tuple<int64_t, Compaction>> {};

TEST_P(KeepListSizes, ValidListsYieldTheSurvivors) {
  const auto [n, mode] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 3 + static_cast<int>(mode)));
  std::vector<int32_t> keep;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int32_t> victims;
    const double p = (trial % 5) / 4.0;  // 0, .25, .5, .75, 1 of the row evicted
    std::bernoulli_distribution coin(p);
    for (int32_t i = 0; i < n; ++i)
      if (coin(rng)) victims.push_back(i);
    make_keep_list(n, victims, mode, keep);
    const auto m = static_cast<size_t>(n) - victims.size();
    ASSERT_EQ(keep.size(), m);
    std::set<int32_t> want;
    for (int32_t i = 0; i < n; ++i)
      if (!std::binary_search(victims.begin(), victims.end(), i)) want.insert(i);
    for (size_t i = 0; i < m; ++i) {
      ASSERT_GE(keep[i], static_cast<int32_t>(i));
      ASSERT_LT(keep[i], n);
      if (mode == Compaction::kStable) {
        if (i > 0) {
          ASSERT_LT(keep[i - 1], keep[i]);
        }
      } else {  // a survivor below m never moves; others come from the tail [m, n)
        ASSERT_TRUE(keep[i] == static_cast<int32_t>(i) || keep[i] >= static_cast<int32_t>(m));
      }
    }
    ASSERT_EQ(std::set<int32_t>(keep.begin(), keep.end()), want);
    // Applying it in place moves exactly the survivors' payloads into [0, m).
    std::vector<int64_t> row(static_cast<size_t>(n));
    std::iota(row.begin(), row.end(), 1000);
    compact_in_place(std::span<int64_t>(row), std::span<const int32_t>(keep));
    for (size_t i = 0; i < m; ++i) ASSERT_EQ(row[i], 1000 + keep[i]);
    // Move-last copies are independent: applying them in reverse order gives the same result.
    if (mode == Compaction::kMoveLast) {
      std::vector<int64_t> rev(static_cast<size_t>(n));
      std::iota(rev.begin(), rev.end(), 1000);
      for (size_t i = m; i-- > 0;) rev[i] = rev[static_cast<size_t>(keep[i])];
      ASSERT_TRUE(std::equal(rev.begin(), rev.begin() + static_cast<ptrdiff_t>(m), row.begin()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AwkwardSizes, KeepListSizes,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::Values(Compaction::kStable,
                                                              Compaction::kMoveLast)));

}  // namespace
}  // namespace flexh2o::test
