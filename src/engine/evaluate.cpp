// Streaming perplexity and log-likelihood / multiple-choice scoring over a StepRunner.
#include "engine/evaluate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace flexh2o {
namespace {

struct TokenScore {
  double nll = 0;
  bool argmax = false;  // target is the first maximum of the row
};

// -log softmax(row)[target] in double, computed exactly as perplexity() does (so the streaming
// and prefill paths differ only by what the model computes, not by the scoring).
TokenScore score_token(const float* row, int64_t vocab, int32_t target) {
  const float* mx_it = std::max_element(row, row + vocab);
  const float mx = *mx_it;
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v] - mx));
  return {std::log(sum) + mx - row[target], mx_it - row == target};
}

// The most rows, at most `rows`, that a step reading `from` + them may have within the runner's
// memory budgets (StepRunner::check_batch, found by bisection: a step's need grows with its
// rows). Asked after begin_batch(), which removes the last batch's KV files: the disk space is
// then this batch's. Where one row does not fit either, check_batch's refusal is thrown as it is.
int64_t rows_within_budgets(const StepRunner& runner, int64_t from, int64_t rows, int64_t capacity) {
  auto check = [&](int64_t r) {
    const std::array<int64_t, 1> length{from + r};
    runner.check_batch(length, from + r, capacity);
  };
  auto fits = [&](int64_t r) {
    try {
      check(r);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (rows <= 1 || fits(rows)) return std::max<int64_t>(rows, 1);
  check(1);
  int64_t lo = 1, hi = rows;  // !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

// Scores one sequence: logits of the rows of `fed` from `from` on, handed to on_row(j, row) for
// each such row j (it predicts fed[j + 1], or the next token for the last row). With
// can_step_rows(), the first step reads fed[0..from] and on as many rows as the logits budget and
// the runner's memory budgets allow, later steps that many rows each while can_rewind(), else one.
// Without it, one row a step after fed[0..from]. on_step(rows done) after each step: false stops
// there.
void score_sequence(StepRunner& runner, std::span<const int32_t> fed, int64_t from, uint64_t logits_bytes,
                    const std::function<void(int64_t, const float*)>& on_row,
                    const std::function<bool(int64_t)>& on_step) {
  const int64_t V = runner.config().vocab_size, n = int64_t(fed.size());
  runner.begin_batch(1, n);
  const int64_t wanted = std::min(scoring_rows(V, 1, logits_bytes), n - from);
  const int64_t chunk = runner.can_step_rows() ? rows_within_budgets(runner, from, wanted, n) : 1;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[size_t(t)] = int32_t(t);
  std::vector<float> logits;
  int64_t at = 0, next = from;  // fed rows read so far; the next row to score
  while (next < n) {
    const int64_t rows = at == 0 ? std::min(chunk, n - from) : runner.can_rewind() ? std::min(chunk, n - next) : 1;
    const int64_t end = next + rows;  // rows [next, end) scored this step
    runner.step_rows(fed.data() + at, pos.data() + at, end - at, nullptr, rows, logits);
    FH_CHECK(int64_t(logits.size()) >= rows * V, "runner returned ", logits.size(), " logits for ", rows, " rows");
    for (int64_t i = 0; i < rows; ++i) on_row(next + i, logits.data() + i * V);
    at = next = end;
    if (on_step && !on_step(next - from)) return;
  }
}

}  // namespace

int64_t scoring_rows(int64_t vocab, int64_t sequences, uint64_t logits_bytes) {
  const uint64_t row = uint64_t(std::max<int64_t>(vocab, 1)) * 4 * uint64_t(std::max<int64_t>(sequences, 1));
  return std::max<int64_t>(1, int64_t(logits_bytes / row));
}

PerplexityResult streaming_perplexity(StepRunner& runner, std::span<const int32_t> ids,
                                      std::vector<double>* token_nll,
                                      const std::function<void(int64_t, int64_t)>& on_progress,
                                      uint64_t logits_bytes, const std::atomic<bool>* stop) {
  const ModelConfig& c = runner.config();
  const int64_t n = int64_t(ids.size()) - 1;
  if (n < 1) FH_FAIL("perplexity needs at least 2 tokens (BOS + 1), got ", ids.size());
  if (n > c.max_positions)
    FH_FAIL("the text is ", ids.size(), " tokens; scoring it reads ", n, " of them, more than the model's ",
            c.max_positions, " positions");
  check_token_ids(ids, c, "text");
  if (token_nll) token_nll->assign(size_t(n), 0.0);
  double nll = 0;
  int64_t scored = 0;
  StepStopScope stop_steps(runner, stop);
  try {
    score_sequence(
        runner, ids.first(size_t(n)), 0, logits_bytes,
        [&](int64_t t, const float* row) {
          const double l = score_token(row, c.vocab_size, ids[size_t(t + 1)]).nll;
          if (token_nll) (*token_nll)[size_t(t)] = l;
          nll += l;
          ++scored;
        },
        [&](int64_t done) {
          if (on_progress) on_progress(done, n);
          return !(stop && stop->load(std::memory_order_relaxed));
        });
  } catch (const StepStopped&) {  // over the tokens scored before the step that stopped
  }
  return perplexity_of(nll, scored, n);
}

namespace {

// Called with (request in the batch, continuation token, the logits row that predicts it).
using OnToken = std::function<void(size_t, size_t, const float*)>;

void throw_if_stopped(const std::atomic<bool>* stop) {
  if (stop && stop->load(std::memory_order_relaxed)) throw ScoringStopped();
}

// A batch whose contexts are prefilled in one step, then teacher-forced a token a step. A KV
// policy's ratios are shares of each context, or with `whole` of all the tokens the request reads.
void batch_streamed(StepRunner& runner, std::span<const LoglikRequest> req, bool whole, const OnToken& on_token,
                    const std::atomic<bool>* stop) {
  const ModelConfig& c = runner.config();
  const int64_t B = int64_t(req.size());
  int64_t S = 0, L = 0;
  for (const LoglikRequest& r : req) {
    S = std::max<int64_t>(S, int64_t(r.context.size()));
    L = std::max<int64_t>(L, int64_t(r.continuation.size()));
  }
  runner.begin_batch(B, S + L - 1);
  if (whole) {
    std::vector<int64_t> fed;
    for (const LoglikRequest& r : req) fed.push_back(int64_t(r.context.size() + r.continuation.size()) - 1);
    runner.budget_lengths(fed);
  }
  // Prefill: left-padded contexts.
  std::vector<int32_t> ids(size_t(B * S), 0), pos(size_t(B * S), 0), real(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto& ctx = req[size_t(b)].context;
    const int64_t pad = S - int64_t(ctx.size());
    real[size_t(b)] = int32_t(ctx.size());
    for (size_t t = 0; t < ctx.size(); ++t) {
      ids[size_t(b * S + pad) + t] = ctx[t];
      pos[size_t(b * S + pad) + t] = int32_t(t);
    }
  }
  std::vector<float> logits;
  runner.step(ids.data(), pos.data(), S, real.data(), logits);
  for (int64_t b = 0; b < B; ++b) on_token(size_t(b), 0, logits.data() + b * c.vocab_size);
  // Teacher forcing: step i feeds continuation token i-1 and scores token i.
  std::vector<int32_t> next(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
  for (int64_t i = 1; i < L; ++i) {
    throw_if_stopped(stop);
    for (int64_t b = 0; b < B; ++b) {
      const auto& r = req[size_t(b)];
      const int64_t j = std::min<int64_t>(i - 1, int64_t(r.continuation.size()) - 1);  // rides along when done
      next[size_t(b)] = r.continuation[size_t(j)];
      next_pos[size_t(b)] = int32_t(std::min<int64_t>(int64_t(r.context.size()) + i - 1, c.max_positions - 1));
    }
    runner.step(next.data(), next_pos.data(), 1, nullptr, logits);
    for (int64_t b = 0; b < B; ++b)
      if (i < int64_t(req[size_t(b)].continuation.size())) on_token(size_t(b), size_t(i), logits.data() + b * c.vocab_size);
  }
}

// A batch scored in one step: each request's context and continuation but its last token,
// left-padded to a common end, and the logits of the last `L` rows (L the longest continuation).
void batch_rows(StepRunner& runner, std::span<const LoglikRequest> req, const OnToken& on_token) {
  const int64_t V = runner.config().vocab_size, B = int64_t(req.size());
  int64_t S = 0, L = 0;
  for (const LoglikRequest& r : req) {
    S = std::max<int64_t>(S, int64_t(r.context.size() + r.continuation.size()) - 1);
    L = std::max<int64_t>(L, int64_t(r.continuation.size()));
  }
  runner.begin_batch(B, S);
  std::vector<int32_t> ids(size_t(B * S), 0), pos(size_t(B * S), 0), real(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const LoglikRequest& r = req[size_t(b)];
    const int64_t f = int64_t(r.context.size() + r.continuation.size()) - 1, pad = S - f;
    real[size_t(b)] = int32_t(f);
    for (int64_t t = 0; t < f; ++t) {
      const size_t ct = r.context.size();
      ids[size_t(b * S + pad + t)] = size_t(t) < ct ? r.context[size_t(t)] : r.continuation[size_t(t) - ct];
      pos[size_t(b * S + pad + t)] = int32_t(t);
    }
  }
  std::vector<float> logits;
  runner.step_rows(ids.data(), pos.data(), S, real.data(), L, logits);
  FH_CHECK(int64_t(logits.size()) >= L * B * V, "runner returned ", logits.size(), " logits for ", L, " rows");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t l = int64_t(req[size_t(b)].continuation.size());
    for (int64_t i = 0; i < l; ++i)  // the row before continuation token i: block L - l + i
      on_token(size_t(b), size_t(i), logits.data() + ((L - l + i) * B + b) * V);
  }
}

void check_requests(const ModelConfig& c, const std::vector<LoglikRequest>& requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const LoglikRequest& r = requests[i];
    if (r.context.empty()) FH_FAIL("request ", i, ": empty context (give at least BOS)");
    if (r.continuation.empty()) FH_FAIL("request ", i, ": empty continuation");
    const int64_t fed = int64_t(r.context.size() + r.continuation.size()) - 1;
    if (fed > c.max_positions)
      FH_FAIL("request ", i, ": context + continuation is ", fed + 1, " tokens; the model reads at most ",
              c.max_positions, " positions");
    check_token_ids(r.context, c, "context");
    check_token_ids(r.continuation, c, "continuation");
  }
}

// Runs every continuation token of `requests` (checked) past on_token(request, token, row), in
// batches longest first (so that a batch pads little; lm-eval-harness orders its requests so too).
// `whole`: see batch_streamed.
void score_batches(StepRunner& runner, const std::vector<LoglikRequest>& requests, uint64_t logits_bytes, bool whole,
                   const OnToken& on_token, const std::atomic<bool>* stop) {
  const ModelConfig& c = runner.config();
  const int64_t max_batch = runner.max_batch();
  FH_CHECK(max_batch > 0, "runner batch size must be positive, got ", max_batch);
  check_requests(c, requests);
  std::vector<size_t> order(requests.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto fed = [&](size_t i) { return requests[i].context.size() + requests[i].continuation.size(); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return fed(a) > fed(b); });
  const bool rows = runner.can_step_rows();
  std::vector<LoglikRequest> batch;
  for (size_t first = 0; first < order.size();) {
    throw_if_stopped(stop);
    // A batch: up to max_batch requests whose continuations' logits fit the scoring budget.
    size_t end = first + 1;
    int64_t L = int64_t(requests[order[first]].continuation.size());
    while (end < order.size() && int64_t(end - first) < max_batch) {
      const int64_t l = std::max<int64_t>(L, int64_t(requests[order[end]].continuation.size()));
      if (rows && l > scoring_rows(c.vocab_size, int64_t(end - first) + 1, logits_bytes)) break;
      L = l, ++end;
    }
    batch.clear();
    for (size_t k = first; k < end; ++k) batch.push_back(requests[order[k]]);
    const OnToken in_batch = [&](size_t b, size_t i, const float* row) { on_token(order[first + b], i, row); };
    if (!rows) {
      batch_streamed(runner, batch, whole, in_batch, stop);
    } else if (L <= scoring_rows(c.vocab_size, int64_t(batch.size()), logits_bytes)) {
      batch_rows(runner, batch, in_batch);
    } else {  // one request whose continuation's logits exceed the budget: in chunks
      const LoglikRequest& r = batch[0];
      std::vector<int32_t> ids(r.context);
      ids.insert(ids.end(), r.continuation.begin(), r.continuation.end() - 1);
      const int64_t from = int64_t(r.context.size()) - 1;
      score_sequence(
          runner, ids, from, logits_bytes,
          [&](int64_t j, const float* row) { in_batch(0, size_t(j - from), row); },
          [&](int64_t) { return throw_if_stopped(stop), true; });
    }
    first = end;
  }
}

// score_batches, whose steps a stop also ends midway (a long batch's prefill).
void score_requests(StepRunner& runner, const std::vector<LoglikRequest>& requests, uint64_t logits_bytes, bool whole,
                    const OnToken& on_token, const std::atomic<bool>* stop) {
  StepStopScope stop_steps(runner, stop);
  try {
    score_batches(runner, requests, logits_bytes, whole, on_token, stop);
  } catch (const StepStopped&) {
    throw ScoringStopped();
  }
}

}  // namespace

std::vector<LoglikResult> loglikelihoods(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                         uint64_t logits_bytes, const std::atomic<bool>* stop) {
  const int64_t V = runner.config().vocab_size;
  std::vector<LoglikResult> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].tokens = int64_t(requests[i].continuation.size());
    out[i].greedy = true;
  }
  score_requests(runner, requests, logits_bytes, /*whole=*/false, [&](size_t r, size_t i, const float* row) {
    const TokenScore s = score_token(row, V, requests[r].continuation[i]);
    out[r].loglik -= s.nll;
    out[r].greedy = out[r].greedy && s.argmax;
  }, stop);
  return out;
}

