// length_sorted_order (batches of like prompt lengths) and generate() over such an order:
// the same results as request order, callbacks with request indices, less padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "engine/generate.h"
#include "test_util.h"

namespace flexh2o {
namespace {

std::vector<GenerationRequest> with_lengths(const std::vector<int>& lens, const std::vector<int>& gens = {}) {
  std::vector<GenerationRequest> r(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int t = 0; t < lens[i]; ++t) r[i].prompt_ids.push_back(int32_t(2 + (7 * i + 3 * size_t(t)) % 500));
    r[i].max_new_tokens = gens.empty() ? 4 : gens[i];
    r[i].sampling.seed = 100 + i;
  }
  return r;
}

TEST(LengthSortedOrder, SortsWithinWindowsStably) {
  // batch 2, windows of 2 batches = 4 requests: [5 1 3 1] [2 9 2] (a partial last window)
  const auto reqs = with_lengths({5, 1, 3, 1, 2, 9, 2}, {1, 2, 1, 1, 3, 1, 3});
  EXPECT_EQ(length_sorted_order(reqs, 2, 2), (std::vector<size_t>{3, 1, 2, 0, 4, 6, 5}));  // ties: max_new_tokens
  EXPECT_EQ(length_sorted_order(reqs, 2, 1), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(length_sorted_order(reqs, 2, 0), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));
  // Equal keys keep request order; one window covering everything.
  const auto same = with_lengths({3, 3, 1, 3, 1});
  EXPECT_EQ(length_sorted_order(same, 1, 100), (std::vector<size_t>{2, 4, 0, 1, 3}));
  EXPECT_TRUE(length_sorted_order({}, 4, 8).empty());
  EXPECT_THROW(length_sorted_order(same, 0, 8), Error);
}

TEST(LengthSortedOrder, GenerateGivesRequestOrderResultsWithLessPadding) {
  Model m = Model::load_dir(test::model_dir("tiny-llama"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 3);
  std::vector<int> lens;
  for (int i = 0; i < 12; ++i) lens.push_back(i % 2 ? 4 + i : 40 - 3 * i);
  auto reqs = with_lengths(lens);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.9f;  // sampled: each request draws from its own seed
    reqs[i].top_logprobs = 2;
    reqs[i].max_new_tokens = 3 + int64_t(i % 4);
  }
  GenerateOptions o;
  o.batch_size = 3;
  o.ignore_eos = true;
  GenerateStats plain_st, sorted_st;
  const std::vector<GenerationResult> plain = generate(runner, reqs, o, &plain_st);

  const std::vector<size_t> order = length_sorted_order(reqs, 3, 4);
  std::vector<size_t> reported;
  o.on_result = [&](size_t r, const GenerationResult& res) {
    reported.push_back(r);
    if (r != 5) {
      EXPECT_EQ(res.tokens, plain[r].tokens) << "request " << r;
    }
  };
  o.ends_at = [&](size_t r, const GenerationResult& res) { return r == 5 && res.tokens.size() == 2; };
  const std::vector<GenerationResult> sorted = generate(runner, reqs, order, o, &sorted_st);
  ASSERT_EQ(sorted.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i == 5) {  // ends_at saw request 5's own index
      EXPECT_EQ(sorted[i].finish, FinishReason::kStopped);
      EXPECT_EQ(sorted[i].tokens, std::vector<int32_t>(plain[i].tokens.begin(), plain[i].tokens.begin() + 2));
      continue;
    }
    EXPECT_EQ(sorted[i].tokens, plain[i].tokens) << i;
    EXPECT_EQ(sorted[i].logprobs, plain[i].logprobs) << i;
    EXPECT_EQ(sorted[i].finish, plain[i].finish) << i;
  }
  std::vector<size_t> want(reqs.size());
  std::iota(want.begin(), want.end(), size_t(0));
  EXPECT_EQ(std::set<size_t>(reported.begin(), reported.end()), std::set<size_t>(want.begin(), want.end()));
  EXPECT_NE(reported, want);  // they came in the sorted batches' order
  EXPECT_EQ(sorted_st.prompt_tokens, plain_st.prompt_tokens);
  // Prompts 40 5 34 | 7 28 9 | 22 11 16 | 13 10 15 pad to 3 x (40 + 28 + 22 + 15) = 315; sorted,
  // 5 7 9 | 10 11 13 | 15 16 22 | 28 34 40 pad to 3 x (9 + 13 + 22 + 40) = 252.
  EXPECT_EQ(plain_st.padded_prompt_tokens, 315);
  EXPECT_EQ(sorted_st.padded_prompt_tokens, 252);

  std::vector<size_t> bad = order;
  bad[0] = bad[1];
  EXPECT_THROW(generate(runner, reqs, bad, o), Error);
}

}  // namespace
}  // namespace flexh2o
