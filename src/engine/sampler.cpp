// Penalties, then greedy or temperature / top-k / top-p / min-p sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace flexh2o {
namespace {

int32_t argmax(const float* logits, int64_t vocab) {  // the first maximum
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature))
    FH_FAIL("temperature must be >= 0, got ", p.temperature);
  if (p.top_k < 0) FH_FAIL("top_k must be >= 0, got ", p.top_k);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) FH_FAIL("top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) FH_FAIL("min_p must be in [0, 1], got ", p.min_p);
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty))
    FH_FAIL("repetition_penalty must be > 0 (1 = off), got ", p.repetition_penalty);
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f))
    FH_FAIL("presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f))
    FH_FAIL("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

const float* Sampler::penalize(const float* logits, int64_t vocab, const TokenHistory& h) {
  if (!p_.penalized()) return logits;
  for (std::span<const int32_t> part : {h.prompt, h.generated})  // before anything is marked
    for (int32_t id : part)
      if (id < 0 || id >= vocab)
        FH_FAIL("sampler: token id ", id, " of the history is outside the vocabulary [0, ", vocab, ")");
  scratch_.assign(logits, logits + vocab);
  if (p_.repetition_penalty != 1.f) {
    // From the unpenalized logit each time, so a repeated token is penalized once.
    const float r = p_.repetition_penalty;
    for (std::span<const int32_t> part : {h.prompt, h.generated})
      for (int32_t id : part) {
        const float x = logits[id];
        scratch_[size_t(id)] = x < 0.f ? x * r : x / r;
      }
  }
  if (p_.presence_penalty != 0.f || p_.frequency_penalty != 0.f) {
    seen_.resize(size_t(vocab), 0);
    for (int32_t id : h.generated) {
      scratch_[size_t(id)] -= p_.frequency_penalty;
      if (!seen_[size_t(id)]) scratch_[size_t(id)] -= p_.presence_penalty;
      seen_[size_t(id)] = 1;
    }
    for (int32_t id : h.generated) seen_[size_t(id)] = 0;
  }
  return scratch_.data();
}

size_t Sampler::candidates(const float* logits, int64_t vocab, double& total) {
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i] / p_.temperature, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted descending).
  const float mx = cand_[0].first;
  total = 0;
  prob_.resize(n);
  for (size_t i = 0; i < n; ++i) total += prob_[i] = std::exp(double(cand_[i].first - mx));
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      acc += prob_[i] / total;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.f) {  // prob_[0] (= 1) is the most likely: keep the prefix at >= min_p of it
    size_t keep = 1;
    while (keep < n && prob_[keep] >= double(p_.min_p) * prob_[0]) ++keep;
    n = keep;
  }
  total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  return n;
}

int32_t Sampler::sample(const float* raw, int64_t vocab, const TokenHistory& h) {
  const float* logits = penalize(raw, vocab, h);
  if (p_.temperature == 0.f) return argmax(logits, vocab);
  double total = 0;
  const size_t n = candidates(logits, vocab, total);
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= prob_[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

float token_logprob(const float* logits, int64_t vocab, int32_t id, int n_top, std::vector<TokenLogprob>* top) {
  FH_CHECK(id >= 0 && id < vocab, "token_logprob: id ", id, " outside [0, ", vocab, ")");
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  if (top && n_top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) ids[size_t(i)] = int32_t(i);
    const auto k = std::min<size_t>(size_t(n_top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    top->clear();
    for (size_t i = 0; i < k; ++i) top->push_back({ids[i], float(double(logits[ids[i]]) - lse)});
  }
  return float(double(logits[id]) - lse);
}

std::vector<std::pair<int32_t, double>> Sampler::distribution(const float* raw, int64_t vocab, const TokenHistory& h) {
  const float* logits = penalize(raw, vocab, h);
  if (p_.temperature == 0.f) return {{argmax(logits, vocab), 1.0}};
  double total = 0;
  const size_t n = candidates(logits, vocab, total);
  std::vector<std::pair<int32_t, double>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {cand_[i].second, prob_[i] / total};
  return out;
}

}  // namespace flexh2o
