// Next-token selection: greedy (temperature 0), or temperature / top-k / top-p sampling
// with a per-sequence seeded RNG so runs are reproducible. Not thread-safe (owns an RNG).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace flexh2o {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws flexh2o::Error for invalid params (negative temperature, top_p outside (0, 1], ...).
  explicit Sampler(const SamplingParams& p);
  // Picks a token from `logits` (fp32, `vocab` entries). Ties in greedy go to the lowest id.
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// Validates params, throwing flexh2o::Error with a message naming the bad field.
void validate(const SamplingParams& p);

}  // namespace flexh2o
