// Streamed OpenAI answers (src/cli/openai_stream.h): the text a stream may send at each token
// against a real byte-level tokenizer (split characters, stop strings), the stream parameters'
// parsing, and LiveAnswers driven as the generation driver drives it.
#include "cli/openai_stream.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "cli_run.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli::openai_batch {
namespace {
using nlohmann::json;

const Tokenizer& opt_tokenizer() {
  static const Tokenizer t = Tokenizer::load(test::model_dir("tiny-opt"));
  return t;
}
std::string decode(std::span<const int32_t> ids) { return opt_tokenizer().decode(ids); }
Decode decode_fn() { return decoder_of(&opt_tokenizer()); }

// Text whose characters split across byte-level tokens (2-, 3- and 4-byte UTF-8).
const std::string kWide = "caf\xC3\xA9 \xE2\x98\x83 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 end";

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

TEST(OpenAiStream, DeltasAreWholeCharactersAndAddUpToTheText) {
  const std::vector<int32_t> ids = opt_tokenizer().encode(kWide, false);
  ASSERT_GT(ids.size(), 8u);
  for (size_t holdback : {size_t(0), size_t(1), size_t(3)}) {
    StreamText st;
    std::string got;
    int split = 0;  // prefixes that end inside a character
    for (size_t n = 1; n <= ids.size(); ++n) {
      const std::string text = decode(std::span(ids).first(n));
      split += text.ends_with("\xEF\xBF\xBD");
      const std::string d = st.next(text, holdback);
      EXPECT_TRUE(valid_utf8(d)) << n;
      EXPECT_EQ(d.find("\xEF\xBF\xBD"), std::string::npos) << "a split character was sent at token " << n;
      got += d;
      EXPECT_EQ(got, st.sent());
      EXPECT_TRUE(text.starts_with(got)) << n;
      if (!text.ends_with("\xEF\xBF\xBD")) {
        EXPECT_GE(got.size() + holdback + 3, text.size()) << n;
      }
    }
    EXPECT_GT(split, 0) << "the text must split a character somewhere, or this checks nothing";
    got += st.rest(decode(ids));
    EXPECT_EQ(got, kWide) << holdback;
  }
}

TEST(OpenAiStream, HoldbackKeepsAStopStringsStartUnsent) {
  StreamText st;
  EXPECT_EQ(st.next("Hello", 2), "Hel");
  EXPECT_EQ(st.next("Hello wo", 2), "lo ");
  EXPECT_EQ(st.rest("Hello "), "");  // the final text ends where the stop string began
  EXPECT_EQ(st.sent(), "Hello ");
  StreamText wide;  // the cut moves back to a character's first byte
  EXPECT_EQ(wide.next("a\xC3\xA9", 1), "a");
  EXPECT_EQ(wide.next("a\xC3\xA9zz", 1), "\xC3\xA9z");
  EXPECT_EQ(stop_holdback({"ab", "\n\n\n", "x"}), 2u);
  EXPECT_EQ(stop_holdback({}), 0u);
}

TEST(OpenAiStream, TextThatStopsBeingAPrefixWaits) {
  StreamText st;
  EXPECT_EQ(st.next("a b", 0), "a b");
  EXPECT_EQ(st.next("a,b", 0), "");  // rewritten earlier text: nothing more until it agrees
  EXPECT_EQ(st.next("a bc", 0), "c");
  EXPECT_EQ(st.rest("a bcd"), "d");
}

Hooks opt_hooks() {
  Hooks h;
  h.tokenize = [](const std::string& s, bool add) { return opt_tokenizer().encode(s, add); };
  h.render_chat = [](const json&) { return std::string("hi there"); };
  return h;
}
json line(const std::string& url, json body) {
  return json{{"custom_id", "c1"}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}};
}

