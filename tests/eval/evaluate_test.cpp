// engine/evaluate.h on the tiny models: streaming perplexity (full = prefill = HF reference;
// a policy whose budget covers the text is bit-identical to full; a small budget changes
// exactly the tokens past the budget), choice scoring (left padding, batching, agreement
// with streaming perplexity, streamed choices), 4-bit compression's perplexity bound, and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "../engine/test_util.h"
#include "core/error.h"
#include "engine/compress.h"
#include "engine/evaluate.h"
#include "policies/kv_policy.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;
using test::read_json;

// One loaded model per name for the whole binary (weights are mmapped; cheap to keep).
struct Loaded {
  Model model;
  Tokenizer tok;
  nlohmann::json ref;
  std::vector<int32_t> ids;  // BOS + the first ref["num_tokens"] tokens of eval.txt
};
Loaded& loaded(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto dir = model_dir(name);
    slot.reset(new Loaded{Model::load_dir(dir), Tokenizer::load(dir), read_json(dir / "reference/perplexity_full.json"), {}});
    auto toks = slot->tok.encode(test::read_text(dir / "reference/eval.txt"), false);
    slot->ids.push_back(slot->ref["bos_token_id"].get<int32_t>());
    const int64_t n = slot->ref["num_tokens"].get<int64_t>();
    slot->ids.insert(slot->ids.end(), toks.begin(), toks.begin() + n);
  }
  return *slot;
}

CpuDevice& dev() {
  static CpuDevice d(2);
  return d;
}

KvPolicyConfig cfg(KvPolicyKind k, std::optional<int64_t> heavy, std::optional<int64_t> recent,
                   std::optional<int64_t> sinks = std::nullopt) {
  KvPolicyConfig c;
  c.kind = k;
  c.heavy_budget = heavy;
  c.recent_budget = recent;
  c.sink_tokens = sinks;
  c.seed = 7;
  return c;
}

class Eval : public ::testing::TestWithParam<std::string> {
 protected:
  Loaded& m() { return loaded(GetParam()); }
  // Streaming perplexity of the first `n` scored tokens under `policy` (null = full).
  // `w`: the weights as held (CompressedWeights), null = the model's.
  PerplexityResult stream(const KvPolicy* policy, int64_t n, std::vector<double>* nll = nullptr,
                          DType kv = DType::F16, const ModelWeights* w = nullptr) {
    Forward fwd(m().model, dev());
    fwd.use_weights(w);
    InMemoryRunner runner(fwd, 1, policy, kv);
    return streaming_perplexity(runner, std::span(m().ids).first(size_t(n + 1)), nll);
  }
};

// The KV cache in f16 (the default) costs next to nothing in accuracy: perplexity over the
// held-out text within 0.2% of an fp32 cache, with the full cache and with H2O (whose decisions
// read the same scores), yet it is not the same computation. bf16 (8-bit mantissa) within 1%.
TEST_P(Eval, HalfPrecisionKvPerplexityWithinAFifthOfAPercentOfF32) {
  const int64_t n = int64_t(m().ids.size()) - 1;
  const auto h2o = make_policy(cfg(KvPolicyKind::kH2o, 51, 51));
  for (const KvPolicy* p : std::vector<const KvPolicy*>{nullptr, h2o.get()}) {
    const double f32 = stream(p, n, nullptr, DType::F32).perplexity;
    for (DType dt : {DType::F16, DType::BF16}) {
      const double half = stream(p, n, nullptr, dt).perplexity;
      std::printf("[%s] %s perplexity: f32 KV %.6f, %s KV %.6f (%+.4f%%)\n", GetParam().c_str(), p ? "h2o 51+51" : "full",
                  f32, std::string(dtype_name(dt)).c_str(), half, 100 * (half - f32) / f32);
      EXPECT_NEAR(half, f32, (dt == DType::F16 ? 0.002 : 0.01) * f32) << dtype_name(dt);  // bf16: 8-bit mantissa
      if (dt == DType::F16) {
        EXPECT_NE(half, f32);
      }
    }
  }
}

