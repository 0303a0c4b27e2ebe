// vLLM's extra body parameters in OpenAI lines (Batch files, the server): top_k, min_p and
// repetition_penalty override the CLI's defaults per request; skip_special_tokens; add_generation_prompt,
// continue_final_message and chat_template_kwargs are checked here and reach the chat hook.
#include <gtest/gtest.h>

#include <limits>

#include "cli/openai_batch.h"
#include "openai_batch_fixtures.h"

namespace flexh2o::cli {
namespace {
using nlohmann::json;
using namespace openai_batch;
using namespace test_batch;

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 4096;
  c.max_positions = 1024;
  return c;
}

Hooks hooks(json* seen = nullptr) {
  Hooks h;
  h.tokenize = [](const std::string& s, bool add) { return opt_tokenizer().encode(s, add); };
  h.render_chat = [seen](const nlohmann::ordered_json& body) {
    if (seen) *seen = json(body);
    return std::string("user: hi\nassistant:");
  };
  return h;
}

json completion(json extra) {
  json body{{"model", "m"}, {"prompt", "In the beginning"}, {"max_tokens", 4}};
  body.update(extra);
  return line("/v1/completions", body);
}
json chat(json extra) {
  json body{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  body.update(extra);
  return line("/v1/chat/completions", body);
}

SamplingParams sampling_of(const json& l, const RunDefaults& d) {
  const Parsed p = parse_input_line(l, hooks());
  EXPECT_TRUE(p.request) << l.dump() << ": " << (p.error ? p.error->message : "");
  if (!p.request) return {};
  const std::vector<GenerationRequest> g = expand_request(*p.request, d, tiny_config());
  EXPECT_EQ(g.size(), 1u);
  return g.at(0).sampling;
}

TEST(VllmParams, SamplingParametersOverrideTheFlagsDefaults) {
  RunDefaults d;
  d.top_k = 7;
  d.min_p = 0.2f;
  d.repetition_penalty = 1.1f;
  for (const json& l : {completion(json::object()), chat(json::object())}) {
    SamplingParams s = sampling_of(l, d);  // absent: the flags'
    EXPECT_EQ(s.top_k, 7);
    EXPECT_EQ(s.min_p, 0.2f);
    EXPECT_EQ(s.repetition_penalty, 1.1f);
    json with = l;
    with["body"].update(json{{"top_k", 40}, {"min_p", 0.05}, {"repetition_penalty", 1.3}});
    s = sampling_of(with, d);
    EXPECT_EQ(s.top_k, 40);
    EXPECT_EQ(s.min_p, 0.05f);
    EXPECT_EQ(s.repetition_penalty, 1.3f);
    for (int off : {-1, 0}) {  // vLLM's "all tokens"
      with["body"]["top_k"] = off;
      EXPECT_EQ(sampling_of(with, d).top_k, 0);
    }
    with["body"]["top_k"] = 1000000000000LL;  // past the vocabulary: every token, as vLLM caps it
    EXPECT_EQ(sampling_of(with, d).top_k, std::numeric_limits<int32_t>::max());
    with["body"].update(json{{"top_k", nullptr}, {"min_p", nullptr}, {"repetition_penalty", nullptr}});
    s = sampling_of(with, d);  // null: absent
    EXPECT_EQ(s.top_k, 7);
    EXPECT_EQ(s.min_p, 0.2f);
    EXPECT_EQ(s.repetition_penalty, 1.1f);
  }
}

TEST(VllmParams, BadSamplingValuesNameTheField) {
  const std::pair<json, std::string> bad[] = {
      {{{"top_k", -2}}, "top_k"},          {{{"top_k", 1.5}}, "top_k"},
      {{{"top_k", "5"}}, "top_k"},         {{{"repetition_penalty", 1e39}}, "repetition_penalty"},
      {{{"min_p", 1.5}}, "min_p"},         {{{"min_p", -0.1}}, "min_p"},
      {{{"min_p", "0.1"}}, "min_p"},       {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"repetition_penalty", -1}}, "repetition_penalty"}, {{{"repetition_penalty", true}}, "repetition_penalty"}};
  for (const auto& [extra, key] : bad)
    for (const json& l : {completion(extra), chat(extra)}) {
      const Parsed p = parse_input_line(l, hooks());
      ASSERT_TRUE(p.error) << l.dump();
      EXPECT_EQ(p.error->param, key) << l.dump();
      EXPECT_NE(p.error->message.find("\"" + key + "\""), std::string::npos) << p.error->message;
    }
}

