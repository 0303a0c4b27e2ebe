// Continuous batching (GenerateOptions::continuous): every request's tokens, log-probabilities
// and finish are what static batches give, on the in-memory runner and on the offloading engine
// over placements that can refill (logits bit for bit against the in-memory runner, step by
// step); fewer steps when sequences end early; the runners that cannot refill fall back.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "bible_requests.h"
#include "engine/cpu_device.h"
#include "engine/forwarding_runner.h"
#include "engine/offload_engine.h"
#include "policy_of.h"
#include "runner_compare.h"
#include "test_util.h"

namespace flexh2o {
namespace {
using test::model_dir;

// 14 requests: prompts of 1 to 40 tokens, 0 to 11 new tokens, sampled from their own seeds with
// 2 alternatives' log-probabilities; some end early (their stop at `stop_at`).
std::vector<GenerationRequest> mixed_requests(const ModelConfig& c) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 14; ++i) {
    GenerationRequest r;
    const int len = i % 3 == 0 ? 40 - 2 * i : 1 + 3 * i % 17;
    for (int t = 0; t < len; ++t) r.prompt_ids.push_back(int32_t(4 + (11 * i + 5 * t) % (c.vocab_size - 4)));
    r.max_new_tokens = i == 4 ? 0 : 2 + (5 * i) % 10;
    r.sampling.temperature = i % 4 == 1 ? 0.f : 0.9f;
    r.sampling.seed = 1000 + uint64_t(i);
    r.top_logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}
size_t stop_at(size_t r) { return r % 3 == 2 ? 1 + r % 4 : 1000; }

class CountingRunner final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void step(const int32_t* ids, const int32_t* pos, int64_t T, const int32_t* rr, std::vector<float>& lg) override {
    ++steps;
    ForwardingRunner::step(ids, pos, T, rr, lg);
  }
  int64_t steps = 0;
};

GenerateOptions options(bool continuous, std::vector<size_t>* reported = nullptr) {
  GenerateOptions o;
  o.ignore_eos = true;
  o.continuous = continuous;
  o.ends_at = [](size_t r, const GenerationResult& res) { return res.tokens.size() >= stop_at(r); };
  if (reported) o.on_result = [reported](size_t r, const GenerationResult&) { reported->push_back(r); };
  return o;
}

void expect_same_results(const std::vector<GenerationResult>& got, const std::vector<GenerationResult>& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].finished) << what << " request " << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << " request " << i;
    EXPECT_EQ(got[i].logprobs, want[i].logprobs) << what << " request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << " request " << i;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << what << " request " << i;
    for (size_t k = 0; k < got[i].top_logprobs.size(); ++k)
      for (size_t j = 0; j < got[i].top_logprobs[k].size(); ++j) {
        EXPECT_EQ(got[i].top_logprobs[k][j].id, want[i].top_logprobs[k][j].id) << what << " request " << i;
        EXPECT_EQ(got[i].top_logprobs[k][j].logprob, want[i].top_logprobs[k][j].logprob) << what;
      }
  }
}

TEST(ContinuousBatching, InMemoryResultsEqualStaticBatchesInFewerSteps) {
  for (const char* name : {"tiny-llama", "tiny-opt"}) {
    Model m = Model::load_dir(model_dir(name));
    CpuDevice dev(2);
    Forward fwd(m, dev);
    InMemoryRunner in_memory(fwd, 4);
    CountingRunner runner(in_memory);
    const auto reqs = mixed_requests(m.config());
    GenerateStats st_static, st_cont;
    std::vector<size_t> reported;
    const auto want = generate(runner, reqs, options(false), &st_static);
    const int64_t static_steps = std::exchange(runner.steps, 0);
    const auto got = generate(runner, reqs, options(true, &reported), &st_cont);
    // Every step is a batch's prefill, a refill (both timed as prefill) or a decode step.
    EXPECT_EQ(static_steps, st_static.batches + st_static.decode_steps) << name;
    EXPECT_EQ(runner.steps, st_cont.batches + st_cont.refills + st_cont.decode_steps) << name;
    expect_same_results(got, want, name);
    EXPECT_EQ(reported.size(), reqs.size()) << name;
    EXPECT_EQ(std::set<size_t>(reported.begin(), reported.end()).size(), reqs.size()) << name;
    EXPECT_GT(st_cont.refills, 0) << name;
    EXPECT_EQ(st_cont.refilled_sequences, int64_t(reqs.size()) - 4 - 1) << name;  // all but the first 4 and request 4
    EXPECT_EQ(st_cont.batches, 1) << name;
    EXPECT_EQ(st_cont.generated_tokens, st_static.generated_tokens) << name;
    // Request 4 (no new tokens) joins no batch: its prompt is never computed.
    EXPECT_EQ(st_cont.prompt_tokens, st_static.prompt_tokens - int64_t(reqs[4].prompt_ids.size())) << name;
    EXPECT_LT(st_cont.decode_steps + st_cont.refills, st_static.decode_steps + st_static.batches) << name;
  }
}