TEST(OpenAiStream, StreamParametersParseOnlyWhereStreamingIsServed) {
  const json body{{"prompt", "In the beginning"}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  const Parsed served = parse_input_line(line("/v1/completions", body), opt_hooks(), true);
  ASSERT_TRUE(served.request) << served.error->message;
  EXPECT_TRUE(served.request->stream);
  EXPECT_TRUE(served.request->include_usage);
  const Parsed batch = parse_input_line(line("/v1/completions", body), opt_hooks());
  ASSERT_TRUE(batch.error);
  EXPECT_EQ(batch.error->param, "stream");
  auto refused = [](json b, const std::string& url, const std::string& needle, const std::string& param) {
    const Parsed p = parse_input_line(line(url, std::move(b)), opt_hooks(), true);
    ASSERT_TRUE(p.error) << needle;
    EXPECT_NE(p.error->message.find(needle), std::string::npos) << p.error->message;
    EXPECT_EQ(p.error->param, param);
  };
  refused({{"prompt", "x"}, {"stream", "yes"}}, "/v1/completions", "must be a boolean", "stream");
  refused({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, "/v1/completions",
          "only allowed with \"stream\": true", "stream_options");
  refused({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"chunk", 1}}}}, "/v1/completions",
          "takes \"include_usage\"", "stream_options");
  refused({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}}, "/v1/completions",
          "must be a boolean", "stream_options");
  EXPECT_TRUE(parse_input_line(line("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"echo", true}}),
                               opt_hooks(), true).request);
  // Log-probabilities stream (they go out with the chunks).
  EXPECT_TRUE(parse_input_line(line("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"logprobs", 1}}),
                               opt_hooks(), true).request);
  const Parsed off = parse_input_line(line("/v1/completions", {{"prompt", "x"}, {"stream", false}}), opt_hooks(), true);
  ASSERT_TRUE(off.request);
  EXPECT_FALSE(off.request->stream);
}

// LiveAnswers fed as the driver feeds it: on_token after each token that does not end a
// sequence, on_result when it ends; the events it emits, in order.
struct Recorder {
  std::vector<std::tuple<size_t, LiveAnswers::Event, json>> events;
  std::set<size_t> gone;  // lines whose client has left
  int alive_asked = 0;     // kAlive questions (lines not streamed)
  LiveAnswers::Emit emit() {
    return [this](size_t line, LiveAnswers::Event kind, const std::string& payload) {
      if (kind == LiveAnswers::Event::kAlive) {
        ++alive_asked;
        return !gone.contains(line);
      }
      events.emplace_back(line, kind, json::parse(payload));
      return !gone.contains(line);
    };
  }
  // Each choice's streamed text of `line`, and its finish reason.
  std::map<int64_t, std::pair<std::string, std::string>> streamed(size_t line, bool chat) const {
    std::map<int64_t, std::pair<std::string, std::string>> out;
    for (const auto& [l, kind, j] : events) {
      if (l != line || kind != LiveAnswers::Event::kChunk) continue;
      for (const json& c : j["choices"]) {
        auto& [text, fin] = out[c["index"].get<int64_t>()];
        text += chat ? c["delta"].value("content", std::string()) : c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) fin = c["finish_reason"].get<std::string>();
      }
    }
    return out;
  }
};

// Runs `gen[k]` (each choice's tokens; `eos` ends them with EOS 2) through `live` for requests
// [first, first + gen.size()), interleaved token by token as a batch runs them; with top >= 0
// each token gets a log-probability (and `top` alternatives) as the driver gives them.
void drive(LiveAnswers& live, size_t first, const std::vector<std::vector<int32_t>>& gen, const std::vector<int64_t>& max,
           std::vector<GenerationResult>& res, int top = -1) {
  res.resize(first + gen.size());
  std::vector<bool> ended(gen.size(), false);
  for (size_t t = 0;; ++t) {
    bool any = false;
    for (size_t k = 0; k < gen.size(); ++k) {
      if (ended[k]) continue;
      GenerationResult& r = res[first + k];
      r.tokens.push_back(gen[k][t]);
      if (top >= 0) r.logprobs.push_back(-0.125f * float(t + 1 + k));
      if (top > 0) {
        r.top_logprobs.emplace_back();
        for (int i = 0; i < top; ++i) r.top_logprobs.back().push_back({gen[k][t] + i, -0.125f * float(t + 1 + k + i)});
      }
      const bool eos = gen[k][t] == 2, length = int64_t(r.tokens.size()) >= max[k];
      const bool stop = !eos && !length && live.on_token(first + k, r);
      if (eos || length || stop) {
        r.finish = eos ? FinishReason::kEos : stop ? FinishReason::kStopped : FinishReason::kLength;
        r.finished = ended[k] = true;
        live.on_result(first + k, r);
      }
      any = any || !ended[k];
    }
    if (!any) return;
  }
}