TEST(VllmParams, ChatTemplateParametersReachTheHook) {
  json seen;
  const json extra{{"add_generation_prompt", false},
                   {"continue_final_message", true},
                   {"chat_template_kwargs", {{"enable_thinking", false}, {"bos_token", "<B>"}}}};
  const Parsed p = parse_input_line(chat(extra), hooks(&seen));
  ASSERT_TRUE(p.request) << p.error->message;
  EXPECT_EQ(seen["add_generation_prompt"], false);
  EXPECT_EQ(seen["continue_final_message"], true);
  EXPECT_EQ(seen["chat_template_kwargs"], extra["chat_template_kwargs"]);
  EXPECT_EQ(p.request->prompts.at(0), opt_tokenizer().encode("user: hi\nassistant:", false));
  // Their defaults and null pass too.
  for (const json& ok : {json{{"add_generation_prompt", true}, {"continue_final_message", false}},
                         json{{"add_generation_prompt", nullptr}, {"continue_final_message", nullptr},
                              {"chat_template_kwargs", nullptr}},
                         json{{"continue_final_message", true}, {"add_generation_prompt", false}},
                         json{{"chat_template_kwargs", {{"add_generation_prompt", false},
                                                        {"continue_final_message", true}}}},
                         json{{"chat_template_kwargs", json::object()}}}) {
    const Parsed q = parse_input_line(chat(ok), hooks());
    EXPECT_TRUE(q.request) << ok.dump() << ": " << (q.error ? q.error->message : "");
  }
}

TEST(VllmParams, ChatTemplateParametersAreChecked) {
  const std::tuple<json, std::string, std::string> bad[] = {
      {{{"add_generation_prompt", "yes"}}, "add_generation_prompt", "\"add_generation_prompt\" must be a boolean"},
      {{{"continue_final_message", 1}}, "continue_final_message", "\"continue_final_message\" must be a boolean"},
      // Checked whatever the other flag says.
      {{{"continue_final_message", "false"}, {"add_generation_prompt", false}}, "continue_final_message",
       "\"continue_final_message\" must be a boolean"},
      // add_generation_prompt's default is true
      {{{"continue_final_message", true}}, "continue_final_message",
       "\"continue_final_message\": true continues the last message, so it needs \"add_generation_prompt\": false"},
      {{{"continue_final_message", true}, {"add_generation_prompt", true}}, "continue_final_message",
       "needs \"add_generation_prompt\": false"},
      // chat_template_kwargs' flags override the body's (vLLM's merge), and are checked too.
      {{{"continue_final_message", true}, {"add_generation_prompt", false},
        {"chat_template_kwargs", {{"add_generation_prompt", true}}}},
       "continue_final_message", "needs \"add_generation_prompt\": false"},
      {{{"chat_template_kwargs", {{"continue_final_message", 1}}}}, "chat_template_kwargs",
       "\"chat_template_kwargs\".continue_final_message must be a boolean"},
      {{{"chat_template_kwargs", {{"chat_template", "{{ x }}"}}}}, "chat_template_kwargs",
       "cannot set \"chat_template\": flexh2o renders the model's own template"},
      {{{"chat_template_kwargs", json::array()}}, "chat_template_kwargs", "must be an object"},
      {{{"chat_template_kwargs", {{"messages", json::array()}}}}, "chat_template_kwargs",
       "cannot set \"messages\": the template gets the request's own"},
      {{{"chat_template_kwargs", {{"tools", json::array()}}}}, "chat_template_kwargs", "cannot set \"tools\""}};
  for (const auto& [extra, key, needle] : bad) {
    json seen;
    const Parsed p = parse_input_line(chat(extra), hooks(&seen));
    ASSERT_TRUE(p.error) << extra.dump();
    EXPECT_EQ(p.error->param, key) << extra.dump();
    EXPECT_NE(p.error->message.find(needle), std::string::npos) << p.error->message;
    EXPECT_TRUE(seen.is_null()) << "the hook ran for a bad line: " << extra.dump();
  }
  // They are chat parameters: /v1/completions refuses them as OpenAI refuses unknown keys.
  for (const char* key : {"add_generation_prompt", "continue_final_message", "chat_template_kwargs"}) {
    const Parsed p = parse_input_line(completion(json{{key, false}}), hooks());
    ASSERT_TRUE(p.error) << key;
    EXPECT_EQ(p.error->message, std::string("Unrecognized request argument supplied: ") + key);
  }
}

