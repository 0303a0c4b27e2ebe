// `flexh2o generate`'s input lines turned into engine requests: a flexh2o line ({"prompt"},
// {"prompt_ids"} or {"messages"} with its sampling fields and stop strings), or an OpenAI Batch
// line (its prompts x n choices). Plain values; cmd_generate.cpp runs them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/dp_generate.h"
#include "cli/openai_batch.h"
#include "engine/generate.h"

namespace flexh2o::cli {

// One input line (or the --prompt) turned into requests, or the reason it cannot be.
struct GenerateItem {
  nlohmann::json id;  // flexh2o's "id" (default: the line's index), or the Batch "custom_id"
  int64_t line = 0;
  std::vector<GenerationRequest> reqs;  // one; a Batch line: one per prompt and choice
  std::string error;
  bool unread = false;  // the line could not be read (not JSON, too long): its id is its index
  std::optional<std::string> error_param;  // Batch lines: the field at fault
  std::optional<std::string> error_code;   // Batch lines: OpenAI's code (openai_batch::RequestError)
  std::unique_ptr<openai_batch::Request> batch;  // a pointer: most runs hold only flexh2o lines, millions
  std::vector<std::string> stop;  // a flexh2o line's (or --stop's) stop strings; Batch lines: batch->stop
  size_t first_req = 0, results = 0;  // where its requests sit in the run; how many finished
  bool ready() const { return !reqs.empty() && results == reqs.size(); }
  // The strings that end its requests, and whether they are looked for in the text without the
  // special tokens' (a Batch body's skip_special_tokens; flexh2o lines keep them, as their text does).
  const std::vector<std::string>& stop_strings() const { return batch ? batch->stop : stop; }
  bool stop_skips_special() const { return batch && batch->skip_special_tokens; }
  StopRule stop_rule() const { return {stop_strings(), stop_skips_special()}; }
};

// A flexh2o line (or --prompt, as {"prompt": ...}): its request, or the line's error in `error`.
// `index` is the line's place among the input's requests (its default id and seed offset).
GenerateItem make_item(const nlohmann::ordered_json& line_json, int64_t line, size_t index, const GenerateArgs& a,
                       const LoadedModel& lm);
// A Batch line: its prompts x n choices. Bodies carry OpenAI's defaults (max_tokens 16 for
// completions, up to the context for chat; temperature 1, top_p 1); --greedy, --top-k and --seed
// (base seed + line index, when the body has no seed) still apply.
GenerateItem make_batch_item(const nlohmann::ordered_json& j, int64_t line, size_t index, const GenerateArgs& a,
                             const LoadedModel& lm);

}  // namespace flexh2o::cli
