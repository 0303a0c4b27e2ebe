// Sampler: greedy ties, top-k / top-p / min-p truncation, seeded reproducibility, temperature, the
// repetition / presence / frequency penalties (values worked by hand from transformers' and
// OpenAI's definitions), and the distribution sample() draws from against transformers' logits
// processors (tests/data/sampling/cases.json, tests/tools/make_sampling_cases.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/test_util.h"

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
  auto msg = [](SamplingParams p) {
    try {
      Sampler s(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(msg({1.f, 0, 1.f, 0, -0.1f}).find("min_p must be in [0, 1]"), std::string::npos);
  EXPECT_NE(msg({1.f, 0, 1.f, 0, 1.5f}).find("min_p"), std::string::npos);
  EXPECT_NE(msg({1.f, 0, 1.f, 0, 0.f, 0.f}).find("repetition_penalty must be > 0 (1 = off), got 0"), std::string::npos);
  EXPECT_NE(msg({1.f, 0, 1.f, 0, 0.f, NAN}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(msg({1.f, 0, 1.f, 0, 0.f, 1.f, 2.5f}).find("presence_penalty must be in [-2, 2]"), std::string::npos);
  EXPECT_NE(msg({1.f, 0, 1.f, 0, 0.f, 1.f, 0.f, -3.f}).find("frequency_penalty must be in [-2, 2]"), std::string::npos);
  EXPECT_EQ(msg({1.f, 0, 1.f, 0, 1.f, 0.5f, -2.f, 2.f}), "accepted");
}

// (id, probability) pairs against softmax(expected) over all ids, most likely first.
void expect_softmax(const std::vector<std::pair<int32_t, double>>& got, const std::vector<double>& logits) {
  double mx = *std::max_element(logits.begin(), logits.end()), total = 0;
  for (double x : logits) total += std::exp(x - mx);
  ASSERT_EQ(got.size(), logits.size());
  double prev = 2;
  for (const auto& [id, p] : got) {
    EXPECT_NEAR(p, std::exp(logits[size_t(id)] - mx) / total, 1e-6) << "id " << id;
    EXPECT_LE(p, prev);
    prev = p;
  }
}

// transformers: every id of prompt + generated, once however often it occurs, from its own
// logit: positive / penalty, negative * penalty; greedy sees it too.
TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnce) {
  const std::vector<float> l{2.f, -1.f, 0.5f, 1.5f, 0.f};
  const std::vector<int32_t> prompt{0, 4}, gen{1, 1, 0};
  Sampler s({1.f, 0, 1.f, 0, 0.f, 2.f});
  expect_softmax(s.distribution(l.data(), 5, {prompt, gen}), {1.0, -2.0, 0.5, 1.5, 0.0});
  expect_softmax(s.distribution(l.data(), 5), {2.0, -1.0, 0.5, 1.5, 0.0});  // no history, no penalty
  Sampler g({0.f, 0, 1.f, 0, 0.f, 2.f}), g1({0.f, 0, 1.f, 0});
  EXPECT_EQ(g.sample(l.data(), 5, {prompt, gen}), 3);
  EXPECT_EQ(g1.sample(l.data(), 5, {prompt, gen}), 0);
  Sampler below({1.f, 0, 1.f, 0, 0.f, 0.5f});  // < 1 favours repeats
  expect_softmax(below.distribution(l.data(), 5, {prompt, gen}), {4.0, -0.5, 0.5, 1.5, 0.0});
}

// OpenAI: generated tokens only, presence once, frequency per occurrence; after the repetition
// penalty, before the temperature.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> l{1.f, 1.f, 1.f, 1.f};
  const std::vector<int32_t> prompt{3, 3}, gen{0, 0, 1, 0};
  Sampler s({1.f, 0, 1.f, 0, 0.f, 1.f, 0.5f, 0.25f});
  expect_softmax(s.distribution(l.data(), 4, {prompt, gen}), {1 - 0.5 - 0.75, 1 - 0.5 - 0.25, 1, 1});
  // Twice in a row: the marks of the first call are cleared.
  expect_softmax(s.distribution(l.data(), 4, {prompt, gen}), {1 - 0.5 - 0.75, 1 - 0.5 - 0.25, 1, 1});
  Sampler both({2.f, 0, 1.f, 0, 0.f, 2.f, -1.f, 0.f});  // (1 / 2 + 1) / temperature 2
  expect_softmax(both.distribution(l.data(), 4, {prompt, gen}), {0.75, 0.75, 0.5, 0.25});
  const std::vector<int32_t> bad{4};
  EXPECT_THROW(s.distribution(l.data(), 4, {prompt, bad}), Error);
}

// OpenAI's logit_bias: added after the penalties, before the temperature, greedy too.
TEST(Sampler, LogitBiasIsAddedAfterThePenalties) {
  const std::vector<float> l{2.f, 1.f, 0.5f, 1.5f};
  const std::vector<int32_t> prompt{0}, gen{0};
  SamplingParams p{1.f, 0, 1.f, 0, 0.f, 2.f};
  p.logit_bias = {{1, -0.5f}, {3, 1.f}};
  Sampler s(p);  // repetition penalty halves token 0's 2 to 1, then the biases
  expect_softmax(s.distribution(l.data(), 4, {prompt, gen}), {1.0, 0.5, 0.5, 2.5});
  SamplingParams greedy{0.f, 0, 1.f, 0};
  greedy.logit_bias = {{0, -100.f}};  // bans the greedy choice
  Sampler g(greedy);
  EXPECT_EQ(g.sample(l.data(), 4), 3);
  greedy.logit_bias = {{2, 100.f}};  // forces one
  Sampler f(greedy);
  EXPECT_EQ(f.sample(l.data(), 4), 2);
  SamplingParams hot{1.f, 0, 1.f, 7};
  hot.logit_bias = {{2, 100.f}};
  Sampler h(hot);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(h.sample(l.data(), 4), 2);
  SamplingParams bad{1.f, 0, 1.f, 0};
  bad.logit_bias = {{4, 1.f}};
  EXPECT_THROW(validate(bad, 4), Error);  // outside the vocabulary
  EXPECT_NO_THROW(validate(bad));          // no vocabulary given: only the sign is checked
  Sampler late(bad);
  EXPECT_THROW(late.sample(l.data(), 4), Error);
  bad.logit_bias = {{1, 100.5f}};
  EXPECT_THROW(validate(bad, 4), Error);
  bad.logit_bias = {{1, 1.f}, {1, 2.f}};
  EXPECT_THROW(validate(bad, 4), Error);
  bad.logit_bias = {{-1, 1.f}};
  EXPECT_THROW(validate(bad), Error);
}

// transformers' MinPLogitsWarper after top-k and top-p: keep p >= min_p * p_max.
TEST(Sampler, MinPKeepsTokensWithinAFractionOfTheMostLikely) {
  const std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto kept = [&](SamplingParams p) {
    std::vector<int32_t> ids;
    for (const auto& [id, pr] : Sampler(p).distribution(l.data(), 4)) ids.push_back(id);
    return ids;
  };
  EXPECT_EQ(kept({1.f, 0, 1.f, 0, 0.25f}), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept({1.f, 0, 1.f, 0, 0.5f}), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept({1.f, 0, 1.f, 0, 1.f}), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept({1.f, 2, 1.f, 0, 0.05f}), (std::vector<int32_t>{0, 1}));  // top-k first
  // At temperature 2 the ratios are square roots: 0.15 / 0.5 -> 0.548 >= 0.5.
  EXPECT_EQ(kept({2.f, 0, 1.f, 0, 0.5f}), (std::vector<int32_t>{0, 1, 2}));
  const auto d = Sampler({1.f, 0, 1.f, 0, 0.25f}).distribution(l.data(), 4);
  EXPECT_NEAR(d[2].second, 0.15 / 0.95, 1e-6);  // renormalized over what is kept
  Sampler s({1.f, 0, 1.f, 7, 0.5f});
  for (int i = 0; i < 300; ++i) EXPECT_LT(s.sample(l.data(), 4), 2);
}

// log softmax of the raw row: exact on a hand case, the alternatives most likely first (ties to
// the lower id), the chosen token's value among them; a large row stays finite.
TEST(TokenLogprob, IsLogSoftmaxWithTheMostLikelyAlternatives) {
  const std::vector<float> l{std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  std::vector<TokenLogprob> top;
  EXPECT_NEAR(token_logprob(l.data(), 4, 1, 3, &top), std::log(0.25), 1e-6);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 0);
  EXPECT_EQ(top[1].id, 1);
  EXPECT_EQ(top[2].id, 2);  // tied with 3: the lower id
  EXPECT_NEAR(top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_NEAR(top[2].logprob, std::log(0.125), 1e-6);
  EXPECT_NEAR(token_logprob(l.data(), 4, 3, 10, &top), std::log(0.125), 1e-6);
  EXPECT_EQ(top.size(), 4u) << "at most the vocabulary";
  const std::vector<float> big{1000.f, 999.f, -1000.f};
  const float lp = token_logprob(big.data(), 3, 1);
  EXPECT_TRUE(std::isfinite(lp));
  EXPECT_NEAR(lp, -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_THROW(token_logprob(big.data(), 3, 3), Error);
}

// Without top-k the kept tokens are found without sorting the vocabulary (a weighted
// quickselect among the tokens heavy enough to matter): the same tokens and probabilities as
// sorting all of them, on flat and peaked rows of 1000 and 50000 tokens; draws stay inside.
TEST(Sampler, LargeVocabularyTopPAndMinPEqualAFullSort) {
  std::mt19937 g(11);
  int checked = 0;
  for (int64_t V : {int64_t(1000), int64_t(50000)})
    for (float spread : {0.02f, 1.f, 4.f})
      for (float top_p : {0.3f, 0.9f, 0.995f, 1.f})
        for (float min_p : {0.f, 0.001f, 0.3f}) {
          std::normal_distribution<float> n(0.f, spread);
          std::vector<float> l(static_cast<size_t>(V));
          for (auto& x : l) x = n(g);
          const float T = 0.7f;
          std::vector<std::pair<float, int32_t>> all(static_cast<size_t>(V));
          for (int64_t i = 0; i < V; ++i) all[size_t(i)] = {l[size_t(i)] / T, int32_t(i)};
          std::sort(all.begin(), all.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
          std::vector<double> w(all.size());
          double total = 0;
          for (size_t i = 0; i < all.size(); ++i) total += w[i] = std::exp(double(all[i].first - all[0].first));
          size_t keep = all.size();
          double acc = 0, margin = 1;
          if (top_p < 1.f)
            for (size_t i = 0; i < all.size(); ++i) {
              acc += w[i] / total;
              margin = std::min(margin, std::abs(acc - top_p));
              if (acc >= top_p) {
                keep = i + 1;
                break;
              }
            }
          while (min_p > 0.f && keep > 1 && w[keep - 1] < min_p) --keep;
          if (margin < 1e-9) continue;  // a cut within rounding of the threshold
          double kept = 0;
          for (size_t i = 0; i < keep; ++i) kept += w[i];
          SamplingParams p{T, 0, top_p, 5, min_p};
          const auto got = Sampler(p).distribution(l.data(), V);
          ASSERT_EQ(got.size(), keep) << V << " " << spread << " " << top_p << " " << min_p;
          for (size_t i = 0; i < keep; ++i) {
            ASSERT_EQ(got[i].first, all[i].second) << i;
            ASSERT_NEAR(got[i].second, w[i] / kept, 1e-9) << i;
          }
          Sampler s(p);
          std::vector<char> in(static_cast<size_t>(V), 0);
          for (size_t i = 0; i < keep; ++i) in[size_t(all[i].second)] = 1;
          for (int d = 0; d < 50; ++d) ASSERT_TRUE(in[size_t(s.sample(l.data(), V))]) << "a draw outside the kept tokens";
          ++checked;
        }
  EXPECT_GT(checked, 60);
}

// transformers' RepetitionPenalty -> Temperature -> TopK -> TopP -> MinP on 60 random cases: the
// same tokens kept, with the same probabilities.
TEST(Sampler, DistributionMatchesTransformersProcessors) {
  const auto doc = test::read_json(std::filesystem::path(FLEXH2O_TEST_DATA) / "sampling" / "cases.json");
  ASSERT_GE(doc["cases"].size(), 60u);
  int truncated = 0;
  for (size_t c = 0; c < doc["cases"].size(); ++c) {
    const auto& k = doc["cases"][c];
    const auto& pj = k["params"];
    SamplingParams p;
    p.temperature = pj["temperature"].get<float>();
    p.top_k = pj["top_k"].get<int>();
    p.top_p = pj["top_p"].get<float>();
    p.min_p = pj["min_p"].get<float>();
    p.repetition_penalty = pj["repetition_penalty"].get<float>();
    const auto logits = k["logits"].get<std::vector<float>>();
    const auto prompt = k["prompt"].get<std::vector<int32_t>>(), gen = k["generated"].get<std::vector<int32_t>>();
    const auto want = k["probs"].get<std::vector<double>>();
    std::vector<double> got(want.size(), 0.0);
    for (const auto& [id, pr] : Sampler(p).distribution(logits.data(), int64_t(logits.size()), {prompt, gen}))
      got[size_t(id)] = pr;
    int kept = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i] > 0, want[i] > 0) << "case " << c << " token " << i << ": " << pj.dump();
      EXPECT_NEAR(got[i], want[i], 1e-6) << "case " << c << " token " << i << ": " << pj.dump();
      kept += want[i] > 0;
    }
    truncated += kept < int(want.size());
  }
  EXPECT_GT(truncated, 30) << "most cases should cut the vocabulary";
}

}  // namespace
}  // namespace flexh2o