// skip_special_tokens (vLLM's, default true there and here): a special token generated mid-text
// (EOS under --ignore-eos, a chat marker) leaves its text out of the choice; stop strings are
// found in that text.
TEST(VllmParams, SkipSpecialTokensLeavesTheirTextOut) {
  const std::vector<int32_t> tokens{15, 2, 271, 262};  // ",", "</s>" (special), " and", " the"
  ASSERT_TRUE(opt_tokenizer().is_special(2));
  GenerationResult res;
  res.tokens = tokens;
  res.finish = FinishReason::kLength;
  const GenerationResult* one[] = {&res};
  IdMaker ids(1);
  auto text_of = [&](const json& extra) {
    const Parsed p = parse_input_line(completion(extra), hooks());
    EXPECT_TRUE(p.request) << (p.error ? p.error->message : "");
    const json out = result_line(*p.request, one, decoder_of(&opt_tokenizer()), token_text_of(&opt_tokenizer()),
                                 "m", 0, ids);
    return out["response"]["body"]["choices"][0]["text"].get<std::string>();
  };
  EXPECT_EQ(text_of(json::object()), ", and the");
  EXPECT_EQ(text_of({{"skip_special_tokens", true}}), ", and the");
  EXPECT_EQ(text_of({{"skip_special_tokens", false}}), ",</s> and the");
  EXPECT_EQ(text_of({{"stop", ", and"}}), "");  // found across the skipped token
  EXPECT_EQ(text_of({{"stop", ", and"}, {"skip_special_tokens", false}}), ",</s> and the");
  // Its log-probabilities still name every token; text_offset points into the text shown.
  res.logprobs = {-1.f, -2.f, -3.f, -4.f};
  for (const bool skip : {true, false}) {
    const Parsed p = parse_input_line(completion({{"logprobs", 0}, {"skip_special_tokens", skip}}), hooks());
    ASSERT_TRUE(p.request);
    const json body = result_line(*p.request, one, decoder_of(&opt_tokenizer()), token_text_of(&opt_tokenizer()),
                                  "m", 0, ids)["response"]["body"];
    const json& lp = body["choices"][0]["logprobs"];
    EXPECT_EQ(lp["tokens"], json({",", "</s>", " and", " the"})) << skip;
    EXPECT_EQ(lp["text_offset"], skip ? json({0, 1, 1, 5}) : json({0, 1, 5, 9})) << skip;
  }
  const Parsed bad = parse_input_line(chat({{"skip_special_tokens", "no"}}), hooks());
  ASSERT_TRUE(bad.error);
  EXPECT_EQ(bad.error->param, "skip_special_tokens");
}

}  // namespace
}  // namespace flexh2o::cli