// Streamed log-probabilities: each token goes out with the chunk that sends the last of its text,
// and the chunks' text, tokens, log-probabilities, alternatives and text offsets add up to the
// plain answer's (completions, chat, and completions with "echo" of a prompt that splits a
// character; a choice ended by a stop string).
TEST(OpenAiStream, StreamedLogprobsAddUpToThePlainAnswers) {
  const std::vector<int32_t> a = opt_tokenizer().encode(kWide + " and more", false);
  std::vector<int32_t> b = opt_tokenizer().encode(" short, then a stop and more", false);
  b.push_back(2);  // EOS
  const TokenText piece = token_text_of(&opt_tokenizer());
  enum Kind { kCompletions, kChat, kEcho };
  for (Kind kind : {kCompletions, kChat, kEcho}) {
    const bool chat = kind == kChat;
    Recorder rec;
    IdMaker ids(7);
    LiveAnswers live(rec.emit(), decode_fn(), piece, "tiny", 123, ids);
    json body{{"stream", true}, {"n", 2}, {"stop", " stop"}};
    if (chat) {
      body["messages"] = {{{"role", "user"}, {"content", "x"}}};
      body["logprobs"] = true;
      body["top_logprobs"] = 2;
    } else {
      body["prompt"] = kind == kEcho ? "\xE2\x98\x83 snow" : "x";
      body["logprobs"] = 2;
      body["echo"] = kind == kEcho;
    }
    Hooks hooks = opt_hooks();
    hooks.score_prompts = true;
    Parsed streamed = parse_input_line(line(chat ? "/v1/chat/completions" : "/v1/completions", body), hooks, true);
    ASSERT_TRUE(streamed.request) << streamed.error->message;
    if (kind == kEcho) {  // as score_echoed_prompts() leaves them: every token's but the first
      Request& r = *streamed.request;
      ASSERT_GT(r.prompts.at(0).size(), 3u);
      r.prompt_scores.assign(1, {});
      for (size_t t = 1; t < r.prompts[0].size(); ++t)
        r.prompt_scores[0].push_back({-0.5f * float(t), {{7, -0.25f}, {9, -0.75f * float(t)}}});
    }
    live.add(0, *streamed.request, 0, 2);
    std::vector<GenerationResult> res;
    drive(live, 0, {a, b}, {int64_t(a.size()), 100}, res, 2);
    const json& out = live.line(0);
    ASSERT_TRUE(out.is_object());
    for (int64_t k = 0; k < 2; ++k) {
      const json& want = out["response"]["body"]["choices"][size_t(k)]["logprobs"];
      json got = chat ? json{{"content", json::array()}} : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                                                                {"top_logprobs", json::array()}, {"text_offset", json::array()}};
      int chunks = 0;
      std::string text, token_bytes;  // sent so far: the text, and (chat) the bytes of the tokens sent
      for (const auto& [l, kind, j] : rec.events) {
        if (kind != LiveAnswers::Event::kChunk) continue;
        for (const json& c : j["choices"]) {
          if (c["index"] != k || c["logprobs"].is_null()) continue;
          ++chunks;
          text += chat ? c["delta"].value("content", std::string()) : c["text"].get<std::string>();
          for (auto& [key, arr] : got.items())
            for (const json& x : c["logprobs"][key]) arr.push_back(x);
          if (!chat) continue;
          for (const json& t : c["logprobs"]["content"])
            for (int byte : t["bytes"]) token_bytes.push_back(char(byte));
          // A token goes out with (or after) the last of its text, never before (the last chunk
          // also has the token that completed a stop string, whose text is cut, as the answer has).
          if (c["finish_reason"].is_null()) {
            EXPECT_TRUE(text.starts_with(token_bytes)) << "choice " << k << ": " << token_bytes << " | " << text;
          }
        }
      }
      const std::string what =
          std::string(chat ? "chat" : kind == kEcho ? "echo" : "completions") + " choice " + std::to_string(k);
      EXPECT_GT(chunks, 2) << what;
      if (chat) got["refusal"] = nullptr;
      EXPECT_EQ(got, want) << what;
      if (!chat) {
        EXPECT_EQ(text, out["response"]["body"]["choices"][size_t(k)]["text"]) << what;
      }
      if (kind == kEcho) {
        EXPECT_TRUE(want["token_logprobs"][0].is_null()) << what;
        EXPECT_EQ(want["token_logprobs"][1], -0.5) << what;
      }
      EXPECT_FALSE((chat ? want["content"] : want["tokens"]).empty()) << what;
    }
    EXPECT_EQ(out["response"]["body"]["choices"][1]["finish_reason"], "stop");
  }
}

