// Teacher-forced perplexity with the full KV cache: the model reads ids[0..n-2] and every
// next token ids[1..n-1] is scored. Chunked so logits memory stays bounded. Blocking.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>

#include "engine/forward.h"

namespace flexh2o {

struct PerplexityResult {
  double mean_nll = 0;     // natural log
  double perplexity = 0;   // exp(mean_nll)
  int64_t tokens = 0;      // tokens scored (ids.size() - 1, unless interrupted)
  bool interrupted = false;  // a stop ended the scoring before its last token: over `tokens` only
};

// The result of `scored` of `n` tokens whose NLLs sum to `nll` (NaN means when none was scored).
PerplexityResult perplexity_of(double nll, int64_t scored, int64_t n);

// ids include BOS where the model expects one; ids.size() must be in [2, max_positions + 1].
// The KV cache holds `kv_dtype`. `on_progress(done, n)` (optional) is called after each chunk;
// once `*stop` is set (optional) it ends the chunk under way at its next layer and returns over
// the chunks before (PerplexityResult::interrupted), as streaming_perplexity.
PerplexityResult perplexity(Forward& fwd, std::span<const int32_t> ids, int64_t chunk = 256,
                            DType kv_dtype = DType::F16,
                            const std::function<void(int64_t, int64_t)>& on_progress = {},
                            const std::atomic<bool>* stop = nullptr);

}  // namespace flexh2o
