// The eval-ppl and eval-choice commands as a user runs them: the JSON contract, reference
// perplexity, policy budgets in the output, accuracy above chance on the shipped task file,
// and bad flags / bad task files (clear error naming the flag or line, non-zero exit).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::read_json;
using flexh2o::test::TempDir;

using flexh2o::test::RunResult;

RunResult flexh2o(const std::string& args, const std::string& env = "") { return flexh2o::test::run_flexh2o(args, env); }

json run_json(const std::string& args) {
  RunResult r = flexh2o(args + " --json --device cpu --threads 2");
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  if (r.code != 0) return json::object();
  return json::parse(r.out);
}

std::string eval_txt(const std::string& model) { return (model_dir(model) / "reference/eval.txt").string(); }
const std::string kTasks = (flexh2o::test::data_dir() / "tasks/bible_cloze.jsonl").string();

class EvalCli : public ::testing::TestWithParam<std::string> {
 protected:
  std::string model() const { return model_dir(GetParam()).string(); }
};

TEST_P(EvalCli, PerplexityJsonMatchesReferenceOnBothPaths) {
  const double want = read_json(model_dir(GetParam()) / "reference/perplexity_full.json")["perplexity"];
  json pre = run_json("eval-ppl --model " + model() + " --max-tokens 1024 " + eval_txt(GetParam()));
  json st = run_json("eval-ppl --model " + model() + " --max-tokens 1024 --streaming " + eval_txt(GetParam()));
  for (const json& j : {pre, st}) {
    ASSERT_TRUE(j.contains("perplexity") && j.contains("tokens")) << j;
    EXPECT_EQ(j["tokens"], 1024);
    EXPECT_EQ(j["kv_policy"], "full");
    EXPECT_NEAR(j["perplexity"].get<double>(), want, 0.005 * want);
    // The JSON names what it scored and how long that took.
    EXPECT_EQ(j["model"], GetParam());
    EXPECT_EQ(j["input"], eval_txt(GetParam()));
    EXPECT_GT(j["seconds"].get<double>(), 0.0);
  }
  EXPECT_EQ(pre["mode"], "prefill");
  EXPECT_EQ(st["mode"], "streaming");
  EXPECT_NEAR(st["perplexity"].get<double>(), pre["perplexity"].get<double>(), 1e-4 * want);
}

TEST_P(EvalCli, RatiosAreFractionsOfTheTokensScored) {
  json j = run_json("eval-ppl --model " + model() + " --max-tokens 200 --kv-policy h2o --heavy-ratio 0.1 "
                    "--recent-ratio 0.15 " + eval_txt(GetParam()));
  EXPECT_EQ(j["tokens"], 200);
  EXPECT_EQ(j["mode"], "streaming");
  EXPECT_EQ(j["kv_budget"]["heavy"], 20);
  EXPECT_EQ(j["kv_budget"]["recent"], 30);
  EXPECT_EQ(j["kv_budget"]["total"], 50);
  EXPECT_EQ(j["kv_policy"], "h2o heavy=20 recent=30");
  // Budgets in tokens are absolute; one covering the text gives exactly the full numbers.
  json big = run_json("eval-ppl --model " + model() + " --max-tokens 200 --kv-policy sinks --recent-budget 300 " +
                      eval_txt(GetParam()));
  json full = run_json("eval-ppl --model " + model() + " --max-tokens 200 --streaming " + eval_txt(GetParam()));
  EXPECT_EQ(big["kv_budget"]["total"], 304);
  EXPECT_EQ(big["perplexity"], full["perplexity"]);
}

// Offloading flags stream the text through the offloading engine: exactly the in-memory
// streaming numbers (full cache, KV on the host; H2O with weights and KV on disk).
TEST_P(EvalCli, OffloadedPerplexityEqualsInMemory) {
  flexh2o::test::TempDir dir;
  const std::string base = "eval-ppl --model " + model() + " --max-tokens 120 ";
  json mem = run_json(base + "--streaming " + eval_txt(GetParam()));
  json off = run_json(base + "--percent 0 100 0 100 100 0 --gpu-batch-size 1 " + eval_txt(GetParam()));
  EXPECT_EQ(off["perplexity"], mem["perplexity"]);
  EXPECT_GT(off["offload"]["bytes_moved"]["host_to_device"].get<uint64_t>(), 0u);
  const std::string h2o = "--kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1 ";
  json mem_h = run_json(base + h2o + eval_txt(GetParam()));
  json off_h = run_json(base + h2o + "--percent 0 0 0 0 100 0 --gpu-batch-size 1 --offload-dir " +
                        (dir.path() / "store").string() + " " + eval_txt(GetParam()));
  EXPECT_EQ(off_h["perplexity"], mem_h["perplexity"]);
  EXPECT_EQ(off_h["kv_budget"], mem_h["kv_budget"]);
  EXPECT_GT(off_h["offload"]["bytes_moved"]["disk_to_host"].get<uint64_t>(), 0u);
}