TEST(OpenAiStream, LiveAnswersStreamChoicesAndAnswerEachLineWhenItsChoicesEnd) {
  const std::vector<int32_t> a = opt_tokenizer().encode(kWide + " and more", false);
  std::vector<int32_t> b = opt_tokenizer().encode(" short", false);
  b.push_back(2);  // EOS
  for (bool chat : {false, true}) {
    Recorder rec;
    IdMaker ids(7);
    LiveAnswers live(rec.emit(), decode_fn(), {}, "tiny", 123, ids);
    json body{{"stream", true}, {"n", 2}, {"stream_options", {{"include_usage", true}}}};
    if (chat) body["messages"] = {{{"role", "user"}, {"content", "x"}}};
    else body["prompt"] = "x";
    const Parsed streamed = parse_input_line(line(chat ? "/v1/chat/completions" : "/v1/completions", body),
                                             opt_hooks(), true);
    const Parsed plain = parse_input_line(line("/v1/completions", {{"prompt", "x"}}), opt_hooks(), true);
    ASSERT_TRUE(streamed.request && plain.request);
    live.add(0, *streamed.request, 0, 2);
    live.fail(1, json{{"custom_id", "bad"}});
    live.add(2, *plain.request, 2, 1);
    ASSERT_EQ(rec.events.size(), chat ? 3u : 1u);  // chat: a role chunk per choice, then the error line
    EXPECT_EQ(std::get<1>(rec.events.back()), LiveAnswers::Event::kLine);
    std::vector<GenerationResult> res;
    drive(live, 0, {a, b, b}, {int64_t(a.size()), 100, 100}, res);
    const json& out = live.line(0);
    ASSERT_TRUE(out.is_object());
    const auto got = rec.streamed(0, chat);
    ASSERT_EQ(got.size(), 2u);
    for (int64_t k = 0; k < 2; ++k) {
      const json& c = out["response"]["body"]["choices"][size_t(k)];
      EXPECT_EQ(got.at(k).first, chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>());
      EXPECT_EQ(got.at(k).second, c["finish_reason"].get<std::string>());
    }
    EXPECT_EQ(got.at(1).second, "stop");
    EXPECT_EQ(got.at(0).second, "length");
    // Line 0's last events: its usage chunk, then its line; line 2 (not streamed) only its line.
    size_t usage_at = 0, line0_at = 0, line2_at = 0;
    for (size_t i = 0; i < rec.events.size(); ++i) {
      const auto& [l, kind, j] = rec.events[i];
      if (kind == LiveAnswers::Event::kChunk && j["choices"].empty()) usage_at = i;
      if (kind == LiveAnswers::Event::kLine && l == 0) line0_at = i;
      if (kind == LiveAnswers::Event::kLine && l == 2) line2_at = i;
      if (l == 2) {
        EXPECT_EQ(kind, LiveAnswers::Event::kLine);
      }
    }
    EXPECT_EQ(usage_at + 1, line0_at);
    EXPECT_EQ(std::get<2>(rec.events[usage_at])["usage"], out["response"]["body"]["usage"]);
    EXPECT_LT(line2_at, line0_at) << "line 2 ended first (EOS at its third token), so it is answered first";
    EXPECT_EQ(live.cancelled(), 0);
  }
}

