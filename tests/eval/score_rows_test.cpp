// Scoring many rows a step (StepRunner::step_rows): perplexity and log-likelihoods read in
// steps of several rows give the numbers that one token a step gives, on the in-memory runner
// and on the offloading engine over placements (micro-batches, host and disk KV, host
// attention, which reads one row a step after the first), in fewer steps; chunks follow the
// logits budget; the rows cost host memory only; a runner with a KV policy keeps one token a step,
// and scoring a whole sequence under its ratios keeps their share of the sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "../engine/policy_of.h"
#include "../engine/test_util.h"
#include "core/error.h"
#include "engine/evaluate.h"
#include "engine/forwarding_runner.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "policies/kv_policy.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;

// Forwards to a runner, counting steps; `rewind` false hides can_rewind() (as a KV policy does).
class Counting final : public ForwardingRunner {
 public:
  explicit Counting(StepRunner& r, bool rewind = true) : ForwardingRunner(r), rewind_(rewind) {}
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    step_rows(ids, positions, T, real_rows, 1, logits);
  }
  bool can_rewind() const override { return rewind_ && ForwardingRunner::can_rewind(); }
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override {
    inner().step_rows(ids, positions, T, real_rows, rows, logits);
    ++steps;
    max_rows = std::max(max_rows, rows);
  }
  int64_t steps = 0, max_rows = 0;

 private:
  bool rewind_;
};

std::unique_ptr<KvPolicy> full_policy() {  // the full cache as a policy object: one token a step
  KvPolicyConfig c;
  c.kind = KvPolicyKind::kFull;
  return make_policy(c);
}

// The first n + 1 token ids of the model's held-out text (BOS first).
const std::vector<int32_t>& text(const std::string& name) {
  static std::map<std::string, std::vector<int32_t>> cache;
  std::vector<int32_t>& ids = cache[name];
  if (ids.empty()) {
    const auto dir = model_dir(name);
    ids = Tokenizer::load(dir).encode(test::read_text(dir / "reference/eval.txt"), true);
  }
  return ids;
}
std::vector<int32_t> text_ids(const std::string& name, size_t n) {
  const std::vector<int32_t>& ids = text(name);
  EXPECT_GE(ids.size(), n + 1);
  return {ids.begin(), ids.begin() + std::ptrdiff_t(n + 1)};
}

void expect_near(double got, double want, const std::string& what) {
  ASSERT_TRUE(std::isfinite(got)) << what;
  EXPECT_NEAR(got, want, 1e-9 + 1e-6 * std::abs(want)) << what;
}

// 13 requests from the held-out text: contexts of 1..57 tokens, continuations of 1..40 (awkward
// lengths, so the batches pad on the left and ride along differently).
std::vector<LoglikRequest> requests(const std::string& name) {
  const std::vector<int32_t>& ids = text(name);
  std::vector<LoglikRequest> reqs;
  for (int i = 0; i < 13; ++i) {
    const size_t at = size_t(29 * i), ctx = size_t(1 + (i * 19) % 57), cont = i == 5 ? 40 : size_t(1 + (i * 7) % 23);
    reqs.push_back({{ids.begin() + std::ptrdiff_t(at), ids.begin() + std::ptrdiff_t(at + ctx)},
                    {ids.begin() + std::ptrdiff_t(at + ctx), ids.begin() + std::ptrdiff_t(at + ctx + cont)}});
  }
  return reqs;
}

void expect_same(const std::vector<LoglikResult>& got, const std::vector<LoglikResult>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    expect_near(got[i].loglik, want[i].loglik, what + " request " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << " request " << i;
    EXPECT_EQ(got[i].greedy, want[i].greedy) << what << " request " << i;
  }
}

class ScoreRows : public ::testing::TestWithParam<std::string> {};

