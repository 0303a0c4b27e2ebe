// OpenAI Batch lines (src/cli/openai_batch.h): every way a line can be refused and its message,
// OpenAI's defaults, stop strings against a real tokenizer, the output shapes (run_generate on
// Batch files: openai_batch_run_test.cpp).
#include "cli/openai_batch.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "cli/commands.h"
#include "engine/cpu_device.h"
#include "engine/evaluate.h"
#include "cli_run.h"
#include "openai_batch_fixtures.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace openai_batch;
using namespace test_batch;
using test::model_dir;
using test::TempDir;

Hooks opt_hooks() {
  Hooks h;
  h.tokenize = [](const std::string& s, bool add) { return opt_tokenizer().encode(s, add); };
  return h;
}

json completion(json extra = json::object()) {
  json body{{"model", "m"}, {"prompt", "In the beginning"}};
  body.update(extra);
  return line("/v1/completions", body);
}
json chat(json extra = json::object()) {
  json body{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  body.update(extra);
  return line("/v1/chat/completions", body);
}

// The error of a line that must be refused: its message holds `needle` and names `param`.
void expect_refused(const json& l, const std::string& needle, std::optional<std::string> param,
                    const Hooks& h = opt_hooks()) {
  const Parsed p = parse_input_line(l, h);
  ASSERT_TRUE(p.error) << l.dump();
  EXPECT_FALSE(p.request);
  EXPECT_NE(p.error->message.find(needle), std::string::npos) << l.dump() << "\n" << p.error->message;
  EXPECT_EQ(p.error->param, param) << l.dump();
}

TEST(OpenAiBatch, LineShapeErrorsNameTheField) {
  json l = completion();
  l.erase("custom_id");
  expect_refused(l, "missing \"custom_id\"", "custom_id");
  l["custom_id"] = 7;
  expect_refused(l, "\"custom_id\" must be a non-empty string, got 7", "custom_id");
  l = completion();
  l["method"] = "GET";
  expect_refused(l, "\"method\" must be \"POST\", got \"GET\"", "method");
  l.erase("method");
  expect_refused(l, "missing \"method\"", "method");
  l = completion();
  l["url"] = "/v1/embeddings";
  expect_refused(l, "\"url\" \"/v1/embeddings\" is not served", "url");
  l.erase("url");
  expect_refused(l, "missing \"url\"", "url");
  l = completion();
  l.erase("body");
  expect_refused(l, "missing \"body\"", "body");
  l["body"] = "prompt";
  expect_refused(l, "\"body\" must be an object, got \"prompt\"", "body");
  EXPECT_EQ(parse_input_line(completion(), opt_hooks()).custom_id, "c1");
}

TEST(OpenAiBatch, UnsupportedParametersAreRefusedUnlessDefault) {
  const std::pair<json, std::string> completions_bad[] = {
      {{{"stream", true}}, "stream"},
      {{{"suffix", "x"}}, "suffix"},          {{{"stream_options", {{"include_usage", true}}}}, "stream_options"}};
  for (const auto& [extra, key] : completions_bad)
    expect_refused(completion(extra), "\"" + key + "\" is not supported by flexh2o (got ", key);
  const std::pair<json, std::string> chat_bad[] = {
      {{{"tools", {{{"type", "function"}}}}}, "tools"},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"tool_choice", "auto"}}, "tool_choice"}};
  for (const auto& [extra, key] : chat_bad) {
    Hooks h = opt_hooks();
    h.render_chat = [](const json&) { return std::string("hi"); };
    expect_refused(chat(extra), "\"" + key + "\" is not supported by flexh2o (got ", key, h);
  }
  // Their defaults (and null) ask for nothing flexh2o lacks.
  const Parsed ok = parse_input_line(
      completion({{"stream", false}, {"logprobs", nullptr}, {"echo", false}, {"presence_penalty", 0.0},
                  {"frequency_penalty", 0}, {"logit_bias", json::object()}, {"best_of", 1}, {"user", "u"}}),
      opt_hooks());
  EXPECT_TRUE(ok.request) << (ok.error ? ok.error->message : "");
  expect_refused(completion({{"best_of", 3}}), "\"best_of\" other than \"n\" is not supported", "best_of");
  // Unknown keys: refused, as OpenAI refuses them.
  expect_refused(completion({{"max_new_tokens", 5}}), "Unrecognized request argument supplied: max_new_tokens",
                 "max_new_tokens");
  expect_refused(completion({{"messages", json::array()}}), "Unrecognized request argument supplied: messages",
                 "messages");
  // Chat's name for max_tokens: its message says which one /v1/completions takes.
  for (const json& extra : {json{{"max_completion_tokens", 4}}, json{{"max_tokens", 4}, {"max_completion_tokens", 4}}})
    expect_refused(completion(extra), "\"max_completion_tokens\" is chat's name (/v1/chat/completions); "
                   "/v1/completions takes \"max_tokens\": give that one", "max_completion_tokens");
}