TEST(ContinuousBatching, AStopEndsTheRunAndKeepsWhatFinished) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 4);
  const auto reqs = mixed_requests(m.config());
  const auto want = generate(runner, reqs, options(false));
  std::atomic<bool> stop{false};
  size_t n = 0;
  GenerateOptions o = options(true);
  o.on_result = [&](size_t, const GenerationResult&) { stop = ++n >= 7; };
  o.stop = &stop;
  GenerateStats st;
  const auto got = generate(runner, reqs, o, &st);
  EXPECT_TRUE(st.interrupted);
  size_t finished = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].finished) continue;
    ++finished;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
  }
  EXPECT_GE(finished, 7u);
  EXPECT_LT(finished, reqs.size());
}

TEST(ContinuousBatching, RequestsThatArriveWhileItRunsJoinIt) {
  Model m = Model::load_dir(model_dir("tiny-llama"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 4);
  const auto all = mixed_requests(m.config());
  const auto want = generate(runner, all, options(false));
  for (size_t given : {size_t(0), size_t(5)}) {
    // The first `given` requests are the call's; the rest arrive two at a time, each time the
    // driver asks. Those longer than the batch was sized for (at least 30 rows and 42 slots,
    // more if the call's own requests need it) stay with the caller: without any of its own,
    // requests 0 and 3 (prompts of 40 and 34 tokens).
    std::vector<GenerationRequest> first(all.begin(), all.begin() + std::ptrdiff_t(given));
    int64_t rows = 30;
    for (const auto& r : first) rows = std::max<int64_t>(rows, int64_t(r.prompt_ids.size()));
    std::vector<size_t> queue, kept, index;  // arrival order; left with the caller; engine index -> request
    const std::vector<size_t> want_kept = given ? std::vector<size_t>{} : std::vector<size_t>{0, 3};
    for (size_t i = given; i < all.size(); ++i) queue.push_back(i);
    for (size_t i = 0; i < given; ++i) index.push_back(i);
    GenerateOptions o = options(true);
    o.min_rows = 30;
    o.min_capacity = 42;
    o.ends_at = [&](size_t j, const GenerationResult& res) { return res.tokens.size() >= stop_at(index.at(j)); };
    int polls = 0;
    o.more = [&](size_t max_count, int64_t max_prompt, int64_t max_total) {
      ++polls;
      EXPECT_EQ(max_prompt, rows);
      EXPECT_GE(max_total, 42);
      std::vector<GenerationRequest> got;
      while (!queue.empty() && got.size() < std::min<size_t>(max_count, 2)) {
        const size_t r = queue.front();
        queue.erase(queue.begin());
        const int64_t p = int64_t(all[r].prompt_ids.size());
        if (p > max_prompt || p + all[r].max_new_tokens > max_total) {
          kept.push_back(r);
          continue;
        }
        got.push_back(all[r]);
        index.push_back(r);
      }
      return got;
    };
    GenerateStats st;
    const auto got = generate(runner, first, o, &st);
    ASSERT_EQ(got.size(), index.size()) << given;
    EXPECT_EQ(kept, want_kept) << given;
    EXPECT_TRUE(queue.empty());
    EXPECT_GT(polls, 3);
    EXPECT_EQ(got.size(), all.size() - kept.size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_TRUE(got[j].finished) << j;
      EXPECT_EQ(got[j].tokens, want[index[j]].tokens) << "request " << index[j];
      EXPECT_EQ(got[j].logprobs, want[index[j]].logprobs) << "request " << index[j];
    }
    EXPECT_EQ(st.batches, 1) << given;
  }
}

// Records each step's width.
class Widths final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    widths.push_back(T);
    ForwardingRunner::step(ids, positions, T, real_rows, logits);
  }
  std::vector<int64_t> widths;
};

