// The generation driver's stop flag: set from a result callback (as a signal thread would set
// it), the run ends at the next token-step boundary, finished requests keep exactly the tokens
// of an uninterrupted run, and the rest are marked unfinished.
#include <gtest/gtest.h>

#include <atomic>

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

}  // namespace
}  // namespace flexh2o
