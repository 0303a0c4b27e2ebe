// What GenerateStats' seconds hold: the model's steps only. Time the caller's callbacks take
// (writing and syncing an output file in on_result, progress in on_progress) is output_seconds,
// outside prefill_seconds and decode_seconds (FlexGen's timer holds only the model's steps).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/generate.h"
#include "test_util.h"

namespace flexh2o {
namespace {

TEST(GenerateTiming, CallbacksAreOutsideTheStepSeconds) {
  Model m = Model::load_dir(test::model_dir("tiny-opt"));
  CpuDevice dev(1);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 2);
  std::vector<GenerationRequest> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt_ids = {2, int32_t(10 + i), 31, 7};
    reqs[i].max_new_tokens = 3;
  }
  constexpr auto kSlow = std::chrono::milliseconds(150);
  for (const bool continuous : {false, true})
    for (const bool in_progress : {false, true}) {
      GenerateOptions o;
      o.ignore_eos = true;
      o.continuous = continuous;
      int calls = 0;
      if (in_progress)
        o.on_progress = [&](int64_t, int64_t) { ++calls, std::this_thread::sleep_for(kSlow); };
      else
        o.on_result = [&](size_t, const GenerationResult&) { ++calls, std::this_thread::sleep_for(kSlow); };
      GenerateStats st;
      const auto t0 = std::chrono::steady_clock::now();
      (void)generate(runner, reqs, o, &st);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double slept = calls * std::chrono::duration<double>(kSlow).count();
      const std::string what =
          std::string(continuous ? "continuous" : "static") + (in_progress ? " progress" : " result");
      ASSERT_GE(calls, 4) << what;
      EXPECT_GE(st.output_seconds, slept) << what;
      EXPECT_LE(st.output_seconds, wall) << what;
      // The model's steps are what is left of the wall time.
      EXPECT_LE(st.prefill_seconds + st.decode_seconds, wall - slept) << what;
      EXPECT_GE(st.prefill_seconds, 0) << what;
      EXPECT_GE(st.decode_seconds, 0) << what;
    }
}

}  // namespace
}  // namespace flexh2o
