// Streamed chunks and early output lines of OpenAI requests (openai_stream.h).
#include "cli/openai_stream.h"

#include <algorithm>

#include "core/error.h"

namespace flexh2o::cli::openai_batch {
namespace {
using nlohmann::json;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD: a split UTF-8 sequence

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// A chunk of r's stream around `choices` (both chunk kinds share it).
json envelope(const Request& r, const std::string& id, int64_t created, const std::string& model_name, json choices) {
  return json{{"id", id},
              {"object", r.endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", r.model.value_or(model_name)},
              {"choices", std::move(choices)}};
}

}  // namespace

std::string StreamText::next(std::string_view text, size_t holdback) {
  size_t cut = text.size() > holdback ? text.size() - holdback : 0;
  while (cut > 0 && cut < text.size() && is_continuation(text[cut])) --cut;  // whole characters only
  std::string_view ready = text.substr(0, cut);
  while (ready.ends_with(kReplacement)) ready.remove_suffix(kReplacement.size());
  if (ready.size() <= sent_.size() || !ready.starts_with(sent_)) return {};
  std::string delta(ready.substr(sent_.size()));
  sent_.assign(ready);
  return delta;
}

std::string StreamText::rest(std::string_view final_text) {
  std::string delta = final_text.size() > sent_.size() ? std::string(final_text.substr(sent_.size())) : std::string();
  sent_.append(delta);
  return delta;
}

size_t stop_holdback(const std::vector<std::string>& stop) {
  size_t n = 0;
  for (const std::string& s : stop) n = std::max(n, s.size());
  return n > 0 ? n - 1 : 0;
}

json stream_chunk(const Request& r, const std::string& id, int64_t created, const std::string& model_name,
                  int64_t index, std::string_view text, const char* finish, bool role, json logprobs) {
  const bool chat = r.endpoint == Endpoint::kChatCompletions;
  json c{{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish ? json(finish) : json()}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = std::string(text);
    c["delta"] = std::move(delta);
  } else {
    c["text"] = std::string(text);
  }
  json out = envelope(r, id, created, model_name, json::array({std::move(c)}));
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk(const Request& r, const std::string& id, int64_t created, const std::string& model_name,
                 int64_t prompt_tokens, int64_t completion_tokens) {
  json out = envelope(r, id, created, model_name, json::array());
  out["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  return out;
}

LiveAnswers::LiveAnswers(Emit emit, Decode decode, TokenText piece, std::string model_name, int64_t created,
                         IdMaker& ids)
    : emit_(std::move(emit)), decode_(std::move(decode)), piece_(std::move(piece)),
      model_name_(std::move(model_name)), created_(created), ids_(ids) {}

bool LiveAnswers::chunk(Line& l, const json& c) {
  if (l.gone) return false;
  if (emit_ && !emit_(size_t(&l - lines_.data()), Event::kChunk, c.dump(-1, ' ', false, json::error_handler_t::replace)))
    l.gone = true;
  return !l.gone;
}

void LiveAnswers::add(size_t line, const Request& r, size_t first, size_t count) {
  FH_CHECK(count > 0, "a line runs as at least one engine request");
  if (lines_.size() <= line) lines_.resize(line + 1);
  if (choices_.size() < first + count) choices_.resize(first + count);
  Line& l = lines_[line];
  l.r = &r;
  l.first = first;
  l.count = count;
  for (size_t k = 0; k < count; ++k) choices_[first + k].line = line;
  if (!r.stream) return;
  l.stream_id = ids_.next(r.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-");
  if (r.endpoint == Endpoint::kChatCompletions)
    for (size_t k = 0; k < count; ++k)
      chunk(l, stream_chunk(r, l.stream_id, created_, model_name_, int64_t(k), "", nullptr, true));
}

void LiveAnswers::fail(size_t line, json error_line) {
  if (lines_.size() <= line) lines_.resize(line + 1);
  lines_[line].out = std::move(error_line);
  if (emit_) emit_(line, Event::kLine, lines_[line].out.dump(-1, ' ', false, json::error_handler_t::replace));
}

void LiveAnswers::defer(size_t line) {
  if (emit_) emit_(line, Event::kDefer, std::string());
}

json LiveAnswers::logprobs_upto(Choice& ch, const Request& r, const GenerationResult& res, size_t end) {
  if (r.logprobs < 0) return nullptr;
  openai_batch::Choice part;
  part.skip_special = r.skip_special_tokens;
  end = std::min({end, res.tokens.size(), res.logprobs.size()});
  const size_t from = std::min(ch.tokens_sent, end);
  part.tokens.assign(res.tokens.begin() + std::ptrdiff_t(from), res.tokens.begin() + std::ptrdiff_t(end));
  part.logprobs.assign(res.logprobs.begin() + std::ptrdiff_t(from), res.logprobs.begin() + std::ptrdiff_t(end));
  if (res.top_logprobs.size() >= end)
    part.top_logprobs.assign(res.top_logprobs.begin() + std::ptrdiff_t(from),
                             res.top_logprobs.begin() + std::ptrdiff_t(end));
  ch.tokens_sent = std::max(ch.tokens_sent, end);
  return logprobs_of(part, r.endpoint == Endpoint::kChatCompletions, piece_, &ch.chars_sent);
}

bool LiveAnswers::echo_prompt(Choice& ch, Line& l, size_t req) {
  const Request& r = *l.r;
  if (!r.stream || !r.echo || ch.echoed) return !l.gone;
  ch.echoed = true;
  const size_t p = (req - l.first) / size_t(std::max<int64_t>(r.n, 1));  // prompt-major, then n
  json logprobs;
  if (r.logprobs >= 0) {
    openai_batch::Choice part;
    part.prompt = r.prompts[p];
    if (p < r.prompt_scores.size()) part.prompt_scores = r.prompt_scores[p];
    logprobs = logprobs_of(part, false, piece_, &ch.chars_sent);
  }
  return chunk(l, stream_chunk(r, l.stream_id, created_, model_name_, int64_t(req - l.first),
                               openai_batch::echoed_prompt(r, p, decode_), nullptr, false, std::move(logprobs)));
}

bool LiveAnswers::on_token(size_t req, const GenerationResult& res) {
  Choice& ch = choices_.at(req);
  Line& l = lines_[ch.line];
  const Request& r = *l.r;
  // A plain answer's client is asked after every kAliveEvery tokens of each choice (a question is
  // a call into the server, which takes its lock).
  const bool ask = !r.stream && emit_ && res.tokens.size() % kAliveEvery == 1;
  if (l.gone || !echo_prompt(ch, l, req) || (ask && !emit_(ch.line, Event::kAlive, {}) && (l.gone = true))) {
    ++cancelled_;
    return true;
  }
  if (r.stop.empty() && !r.stream) return false;
  const std::string text = decode_(res.tokens, r.skip_special_tokens);
  if (!r.stop.empty() && first_stop_at(text, r.stop) != std::string::npos) return true;
  if (!r.stream) return false;
  const std::string delta = ch.text.next(text, stop_holdback(r.stop));
  if (delta.empty()) return false;
  // The tokens whose text has now gone out in full.
  size_t done = ch.tokens_sent;
  if (r.logprobs >= 0)
    while (done < res.tokens.size() &&
           decode_(std::span(res.tokens).first(done + 1), r.skip_special_tokens).size() <= ch.text.sent().size())
      ++done;
  if (!chunk(l, stream_chunk(r, l.stream_id, created_, model_name_, int64_t(req - l.first), delta, nullptr, false,
                             logprobs_upto(ch, r, res, done)))) {
    ++cancelled_;
    return true;
  }
  return false;
}

void LiveAnswers::on_result(size_t req, const GenerationResult& res) {
  Choice& ch = choices_.at(req);
  Line& l = lines_[ch.line];
  const Request& r = *l.r;
  ch.res = &res;
  if (r.stream) {
    echo_prompt(ch, l, req);
    openai_batch::Choice c =
        finish_choice(res.tokens, res.finish == FinishReason::kEos, decode_, r.stop, r.skip_special_tokens);
    with_logprobs(c, res);  // the tokens the plain answer lists (EOS left out)
    chunk(l, stream_chunk(r, l.stream_id, created_, model_name_, int64_t(req - l.first), ch.text.rest(c.text),
                          c.stopped ? "stop" : "length", false, logprobs_upto(ch, r, res, c.tokens.size())));
  }
  if (++l.ended < l.count) return;
  std::vector<const GenerationResult*> mine;
  for (size_t k = 0; k < l.count; ++k) mine.push_back(choices_[l.first + k].res);
  l.out = result_line(r, mine, decode_, piece_, model_name_, created_, ids_);
  if (r.stream && r.include_usage) {
    const json& usage = l.out["response"]["body"]["usage"];
    chunk(l, usage_chunk(r, l.stream_id, created_, model_name_, usage["prompt_tokens"].get<int64_t>(),
                         usage["completion_tokens"].get<int64_t>()));
  }
  if (emit_) emit_(ch.line, Event::kLine, l.out.dump(-1, ' ', false, json::error_handler_t::replace));
}

const json& LiveAnswers::line(size_t i) const {
  static const json kNone;
  return i < lines_.size() ? lines_[i].out : kNone;
}

}  // namespace flexh2o::cli::openai_batch