// --compress-weight / --compress-cache (and --kv-dtype q4, the same as the latter): in memory
// they change the numbers (the Q4 weights and cache), and the offloaded run with the weights and
// half the KV on disk gives exactly the in-memory compressed perplexity; the report says Q4
// and the weight bytes crossing host->device are ~0.28x of the uncompressed run's.
TEST_P(EvalCli, CompressedPerplexityOffloadedEqualsInMemory) {
  flexh2o::test::TempDir dir;
  const std::string base = "eval-ppl --model " + model() + " --max-tokens 60 ";
  const std::string z = "--compress-weight --compress-cache ";
  json plain = run_json(base + "--streaming " + eval_txt(GetParam()));
  json mem = run_json(base + z + "--streaming " + eval_txt(GetParam()));
  json q4 = run_json(base + "--compress-weight --kv-dtype q4 --streaming " + eval_txt(GetParam()));
  EXPECT_EQ(mem["kv_dtype"], "Q4");
  EXPECT_EQ(mem["compress_weight"], true);
  EXPECT_NE(mem["perplexity"], plain["perplexity"]);
  EXPECT_EQ(q4["perplexity"], mem["perplexity"]);
  const std::string off = "--percent 0 100 0 100 100 0 --gpu-batch-size 1 ";
  json offz = run_json(base + z + off + eval_txt(GetParam()));
  json offp = run_json(base + off + eval_txt(GetParam()));
  EXPECT_EQ(offz["perplexity"], mem["perplexity"]);
  EXPECT_EQ(offz["offload"]["kv_dtype"], "Q4");
  const double ratio = offz["offload"]["bytes_moved"]["host_to_device"].get<double>() /
                       offp["offload"]["bytes_moved"]["host_to_device"].get<double>();
  EXPECT_LT(ratio, 0.33);
  EXPECT_GT(ratio, 0.2);
  json disk = run_json(base + z + "--percent 0 0 0 0 100 0 --gpu-batch-size 1 --offload-dir " +
                       (dir.path() / "store").string() + " " + eval_txt(GetParam()));
  EXPECT_EQ(disk["perplexity"], mem["perplexity"]);
}

TEST_P(EvalCli, OffloadedChoiceScoresEqualInMemory) {
  const std::string base = "eval-choice --model " + model() + " --tasks " + kTasks + " --limit 12 ";
  json mem = run_json(base);
  json off = run_json(base + "--percent 30 70 0 100 100 0 --gpu-batch-size 2 --num-gpu-batches 2");
  EXPECT_EQ(off["correct"], mem["correct"]);
  EXPECT_EQ(off["correct_norm"], mem["correct_norm"]);
  EXPECT_GT(off["offload"]["bytes_moved"]["host_to_device"].get<uint64_t>(), 0u);
}

