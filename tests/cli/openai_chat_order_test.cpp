// A chat line's messages reach the template in the order the line wrote their keys (a template's
// tojson of a message or of tool-call arguments then matches transformers'), through a Batch
// line, a flexh2o JSONL line read by for_each_jsonl, and the Python server's parse.
#include <gtest/gtest.h>

#include <sstream>

#include "cli/common.h"
#include "cli/openai_batch.h"

namespace flexh2o::cli {
namespace {
using nlohmann::ordered_json;

// The messages of a line whose keys are out of alphabetical order, nested ones too.
const char* kMessages =
    R"([{"role": "user", "content": "Weather?"},)"
    R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "c1",)"
    R"( "function": {"name": "get_weather", "arguments": {"unit": "C", "city": "Paris"}}}]},)"
    R"( {"role": "tool", "content": [{"type": "text", "text": "21"}], "tool_call_id": "c1"}])";

// What the line's messages become for the template: null content "", text parts as sent (the
// renderer joins them where the template does not loop over content); every object's keys as
// written.
const char* kRendered =
    R"([{"role":"user","content":"Weather?"},{"role":"assistant","content":"","tool_calls":[{"type":"function",)"
    R"("id":"c1","function":{"name":"get_weather","arguments":{"unit":"C","city":"Paris"}}}]},)"
    R"({"role":"tool","content":[{"type":"text","text":"21"}],"tool_call_id":"c1"}])";

openai_batch::Hooks recording(std::string* seen) {
  openai_batch::Hooks h;
  h.tokenize = [](const std::string& s, bool) { return std::vector<int32_t>(s.size() % 7 + 1, 5); };
  h.render_chat = [seen](const ordered_json& body) {
    *seen = body["messages"].dump();
    return std::string("rendered");
  };
  return h;
}

TEST(ChatKeyOrder, ABatchLineKeepsTheKeyOrderOfItsMessages) {
  std::string seen;
  const ordered_json line = ordered_json::parse(
      std::string(R"({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": )") +
      kMessages + R"(, "model": "m"}})");
  const openai_batch::Parsed p = openai_batch::parse_input_line(line, recording(&seen));
  ASSERT_TRUE(p.request) << p.error->message;
  EXPECT_EQ(seen, kRendered);
}

TEST(ChatKeyOrder, AJsonlLineKeepsIt) {
  std::istringstream in(std::string(R"({"messages": )") + kMessages + R"(, "id": 3})" + "\n");
  std::string seen;
  int lines = 0;
  const int64_t bad = for_each_jsonl(
      in,
      [&](int64_t, const ordered_json& j) {
        ++lines;
        EXPECT_EQ(j.begin().key(), "messages");  // as written, not sorted
        openai_batch::RequestError why;
        EXPECT_FALSE(openai_batch::chat_prompt_ids(j, recording(&seen), &why).empty()) << why.message;
      },
      [](int64_t, const std::string& e) { ADD_FAILURE() << e; });
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(seen, kRendered);
}

}  // namespace
}  // namespace flexh2o::cli