// 4-bit compression (FlexGen's groups of 64, min and scale per group) of the weights (W4), the
// KV cache (KV4) and both: perplexity over the held-out text stays finite and within kQ4Bound of
// the f16 run, with the full cache and with H2O 20% (README "Accuracy with compression"). A
// broken kernel (codes or groups misread, a scale lost) sends the tiny models' perplexity to the
// hundreds or thousands; the measured costs are under 1% (printed).
TEST_P(Eval, CompressedPerplexityWithinBoundOfF16) {
  constexpr double kQ4Bound = 0.03;  // measured: at most +0.6% (README)
  const int64_t n = int64_t(m().ids.size()) - 1;
  const int64_t budget = n / 5;
  const auto h2o = make_policy(cfg(KvPolicyKind::kH2o, budget / 2, budget - budget / 2));
  const CompressedWeights w4(m().model);
  for (const KvPolicy* p : std::vector<const KvPolicy*>{nullptr, h2o.get()}) {
    const double f16 = stream(p, n).perplexity;
    struct Mode { const char* name; DType kv; const ModelWeights* w; };
    for (const Mode& mode : {Mode{"W4", DType::F16, &w4.weights()}, Mode{"KV4", DType::Q4, nullptr},
                             Mode{"W4+KV4", DType::Q4, &w4.weights()}}) {
      const double q = stream(p, n, nullptr, mode.kv, mode.w).perplexity;
      std::printf("[%s] %s perplexity: f16 %.4f, %s %.4f (%+.2f%%)\n", GetParam().c_str(), p ? "h2o 20%" : "full", f16,
                  mode.name, q, 100 * (q - f16) / f16);
      ASSERT_TRUE(std::isfinite(q)) << mode.name;
      EXPECT_NEAR(q, f16, kQ4Bound * f16) << mode.name;
      EXPECT_NE(q, f16) << mode.name << ": compression changed nothing";
    }
  }
}

// A text token past the model's table (another model's --tokenizer) is named, not an embedding
// kernel's bound check.
TEST_P(Eval, ATokenOutsideTheVocabularyIsNamed) {
  Forward fwd(m().model, dev());
  std::vector<int32_t> ids = m().ids;
  const int32_t vocab = int32_t(m().model.config().vocab_size);
  ids[3] = vocab;
  try {
    (void)perplexity(fwd, ids);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "text token id " + std::to_string(vocab) + " is outside the vocabulary [0, " +
                                         std::to_string(vocab) + ")");
  }
}

TEST_P(Eval, StreamingFullEqualsPrefillAndReference) {
  Forward fwd(m().model, dev());
  const PerplexityResult pre = perplexity(fwd, m().ids);
  const PerplexityResult st = stream(nullptr, int64_t(m().ids.size()) - 1);
  const double want = m().ref["perplexity"].get<double>();
  std::printf("[%s] perplexity: streaming %.6f prefill %.6f reference %.6f\n", GetParam().c_str(), st.perplexity,
              pre.perplexity, want);
  EXPECT_EQ(st.tokens, m().ref["num_tokens"].get<int64_t>());
  EXPECT_EQ(st.tokens, pre.tokens);
  EXPECT_NEAR(st.perplexity, pre.perplexity, 1e-4 * pre.perplexity);
  EXPECT_NEAR(st.perplexity, want, 0.005 * want);
  EXPECT_NEAR(pre.perplexity, want, 0.005 * want);
}

// A policy whose budget covers the whole text never evicts: bit-identical to the full cache,
// token by token, for every policy kind (including full given as a policy object).
TEST_P(Eval, BudgetCoveringTheTextIsExactlyFull) {
  const int64_t n = 384;
  std::vector<double> full_nll;
  const PerplexityResult full = stream(nullptr, n, &full_nll);
  for (const KvPolicyConfig& c :
       {cfg(KvPolicyKind::kFull, std::nullopt, std::nullopt), cfg(KvPolicyKind::kH2o, n, n),
        cfg(KvPolicyKind::kH2o, n / 2, n / 2), cfg(KvPolicyKind::kLocal, std::nullopt, n),
        cfg(KvPolicyKind::kSinks, std::nullopt, n - 4, 4), cfg(KvPolicyKind::kRandom, n / 2, n / 2)}) {
    auto policy = make_policy(c);
    std::vector<double> nll;
    const PerplexityResult r = stream(policy.get(), n, &nll);
    EXPECT_EQ(r.perplexity, full.perplexity) << describe(c);
    EXPECT_EQ(nll, full_nll) << describe(c);
  }
}

