// The sampling flags through the program: repetition penalty, --logprobs, and the sampling
// defaults a model's generation_config.json sets.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::read_jsonl;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args, ""); }

const std::string kOpt = model_dir("tiny-opt").string();
// The repetition penalty breaks tiny-opt's greedy loop; a penalty outside its range is refused
// before anything runs, and a line's own bad value is that line's error.
TEST(Cli, PenaltiesChangeGreedyTextAndBadValuesAreNamed) {
  const std::string run = "generate -m " + kOpt + " --prompt 'In the beginning God created' --greedy -n 8 --device cpu";
  RunResult r = flexh2o(run + " --repetition-penalty 1.8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out, ", and the LORD, and the LORD\n");
  EXPECT_EQ(r.out.find(", and the LORD, and the LORD"), std::string::npos) << r.out;
  RunResult bad = flexh2o(run + " --presence-penalty 3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("presence_penalty must be in [-2, 2], got 3"), std::string::npos) << bad.err;
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"id": "a", "prompt": "Jesus wept.", "max_new_tokens": 2, "min_p": 2})" << "\n";
    f << R"({"id": "b", "prompt": "Jesus wept.", "max_new_tokens": 2, "min_p": 0.1, "repetition_penalty": 1.3})"
      << "\n";
  }
  RunResult lines = flexh2o("generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() + " --device cpu");
  EXPECT_EQ(lines.code, 1);
  const auto got = read_jsonl(out);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0]["error"].get<std::string>().find("min_p must be in [0, 1], got 2"), std::string::npos) << got[0];
  EXPECT_EQ(got[1]["token_ids"].size(), 2u) << got[1];
}

// --logprobs N: one log-probability per generated token, N alternatives most likely first; greedy
// tokens are the first alternative, with the same value. A line may ask for its own; out of
// range is refused.
TEST(Cli, LogprobsAreWrittenPerTokenWithAlternatives) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"id": "g", "prompt": "In the beginning", "max_new_tokens": 5, "temperature": 0})" << "\n";
    f << R"({"id": "s", "prompt": "Jesus wept.", "max_new_tokens": 4, "logprobs": 0})" << "\n";
    f << R"({"id": "none", "prompt": "Jesus wept.", "max_new_tokens": 2, "logprobs": null})" << "\n";
    f << R"({"id": "bad", "prompt": "Jesus wept.", "max_new_tokens": 2, "logprobs": 21})" << "\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() +
                        " --device cpu --logprobs 3 --ignore-eos");
  EXPECT_EQ(r.code, 1) << r.err;  // the bad line
  const auto got = read_jsonl(out);
  ASSERT_EQ(got.size(), 4u);
  const json& g = got[0];
  ASSERT_EQ(g["logprobs"].size(), 5u) << g;
  ASSERT_EQ(g["top_logprobs"].size(), 5u) << g;
  for (size_t t = 0; t < 5; ++t) {
    const json& alts = g["top_logprobs"][t];
    ASSERT_EQ(alts.size(), 3u) << g;
    EXPECT_EQ(alts[0]["id"], g["token_ids"][t]) << "greedy takes the most likely";
    EXPECT_EQ(alts[0]["logprob"], g["logprobs"][t]);
    EXPECT_LE(alts[0]["logprob"].get<double>(), 0.0);
    EXPECT_GE(alts[0]["logprob"].get<double>(), alts[1]["logprob"].get<double>());
    EXPECT_GE(alts[1]["logprob"].get<double>(), alts[2]["logprob"].get<double>());
  }
  EXPECT_EQ(got[1]["logprobs"].size(), 4u) << got[1];
  EXPECT_FALSE(got[1].contains("top_logprobs")) << got[1];
  EXPECT_EQ(got[2]["logprobs"].size(), 2u) << "null takes the flag's value";
  EXPECT_EQ(got[3]["error"], "field \"logprobs\" must be an integer in [0, 20], got 21.") << got[3];
  RunResult off = flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --logprobs 21");
  EXPECT_EQ(off.code, 2) << off.err;
  EXPECT_NE(off.err.find("--logprobs"), std::string::npos) << off.err;
}

// A model's generation_config.json sets the sampling defaults (as vLLM reads it): temperature 0
// there is greedy; a flag given wins; --generation-config none ignores the file; a bad value is
// refused naming the file.
TEST(Cli, GenerationConfigSetsSamplingDefaultsFlagsWin) {
  TempDir tmp;
  const fs::path model = tmp.path() / "m";
  fs::copy(model_dir("tiny-llama"), model, fs::copy_options::recursive);
  auto write_config = [&](const std::string& text) { std::ofstream(model / "generation_config.json") << text; };
  const std::string run = "generate -m " + model.string() + " --prompt 'In the beginning God created' -n 12 "
                          "--device cpu --seed 5 --ignore-eos";
  RunResult greedy = flexh2o(run + " --greedy");
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  RunResult plain = flexh2o(run);  // tiny-llama's own file has no sampling values: temperature 1
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_NE(plain.out, greedy.out) << "seed 5 should not sample the greedy text";
  EXPECT_EQ(plain.err.find("sampling defaults from"), std::string::npos) << plain.err;
  write_config(R"({"bos_token_id": 0, "eos_token_id": 2, "do_sample": true, "temperature": 0, "top_p": 0.9})");
  RunResult from_file = flexh2o(run);
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, greedy.out);
  EXPECT_NE(from_file.err.find("generation_config.json: temperature 0, top_p 0.9"), std::string::npos)
      << from_file.err;
  RunResult flag = flexh2o(run + " --temperature 1");
  ASSERT_EQ(flag.code, 0) << flag.err;
  EXPECT_NE(flag.out, greedy.out) << "the flag must win over the file";
  RunResult none = flexh2o(run + " --generation-config none");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out, plain.out);
  write_config(R"({"temperature": "hot"})");
  RunResult bad = flexh2o(run);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("generation_config.json: \"temperature\" must be a number, got \"hot\""),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("--generation-config none"), std::string::npos) << bad.err;
}