TEST_P(ScoreRows, PerplexityInRowsEqualsOneTokenAStep) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  CpuDevice dev(2);
  Forward fwd(m, dev);
  const int64_t n = 301;
  const std::vector<int32_t> ids = text_ids(GetParam(), size_t(n));
  const auto full = full_policy();
  InMemoryRunner one(fwd, 1, full.get());
  Counting one_c(one);
  std::vector<double> want;
  const PerplexityResult w = streaming_perplexity(one_c, ids, &want);
  EXPECT_EQ(one_c.steps, n);
  EXPECT_EQ(one_c.max_rows, 1);
  struct Case {
    uint64_t bytes;
    bool rewind;
    int64_t steps;
  };
  const uint64_t row = uint64_t(c.vocab_size) * 4;
  for (const Case& k : {Case{kScoringLogitsBytes, true, 1}, Case{50 * row, true, 7}, Case{50 * row + 3, true, 7},
                        Case{50 * row, false, 1 + n - 50}, Case{row - 1, true, n}}) {
    InMemoryRunner rows(fwd, 1);
    Counting rc(rows, k.rewind);
    std::vector<double> got;
    int64_t last_done = 0, calls = 0;
    const PerplexityResult g = streaming_perplexity(rc, ids, &got, [&](int64_t d, int64_t total) {
      EXPECT_GT(d, last_done);
      EXPECT_EQ(total, n);
      last_done = d, ++calls;
    }, k.bytes);
    const std::string what = GetParam() + " budget " + std::to_string(k.bytes) + (k.rewind ? "" : " no rewind");
    EXPECT_EQ(rc.steps, k.steps) << what;
    EXPECT_EQ(calls, k.steps) << what;
    EXPECT_EQ(last_done, n) << what;
    EXPECT_EQ(g.tokens, n) << what;
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t t = 0; t < got.size(); ++t) expect_near(got[t], want[t], what + " token " + std::to_string(t));
    expect_near(g.perplexity, w.perplexity, what);
  }
}

TEST_P(ScoreRows, LoglikelihoodsInRowsEqualTeacherForcing) {
  Model m = Model::load_dir(model_dir(GetParam()));
  const ModelConfig& c = m.config();
  CpuDevice dev(2);
  Forward fwd(m, dev);
  const auto reqs = requests(GetParam());
  const auto full = full_policy();
  InMemoryRunner one(fwd, 5, full.get());
  const auto want = loglikelihoods(one, reqs);
  const uint64_t row = uint64_t(c.vocab_size) * 4;
  // One step a batch of 5; batches cut to 40 rows of logits; continuations over 16 rows alone,
  // in steps of 16 rows (with and without steps of many rows after the first).
  struct Case {
    uint64_t bytes;
    bool rewind;
  };
  for (const Case& k : {Case{kScoringLogitsBytes, true}, Case{40 * row, true}, Case{16 * row, true},
                        Case{16 * row, false}, Case{row, true}}) {
    InMemoryRunner rows(fwd, 5);
    Counting rc(rows, k.rewind);
    const auto got = loglikelihoods(rc, reqs, k.bytes);
    const std::string what = GetParam() + " budget " + std::to_string(k.bytes / row) + " rows";
    expect_same(got, want, what);
    EXPECT_LE(rc.max_rows, std::max<int64_t>(1, int64_t(k.bytes / row))) << what;
    if (k.bytes == kScoringLogitsBytes) {
      EXPECT_EQ(rc.steps, 3) << what;  // 13 requests, 5 a batch
    }
  }
}

