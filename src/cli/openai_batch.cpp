// OpenAI Batch API lines: parsing requests (with OpenAI's defaults, ranges and error shape) and
// building output lines. A problem in a line is thrown as BadRequest inside this file and comes
// back to the caller as that line's RequestError; nothing here throws for bad input.
#include "cli/openai_batch.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli::openai_batch {
namespace {
using nlohmann::json;

struct BadRequest {
  RequestError e;
};

template <typename... Args>
[[noreturn]] void bad(std::optional<std::string> param, const Args&... args) {
  throw BadRequest{RequestError{detail::concat(args...), std::move(param)}};
}

// A body parameter in one of the states OpenAI documents, or one of vLLM's extra parameters
// (top_k, min_p, repetition_penalty, skip_special_tokens; for chat add_generation_prompt,
// continue_final_message and chat_template_kwargs), which OpenAI clients send as `extra_body`.
// `dflt` are the values that ask for nothing flexh2o lacks (null always does).
struct Param {
  const char* key;
  enum Kind { kSupported, kIgnored, kDefaultOnly } kind;
  std::vector<json> dflt = {};
};

const std::vector<Param>& params(Endpoint ep) {
  using K = Param::Kind;
  static const std::vector<Param> completions = {
      {"model", K::kSupported}, {"prompt", K::kSupported}, {"max_tokens", K::kSupported},
      {"temperature", K::kSupported}, {"top_p", K::kSupported}, {"n", K::kSupported}, {"stop", K::kSupported},
      {"seed", K::kSupported}, {"best_of", K::kSupported}, {"user", K::kIgnored},
      {"echo", K::kSupported}, {"frequency_penalty", K::kSupported},
      {"presence_penalty", K::kSupported}, {"logit_bias", K::kSupported},
      {"logprobs", K::kSupported}, {"stream", K::kDefaultOnly, {false}}, {"stream_options", K::kDefaultOnly},
      {"suffix", K::kDefaultOnly}, {"top_k", K::kSupported}, {"min_p", K::kSupported},
      {"repetition_penalty", K::kSupported}, {"skip_special_tokens", K::kSupported}};
  static const std::vector<Param> chat = {
      {"model", K::kSupported}, {"messages", K::kSupported}, {"max_tokens", K::kSupported},
      {"max_completion_tokens", K::kSupported}, {"temperature", K::kSupported}, {"top_p", K::kSupported},
      {"n", K::kSupported}, {"stop", K::kSupported}, {"seed", K::kSupported}, {"user", K::kIgnored},
      {"metadata", K::kIgnored}, {"store", K::kIgnored}, {"service_tier", K::kIgnored},
      {"parallel_tool_calls", K::kIgnored}, {"prompt_cache_key", K::kIgnored}, {"safety_identifier", K::kIgnored},
      {"frequency_penalty", K::kSupported}, {"presence_penalty", K::kSupported},
      {"logit_bias", K::kSupported}, {"logprobs", K::kSupported},
      {"top_logprobs", K::kSupported}, {"stream", K::kDefaultOnly, {false}},
      {"stream_options", K::kDefaultOnly}, {"tools", K::kDefaultOnly, {json::array()}},
      {"tool_choice", K::kDefaultOnly, {"none"}}, {"functions", K::kDefaultOnly, {json::array()}},
      {"function_call", K::kDefaultOnly, {"none"}},
      {"response_format", K::kDefaultOnly, {json{{"type", "text"}}}}, {"audio", K::kDefaultOnly},
      {"modalities", K::kDefaultOnly, {json::array({"text"})}}, {"prediction", K::kDefaultOnly},
      {"reasoning_effort", K::kDefaultOnly}, {"verbosity", K::kDefaultOnly},
      {"web_search_options", K::kDefaultOnly}, {"top_k", K::kSupported}, {"min_p", K::kSupported},
      {"repetition_penalty", K::kSupported}, {"skip_special_tokens", K::kSupported},
      {"add_generation_prompt", K::kSupported},
      {"continue_final_message", K::kSupported}, {"chat_template_kwargs", K::kSupported}};
  return ep == Endpoint::kCompletions ? completions : chat;
}

// Unknown keys are refused as OpenAI refuses them; parameters flexh2o cannot honour are refused
// unless they hold their default.
// `stream`: "stream" and "stream_options" are checked by stream_params instead.
void check_params(const json& body, Endpoint ep, bool stream) {
  for (const auto& item : body.items()) {  // no structured binding: clang 14 cannot capture one
    const std::string& key = item.key();
    const json& value = item.value();
    const auto& ps = params(ep);
    auto p = std::find_if(ps.begin(), ps.end(), [&](const Param& q) { return key == q.key; });
    if (p == ps.end() && key == "max_completion_tokens")  // chat's alternative to max_tokens
      bad(key, "\"max_completion_tokens\" is chat's name (/v1/chat/completions); /v1/completions takes "
               "\"max_tokens\": give that one");
    if (p == ps.end()) bad(key, "Unrecognized request argument supplied: ", key);
    if (stream && (key == "stream" || key == "stream_options")) continue;
    if (p->kind != Param::kDefaultOnly || value.is_null()) continue;
    if (std::find(p->dflt.begin(), p->dflt.end(), value) == p->dflt.end())
      bad(key, "\"", key, "\" is not supported by flexh2o (got ", json_excerpt(value), "); remove it",
          p->dflt.empty() ? std::string(" or set it to null") : " or set it to " + p->dflt.front().dump());
  }
}

bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

int64_t int_param(const json& body, const char* key, int64_t lo, int64_t hi) {
  try {
    return json_to_int(body[key], lo, hi, std::string("\"") + key + "\"");
  } catch (const Error& e) {
    bad(key, e.what());
  }
}

bool bool_param(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_boolean()) bad(key, "\"", key, "\" must be a boolean, got ", json_excerpt(v));
  return v.get<bool>();
}

