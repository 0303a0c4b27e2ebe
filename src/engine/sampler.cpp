// Penalties, then greedy or temperature / top-k / top-p / min-p sampling.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace flexh2o {
namespace {

int32_t argmax(const float* logits, int64_t vocab) {  // the first maximum
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

// Before in the order tokens are kept: the higher scaled logit, then the lower id.
bool before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

void validate(const SamplingParams& p, int64_t vocab) {
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature))
    FH_FAIL("temperature must be >= 0, got ", p.temperature);
  if (p.top_k < -1) FH_FAIL("top_k must be a count of tokens, or 0 or -1 (off), got ", p.top_k);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) FH_FAIL("top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) FH_FAIL("min_p must be in [0, 1], got ", p.min_p);
  if (!(p.repetition_penalty > 0.f) || !std::isfinite(p.repetition_penalty))
    FH_FAIL("repetition_penalty must be > 0 (1 = off), got ", p.repetition_penalty);
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f))
    FH_FAIL("presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f))
    FH_FAIL("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  std::vector<int32_t> ids;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || (vocab > 0 && id >= vocab))
      FH_FAIL("logit_bias: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
    if (!(bias >= -100.f && bias <= 100.f)) FH_FAIL("logit_bias: the bias of token ", id, " must be in [-100, 100], got ", bias);
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end())
    FH_FAIL("logit_bias: token id ", *std::adjacent_find(ids.begin(), ids.end()), " is given twice");
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
  for (const auto& [id, bias] : p_.logit_bias) {
    if (id >= vocab) FH_FAIL("sampler: logit_bias token id ", id, " is outside the vocabulary [0, ", vocab, ")");
    scratch_[size_t(id)] += bias;
  }
  return scratch_.data();
}

// The top-k path: the k most likely by scaled logit (a partial sort), then top-p and min-p among
// them. prob_ holds their weights, cand_ them; returns how many are kept.
size_t Sampler::top_k_candidates(const float* logits, int64_t vocab, double& total) {
  cand_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) cand_[size_t(i)] = {logits[i] / p_.temperature, int32_t(i)};
  size_t n = std::min(cand_.size(), size_t(p_.top_k));
  std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(n), cand_.end(), before);
  const float mx = cand_[0].first;
  total = 0;
  prob_.resize(n);
  for (size_t i = 0; i < n; ++i) total += prob_[i] = std::exp(double(cand_[i].first - mx));
  if (p_.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
      acc += prob_[i] / total;
      if (acc >= p_.top_p) {
        n = i + 1;
        break;
      }
    }
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

// Without top-k: the weight of every token, exp((logit - max) / temperature) (the most likely
// weighs 1), in w_, and their sum (in id order).
double Sampler::weigh(const float* logits, int64_t vocab) {
  w_.resize(size_t(vocab));
  x_.resize(size_t(vocab));
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, x_[size_t(i)] = logits[i] / p_.temperature);
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += w_[size_t(i)] = std::exp(double(x_[size_t(i)] - mx));
  return total;
}

// cand_ <- the most likely tokens (scaled logit, id), as few as it takes for their weight to
// reach `mass`, none below `floor`: the prefix of the vocabulary in `before` order, found without
// sorting it (cand_'s order is unspecified). Tokens lighter than eps cannot be in it once those
// at least eps weigh enough, so only those are looked at; eps falls by 1e3 until they do. Among
// them a weighted quickselect: partition around a pivot, keep the side the prefix ends in.
// Returns the prefix's weight.
double Sampler::heaviest(int64_t vocab, double mass, double floor) {
  for (double eps = std::max(floor, 1e-3);; eps = eps > 1e-30 ? std::max(floor, eps * 1e-3) : floor) {
    cand_.clear();
    double m = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (w_[size_t(i)] >= eps) cand_.push_back({x_[size_t(i)], int32_t(i)}), m += w_[size_t(i)];
    if (eps > floor && m < mass) continue;
    auto w = [&](const std::pair<float, int32_t>& e) { return w_[size_t(e.second)]; };
    size_t lo = 0, hi = cand_.size();  // cand_[0, lo) is in the prefix, which ends in [lo, hi]
    double need = mass, taken = 0;
    while (hi - lo > 32) {
      const auto a = cand_[lo], b = cand_[lo + (hi - lo) / 2], c = cand_[hi - 1];
      const auto pivot = before(a, b) ? (before(b, c) ? b : before(a, c) ? c : a) : (before(a, c) ? a : before(b, c) ? c : b);
      const auto mid = size_t(std::partition(cand_.begin() + std::ptrdiff_t(lo), cand_.begin() + std::ptrdiff_t(hi),
                                             [&](const auto& e) { return before(e, pivot); }) -
                              cand_.begin());
      double left = 0;
      for (size_t i = lo; i < mid; ++i) left += w(cand_[i]);
      if (left >= need) {
        hi = mid;
        continue;
      }
      need -= left, taken += left, lo = mid;
      // The pivot leads what is left: take it.
      const auto at = std::find(cand_.begin() + std::ptrdiff_t(lo), cand_.begin() + std::ptrdiff_t(hi), pivot);
      std::iter_swap(cand_.begin() + std::ptrdiff_t(lo), at);
      need -= w(pivot), taken += w(pivot), ++lo;
      if (need <= 0) {
        cand_.resize(lo);
        return taken;
      }
    }
    std::sort(cand_.begin() + std::ptrdiff_t(lo), cand_.begin() + std::ptrdiff_t(hi), before);
    for (size_t k = lo; k < hi; ++k) {
      need -= w(cand_[k]), taken += w(cand_[k]);
      if (need <= 0) {
        hi = k + 1;
        break;
      }
    }
    cand_.resize(hi);
    return taken;
  }
}

