// Answers to OpenAI requests while their engine call runs: a streamed request's chunks ("stream":
// true, server-sent events) as its tokens are drawn, and every request's output line as soon as
// its last choice ends, instead of when the whole call ends. Plain values and callbacks, no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/openai_batch.h"

namespace flexh2o::cli::openai_batch {

// The text of one streamed choice that has been sent. Text is sent only while it stays a
// prefix of what follows: a trailing partial character (U+FFFD from a split UTF-8 sequence) and
// the last `holdback` bytes (where a stop string may be starting) wait for later tokens.
class StreamText {
 public:
  // `text`: the decoded tokens so far (no stop string complete in it). Returns the new text to
  // send (empty: nothing yet).
  std::string next(std::string_view text, size_t holdback);
  // The choice's final text (finish_choice's): what has not been sent. Sent text is never taken
  // back; in the rare case that it is not a prefix of `final_text` (a tokenizer that rewrites
  // earlier text), the rest is `final_text` past the sent length.
  std::string rest(std::string_view final_text);
  const std::string& sent() const { return sent_; }

 private:
  std::string sent_;
};

// The bytes held back for stop strings: the longest one's length minus one.
size_t stop_holdback(const std::vector<std::string>& stop);

// One chunk of a streamed response: completions {"object": "text_completion", choices[{index,
// text, logprobs, finish_reason}]}, chat {"object": "chat.completion.chunk", choices[{index,
// delta: {role?, content?}, logprobs, finish_reason}]}. `finish`: null while the choice runs.
// `logprobs`: the chunk's tokens' (logprobs_of()), null without. With
// stream_options.include_usage every chunk has "usage": null.
nlohmann::json stream_chunk(const Request& r, const std::string& id, int64_t created, const std::string& model_name,
                            int64_t index, std::string_view text, const char* finish, bool role = false,
                            nlohmann::json logprobs = nullptr);
// The last chunk under stream_options.include_usage: no choices, the request's usage.
nlohmann::json usage_chunk(const Request& r, const std::string& id, int64_t created, const std::string& model_name,
                           int64_t prompt_tokens, int64_t completion_tokens);

// The bookkeeping of one engine call: which engine requests belong to which line, what each
// streamed choice has sent. Its on_token / on_result are GenerateOptions::ends_at / on_result.
// Not thread-safe: the generation thread calls it; `emit` runs on that thread.
class LiveAnswers {
 public:
  enum class Event { kChunk, kLine, kDefer, kAlive };
  // (line, kChunk, a chunk's JSON), (line, kLine, the line's output line), (line, kDefer, "":
  // the line does not run in this call) or (line, kAlive, "": asked every kAliveEvery tokens of
  // a line that is not streamed). A false return for a chunk or kAlive means its client has
  // gone: the line's choices end at their next token.
  using Emit = std::function<bool(size_t line, Event kind, const std::string& payload)>;
  static constexpr size_t kAliveEvery = 8;
  LiveAnswers(Emit emit, Decode decode, TokenText piece, std::string model_name, int64_t created, IdMaker& ids);

  // Line `line` runs as engine requests [first, first + count) (expand_request's order); for a
  // streamed chat request its role chunks are emitted now. `r` must outlive this object.
  void add(size_t line, const Request& r, size_t first, size_t count);
  // A line that cannot run: its error line, emitted now.
  void fail(size_t line, nlohmann::json error_line);
  // A line left for a later call: kDefer, emitted now.
  void defer(size_t line);
  // ends_at: true when request `req`'s text holds a stop string or its client has gone; a
  // streamed choice's new text is emitted, with logprobs those of the tokens it completes (a
  // token goes out with the chunk that sends the last of its text). A streamed "echo" choice
  // sends its prompt first, so the chunks add up to the plain answer.
  bool on_token(size_t req, const GenerationResult& res);
  // on_result: a streamed choice's last chunk; once a line's choices have all ended, its
  // output line (a streamed one first gets its usage chunk when asked). `res` must stay valid
  // until the line ends (the driver's results do).
  void on_result(size_t req, const GenerationResult& res);
  // Line i's output line once emitted; null before.
  const nlohmann::json& line(size_t i) const;
  // Engine requests ended because their client had gone.
  int64_t cancelled() const { return cancelled_; }

 private:
  struct Line {
    const Request* r = nullptr;
    size_t first = 0, count = 0, ended = 0;
    std::string stream_id;
    bool gone = false;
    nlohmann::json out;
  };
  struct Choice {
    size_t line = 0;
    StreamText text;
    const GenerationResult* res = nullptr;
    size_t tokens_sent = 0;   // tokens whose log-probabilities went out
    int64_t chars_sent = 0;   // their characters (text_offset of the next)
    bool echoed = false;      // an "echo" choice's prompt chunk went out
  };
  bool chunk(Line& l, const nlohmann::json& c);
  // A streamed "echo" choice's first chunk, before its first generated text: the prompt's text
  // and, with logprobs, its tokens and scores (Request::prompt_scores, filled by then). False
  // once the client has gone.
  bool echo_prompt(Choice& ch, Line& l, size_t req);
  // The logprobs of a streamed choice's tokens [ch.tokens_sent, end) (null without logprobs).
  nlohmann::json logprobs_upto(Choice& ch, const Request& r, const GenerationResult& res, size_t end);

  Emit emit_;
  Decode decode_;
  TokenText piece_;
  std::string model_name_;
  int64_t created_;
  IdMaker& ids_;
  std::vector<Line> lines_;
  std::vector<Choice> choices_;  // by engine request
  int64_t cancelled_ = 0;
};

}  // namespace flexh2o::cli::openai_batch
