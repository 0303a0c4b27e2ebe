// Sampler: greedy ties, top-k / top-p truncation, seeded reproducibility, temperature.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/sampler.h"

namespace flexh2o {
namespace {

TEST(Sampler, GreedyPicksFirstMaximum) {
  Sampler s({0.f, 0, 1.f, 0});
  std::vector<float> l{0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(s.sample(l.data(), 4), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> l{0.1f, 2.f, 1.9f, -5.f, 1.99f};
  Sampler k1({1.f, 1, 1.f, 3});
  Sampler p0({1.f, 0, 1e-6f, 4});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1.sample(l.data(), 5), 1);
    EXPECT_EQ(p0.sample(l.data(), 5), 1);
  }
}

TEST(Sampler, TopKRestrictsSupport) {
  std::vector<float> l{5.f, 4.f, 3.f, 0.f, 0.f, 0.f};
  Sampler s({5.f, 2, 1.f, 9});
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.sample(l.data(), 6), 2);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  // Probabilities ~ 0.5, 0.3, 0.2 (logs): top_p 0.75 keeps {0, 1}.
  std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s({1.f, 0, 0.75f, 1});
  std::map<int, int> seen;
  for (int i = 0; i < 500; ++i) ++seen[s.sample(l.data(), 3)];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_GT(seen[1], 100);  // ~37.5% of 500
}

TEST(Sampler, SameSeedSameSequenceAndFrequenciesFollowSoftmax) {
  std::vector<float> l{std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  Sampler a({1.f, 0, 1.f, 42}), b({1.f, 0, 1.f, 42});
  std::map<int, int> seen;
  for (int i = 0; i < 4000; ++i) {
    int x = a.sample(l.data(), 3);
    EXPECT_EQ(x, b.sample(l.data(), 3));
    ++seen[x];
  }
  EXPECT_NEAR(seen[0] / 4000.0, 0.7, 0.03);
  EXPECT_NEAR(seen[2] / 4000.0, 0.1, 0.02);
}

TEST(Sampler, InvalidParamsThrow) {
  EXPECT_THROW(Sampler({-1.f, 0, 1.f, 0}), Error);
  EXPECT_THROW(Sampler({1.f, -2, 1.f, 0}), Error);
  EXPECT_THROW(Sampler({1.f, 0, 1.5f, 0}), Error);
}

}  // namespace
}  // namespace flexh2o
