// Next-token selection: greedy (temperature 0), or temperature / top-k / top-p / min-p sampling
// with a per-sequence seeded RNG so runs are reproducible; before either, the repetition penalty
// (Hugging Face's) and the presence / frequency penalties (OpenAI's) over the sequence's tokens.
// Not thread-safe (owns an RNG and scratch).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace flexh2o {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off (-1 too, as vLLM's)
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  // After top-k and top-p: keep the tokens at least min_p times as likely as the most likely one
  // (transformers' MinPLogitsWarper). 0 = off.
  float min_p = 0.f;
  // transformers' RepetitionPenaltyLogitsProcessor: the logit of every token of the prompt or
  // generated so far is divided by it when positive, multiplied when negative. 1 = off; > 0.
  float repetition_penalty = 1.f;
  // OpenAI's: each token generated so far loses presence_penalty once and frequency_penalty per
  // time it was generated (the prompt does not count). 0 = off; each in [-2, 2].
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to that token's logit after the
  // penalties, greedy too (-100 in effect bans a token, 100 forces it). Ids once each.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool penalized() const {
    return repetition_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f || !logit_bias.empty();
  }
};

// What a step's penalties read: the sequence's prompt and the tokens it generated so far.
struct TokenHistory {
  std::span<const int32_t> prompt, generated;
};

class Sampler {
 public:
  // Throws flexh2o::Error for invalid params (negative temperature, top_p outside (0, 1], ...).
  explicit Sampler(const SamplingParams& p);
  // Picks a token from `logits` (fp32, `vocab` entries; ids in `h` must be in [0, vocab)). Ties in
  // greedy go to the lowest id.
  int32_t sample(const float* logits, int64_t vocab, const TokenHistory& h = {});
  // The distribution sample() draws from, without drawing: (id, probability) of every token that
  // may come, most likely first (ties: lower id), probabilities summing to 1; greedy: {(id, 1)}.
  std::vector<std::pair<int32_t, double>> distribution(const float* logits, int64_t vocab, const TokenHistory& h = {});

 private:
  // The penalized logits (logits itself when no penalty applies).
  const float* penalize(const float* logits, int64_t vocab, const TokenHistory& h);
  // With top-k: cand_ (sorted) and prob_ (unnormalized) hold the kept candidates; returns their
  // number and sets total to their mass.
  size_t top_k_candidates(const float* logits, int64_t vocab, double& total);
  // Without: every token's weight (w_, scaled logits x_); the heaviest prefix (cand_, for top-p);
  // a draw among the tokens of weight >= floor in id order (no sort: temperature and min-p).
  double weigh(const float* logits, int64_t vocab);
  double heaviest(int64_t vocab, double mass, double floor);
  int32_t draw_unsorted(int64_t vocab, double floor);

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_, w_;
  std::vector<float> x_;
  std::vector<float> scratch_;
  std::vector<uint8_t> seen_;  // per id, during penalize(); all zero between calls
};

// Validates params, throwing flexh2o::Error with a message naming the bad field. With vocab > 0,
// logit_bias ids must be in [0, vocab).
void validate(const SamplingParams& p, int64_t vocab = 0);

// The model's log-probability of a token: log softmax of the raw logits (before penalties and
// temperature), in nats.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
  bool operator==(const TokenLogprob&) const = default;
};
// Of token `id` of `logits` (`vocab` entries); with n_top > 0, `top` <- the n_top most likely
// tokens, most likely first (ties: lower id). Reads the row twice, sorts only when n_top > 0.
float token_logprob(const float* logits, int64_t vocab, int32_t id, int n_top = 0,
                    std::vector<TokenLogprob>* top = nullptr);
// Most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

}  // namespace flexh2o