// The budget contract: with B = heavy + recent (+ sinks), the tokens at positions < B are
// predicted from the same cache as full (bit-identical), and from position B on the cache is
// capped, so the prediction at position B already differs and perplexity changes.
// Needs the engine to apply the policy (the "KV eviction" commit).
TEST_P(Eval, SmallBudgetEvictsExactlyPastTheBudget) {
  const int64_t n = 384, B = 64;
  std::vector<double> full_nll;
  const PerplexityResult full = stream(nullptr, n, &full_nll);
  for (const KvPolicyConfig& c :
       {cfg(KvPolicyKind::kH2o, B / 2, B / 2), cfg(KvPolicyKind::kLocal, std::nullopt, B),
        cfg(KvPolicyKind::kSinks, std::nullopt, B - 4, 4), cfg(KvPolicyKind::kRandom, B / 2, B / 2),
        cfg(KvPolicyKind::kH2o, B - 1, 1)}) {
    auto policy = make_policy(c);
    std::vector<double> nll;
    const PerplexityResult r = stream(policy.get(), n, &nll);
    std::printf("[%s] %s: perplexity %.4f (full %.4f)\n", GetParam().c_str(), describe(c).c_str(), r.perplexity,
                full.perplexity);
    for (int64_t t = 0; t < B; ++t) ASSERT_EQ(nll[size_t(t)], full_nll[size_t(t)]) << describe(c) << " position " << t;
    // Position B (the token fed at step B) is the first that attends to a capped cache.
    EXPECT_NE(nll[size_t(B)], full_nll[size_t(B)]) << describe(c);
    EXPECT_GT(std::abs(r.perplexity - full.perplexity), 1e-6 * full.perplexity) << describe(c);
  }
}

// Local attention keeps the last B tokens; as the budget grows its perplexity approaches full.
TEST_P(Eval, LocalBudgetOneTokenIsUnigramLike) {
  // With B = 1 every token sees only itself: perplexity is much worse than full.
  const int64_t n = 256;
  const PerplexityResult full = stream(nullptr, n);
  auto policy = make_policy(cfg(KvPolicyKind::kLocal, std::nullopt, 1));
  const PerplexityResult one = stream(policy.get(), n);
  std::printf("[%s] local B=1 perplexity %.3f (full %.3f)\n", GetParam().c_str(), one.perplexity, full.perplexity);
  EXPECT_GT(one.perplexity, 1.5 * full.perplexity);
}

// Continuation log-likelihood equals the streaming perplexity's per-token NLLs over
// context + continuation (the same numbers reached through prefill + teacher forcing).
TEST_P(Eval, LoglikelihoodAgreesWithStreamingPerplexity) {
  const auto& ids = m().ids;
  const size_t ctx = 40, len = 12;
  std::vector<double> nll;
  stream(nullptr, int64_t(ctx + len) - 1, &nll);
  double want = 0;
  for (size_t i = ctx - 1; i < ctx + len - 1; ++i) want -= nll[i];
  Forward fwd(m().model, dev());
  InMemoryRunner runner(fwd, 2);
  LoglikRequest r{{ids.begin(), ids.begin() + ctx}, {ids.begin() + ctx, ids.begin() + ctx + len}};
  auto out = loglikelihoods(runner, {r});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens, int64_t(len));
  EXPECT_NEAR(out[0].loglik, want, 1e-4 * std::abs(want));
}

