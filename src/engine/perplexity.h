// Teacher-forced perplexity with the full KV cache: the model reads ids[0..n-2] and every
// next token ids[1..n-1] is scored. Chunked so logits memory stays bounded. Blocking.
#pragma once

#include <cstdint>
#include <span>

#include "engine/forward.h"

namespace flexh2o {

struct PerplexityResult {
  double mean_nll = 0;     // natural log
  double perplexity = 0;   // exp(mean_nll)
  int64_t tokens = 0;      // tokens scored (ids.size() - 1)
};

// ids include BOS where the model expects one; ids.size() must be in [2, max_positions + 1].
// The KV cache holds `kv_dtype`.
PerplexityResult perplexity(Forward& fwd, std::span<const int32_t> ids, int64_t chunk = 256,
                            DType kv_dtype = DType::F16);

}  // namespace flexh2o