// logit_bias as OpenAI writes it (ids as decimal strings) reaches every choice's sampling.
TEST(OpenAiBatch, LogitBiasReachesEveryChoice) {
  const Parsed p = parse_input_line(completion({{"logit_bias", {{"50256", -100}, {"7", 2.5}}}, {"n", 2}}), opt_hooks());
  ASSERT_TRUE(p.request) << p.error->message;
  const std::vector<std::pair<int32_t, float>> want{{50256, -100.f}, {7, 2.5f}};  // keys in string order
  EXPECT_EQ(p.request->logit_bias, want);
  ModelConfig c;
  c.vocab_size = 50272;
  c.max_positions = 2048;
  const auto reqs = expand_request(*p.request, RunDefaults{}, c);
  ASSERT_EQ(reqs.size(), 2u);
  for (const auto& g : reqs) EXPECT_EQ(g.sampling.logit_bias, want);
  c.vocab_size = 5000;  // an id outside the vocabulary fails when the request is expanded
  EXPECT_THROW(expand_request(*p.request, RunDefaults{}, c), Error);
}

// A prompt and max_tokens past the context are refused (OpenAI's and vLLM's 400), up to the
// token drawn from the last position; chat without max_tokens takes the rest of the context.
TEST(OpenAiBatch, MaxTokensPastTheContextAreRefused) {
  ModelConfig c;
  c.vocab_size = 50272;
  c.max_positions = 8;
  auto expand = [&](const json& extra) {
    const Parsed p = parse_input_line(completion(extra), opt_hooks());
    EXPECT_TRUE(p.request) << p.error->message;
    return expand_request(*p.request, RunDefaults{}, c);
  };
  const std::vector<int32_t> five{2, 10, 11, 12, 13};
  EXPECT_EQ(expand({{"prompt", five}, {"max_tokens", 4}}).at(0).max_new_tokens, 4);  // 9 tokens: the 9th from position 7
  EXPECT_EQ(test::error_of([&] { expand({{"prompt", five}, {"max_tokens", 5}}); }),
            "a sequence of this model reaches at most 9 tokens (8 positions, the last token drawn from the last "
            "one); the prompt of 5 tokens leaves room for 4 more, and max_tokens asks 5");
  EXPECT_NE(test::error_of([&] { expand({{"prompt", five}}); }).find("max_tokens asks 16"), std::string::npos);
}