// Per-token scores (what "echo" reports for a prompt): a generation's own log-probabilities and
// alternatives for the tokens it chose, rows or one token a step, and they sum to loglikelihoods().
TEST_P(ScoreRows, TokenScoresAreTheGenerationsLogprobs) {
  Model m = Model::load_dir(model_dir(GetParam()));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 3);
  const auto full = full_policy();
  InMemoryRunner one(fwd, 3, full.get());
  std::vector<GenerationRequest> gen;
  for (size_t i = 0; i < 4; ++i) {
    GenerationRequest g;
    g.prompt_ids = text_ids(GetParam(), 5 + 9 * i);
    g.max_new_tokens = 6 + int64_t(i);
    g.sampling.temperature = 0.8f;
    g.sampling.seed = 7 + i;
    g.top_logprobs = 3;
    gen.push_back(std::move(g));
  }
  GenerateOptions go;
  go.ignore_eos = true;
  const auto res = generate(runner, gen, go);
  std::vector<LoglikRequest> reqs;
  for (size_t i = 0; i < gen.size(); ++i) reqs.push_back({gen[i].prompt_ids, res[i].tokens});
  const auto lls = loglikelihoods(runner, reqs);
  for (StepRunner* r : {static_cast<StepRunner*>(&runner), static_cast<StepRunner*>(&one)}) {
    const auto got = score_tokens(*r, reqs, 3);
    ASSERT_EQ(got.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].size(), res[i].tokens.size());
      double sum = 0;
      for (size_t t = 0; t < got[i].size(); ++t) {
        const std::string what = GetParam() + " request " + std::to_string(i) + " token " + std::to_string(t);
        expect_near(got[i][t].logprob, res[i].logprobs[t], what);
        ASSERT_EQ(got[i][t].top.size(), 3u) << what;
        for (size_t k = 0; k < 3; ++k) {
          EXPECT_EQ(got[i][t].top[k].id, res[i].top_logprobs[t][k].id) << what;
          expect_near(got[i][t].top[k].logprob, res[i].top_logprobs[t][k].logprob, what);
        }
        sum += got[i][t].logprob;
      }
      EXPECT_NEAR(sum, lls[i].loglik, 1e-4 * std::abs(lls[i].loglik)) << GetParam() << " request " << i;
    }
  }
  EXPECT_THROW(score_tokens(runner, reqs, kMaxTopLogprobs + 1), Error);
}

// A runner with a KV policy reads one token a step, and refuses more.
TEST_P(ScoreRows, AKvPolicyKeepsOneTokenAStep) {
  Model m = Model::load_dir(model_dir(GetParam()));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_budget = 8;
  h2o.recent_budget = 8;
  const auto p = make_policy(h2o);
  InMemoryRunner runner(fwd, 2, p.get());
  EXPECT_FALSE(runner.can_step_rows());
  Counting rc(runner);
  const std::vector<int32_t> ids = text_ids(GetParam(), 40);
  streaming_perplexity(rc, ids);
  EXPECT_EQ(rc.steps, 40);
  EXPECT_EQ(rc.max_rows, 1);
  runner.begin_batch(1, 8);
  std::vector<float> logits;
  const int32_t pos[2] = {0, 1};
  EXPECT_THROW(runner.step_rows(ids.data(), pos, 2, nullptr, 2, logits), Error);
}

