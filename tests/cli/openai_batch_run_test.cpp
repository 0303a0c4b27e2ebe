// run_generate in-process on OpenAI Batch files, as the Python front end calls it: chat lines
// rendered by a render_chat hook (its failure is that line's error only), and echoed prompts
// scored.
#include <gtest/gtest.h>

#include <fstream>

#include "cli/commands.h"
#include "cli/openai_batch.h"
#include "openai_batch_fixtures.h"

namespace flexh2o::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace openai_batch;
using namespace test_batch;
using test::model_dir;
using test::TempDir;

std::vector<json> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<json> v;
  for (std::string l; std::getline(in, l);) v.push_back(json::parse(l));
  return v;
}

// `generate --input in --output out` on tiny-opt, on the CPU, quietly.
GenerateArgs batch_args(const fs::path& in, const fs::path& out) {
  GenerateArgs a;
  a.model = model_dir("tiny-opt").string();
  a.input = in.string();
  a.output = out.string();
  a.device = "cpu";
  a.quiet = true;
  a.progress = "never";
  return a;
}

// run_generate in-process with a render_chat hook (what `python -m flexh2o generate` does): the
// rendered text is what is tokenized (no BOS added), so a chat line equals a completions line
// whose prompt is those token ids; the hook's exception is that line's error only.
TEST(OpenAiBatch, RunGenerateWithHookRendersChatLines) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  const std::string rendered = "<|user|>And God said\n<|assistant|>";
  const std::vector<int32_t> ids = opt_tokenizer().encode(rendered, /*add_special=*/false);
  {
    std::ofstream f(in);
    const json messages = {{{"role", "user"}, {"content", "And God said"}}};
    const json sampling = {{"max_tokens", 12}, {"temperature", 0.8}, {"seed", 11}};
    json body{{"model", "tiny"}, {"messages", messages}};
    body.update(sampling);
    f << line("/v1/chat/completions", body).dump() << "\n";
    body = json{{"model", "tiny"}, {"prompt", ids}};
    body.update(sampling);
    json l = line("/v1/completions", body);
    l["custom_id"] = "c2";
    f << l.dump() << "\n";
    body = json{{"messages", {{{"role", "tool"}, {"content", "x"}}}}};
    l = line("/v1/chat/completions", body);
    l["custom_id"] = "c3";
    f << l.dump() << "\n";
  }
  GenerateArgs a = batch_args(in, out);
  a.render_chat = [&](const json& body) -> std::string {
    std::string s;
    for (const json& m : body["messages"]) {
      if (m["role"] != "user") throw std::runtime_error("role " + m["role"].dump() + " is not supported");
      s += "<|user|>" + m["content"].get<std::string>() + "\n";
    }
    return s + "<|assistant|>";
  };
  Env env;
  EXPECT_EQ(run_generate(a, env), 1);  // the third line failed
  const auto lines = read_lines(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["custom_id"], "c1");
  ASSERT_EQ(lines[0]["response"]["status_code"], 200) << lines[0].dump();
  const json& chat_body = lines[0]["response"]["body"];
  const json& completion_body = lines[1]["response"]["body"];
  EXPECT_EQ(chat_body["object"], "chat.completion");
  EXPECT_EQ(chat_body["model"], "tiny");
  EXPECT_EQ(chat_body["choices"][0]["message"]["content"], completion_body["choices"][0]["text"]);
  EXPECT_FALSE(chat_body["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_EQ(chat_body["usage"], completion_body["usage"]);
  EXPECT_EQ(chat_body["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(lines[2]["custom_id"], "c3");
  EXPECT_EQ(lines[2]["response"]["status_code"], 400);
  EXPECT_EQ(lines[2]["response"]["body"]["error"]["message"],
            "rendering the chat template failed: role \"tool\" is not supported");
}

// A Batch file's echo with logprobs: the prompts are scored before generation, and each choice
// lists them first (the first token null), with score_tokens()' numbers on an in-memory runner.
// The text starts with the prompt as the body gave it: a string as written (no BOS text, as
// OpenAI's echo), token ids decoded.
TEST(OpenAiBatch, RunGenerateScoresEchoedPrompts) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  const std::vector<int32_t> p1 = opt_tokenizer().encode("In the beginning God created", true);
  const std::vector<int32_t> p2 = opt_tokenizer().encode("And the earth was", true);
  {
    std::ofstream f(in);
    f << line("/v1/completions", {{"prompt", {"In the beginning God created", p2}}, {"max_tokens", 2},
                                  {"temperature", 0}, {"echo", true},
                                  {"logprobs", 2}})
             .dump()
      << "\n";
  }
  GenerateArgs a = batch_args(in, out);
  Env env;
  ASSERT_EQ(run_generate(a, env), 0);
  const auto lines = read_lines(out);
  ASSERT_EQ(lines.size(), 1u);
  const json& cs = lines[0]["response"]["body"]["choices"];
  ASSERT_EQ(cs.size(), 2u) << lines[0].dump();
  Model m = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  Forward fwd(m, dev);
  InMemoryRunner runner(fwd, 2);
  const auto want = score_tokens(runner, {{{p1[0]}, {p1.begin() + 1, p1.end()}}, {{p2[0]}, {p2.begin() + 1, p2.end()}}}, 2);
  for (size_t k = 0; k < 2; ++k) {
    const json& lp = cs[k]["logprobs"];
    const std::vector<int32_t>& p = k == 0 ? p1 : p2;
    ASSERT_EQ(lp["tokens"].size(), p.size() + 2) << lp.dump();
    EXPECT_TRUE(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for (size_t t = 1; t < p.size(); ++t) {
      EXPECT_NEAR(lp["token_logprobs"][t].get<double>(), want[k][t - 1].logprob, 1e-6) << k << " " << t;
      // The 2 alternatives and, where it is not one of them, the token itself (as OpenAI).
      const json& top = lp["top_logprobs"][t];
      const std::string tok = lp["tokens"][t].get<std::string>();
      EXPECT_EQ(top.size(), want[k][t - 1].logprob >= want[k][t - 1].top.back().logprob ? 2u : 3u) << top.dump();
      ASSERT_TRUE(top.contains(tok)) << top.dump();
      EXPECT_EQ(top[tok], lp["token_logprobs"][t]);
    }
    const std::string echoed = k == 0 ? "In the beginning God created" : opt_tokenizer().decode(p);
    EXPECT_EQ(cs[k]["text"].get<std::string>().rfind(echoed, 0), 0u) << cs[k].dump();
  }
}

}  // namespace
}  // namespace flexh2o::cli