TEST(OpenAiBatch, BadTypesAndRangesNameTheField) {
  struct Case {
    json extra;
    std::string needle, param;
  } cases[] = {
      {{{"max_tokens", "5"}}, "\"max_tokens\" must be an integer", "max_tokens"},
      {{{"max_tokens", -1}}, "\"max_tokens\" must be an integer in [0, ", "max_tokens"},
      {{{"max_tokens", 2.5}}, "\"max_tokens\" must be an integer", "max_tokens"},
      {{{"temperature", "hot"}}, "\"temperature\" must be a number, got \"hot\"", "temperature"},
      {{{"temperature", 2.5}}, "\"temperature\" must be in [0, 2], got 2.5", "temperature"},
      {{{"top_p", 0}}, "\"top_p\" must be in (0, 1], got 0", "top_p"},
      {{{"presence_penalty", 2.5}}, "\"presence_penalty\" must be in [-2, 2], got 2.5", "presence_penalty"},
      {{{"frequency_penalty", "x"}}, "\"frequency_penalty\" must be a number", "frequency_penalty"},
      {{{"n", 0}}, "\"n\" must be an integer in [1, 128], got 0", "n"},
      {{{"n", 129}}, "\"n\" must be an integer in [1, 128]", "n"},
      {{{"seed", "42"}}, "\"seed\" must be an integer", "seed"},
      {{{"stop", 5}}, "\"stop\" must be a string or an array of up to 4 strings, got 5", "stop"},
      {{{"stop", {"a", "b", "c", "d", "e"}}}, "\"stop\" must be a string or an array of up to 4", "stop"},
      {{{"stop", {"a", 1}}}, "\"stop\" must be a string or an array of up to 4", "stop"},
      {{{"stop", ""}}, "\"stop\": an empty string would stop every sequence at once", "stop"},
      {{{"model", 3}}, "\"model\" must be a string, got 3", "model"},
      {{{"prompt", nullptr}}, "missing \"prompt\"", "prompt"},
      {{{"prompt", {{"a", 1}}}}, "\"prompt\" must be a string, an array of token ids, an array of strings or", "prompt"},
      {{{"prompt", json::array()}}, "\"prompt\" must be a string, an array of token ids", "prompt"},
      {{{"prompt", {2, -1}}}, "\"prompt\"[1] must be an integer in [0, ", "prompt"},
      {{{"prompt", {"ok", 5}}}, "\"prompt\"[1] must be a string or an array of token ids, got 5", "prompt"},
      {{{"logit_bias", {1, 2}}}, "\"logit_bias\" must be an object of token ids to biases", "logit_bias"},
      {{{"logit_bias", {{"x5", 1}}}}, "\"logit_bias\": the key \"x5\" is not a token id", "logit_bias"},
      {{{"logit_bias", {{"-3", 1}}}}, "the key \"-3\" is not a token id", "logit_bias"},
      {{{"logit_bias", {{"5", "up"}}}}, "the bias of token 5 must be a number", "logit_bias"},
      {{{"logit_bias", {{"5", 101}}}}, "the bias of token 5 must be in [-100, 100], got 101", "logit_bias"},
  };
  for (const Case& c : cases) expect_refused(completion(c.extra), c.needle, c.param);
  // An empty prompt is the BOS alone (as transformers and OpenAI take it), refused only where the
  // tokenizer adds nothing.
  const Parsed empty = parse_input_line(completion({{"prompt", {"ok", ""}}}), opt_hooks());
  ASSERT_TRUE(empty.request) << empty.error->message;
  EXPECT_EQ(empty.request->prompts.at(1), opt_tokenizer().encode("", true));
  EXPECT_EQ(empty.request->prompts.at(1).size(), 1u);
  Hooks bare = opt_hooks();
  bare.tokenize = [](const std::string& s, bool) { return opt_tokenizer().encode(s, false); };
  expect_refused(completion({{"prompt", ""}}), "\"prompt\" gives no tokens", "prompt", bare);
  expect_refused(chat({{"messages", json::array()}}), "\"messages\" must be a non-empty array, got []", "messages");
  expect_refused(chat({{"messages", {"hi"}}}), "\"messages\"[0] must be an object with a string \"role\"",
                 "messages");
  expect_refused(chat({{"max_tokens", 4}, {"max_completion_tokens", 5}}),
                 "\"max_tokens\" (4) and \"max_completion_tokens\" (5) disagree", "max_tokens");
  expect_refused(chat({{"max_tokens", 0}}), "\"max_tokens\" must be", "max_tokens");
  expect_refused(chat({{"max_completion_tokens", 0}}), "\"max_completion_tokens\" must be", "max_completion_tokens");
  // A text prompt needs a tokenizer (a preset model has none).
  expect_refused(completion(), "this model has no tokenizer", "prompt", Hooks{});
  EXPECT_TRUE(parse_input_line(completion({{"prompt", {2, 44, 81}}}), Hooks{}).request);
}

