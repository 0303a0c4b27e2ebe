// The sampling flags of `flexh2o generate` (--greedy, --temperature, --top-k, --top-p, --min-p,
// the penalties, --logprobs, --seed): the defaults of flexh2o input lines (engine/sampler.h says
// what each does); and the log-probability fields of flexh2o output lines.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/sampler.h"

namespace flexh2o::cli {

// Binds the flags to `a`'s fields; `a` must outlive parsing.
void add_sampling_flags(CLI::App& g, GenerateArgs& a);

// When `r` has them: "logprobs" [per token] and "top_logprobs" [[{"id", "logprob"}, ...] per token].
void add_logprobs(const GenerationResult& r, nlohmann::json& line);

}  // namespace flexh2o::cli