float number_param(const json& body, const char* key, double lo, double hi, bool lo_open) {
  const json& v = body[key];
  if (!v.is_number()) bad(key, "\"", key, "\" must be a number, got ", json_excerpt(v));
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
    bad(key, "\"", key, "\" must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", json_excerpt(v));
  return float(x);
}

std::vector<int32_t> ids_param(const json& v, const std::string& what) {
  try {
    return json_to_ids(v, what);
  } catch (const Error& e) {
    bad("prompt", e.what());
  }
}

std::vector<int32_t> tokenize(const Hooks& h, const std::string& text, bool add_special, const char* param) {
  if (!h.tokenize) bad(param, "this model has no tokenizer: give \"prompt\" as token ids, or pass --tokenizer DIR");
  std::vector<int32_t> ids = h.tokenize(text, add_special);
  if (ids.empty()) bad(param, "\"", param, "\" gives no tokens");
  return ids;
}

// A completions prompt: a string, token ids, or an array of either (several prompts), into
// r.prompts and r.prompt_texts.
void completion_prompts(const json& body, const Hooks& h, Request& r) {
  if (!given(body, "prompt")) bad("prompt", "missing \"prompt\"");
  const json& p = body["prompt"];
  auto one_string = [&](const json& s) {  // "": BOS alone, as transformers
    r.prompts.push_back(tokenize(h, s.get<std::string>(), /*add_special=*/true, "prompt"));
    r.prompt_texts.push_back(s.get<std::string>());
  };
  auto ids = [&](const json& v, const std::string& what) {
    r.prompts.push_back(ids_param(v, what));
    r.prompt_texts.push_back(std::nullopt);
  };
  if (p.is_string()) return one_string(p);
  if (!p.is_array() || p.empty())
    bad("prompt", "\"prompt\" must be a string, an array of token ids, an array of strings or an array of "
                  "token-id arrays, got ", json_excerpt(p));
  if (p[0].is_number()) return ids(p, "\"prompt\"");
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string what = "\"prompt\"[" + std::to_string(i) + "]";
    if (p[i].is_string()) one_string(p[i]);
    else if (p[i].is_array()) ids(p[i], what);
    else bad("prompt", what, " must be a string or an array of token ids, got ", json_excerpt(p[i]));
  }
}