std::vector<std::vector<ScoredToken>> score_tokens(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                                   int top, uint64_t logits_bytes, const std::atomic<bool>* stop) {
  FH_CHECK(top >= 0 && top <= kMaxTopLogprobs, "top alternatives must be in [0, ", kMaxTopLogprobs, "], got ", top);
  const int64_t V = runner.config().vocab_size;
  std::vector<std::vector<ScoredToken>> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out[i].resize(requests[i].continuation.size());
  score_requests(runner, requests, logits_bytes, /*whole=*/true, [&](size_t r, size_t i, const float* row) {
    ScoredToken& t = out[r][i];
    t.logprob = token_logprob(row, V, requests[r].continuation[i], top, &t.top);
  }, stop);
  return out;
}

ChoiceResult score_choices(StepRunner& runner, std::span<const int32_t> context,
                           const std::vector<std::vector<int32_t>>& choices) {
  std::vector<LoglikRequest> reqs;
  reqs.reserve(choices.size());
  for (const auto& ch : choices) reqs.push_back({{context.begin(), context.end()}, ch});
  return score_choices(runner, reqs);
}

namespace {

// The choices' result from their log-likelihoods.
ChoiceResult choice_result(const std::vector<LoglikResult>& ll) {
  ChoiceResult r;
  for (size_t i = 0; i < ll.size(); ++i) {
    r.loglik.push_back(ll[i].loglik);
    r.loglik_norm.push_back(ll[i].loglik / double(ll[i].tokens));
    r.tokens.push_back(ll[i].tokens);
    r.greedy.push_back(ll[i].greedy);
  }
  // Strict '>' keeps the lowest index on ties (numpy argmax, as lm-eval-harness).
  auto argmax = [](const std::vector<double>& v) {
    int64_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i] > v[size_t(best)]) best = int64_t(i);
    return best;
  };
  r.best = argmax(r.loglik);
  r.best_norm = argmax(r.loglik_norm);
  return r;
}

}  // namespace

