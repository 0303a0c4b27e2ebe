// OpenAI Batch API files for `flexh2o generate`: one input line ({"custom_id", "method", "url",
// "body"} for /v1/completions or /v1/chat/completions) parsed into a request or an OpenAI-shaped
// error, and one output line ({"id", "custom_id", "response": {"status_code", "request_id",
// "body"}, "error": null}) built from the generated choices. Plain values and functions, no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/evaluate.h"
#include "engine/generate.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli::openai_batch {

enum class Endpoint { kCompletions, kChatCompletions };

// What a valid line asks for. Prompts are token ids, ready for the engine.
struct Request {
  std::string custom_id;
  Endpoint endpoint = Endpoint::kCompletions;
  std::optional<std::string> model;         // body.model: echoed back, never used to pick a model
  std::vector<std::vector<int32_t>> prompts;  // several only for a completions array of prompts
  // Completions: each prompt as the body gave it when it was a string (what "echo" returns, as
  // OpenAI's API does: no BOS text); nullopt for token ids, which echo as their decoded text.
  std::vector<std::optional<std::string>> prompt_texts;
  int64_t n = 1;                            // choices per prompt
  std::optional<int64_t> max_tokens;        // absent (chat only): up to the model's context
  float temperature = 1.0f, top_p = 1.0f;   // OpenAI's defaults
  float presence_penalty = 0.f, frequency_penalty = 0.f;  // in [-2, 2], over the generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;      // SamplingParams::logit_bias
  // vLLM's extra sampling parameters; absent: RunDefaults' (the CLI's flags).
  std::optional<int32_t> top_k;                             // 0: off (vLLM's -1 too)
  std::optional<float> min_p, repetition_penalty;
  // -1: none; else per-token log-probabilities with this many alternatives (completions:
  // "logprobs" 0..5; chat: "logprobs": true and "top_logprobs" 0..20).
  int logprobs = -1;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;            // up to 4 non-empty strings
  // "stream": true and stream_options.include_usage (a server's; Batch files refuse them).
  bool stream = false, include_usage = false;
  // Completions "echo": each choice's text (and with logprobs its tokens) begins with its prompt.
  bool echo = false;
  // vLLM's skip_special_tokens (default true, as there): choices' text leaves special tokens'
  // text out (stop strings are found in that text); their logprobs still name every token.
  bool skip_special_tokens = true;
  // With echo and logprobs: per prompt, the scores of its tokens after the first (the first has
  // none), which score_echoed_prompts() fills before the output line is built.
  std::vector<std::vector<ScoredToken>> prompt_scores;
  bool scores_prompts() const { return echo && logprobs >= 0; }
};

// Why a line cannot run: OpenAI's error object, sent as a 400 response.
struct RequestError {
  std::string message;
  std::optional<std::string> param;  // the field at fault ("body.n" is written "n", as OpenAI does)
  // OpenAI's machine-readable code where it has one: "context_length_exceeded" (clients such as
  // LangChain map it to a context-overflow error); null otherwise.
  std::optional<std::string> code = std::nullopt;
};

// What expand_request throws for a request it refuses: the message, and the error's param/code.
class RefusedRequest : public Error {
 public:
  explicit RefusedRequest(RequestError e) : Error(e.message), error(std::move(e)) {}
  RequestError error;
};

struct Parsed {
  nlohmann::json custom_id;              // as the line gives it (null when absent)
  std::optional<Request> request;        // exactly one of request and error is set
  std::optional<RequestError> error;
};

// What parsing needs from the model. Both may be null: a prompt that needs one then fails.
struct Hooks {
  // Text -> token ids (add_special: BOS/EOS per the tokenizer's convention).
  std::function<std::vector<int32_t>(const std::string& text, bool add_special)> tokenize;
  // A chat body -> prompt text (GenerateArgs::render_chat); may throw. Its objects keep the
  // line's key order, as a template's tojson shows it. It applies the body's (checked)
  // add_generation_prompt, continue_final_message and chat_template_kwargs.
  std::function<std::string(const nlohmann::ordered_json& body)> render_chat;
  // Whether the caller scores echoed prompts (score_echoed_prompts), so that "echo" may come with
  // "logprobs"; else that pair is refused (a pipeline's stages).
  bool score_prompts = false;
};

// OpenAI's logit_bias object ({"50256": -100, ...}: token ids as decimal strings, biases in
// [-100, 100], at most 1024) as SamplingParams::logit_bias; throws Error naming what is wrong.
// Ids are checked against the vocabulary later (validate_request).
std::vector<std::pair<int32_t, float>> parse_logit_bias(const nlohmann::json& v);