// vLLM's template parameters, checked here and applied by the renderer (the hook gets the body):
// add_generation_prompt (default true) and continue_final_message (default false; the text ends
// inside the last message, as transformers cuts it) are booleans, not both true; the names in
// chat_template_kwargs become template variables (there the two flags override the body's, as
// vLLM merges them), except those the request itself gives.
void chat_template_params(const nlohmann::ordered_json& body) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  const bool has_kw = body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null();
  if (has_kw && !body["chat_template_kwargs"].is_object())
    bad("chat_template_kwargs", "\"chat_template_kwargs\" must be an object, got ",
        json_excerpt(json(body["chat_template_kwargs"])));
  const nlohmann::ordered_json& kw = has_kw ? body["chat_template_kwargs"] : none;
  auto flag = [&](const char* key, bool value) {
    for (const nlohmann::ordered_json* from : {&body, &kw}) {
      if (!from->contains(key) || (*from)[key].is_null()) continue;
      const bool in_kw = from == &kw;
      if (!(*from)[key].is_boolean())
        bad(in_kw ? "chat_template_kwargs" : key, in_kw ? "\"chat_template_kwargs\"." : "\"", key,
            in_kw ? "" : "\"", " must be a boolean, got ", json_excerpt(json((*from)[key])));
      value = (*from)[key].get<bool>();
    }
    return value;
  };
  const bool generation_prompt = flag("add_generation_prompt", true), cont = flag("continue_final_message", false);
  if (generation_prompt && cont)
    bad("continue_final_message",
        "\"continue_final_message\": true continues the last message, so it needs \"add_generation_prompt\": "
        "false (whose default, true, starts a new assistant turn)");
  for (const auto& item : kw.items()) {
    if (item.key() == "messages" || item.key() == "tools" || item.key() == "documents")
      bad("chat_template_kwargs", "\"chat_template_kwargs\" cannot set \"", item.key(),
          "\": the template gets the request's own");
    if (item.key() == "chat_template")
      bad("chat_template_kwargs", "\"chat_template_kwargs\" cannot set \"chat_template\": flexh2o renders the "
                                  "model's own template (its tokenizer_config.json or chat_template.jinja)");
  }
}

std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& body, const Hooks& h) {
  if (!given(body, "messages")) bad("messages", "missing \"messages\"");
  const nlohmann::ordered_json& m = body["messages"];
  if (!m.is_array() || m.empty()) bad("messages", "\"messages\" must be a non-empty array, got ", json_excerpt(m));
  // What the template renders: each message with a known role, its content a string or an array
  // of text parts (other part types are refused; the renderer joins the texts by newlines unless
  // the template loops over content itself, as vLLM does); objects keep their key order.
  nlohmann::ordered_json chat = body;
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i].is_object() || !m[i].contains("role") || !m[i]["role"].is_string())
      bad("messages", "\"messages\"[", i, "] must be an object with a string \"role\", got ", json_excerpt(m[i]));
    static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool", "function"};
    if (!kRoles.contains(m[i]["role"].get<std::string>()))
      bad("messages", "\"messages\"[", i, "].role ", json_excerpt(m[i]["role"]),
          " is not one of system, developer, user, assistant, tool, function");
    // Null or absent (an assistant turn with tool_calls, as OpenAI allows): empty text.
    if (!m[i].contains("content") || m[i]["content"].is_null()) {
      chat["messages"][i]["content"] = "";
      continue;
    }
    if (m[i]["content"].is_string()) continue;
    if (!m[i]["content"].is_array())
      bad("messages", "\"messages\"[", i, "].content must be a string, an array of text parts or null, got ",
          json_excerpt(m[i]["content"]));
    for (size_t k = 0; k < m[i]["content"].size(); ++k) {
      const nlohmann::ordered_json& part = m[i]["content"][k];
      const std::string at = "\"messages\"[" + std::to_string(i) + "].content[" + std::to_string(k) + "]";
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        bad("messages", at, " must be an object with a string \"type\", got ", json_excerpt(part));
      if (part["type"] != "text")
        bad("messages", at, " is of type ", part["type"].dump(), "; flexh2o serves text models (\"text\" parts only)");
      if (!part.contains("text") || !part["text"].is_string())
        bad("messages", at, " must have a string \"text\", got ", json_excerpt(part));
    }
  }
  chat_template_params(body);
  if (!h.render_chat)
    bad("messages", "the flexh2o binary cannot render chat templates (they are Jinja); run the same command as "
                    "`python -m flexh2o generate ...`, whose Python front end renders them");
  std::string text;
  try {
    text = h.render_chat(chat);
  } catch (const std::exception& e) {
    bad("messages", "rendering the chat template failed: ", e.what());
  } catch (...) {
    bad("messages", "rendering the chat template failed (an exception that is not a std::exception)");
  }
  if (text.empty()) bad("messages", "the chat template rendered an empty prompt");
  return tokenize(h, text, /*add_special=*/false, "messages");
}

