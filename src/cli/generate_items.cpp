// Input lines -> engine requests for `flexh2o generate` (generate_items.h): field by field, each
// checked against the range it takes, so that a bad line is that line's error and the rest run.
#include "cli/generate_items.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "cli/sampling_flags.h"
#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli {
namespace {
using nlohmann::json;
namespace batch = openai_batch;

// A flexh2o line's "stop": a string or an array of them, none empty ([]: none, not --stop's);
// absent or null: --stop's. Stop strings are found in the decoded text, so they need the tokenizer.
std::vector<std::string> stop_field(const json& j, const std::vector<std::string>& dflt, bool has_tokenizer) {
  if (!j.contains("stop") || j["stop"].is_null()) return dflt;
  if (!has_tokenizer) FH_FAIL("field \"stop\" needs the text: this model has no tokenizer (pass --tokenizer DIR)");
  return batch::parse_stop_strings(j["stop"], 0, "field \"stop\"");
}

// An integer field, checked against the range the field takes (4294967298 must not wrap to 2,
// and the message names that range, not the C++ type's); nullopt when absent or null.
std::optional<int64_t> int_field(const json& j, const char* key, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return json_to_int(j[key], lo, hi, "field \"" + std::string(key) + "\"");
}

template <typename T>
T field(const json& j, const char* key, T dflt) {
  static_assert(!std::is_integral_v<T>, "integer fields go through int_field (get<int>() would wrap)");
  if (!j.contains(key) || j[key].is_null()) return dflt;
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    FH_FAIL("field \"", key, "\" has the wrong type: ", json_excerpt(j[key]));
  }
}

batch::Hooks hooks_of(const GenerateArgs& a, const LoadedModel& lm) {
  batch::Hooks h = batch::make_hooks(lm.tokenizer_or_null(), a.render_chat);
  h.score_prompts = a.pipeline.stages <= 1;  // echoed prompts are scored on the driver's runner
  return h;
}

}  // namespace

GenerateItem make_item(const nlohmann::ordered_json& line_json, int64_t line, size_t index, const GenerateArgs& a,
                       const LoadedModel& lm) {
  const json j(line_json);
  GenerateItem it;
  it.line = line;
  it.id = j.contains("id") ? j["id"] : json(index);
  try {
    // A misspelt field ("temprature") would otherwise run with the flag's value unnoticed.
    static const std::set<std::string> kFields = {
        "id",          "prompt",     "prompt_ids", "messages",           "max_new_tokens",   "temperature",
        "top_k",       "top_p",      "min_p",      "repetition_penalty", "presence_penalty", "frequency_penalty",
        "seed",        "logit_bias", "logprobs",   "stop",               "add_generation_prompt",
        "continue_final_message", "chat_template_kwargs"};
    for (const auto& [key, value] : j.items()) {
      if (!kFields.contains(key))
        FH_FAIL("unknown field \"", key, "\"; a line takes id, one of prompt / prompt_ids / messages, "
                "max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, "
                "frequency_penalty, seed, logit_bias, logprobs and stop (and with messages add_generation_prompt, "
                "continue_final_message and chat_template_kwargs)");
      if (!j.contains("messages") &&
          (key == "add_generation_prompt" || key == "continue_final_message" || key == "chat_template_kwargs"))
        FH_FAIL("field \"", key, "\" applies to a chat template: it needs \"messages\"");
    }
    if (int(j.contains("prompt")) + int(j.contains("prompt_ids")) + int(j.contains("messages")) > 1)
      FH_FAIL("give one of \"prompt\", \"prompt_ids\" and \"messages\", not several");
    GenerationRequest req;
    if (j.contains("prompt_ids")) {
      req.prompt_ids = json_to_ids(j["prompt_ids"], "field \"prompt_ids\"");
    } else if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) FH_FAIL("field \"prompt\" must be a string");
      const std::string text = j["prompt"].get<std::string>();
      if (!lm.tokenizer) FH_FAIL("this model has no tokenizer: give \"prompt_ids\" or pass --tokenizer DIR");
      req.prompt_ids = lm.tokenizer->encode(text, /*add_special=*/true);  // "": BOS alone, as transformers
      if (req.prompt_ids.empty()) FH_FAIL("empty prompt: this model adds no BOS, so it gives no tokens");
    } else if (j.contains("messages")) {  // a chat: rendered with the model's template
      batch::RequestError why;
      req.prompt_ids = batch::chat_prompt_ids(line_json, hooks_of(a, lm), &why);
      if (req.prompt_ids.empty()) FH_FAIL(why.message);
    } else {
      FH_FAIL("line has none of \"prompt\", \"prompt_ids\" and \"messages\"");
    }
    req.max_new_tokens = int_field(j, "max_new_tokens", 0, INT64_MAX).value_or(a.max_new_tokens);
    req.sampling.temperature = a.greedy ? 0.f : field<float>(j, "temperature", a.temperature);
    req.sampling.top_k = int(int_field(j, "top_k", -1, INT32_MAX).value_or(a.top_k));
    req.sampling.top_p = field<float>(j, "top_p", a.top_p);
    req.sampling.min_p = field<float>(j, "min_p", a.min_p);
    req.sampling.repetition_penalty = field<float>(j, "repetition_penalty", a.repetition_penalty);
    req.sampling.presence_penalty = field<float>(j, "presence_penalty", a.presence_penalty);
    req.sampling.frequency_penalty = field<float>(j, "frequency_penalty", a.frequency_penalty);
    // Any int64, taken modulo 2**64 (-1 is 2**64 - 1) as Batch bodies and LLM.generate take it.
    const std::optional<int64_t> seed = int_field(j, "seed", INT64_MIN, INT64_MAX);
    req.sampling.seed = seed ? uint64_t(*seed) : a.seed + index;
    if (j.contains("logit_bias") && !j["logit_bias"].is_null())
      req.sampling.logit_bias = batch::parse_logit_bias(j["logit_bias"]);
    req.top_logprobs = int(int_field(j, "logprobs", 0, kMaxTopLogprobs).value_or(a.logprobs));
    it.stop = stop_field(j, a.stop, lm.tokenizer.has_value());
    validate_request(req, lm.model->config());
    it.reqs.push_back(std::move(req));
  } catch (const Error& e) {
    it.error = e.what();
  }
  return it;
}

GenerateItem make_batch_item(const nlohmann::ordered_json& j, int64_t line, size_t index, const GenerateArgs& a,
                             const LoadedModel& lm) {
  batch::Parsed p = batch::parse_input_line(j, hooks_of(a, lm));
  GenerateItem it;
  it.line = line;
  it.id = p.custom_id;
  if (p.error) {
    it.error = p.error->message;
    it.error_param = p.error->param;
    it.error_code = p.error->code;
    return it;
  }
  batch::RunDefaults d;
  d.greedy = a.greedy;
  d.top_k = a.top_k;
  d.min_p = a.min_p;
  d.repetition_penalty = a.repetition_penalty;
  d.seed = a.seed + index;
  try {
    it.reqs = batch::expand_request(*p.request, d, lm.model->config());
    it.batch = std::make_unique<batch::Request>(std::move(*p.request));
  } catch (const batch::RefusedRequest& e) {
    it.error = e.error.message;
    it.error_param = e.error.param;
    it.error_code = e.error.code;
  }
  return it;
}


}  // namespace flexh2o::cli