TEST(OpenAiBatch, DefaultsAndValuesAreOpenAis) {
  Parsed p = parse_input_line(completion(), opt_hooks());
  ASSERT_TRUE(p.request);
  EXPECT_EQ(p.request->custom_id, "c1");
  EXPECT_EQ(p.request->endpoint, Endpoint::kCompletions);
  EXPECT_EQ(p.request->model, "m");
  EXPECT_EQ(p.request->max_tokens, 16);
  EXPECT_EQ(p.request->temperature, 1.0f);
  EXPECT_EQ(p.request->top_p, 1.0f);
  EXPECT_EQ(p.request->presence_penalty, 0.0f);
  EXPECT_EQ(p.request->frequency_penalty, 0.0f);
  EXPECT_EQ(p.request->n, 1);
  EXPECT_FALSE(p.request->seed);
  EXPECT_TRUE(p.request->stop.empty());
  ASSERT_EQ(p.request->prompts.size(), 1u);
  EXPECT_EQ(p.request->prompts[0], opt_tokenizer().encode("In the beginning", true));  // BOS as flexh2o lines

  p = parse_input_line(completion({{"prompt", {"In the", {2, 44}}}, {"max_tokens", 0}, {"temperature", 0},
                                   {"top_p", 0.5}, {"n", 3}, {"seed", -5}, {"stop", {"\n", "LORD"}},
                                   {"presence_penalty", 0.5}, {"frequency_penalty", -1}}),
                       opt_hooks());
  ASSERT_TRUE(p.request) << p.error->message;
  ASSERT_EQ(p.request->prompts.size(), 2u);
  EXPECT_EQ(p.request->prompts[0], opt_tokenizer().encode("In the", true));
  EXPECT_EQ(p.request->prompts[1], (std::vector<int32_t>{2, 44}));
  EXPECT_EQ(p.request->max_tokens, 0);
  EXPECT_EQ(p.request->temperature, 0.0f);
  EXPECT_EQ(p.request->top_p, 0.5f);
  EXPECT_EQ(p.request->presence_penalty, 0.5f);
  EXPECT_EQ(p.request->frequency_penalty, -1.0f);
  EXPECT_EQ(p.request->n, 3);
  EXPECT_EQ(p.request->seed, -5);
  EXPECT_EQ(p.request->stop, (std::vector<std::string>{"\n", "LORD"}));

  Hooks h = opt_hooks();
  json seen;
  h.render_chat = [&](const json& body) {
    seen = body;
    return std::string("</s>user: hi\nassistant:");
  };
  p = parse_input_line(chat({{"max_completion_tokens", 7}}), h);
  ASSERT_TRUE(p.request) << p.error->message;
  EXPECT_EQ(seen, chat({{"max_completion_tokens", 7}})["body"]);  // the whole body reaches the hook
  EXPECT_EQ(p.request->endpoint, Endpoint::kChatCompletions);
  EXPECT_EQ(p.request->max_tokens, 7);
  ASSERT_EQ(p.request->prompts.size(), 1u);
  EXPECT_EQ(p.request->prompts[0], opt_tokenizer().encode("</s>user: hi\nassistant:", false));
  p = parse_input_line(chat({{"max_tokens", 9}}), h);
  EXPECT_EQ(p.request->max_tokens, 9);
  p = parse_input_line(chat(), h);
  EXPECT_FALSE(p.request->max_tokens);  // chat's default: up to the context
}

TEST(OpenAiBatch, ChatNeedsTheHookAndItsFailuresAreTheLinesError) {
  expect_refused(chat(), "the flexh2o binary cannot render chat templates", "messages");
  expect_refused(chat(), "`python -m flexh2o generate ...`", "messages");
  Hooks h = opt_hooks();
  h.render_chat = [](const json&) -> std::string { throw std::runtime_error("TemplateError: bad role 'tool'"); };
  expect_refused(chat(), "rendering the chat template failed: TemplateError: bad role 'tool'", "messages", h);
  h.render_chat = [](const json&) { return std::string(); };
  expect_refused(chat(), "the chat template rendered an empty prompt", "messages", h);
}

// What the renderer gets: text parts as sent (it joins them unless the template loops over
// content), null or absent content as "" (an assistant turn with tool_calls), other content
// refused naming the message.
TEST(OpenAiBatch, ChatContentReachesTheTemplateAsText) {
  Hooks h = opt_hooks();
  json seen;
  h.render_chat = [&](const json& body) {
    seen = body["messages"];
    return std::string("hi");
  };
  const json messages = {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
                         {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}},
                         {{"role", "user"}}};
  const Parsed p = parse_input_line(chat({{"messages", messages}}), h);
  ASSERT_TRUE(p.request) << p.error->message;
  EXPECT_EQ(seen[0]["content"], messages[0]["content"]);
  EXPECT_EQ(seen[1]["content"], "");
  EXPECT_EQ(seen[2]["content"], "");
  expect_refused(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}),
                 "\"messages\"[0].content must be a string, an array of text parts or null, got 5", "messages", h);
}