std::vector<std::string> stop_param(const json& body) {
  if (!given(body, "stop")) return {};
  try {
    return parse_stop_strings(body["stop"], 4, "\"stop\"");  // OpenAI takes up to 4
  } catch (const Error& e) {
    bad("stop", e.what());
  }
}

// "stream" (a boolean) and "stream_options" ({"include_usage": bool}, only with "stream": true).
void stream_params(const json& body, Request& r) {
  if (given(body, "stream")) r.stream = bool_param(body, "stream");
  if (!given(body, "stream_options")) return;
  const json& o = body["stream_options"];
  if (!r.stream) bad("stream_options", "\"stream_options\" is only allowed with \"stream\": true");
  if (!o.is_object()) bad("stream_options", "\"stream_options\" must be an object, got ", json_excerpt(o));
  for (const auto& item : o.items()) {
    if (item.key() != "include_usage")
      bad("stream_options", "\"stream_options\": ", json(item.key()).dump(),
          " is not supported by flexh2o (it takes \"include_usage\")");
    if (!item.value().is_null() && !item.value().is_boolean())
      bad("stream_options", "\"stream_options\".include_usage must be a boolean, got ", json_excerpt(item.value()));
    r.include_usage = item.value().is_boolean() && item.value().get<bool>();
  }
}