// Hooks over a tokenizer (null: none, a preset without one) and a chat renderer (may be null).
Hooks make_hooks(const Tokenizer* tokenizer, std::function<std::string(const nlohmann::ordered_json& body)> render_chat);

// True for a line in the Batch input format: an object with "custom_id", "method", "url" or
// "body" (flexh2o's own request lines use none of them).
bool is_input_line(const nlohmann::json& line);

// Checks one input line and tokenizes its prompt(s), calling the hooks on this thread before it
// returns (at most one render_chat call). Never throws for bad input: every problem
// (method, url, body, types, ranges, parameters flexh2o cannot honour, unknown body keys, a chat
// line without render_chat or whose hook throws) becomes the error, naming the field.
// `stream`: "stream" and "stream_options" are honoured (a server); else only their defaults pass.
Parsed parse_input_line(const nlohmann::ordered_json& line, const Hooks& hooks, bool stream = false);

// What a request runs with besides its body: the CLI's sampling flags that are not OpenAI
// parameters (top_k, min_p and repetition_penalty are the defaults of vLLM's body parameters),
// the base seed of a body without "seed", and an optional cap on max_tokens.
struct RunDefaults {
  bool greedy = false;  // temperature 0 whatever the body says
  int top_k = 0;
  float min_p = 0.f, repetition_penalty = 1.f;
  uint64_t seed = 0;
  // > 0: the most tokens a request may generate (a server's bound): a larger max_tokens is
  // refused, and a chat body without one gets up to this many. 0: the model's context.
  int64_t max_tokens_cap = 0;
};

// A valid request's engine requests: one per prompt and choice, prompt-major. Choice k draws
// from (body seed, else defaults.seed) + k * an odd constant, so choice 0 uses the base seed.
// Throws RefusedRequest (validate_request's message, or the cap's, with the field at fault;
// "context_length_exceeded" where the prompt, or the prompt and max_tokens, pass the context)
// when one cannot run on `c`.
std::vector<GenerationRequest> expand_request(const Request& r, const RunDefaults& defaults, const ModelConfig& c);

// Fills r.prompt_scores when r.scores_prompts() (score_tokens() of every prompt's tokens after its
// first, with r.logprobs alternatives), on `runner` between generation calls. Blocking; throws
// what the runner throws.
void score_echoed_prompts(StepRunner& runner, std::span<Request* const> requests);

// The prompt of a chat request: its "messages" checked, rendered by hooks.render_chat and
// tokenized without adding BOS/EOS; empty, with *error set (param "messages"), when it cannot be.
std::vector<int32_t> chat_prompt_ids(const nlohmann::ordered_json& body, const Hooks& hooks, RequestError* error);

// Where the first of the stop strings starts in `text`; npos when none occurs.
size_t first_stop_at(std::string_view text, const std::vector<std::string>& stop);

// Stop strings as a request gives them (a Batch body's "stop", a flexh2o line's): a string or an
// array of strings, at most max_count of them (0: any number), none empty. Throws Error naming
// `what` ("\"stop\"", "field \"stop\"").
std::vector<std::string> parse_stop_strings(const nlohmann::json& s, size_t max_count, std::string_view what);
// Throws Error naming `what` if a stop string is empty (it would stop every sequence at once).
void check_stop_strings(const std::vector<std::string>& stop, std::string_view what);

// One generated choice, cut at the first stop string.
struct Choice {
  std::string text;  // with echo, the prompt's text first
  int64_t completion_tokens = 0;  // tokens generated up to the stop (EOS counted)
  bool stopped = false;           // EOS or a stop string: "stop"; else "length"
  // With Request::logprobs >= 0 (with_logprobs): the tokens of `text` and their log-probabilities.
  std::vector<int32_t> tokens{};
  std::vector<float> logprobs{};
  std::vector<std::vector<TokenLogprob>> top_logprobs{};
  // With echo and logprobs: the prompt's tokens and the scores of all but the first.
  std::vector<int32_t> prompt{};
  std::vector<ScoredToken> prompt_scores{};
  // Cut at a stop string: the tokens whose text begins before the cut (those the logprobs list,
  // as their texts then add up to `text`); -1: completion_tokens.
  int64_t text_tokens = -1;
  // `text` leaves special tokens' text out (skip_special_tokens): their text_offset takes no room.
  bool skip_special = false;
};
// Token ids -> text; skip_special leaves special tokens' text out (Tokenizer::decode).
using Decode = std::function<std::string(std::span<const int32_t> ids, bool skip_special)>;
// `tokens` as generated (ending in EOS when `eos`): the text without EOS (and without every
// special token's text when skip_special), cut before the first occurrence of any stop string;
// then the tokens counted are those needed to produce that stop, and text_tokens those that
// begin before it.
Choice finish_choice(std::span<const int32_t> tokens, bool eos, const Decode& decode,
                     const std::vector<std::string>& stop, bool skip_special);
