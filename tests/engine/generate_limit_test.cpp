// Generation at the model's last position: a sequence grows to max_positions + 1 tokens (the
// last one drawn from the token fed at position max_positions - 1, as transformers draws it),
// and every runner stops there alike: the in-memory runner, static and continuous, and the
// offloading engine with KV on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu_device.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "test_util.h"

namespace flexh2o {
namespace {

// Prompts of P tokens for each P in `lengths`, each asking for `max_new` tokens greedily.
std::vector<GenerationRequest> requests(const ModelConfig& c, std::initializer_list<int64_t> lengths,
                                        int64_t max_new) {
  std::vector<GenerationRequest> reqs;
  int i = 0;
  for (int64_t len : lengths) {
    GenerationRequest r;
    for (int64_t t = 0; t < len; ++t) r.prompt_ids.push_back(int32_t(4 + (7 * t + 13 * i) % (c.vocab_size - 4)));
    r.max_new_tokens = max_new;
    r.sampling.temperature = 0.f;
    reqs.push_back(std::move(r));
    ++i;
  }
  return reqs;
}

GenerateOptions greedy(int64_t batch, bool continuous = false) {
  GenerateOptions o;
  o.batch_size = batch;
  o.ignore_eos = true;
  o.continuous = continuous;
  return o;
}

// The argmax of the last row of one prefill over `ids` (at positions 0..n-1): an independent
// path to the token the decode steps drew last.
int32_t prefill_argmax(Forward& fwd, const std::vector<int32_t>& ids) {
  const ModelConfig& c = fwd.model().config();
  const int64_t n = int64_t(ids.size());
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t);
  KvCache cache(c, 1, n);
  std::vector<float> logits;
  fwd.step(ids.data(), pos.data(), n, nullptr, cache, LogitsRows::kLast, logits);
  EXPECT_EQ(int64_t(logits.size()), c.vocab_size);
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TEST(GenerateLimit, TheTokenAfterTheLastPositionIsDrawnAndNoMore) {
  for (const char* name : {"tiny-opt", "tiny-llama"}) {  // learned positions (OPT's offset of 2) and rotary
    Model m = Model::load_dir(test::model_dir(name));
    const ModelConfig& c = m.config();
    ASSERT_EQ(c.max_positions, 1024) << name;
    CpuDevice dev(2);
    Forward fwd(m, dev);
    InMemoryRunner runner(fwd, 4);
    // 1020 + 5 = 1025 tokens; a full-length prompt draws one; one short of it draws two.
    const auto reqs = requests(c, {1020, 1024, 1023, 7}, 10);
    const auto got = generate(runner, reqs, greedy(4));
    ASSERT_EQ(got.size(), reqs.size());
    const size_t want_n[] = {5, 1, 2, 10};
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens.size(), want_n[i]) << name << " request " << i;
      EXPECT_EQ(got[i].finish, FinishReason::kLength) << name << " request " << i;
    }
    // Each sequence's last token is the prefill argmax of everything before it, the prefill
    // reaching position 1023 with the prompt at its full length.
    for (size_t i : {size_t(0), size_t(1), size_t(2)}) {
      std::vector<int32_t> ids = reqs[i].prompt_ids;
      ids.insert(ids.end(), got[i].tokens.begin(), got[i].tokens.end() - 1);
      ASSERT_EQ(int64_t(ids.size()), c.max_positions) << name << " request " << i;
      EXPECT_EQ(prefill_argmax(fwd, ids), got[i].tokens.back()) << name << " request " << i;
    }

    const auto cont = generate(runner, reqs, greedy(2, true));
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(cont[i].tokens, got[i].tokens) << name << " continuous " << i;

    OffloadOptions o;
    o.policy = test::policy_of("0 100 0 100 100 0", 2, 2);
    OffloadEngine eng(m, dev, o);
    const auto off = generate(eng, reqs, greedy(eng.max_batch()));
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(off[i].tokens, got[i].tokens) << name << " offloaded " << i;
  }
}

}  // namespace
}  // namespace flexh2o
