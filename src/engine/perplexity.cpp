// Teacher-forced perplexity over one sequence, in chunks of decode-style steps.
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace flexh2o {

PerplexityResult perplexity_of(double nll, int64_t scored, int64_t n) {
  PerplexityResult r;
  r.tokens = scored;
  r.interrupted = scored < n;
  r.mean_nll = scored ? nll / double(scored) : std::nan("");
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

PerplexityResult perplexity(Forward& fwd, std::span<const int32_t> ids, int64_t chunk, DType kv_dtype,
                            const std::function<void(int64_t, int64_t)>& on_progress,
                            const std::atomic<bool>* stop) {
  const ModelConfig& c = fwd.model().config();
  const int64_t n = int64_t(ids.size()) - 1;  // positions fed
  if (n < 1) FH_FAIL("perplexity needs at least 2 tokens, got ", ids.size());
  if (n > c.max_positions)
    FH_FAIL("the text is ", ids.size(), " tokens; scoring it reads ", n, " of them, more than the model's ",
            c.max_positions, " positions");
  FH_CHECK(chunk > 0, "chunk must be positive");
  check_token_ids(ids, c, "text");  // a tokenizer larger than the model's table (another model's)
  KvCache cache(c, 1, n, kv_dtype);
  std::vector<float> logits;
  std::vector<int32_t> pos;
  double nll = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t T = std::min(chunk, n - start);
    pos.resize(size_t(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(start + t);
    try {
      fwd.step(ids.data() + start, pos.data(), T, nullptr, cache, LogitsRows::kAll, logits, nullptr, stop);
    } catch (const StepStopped&) {  // over the chunks scored before
      return perplexity_of(nll, start, n);
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* row = logits.data() + t * c.vocab_size;
      const float mx = *std::max_element(row, row + c.vocab_size);
      double sum = 0;
      for (int64_t v = 0; v < c.vocab_size; ++v) sum += std::exp(double(row[v] - mx));
      const int32_t target = ids[size_t(start + t + 1)];
      FH_CHECK(target >= 0 && target < c.vocab_size, "token id ", target, " outside the vocabulary");
      nll += std::log(sum) + mx - row[target];
    }
    if (on_progress) on_progress(start + T, n);
    if (stop && stop->load(std::memory_order_relaxed)) return perplexity_of(nll, start + T, n);
  }
  return perplexity_of(nll, n, n);
}

}  // namespace flexh2o