ChoiceResult score_choices(StepRunner& runner, const std::vector<LoglikRequest>& reqs,
                           const std::atomic<bool>* stop) {
  if (reqs.empty()) FH_FAIL("multiple choice needs at least one choice");
  return choice_result(loglikelihoods(runner, reqs, kScoringLogitsBytes, stop));
}

std::vector<LoglikResult> loglikelihoods_streamed(StepRunner& runner, const std::vector<LoglikRequest>& requests,
                                                  const std::atomic<bool>* stop) {
  // No KV policy: nothing to hold inside the context, so the context's rows need no logits.
  if (runner.can_step_rows()) return loglikelihoods(runner, requests, kScoringLogitsBytes, stop);
  // Each request from its first id, the rest of its context then teacher-forced with the
  // continuation; the context's own predictions are not summed.
  std::vector<LoglikRequest> fed;
  std::vector<LoglikResult> out(requests.size());
  for (size_t k = 0; k < requests.size(); ++k) {
    const LoglikRequest& r = requests[k];
    if (r.context.empty()) FH_FAIL("request ", k, ": empty context (give at least BOS)");
    if (r.continuation.empty()) FH_FAIL("request ", k, ": empty continuation");
    LoglikRequest w{{r.context.front()}, {r.context.begin() + 1, r.context.end()}};
    w.continuation.insert(w.continuation.end(), r.continuation.begin(), r.continuation.end());
    fed.push_back(std::move(w));
    out[k].tokens = int64_t(r.continuation.size());
    out[k].greedy = true;
  }
  const int64_t V = runner.config().vocab_size;
  score_requests(runner, fed, kScoringLogitsBytes, /*whole=*/true, [&](size_t k, size_t i, const float* row) {
    if (i + 1 < requests[k].context.size()) return;  // a context token
    const TokenScore s = score_token(row, V, fed[k].continuation[i]);
    out[k].loglik -= s.nll;
    out[k].greedy = out[k].greedy && s.argmax;
  }, stop);
  return out;
}

ChoiceResult score_choices_streamed(StepRunner& runner, const std::vector<LoglikRequest>& reqs,
                                    const std::atomic<bool>* stop) {
  if (reqs.empty()) FH_FAIL("multiple choice needs at least one choice");
  return choice_result(loglikelihoods_streamed(runner, reqs, stop));
}

}  // namespace flexh2o