// Flags that ask for two decodings at once are a wrong command line: --greedy with a sampling
// temperature ran greedy, and bench's --top-p without --temperature timed greedy decoding.
TEST(Cli, GreedyWithATemperatureAndBenchTopPWithoutOneAreRefused) {
  const std::string gen = "generate -m " + kOpt + " --prompt 'Jesus wept.' -n 2 --device cpu";
  RunResult r = flexh2o(gen + " --greedy --temperature 0.7");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--greedy is temperature 0 and --temperature is 0.7: give one of them"), std::string::npos)
      << r.err;
  EXPECT_EQ(flexh2o(gen + " --greedy --temperature 0").code, 0);
  const std::string bench = "bench -m " + kOpt + " --prompt-len 4 --gen-len 1 --device cpu";
  for (const char* flag : {"--top-p 0.9", "--top-k 5"}) {
    r = flexh2o(bench + " " + flag);
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.err;
    EXPECT_NE(r.err.find("shapes sampled decoding and --temperature is 0"), std::string::npos) << r.err;
    EXPECT_EQ(flexh2o(bench + " " + flag + " --temperature 0.8").code, 0) << flag;
  }
}
// Every end-of-sequence id of config.json and generation_config.json ends a sequence, as
// transformers' generate() and vLLM stop (Gemma's instruct models list <end_of_turn> there, beside
// the tokenizer's <eos>), under --generation-config none too (it drops sampling defaults, not the
// model's ends); an id outside the vocabulary is said and ignored; a malformed one is refused
// naming the file, unless --generation-config none.
TEST(Cli, EveryListedEosIdEndsASequence) {
  TempDir tmp;
  const fs::path model = tmp.path() / "m", out = tmp.path() / "o.jsonl";
  fs::copy(model_dir("tiny-llama"), model, fs::copy_options::recursive);
  auto write_config = [&](const std::string& text) { std::ofstream(model / "generation_config.json") << text; };
  const std::string run = "generate -m " + model.string() + " --prompt 'In the beginning God created' -n 12 "
                          "--device cpu --greedy --overwrite -o " + out.string();
  auto result = [&](const std::string& extra) {
    RunResult r = flexh2o(run + extra);
    EXPECT_EQ(r.code, 0) << r.err;
    const std::vector<json> got = read_jsonl(out);
    return got.size() == 1 ? got[0] : json();
  };
  const json full = result("");
  ASSERT_EQ(full["finish_reason"], "length") << full;
  const std::vector<int32_t> tokens = full["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), 12u);
  const int32_t end = tokens[4];
  const size_t n = size_t(std::find(tokens.begin(), tokens.end(), end) - tokens.begin()) + 1;
  const json cut_ids(std::vector<int32_t>(tokens.begin(), tokens.begin() + std::ptrdiff_t(n)));
  write_config(R"({"eos_token_id": [2, )" + std::to_string(end) + "]}");
  json cut = result("");
  EXPECT_EQ(cut["token_ids"], cut_ids) << cut;
  EXPECT_EQ(cut["finish_reason"], "eos") << cut;
  EXPECT_EQ(result(" --generation-config none")["token_ids"], cut_ids);
  EXPECT_EQ(result(" --ignore-eos")["token_ids"], full["token_ids"]);
  fs::remove(model / "generation_config.json");
  std::ifstream in(model / "config.json");
  json config = json::parse(in);
  in.close();
  config["eos_token_id"] = {2, end};
  std::ofstream(model / "config.json") << config.dump();
  cut = result(" --generation-config none");
  EXPECT_EQ(cut["token_ids"], cut_ids) << cut;
  config["eos_token_id"] = 2;
  std::ofstream(model / "config.json") << config.dump();
  write_config(R"({"eos_token_id": [2, 4096]})");
  RunResult outside = flexh2o(run);
  EXPECT_EQ(outside.code, 0) << outside.err;
  EXPECT_NE(outside.err.find("generation_config.json names end-of-sequence id 4096, outside the model's 4096 ids"),
            std::string::npos)
      << outside.err;
  write_config(R"({"eos_token_id": [2, "x"]})");
  RunResult bad = flexh2o(run);
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_NE(bad.err.find("generation_config.json: \"eos_token_id\" must be a token id or a non-empty list of them, "
                         "got [2,\"x\"]; fix it or pass --generation-config none"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(result(" --generation-config none")["token_ids"], full["token_ids"]);
}
}  // namespace
