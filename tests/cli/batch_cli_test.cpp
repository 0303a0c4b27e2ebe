// `flexh2o generate` on OpenAI Batch files, through the program: the same tokens as the
// equivalent flexh2o lines (penalties and sampling flags included), usage, stop strings, n choices, every error as an OpenAI error line,
// files that mix formats, and --resume's rules for custom_ids.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::read_json;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;

const std::string kOpt = model_dir("tiny-opt").string();

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args); }

std::vector<json> read_jsonl(const fs::path& p) {
  std::ifstream in(p);
  std::vector<json> v;
  for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
  return v;
}

void write_lines(const fs::path& p, const std::vector<json>& lines) {
  std::ofstream f(p);
  for (const json& l : lines) f << l.dump() << "\n";
}

json completion(const std::string& id, json body) {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", std::move(body)}};
}

std::string gen(const fs::path& in, const fs::path& out, const std::string& extra = "") {
  return "generate -m " + kOpt + " -q --device cpu -i " + in.string() + " -o " + out.string() + " " + extra;
}

const json& body_of(const json& line) { return line["response"]["body"]; }

TEST(BatchCli, CompletionsMatchTheEquivalentFlexh2oLinesAndCountUsage) {
  TempDir tmp;
  const json greedy = read_json(model_dir("tiny-opt") / "reference/greedy.json");
  std::vector<json> plain, batch;
  for (int i = 0; i < 6; ++i) {
    const json& p = greedy["prompts"][size_t(i % 3)];
    const int max_new = 5 + i;
    json body{{"model", "gpt-test"}, {"max_tokens", max_new}, {"temperature", 0.9}, {"top_p", 0.95}};
    json ours{{"id", "q" + std::to_string(i)}, {"max_new_tokens", max_new}, {"temperature", 0.9}, {"top_p", 0.95}};
    if (i % 2) {  // explicit seeds on odd lines; the others use --seed + line index on both sides
      body["seed"] = 1000 + i;
      ours["seed"] = 1000 + i;
    }
    if (i % 3 == 2) {  // OpenAI's penalties, the same on both sides
      for (json* j : {&body, &ours}) (*j)["presence_penalty"] = 0.8, (*j)["frequency_penalty"] = 0.4;
    }
    if (i == 5) {
      body["prompt"] = p["ids"];
      ours["prompt_ids"] = p["ids"];
    } else {
      body["prompt"] = p["prompt"];
      ours["prompt"] = p["prompt"];
    }
    plain.push_back(ours);
    batch.push_back(completion("c" + std::to_string(i), body));
  }
  write_lines(tmp.path() / "plain.jsonl", plain);
  write_lines(tmp.path() / "batch.jsonl", batch);
  // --min-p and --repetition-penalty (not OpenAI's) apply to both formats.
  const std::string flags = "--ignore-eos --seed 7 --min-p 0.02 --repetition-penalty 1.1 ";
  RunResult r = flexh2o(gen(tmp.path() / "plain.jsonl", tmp.path() / "plain.out", flags + "-b 4"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = flexh2o(gen(tmp.path() / "batch.jsonl", tmp.path() / "batch.out", flags + "-b 3"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto want = read_jsonl(tmp.path() / "plain.out"), got = read_jsonl(tmp.path() / "batch.out");
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i]["custom_id"], "c" + std::to_string(i));  // input order
    EXPECT_TRUE(got[i]["error"].is_null());
    EXPECT_EQ(got[i]["response"]["status_code"], 200);
    const json& b = body_of(got[i]);
    EXPECT_EQ(b["object"], "text_completion");
    EXPECT_EQ(b["model"], "gpt-test");
    ASSERT_EQ(b["choices"].size(), 1u);
    EXPECT_EQ(b["choices"][0]["text"], want[i]["text"]);
    EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
    const size_t prompt_tokens = greedy["prompts"][i % 3]["ids"].size();
    EXPECT_EQ(b["usage"]["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(b["usage"]["completion_tokens"], want[i]["token_ids"].size());
    EXPECT_EQ(b["usage"]["completion_tokens"], 5 + i);
    EXPECT_EQ(b["usage"]["total_tokens"], prompt_tokens + 5 + i);
  }
}

// A completions line's logprobs are the flexh2o line's: the same values per token, its tokens'
// text, and the top alternatives; EOS and the text after a stop string are left out.
TEST(BatchCli, LogprobsEqualTheFlexh2oLinesValues) {
  TempDir tmp;
  const json greedy = read_json(model_dir("tiny-opt") / "reference/greedy.json");
  const std::string prompt = greedy["prompts"][0]["prompt"];
  write_lines(tmp.path() / "plain.jsonl", {{{"id", "p"}, {"prompt", prompt}, {"max_new_tokens", 6}, {"logprobs", 2}}});
  write_lines(tmp.path() / "batch.jsonl",
              {completion("c", {{"prompt", prompt}, {"max_tokens", 6}, {"logprobs", 2}}),
               completion("s", {{"prompt", prompt}, {"max_tokens", 6}, {"logprobs", 0}, {"stop", " LORD"}})});
  RunResult r = flexh2o(gen(tmp.path() / "plain.jsonl", tmp.path() / "plain.out", "--greedy --ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = flexh2o(gen(tmp.path() / "batch.jsonl", tmp.path() / "batch.out", "--greedy --ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json want = read_jsonl(tmp.path() / "plain.out")[0];
  const auto got = read_jsonl(tmp.path() / "batch.out");
  const json& lp = body_of(got[0])["choices"][0]["logprobs"];
  EXPECT_EQ(lp["token_logprobs"], want["logprobs"]) << lp;
  ASSERT_EQ(lp["tokens"].size(), 6u) << lp;
  std::string joined;
  for (const auto& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, want["text"]) << lp;
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    EXPECT_EQ(lp["top_logprobs"][t].size(), 2u) << lp;
    EXPECT_EQ(lp["top_logprobs"][t][lp["tokens"][t].get<std::string>()], want["logprobs"][t]) << "greedy: the best";
  }
  const json& cut = body_of(got[1])["choices"][0];
  EXPECT_EQ(cut["finish_reason"], "stop");
  std::string kept;
  for (const auto& t : cut["logprobs"]["tokens"]) kept += t.get<std::string>();
  EXPECT_LT(cut["logprobs"]["tokens"].size(), 6u) << cut;
  EXPECT_EQ(kept.substr(0, cut["text"].get<std::string>().size()), cut["text"]) << cut;
}

TEST(BatchCli, StopStringsAndSeveralChoices) {
  TempDir tmp;
  const json greedy = read_json(model_dir("tiny-opt") / "reference/greedy.json");
  const std::string p0 = greedy["prompts"][0]["prompt"], p1 = greedy["prompts"][1]["prompt"];
  write_lines(tmp.path() / "in.jsonl",
              {completion("stop", {{"prompt", p0}, {"max_tokens", 20}, {"temperature", 0}, {"stop", " LORD"}}),
               completion("stops", {{"prompt", p0}, {"max_tokens", 20}, {"temperature", 0}, {"stop", {"xyz", ", and"}}}),
               completion("n", {{"prompt", {p0, p1}}, {"max_tokens", 12}, {"n", 3}, {"seed", 5}})});
  // Choice k of each prompt uses seed + k * 0x9E3779B97F4A7C15 (mod 2^64): as these flexh2o lines.
  write_lines(tmp.path() / "plain.jsonl",
              {json{{"prompt", p0}, {"max_new_tokens", 12}, {"seed", 5}},
               json{{"prompt", p0}, {"max_new_tokens", 12}, {"seed", 5 + 2 * 0x9E3779B97F4A7C15ull}},
               json{{"prompt", p1}, {"max_new_tokens", 12}, {"seed", 5}}});
  const fs::path report = tmp.path() / "report.json";
  RunResult r = flexh2o(gen(tmp.path() / "in.jsonl", tmp.path() / "out.jsonl", "--ignore-eos --report " + report.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = read_jsonl(tmp.path() / "out.jsonl");
  ASSERT_EQ(got.size(), 3u);
  // The engine ends a sequence at its stop string: 4 + 2 tokens, not 2 x max_tokens (20).
  EXPECT_EQ(read_json(report)["generated_tokens"], 4 + 2 + 6 * 12);
  // Greedy: ", and the LORD, and the LORD, ..." (reference/greedy.json).
  EXPECT_EQ(body_of(got[0])["choices"][0]["text"], ", and the");
  EXPECT_EQ(body_of(got[0])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body_of(got[0])["usage"]["completion_tokens"], 4);
  EXPECT_EQ(body_of(got[1])["choices"][0]["text"], "");
  EXPECT_EQ(body_of(got[1])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body_of(got[1])["usage"]["completion_tokens"], 2);
  const json& choices = body_of(got[2])["choices"];
  ASSERT_EQ(choices.size(), 6u);  // prompt-major, then n
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(choices[k]["index"], k);
    EXPECT_EQ(choices[k]["finish_reason"], "length");
    for (size_t j = 0; j < k; ++j) EXPECT_NE(choices[k]["text"], choices[j]["text"]) << k << " " << j;
  }
  EXPECT_EQ(body_of(got[2])["usage"]["completion_tokens"], 6 * 12);
  EXPECT_EQ(body_of(got[2])["usage"]["prompt_tokens"],
            greedy["prompts"][0]["ids"].size() + greedy["prompts"][1]["ids"].size());  // once per prompt
  r = flexh2o(gen(tmp.path() / "plain.jsonl", tmp.path() / "plain.out", "--ignore-eos"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto plain = read_jsonl(tmp.path() / "plain.out");
  EXPECT_EQ(choices[0]["text"], plain[0]["text"]);
  EXPECT_EQ(choices[2]["text"], plain[1]["text"]);
  EXPECT_EQ(choices[3]["text"], plain[2]["text"]);
}

TEST(BatchCli, BadLinesGetOpenAiErrorLinesInOrderAndExitOne) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  json get = completion("get", {{"prompt", "hi"}});
  get["method"] = "GET";
  json url = completion("url", {{"prompt", "hi"}});
  url["url"] = "/v1/embeddings";
  json number_id = completion("", {{"prompt", "hi"}, {"max_tokens", 2}});
  number_id["custom_id"] = 7;
  json nobody = completion("nobody", {});
  nobody.erase("body");
  const json chat{{"custom_id", "chat"}, {"method", "POST"}, {"url", "/v1/chat/completions"},
                  {"body", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}}};
  {
    std::ofstream f(in);
    f << completion("ok", {{"prompt", "And God said"}, {"max_tokens", 3}}).dump() << "\n"
      << get.dump() << "\n"
      << url.dump() << "\n"
      << nobody.dump() << "\n"
      << completion("stream", {{"prompt", "hi"}, {"stream", true}}).dump() << "\n"
      << completion("type", {{"prompt", "hi"}, {"max_tokens", "3"}}).dump() << "\n"
      << R"({"custom_id": "broken", "method": )" << "\n"
      << chat.dump() << "\n"
      << number_id.dump() << "\n"
      << completion("long", {{"prompt", std::vector<int>(1100, 5)}}).dump() << "\n";
  }
  RunResult r = flexh2o(gen(in, out));
  EXPECT_EQ(r.code, 1) << r.err;
  const auto got = read_jsonl(out);
  ASSERT_EQ(got.size(), 10u);
  struct Want {
    json custom_id;
    std::string needle;
    json param;
    json code = nullptr;
  } want[] = {
      {"get", "\"method\" must be \"POST\", got \"GET\"", "method"},
      {"url", "\"url\" \"/v1/embeddings\" is not served", "url"},
      {"nobody", "missing \"body\"", "body"},
      {"stream", "\"stream\" is not supported by flexh2o (got true)", "stream"},
      {"type", "\"max_tokens\" must be an integer", "max_tokens"},
      {nullptr, "invalid JSON", nullptr},
      {"chat", "the flexh2o binary cannot render chat templates", "messages"},
      {7, "\"custom_id\" must be a non-empty string, got 7", "custom_id"},
      {"long", "longer than the model's max_position_embeddings", "prompt", "context_length_exceeded"},
  };
  EXPECT_EQ(got[0]["response"]["status_code"], 200);
  for (size_t i = 0; i < std::size(want); ++i) {
    const json& l = got[i + 1];
    SCOPED_TRACE(l.dump());
    EXPECT_EQ(l["custom_id"], want[i].custom_id);
    EXPECT_TRUE(l["error"].is_null());
    EXPECT_EQ(l["response"]["status_code"], 400);
    const json& e = l["response"]["body"]["error"];
    EXPECT_NE(e["message"].get<std::string>().find(want[i].needle), std::string::npos);
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["param"], want[i].param);
    EXPECT_EQ(e["code"], want[i].code);
  }
  EXPECT_NE(r.err.find("in.jsonl:2: \"method\" must be \"POST\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in.jsonl:8: the flexh2o binary cannot render chat templates"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("`python -m flexh2o generate ...`"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("9 input line(s) failed"), std::string::npos) << r.err;
}

TEST(BatchCli, MixedFormatsAreRefusedBeforeAnyOutput) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_lines(in, {json{{"id", "a"}, {"prompt", "hi"}}, completion("b", {{"prompt", "hi"}})});
  std::ofstream(out) << "old results\n";
  RunResult r = flexh2o(gen(in, out, "--overwrite"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("in.jsonl mixes formats: line 2 is an OpenAI Batch request"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line 1 is a flexh2o request"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(out), "old results\n");
}

TEST(BatchCli, ResumeKeysOnUniqueCustomIdsAndRefusesTheOtherFormat) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_lines(in, {completion("a", {{"prompt", "hi"}, {"max_tokens", 2}}),
                   completion("b", {{"prompt", "And"}, {"max_tokens", 2}}),
                   completion("a", {{"prompt", "hi"}, {"max_tokens", 3}})});
  RunResult r = flexh2o(gen(in, out, "--resume"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("in.jsonl:3 repeats custom_id \"a\" of line 1; custom_ids must be unique"),
            std::string::npos) << r.err;
  // A run that finished one line, then --resume finishes the other.
  write_lines(in, {completion("a", {{"prompt", "hi"}, {"max_tokens", 2}}),
                   completion("b", {{"prompt", "And"}, {"max_tokens", 2}, {"stream", true}})});
  r = flexh2o(gen(in, out));
  EXPECT_EQ(r.code, 1) << r.err;
  auto first = read_jsonl(out);
  ASSERT_EQ(first.size(), 2u);
  {
    std::ofstream f(out);
    f << first[0].dump() << "\n";
  }
  r = flexh2o(gen(in, out, "--resume"));
  EXPECT_EQ(r.code, 1) << r.err;  // line b fails again
  EXPECT_NE(r.err.find("1 of 2 requests already in"), std::string::npos) << r.err;
  auto got = read_jsonl(out);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], first[0]);
  EXPECT_EQ(got[1]["custom_id"], "b");
  EXPECT_EQ(got[1]["response"]["status_code"], 400);
  // The failed line counts as done: nothing left to run, and the exit code still says a line failed.
  r = flexh2o(gen(in, out, "--resume"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("2 of 2 requests already in"), std::string::npos) << r.err;
  EXPECT_EQ(read_jsonl(out).size(), 2u);

  // flexh2o result lines are not the output of a Batch file, nor a mix of the two.
  const fs::path ours = tmp.path() / "ours.jsonl";
  std::ofstream(ours) << json{{"id", "a"}, {"text", ""}, {"token_ids", json::array()}}.dump() << "\n";
  r = flexh2o(gen(in, ours, "--resume"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("holds the results of a flexh2o JSONL file but --input " + in.string() +
                       " is an OpenAI Batch file"), std::string::npos) << r.err;
  std::ofstream(ours, std::ios::app) << got[0].dump() << "\n";
  r = flexh2o(gen(in, ours, "--resume"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("ours.jsonl:2 is an OpenAI Batch output line but line 1 is not"), std::string::npos) << r.err;
}

// custom_ids key --resume, so a file whose custom_ids repeat is refused before the run and before
// --output is touched, naming both lines (OpenAI's Batch API refuses such a file too).
TEST(BatchCli, RepeatedCustomIdsAreRefusedBeforeTheRun) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_lines(in, {completion("a", {{"prompt", "hi"}}), completion("b", {{"prompt", "hi"}}),
                   completion("a", {{"prompt", "And"}})});
  RunResult r = flexh2o(gen(in, out));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("in.jsonl:3 repeats custom_id \"a\" of line 1; custom_ids must be unique"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out) && fs::file_size(out) > 0);
}

// Lines without a usable custom_id (not JSON, none, not a non-empty string) get their error lines
// with the custom_id they had (null when unknown), and a run cut anywhere resumes to the whole
// run's lines: their error lines are the first such lines', in input order.
TEST(BatchCli, LinesWithoutACustomIdResume) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  json none = completion("", {{"prompt", "hi"}, {"max_tokens", 2}});
  none.erase("custom_id");
  {
    std::ofstream f(in);
    f << completion("a", {{"prompt", "hi"}, {"max_tokens", 2}}).dump() << "\n"
      << "not json\n"
      << completion("b", {{"prompt", "And"}, {"max_tokens", 2}}).dump() << "\n"
      << none.dump() << "\n"
      << completion("c", {{"prompt", "God"}, {"max_tokens", 2}}).dump() << "\n";
  }
  RunResult r = flexh2o(gen(in, out));
  EXPECT_EQ(r.code, 1) << r.err;
  const auto whole = read_jsonl(out);
  ASSERT_EQ(whole.size(), 5u);
  const json ids = json::array({"a", nullptr, "b", nullptr, "c"});
  auto shape = [](const std::vector<json>& lines) {
    json s = json::array();
    for (const json& l : lines) s.push_back({l["custom_id"], l["response"]["status_code"], l["response"]["body"].value("choices", json())});
    return s;
  };
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(whole[i]["custom_id"], ids[i]) << i;
  for (const size_t kept : {0, 1, 2, 3, 4, 5}) {
    {
      std::ofstream f(out);
      for (size_t i = 0; i < kept; ++i) f << whole[i].dump() << "\n";
    }
    r = flexh2o(gen(in, out, "--resume"));
    EXPECT_EQ(r.code, 1) << kept << ": " << r.err;
    EXPECT_NE(r.err.find(std::to_string(kept) + " of 5 requests already in"), std::string::npos) << r.err;
    const auto got = read_jsonl(out);
    ASSERT_EQ(got.size(), 5u) << kept;
    EXPECT_EQ(shape(got), shape(whole)) << kept;
  }
  // More such error lines than the input has such lines: another input's output.
  {
    std::ofstream f(out);
    for (const size_t i : {0, 1, 3, 1}) f << whole[i].dump() << "\n";
  }
  r = flexh2o(gen(in, out, "--resume"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("holds 3 error lines of requests without a usable custom_id, more than"), std::string::npos)
      << r.err;
}

// Echoed prompts are scored before the run, as one step of many logit rows: when that does not
// fit (here the host budget for those rows), --output under --overwrite keeps what it held.
TEST(BatchCli, EchoScoringThatDoesNotFitLeavesTheOutput) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_lines(in, {completion("r1", {{"prompt", "In the beginning God created the heaven and the earth. And the "
                                                "earth was without form, and void."},
                                     {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}})});
  const std::string old = R"({"custom_id": "r0", "response": null, "error": null})" "\n";
  std::ofstream(out) << old;
  const std::string flags = " --overwrite --percent 100 0 100 0 100 0 --cpu-mem ";
  RunResult r = flexh2o(gen(in, out, flags + "200KiB"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("host budget exceeded: logits needs"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(out), old);
  r = flexh2o(gen(in, out, flags + "1MiB"));  // the rows of one sequence, not of the block of 4
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_jsonl(out).at(0)["custom_id"], "r1");
}

TEST(BatchCli, HelpTeachesBothFormats) {
  RunResult r = flexh2o("generate --help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"flexh2o's {\"prompt\": ...}", "OpenAI Batch file", "/v1/chat/completions", "batch_req_",
                        "python -m flexh2o generate", "never used to pick a model"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

}  // namespace
