// eval-choice's metrics and requests against lm-eval's definitions, read back from
// --log-samples: acc_norm per character and acc_bytes per UTF-8 byte of the choice (the target
// delimiter not counted), the delimiter between context and choice, Unicode trailing whitespace
// moved to the choice (str.rstrip) and an empty context's leading prefix id.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::TempDir;

const std::string kOpt = model_dir("tiny-opt").string();

// Writes `lines` as the task file `name` in `dir`.
std::string write_tasks(const TempDir& dir, const std::string& name, const std::vector<std::string>& lines) {
  const fs::path f = dir.path() / name;
  std::ofstream o(f);
  for (const std::string& l : lines) o << l << "\n";
  return f.string();
}

struct Scored {
  json summary;
  std::vector<json> samples;  // --log-samples, a line per item
};

Scored eval_choice(const TempDir& dir, const std::string& tasks, const std::string& flags = "") {
  const fs::path log = dir.path() / "samples.jsonl";
  flexh2o::test::RunResult r = flexh2o::test::run_flexh2o("eval-choice --model " + kOpt + " --tasks " + tasks +
                                                          " --json --device cpu --threads 2 --log-samples " +
                                                          log.string() + " " + flags);
  EXPECT_EQ(r.code, 0) << r.err;
  Scored run;
  if (r.code != 0) return run;
  run.summary = json::parse(r.out);
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) run.samples.push_back(json::parse(line));
  return run;
}

// numpy's argmax of loglik / the choices' `unit` field: the first largest.
int64_t argmax_per(const json& sample, const char* unit) {
  int64_t best = 0;
  const json& c = sample["choices"];
  for (size_t i = 1; i < c.size(); ++i)
    if (c[i]["loglik"].get<double>() / c[i][unit].get<double>() >
        c[size_t(best)]["loglik"].get<double>() / c[size_t(best)][unit].get<double>())
      best = int64_t(i);
  return best;
}

TEST(EvalChoiceMetrics, AreLmEvalsPerCharacterAndPerByte) {
  TempDir tmp;
  // Choices of equal characters and unequal bytes (é, ï and — are 2 and 3 UTF-8 bytes).
  const std::string tasks = write_tasks(
      tmp, "t.jsonl",
      {R"({"context": "And he went into the", "choices": ["café", "city", "naïve", "house"], "label": 3})",
       R"({"context": "In the beginning God created the", "choices": ["heaven", "earth—", "sea"], "label": 0})",
       R"({"context": "And the LORD said unto", "choices": ["Moses", "Mosés", "him"], "label": 0})",
       R"({"context": "Blessed are the", "choices": ["meek", "poor in spirit", "peacemakers"], "label": 2})"});
  Scored run = eval_choice(tmp, tasks, "--target-delimiter ' '");
  ASSERT_EQ(run.samples.size(), 4u);
  const std::vector<std::vector<std::pair<int, int>>> lengths = {  // (chars, bytes) of each choice
      {{4, 5}, {4, 4}, {5, 6}, {5, 5}},
      {{6, 6}, {6, 8}, {3, 3}},
      {{5, 5}, {5, 6}, {3, 3}},
      {{4, 4}, {14, 14}, {11, 11}}};
  int64_t norm = 0, bytes = 0, token = 0, plain = 0;
  for (size_t i = 0; i < run.samples.size(); ++i) {
    const json& s = run.samples[i];
    EXPECT_EQ(s["line"], int64_t(i) + 1);
    ASSERT_EQ(s["choices"].size(), lengths[i].size());
    for (size_t k = 0; k < lengths[i].size(); ++k) {
      const json& c = s["choices"][k];
      EXPECT_EQ(c["chars"], lengths[i][k].first) << i << " " << k;
      EXPECT_EQ(c["bytes"], lengths[i][k].second) << i << " " << k;
      EXPECT_GT(c["tokens"].get<int>(), 0);
      EXPECT_LT(c["loglik"].get<double>(), 0.0);
    }
    EXPECT_EQ(s["pred_norm"], argmax_per(s, "chars"));
    EXPECT_EQ(s["pred_bytes"], argmax_per(s, "bytes"));
    EXPECT_EQ(s["pred_norm_token"], argmax_per(s, "tokens"));
    norm += s["pred_norm"] == s["label"];
    bytes += s["pred_bytes"] == s["label"];
    token += s["pred_norm_token"] == s["label"];
    plain += s["pred"] == s["label"];
  }
  EXPECT_EQ(run.summary["correct"], plain);
  EXPECT_EQ(run.summary["correct_norm"], norm);
  EXPECT_EQ(run.summary["correct_bytes"], bytes);
  EXPECT_EQ(run.summary["correct_norm_token"], token);
  EXPECT_DOUBLE_EQ(run.summary["acc_norm"].get<double>(), double(norm) / 4);
  EXPECT_DOUBLE_EQ(run.summary["acc_bytes"].get<double>(), double(bytes) / 4);
  EXPECT_EQ(run.summary["target_delimiter"], " ");
}

