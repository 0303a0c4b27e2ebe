// Accuracy evaluation through the StepRunner interface, so the KV policy the runner was built
// with holds exactly as in generation: perplexity and lm-eval-harness-style log-likelihood /
// multiple-choice scoring. A runner with a KV policy reads the scored tokens one a step; one
// without (can_step_rows()) scores many rows a step, which gives the same numbers up to rounding.
// Blocking; single-threaded driver (the runner may use threads inside a step). Ids in, numbers out.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/perplexity.h"
#include "engine/runner.h"
#include "engine/sampler.h"

namespace flexh2o {

// Bytes of logits one scoring step may return (rows x sequences x vocab, fp32): scoring needs
// little more memory than generation.
inline constexpr uint64_t kScoringLogitsBytes = uint64_t(64) << 20;
// Rows of logits a sequence a scoring step returns for `sequences` sequences within
// `logits_bytes` (at least 1).
int64_t scoring_rows(int64_t vocab, int64_t sequences, uint64_t logits_bytes = kScoringLogitsBytes);

// Teacher-forced perplexity of ids[1..n] given the prefix, n = ids.size() - 1 (ids = BOS + text).
// begin_batch(1, n). With a KV policy, step 0 is a 1-token prefill of ids[0] at position 0 and
// step t feeds ids[t] at position t (T = 1), so with a policy budget of B tokens the token at
// position t is predicted from at most B cached tokens (itself included), and tokens t < B see
// exactly what the full cache sees. Without one, steps read scoring_rows() tokens each (later
// steps one where !can_rewind()). Each next token is scored with a log-softmax of its row's
// logits, accumulated in double. ids.size() must be in [2, max_positions + 1]; ids must lie
// in the vocabulary. If `token_nll` is non-null it receives the n per-token NLLs (natural log).
// `on_progress(done, n)` (optional) is called after each step. `logits_bytes`: the scoring budget
// (0: one token a step, as with a KV policy). Once `*stop` is set (a stop signal; optional) it
// ends the step under way (StepRunner::stop_steps_on()) and returns over the tokens scored before
// it (PerplexityResult::interrupted).
PerplexityResult streaming_perplexity(StepRunner& runner, std::span<const int32_t> ids,
                                      std::vector<double>* token_nll = nullptr,
                                      const std::function<void(int64_t, int64_t)>& on_progress = {},
                                      uint64_t logits_bytes = kScoringLogitsBytes,
                                      const std::atomic<bool>* stop = nullptr);

// Thrown by loglikelihoods(), loglikelihoods_streamed() and score_tokens() once their `stop`
// flag (optional; a stop signal) is set: they end the step under way (StepRunner::stop_steps_on()),
// their results lost.
struct ScoringStopped : Error {
  ScoringStopped() : Error("scoring stopped") {}
};

// One log-likelihood query: log P(continuation | context). context is non-empty (BOS included
// where the model expects it); continuation is non-empty; together <= max_positions tokens.
struct LoglikRequest {
  std::vector<int32_t> context;
  std::vector<int32_t> continuation;
};
struct LoglikResult {
  double loglik = 0;    // sum over continuation tokens of log p(token | everything before), nats
  int64_t tokens = 0;   // continuation.size()
  bool greedy = false;  // every continuation token was the argmax (lm-eval's is_greedy)
};

// Scores requests in batches of up to runner.max_batch(), longest first, left-padded (pad id 0,
// never attended).
// With a KV policy: the contexts are prefilled in one step, so the policy's budget is set by each
// context's own length and applied over it; then the continuations are teacher-forced one token
// a step (shorter ones ride along, their logits ignored). Without one: a batch (as many requests
// as keep the logits within kScoringLogitsBytes) is one step of context + continuation; a request
// too long for that is scored in steps of scoring_rows() rows. Results in request order. Throws
// flexh2o::Error on empty/too long requests or bad ids.
std::vector<LoglikResult> loglikelihoods(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                         uint64_t logits_bytes = kScoringLogitsBytes,
                                         const std::atomic<bool>* stop = nullptr);

// loglikelihoods() with each request read a token a step from its context's first id: a KV policy
// holds inside the context too, its ratios shares of all the tokens the request reads (context +
// continuation but its last token), as H2O's lm-eval code masks attention. The context's own
// predictions are computed, not summed. With the full cache: loglikelihoods()' numbers.
std::vector<LoglikResult> loglikelihoods_streamed(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                                  const std::atomic<bool>* stop = nullptr);

// Each continuation token's log-probability (the model's own, as token_logprob() gives it) and
// with top > 0 the `top` most likely tokens at its position (top <= kMaxTopLogprobs): what an
// OpenAI completion with "echo" reports for its prompt. Batched and checked as loglikelihoods(),
// but a KV policy's ratios are shares of all the tokens a request reads (context + continuation
// but its last token), so that scoring a sequence from its first token keeps the share
// streaming_perplexity() keeps: the same numbers.
struct ScoredToken {
  float logprob = 0.f;
  std::vector<TokenLogprob> top;
};
std::vector<std::vector<ScoredToken>> score_tokens(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                                   int top, uint64_t logits_bytes = kScoringLogitsBytes,
                                                   const std::atomic<bool>* stop = nullptr);

// Multiple choice (lm-eval-harness "multiple_choice" output type).
struct ChoiceResult {
  std::vector<double> loglik;       // per choice: sum of token log-probabilities (nats)
  std::vector<double> loglik_norm;  // per choice: loglik / number of choice tokens
  std::vector<int64_t> tokens;      // per choice: number of tokens
  std::vector<bool> greedy;         // per choice: lm-eval's is_greedy
  int64_t best = -1;                // argmax of loglik       (acc);      ties -> lowest index
  int64_t best_norm = -1;           // argmax of loglik_norm (acc_norm_token); ties -> lowest index
};

// Scores every choice as a continuation of `context`: the choices run as a batch of sequences
// that share the context (one prefill of the context per batch of runner.max_batch() choices),
// each choice teacher-forced one token per step. The normalisation here is per token; lm-eval's
// acc_norm divides by the choice's characters, which only the caller has (cli eval-choice).
ChoiceResult score_choices(StepRunner& runner, std::span<const int32_t> context,
                           const std::vector<std::vector<int32_t>>& choices);
// The same with a context of each choice's own (one cut to fit the model's positions: lm-eval
// cuts each request's context from the left). Once `*stop` is set (optional) it throws
// ScoringStopped, as loglikelihoods() does.
ChoiceResult score_choices(StepRunner& runner, const std::vector<LoglikRequest>& choices,
                           const std::atomic<bool>* stop = nullptr);
// The same with each choice scored by loglikelihoods_streamed().
ChoiceResult score_choices_streamed(StepRunner& runner, const std::vector<LoglikRequest>& choices,
                                    const std::atomic<bool>* stop = nullptr);

}  // namespace flexh2o