TEST(OpenAiBatch, StopStringsCutTextAndCountTheTokensNeeded) {
  const Tokenizer& t = opt_tokenizer();
  const Decode decode = [&](std::span<const int32_t> ids, bool skip) { return t.decode(ids, skip); };
  // tiny-opt's greedy continuation of "In the beginning God created" (reference/greedy.json).
  const std::vector<int32_t> gen{15, 271, 262, 341, 15, 271, 262, 341};
  ASSERT_EQ(t.decode(gen), ", and the LORD, and the LORD");
  Choice c = finish_choice(gen, false, decode, {" LORD"}, true);
  EXPECT_EQ(c.text, ", and the");
  EXPECT_EQ(c.completion_tokens, 4);  // ", and the LORD": the stop is complete at the 4th token
  EXPECT_EQ(c.text_tokens, 3);        // the logprobs list ", and the" only: their texts add up to the text
  EXPECT_TRUE(c.stopped);
  // The first stop to complete wins, though another starts earlier.
  c = finish_choice(gen, false, decode, {"the LORD, and", "LO"}, true);
  EXPECT_EQ(c.text, ", and the ");
  EXPECT_EQ(c.completion_tokens, 4);
  EXPECT_EQ(c.text_tokens, 4);  // " LORD" begins inside the text (its space) and is listed
  c = finish_choice(gen, false, decode, {","}, true);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.text_tokens, 0);
  c = finish_choice(gen, false, decode, {"Egypt"}, true);
  EXPECT_EQ(c.text, ", and the LORD, and the LORD");
  EXPECT_EQ(c.completion_tokens, 8);
  EXPECT_FALSE(c.stopped);
  // EOS: counted, not shown, finish "stop".
  std::vector<int32_t> eos{15, 271, 2};
  c = finish_choice(eos, true, decode, {}, true);
  EXPECT_EQ(c.text, ", and");
  EXPECT_EQ(c.completion_tokens, 3);
  EXPECT_TRUE(c.stopped);
  c = finish_choice(std::vector<int32_t>{}, false, decode, {"x"}, true);
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(c.completion_tokens, 0);
}