// The same requests written two ways score the same: a separating space in each choice, or
// --target-delimiter ' ' (then not counted in the choice's characters); trailing whitespace of
// the context, a Unicode one included, or the same at the front of each choice.
TEST(EvalChoiceRequests, DelimiterAndTrailingWhitespaceAreLmEvals) {
  TempDir tmp;
  const std::string ctx = R"("context": "In the beginning God created the)";
  const std::string spaced =
      write_tasks(tmp, "a.jsonl", {"{" + ctx + R"(", "choices": [" heaven", " cheese"], "label": 0})"});
  const std::string bare =
      write_tasks(tmp, "b.jsonl", {"{" + ctx + R"(", "choices": ["heaven", "cheese"], "label": 0})"});
  const std::string nbsp_context =
      write_tasks(tmp, "c.jsonl", {"{" + ctx + R"(\u00a0", "choices": ["heaven", "cheese"], "label": 0})"});
  const std::string nbsp_choice =
      write_tasks(tmp, "d.jsonl", {"{" + ctx + R"(", "choices": ["\u00a0heaven", "\u00a0cheese"], "label": 0})"});
  const Scored a = eval_choice(tmp, spaced), b = eval_choice(tmp, bare, "--target-delimiter ' '");
  const Scored c = eval_choice(tmp, nbsp_context), d = eval_choice(tmp, nbsp_choice);
  for (const Scored* r : {&a, &b, &c, &d}) ASSERT_EQ(r->samples.size(), 1u);
  for (size_t k = 0; k < 2; ++k) {
    const json &ca = a.samples[0]["choices"][k], &cb = b.samples[0]["choices"][k];
    EXPECT_EQ(ca["loglik"], cb["loglik"]);
    EXPECT_EQ(ca["tokens"], cb["tokens"]);
    EXPECT_EQ(ca["chars"].get<int>(), cb["chars"].get<int>() + 1);  // the delimiter is not counted
    const json &cc = c.samples[0]["choices"][k], &cd = d.samples[0]["choices"][k];
    EXPECT_EQ(cc["loglik"], cd["loglik"]);
    EXPECT_EQ(cc["tokens"], cd["tokens"]);
  }
  EXPECT_EQ(a.samples[0]["context_tokens"], b.samples[0]["context_tokens"]);
  // The no-break space left the context: the same context ids as without it.
  EXPECT_EQ(c.samples[0]["context_tokens"], a.samples[0]["context_tokens"]);
  EXPECT_EQ(d.samples[0]["context_tokens"], a.samples[0]["context_tokens"]);
}

// An empty context is the prefix token (OPT's BOS, "</s>"); a continuation whose own first id is
// that token takes it as the context (lm-eval's LM.loglikelihood), so "</s>" + text scores as text.
TEST(EvalChoiceRequests, AnEmptyContextsLeadingPrefixIdIsTheContext) {
  TempDir tmp;
  const Scored plain = eval_choice(
      tmp, write_tasks(tmp, "a.jsonl", {R"({"context": "", "choices": ["In the beginning", "Cheese"], "label": 0})"}));
  const Scored led = eval_choice(
      tmp, write_tasks(tmp, "b.jsonl",
                       {R"({"context": "", "choices": ["</s>In the beginning", "</s>Cheese"], "label": 0})"}));
  ASSERT_EQ(plain.samples.size(), 1u);
  ASSERT_EQ(led.samples.size(), 1u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(led.samples[0]["choices"][k]["loglik"], plain.samples[0]["choices"][k]["loglik"]);
    EXPECT_EQ(led.samples[0]["choices"][k]["tokens"], plain.samples[0]["choices"][k]["tokens"]);
  }
}

// --streaming: the full cache scores as the prefill does; under H2O the offloading engine scores
// as memory does, and the budget inside the context changes the numbers.
TEST(EvalChoiceStreaming, FullEqualsPrefillAndOffloadedEqualsInMemory) {
  TempDir tmp;
  const std::string tasks = (flexh2o::test::data_dir() / "tasks/bible_cloze.jsonl").string();
  const std::string h2o = " --limit 6 --kv-dtype f32 --kv-policy h2o --heavy-ratio 0.1 --recent-ratio 0.1";
  const Scored full = eval_choice(tmp, tasks, "--limit 6 --kv-dtype f32"),
               full_streamed = eval_choice(tmp, tasks, "--limit 6 --kv-dtype f32 --streaming"),
               prefilled = eval_choice(tmp, tasks, h2o), streamed = eval_choice(tmp, tasks, h2o + " --streaming"),
               offloaded = eval_choice(tmp, tasks, h2o + " --streaming --percent 30 70 0 100 100 0 --gpu-batch-size 2");
  EXPECT_EQ(streamed.summary["mode"], "streaming");
  EXPECT_EQ(prefilled.summary["mode"], "prefill");
  bool differs = false;
  for (const Scored* s : {&full, &full_streamed, &prefilled, &streamed, &offloaded}) ASSERT_EQ(s->samples.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    for (size_t k = 0; k < full.samples[i]["choices"].size(); ++k) {
      auto ll = [&](const Scored& s) { return s.samples[i]["choices"][k]["loglik"].get<double>(); };
      EXPECT_NEAR(ll(full_streamed), ll(full), 1e-6 * std::abs(ll(full))) << i << " " << k;
      EXPECT_NEAR(ll(offloaded), ll(streamed), 1e-6 * std::abs(ll(streamed))) << i << " " << k;
      differs = differs || std::abs(ll(streamed) - ll(prefilled)) > 1e-3;
    }
  EXPECT_TRUE(differs);
}

TEST(EvalChoiceErrors, LogSamplesMayNotBeTheTasks) {
  TempDir tmp;
  const std::string tasks =
      write_tasks(tmp, "t.jsonl", {R"({"context": "The sky is", "choices": [" blue", " green"], "label": 0})"});
  const std::string before = flexh2o::test::read_text(tasks);
  flexh2o::test::RunResult r = flexh2o::test::run_flexh2o("eval-choice --model " + kOpt + " --tasks " + tasks +
                                                          " --device cpu --log-samples " + tasks);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--log-samples"), std::string::npos) << r.err;
  EXPECT_EQ(flexh2o::test::read_text(tasks), before);
}

}  // namespace