// Draws from the tokens at least `floor` heavy (all: floor 0), walking them in id order.
int32_t Sampler::draw_unsorted(int64_t vocab, double floor) {
  double kept = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (w_[size_t(i)] >= floor) kept += w_[size_t(i)];
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (w_[size_t(i)] < floor) continue;
    last = int32_t(i);
    r -= w_[size_t(i)];
    if (r < 0) break;
  }
  return last;
}

int32_t Sampler::sample(const float* raw, int64_t vocab, const TokenHistory& h) {
  const float* logits = penalize(raw, vocab, h);
  if (p_.temperature == 0.f) return argmax(logits, vocab);
  if (p_.top_k > 0) {
    double total = 0;
    const size_t n = top_k_candidates(logits, vocab, total);
    double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
    for (size_t i = 0; i < n; ++i) {
      r -= prob_[i];
      if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
  }
  const double total = weigh(logits, vocab);
  // Temperature and min-p need no order: one pass over the vocabulary.
  if (p_.top_p >= 1.f) return draw_unsorted(vocab, double(p_.min_p));
  const double kept = heaviest(vocab, double(p_.top_p) * total, double(p_.min_p));
  double r = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  for (const auto& [x, id] : cand_) {
    r -= w_[size_t(id)];
    if (r < 0) return id;
  }
  return cand_.back().second;
}

std::vector<std::pair<int32_t, double>> Sampler::distribution(const float* raw, int64_t vocab, const TokenHistory& h) {
  const float* logits = penalize(raw, vocab, h);
  if (p_.temperature == 0.f) return {{argmax(logits, vocab), 1.0}};
  std::vector<std::pair<int32_t, double>> out;
  if (p_.top_k > 0) {
    double total = 0;
    const size_t n = top_k_candidates(logits, vocab, total);
    for (size_t i = 0; i < n; ++i) out.push_back({cand_[i].second, prob_[i] / total});
    return out;
  }
  const double total = weigh(logits, vocab);
  // Without top-p no mass ends the prefix: every token at least min-p heavy.
  const double all = std::numeric_limits<double>::infinity();
  const double kept = heaviest(vocab, p_.top_p < 1.f ? double(p_.top_p) * total : all, double(p_.min_p));
  std::sort(cand_.begin(), cand_.end(), before);
  for (const auto& [x, id] : cand_) out.push_back({id, w_[size_t(id)] / kept});
  return out;
}

float token_logprob(const float* logits, int64_t vocab, int32_t id, int n_top, std::vector<TokenLogprob>* top) {
  FH_CHECK(id >= 0 && id < vocab, "token_logprob: id ", id, " outside [0, ", vocab, ")");
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  if (top && n_top > 0) {
    // One pass keeping the n_top best so far in a heap whose top is the worst of them.
    const size_t k = std::min<size_t>(size_t(n_top), size_t(vocab));
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::vector<int32_t> heap;
    heap.reserve(k);
    for (int64_t i = 0; i < vocab; ++i) {
      if (heap.size() < k) {
        heap.push_back(int32_t(i));
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(int32_t(i), heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = int32_t(i);
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
    std::sort(heap.begin(), heap.end(), better);
    top->clear();
    for (int32_t t : heap) top->push_back({t, float(double(logits[t]) - lse)});
  }
  return float(double(logits[id]) - lse);
}

}  // namespace flexh2o
