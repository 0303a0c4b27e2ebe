// The generation driver's stop flag: set from a result callback (as a signal thread would set
// it), the run ends at the next token-step boundary, finished requests keep exactly the tokens
// of an uninterrupted run, and the rest are marked unfinished. And GenerateOptions::ends_at,
// which ends one sequence early (stop strings) without changing any other; and several EOS ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <span>

#include "engine/generate.h"
#include "test_util.h"

namespace flexh2o {
namespace {

TEST(GenerateStop, EndsAtAStepBoundaryKeepingFinishedResults) {
  Model m = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::vector<GenerationRequest> reqs(5);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt_ids = {2, int32_t(100 + i), int32_t(200 + i)};
    reqs[i].max_new_tokens = i == 0 ? 2 : 6;
    reqs[i].sampling.seed = i;
  }
  GenerateOptions o;
  o.batch_size = 2;
  o.ignore_eos = true;
  const std::vector<GenerationResult> full = generate(fwd, reqs, o);

  std::atomic<bool> stop{false};
  std::vector<size_t> reported;
  o.stop = &stop;
  o.on_result = [&](size_t r, const GenerationResult&) {
    reported.push_back(r);
    stop = true;  // request 0 finishes after 2 tokens: request 1 must not get its 3rd
  };
  GenerateStats st;
  const std::vector<GenerationResult> cut = generate(fwd, reqs, o, &st);
  EXPECT_TRUE(st.interrupted);
  EXPECT_EQ(reported, std::vector<size_t>{0});
  ASSERT_EQ(cut.size(), reqs.size());
  EXPECT_TRUE(cut[0].finished);
  EXPECT_EQ(cut[0].tokens, full[0].tokens);
  EXPECT_FALSE(cut[1].finished);
  EXPECT_EQ(cut[1].tokens.size(), 2u);  // the step that finished request 0, no further one
  for (size_t i = 2; i < reqs.size(); ++i) EXPECT_FALSE(cut[i].finished) << i;
  EXPECT_EQ(st.generated_tokens, 4);
  for (const auto& r : full) EXPECT_TRUE(r.finished);

  stop = true;  // already set before the run: nothing runs
  reported.clear();
  const std::vector<GenerationResult> none = generate(fwd, reqs, o, &st);
  EXPECT_TRUE(st.interrupted);
  EXPECT_TRUE(reported.empty());
  EXPECT_EQ(st.generated_tokens, 0);
}


// ends_at ends exactly the sequences it names, at the token it says, and every other sequence
// (same batch or not) keeps the tokens of the run without it; a batch whose sequences all end
// early runs fewer decode steps.
TEST(GenerateEndsAt, EndsOneSequenceAtTheTokenItNames) {
  Model m = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::vector<GenerationRequest> reqs(5);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt_ids = {2, int32_t(300 + i), int32_t(40 + i)};
    reqs[i].max_new_tokens = 7;
    reqs[i].sampling.temperature = 0.8f;
    reqs[i].sampling.seed = 10 + i;
  }
  GenerateOptions o;
  o.batch_size = 2;
  o.ignore_eos = true;
  GenerateStats full_st;
  const std::vector<GenerationResult> full = generate(fwd, reqs, o, &full_st);

  std::vector<std::vector<int64_t>> seen(reqs.size());
  o.ends_at = [&](size_t r, const GenerationResult& res) {
    const std::vector<int32_t>& tokens = res.tokens;
    seen[r].push_back(int64_t(tokens.size()));
    EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), full[r].tokens.begin())) << r;
    // 4 is alone in its batch; 2 ends at its last allowed token: a stop, not a length (vLLM's order)
    return (r == 1 && tokens.size() == 3) || (r == 4 && tokens.size() == 1) || (r == 2 && tokens.size() == 7);
  };
  GenerateStats st;
  const std::vector<GenerationResult> cut = generate(fwd, reqs, o, &st);
  for (size_t r = 0; r < reqs.size(); ++r) {
    ASSERT_TRUE(cut[r].finished) << r;
    const size_t n = r == 1 ? 3 : r == 4 ? 1 : full[r].tokens.size();
    EXPECT_EQ(cut[r].tokens, std::vector<int32_t>(full[r].tokens.begin(), full[r].tokens.begin() + n)) << r;
    EXPECT_EQ(cut[r].finish, r == 1 || r == 4 || r == 2 ? FinishReason::kStopped : FinishReason::kLength) << r;
    // asked after every token, the last one a length ends too
    EXPECT_EQ(seen[r].size(), r == 1 ? 3u : r == 4 ? 1u : full[r].tokens.size()) << r;
  }
  EXPECT_STREQ(finish_reason_name(FinishReason::kStopped), "stop");
  EXPECT_EQ(st.decode_steps, full_st.decode_steps - 6);  // request 4's batch stops after its prefill
  EXPECT_EQ(st.generated_tokens, full_st.generated_tokens - 4 - 6);
}

// Every id of GenerateOptions::eos_ids ends a sequence at its first occurrence (finish "eos",
// the id kept as its last token), whichever place it has in the list; ignore_eos ignores them all.
TEST(GenerateEos, AnyOfSeveralIdsEndsASequence) {
  Model m = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  std::vector<GenerationRequest> reqs(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt_ids = {2, int32_t(500 + 7 * i), int32_t(60 + i)};
    reqs[i].max_new_tokens = 8;
    reqs[i].sampling.temperature = 0.9f;
    reqs[i].sampling.seed = 3 + i;
  }
  GenerateOptions o;
  o.batch_size = 3;
  o.ignore_eos = true;
  const std::vector<GenerationResult> full = generate(fwd, reqs, o);
  // Request 0 ends at its 3rd token, request 1 at its 5th (each id's first occurrence in it).
  const int32_t a = full[0].tokens[2], b = full[1].tokens[4];
  auto first = [](const std::vector<int32_t>& t, int32_t id) {
    return size_t(std::find(t.begin(), t.end(), id) - t.begin());
  };
  o.eos_ids = {4095, a, b};  // 4095: an id none of them samples
  for (const GenerationResult& r : full) ASSERT_EQ(first(r.tokens, 4095), r.tokens.size());
  o.ignore_eos = false;
  const std::vector<GenerationResult> cut = generate(fwd, reqs, o);
  for (size_t r = 0; r < reqs.size(); ++r) {
    const size_t n = std::min({first(full[r].tokens, a), first(full[r].tokens, b), full[r].tokens.size() - 1}) + 1;
    EXPECT_EQ(cut[r].tokens, std::vector<int32_t>(full[r].tokens.begin(), full[r].tokens.begin() + n)) << r;
    const bool eos = n < full[r].tokens.size() || cut[r].tokens.back() == a || cut[r].tokens.back() == b;
    EXPECT_EQ(cut[r].finish, eos ? FinishReason::kEos : FinishReason::kLength) << r;
  }
  EXPECT_LE(cut[0].tokens.size(), 3u);
  EXPECT_LE(cut[1].tokens.size(), 5u);
  EXPECT_EQ(cut[0].finish, FinishReason::kEos);
  EXPECT_EQ(cut[1].finish, FinishReason::kEos);
}

}  // namespace
}  // namespace flexh2o