Request parse_body(const nlohmann::ordered_json& obody, Endpoint ep, const Hooks& h, bool stream) {
  const json body(obody);
  check_params(body, ep, stream);
  Request r;
  if (stream) stream_params(body, r);
  r.endpoint = ep;
  if (given(body, "model")) {
    if (!body["model"].is_string()) bad("model", "\"model\" must be a string, got ", json_excerpt(body["model"]));
    r.model = body["model"].get<std::string>();
  }
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  if (given(body, "n")) r.n = int_param(body, "n", 1, 128);  // OpenAI's range
  if (given(body, "temperature")) r.temperature = number_param(body, "temperature", 0, 2, false);
  if (given(body, "top_p")) r.top_p = number_param(body, "top_p", 0, 1, true);
  if (given(body, "presence_penalty")) r.presence_penalty = number_param(body, "presence_penalty", -2, 2, false);
  if (given(body, "frequency_penalty")) r.frequency_penalty = number_param(body, "frequency_penalty", -2, 2, false);
  if (given(body, "logit_bias")) {
    try {
      r.logit_bias = parse_logit_bias(body["logit_bias"]);
    } catch (const Error& e) {
      bad("logit_bias", e.what());
    }
  }
  // vLLM's: top_k -1 (or 0) is off, and one past the vocabulary keeps every token.
  if (given(body, "top_k")) {
    const int64_t k = int_param(body, "top_k", -1, std::numeric_limits<int64_t>::max());
    r.top_k = int32_t(std::clamp<int64_t>(k, 0, std::numeric_limits<int32_t>::max()));
  }
  if (given(body, "min_p")) r.min_p = number_param(body, "min_p", 0, 1, false);
  if (given(body, "repetition_penalty")) {
    const json& v = body["repetition_penalty"];
    if (!v.is_number() || !(v.get<float>() > 0) || !std::isfinite(v.get<float>()))
      bad("repetition_penalty", "\"repetition_penalty\" must be a number > 0 (1 = off), got ", json_excerpt(v));
    r.repetition_penalty = v.get<float>();
  }
  if (given(body, "skip_special_tokens")) r.skip_special_tokens = bool_param(body, "skip_special_tokens");
  if (given(body, "seed"))
    r.seed = int_param(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  r.stop = stop_param(body);
  if (ep == Endpoint::kCompletions) {
    if (given(body, "logprobs")) r.logprobs = int(int_param(body, "logprobs", 0, 5));  // OpenAI's range
    r.max_tokens = given(body, "max_tokens") ? int_param(body, "max_tokens", 0, kMaxTokens) : 16;
    if (given(body, "best_of") && int_param(body, "best_of", 1, 128) != r.n)
      bad("best_of", "\"best_of\" other than \"n\" is not supported by flexh2o (it returns every choice it "
                     "generates); remove it");
    if (given(body, "echo")) r.echo = bool_param(body, "echo");
    if (r.echo && r.logprobs >= 0 && !h.score_prompts)
      bad("echo", "\"echo\" with \"logprobs\" (the prompt's log-probabilities) is not served with "
                  "--pipeline-stages, whose stages cannot score a prompt; drop one of them");
    completion_prompts(body, h, r);
  } else {
    std::optional<int64_t> a, b;
    // At least 1, as OpenAI and vLLM take them: a chat has no echo that 0 tokens could serve.
    if (given(body, "max_completion_tokens")) a = int_param(body, "max_completion_tokens", 1, kMaxTokens);
    if (given(body, "max_tokens")) b = int_param(body, "max_tokens", 1, kMaxTokens);
    if (a && b && *a != *b)
      bad("max_tokens", "\"max_tokens\" (", *b, ") and \"max_completion_tokens\" (", *a, ") disagree; give one");
    r.max_tokens = a ? a : b;
    if (given(body, "logprobs") && bool_param(body, "logprobs")) r.logprobs = 0;
    if (given(body, "top_logprobs")) {
      const int n = int(int_param(body, "top_logprobs", 0, kMaxTopLogprobs));
      if (r.logprobs < 0) bad("top_logprobs", "\"top_logprobs\" needs \"logprobs\": true");
      r.logprobs = n;
    }
    r.prompts = {chat_prompt(obody, h)};
  }
  return r;
}

}  // namespace

bool is_input_line(const json& line) {
  return line.is_object() &&
         (line.contains("custom_id") || line.contains("method") || line.contains("url") || line.contains("body"));
}