TEST(OpenAiStream, StopStringsNeverReachTheStreamAndAGoneClientEndsItsChoices) {
  const std::vector<int32_t> a = opt_tokenizer().encode(" one two three four five six", false);
  Recorder rec;
  IdMaker ids(7);
  LiveAnswers live(rec.emit(), decode_fn(), {}, "tiny", 123, ids);
  const Parsed stop = parse_input_line(
      line("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"stop", {" fou", "zz"}}}), opt_hooks(), true);
  ASSERT_TRUE(stop.request);
  live.add(0, *stop.request, 0, 1);
  std::vector<GenerationResult> res;
  drive(live, 0, {a}, {100}, res);
  const auto got = rec.streamed(0, false);
  EXPECT_EQ(got.at(0).first, " one two three");
  EXPECT_EQ(got.at(0).second, "stop");
  for (const auto& [l, kind, j] : rec.events)
    if (kind == LiveAnswers::Event::kChunk) {
      EXPECT_EQ(j["choices"][0]["text"].get<std::string>().find('f'), std::string::npos);
    }

  Recorder left;
  left.gone.insert(0);
  LiveAnswers live2(left.emit(), decode_fn(), {}, "tiny", 123, ids);
  const Parsed plain = parse_input_line(line("/v1/completions", {{"prompt", "x"}, {"stream", true}}), opt_hooks(), true);
  live2.add(0, *plain.request, 0, 1);
  std::vector<GenerationResult> res2;
  drive(live2, 0, {a}, {100}, res2);
  EXPECT_EQ(res2[0].finish, FinishReason::kStopped);
  EXPECT_LE(res2[0].tokens.size(), 2u) << "the first chunk's failed send ends the choice at its next token";
  EXPECT_GE(live2.cancelled(), 1);

  // Not streamed: asked at each token whether its client is still there, and ended once it is not.
  Recorder waiting;
  LiveAnswers live3(waiting.emit(), decode_fn(), {}, "tiny", 123, ids);
  const Parsed quiet = parse_input_line(line("/v1/completions", {{"prompt", "x"}, {"max_tokens", 100}}), opt_hooks());
  live3.add(0, *quiet.request, 0, 1);
  std::vector<GenerationResult> res3;
  drive(live3, 0, {a}, {int64_t(a.size())}, res3);
  EXPECT_EQ(res3[0].tokens, a);
  // After the 1st token, the 9th, ...: not at the last, which ends by length.
  EXPECT_EQ(waiting.alive_asked, int((a.size() - 2) / LiveAnswers::kAliveEvery) + 1);
  EXPECT_EQ(live3.cancelled(), 0);
  waiting.gone.insert(0);
  LiveAnswers live4(waiting.emit(), decode_fn(), {}, "tiny", 123, ids);
  live4.add(0, *quiet.request, 0, 1);
  std::vector<GenerationResult> res4;
  drive(live4, 0, {a}, {int64_t(a.size())}, res4);
  EXPECT_EQ(res4[0].finish, FinishReason::kStopped);
  EXPECT_EQ(res4[0].tokens.size(), 1u) << "the first token's question ends it";
  EXPECT_EQ(live4.cancelled(), 1);
}

}  // namespace
}  // namespace flexh2o::cli::openai_batch
