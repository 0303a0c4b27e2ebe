// OpenAI choices from generated tokens: the text without EOS and cut at stop strings, echoed
// prompts, and log-probabilities in each endpoint's shape (completions' tokens / text_offset,
// chat's content with bytes). Shared by Batch files, the server's streams and the Python API.
#include <algorithm>

#include "cli/openai_batch.h"
#include "core/error.h"
#include "core/input_guard.h"

namespace flexh2o::cli::openai_batch {

using nlohmann::json;

std::vector<std::string> parse_stop_strings(const nlohmann::json& s, size_t max_count, std::string_view what) {
  std::vector<std::string> out;
  const bool strings = s.is_array() && std::all_of(s.begin(), s.end(), [](const nlohmann::json& x) {
    return x.is_string();
  });
  if (s.is_string()) out.push_back(s.get<std::string>());
  else if (strings && (max_count == 0 || s.size() <= max_count))
    for (const nlohmann::json& x : s) out.push_back(x.get<std::string>());
  else
    FH_FAIL(what, " must be a string or an array of ",
            max_count ? detail::concat("up to ", max_count, " strings") : std::string("strings"), ", got ",
            json_excerpt(s));
  check_stop_strings(out, what);
  return out;
}

void check_stop_strings(const std::vector<std::string>& stop, std::string_view what) {
  for (const std::string& x : stop)
    if (x.empty()) FH_FAIL(what, ": an empty string would stop every sequence at once");
}

size_t first_stop_at(std::string_view text, const std::vector<std::string>& stop) {
  size_t at = std::string::npos;
  for (const std::string& s : stop) at = std::min(at, text.find(s));
  return at;
}

bool text_holds_stop(const Decode& decode, std::span<const int32_t> tokens, const std::vector<std::string>& stop,
                     bool skip_special) {
  return !stop.empty() && first_stop_at(decode(tokens, skip_special), stop) != std::string::npos;
}

Choice finish_choice(std::span<const int32_t> tokens, bool eos, const Decode& decode_with,
                     const std::vector<std::string>& stop, bool skip_special) {
  const std::span<const int32_t> body = eos && !tokens.empty() ? tokens.first(tokens.size() - 1) : tokens;
  auto decode = [&](std::span<const int32_t> ids) { return decode_with(ids, skip_special); };
  Choice c{decode(body), int64_t(tokens.size()), eos, {}, {}, {}, {}, {}};
  c.skip_special = skip_special;
  auto first_stop = [&](const std::string& text) { return first_stop_at(text, stop); };
  if (stop.empty() || first_stop(c.text) == std::string::npos) return c;
  // Generation stops once a stop string is complete: the fewest tokens whose text holds one.
  size_t lo = 1, hi = body.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (first_stop(decode(body.first(mid))) != std::string::npos) hi = mid;
    else lo = mid + 1;
  }
  const std::string text = decode(body.first(lo));
  c.text = text.substr(0, first_stop(text));
  c.completion_tokens = int64_t(lo);
  c.stopped = true;
  // The fewest tokens whose text reaches the cut: the others lie wholly in or after the stop.
  size_t k = 0;
  for (size_t hi2 = lo; k < hi2;) {
    const size_t mid = k + (hi2 - k) / 2;
    if (decode(body.first(mid)).size() >= c.text.size()) hi2 = mid;
    else k = mid + 1;
  }
  c.text_tokens = int64_t(k);
  return c;
}

std::string echoed_prompt(const Request& r, size_t p, const Decode& decode) {
  // Token ids as the model reads them, special ones too: the text the prompt's logprobs offset.
  return p < r.prompt_texts.size() && r.prompt_texts[p] ? *r.prompt_texts[p] : decode(r.prompts[p], false);
}

void with_logprobs(Choice& c, const GenerationResult& r) {
  if (r.logprobs.empty()) return;
  size_t n = std::min(size_t(c.text_tokens >= 0 ? c.text_tokens : c.completion_tokens), r.tokens.size());
  if (r.finish == FinishReason::kEos && n == r.tokens.size() && n > 0) --n;  // EOS has no text
  n = std::min(n, r.logprobs.size());
  c.tokens.assign(r.tokens.begin(), r.tokens.begin() + std::ptrdiff_t(n));
  c.logprobs.assign(r.logprobs.begin(), r.logprobs.begin() + std::ptrdiff_t(n));
  if (!r.top_logprobs.empty())
    c.top_logprobs.assign(r.top_logprobs.begin(),
                          r.top_logprobs.begin() + std::ptrdiff_t(std::min(n, r.top_logprobs.size())));
}

namespace {

json bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char ch : b) a.push_back(int(ch));
  return a;
}

}  // namespace

json logprobs_of(const Choice& c, bool chat, const TokenText& piece, int64_t* chars_before) {
  auto of = [&](int32_t id) { return piece ? piece(id) : TokenPiece{}; };
  if (chat) {
    json content = json::array();
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const TokenPiece t = of(c.tokens[i]);
      json alts = json::array();
      if (i < c.top_logprobs.size())
        for (const TokenLogprob& a : c.top_logprobs[i]) {
          const TokenPiece at = of(a.id);
          alts.push_back({{"token", at.text}, {"logprob", a.logprob}, {"bytes", bytes_json(at.bytes)}});
        }
      content.push_back(
          {{"token", t.text}, {"logprob", c.logprobs[i]}, {"bytes", bytes_json(t.bytes)}, {"top_logprobs", alts}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  // text_offset in characters (code points) of the completion text, as OpenAI and vLLM count:
  // a token that starts inside a character (a byte-level piece of it) gets that character's.
  // An echoed prompt's tokens come first; its first token has no log-probability (null).
  json tokens = json::array(), logprobs = json::array(), top = json::array(), offsets = json::array();
  int64_t local = 0;
  int64_t& chars = chars_before ? *chars_before : local;  // characters begun before this token
  auto add = [&](int32_t id, json logprob, const std::vector<TokenLogprob>* alts, bool generated, bool first) {
    const TokenPiece t = of(id);
    tokens.push_back(t.text);
    logprobs.push_back(logprob);
    const bool inside = !t.bytes.empty() && (static_cast<unsigned char>(t.bytes[0]) & 0xC0) == 0x80;
    offsets.push_back(std::max<int64_t>(chars - (inside ? 1 : 0), 0));
    // Not in `text`: a skipped token's text, and the BOS the tokenizer put before a text prompt.
    const bool absent = t.special && ((generated && c.skip_special) || (first && !c.text.starts_with(t.bytes)));
    if (!absent)
      for (unsigned char ch : t.bytes) chars += (ch & 0xC0) != 0x80;
    // The alternatives and, as OpenAI always returns it, the token itself (up to logprobs + 1).
    json o = alts ? json::object() : json();
    if (alts) {
      for (const TokenLogprob& a : *alts) o[of(a.id).text] = a.logprob;
      if (!o.contains(t.text)) o[t.text] = logprob;
    }
    top.push_back(std::move(o));
  };
  static const std::vector<TokenLogprob> none;
  for (size_t i = 0; i < c.prompt.size(); ++i) {
    const ScoredToken* s = i > 0 && i - 1 < c.prompt_scores.size() ? &c.prompt_scores[i - 1] : nullptr;
    add(c.prompt[i], s ? json(s->logprob) : json(), s ? &s->top : nullptr, false, i == 0);
  }
  for (size_t i = 0; i < c.tokens.size(); ++i)
    add(c.tokens[i], c.logprobs[i], i < c.top_logprobs.size() ? &c.top_logprobs[i] : &none, true, false);
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace flexh2o::cli::openai_batch
