// The cutting of copies over page-locked host ranges (gpu/copy_pieces.h), without a GPU: no
// piece spans a registration edge on either side (the driver refuses one that does), the pieces
// cover the copy once and in order, and a 2-D piece is not cut where nothing forces it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "gpu/copy_pieces.h"

namespace flexh2o::gpu {
namespace {

PinRegistry registry(std::initializer_list<std::pair<uintptr_t, uintptr_t>> ranges) {
  PinRegistry r;
  for (auto [a, b] : ranges) r[a] = {b, 1};
  return r;
}

// True when some registration edge lies strictly inside [lo, hi): the span is refused.
bool spans_edge(const PinRegistry& pins, uintptr_t lo, uintptr_t hi) {
  for (const auto& [a, v] : pins)
    if ((a > lo && a < hi) || (v.first > lo && v.first < hi)) return true;
  return false;
}

TEST(CopyPieces, CutsAreTheEdgesStrictlyInside) {
  const PinRegistry pins = registry({{100, 200}, {200, 300}, {400, 500}});
  EXPECT_EQ(registration_cuts(pins, 150, 300), (std::vector<size_t>{50, 150, 250}));  // 200, 300, 400
  EXPECT_TRUE(registration_cuts(pins, 120, 60).empty()) << "inside one registration";
  EXPECT_TRUE(registration_cuts(pins, 100, 100).empty()) << "exactly one registration";
  EXPECT_TRUE(registration_cuts(pins, 300, 100).empty()) << "between registrations";
  EXPECT_TRUE(registration_cuts(pins, 1000, 10).empty()) << "after all of them";
  EXPECT_EQ(registration_cuts(pins, 0, 1000), (std::vector<size_t>{100, 200, 300, 400, 500}));
  EXPECT_EQ(registration_cuts(pins, 450, 100), (std::vector<size_t>{50})) << "out of the last one";
  EXPECT_TRUE(registration_cuts({}, 0, 1000).empty());
  EXPECT_EQ(piece_ends({50, 150}, {20, 150}, 300), (std::vector<size_t>{20, 50, 150, 300}));
  EXPECT_EQ(piece_ends({}, {}, 7), (std::vector<size_t>{7}));
}

// Random registries (neighbours often adjacent, as pin_in_place leaves them) and random 2-D
// copies: every piece is accepted by the driver's rule, the rows are covered once in order, and
// two neighbouring 2-D pieces could not have been one.
TEST(CopyPieces, TwoDimensionalPlansRespectEveryEdge) {
  std::mt19937_64 rng(7);
  auto pick = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  int split_rows = 0, merged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    PinRegistry src_pins, dst_pins;
    for (PinRegistry* pins : {&src_pins, &dst_pins}) {
      uintptr_t at = pick(0, 64);
      const int n = int(pick(0, 6));
      for (int i = 0; i < n; ++i) {
        const uintptr_t len = pick(1, 700);
        (*pins)[at] = {at + len, 1};
        at += len + (pick(0, 1) ? 0 : pick(1, 200));  // adjacent, or a gap
      }
    }
    const size_t width = pick(1, 150), height = pick(1, 30);
    const size_t spitch = width + pick(0, 120), dpitch = width + pick(0, 40);
    const uintptr_t src = pick(0, 300), dst = pick(0, 300);
    const std::vector<size_t> sc = registration_cuts(src_pins, src, spitch * (height - 1) + width);
    const std::vector<size_t> dc = registration_cuts(dst_pins, dst, dpitch * (height - 1) + width);
    const std::vector<RowPiece> plan = plan_2d(sc, spitch, dc, dpitch, width, height);
    size_t next = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      const RowPiece& p = plan[i];
      ASSERT_EQ(p.row, next) << trial;
      ASSERT_GE(p.rows, 1u) << trial;
      next = p.row + p.rows;
      if (p.split_row) {
        ASSERT_EQ(p.rows, 1u);
        ++split_rows;
        const uintptr_t s0 = src + p.row * spitch, d0 = dst + p.row * dpitch;
        size_t at = 0;
        for (size_t end : piece_ends(registration_cuts(src_pins, s0, width), registration_cuts(dst_pins, d0, width), width)) {
          ASSERT_GT(end, at);
          EXPECT_FALSE(spans_edge(src_pins, s0 + at, s0 + end)) << trial << " row " << p.row;
          EXPECT_FALSE(spans_edge(dst_pins, d0 + at, d0 + end)) << trial << " row " << p.row;
          at = end;
        }
        EXPECT_EQ(at, width);
        continue;
      }
      const uintptr_t s0 = src + p.row * spitch, s1 = src + (next - 1) * spitch + width;
      const uintptr_t d0 = dst + p.row * dpitch, d1 = dst + (next - 1) * dpitch + width;
      EXPECT_FALSE(spans_edge(src_pins, s0, s1)) << trial << " rows " << p.row << "+" << p.rows;
      EXPECT_FALSE(spans_edge(dst_pins, d0, d1)) << trial << " rows " << p.row << "+" << p.rows;
      merged += p.rows > 1;
      if (i + 1 < plan.size() && !plan[i + 1].split_row) {  // the next row would have crossed an edge
        const uintptr_t s2 = src + next * spitch + width, d2 = dst + next * dpitch + width;
        EXPECT_TRUE(spans_edge(src_pins, s0, s2) || spans_edge(dst_pins, d0, d2)) << trial << " rows " << p.row;
      }
    }
    EXPECT_EQ(next, height) << trial;
  }
  EXPECT_GT(split_rows, 20);  // the draw reaches both kinds of piece
  EXPECT_GT(merged, 20);
}

}  // namespace
}  // namespace flexh2o::gpu