Parsed parse_input_line(const nlohmann::ordered_json& line, const Hooks& hooks, bool stream) {
  Parsed out;
  out.custom_id = line.is_object() && line.contains("custom_id") ? json(line["custom_id"]) : json();
  try {
    if (!line.is_object()) bad(std::nullopt, "a Batch input line must be a JSON object");
    if (!line.contains("custom_id") || line["custom_id"].is_null()) bad("custom_id", "missing \"custom_id\"");
    if (!line["custom_id"].is_string() || line["custom_id"].get_ref<const std::string&>().empty())
      bad("custom_id", "\"custom_id\" must be a non-empty string, got ", json_excerpt(line["custom_id"]));
    if (!line.contains("method")) bad("method", "missing \"method\" (it must be \"POST\")");
    if (line["method"] != "POST") bad("method", "\"method\" must be \"POST\", got ", json_excerpt(line["method"]));
    if (!line.contains("url")) bad("url", "missing \"url\"");
    Endpoint ep;
    if (line["url"] == "/v1/completions") ep = Endpoint::kCompletions;
    else if (line["url"] == "/v1/chat/completions") ep = Endpoint::kChatCompletions;
    else bad("url", "\"url\" ", json_excerpt(line["url"]), " is not served: flexh2o serves \"/v1/completions\" and "
                    "\"/v1/chat/completions\"");
    if (!line.contains("body")) bad("body", "missing \"body\"");
    if (!line["body"].is_object()) bad("body", "\"body\" must be an object, got ", json_excerpt(line["body"]));
    out.request = parse_body(line["body"], ep, hooks, stream);
    out.request->custom_id = line["custom_id"].get<std::string>();
  } catch (const BadRequest& b) {
    out.error = b.e;
  } catch (const std::exception& e) {  // the tokenizer's own failures
    out.error = RequestError{e.what(), std::nullopt};
  }
  return out;
}

std::string IdMaker::next(std::string_view prefix) {
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return std::string(prefix) + hex;
}

json success_line(const Request& r, const std::vector<Choice>& choices, int64_t prompt_tokens,
                  const std::string& model_name, int64_t created, IdMaker& ids, const TokenText& piece) {
  const bool chat = r.endpoint == Endpoint::kChatCompletions;
  json cs = json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json o{{"index", i},
           {"logprobs", r.logprobs >= 0 ? logprobs_of(c, chat, piece) : json()},
           {"finish_reason", c.stopped ? "stop" : "length"}};
    if (chat) o["message"] = json{{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    else o["text"] = c.text;
    cs.push_back(std::move(o));
    completion_tokens += c.completion_tokens;
  }
  json body{{"id", ids.next(chat ? "chatcmpl-" : "cmpl-")},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", created},
            {"model", r.model.value_or(model_name)},
            {"choices", std::move(cs)},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}}}};
  return json{{"id", ids.next("batch_req_")},
              {"custom_id", r.custom_id},
              {"response", {{"status_code", 200}, {"request_id", ids.next("")}, {"body", std::move(body)}}},
              {"error", nullptr}};
}

