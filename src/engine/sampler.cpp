// Greedy / temperature / top-k / top-p sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace flexh2o {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature))
    FH_FAIL("temperature must be >= 0, got ", p.temperature);
  if (p.top_k < 0) FH_FAIL("top_k must be >= 0, got ", p.top_k);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) FH_FAIL("top_p must be in (0, 1], got ", p.top_p);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature == 0.f) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
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
  double total = 0;
  std::vector<double> prob(n);
  for (size_t i = 0; i < n; ++i) total += prob[i] = std::exp(double(cand_[i].first - mx));
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      acc += prob[i] / total;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    total = 0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
  }
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace flexh2o