// The text "echo" puts before prompt p's completion (Request::prompt_texts; token ids decoded
// with their special tokens, BOS included).
std::string echoed_prompt(const Request& r, size_t p, const Decode& decode);
// Adds r's log-probabilities (when it has them) for the tokens `c` counts, EOS left out.
void with_logprobs(Choice& c, const GenerationResult& r);
// A token's text (valid UTF-8: a partial sequence's bytes become U+FFFD, as Tokenizer::decode
// gives them) and its bytes (Tokenizer::token_bytes).
struct TokenPiece {
  std::string text, bytes;
  bool special = false;  // Tokenizer::is_special
};
using TokenText = std::function<TokenPiece(int32_t id)>;

// A choice's "logprobs" in its endpoint's shape (chat: content[{token, logprob, bytes,
// top_logprobs}]; completions: tokens, token_logprobs, top_logprobs as {token: logprob}, and
// text_offset in characters, an echoed prompt's tokens first). `chars_before` (optional): the
// characters before the first token (a streamed chunk's), advanced past its tokens.
nlohmann::json logprobs_of(const Choice& c, bool chat, const TokenText& piece, int64_t* chars_before = nullptr);

// Decode and TokenText of a tokenizer; both give empty text when `t` is null (a preset without one).
Decode decoder_of(const Tokenizer* t);
TokenText token_text_of(const Tokenizer* t);
// Whether the text of `tokens` (skip_special: without special tokens' text) holds one of `stop`:
// the one test that ends a request at a stop string (GenerateOptions::ends_at) wherever it runs.
bool text_holds_stop(const Decode& decode, std::span<const int32_t> tokens, const std::vector<std::string>& stop,
                     bool skip_special);
// The text of a result line's first choice (completions: "text"; chat: message.content).
std::string first_choice_text(const nlohmann::json& line);

// Unique ids for output lines ("batch_req_…", request ids, "cmpl-…"): 96 random bits each from a
// generator seeded once per run. Not thread-safe.
class IdMaker {
 public:
  explicit IdMaker(uint64_t seed) : rng_(seed) {}
  std::string next(std::string_view prefix);

 private:
  std::mt19937_64 rng_;
};

// The output line of a request that ran: choices in order (prompt-major, then n), usage, and
// `model_name` as body.model when the request gave none. `created`: Unix seconds. With
// Request::logprobs, each choice's "logprobs" in its endpoint's shape (chat: content[{token,
// logprob, bytes, top_logprobs}]; completions: tokens, token_logprobs, top_logprobs as
// {token: logprob}, text_offset in characters of the text), token text from `piece` (empty
// without one).
nlohmann::json success_line(const Request& r, const std::vector<Choice>& choices, int64_t prompt_tokens,
                            const std::string& model_name, int64_t created, IdMaker& ids,
                            const TokenText& piece = {});
// The output line of a request that ran, from its engine results (expand_request's order):
// each choice cut at the stop strings, with its log-probabilities when asked, and the usage.
nlohmann::json result_line(const Request& r, std::span<const GenerationResult* const> results, const Decode& decode,
                           const TokenText& piece, const std::string& model_name, int64_t created, IdMaker& ids);

// The output line of a request that could not run: response.status_code 400 and
// response.body.error {message, type: "invalid_request_error", param, code}, as OpenAI
// writes per-request failures (the top-level "error" is only for expired/cancelled batches).
nlohmann::json error_line(const nlohmann::json& custom_id, const RequestError& e, IdMaker& ids);

// For --resume: true for an object shaped like a Batch output line (a "custom_id", a "response"
// and an "error" member; the custom_id is null or as the input gave it where that line had no
// usable one); `failed` when it carries no 200 response.
bool is_output_line(const nlohmann::json& line);
// A custom_id that identifies a request (a non-empty string): its key for --resume, else none.
std::optional<std::string> custom_id_key(const nlohmann::json& custom_id);
bool output_line_failed(const nlohmann::json& line);

}  // namespace flexh2o::cli::openai_batch