TEST_P(EvalCli, ChoiceAccuracyBeatsChanceWithTheFullCache) {
  json j = run_json("eval-choice --model " + model() + " --tasks " + kTasks);
  ASSERT_TRUE(j.contains("acc")) << j;
  std::printf("[%s] bible_cloze 0-shot full: acc %.3f acc_norm %.3f (chance %.3f, n=%d)\n", GetParam().c_str(),
              j["acc"].get<double>(), j["acc_norm"].get<double>(), j["chance"].get<double>(), j["count"].get<int>());
  EXPECT_EQ(j["count"], 50);
  EXPECT_EQ(j["model"], GetParam());
  EXPECT_EQ(j["input"], kTasks);
  EXPECT_GT(j["seconds"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["chance"].get<double>(), 0.25);
  EXPECT_GT(j["acc"].get<double>(), 0.25);
  EXPECT_GT(j["acc_norm"].get<double>(), 0.25);
  EXPECT_EQ(j["acc"].get<double>() * 50, j["correct"].get<double>());
}

TEST_P(EvalCli, ChoiceFewShotAndPolicyRun) {
  json j = run_json("eval-choice --model " + model() + " --tasks " + kTasks +
                    " --num-fewshot 3 --limit 10 --kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1");
  ASSERT_TRUE(j.contains("acc")) << j;
  std::printf("[%s] bible_cloze 3-shot h2o 20%% (10 items): acc %.3f acc_norm %.3f\n", GetParam().c_str(),
              j["acc"].get<double>(), j["acc_norm"].get<double>());
  EXPECT_EQ(j["count"], 10);
  EXPECT_EQ(j["num_fewshot"], 3);
  EXPECT_GT(j["mean_context_tokens"].get<double>(), 30.0);  // three solved examples + the item
  // Same run twice: deterministic few-shot selection (everything but the time it took).
  json again = run_json("eval-choice --model " + model() + " --tasks " + kTasks +
                        " --num-fewshot 3 --limit 10 --kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1");
  j.erase("seconds");
  again.erase("seconds");
  EXPECT_EQ(j, again);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, EvalCli, ::testing::Values("tiny-opt", "tiny-llama"));

const std::string kOpt = model_dir("tiny-opt").string();

struct BadFlag {
  std::string args, mention;
};

TEST(EvalCliErrors, BadFlagsNameTheFlagAndFail) {
  const std::string ppl = "eval-ppl --model " + kOpt + " " + eval_txt("tiny-opt") + " ";
  const std::string choice = "eval-choice --model " + kOpt + " --tasks " + kTasks + " ";
  for (const BadFlag& b : std::vector<BadFlag>{
           {ppl + "--kv-policy lru", "--kv-policy"},
           {ppl + "--kv-policy h2o --heavy-ratio 2", "--heavy-ratio"},
           {ppl + "--kv-policy h2o --heavy-ratio 0.1 --heavy-budget 5", "--heavy-ratio"},
           {ppl + "--kv-policy local --heavy-budget 5 --recent-budget 5", "--heavy-budget"},
           {ppl + "--kv-policy local", "--recent-"},
           {ppl + "--kv-policy h2o --recent-budget -1", "--recent-budget"},
           {ppl + "--recent-budget 8", "--recent-budget"},
           {ppl + "--kv-policy sinks --recent-budget 8 --kv-seed 3", "--kv-seed"},
           {ppl + "--max-tokens 0", "--max-tokens"},
           {ppl + "--compress-cache --kv-dtype f32", "--kv-dtype f32"},
           {ppl + "--kv-dtype q8", "--kv-dtype"},
           {choice + "--kv-policy random", "--kv-policy random"},
           {choice + "--num-fewshot -1", "--num-fewshot"},
           {choice + "--num-fewshot 50", "--num-fewshot"},
           {"eval-choice --model " + kOpt + " --tasks /nonexistent.jsonl", "/nonexistent.jsonl"},
       }) {
    RunResult r = flexh2o(b.args + " --json --device cpu");
    EXPECT_NE(r.code, 0) << b.args;
    EXPECT_NE(r.err.find(b.mention), std::string::npos) << b.args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << b.args << "\nstdout: " << r.out;
  }
}

TEST(EvalCliErrors, BadTaskLinesNameTheLine) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"context": "a", "choices": [" b", " c"], "label": 2})", ":2: \"label\" 2"},
      {R"({"context": "a", "choices": [" b"], "label": 0})", ":2: \"choices\""},
      {R"({"context": 5, "choices": [" b", " c"], "label": 0})", ":2: \"context\""},
      {R"({"context": "a", "choices": [" b", ""], "label": 0})", ":2: every choice"},
      {R"({"context": "a", "choices": [" b", " c"]})", ":2: \"label\""},
      {R"(not json)", ":2: invalid JSON"},
  };
  for (const auto& [line, mention] : cases) {
    const fs::path f = tmp.path() / "t.jsonl";
    {
      std::ofstream o(f);
      o << R"({"context": "In the beginning", "choices": [" God", " cheese"], "label": 0})" << "\n" << line << "\n";
    }
    RunResult r = flexh2o("eval-choice --model " + kOpt + " --tasks " + f.string() + " --device cpu");
    EXPECT_EQ(r.code, 1) << line;
    EXPECT_NE(r.err.find(mention), std::string::npos) << line << "\nstderr: " << r.err;
  }
}

// Prefill-mode perplexity through the offloading engine reads as many rows a step as the device
// budget fits: under a --gpu-mem that 1024 rows a step overrun, the same number as streaming, in
// more than one step and fewer than a token a step.
TEST(EvalCliBudget, PrefillReadsTheRowsTheDeviceBudgetFits) {
  TempDir tmp;
  const std::string model = model_dir("tiny-llama").string();
  const std::string off = " --percent 0 0 0 0 0 100 --gpu-mem 12MiB --offload-dir " + (tmp.path() / "s").string() + " ";
  const std::string base = "eval-ppl --model " + model + " --max-tokens 1024" + off;
  json pre = run_json(base + eval_txt("tiny-llama"));
  json st = run_json(base + "--streaming " + eval_txt("tiny-llama"));
  ASSERT_TRUE(pre.contains("perplexity") && st.contains("perplexity")) << pre << st;
  EXPECT_EQ(pre["mode"], "prefill");
  EXPECT_NEAR(pre["perplexity"].get<double>(), st["perplexity"].get<double>(), 1e-9 * st["perplexity"].get<double>());
  const int64_t steps = pre["offload"]["token_steps"];
  EXPECT_GT(steps, 1);
  EXPECT_LT(steps, 100);
  EXPECT_EQ(st["offload"]["token_steps"], 1024);
}

