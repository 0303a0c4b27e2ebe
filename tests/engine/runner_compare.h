// Comparing two runners step by step: a wrapper that records every step's logits, greedy runs
// through it, and element-wise comparisons (bit for bit, or within a tolerance; NaN fails).
// Token equality alone is weak evidence on the tiny models (their greedy text loops).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "tolerance.h"
#include "engine/forwarding_runner.h"
#include "engine/runner.h"

namespace flexh2o::test {

class Recorder final : public ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  void step(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows,
            std::vector<float>& logits) override {
    step_rows(ids, positions, T, real_rows, 1, logits);
  }
  void step_rows(const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows, int64_t rows,
                 std::vector<float>& logits) override {
    inner().step_rows(ids, positions, T, real_rows, rows, logits);
    steps.push_back(logits);
  }
  std::vector<std::vector<float>> steps;
};

struct Run {
  std::vector<std::vector<float>> logits;  // per step
  std::vector<std::vector<int32_t>> tokens;
};

inline Run run_greedy(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  Recorder rec(r);
  GenerateOptions o;
  o.ignore_eos = true;
  Run out;
  for (auto& g : generate(rec, reqs, o)) out.tokens.push_back(g.tokens);
  out.logits = std::move(rec.steps);
  return out;
}

// A batch's prompts as one prefill step: [B, S] ids and positions, left-padded with zeros, and
// each sequence's real length.
struct PaddedPrompts {
  int64_t B = 0, S = 0;
  std::vector<int32_t> ids, pos, real;
};

inline PaddedPrompts pad_prompts(const std::vector<GenerationRequest>& reqs) {
  PaddedPrompts p;
  p.B = int64_t(reqs.size());
  for (const auto& q : reqs) p.S = std::max<int64_t>(p.S, int64_t(q.prompt_ids.size()));
  p.ids.assign(size_t(p.B * p.S), 0);
  p.pos.assign(size_t(p.B * p.S), 0);
  p.real.resize(size_t(p.B));
  for (int64_t b = 0; b < p.B; ++b) {
    const auto& ids = reqs[size_t(b)].prompt_ids;
    const size_t at = size_t(b * p.S + p.S - int64_t(ids.size()));
    p.real[size_t(b)] = int32_t(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) p.ids[at + t] = ids[t], p.pos[at + t] = int32_t(t);
  }
  return p;
}

// Feeds `reqs` as one batch (left-padded prompts), then `tokens[b][j]` at decode step j for
// every sequence (teacher forcing): two runners see the same inputs even where their greedy
// choices would part. `tokens` is another run's output; every request must have as many.
inline Run run_forced(StepRunner& r, const std::vector<GenerationRequest>& reqs,
                      const std::vector<std::vector<int32_t>>& tokens) {
  const PaddedPrompts p = pad_prompts(reqs);
  const int64_t B = p.B, S = p.S;
  const std::vector<int32_t>& real = p.real;
  EXPECT_LE(B, r.max_batch());
  const int64_t gen = int64_t(tokens.at(0).size());
  Run out;
  std::vector<float> logits;
  r.begin_batch(B, S + gen);
  r.step(p.ids.data(), p.pos.data(), S, real.data(), logits);
  out.logits.push_back(logits);
  for (int64_t j = 0; j + 1 < gen; ++j) {
    std::vector<int32_t> next(static_cast<size_t>(B)), np(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      next[size_t(b)] = tokens[size_t(b)][size_t(j)];
      np[size_t(b)] = real[size_t(b)] + int32_t(j);
    }
    r.expect_more_steps(j + 2 < gen);
    r.step(next.data(), np.data(), 1, nullptr, logits);
    out.logits.push_back(logits);
  }
  out.tokens = tokens;
  return out;
}

inline void expect_same_logits(const Run& got, const Run& want, const std::string& what) {
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t s = 0; s < got.logits.size(); ++s) {
    ASSERT_EQ(got.logits[s].size(), want.logits[s].size()) << what << " step " << s;
    for (size_t i = 0; i < got.logits[s].size(); ++i) {
      ASSERT_FALSE(std::isnan(got.logits[s][i])) << what << " step " << s << " logit " << i;
      ASSERT_EQ(std::memcmp(&got.logits[s][i], &want.logits[s][i], sizeof(float)), 0)
          << what << ": step " << s << " logit " << i << " is " << got.logits[s][i] << ", expected "
          << want.logits[s][i];
    }
  }
  EXPECT_EQ(got.tokens, want.tokens) << what;
}

// within_tolerance(got, want, atol, rtol) for every logit of every step, and logits are finite:
// a NaN or an infinity on either side fails. Returns the largest absolute difference. Runs without
// logits fail.
inline double expect_close_logits(const Run& got, const Run& want, double atol, double rtol, const std::string& what) {
  double worst = 0;
  EXPECT_FALSE(want.logits.empty()) << what << ": no logits to compare";
  EXPECT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t s = 0; s < std::min(got.logits.size(), want.logits.size()); ++s) {
    EXPECT_EQ(got.logits[s].size(), want.logits[s].size()) << what;
    for (size_t i = 0; i < std::min(got.logits[s].size(), want.logits[s].size()); ++i) {
      const double g = got.logits[s][i], w = want.logits[s][i];
      if (!within_tolerance(g, w, atol, rtol) || !std::isfinite(w)) {
        ADD_FAILURE() << what << ": step " << s << " logit " << i << " is " << g << ", expected " << w;
        return std::abs(g - w);
      }
      worst = std::max(worst, std::abs(g - w));
    }
  }
  return worst;
}

}  // namespace flexh2o::test