// Scoring whole sequences from their first token (score_tokens: an echoed prompt, LLM.score)
// under H2O ratios keeps the ratio's share of each sequence, as streaming_perplexity with the
// budgets of that share does, not of the one-token prefill: sequences of different lengths in
// one batch, in memory and offloaded. budget_lengths() is checked.
TEST_P(ScoreRows, RatioBudgetsAreSharesOfTheWholeSequence) {
  Model m = Model::load_dir(model_dir(GetParam()));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  KvPolicyConfig ratio;
  ratio.kind = KvPolicyKind::kH2o;
  ratio.heavy_ratio = 0.1;
  ratio.recent_ratio = 0.15;
  const auto rp = make_policy(ratio);
  InMemoryRunner mem(fwd, 3, rp.get());
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of("0 100 0 100 100 0", 2, 2);
  o.offload_dir = dir.path() / "store";
  o.kv_policy = rp.get();
  OffloadEngine eng(m, dev, o);
  std::vector<LoglikRequest> reqs;
  for (const size_t n : {150, 61, 97}) {
    const std::vector<int32_t> ids = text_ids(GetParam(), n);
    reqs.push_back({{ids.front()}, {ids.begin() + 1, ids.end()}});
  }
  for (StepRunner* r : {static_cast<StepRunner*>(&mem), static_cast<StepRunner*>(&eng)}) {
    const auto got = score_tokens(*r, reqs, 0);
    ASSERT_EQ(got.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      const int64_t n = int64_t(reqs[i].continuation.size());
      const KvBudget b = rp->budget(n);
      ASSERT_GE(b.heavy, 6) << "a share too small to tell from one token's";
      KvPolicyConfig fixed;
      fixed.kind = KvPolicyKind::kH2o;
      fixed.heavy_budget = b.heavy;
      fixed.recent_budget = b.recent;
      const auto fp = make_policy(fixed);
      InMemoryRunner one(fwd, 1, fp.get());
      std::vector<int32_t> ids = reqs[i].context;
      ids.insert(ids.end(), reqs[i].continuation.begin(), reqs[i].continuation.end());
      std::vector<double> want;
      streaming_perplexity(one, ids, &want);
      ASSERT_EQ(got[i].size(), want.size());
      for (size_t t = 0; t < want.size(); ++t)
        expect_near(-double(got[i][t].logprob), want[t],
                    GetParam() + (r == &eng ? " offloaded" : " in memory") + " sequence " + std::to_string(i) +
                        " token " + std::to_string(t));
    }
  }
  for (StepRunner* r : {static_cast<StepRunner*>(&mem), static_cast<StepRunner*>(&eng)}) {
    r->begin_batch(2, 8);
    EXPECT_THROW(r->budget_lengths(std::vector<int64_t>{5}), Error);     // one length for two sequences
    EXPECT_THROW(r->budget_lengths(std::vector<int64_t>{5, 0}), Error);  // below 1
    std::vector<float> logits;
    const int32_t ids[2] = {1, 2}, pos[2] = {0, 0};
    r->step(ids, pos, 1, nullptr, logits);
    EXPECT_THROW(r->budget_lengths(std::vector<int64_t>{5, 5}), Error);  // after the first step
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ScoreRows, ::testing::Values("tiny-opt", "tiny-llama"));

// A CPU device that counts the head's calls and the rows they compute.
class CountingHeads final : public CpuDevice {
 public:
  using CpuDevice::CpuDevice;
  void head(const ModelConfig& c, const ModelWeights& w, const StepRows& r, const void* hidden, int64_t first,
            int64_t rows, float* logits) override {
    ++calls;
    max_rows = std::max(max_rows, rows);
    CpuDevice::head(c, w, r, hidden, first, rows, logits);
  }
  int64_t calls = 0, max_rows = 0;
};

// The rows of a scoring step cost host memory, and on the device a logits slot of up to
// kHeadLogitsBytes so that one head call (one pass over the lm_head) computes many rows. A device
// budget with room for it scores 40 rows a step in one call a micro-batch; one the size of the
// generation plan still scores them, through the generation slot (2 rows a call here: the block's
// 4 rows / micro-batches of 2). A slot of 3 rows a call leaves a last call of 1, and 3 requests a
// last micro-batch of 1 sequence. Each gives the one-token-a-step scores.
TEST(ScoreRowsMemory, ManyRowsAHeadCallWhereTheDeviceHasRoom) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  const ModelConfig& c = model.config();
  const uint64_t V = uint64_t(c.vocab_size);
  CpuDevice dev(2);
  OffloadOptions o;
  o.policy = test::policy_of("20 80 50 50 100 0", 2, 2);
  BatchDims d;
  d.rows = d.capacity = 60;
  const MemoryPlan gen = offload_memory_plan(model, dev, o, d);
  d.logit_rows = 40;
  const MemoryPlan score = offload_memory_plan(model, dev, o, d);
  o.head_logits_bytes = 0;
  const MemoryPlan narrow = offload_memory_plan(model, dev, o, d);
  o.head_logits_bytes = kHeadLogitsBytes;
  ASSERT_EQ(gen.head_rows, 1);
  ASSERT_EQ(score.head_rows, 40);  // 40 x 2 x 4096 x 4 bytes: within kHeadLogitsBytes
  EXPECT_EQ(narrow.head_rows, 2);
  EXPECT_EQ(score.bytes[0], gen.bytes[0] + (40 * 2 - 4) * V * 4);
  EXPECT_EQ(narrow.bytes[0], gen.bytes[0]);
  for (const MemoryPlan* p : {&score, &narrow}) EXPECT_EQ(p->bytes[1], gen.bytes[1] + 39 * 4 * V * 4);
  EXPECT_EQ(head_rows_per_call(4096, 2, 40, uint64_t(5) * 2 * 4096 * 4 + 7), 5);
  EXPECT_EQ(head_rows_per_call(4096, 2, 3, kHeadLogitsBytes), 3);
  EXPECT_EQ(head_rows_per_call(50272, 8, 512, 100), 1);
  const std::vector<int32_t>& ids = text("tiny-opt");
  std::vector<LoglikRequest> reqs;
  for (size_t i = 0; i < 4; ++i)
    reqs.push_back({{ids.begin() + std::ptrdiff_t(i * 61), ids.begin() + std::ptrdiff_t(i * 61 + 21)},
                    {ids.begin() + std::ptrdiff_t(i * 61 + 21), ids.begin() + std::ptrdiff_t(i * 61 + 61)}});
  Forward fwd(model, dev);
  const auto full = full_policy();
  InMemoryRunner one(fwd, 4, full.get());
  const auto want = loglikelihoods(one, reqs);
  for (const MemoryPlan* p : {&score, &narrow}) {
    const bool roomy = p == &score;
    SCOPED_TRACE(roomy ? "device budget with room for 40 rows" : "the generation plan's device budget");
    o.device_mem = p->bytes[0];
    o.host_mem = p->bytes[1];
    CountingHeads heads(2);
    OffloadEngine eng(model, heads, o);
    Counting ec(eng);
    const auto got = loglikelihoods(ec, reqs);
    EXPECT_EQ(ec.steps, 1);
    EXPECT_EQ(ec.max_rows, 40);
    EXPECT_EQ(heads.max_rows, roomy ? 40 : 2);
    EXPECT_EQ(heads.calls, roomy ? 2 : 40);  // two micro-batches
    expect_same(got, want, roomy ? "40 rows a head call" : "2 rows a head call");
    EXPECT_LE(eng.report().peak[0], p->bytes[0]);
  }
  o.device_mem = o.host_mem = 0;
  o.head_logits_bytes = 3 * 2 * V * 4;
  const std::vector<LoglikRequest> three(reqs.begin(), reqs.begin() + 3);
  CountingHeads heads(2);
  OffloadEngine eng(model, heads, o);
  expect_same(loglikelihoods(eng, three), loglikelihoods(one, three), "3 rows a head call, micro-batches of 2 and 1");
  EXPECT_EQ(heads.max_rows, 3);
  EXPECT_EQ(heads.calls, 2 * 14);
}