// eval-ppl --progress draws its line in memory too (the prefill path read the text silently).
TEST(EvalCliProgress, InMemoryPrefillDrawsProgress) {
  RunResult r = flexh2o("eval-ppl --model " + kOpt + " --max-tokens 600 --progress always --device cpu " +
                        eval_txt("tiny-opt"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[eval-ppl] 600/600 tokens"), std::string::npos) << r.err;
}

// The engine flags an evaluation cannot use are refused as a wrong command line, before the model
// loads (the model path here does not exist); --batch-size is the offloading block, as generate's -b.
TEST(EvalCliErrors, EngineFlagsAreCheckedAsGenerateChecksThem) {
  for (const char* cmd : {"eval-ppl --model /nonexistent/m x.txt", "eval-choice --model /nonexistent/m --tasks t"}) {
    RunResult r = flexh2o(std::string(cmd) + " --policy auto");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("--policy auto is not supported; give --percent"), std::string::npos) << r.err;
    r = flexh2o(std::string(cmd) + " --percent 0 100 0 100 100 0 --hardware h200");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("--hardware h200 is the profile --policy auto plans for"), std::string::npos) << r.err;
  }
  RunResult r = flexh2o("eval-choice --model /nonexistent/m --tasks t --batch-size 3 --gpu-batch-size 2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--batch-size 3 contradicts --gpu-batch-size"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("-b/"), std::string::npos) << "eval-choice has no -b: " << r.err;
  const std::string base =
      "eval-choice --model " + kOpt + " --tasks " + kTasks + " --limit 6 --percent 0 100 0 100 100 0";
  json one = run_json(base + " --batch-size 1"), three = run_json(base + " --batch-size 3");
  EXPECT_EQ(one["offload"]["policy"]["gpu_batch_size"], 1) << one;
  EXPECT_EQ(three["offload"]["policy"]["gpu_batch_size"], 3) << three;
  EXPECT_EQ(one["correct"], three["correct"]);
  EXPECT_EQ(one["correct_norm"], three["correct_norm"]);
}

// eval-choice builds HFLM's requests: a context's trailing newline moves to the choices (the
// same as writing it there), a context too long for the model is cut from the left and counted,
// and an item that cannot be scored fails the run before any is scored, naming its line and choice.
TEST(EvalCliChoice, RequestsAreLmEvalsAndEveryItemIsCheckedFirst) {
  TempDir tmp;
  auto write = [&](const std::string& name, const std::vector<std::string>& lines) {
    const fs::path f = tmp.path() / name;
    std::ofstream o(f);
    for (const std::string& l : lines) o << l << "\n";
    return f.string();
  };
  const std::string run = "eval-choice --model " + kOpt + " --tasks ";
  const std::string moved =
      write("a.jsonl", {R"({"context": "In the beginning God created the", "choices": ["\n heaven", "\n cheese"],)"
                        R"( "label": 0})",
                        R"({"context": "And God said, Let there be", "choices": ["\n light", "\n wet"], "label": 0})"});
  const std::string newline =
      write("b.jsonl", {R"({"context": "In the beginning God created the\n", "choices": [" heaven", " cheese"],)"
                        R"( "label": 0})",
                        R"({"context": "And God said, Let there be\n", "choices": [" light", " wet"], "label": 0})"});
  json a = run_json(run + moved), b = run_json(run + newline);
  a.erase("seconds"), a.erase("input"), b.erase("seconds"), b.erase("input");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a["truncated_items"], 0);
  std::string long_context;
  for (int i = 0; i < 400; ++i) long_context += "and the earth was without form, ";
  const std::string item =
      R"({"context": ")" + long_context + R"(and God said", "choices": [" light", " cheese"], "label": 0})";
  json cut = run_json(run + write("c.jsonl", {item, item}));
  EXPECT_EQ(cut["truncated_items"], 2) << cut;
  EXPECT_EQ(cut["count"], 2);
  // BERT's normalizer drops a zero-width space: the last item's first choice is no tokens.
  std::vector<std::string> lines(40, R"({"context": "The sky is", "choices": [" blue", " green"], "label": 0})");
  lines.push_back(R"({"context": "The sky is", "choices": ["\u200b", " b"], "label": 0})");
  RunResult r = flexh2o(run + write("d.jsonl", lines) + " --device cpu --progress always --tokenizer " +
                        (flexh2o::test::data_dir() / "tokenizers/bert").string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("d.jsonl:41: choice 0 \"\u200b\" encodes to no tokens after the context"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("[eval-choice]"), std::string::npos) << "no item is scored first:\n" << r.err;
}

}  // namespace