// Choice scores do not depend on left padding, batch composition or batch size, with the full
// cache and with H2O active over the context (budgets are per sequence, from its own length).
TEST_P(Eval, PaddedAndUnpaddedPromptsGiveTheSameChoiceScores) {
  const auto& ids = m().ids;
  const std::vector<int32_t> context(ids.begin(), ids.begin() + 30);
  std::vector<std::vector<int32_t>> choices;
  for (size_t start : {30u, 100u, 200u, 300u}) {  // lengths 5, 1, 3, 7: short ones ride along
    static const size_t lens[] = {5, 1, 3, 7};
    const size_t L = lens[choices.size()];
    choices.emplace_back(ids.begin() + start, ids.begin() + start + L);
  }
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_ratio = 0.25;
  h2o.recent_ratio = 0.25;
  const std::unique_ptr<KvPolicy> h2o_policy = make_policy(h2o);
  for (const KvPolicy* policy : std::vector<const KvPolicy*>{nullptr, h2o_policy.get()}) {
    Forward fwd(m().model, dev());
    InMemoryRunner batched(fwd, 4, policy);
    const ChoiceResult base = score_choices(batched, context, choices);
    // One choice per batch (no ride-along).
    InMemoryRunner single(fwd, 1, policy);
    const ChoiceResult one = score_choices(single, context, choices);
    // Batched with a request whose context is 23 tokens longer, so ours is left-padded.
    std::vector<LoglikRequest> reqs{{std::vector<int32_t>(ids.begin() + 400, ids.begin() + 453), {ids[453]}}};
    for (const auto& ch : choices) reqs.push_back({context, ch});
    InMemoryRunner wide(fwd, 5, policy);
    const auto padded = loglikelihoods(wide, reqs);
    for (size_t i = 0; i < choices.size(); ++i) {
      const double tol = 1e-5 * std::max(1.0, std::abs(base.loglik[i]));
      EXPECT_NEAR(one.loglik[i], base.loglik[i], tol) << i << (policy ? " h2o" : " full");
      EXPECT_NEAR(padded[i + 1].loglik, base.loglik[i], tol) << i << (policy ? " h2o" : " full");
      EXPECT_EQ(base.tokens[i], int64_t(choices[i].size()));
      EXPECT_DOUBLE_EQ(base.loglik_norm[i], base.loglik[i] / double(choices[i].size()));
      EXPECT_LT(base.loglik[i], 0.0);
    }
  }
}

// Streamed choices are streaming perplexity's tokens: each choice's sequence read a token a step
// from its first id, under budgets that are the ratios' shares of all the tokens it reads (a
// different budget for each choice length), batched; only the choice's predictions summed.
TEST_P(Eval, StreamedChoicesAreStreamingPerplexitysTokens) {
  const auto& ids = m().ids;
  const std::vector<int32_t> context(ids.begin(), ids.begin() + 40);
  std::vector<std::vector<int32_t>> choices;
  for (auto [start, len] : {std::pair<size_t, size_t>{40, 6}, {100, 1}, {200, 3}, {300, 11}})
    choices.emplace_back(ids.begin() + std::ptrdiff_t(start), ids.begin() + std::ptrdiff_t(start + len));
  std::vector<LoglikRequest> reqs;
  for (const auto& ch : choices) reqs.push_back({context, ch});
  for (const KvPolicyKind kind : {KvPolicyKind::kH2o, KvPolicyKind::kLocal}) {
    KvPolicyConfig ratios;
    ratios.kind = kind;
    ratios.recent_ratio = 0.2;
    if (kind == KvPolicyKind::kH2o) ratios.heavy_ratio = 0.2;
    const std::unique_ptr<KvPolicy> policy = make_policy(ratios);
    Forward fwd(m().model, dev());
    InMemoryRunner batched(fwd, 4, policy.get(), DType::F32);
    const ChoiceResult streamed = score_choices_streamed(batched, reqs);
    InMemoryRunner prefill_runner(fwd, 4, policy.get(), DType::F32);
    const ChoiceResult prefilled = score_choices(prefill_runner, reqs);
    bool differs = false;
    for (size_t k = 0; k < choices.size(); ++k) {
      std::vector<int32_t> seq(context);
      seq.insert(seq.end(), choices[k].begin(), choices[k].end());
      const int64_t n = int64_t(seq.size()) - 1;  // the tokens the sequence reads
      const auto budget = [&](double r) { return std::max<int64_t>(1, int64_t(r * double(n))); };
      KvPolicyConfig absolute = cfg(kind, kind == KvPolicyKind::kH2o ? std::optional(budget(0.2)) : std::nullopt,
                                    budget(0.2));
      const std::unique_ptr<KvPolicy> one_policy = make_policy(absolute);
      InMemoryRunner one(fwd, 1, one_policy.get(), DType::F32);
      std::vector<double> nll;
      streaming_perplexity(one, seq, &nll, {}, 0);
      double want = 0;
      for (size_t t = context.size() - 1; t < nll.size(); ++t) want -= nll[t];
      EXPECT_NEAR(streamed.loglik[k], want, 1e-5 * std::abs(want)) << k << " " << make_policy(ratios)->name();
      EXPECT_EQ(streamed.tokens[k], int64_t(choices[k].size()));
      differs = differs || std::abs(streamed.loglik[k] - prefilled.loglik[k]) > 1e-3;
    }
    EXPECT_TRUE(differs) << "the budget inside the context changes some choice's score";
  }
  // The full cache: the same numbers as prefilled choices.
  Forward fwd(m().model, dev());
  InMemoryRunner full(fwd, 4);
  const ChoiceResult a = score_choices_streamed(full, reqs), b = score_choices(full, reqs);
  for (size_t k = 0; k < choices.size(); ++k)
    EXPECT_NEAR(a.loglik[k], b.loglik[k], 1e-6 * std::abs(b.loglik[k])) << k;
}