std::vector<GenerationRequest> expand_request(const Request& r, const RunDefaults& d, const ModelConfig& c) {
  // 2^64 / golden ratio: odd, so no two choices of a line share a seed.
  constexpr uint64_t kChoiceSeedStride = 0x9E3779B97F4A7C15ull;
  auto refuse = [](std::optional<std::string> param, std::optional<std::string> code, auto&&... parts) {
    throw RefusedRequest(RequestError{detail::concat(parts...), std::move(param), std::move(code)});
  };
  // The prompts' ids and lengths, which parse_body cannot see: validate_request's checks of them.
  for (const auto& prompt : r.prompts) {
    GenerationRequest bare;
    bare.prompt_ids = prompt;
    try {
      validate_request(bare, c);
    } catch (const Error& e) {
      refuse(r.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt",
             int64_t(prompt.size()) > c.max_positions ? std::optional<std::string>("context_length_exceeded")
                                                      : std::nullopt,
             e.what());
    }
  }
  if (d.max_tokens_cap > 0 && r.max_tokens && *r.max_tokens > d.max_tokens_cap)
    refuse("max_tokens", std::nullopt, "max_tokens ", *r.max_tokens, " is more than this server's limit of ",
           d.max_tokens_cap, " (--max-new-tokens)");
  // As OpenAI and vLLM: a prompt and max_tokens longer than the context are refused, not cut (a
  // prompt longer than the positions by itself gets validate_request's message).
  for (const auto& prompt : r.prompts)
    if (const int64_t p = int64_t(prompt.size());
        r.max_tokens && p <= c.max_positions && p + *r.max_tokens > max_sequence_tokens(c))
      refuse("max_tokens", "context_length_exceeded", "a sequence of this model reaches at most ",
             max_sequence_tokens(c), " tokens (", c.max_positions,
             " positions, the last token drawn from the last one); the prompt of ", p, " tokens leaves room for ",
             max_sequence_tokens(c) - p, " more, and max_tokens asks ", *r.max_tokens);
  const uint64_t base = r.seed ? uint64_t(*r.seed) : d.seed;
  std::vector<GenerationRequest> out;
  for (const auto& prompt : r.prompts)
    for (int64_t k = 0; k < r.n; ++k) {
      GenerationRequest g;
      g.prompt_ids = prompt;
      int64_t rest = std::max<int64_t>(0, max_sequence_tokens(c) - int64_t(prompt.size()));
      if (d.max_tokens_cap > 0) rest = std::min(rest, d.max_tokens_cap);
      g.max_new_tokens = r.max_tokens.value_or(rest);
      g.sampling.temperature = d.greedy ? 0.f : r.temperature;
      g.sampling.top_k = r.top_k.value_or(d.top_k);
      g.sampling.top_p = r.top_p;
      g.sampling.min_p = r.min_p.value_or(d.min_p);
      g.sampling.repetition_penalty = r.repetition_penalty.value_or(d.repetition_penalty);
      g.sampling.presence_penalty = r.presence_penalty;
      g.sampling.logit_bias = r.logit_bias;
      g.sampling.frequency_penalty = r.frequency_penalty;
      g.sampling.seed = base + uint64_t(k) * kChoiceSeedStride;
      g.top_logprobs = r.logprobs;
      try {
        validate_request(g, c);
      } catch (const Error& e) {  // the prompt passed above: logit_bias's ids, which parse_body cannot check
        refuse(r.logit_bias.empty() ? std::nullopt : std::optional<std::string>("logit_bias"), std::nullopt, e.what());
      }
      out.push_back(std::move(g));
    }
  return out;
}

json result_line(const Request& r, std::span<const GenerationResult* const> results, const Decode& decode,
                 const TokenText& piece, const std::string& model_name, int64_t created, IdMaker& ids) {
  std::vector<Choice> choices;
  for (const GenerationResult* res : results) {
    choices.push_back(finish_choice(res->tokens, res->finish == FinishReason::kEos, decode, r.stop,
                                    r.skip_special_tokens));
    Choice& c = choices.back();
    with_logprobs(c, *res);
    if (!r.echo) continue;
    const size_t p = (choices.size() - 1) / size_t(std::max<int64_t>(r.n, 1));  // prompt-major, then n
    c.text = echoed_prompt(r, p, decode) + c.text;
    if (r.logprobs < 0) continue;
    c.prompt = r.prompts[p];
    if (p < r.prompt_scores.size()) c.prompt_scores = r.prompt_scores[p];
  }
  int64_t prompt_tokens = 0;
  for (const auto& p : r.prompts) prompt_tokens += int64_t(p.size());
  return success_line(r, choices, prompt_tokens, model_name, created, ids, piece);
}

void score_echoed_prompts(StepRunner& runner, std::span<Request* const> requests) {
  std::vector<LoglikRequest> scored;
  std::vector<std::pair<Request*, size_t>> of;  // (request, prompt) of each scored prompt
  for (Request* r : requests) {
    if (!r->scores_prompts()) continue;
    r->prompt_scores.assign(r->prompts.size(), {});
    for (size_t p = 0; p < r->prompts.size(); ++p) {
      const std::vector<int32_t>& ids = r->prompts[p];
      if (ids.size() < 2) continue;  // one token: nothing to score
      scored.push_back({{ids.front()}, {ids.begin() + 1, ids.end()}});
      of.emplace_back(r, p);
    }
  }
  if (scored.empty()) return;
  // One top-k for all: each request keeps its own number of alternatives.
  int top = 0;
  for (const auto& [r, p] : of) top = std::max(top, r->logprobs);
  std::vector<std::vector<ScoredToken>> got = score_tokens(runner, scored, top);
  for (size_t i = 0; i < got.size(); ++i) {
    auto [r, p] = of[i];
    for (ScoredToken& t : got[i]) t.top.resize(std::min(t.top.size(), size_t(r->logprobs)));
    r->prompt_scores[p] = std::move(got[i]);
  }
}

