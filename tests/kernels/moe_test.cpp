// cpu::moe_route against a double-precision reference (softmax, top k by probability then expert
// index, optional renormalization) over awkward expert counts, and its edge cases: ties, k == E,
// huge logits, NaN, bad k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu::test {
namespace {

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Routed route(const std::vector<float>& logits, int64_t E, int64_t k, bool normalize) {
  const int64_t M = int64_t(logits.size()) / E;
  Routed r{std::vector<int32_t>(size_t(M * k), -1), std::vector<float>(size_t(M * k), -1.f)};
  moe_route(logits.data(), M, E, k, normalize, r.experts.data(), r.weights.data());
  return r;
}

class MoeRoute : public ::testing::TestWithParam<std::tuple<int64_t /*E*/, int64_t /*k*/, bool /*normalize*/>> {};

TEST_P(MoeRoute, MatchesDoubleReference) {
  const auto [E, k, normalize] = GetParam();
  const int64_t M = 37;
  std::mt19937 g(unsigned(E * 131 + k));
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> logits(size_t(M * E));
  for (float& x : logits) x = d(g);
  const Routed got = route(logits, E, k, normalize);
  for (int64_t r = 0; r < M; ++r) {
    std::vector<double> p(static_cast<size_t>(E));
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(r * E + e)]));
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(logits[size_t(r * E + e)]) - mx);
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = size_t(r * k + j);
      ASSERT_EQ(got.experts[i], order[size_t(j)]) << "row " << r << " choice " << j;
      const double want = p[size_t(order[size_t(j)])] / (normalize ? chosen : sum);
      ASSERT_FALSE(std::isnan(got.weights[i]));
      EXPECT_NEAR(got.weights[i], want, 1e-6 * want + 1e-7) << "row " << r << " choice " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRoute,
                         ::testing::Values(std::tuple{1, 1, true}, std::tuple{1, 1, false}, std::tuple{3, 2, true},
                                           std::tuple{8, 2, true}, std::tuple{8, 2, false}, std::tuple{8, 8, true},
                                           std::tuple{13, 5, false}, std::tuple{128, 8, true},
                                           std::tuple{128, 8, false}));

TEST(MoeRouteEdges, TiesGoToTheLowerExpert) {
  const Routed r = route({1, 1, 1, 1, /**/ 0, 2, 0, 2}, 4, 2, false);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 1, 1, 3}));
  const float tied = float(std::exp(2.0) / (2 * std::exp(2.0) + 2));
  EXPECT_EQ(r.weights, (std::vector<float>{0.25f, 0.25f, r.weights[2], r.weights[2]}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.25f);
  EXPECT_NEAR(r.weights[2], tied, 1e-6);
}

TEST(MoeRouteEdges, AllExpertsNormalizedSumToOne) {
  const Routed r = route({0.5f, -3, 2, 7, 1}, 5, 5, true);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 2, 4, 0, 1}));
  EXPECT_NEAR(std::accumulate(r.weights.begin(), r.weights.end(), 0.0), 1.0, 1e-6);
}

TEST(MoeRouteEdges, HugeLogitsStayFinite) {
  const Routed r = route({3e38f, -3e38f, 1e38f, 3e38f}, 4, 2, false);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 3}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
}

// A NaN logit poisons the row's weights (the hidden state then shows it) instead of being
// dropped silently, and the choice stays defined (valid, distinct experts).
TEST(MoeRouteEdges, NanLogitGivesNanWeights) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& row : {std::vector<float>{nan, 1, 2, 0}, std::vector<float>{1, 2, 0, nan}}) {
    const Routed r = route(row, 4, 2, true);
    EXPECT_TRUE(std::isnan(r.weights[0]) || std::isnan(r.weights[1]));
    EXPECT_NE(r.experts[0], r.experts[1]);
    for (int32_t e : r.experts) EXPECT_TRUE(e >= 0 && e < 4);
  }
}

TEST(MoeRouteEdges, BadKThrows) {
  std::vector<float> l(4, 0.f);
  std::vector<int32_t> e(8);
  std::vector<float> w(8);
  EXPECT_THROW(moe_route(l.data(), 1, 4, 5, true, e.data(), w.data()), Error);
  EXPECT_THROW(moe_route(l.data(), 1, 4, 0, true, e.data(), w.data()), Error);
}

}  // namespace
}  // namespace flexh2o::cpu::test