// Every architecture's own features in a scoring step of many rows (sliding windows and the
// full cache's window cap, alternating layers, soft-capping, MoE routing, rope scalings): the
// per-token scores one token a step gives, in memory and (Gemma 2: the window cap, which reads
// one row a step after the first) offloaded.
class ScoreRowsArch : public ::testing::TestWithParam<std::string> {};

TEST_P(ScoreRowsArch, PerplexityAndLoglikelihoodsEqualOneTokenAStep) {
  Model m = Model::load_dir(model_dir("arch/" + GetParam()));
  const ModelConfig& c = m.config();
  CpuDevice dev(2);
  Forward fwd(m, dev);
  const int64_t n = std::min<int64_t>(100, c.max_positions - 1);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i <= n; ++i) ids.push_back(int32_t(3 + (i * 37 + i * i) % (c.vocab_size - 3)));
  std::vector<LoglikRequest> reqs;  // contexts of 2..2+n/3 tokens, continuations of 1..1+n/5
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t ctx = 2 + i * n / 12, cont = 1 + i * n / 20;
    reqs.push_back({{ids.begin() + i, ids.begin() + i + ctx}, {ids.begin() + i + ctx, ids.begin() + i + ctx + cont}});
  }
  // The reference: the same runner reading one token a step (a logits budget of 0). Under a full
  // cache's window cap the two compact the cache at other steps, so attention sums the same keys
  // in another order: rounding (1e-4 at most here), where one key too many or too few moves a
  // score by 1e-2 and more.
  InMemoryRunner one(fwd, 3);
  std::vector<double> want;
  streaming_perplexity(one, ids, &want, {}, 0);
  const auto want_ll = loglikelihoods(one, reqs, 0);
  const uint64_t row = uint64_t(c.vocab_size) * 4;
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of("0 100 0 100 100 0", 3, 1);
  o.offload_dir = dir.path() / "store";
  OffloadEngine eng(m, dev, o);
  InMemoryRunner rows(fwd, 3);
  for (StepRunner* r : {static_cast<StepRunner*>(&rows), static_cast<StepRunner*>(&eng)}) {
    const std::string what = GetParam() + (r == &eng ? " offloaded" : " in memory");
    ASSERT_TRUE(r->can_step_rows()) << what;
    Counting rc(*r);
    std::vector<double> got;
    streaming_perplexity(rc, ids, &got, {}, 30 * row);  // chunks of 30 rows
    EXPECT_LT(rc.steps, n) << what;
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t t = 0; t < got.size(); ++t) {
      ASSERT_TRUE(std::isfinite(got[t])) << what << " token " << t;
      EXPECT_NEAR(got[t], want[t], 1e-3) << what << " token " << t;
    }
    const auto got_ll = loglikelihoods(*r, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_NEAR(got_ll[i].loglik, want_ll[i].loglik, 1e-3 * double(got_ll[i].tokens)) << what << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, ScoreRowsArch,
                         ::testing::Values("mistral", "gemma2", "gemma3_text_linear", "phi3", "qwen2_window",
                                           "llama_longrope", "mixtral", "qwen2_moe"));