Decode decoder_of(const Tokenizer* t) {
  return [t](std::span<const int32_t> ids, bool skip_special) {
    return t ? t->decode(ids, skip_special) : std::string();
  };
}

TokenText token_text_of(const Tokenizer* t) {
  return [t](int32_t id) {
    if (!t) return TokenPiece{};
    return TokenPiece{t->decode(std::vector<int32_t>{id}), t->token_bytes(id), t->is_special(id)};
  };
}

std::string first_choice_text(const json& line) {
  const json& c = line["response"]["body"]["choices"][0];
  if (c.contains("message")) return c["message"].value("content", std::string());
  return c.value("text", std::string());
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v) {
  if (!v.is_object()) FH_FAIL("\"logit_bias\" must be an object of token ids to biases, got ", json_excerpt(v));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& item : v.items()) {
    const std::string& key = item.key();
    int64_t id = -1;
    const char* end = key.data() + key.size();
    const auto [at, ec] = std::from_chars(key.data(), end, id);
    if (ec != std::errc() || at != end || key.empty() || id < 0 || id > std::numeric_limits<int32_t>::max())
      FH_FAIL("\"logit_bias\": the key ", json(key).dump(), " is not a token id");
    if (!item.value().is_number())
      FH_FAIL("\"logit_bias\": the bias of token ", key, " must be a number, got ", json_excerpt(item.value()));
    const double b = item.value().get<double>();
    if (!(b >= -100 && b <= 100)) FH_FAIL("\"logit_bias\": the bias of token ", key, " must be in [-100, 100], got ", b);
    out.emplace_back(int32_t(id), float(b));
  }
  if (out.size() > 1024) FH_FAIL("\"logit_bias\" holds ", out.size(), " tokens, more than 1024");
  return out;
}

Hooks make_hooks(const Tokenizer* tokenizer, std::function<std::string(const nlohmann::ordered_json& body)> render_chat) {
  Hooks h;
  if (tokenizer)
    h.tokenize = [tokenizer](const std::string& text, bool add_special) { return tokenizer->encode(text, add_special); };
  h.render_chat = std::move(render_chat);
  return h;
}

std::vector<int32_t> chat_prompt_ids(const nlohmann::ordered_json& body, const Hooks& hooks, RequestError* error) {
  try {
    return chat_prompt(body, hooks);
  } catch (const BadRequest& b) {
    *error = b.e;
    return {};
  }
}

json error_line(const json& custom_id, const RequestError& e, IdMaker& ids) {
  json err{{"message", e.message}, {"type", "invalid_request_error"}};
  err["param"] = e.param ? json(*e.param) : json();
  err["code"] = e.code ? json(*e.code) : json();
  return json{{"id", ids.next("batch_req_")},
              {"custom_id", custom_id},
              {"response", {{"status_code", 400}, {"request_id", ids.next("")}, {"body", {{"error", err}}}}},
              {"error", nullptr}};
}

bool is_output_line(const json& line) {
  return line.is_object() && line.contains("custom_id") && line.contains("response") && line.contains("error");
}

std::optional<std::string> custom_id_key(const json& custom_id) {
  if (!custom_id.is_string() || custom_id.get_ref<const std::string&>().empty()) return std::nullopt;
  return custom_id.dump();
}

bool output_line_failed(const json& line) {
  const json& r = line["response"];
  return !line["error"].is_null() || !r.is_object() || !r.contains("status_code") || r["status_code"] != 200;
}

}  // namespace flexh2o::cli::openai_batch