INSTANTIATE_TEST_SUITE_P(TinyModels, Eval, ::testing::Values("tiny-opt", "tiny-llama"));

TEST(EvalChoice, TiesGoToTheLowestIndexAndGreedyIsReported) {
  Loaded& m = loaded("tiny-opt");
  Forward fwd(m.model, dev());
  InMemoryRunner runner(fwd, 3);
  const std::vector<int32_t> context(m.ids.begin(), m.ids.begin() + 10);
  const std::vector<int32_t> same{m.ids[10], m.ids[11]};
  ChoiceResult r = score_choices(runner, context, {{m.ids[20]}, same, same});
  EXPECT_EQ(r.loglik[1], r.loglik[2]);
  EXPECT_NE(r.best, 2);  // a tie between 1 and 2 never picks 2
  EXPECT_NE(r.best_norm, 2);
  // Greedy: the argmax continuation is greedy by definition.
  std::vector<float> logits;
  runner.begin_batch(1, int64_t(context.size()));
  std::vector<int32_t> pos(context.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  runner.step(context.data(), pos.data(), int64_t(context.size()), nullptr, logits);
  const int32_t top = int32_t(std::max_element(logits.begin(), logits.begin() + m.model.config().vocab_size) -
                              logits.begin());
  r = score_choices(runner, context, {{top}, {top == 5 ? 6 : 5}});
  EXPECT_TRUE(r.greedy[0]);
  EXPECT_FALSE(r.greedy[1]);
  EXPECT_EQ(r.best, 0);
  EXPECT_EQ(r.best_norm, 0);
}

TEST(EvalErrors, BadInputsThrow) {
  Loaded& m = loaded("tiny-opt");
  Forward fwd(m.model, dev());
  InMemoryRunner runner(fwd, 2);
  const std::vector<int32_t> one{2};
  EXPECT_THROW(streaming_perplexity(runner, one), Error);
  const std::vector<int32_t> bad{2, 99999};
  EXPECT_THROW(streaming_perplexity(runner, bad), Error);
  std::vector<int32_t> too_long(size_t(m.model.config().max_positions) + 2, 5);
  EXPECT_THROW(streaming_perplexity(runner, too_long), Error);
  EXPECT_THROW(loglikelihoods(runner, {{{}, {5}}}), Error);
  EXPECT_THROW(loglikelihoods(runner, {{{2}, {}}}), Error);
  EXPECT_THROW(loglikelihoods(runner, {{{2}, {-1}}}), Error);
  EXPECT_THROW(score_choices(runner, one, {}), Error);
  too_long.resize(size_t(m.model.config().max_positions));
  EXPECT_THROW(loglikelihoods(runner, {{too_long, {5, 6}}}), Error);
  EXPECT_NO_THROW(loglikelihoods(runner, {{too_long, {5}}}));
}

}  // namespace
}  // namespace flexh2o