// The prefill is as wide as the batch's own prompts, not as the longest request that may join
// (a server sizes its batch for --max-prompt-len: a prefill that wide cost seconds on 5-token
// prompts); a joining longer prompt's refill step is wider than the prefill, on the offloading
// engine too (its buffers are sized for it at the prefill).
TEST(ContinuousBatching, ThePrefillIsAsWideAsItsPromptsAndRefillsMayBeWider) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of("0 100 0 100 100 0", 2, 1);
  o.offload_dir = dir.path() / "store";
  OffloadEngine eng(model, dev, o);
  Forward fwd(model, dev);
  InMemoryRunner ref(fwd, eng.max_batch());
  std::vector<GenerationRequest> reqs = mixed_requests(model.config());
  std::stable_sort(reqs.begin(), reqs.end(), [](const GenerationRequest& a, const GenerationRequest& b) {
    return a.prompt_ids.size() < b.prompt_ids.size();  // short prompts first, the longest join last
  });
  for (StepRunner* r : {static_cast<StepRunner*>(&eng), static_cast<StepRunner*>(&ref)}) {
    const std::string what = r == &eng ? "offloaded" : "in memory";
    Widths w(*r);
    GenerateOptions opts = options(true);
    opts.ends_at = nullptr;
    opts.min_rows = 48;  // a server's bound, beyond every prompt
    GenerateStats st;
    const auto got = generate(w, reqs, opts, &st);
    GenerateOptions plain = options(false);
    plain.ends_at = nullptr;
    expect_same_results(got, generate(ref, reqs, plain), what);
    ASSERT_FALSE(w.widths.empty()) << what;
    EXPECT_EQ(w.widths[0], int64_t(std::max(reqs[0].prompt_ids.size(), reqs[1].prompt_ids.size()))) << what;
    EXPECT_EQ(*std::max_element(w.widths.begin(), w.widths.end()), int64_t(reqs.back().prompt_ids.size())) << what;
    EXPECT_GT(st.refills, 0) << what;
  }
}

struct Placement {
  const char* model;
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool overlap = true, cpu_attention = false;
  bool refills = true;  // whether the engine can refill under this placement
  bool kv4 = false;     // 4-bit KV: disk pages then split rows, heads and sequences
};

std::ostream& operator<<(std::ostream& os, const Placement& p) {
  return os << p.model << " [" << p.percent << "] " << p.gbs << "x" << p.ngb << (p.overlap ? "" : " no-overlap")
            << (p.cpu_attention ? " cpu-attn" : "") << (p.kv4 ? " kv4" : "");
}

class ContinuousOffload : public ::testing::TestWithParam<Placement> {};

TEST_P(ContinuousOffload, LogitsBitIdenticalToInMemoryAndResultsToStatic) {
  const Placement& c = GetParam();
  std::ostringstream what;
  what << c;
  Model model = Model::load_dir(model_dir(c.model));
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of(c.percent, c.gbs, c.ngb, c.cpu_attention);
  o.policy.overlap = c.overlap;
  o.policy.compress_cache = c.kv4;
  o.offload_dir = dir.path() / "store";
  OffloadEngine eng(model, dev, o);
  Forward fwd(model, dev);
  InMemoryRunner ref(fwd, eng.max_batch(), nullptr, c.kv4 ? DType::Q4 : DType::F16);
  const auto reqs = mixed_requests(model.config());
  test::Recorder got_rec(eng), ref_rec(ref);
  GenerateStats st;
  const auto got = generate(got_rec, reqs, options(true), &st);
  const auto want = generate(ref_rec, reqs, options(c.refills), nullptr);
  test::Run g{got_rec.steps, {}}, w{ref_rec.steps, {}};
  test::expect_same_logits(g, w, what.str());
  expect_same_results(got, generate(ref, reqs, options(false)), what.str());
  EXPECT_EQ(st.refills > 0, c.refills) << what.str();
}

INSTANTIATE_TEST_SUITE_P(
    Placements, ContinuousOffload,
    ::testing::Values(Placement{"tiny-opt", "100 0 100 0 100 0", 2, 2}, Placement{"tiny-opt", "0 100 0 100 100 0", 2, 3},
                      Placement{"tiny-opt", "30 30 34 33 100 0", 3, 2}, Placement{"tiny-opt", "100 0 0 0 100 0", 3, 2},
                      Placement{"tiny-opt", "0 50 0 100 0 100", 2, 2, false},
                      Placement{"tiny-llama", "50 0 34 33 100 0", 2, 3}, Placement{"tiny-llama", "0 0 0 100 0 100", 4, 1},
                      // Host attention over offloaded KV: decode steps there, refills on the device.
                      Placement{"tiny-opt", "100 0 0 100 100 0", 2, 2, true, true},
                      Placement{"tiny-opt", "30 30 34 33 100 0", 3, 2, true, true},
                      Placement{"tiny-opt", "0 50 0 0 0 100", 2, 2, false, true},
                      Placement{"tiny-llama", "50 0 0 50 100 0", 2, 3, true, true},
                      Placement{"tiny-opt", "100 0 100 0 100 0", 2, 2, true, true},
                      Placement{"tiny-opt", "100 0 0 0 100 0", 3, 2, true, false, true, true},
                      Placement{"tiny-opt", "30 30 34 33 100 0", 3, 2, true, true, true, true},
                      Placement{"tiny-llama", "50 0 0 50 100 0", 2, 3, false, false, true, true}));

}  // namespace
}  // namespace flexh2o
