// The sampling flags of `flexh2o generate` (--greedy, --temperature, --top-k, --top-p, --min-p,
// the penalties, --logprobs, --seed): the defaults of flexh2o input lines (engine/sampler.h says
// what each does), which a model's generation_config.json may set; and the log-probability fields
// of flexh2o output lines.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/sampler.h"

namespace flexh2o::cli {

// Binds the flags to `a`'s fields; `a` must outlive parsing.
void add_sampling_flags(CLI::App& g, GenerateArgs& a);
// --seed's check at parse time: an integer of int64 or uint64 (taken modulo 2**64, -1 is
// 2**64 - 1); larger ones are refused, not clamped to 2**64 - 1.
CLI::Validator seed_check();

// The sampling values a model's generation_config.json sets: those of kGenerationConfigKeys it
// has (not null), in that order, as the file writes them (top_k too is a double here).
struct GenerationConfig {
  std::filesystem::path file;  // empty: there is none
  std::vector<std::pair<std::string, double>> values;
  std::vector<int32_t> eos_ids;  // its "eos_token_id": one id or a list (Gemma's instruct models add <end_of_turn>)
  std::optional<double> value(const std::string& key) const;
};
inline constexpr const char* kGenerationConfigKeys[] = {"temperature", "top_k", "top_p", "min_p",
                                                        "repetition_penalty"};

// Reads `model_dir`'s generation_config.json; no file (a preset: empty dir) gives no values.
// Throws, naming the file and `turn_off` (how the caller ignores it: "--generation-config none"),
// for one that is not a JSON object or a value that is not a number.
GenerationConfig read_generation_config(const std::filesystem::path& model_dir, const std::string& turn_off);
// What a run takes of the file under `mode` (--generation-config): "auto", read_generation_config's
// all; "none", its end-of-sequence ids alone (they end sequences whatever the sampling defaults, as
// in transformers and vLLM), and nothing from a file that does not read.
GenerationConfig read_generation_config(const std::string& mode, const std::filesystem::path& model_dir,
                                        const std::string& turn_off);

// With --generation-config auto (the default): the values of read_generation_config become `a`'s
// where its flags were not given, and `log` says which. Returns what the run takes of the file
// (read_generation_config(mode, ...)), for its end-of-sequence ids.
GenerationConfig apply_generation_config(GenerateArgs& a, const std::filesystem::path& model_dir, std::ostream& log);

// The ids that end a sequence, as transformers' generate() and vLLM stop: the tokenizer's EOS, every
// eos_token_id of config.json and of generation_config.json (`g`), each once, in that order. An id
// outside the vocabulary, which the model never samples, is left out and `log` says so.
std::vector<int32_t> end_of_sequence_ids(const ModelConfig& c, std::optional<int32_t> tokenizer_eos,
                                         const GenerationConfig& g, std::ostream& log);

// The sampling values every line starts from (the flags; after apply_generation_config, with the
// file's): throws naming the flag, or the file, for one out of range (SamplingParams' validate),
// so that a bad flag stops the run before any line, not in every line's "error".
void check_sampling_defaults(const GenerateArgs& a);

// When `q` asked for them (top_logprobs >= 0): "logprobs" [per token], and for top_logprobs > 0
// "top_logprobs" [[{"id", "logprob"}, ...] per token]; empty arrays for no token.
void add_logprobs(const GenerationRequest& q, const GenerationResult& r, nlohmann::json& line);

}  // namespace flexh2o::cli