struct Placement {
  const char* model;
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool cpu_attention = false;
};

std::ostream& operator<<(std::ostream& os, const Placement& p) {
  return os << p.model << " [" << p.percent << "] " << p.gbs << "x" << p.ngb << (p.cpu_attention ? " cpu-attn" : "");
}

class ScoreRowsOffload : public ::testing::TestWithParam<Placement> {};

// The offloading engine's rows (micro-batches laid out per row) against the in-memory runner
// one token a step.
TEST_P(ScoreRowsOffload, EqualsInMemoryOneTokenAStep) {
  const Placement& pl = GetParam();
  std::ostringstream what;
  what << pl;
  Model m = Model::load_dir(model_dir(pl.model));
  const ModelConfig& c = m.config();
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = test::policy_of(pl.percent, pl.gbs, pl.ngb, pl.cpu_attention);
  o.offload_dir = dir.path() / "store";
  OffloadEngine eng(m, dev, o);
  ASSERT_TRUE(eng.can_step_rows()) << what.str();
  Forward fwd(m, dev);
  const auto full = full_policy();
  InMemoryRunner one(fwd, eng.max_batch(), full.get());
  const auto reqs = requests(pl.model);
  const uint64_t row = uint64_t(c.vocab_size) * 4;
  const auto want_ll = loglikelihoods(one, reqs);
  // Whole batches in a step (every micro-batch), and batches cut to 24 rows of logits.
  for (const uint64_t bytes : {kScoringLogitsBytes, 24 * row}) {
    Counting ec(eng);
    expect_same(loglikelihoods(ec, reqs, bytes), want_ll, what.str() + " budget " + std::to_string(bytes / row));
    EXPECT_GT(ec.max_rows, 1) << what.str();
  }
  const int64_t n = 150;
  const std::vector<int32_t> ids = text_ids(pl.model, size_t(n));
  std::vector<double> got, want;
  Counting pc(eng);
  streaming_perplexity(pc, ids, &got, {}, 40 * row);
  streaming_perplexity(one, ids, &want);
  EXPECT_EQ(pc.steps, 4) << what.str();  // 40 rows a step after the first (can_rewind())
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) expect_near(got[t], want[t], what.str() + " token " + std::to_string(t));
}

INSTANTIATE_TEST_SUITE_P(
    Placements, ScoreRowsOffload,
    ::testing::Values(Placement{"tiny-opt", "100 0 100 0 100 0", 2, 3}, Placement{"tiny-opt", "0 100 0 100 100 0", 2, 3},
                      Placement{"tiny-opt", "30 30 34 33 100 0", 3, 2}, Placement{"tiny-opt", "0 50 0 100 0 100", 2, 2},
                      Placement{"tiny-llama", "50 0 34 33 100 0", 2, 3}, Placement{"tiny-llama", "0 0 0 100 0 100", 4, 1},
                      // Host attention over offloaded KV: a step of many rows attends on the
                      // device, as the prefill does.
                      Placement{"tiny-opt", "100 0 0 100 100 0", 2, 2, true},
                      Placement{"tiny-llama", "0 100 0 50 0 100", 2, 2, true},
                      Placement{"tiny-opt", "100 0 100 0 100 0", 2, 2, true}));

}  // namespace
}  // namespace flexh2o
