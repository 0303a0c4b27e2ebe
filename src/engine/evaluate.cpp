// Streaming perplexity and log-likelihood / multiple-choice scoring over a StepRunner.
#include "engine/evaluate.h"

#include <algorithm>
#include <cmath>

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

void check_ids(std::span<const int32_t> ids, const ModelConfig& c, const char* what) {
  for (int32_t id : ids)
    if (id < 0 || id >= c.vocab_size)
      FH_FAIL(what, " token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")");
}

}  // namespace

PerplexityResult streaming_perplexity(StepRunner& runner, std::span<const int32_t> ids,
                                      std::vector<double>* token_nll,
                                      const std::function<void(int64_t, int64_t)>& on_progress) {
  const ModelConfig& c = runner.config();
  const int64_t n = int64_t(ids.size()) - 1;
  if (n < 1) FH_FAIL("perplexity needs at least 2 tokens (BOS + 1), got ", ids.size());
  if (n > c.max_positions)
    FH_FAIL("text is ", n, " tokens, more than the model's ", c.max_positions, " positions");
  check_ids(ids, c, "text");
  if (token_nll) token_nll->assign(size_t(n), 0.0);
  runner.begin_batch(1, n);
  std::vector<float> logits;
  double nll = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t pos = int32_t(t);
    runner.step(ids.data() + t, &pos, 1, nullptr, logits);
    FH_CHECK(int64_t(logits.size()) >= c.vocab_size, "runner returned ", logits.size(), " logits");
    const double l = score_token(logits.data(), c.vocab_size, ids[size_t(t + 1)]).nll;
    if (token_nll) (*token_nll)[size_t(t)] = l;
    nll += l;
    if (on_progress) on_progress(t + 1, n);
  }
  PerplexityResult r;
  r.tokens = n;
  r.mean_nll = nll / double(n);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

std::vector<LoglikResult> loglikelihoods(StepRunner& runner, const std::vector<LoglikRequest>& requests) {
  const ModelConfig& c = runner.config();
  const int64_t max_batch = runner.max_batch();
  FH_CHECK(max_batch > 0, "runner batch size must be positive, got ", max_batch);
  for (size_t i = 0; i < requests.size(); ++i) {
    const LoglikRequest& r = requests[i];
    if (r.context.empty()) FH_FAIL("request ", i, ": empty context (give at least BOS)");
    if (r.continuation.empty()) FH_FAIL("request ", i, ": empty continuation");
    const int64_t fed = int64_t(r.context.size() + r.continuation.size()) - 1;
    if (fed > c.max_positions)
      FH_FAIL("request ", i, ": context + continuation is ", fed + 1, " tokens; the model reads at most ",
              c.max_positions, " positions");
    check_ids(r.context, c, "context");
    check_ids(r.continuation, c, "continuation");
  }
  std::vector<LoglikResult> out(requests.size());
  std::vector<float> logits;
  for (size_t first = 0; first < requests.size(); first += size_t(max_batch)) {
    const int64_t B = std::min<int64_t>(max_batch, int64_t(requests.size() - first));
    auto req = [&](int64_t b) -> const LoglikRequest& { return requests[first + size_t(b)]; };
    int64_t S = 0, L = 0;
    for (int64_t b = 0; b < B; ++b) {
      S = std::max<int64_t>(S, int64_t(req(b).context.size()));
      L = std::max<int64_t>(L, int64_t(req(b).continuation.size()));
    }
    runner.begin_batch(B, S + L - 1);
    // Prefill: left-padded contexts.
    std::vector<int32_t> ids(size_t(B * S), 0), pos(size_t(B * S), 0), real(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const auto& ctx = req(b).context;
      const int64_t pad = S - int64_t(ctx.size());
      real[size_t(b)] = int32_t(ctx.size());
      for (size_t t = 0; t < ctx.size(); ++t) {
        ids[size_t(b * S + pad) + t] = ctx[t];
        pos[size_t(b * S + pad) + t] = int32_t(t);
      }
    }
    runner.step(ids.data(), pos.data(), S, real.data(), logits);
    auto score = [&](int64_t b, int64_t i) {  // logits row b predicts continuation token i
      const auto& cont = req(b).continuation;
      TokenScore s = score_token(logits.data() + b * c.vocab_size, c.vocab_size, cont[size_t(i)]);
      LoglikResult& r = out[first + size_t(b)];
      r.loglik -= s.nll;
      r.greedy = r.greedy && s.argmax;
    };
    for (int64_t b = 0; b < B; ++b) {
      LoglikResult& r = out[first + size_t(b)];
      r.tokens = int64_t(req(b).continuation.size());
      r.greedy = true;
      score(b, 0);
    }
    // Teacher forcing: step i feeds continuation token i-1 and scores token i.
    std::vector<int32_t> next(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
    for (int64_t i = 1; i < L; ++i) {
      for (int64_t b = 0; b < B; ++b) {
        const auto& cont = req(b).continuation;
        const int64_t j = std::min<int64_t>(i - 1, int64_t(cont.size()) - 1);  // rides along when done
        next[size_t(b)] = cont[size_t(j)];
        next_pos[size_t(b)] =
            int32_t(std::min<int64_t>(int64_t(req(b).context.size()) + i - 1, c.max_positions - 1));
      }
      runner.step(next.data(), next_pos.data(), 1, nullptr, logits);
      for (int64_t b = 0; b < B; ++b)
        if (i < int64_t(req(b).continuation.size())) score(b, i);
    }
  }
  return out;
}

ChoiceResult score_choices(StepRunner& runner, std::span<const int32_t> context,
                           const std::vector<std::vector<int32_t>>& choices) {
  if (choices.empty()) FH_FAIL("multiple choice needs at least one choice");
  std::vector<LoglikRequest> reqs;
  reqs.reserve(choices.size());
  for (const auto& ch : choices) reqs.push_back({{context.begin(), context.end()}, ch});
  std::vector<LoglikResult> ll = loglikelihoods(runner, reqs);
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

}  // namespace flexh2o