// logprobs: completions' integer (0..5), chat's boolean with top_logprobs (0..20, only with
// logprobs true); each endpoint's output shape, with token text and bytes from the hook.
TEST(OpenAiBatch, LogprobsParseAndTakeEachEndpointsShape) {
  auto parsed = [](const json& l) {
    Hooks h = opt_hooks();
    h.render_chat = [](const json&) { return std::string("hi"); };
    return parse_input_line(l, h);
  };
  EXPECT_EQ(parsed(completion()).request->logprobs, -1);
  EXPECT_EQ(parsed(completion({{"logprobs", 0}})).request->logprobs, 0);
  EXPECT_EQ(parsed(completion({{"logprobs", 5}})).request->logprobs, 5);
  EXPECT_EQ(parsed(chat({{"logprobs", false}})).request->logprobs, -1);
  EXPECT_EQ(parsed(chat({{"logprobs", true}})).request->logprobs, 0);
  EXPECT_EQ(parsed(chat({{"logprobs", true}, {"top_logprobs", 20}})).request->logprobs, 20);
  auto error = [&](const json& l) {
    const Parsed p = parsed(l);
    return p.error ? p.error->param.value_or("") + ": " + p.error->message : std::string("accepted");
  };
  EXPECT_NE(error(completion({{"logprobs", 6}})).find("logprobs: \"logprobs\" must be an integer in [0, 5]"),
            std::string::npos);
  EXPECT_NE(error(chat({{"logprobs", 1}})).find("logprobs: \"logprobs\" must be a boolean, got 1"), std::string::npos);
  EXPECT_NE(error(chat({{"top_logprobs", 2}})).find("top_logprobs: \"top_logprobs\" needs \"logprobs\": true"),
            std::string::npos);
  EXPECT_NE(error(chat({{"logprobs", false}, {"top_logprobs", 2}})).find("needs \"logprobs\": true"), std::string::npos);
  EXPECT_NE(error(chat({{"logprobs", true}, {"top_logprobs", 21}})).find("in [0, 20]"), std::string::npos);

  Choice c{.text = "ab",
           .completion_tokens = 2,
           .tokens = {5, 6},
           .logprobs = {-0.5f, -1.5f},
           .top_logprobs = {{{5, -0.5f}, {7, -0.75f}}, {{8, -1.25f}, {6, -1.5f}}}};
  const TokenText bytes = [](int32_t id) {
    if (id == 6) return TokenPiece{"\xef\xbf\xbd", "\xc3"};  // a partial UTF-8 sequence: U+FFFD, its byte
    return TokenPiece{std::string(1, char('a' + id - 5)), std::string(1, char('a' + id - 5))};
  };
  IdMaker ids(1);
  const json cl = success_line(*parsed(completion({{"logprobs", 2}})).request, {c}, 1, "m", 1, ids, bytes);
  EXPECT_EQ(cl["response"]["body"]["choices"][0]["logprobs"], json::parse(R"({"tokens": ["a", "\ufffd"],
      "token_logprobs": [-0.5, -1.5], "top_logprobs": [{"a": -0.5, "c": -0.75}, {"d": -1.25, "\ufffd": -1.5}],
      "text_offset": [0, 1]})")) << cl.dump();
  const json ch = success_line(*parsed(chat({{"logprobs", true}, {"top_logprobs", 1}})).request, {c}, 1, "m", 1, ids,
                               bytes);
  const json& content = ch["response"]["body"]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << ch.dump();
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json::array({97}));
  EXPECT_EQ(content[1]["bytes"], json::array({195})) << "a partial UTF-8 sequence keeps its bytes";
  EXPECT_EQ(content[0]["top_logprobs"][1], json::parse(R"({"token": "c", "logprob": -0.75, "bytes": [99]})"));
  EXPECT_TRUE(ch["response"]["body"]["choices"][0]["logprobs"]["refusal"].is_null());

  // The tokens a choice keeps: those its text counts, EOS left out.
  GenerationResult r;
  r.tokens = {5, 6, 2};
  r.logprobs = {-0.5f, -1.5f, -0.1f};
  r.finish = FinishReason::kEos;
  Choice e{.text = "ab", .completion_tokens = 3, .stopped = true};
  with_logprobs(e, r);
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(e.logprobs, (std::vector<float>{-0.5f, -1.5f}));
  Choice cut{.text = "a", .completion_tokens = 1, .stopped = true};  // a stop string after the first token
  with_logprobs(cut, r);
  EXPECT_EQ(cut.tokens, (std::vector<int32_t>{5}));
  Choice within{.text = "a", .completion_tokens = 2, .stopped = true};  // a stop string completed by the second token, which is all stop
  within.text_tokens = 1;
  with_logprobs(within, r);
  EXPECT_EQ(within.tokens, (std::vector<int32_t>{5}));
  EXPECT_EQ(within.logprobs, (std::vector<float>{-0.5f}));
}

