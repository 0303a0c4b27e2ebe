// Parses the rotary settings of a LLaMA-family config.json into a Rope (model/rope.h).
// Internal to flexh2o::model; config.cpp is the one caller.
#pragma once

#include <cstdint>

#include "model/detail/config_reader.h"
#include "model/rope.h"

namespace flexh2o::model_detail {

// The rope of config `r` (rope_theta, rope_scaling, transformers 5's rope_parameters) for heads
// of `head_dim`, whose max_position_embeddings is `max_positions`. `*positions` receives the
// positions over which the result equals transformers exactly: scaled up by linear and yarn
// (their frequencies are fixed), the pretraining length for longrope (transformers switches to
// its long factors beyond), max_positions otherwise. `phi3`: Phi3Config's rules (rope types "su"
// and "yarn" mean longrope; the top-level original_max_position_embeddings, 4096 when absent,
// is the pretraining length). Throws Error naming the key on any problem.
Rope parse_rope(const Reader& r, int64_t head_dim, int64_t max_positions, bool phi3, int64_t* positions);

}  // namespace flexh2o::model_detail
