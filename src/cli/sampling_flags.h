// The sampling flags of `flexh2o generate` (--greedy, --temperature, --top-k, --top-p, --min-p,
// the penalties, --logprobs, --seed): the defaults of flexh2o input lines (engine/sampler.h says
// what each does), which a model's generation_config.json may set; and the log-probability fields
// of flexh2o output lines.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/sampler.h"

namespace flexh2o::cli {

// Binds the flags to `a`'s fields; `a` must outlive parsing.
void add_sampling_flags(CLI::App& g, GenerateArgs& a);

// With --generation-config auto (the default): the sampling values of `model_dir`'s
// generation_config.json (temperature, top_k, top_p, min_p, repetition_penalty) become `a`'s
// where its flags were not given, and `log` says which. No file (a preset: empty dir): nothing.
// Throws, naming the file, for one that is not a JSON object or a value that is not a number.
void apply_generation_config(GenerateArgs& a, const std::filesystem::path& model_dir, std::ostream& log);

// When `r` has them: "logprobs" [per token] and "top_logprobs" [[{"id", "logprob"}, ...] per token].
void add_logprobs(const GenerationResult& r, nlohmann::json& line);

}  // namespace flexh2o::cli