// "echo": a boolean; with logprobs only where the caller scores prompts (not a pipeline); with
// stream too. Each choice's text begins with its prompt's; with logprobs its tokens too, the first
// with null log-probability and alternatives, then the prompt's scores, then the generated tokens.
TEST(OpenAiBatch, EchoPrependsThePromptAndItsScores) {
  EXPECT_TRUE(parse_input_line(completion({{"echo", true}}), opt_hooks()).request->echo);
  expect_refused(completion({{"echo", 1}}), "\"echo\" must be a boolean, got 1", "echo");
  expect_refused(completion({{"echo", true}, {"logprobs", 1}}), "not served with --pipeline-stages", "echo");
  Hooks server = opt_hooks();
  server.score_prompts = true;
  const Parsed s = parse_input_line(completion({{"echo", true}, {"stream", true}, {"logprobs", 1}}), server, true);
  ASSERT_TRUE(s.request) << s.error->message;
  EXPECT_TRUE(s.request->echo && s.request->stream);
  // Two prompts of token ids, two choices each, two alternatives.
  const Parsed p = parse_input_line(
      completion({{"echo", true}, {"logprobs", 2}, {"n", 2}, {"prompt", {{5, 6}, {7}}}}), server);
  ASSERT_TRUE(p.request) << p.error->message;
  Request r = *p.request;
  EXPECT_TRUE(r.scores_prompts());
  r.prompt_scores = {{ScoredToken{-2.5f, {{9, -0.5f}, {6, -2.5f}}}}, {}};
  const Decode decode = [](std::span<const int32_t> ids, bool) {
    std::string s;
    for (int32_t id : ids) s += char('a' + id - 5);
    return s;
  };
  const TokenText piece = [](int32_t id) { return TokenPiece{std::string(1, char('a' + id - 5)), std::string(1, char('a' + id - 5))}; };
  std::vector<GenerationResult> res(4);
  for (size_t i = 0; i < 4; ++i) {
    res[i].tokens = {int32_t(8 + i)};
    res[i].logprobs = {-1.f - float(i)};
    res[i].top_logprobs = {{{int32_t(8 + i), -1.f - float(i)}}};
    res[i].finish = FinishReason::kLength;
  }
  const std::vector<const GenerationResult*> ptrs = {&res[0], &res[1], &res[2], &res[3]};
  IdMaker ids(1);
  const json l = result_line(r, ptrs, decode, piece, "m", 1, ids);
  const json& cs = l["response"]["body"]["choices"];
  ASSERT_EQ(cs.size(), 4u) << l.dump();
  EXPECT_EQ(cs[0]["text"], "abd");
  EXPECT_EQ(cs[1]["text"], "abe");
  EXPECT_EQ(cs[2]["text"], "cf");
  EXPECT_EQ(cs[0]["logprobs"], json::parse(R"({"tokens": ["a", "b", "d"], "token_logprobs": [null, -2.5, -1.0],
      "top_logprobs": [null, {"e": -0.5, "b": -2.5}, {"d": -1.0}], "text_offset": [0, 1, 2]})")) << cs[0].dump();
  EXPECT_EQ(cs[3]["logprobs"], json::parse(R"({"tokens": ["c", "g"], "token_logprobs": [null, -4.0],
      "top_logprobs": [null, {"g": -4.0}], "text_offset": [0, 1]})")) << cs[3].dump();
  EXPECT_EQ(l["response"]["body"]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(l["response"]["body"]["usage"]["prompt_tokens"], 3);
  // Without logprobs, the text alone.
  Request plain = *parse_input_line(completion({{"echo", true}, {"prompt", {5, 6}}}), opt_hooks()).request;
  const json pl = result_line(plain, std::vector<const GenerationResult*>{&res[0]}, decode, piece, "m", 1, ids);
  EXPECT_EQ(pl["response"]["body"]["choices"][0]["text"], "abd");
  EXPECT_TRUE(pl["response"]["body"]["choices"][0]["logprobs"].is_null());
}

// text_offset counts characters (code points) of the completion text, as OpenAI and vLLM do:
// "é" is one character of two bytes, and the byte-level pieces of "€" share its offset.
TEST(OpenAiBatch, TextOffsetsCountCharacters) {
  const std::map<int32_t, std::string> bytes = {{1, "\xc3\xa9"}, {2, "b"}, {3, "\xe2\x82"}, {4, "\xac"}, {5, "x"}};
  const TokenText piece = [&](int32_t id) { return TokenPiece{bytes.at(id), bytes.at(id)}; };
  Choice c{.text = "\xc3\xa9" "b\xe2\x82\xacx", .completion_tokens = 5, .tokens = {1, 2, 3, 4, 5},
           .logprobs = {-1, -1, -1, -1, -1}};
  const Parsed p = parse_input_line(completion({{"logprobs", 0}}), opt_hooks());
  ASSERT_TRUE(p.request) << (p.error ? p.error->message : "");
  IdMaker ids(1);
  const json line = success_line(*p.request, {c}, 1, "m", 1, ids, piece);
  // "éb€x": é 0, b 1, € 2 (both of its pieces), x 3.
  EXPECT_EQ(line["response"]["body"]["choices"][0]["logprobs"]["text_offset"], json::array({0, 1, 2, 2, 3}))
      << line.dump();
}

// An echoed text prompt's text has no BOS, so its tokens' offsets do not count the BOS's "</s>";
// a prompt of ids whose text (decoded) holds it counts it.
TEST(OpenAiBatch, TextOffsetsOfAnEchoedPromptPointIntoItsText) {
  const std::map<int32_t, std::string> bytes = {{2, "</s>"}, {5, "a"}, {6, "b"}, {8, "d"}};
  const TokenText piece = [&](int32_t id) { return TokenPiece{bytes.at(id), bytes.at(id), id == 2}; };
  for (const std::string& text : {std::string("abd"), std::string("</s>abd")}) {
    Choice c{.text = text, .completion_tokens = 1, .tokens = {8}, .logprobs = {-1}, .prompt = {2, 5, 6},
             .prompt_scores = {ScoredToken{-1.f, {}}, ScoredToken{-1.f, {}}}};
    const json lp = logprobs_of(c, false, piece);
    const std::vector<int64_t> offsets = lp["text_offset"];
    ASSERT_EQ(offsets.size(), 4u) << lp.dump();
    for (size_t i = 1; i < 4; ++i)  // each token's text begins at its offset
      EXPECT_EQ(text.substr(size_t(offsets[i]), 1), bytes.at(i < 3 ? c.prompt[i] : 8)) << text << " " << lp.dump();
    EXPECT_EQ(offsets[0], 0) << lp.dump();
  }
}

TEST(OpenAiBatch, OutputLinesHaveOpenAisShape) {
  IdMaker ids(1);
  Parsed p = parse_input_line(completion({{"n", 2}}), opt_hooks());
  const json ok = success_line(*p.request, {{"a", 3, true}, {"bc", 16, false}}, 5, "tiny-opt", 1700000000, ids);
  EXPECT_EQ(ok["custom_id"], "c1");
  EXPECT_TRUE(ok["error"].is_null());
  EXPECT_TRUE(std::regex_match(ok["id"].get<std::string>(), std::regex("batch_req_[0-9a-f]{32}")));
  const json& resp = ok["response"];
  EXPECT_EQ(resp["status_code"], 200);
  EXPECT_TRUE(std::regex_match(resp["request_id"].get<std::string>(), std::regex("[0-9a-f]{32}")));
  const json& body = resp["body"];
  EXPECT_TRUE(std::regex_match(body["id"].get<std::string>(), std::regex("cmpl-[0-9a-f]{32}")));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["choices"], json::parse(R"([{"text": "a", "index": 0, "logprobs": null, "finish_reason": "stop"},
                                             {"text": "bc", "index": 1, "logprobs": null, "finish_reason": "length"}])"));
  EXPECT_EQ(body["usage"], json::parse(R"({"prompt_tokens": 5, "completion_tokens": 19, "total_tokens": 24})"));
  EXPECT_TRUE(is_output_line(ok));
  EXPECT_FALSE(output_line_failed(ok));

  Hooks h = opt_hooks();
  h.render_chat = [](const json&) { return std::string("hi"); };
  p = parse_input_line(chat(), h);
  p.request->model.reset();  // no model in the body: the loaded model's name
  const json c = success_line(*p.request, {{"hello", 2, true}}, 1, "tiny-opt", 1, ids);
  EXPECT_EQ(c["response"]["body"]["object"], "chat.completion");
  EXPECT_EQ(c["response"]["body"]["model"], "tiny-opt");
  EXPECT_TRUE(std::regex_match(c["response"]["body"]["id"].get<std::string>(), std::regex("chatcmpl-[0-9a-f]{32}")));
  EXPECT_EQ(c["response"]["body"]["choices"], json::parse(R"([{"index": 0, "logprobs": null, "finish_reason": "stop",
      "message": {"role": "assistant", "content": "hello", "refusal": null}}])"));

  const json err = error_line("c9", {"\"n\" must be ...", "n"}, ids);
  EXPECT_EQ(err["custom_id"], "c9");
  EXPECT_TRUE(err["error"].is_null());
  EXPECT_EQ(err["response"]["status_code"], 400);
  EXPECT_EQ(err["response"]["body"], json::parse(R"({"error": {"message": "\"n\" must be ...",
      "type": "invalid_request_error", "param": "n", "code": null}})"));
  EXPECT_TRUE(is_output_line(err));
  EXPECT_TRUE(output_line_failed(err));
  EXPECT_FALSE(is_output_line(json{{"id", "x"}, {"text", ""}, {"token_ids", json::array()}}));
  // Every id differs.
  std::set<std::string> all;
  for (const json* l : {&ok, &c, &err}) {
    all.insert((*l)["id"].get<std::string>());
    all.insert((*l)["response"]["request_id"].get<std::string>());
  }
  EXPECT_EQ(all.size(), 6u);
}

}  // namespace
}  // namespace flexh2o::cli
