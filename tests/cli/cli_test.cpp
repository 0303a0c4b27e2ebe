// The flexh2o program as a user runs it: generate (JSONL contract, report, bad lines),
// tokenize/detokenize, info, hub-cache resolution, device selection, exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::model_dir;
using flexh2o::test::read_jsonl;
using flexh2o::test::read_json;
using flexh2o::test::TempDir;

using flexh2o::test::RunResult;

RunResult flexh2o(const std::string& args, const std::string& env = "") { return flexh2o::test::run_flexh2o(args, env); }

const std::string kOpt = model_dir("tiny-opt").string();

TEST(Cli, GenerateJsonlKeepsOrderAndMatchesReference) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", rep = tmp.path() / "run.json";
  auto greedy = read_json(model_dir("tiny-opt") / "reference/greedy.json");
  {
    std::ofstream f(in);
    int i = 0;
    for (const auto& p : greedy["prompts"]) f << json{{"id", "p" + std::to_string(i++)}, {"prompt", p["prompt"]}} << "\n";
    f << json{{"prompt_ids", greedy["prompts"][0]["ids"]}, {"max_new_tokens", 5}} << "\n";
  }
  RunResult r = flexh2o("generate --model " + kOpt + " --input " + in.string() + " --output " + out.string() +
                  " --report " + rep.string() + " --greedy --ignore-eos -n 32 --batch-size 3 --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["id"], "p" + std::to_string(i));
    EXPECT_EQ(lines[i]["token_ids"], greedy["prompts"][i]["generated_ids"]);
    EXPECT_EQ(lines[i]["text"], greedy["prompts"][i]["generated_text"]);
    EXPECT_EQ(lines[i]["finish_reason"], "length");
  }
  EXPECT_EQ(lines[3]["id"], 3);  // no id given: the line's index
  auto first5 = greedy["prompts"][0]["generated_ids"].get<std::vector<int>>();
  first5.resize(5);
  EXPECT_EQ(lines[3]["token_ids"].get<std::vector<int>>(), first5);
  auto report = read_json(rep);
  for (const char* k : {"prefill_seconds", "decode_seconds", "tokens_per_s", "peak_rss_bytes", "generated_tokens"})
    EXPECT_TRUE(report.contains(k)) << k;
  EXPECT_EQ(report["generated_tokens"], 3 * 32 + 5);
  EXPECT_EQ(report["decode_tokens"], 3 * 31 + 4);  // each request's first token is the prefill's
  EXPECT_EQ(report["decode_tokens_per_s"], report["decode_tokens"].get<double>() / report["decode_seconds"].get<double>());
  EXPECT_NE(r.out.find("[\"p0\"]"), std::string::npos);  // human-readable results on stdout
}

TEST(Cli, BadLinesAreReportedWithLineNumbersOthersStillRun) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  std::string long_prompt(5000, 'x');
  {
    std::ofstream f(in);
    f << R"({"id": "ok1", "prompt": "And God said", "max_new_tokens": 3})" << "\n";
    f << R"({"id": "broken", "prompt": )" << "\n";  // line 2: invalid JSON
    f << R"({"id": "empty", "prompt": ""})" << "\n";
    f << json{{"id", "long"}, {"prompt_ids", std::vector<int>(1100, 5)}} << "\n";
    f << "\n";
    f << R"({"id": "ok2", "prompt": "Jesus wept.", "max_new_tokens": 2, "temperature": 0})" << "\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() + " --device cpu");
  EXPECT_EQ(r.code, 1);
  // The parser's words without its "[json.exception.parse_error.101]" tag.
  EXPECT_NE(r.err.find("in.jsonl:2: invalid JSON: parse error at line 1, column "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[json.exception"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in.jsonl:4: prompt is too long: 1100 tokens"), std::string::npos) << r.err;
  auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["id"], "ok1");
  EXPECT_EQ(lines[0]["token_ids"].size(), 3u);
  EXPECT_EQ(lines[1]["line"], 2);
  EXPECT_TRUE(lines[1].contains("error"));
  EXPECT_EQ(lines[2]["id"], "empty");  // generated from the BOS alone
  EXPECT_FALSE(lines[2].contains("error")) << lines[2].dump();
  EXPECT_TRUE(lines[3]["error"].get<std::string>().find("max_position_embeddings") != std::string::npos);
  EXPECT_EQ(lines[4]["id"], "ok2");
  EXPECT_EQ(lines[4]["token_ids"].size(), 2u);
}

TEST(Cli, SinglePromptPrintsText) {
  RunResult r = flexh2o("generate -m " + kOpt + " --prompt 'In the beginning God created' --greedy -n 8 --device auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ", and the LORD, and the LORD\n");
  // auto picks the GPU when one is usable, else the CPU, and says which.
  EXPECT_TRUE(r.err.find("using the CPU") != std::string::npos || r.err.find("using the GPU") != std::string::npos)
      << r.err;
}

TEST(Cli, DeviceCudaWithoutAGpuFailsClearlyAndAutoFallsBack) {
  RunResult probe = flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --device auto");
  ASSERT_EQ(probe.code, 0) << probe.err;
  if (probe.err.find("using the GPU") != std::string::npos) GTEST_SKIP() << "a GPU is present (label gpu tests cover it)";
  for (const std::string& cmd : {"generate -m " + kOpt + " --prompt hi", "bench -m " + kOpt + " --prompt-len 4 --gen-len 2",
                                "generate -m " + kOpt + " --prompt hi --percent 50 50 0 100 0 100"}) {
    RunResult r = flexh2o(cmd + " --device cuda");
    EXPECT_EQ(r.code, 1) << cmd;
    EXPECT_NE(r.err.find("--device cuda: no usable GPU ("), std::string::npos) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("use --device cpu"), std::string::npos) << cmd << ": " << r.err;
  }
  RunResult bench = flexh2o("bench -m " + kOpt + " --prompt-len 4 --gen-len 2 --num-prompts 2 --device auto");
  EXPECT_EQ(bench.code, 0) << bench.err;
  EXPECT_NE(bench.err.find("--device auto: using the CPU (no usable GPU: "), std::string::npos) << bench.err;
}

TEST(Cli, ModelErrorsAreClearAndNonZero) {
  RunResult missing = flexh2o("generate -m /nonexistent/model --prompt hi");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;

  TempDir tmp;
  flexh2o::test::copy_model_files(model_dir("tiny-opt"), tmp.path());
  std::string bytes = flexh2o::test::read_text(model_dir("tiny-opt") / "model.safetensors");
  std::ofstream(tmp.path() / "model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  RunResult trunc = flexh2o("generate -m " + tmp.path().string() + " --prompt hi");
  EXPECT_EQ(trunc.code, 1);
  EXPECT_NE(trunc.err.find("model.safetensors"), std::string::npos) << trunc.err;

  RunResult cuda = flexh2o("generate -m " + kOpt + " --prompt hi --device cuda");
  EXPECT_EQ(cuda.code, 1);
  EXPECT_NE(cuda.err.find("--device cuda"), std::string::npos) << cuda.err;

  RunResult usage = flexh2o("generate --prompt hi");
  EXPECT_EQ(usage.code, 2);
}

TEST(Cli, HubIdResolvesFromLocalCache) {
  TempDir tmp;
  fs::path snap = tmp.path() / "hub/models--tiny--opt/snapshots/abc123";
  fs::create_directories(snap);
  for (const auto& e : fs::directory_iterator(model_dir("tiny-opt")))
    if (e.is_regular_file()) fs::create_symlink(e.path(), snap / e.path().filename());
  fs::create_directories(tmp.path() / "hub/models--tiny--opt/refs");
  std::ofstream(tmp.path() / "hub/models--tiny--opt/refs/main") << "abc123";
  RunResult ok = flexh2o("generate -m tiny/opt --prompt 'Jesus wept.' --greedy -n 3", "HF_HOME=" + tmp.path().string());
  EXPECT_EQ(ok.code, 0) << ok.err;
  RunResult absent = flexh2o("info facebook/opt-1.3b", "HF_HOME=" + tmp.path().string());
  EXPECT_EQ(absent.code, 1);
  EXPECT_NE(absent.err.find("huggingface-cli download facebook/opt-1.3b"), std::string::npos) << absent.err;
}

// Another model's tokenizer with far fewer tokens than the model's rows: the run says so up
// front and its ids past the tokenizer decode to no text (they used to end the run after the
// first batch with an internal error).
TEST(Cli, ATokenizerShortOfTheModelsVocabularyIsNamedAndItsIdsAddNoText) {
  RunResult r = flexh2o("generate -m opt-125m --tokenizer " + kOpt + " --prompt hi -n 6 --device cpu --seed 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("the tokenizer has 4096 tokens and the model's vocabulary 50272"), std::string::npos) << r.err;
  RunResult own = flexh2o("generate -m " + kOpt + " --prompt hi -n 2 --device cpu");
  EXPECT_EQ(own.err.find("warning"), std::string::npos) << own.err;
}

TEST(Cli, TokenizeAndDetokenizeRoundTrip) {
  TempDir tmp;
  auto cases = read_json(model_dir("tiny-opt") / "reference/tokenizer_cases.json");
  const fs::path in = tmp.path() / "t.jsonl", ids = tmp.path() / "ids.jsonl";
  {
    std::ofstream f(in);
    for (const auto& c : cases["cases"]) f << json{{"text", c["text"]}} << "\n";
  }
  RunResult t = flexh2o("tokenize --tokenizer " + kOpt + " --no-special -i " + in.string() + " -o " + ids.string());
  ASSERT_EQ(t.code, 0) << t.err;
  auto lines = read_jsonl(ids);
  ASSERT_EQ(lines.size(), cases["cases"].size());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["ids"], cases["cases"][i]["ids"]);
  RunResult d = flexh2o("detokenize --tokenizer " + kOpt + " -i " + ids.string());
  ASSERT_EQ(d.code, 0) << d.err;
  std::istringstream ds(d.out);
  std::string line;
  for (size_t i = 0; std::getline(ds, line); ++i) EXPECT_EQ(json::parse(line)["text"], cases["cases"][i]["decoded"]);
  RunResult with_bos = flexh2o("tokenize --tokenizer " + kOpt + " -i " + in.string());
  EXPECT_EQ(json::parse(with_bos.out.substr(0, with_bos.out.find('\n')))["ids"][0], 2);
  RunResult none = flexh2o("tokenize --tokenizer " + tmp.path().string() + " -i " + in.string());
  EXPECT_EQ(none.code, 1);
}

TEST(Cli, InfoDescribesPresetsAndDirectories) {
  RunResult r = flexh2o("info opt-30b --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(flexh2o("info -m opt-30b --json").out, r.out);  // -m as every other command takes it
  auto j = json::parse(r.out);
  EXPECT_NEAR(j["parameters"].get<double>(), 29.97e9, 0.05e9);
  EXPECT_EQ(j["kv_bytes_per_token_f16"], 2 * 48 * 7168 * 2);
  EXPECT_EQ(j["kv_bytes_per_token_q4"], 2 * 48 * 56 * 72);  // 56 KV heads, a 72-byte record of 128
  // The model cards' counts: Qwen2.5-7B 7.62 B (its q/k/v biases included), Mistral-7B-v0.3 7.25 B, v0.1 7.24 B,
  // Llama 3.1 8.03 B and 70.55 B, Phi-4 14.66 B, Qwen3 8.19 B and 32.76 B.
  for (auto [preset, params] :
       {std::pair{"qwen2.5-7b", 7.62e9}, std::pair{"mistral-7b", 7.25e9}, std::pair{"mistral-7b-v0.1", 7.24e9},
        std::pair{"llama-3.1-8b", 8.03e9},
        std::pair{"llama-3.1-70b", 70.55e9}, std::pair{"phi-4", 14.66e9}, std::pair{"qwen3-8b", 8.19e9},
        std::pair{"qwen3-32b", 32.76e9}}) {
    RunResult p = flexh2o(std::string("info --json ") + preset);
    ASSERT_EQ(p.code, 0) << p.err;
    EXPECT_NEAR(json::parse(p.out)["parameters"].get<double>(), params, 0.006e9) << preset;
  }
  RunResult l3 = flexh2o("info llama-3.1-8b");
  ASSERT_EQ(l3.code, 0) << l3.err;
  EXPECT_NE(l3.out.find("rope         llama3, theta 500000, factor 8 over 8192 pretraining positions\n"),
            std::string::npos)
      << l3.out;
  RunResult y = flexh2o("info --json " + model_dir("arch/qwen2_yarn").string());
  ASSERT_EQ(y.code, 0) << y.err;
  EXPECT_EQ(json::parse(y.out)["max_position_embeddings"], 64);  // yarn: 16 x 4, over the config's 32
  EXPECT_NEAR(json::parse(y.out)["rope"]["attention_factor"].get<double>(), 1.1386, 1e-4);
  RunResult w = flexh2o("info " + model_dir("arch/mistral").string());
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_NE(w.out.find("128 positions\nwindow       2 of 2 layers attend to the last 20 positions only (a full cache keeps that many a sequence)\n"),
            std::string::npos)
      << w.out;
  RunResult wg = flexh2o("info " + model_dir("arch/gemma2").string());
  ASSERT_EQ(wg.code, 0) << wg.err;
  EXPECT_NE(wg.out.find("window       1 of 2 layers attend to the last 20 positions only (a full cache keeps that many in those layers)\n"),
            std::string::npos)
      << wg.out;
  {  // Gemma 2's soft caps as the config writes them, not truncated
    TempDir g;
    json cfg = json::parse(std::ifstream(model_dir("arch/gemma2") / "config.json"));
    cfg["attn_logit_softcapping"] = 30.5;
    std::ofstream(g.path() / "config.json") << cfg.dump();
    fs::copy_file(model_dir("arch/gemma2") / "model.safetensors", g.path() / "model.safetensors");
    RunResult gi = flexh2o("info " + g.path().string());
    ASSERT_EQ(gi.code, 0) << gi.err;
    EXPECT_NE(gi.out.find("scores capped at 30.5, logits capped at 3\n"), std::string::npos) << gi.out;
  }
  RunResult d = flexh2o("info " + model_dir("tiny-llama").string());
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("4 heads (2 kv)"), std::string::npos) << d.out;
}

TEST(Cli, OffloadingAndKvPolicyFlagsKeepTokensAndExplainMistakes) {
  TempDir tmp;
  const std::string in = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/prompts/bible.jsonl").string();
  auto tokens_of = [&](const std::string& extra) {
    const fs::path out = tmp.path() / "o.jsonl";
    RunResult r = flexh2o("generate -m " + kOpt + " -i " + in + " -o " + out.string() + " --overwrite --greedy -q " + extra);
    EXPECT_EQ(r.code, 0) << extra << "\n" << r.err;
    std::vector<json> ids;
    for (auto& l : read_jsonl(out)) ids.push_back(l["token_ids"]);
    return ids;
  };
  const auto want = tokens_of("");
  ASSERT_EQ(want.size(), 5u);
  const std::string dir = " --offload-dir " + (tmp.path() / "store").string();
  EXPECT_EQ(tokens_of("--percent 20 30 0 50 0 100 --gpu-batch-size 2 --num-gpu-batches 2" + dir), want);
  EXPECT_EQ(tokens_of("--percent 0 100 0 100 100 0 --gpu-batch-size 3 --cpu-cache-compute --overlap false"), want);
  EXPECT_EQ(tokens_of("--kv-policy h2o --heavy-budget 300 --recent-budget 300"), want);
  {  // a profile that does not price dequantization: auto then never picks (lossy) compression
    json t4 = read_json(fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json");
    t4.erase("dequant_gbps");
    const fs::path prof = tmp.path() / "t4-plain.json";
    std::ofstream(prof) << t4.dump();
    EXPECT_EQ(tokens_of("--policy auto --hardware " + prof.string() + " --gpu-mem 8MiB" + dir), want);
  }
  {  // a profile that prices it: auto keeps full-precision weights and KV unless --allow-compress
    const std::string t4 = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json").string();
    EXPECT_EQ(tokens_of("--policy auto --hardware " + t4 + " --gpu-mem 8MiB" + dir), want);
    EXPECT_EQ(tokens_of("--policy auto --no-compress --hardware " + t4 + " --gpu-mem 8MiB" + dir), want);
    const std::string auto_run = "generate -m " + kOpt + " --prompt hi -n 1 --policy auto --gpu-mem 8MiB --hardware " + t4;
    const RunResult chosen = flexh2o(auto_run);  // says what it chose and what the profile predicts
    EXPECT_EQ(chosen.err.find("--compress"), std::string::npos);
    EXPECT_TRUE(std::regex_search(chosen.err, std::regex("tok/s on the profile, bottleneck [a-z]"))) << chosen.err;
    EXPECT_NE(flexh2o(auto_run + " --allow-compress").err.find("--compress-weight"), std::string::npos);  // it would
    RunResult allow_no = flexh2o(auto_run + " --allow-compress --no-compress");
    EXPECT_EQ(allow_no.code, 1);
    EXPECT_NE(allow_no.err.find("--no-compress contradicts --allow-compress"), std::string::npos) << allow_no.err;
    RunResult both = flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --policy auto --hardware " + t4 +
                             " --no-compress --compress-cache");
    EXPECT_EQ(both.code, 1);
    EXPECT_NE(both.err.find("--no-compress contradicts --compress-weight / --compress-cache"), std::string::npos)
        << both.err;
  }
  EXPECT_NE(tokens_of("--kv-policy local --recent-budget 3"), want);  // a 3-token window changes things
  {
    const fs::path rep = tmp.path() / "r.json";
    RunResult r = flexh2o("generate -m " + kOpt + " -i " + in + " -o /dev/null -q --percent 0 100 0 100 100 0 "
                          "--kv-policy h2o --heavy-ratio 0.2 --recent-ratio 0.2 --report " + rep.string());
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = read_json(rep);
    EXPECT_GT(j["offload"]["bytes_moved"]["host_to_device"].get<uint64_t>(), 0u);
    EXPECT_GT(j["offload"]["kv_bytes_moved"].get<uint64_t>(), 0u);
    EXPECT_NE(j["kv_policy"].get<std::string>().find("h2o"), std::string::npos);
  }
  {  // -b with offloading flags is the block (one micro-batch); beside flags that set it, an error
    const fs::path rep = tmp.path() / "b.json";
    const std::string off = " -b 3 --percent 0 100 0 100 100 0 --report " + rep.string();
    for (const std::string& c : {"generate -m " + kOpt + " -i " + in + " -o /dev/null -q" + off,
                                 "bench -m " + kOpt + " --prompt-len 5 --gen-len 2 --num-prompts 5" + off}) {
      RunResult r = flexh2o(c);
      ASSERT_EQ(r.code, 0) << c << "\n" << r.err;
      EXPECT_EQ(read_json(rep)["batch_size"], 3) << c;
      // The split as it came out (whole tensors): all of these weights on the host.
      EXPECT_NE(r.err.find("; weights homed: 0 B device, "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(" host, 0 B disk\n"), std::string::npos) << r.err;
    }
    for (const std::string extra : {"--percent 0 100 0 100 100 0 --gpu-batch-size 2",
                                    "--percent 0 100 0 100 100 0 --num-gpu-batches 2", "--cpu-mem 1GiB --policy auto"}) {
      RunResult r = flexh2o("generate -m " + kOpt + " --prompt hi -b 3 " + extra);
      EXPECT_EQ(r.code, 2) << extra;  // flags that contradict: a wrong command line
      EXPECT_NE(r.err.find("-b/--batch-size 3 contradicts"), std::string::npos) << r.err;
    }
  }
  {  // --trace: Chrome trace-event JSON with one slice per schedule step; an unwritable path fails
    const fs::path tr = tmp.path() / "trace.json";
    RunResult r = flexh2o("bench -m " + kOpt + " --prompt-len 5 --gen-len 3 --percent 0 100 0 100 100 0 --trace " +
                          tr.string());
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = read_json(tr);
    size_t slices = 0;
    for (const auto& ev : j["traceEvents"]) slices += ev["ph"] == "X";
    EXPECT_GT(slices, 20u);
    RunResult no = flexh2o("generate -m " + kOpt + " --prompt hi --percent 0 100 0 100 100 0 --trace /nonexistent/t.json");
    EXPECT_EQ(no.code, 1);
    EXPECT_NE(no.err.find("trace"), std::string::npos) << no.err;
  }
  RunResult bad = flexh2o("generate -m " + kOpt + " --prompt hi --percent 50 60 100 0 100 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("sum to 110"), std::string::npos) << bad.err;
  RunResult mem = flexh2o("generate -m " + kOpt + " --prompt hi --gpu-mem lots");
  EXPECT_EQ(mem.code, 2);  // a flag's value: refused at parse time
  EXPECT_NE(mem.err.find("--gpu-mem"), std::string::npos) << mem.err;
  RunResult small = flexh2o("generate -m " + kOpt + " --prompt hi --percent 0 100 100 0 100 0 --gpu-mem 100KiB");
  EXPECT_EQ(small.code, 1);
  EXPECT_NE(small.err.find("needs at least"), std::string::npos) << small.err;
  RunResult kv = flexh2o("generate -m " + kOpt + " --prompt hi --kv-policy h2o --heavy-ratio 1.5");
  EXPECT_EQ(kv.code, 2);
  EXPECT_NE(kv.err.find("--heavy-ratio"), std::string::npos) << kv.err;
}

// A KV budget wider than a sliding window that the sequences pass is refused before anything
// runs (in memory too, a batch a line: not after the lines before it), naming the prompt's
// length; one that fits the window runs (arch/mistral: window 20, a 37-token prompt second).
TEST(Cli, AKvBudgetWiderThanTheSlidingWindowIsRefusedUpFront) {
  TempDir tmp;
  const fs::path in = tmp.path() / "ids.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt_ids": [3, 4, 5]})" << "\n" << R"({"prompt_ids": [)";
    for (int i = 3; i < 40; ++i) f << (i > 3 ? "," : "") << i;
    f << "]}\n";
  }
  const std::string run = "generate -m " + model_dir("arch/mistral").string() + " --input " + in.string() +
                          " --output " + out.string() + " -n 4 -b 1 --kv-policy h2o --recent-budget 10 --heavy-budget ";
  RunResult wide = flexh2o(run + "15");
  EXPECT_EQ(wide.code, 1);
  EXPECT_NE(wide.err.find("KV budget of 25 tokens (of a sequence whose budget's basis is 37 tokens) is more "
                          "than the 20-token sliding window"),
            std::string::npos)
      << wide.err;
  EXPECT_EQ(flexh2o::test::read_text(out), "") << "no line ran before the refusal";
  RunResult fits = flexh2o(run + "10");
  ASSERT_EQ(fits.code, 0) << fits.err;
  std::ifstream f(out);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(json::parse(line)["token_ids"].size(), 4u) << line;
}

// --overlap / --sep-layer / --pin-weight take the same words wherever they are read: a bad one
// is refused before anything runs, in memory too, and --policy auto honours "0" (it used to read
// anything but "false" as true).
TEST(Cli, TrueFalseFlagsAreCheckedAndReadAlikeEverywhere) {
  for (const char* flag : {"--overlap", "--sep-layer", "--pin-weight"}) {
    RunResult r = flexh2o("generate -m " + kOpt + " --prompt hi -n 1 " + flag + " maybe");
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_NE(r.err.find(std::string(flag) + ": must be true or false (or 1/0, on/off, yes/no), got \"maybe\""),
              std::string::npos)
        << r.err;
  }
  const std::string t4 = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json").string();
  const std::string run = "generate -m " + kOpt + " --prompt hi -n 1 --policy auto --no-compress --gpu-mem 8MiB --hardware " + t4;
  for (const char* off : {"false", "0", "off", "no"}) {
    RunResult r = flexh2o(run + " --overlap " + off);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("--overlap false"), std::string::npos) << off << "\n" << r.err;
  }
  RunResult on = flexh2o(run + " --overlap yes");
  EXPECT_EQ(on.code, 0) << on.err;
  EXPECT_EQ(on.err.find("--overlap false"), std::string::npos) << on.err;
  RunResult plan = flexh2o("plan -m " + kOpt + " --hardware " + t4 + " --prompt-len 8 --gen-len 2 --overlap 0");
  EXPECT_EQ(plan.code, 0) << plan.err;
}

// A policy file's overlap / sep_layer / pin_weight stand unless the flag is given (the flags'
// default used to override the file's false). --policy auto searches under --overlap and
// --sep-layer and applies --pin-weight; it refuses --cpu-cache-compute, which it chooses;
// plan searches under --sep-layer.
TEST(Cli, PolicyFileFalseStandsAndAutoHonoursTheSwitches) {
  TempDir tmp;
  const fs::path file = tmp.path() / "p.json", rep = tmp.path() / "r.json";
  std::ofstream(file) << R"({"percent": [10, 90, 40, 60, 100, 0], "gpu_batch_size": 2, "num_gpu_batches": 1,
                            "overlap": false, "sep_layer": false, "pin_weight": false})";
  auto policy_of = [&](const std::string& flags) {
    RunResult r = flexh2o("generate -m " + kOpt + " --prompt hi -n 2 --device cpu --report " + rep.string() + " " + flags);
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.err;
    return r.code == 0 ? read_json(rep)["offload"]["policy"] : json();
  };
  json p = policy_of("--policy " + file.string());
  EXPECT_EQ(p["overlap"], false);
  EXPECT_EQ(p["sep_layer"], false);
  EXPECT_EQ(p["pin_weight"], false);
  p = policy_of("--policy " + file.string() + " --overlap true --sep-layer 1");
  EXPECT_EQ(p["overlap"], true);
  EXPECT_EQ(p["sep_layer"], true);
  EXPECT_EQ(p["pin_weight"], false);
  const std::string t4 = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json").string();
  const std::string autop = "--policy auto --no-compress --gpu-mem 8MiB --hardware " + t4;
  p = policy_of(autop);
  EXPECT_EQ(p["sep_layer"], true);
  EXPECT_EQ(p["pin_weight"], true);
  p = policy_of(autop + " --sep-layer false --pin-weight off --overlap no");
  EXPECT_EQ(p["sep_layer"], false);
  EXPECT_EQ(p["pin_weight"], false);
  EXPECT_EQ(p["overlap"], false);
  RunResult cpu = flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --device cpu --cpu-cache-compute " + autop);
  EXPECT_NE(cpu.code, 0);
  EXPECT_NE(cpu.err.find("--cpu-cache-compute itself"), std::string::npos) << cpu.err;
  RunResult plan = flexh2o("plan -m " + kOpt + " --hardware " + t4 + " --prompt-len 8 --gen-len 2 --sep-layer false --json");
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_EQ(json::parse(plan.out)["policy"]["sep_layer"], false) << plan.out;
}

// --compress-weight / --compress-cache on generate: in memory and offloaded (by the flags, or by
// a policy file's compress_* fields) give the same tokens, and the reports say Q4.
TEST(Cli, CompressionFlagsAndPolicyFilesGiveTheInMemoryCompressedTokens) {
  TempDir tmp;
  const std::string in = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/prompts/bible.jsonl").string();
  std::string err;  // the last run's
  auto run = [&](const std::string& extra, json* report = nullptr) {
    const fs::path out = tmp.path() / "o.jsonl", rep = tmp.path() / "r.json";
    RunResult r = flexh2o("generate -m " + kOpt + " -i " + in + " -o " + out.string() +
                          " --overwrite --greedy -n 12 -q --report " + rep.string() + " " + extra);
    EXPECT_EQ(r.code, 0) << extra << "\n" << r.err;
    err = r.err;
    if (report) *report = read_json(rep);
    std::vector<json> ids;
    for (auto& l : read_jsonl(out)) ids.push_back(l["token_ids"]);
    return ids;
  };
  json mem_rep, off_rep, file_rep;
  const auto want = run("--compress-weight --compress-cache", &mem_rep);
  ASSERT_EQ(want.size(), 5u);
  EXPECT_EQ(mem_rep["kv_dtype"], "Q4");
  EXPECT_EQ(mem_rep["compress_weight"], true);
  EXPECT_EQ(mem_rep["compress_cache"], true);
  const std::string dir = " --offload-dir " + (tmp.path() / "store").string();
  EXPECT_EQ(run("--compress-weight --compress-cache --percent 0 50 0 50 100 0 --gpu-batch-size 2 "
                "--num-gpu-batches 2" + dir, &off_rep), want);
  EXPECT_EQ(off_rep["offload"]["weight_dtype"], "Q4");
  EXPECT_EQ(off_rep["offload"]["kv_dtype"], "Q4");
  EXPECT_EQ(off_rep["offload"]["policy"]["compress_weight"], true);
  const fs::path pol = tmp.path() / "policy.json";
  std::ofstream(pol) << R"({"percent": [0, 100, 0, 100, 100, 0], "gpu_batch_size": 3, "compress_weight": true,
                           "compress_cache": true})";
  EXPECT_EQ(run("--policy " + pol.string(), &file_rep), want);
  EXPECT_EQ(file_rep["kv_dtype"], "Q4");
  EXPECT_EQ(file_rep["compress_cache"], true);
  EXPECT_EQ(file_rep["offload"]["weight_dtype"], "Q4");
  EXPECT_NE(err.find("sequences), KV cache Q4; weights homed"), std::string::npos) << err;  // as the report
  json plain;
  run("", &plain);
  EXPECT_EQ(plain["compress_cache"], false);
  // weight_bytes are the weights as the run holds them, checkpoint_weight_bytes the files'.
  EXPECT_EQ(plain["weight_bytes"], 8941568);
  for (const json* r : {&plain, &mem_rep, &off_rep, &file_rep}) EXPECT_EQ((*r)["checkpoint_weight_bytes"], 8941568);
  EXPECT_LT(mem_rep["weight_bytes"].get<int64_t>(), 8941568 / 3);
  EXPECT_EQ(off_rep["weight_bytes"], mem_rep["weight_bytes"]);
  EXPECT_EQ(file_rep["weight_bytes"], mem_rep["weight_bytes"]);
}

TEST(Cli, BenchRunsFixedLengthWorkloadsWithPoliciesAndPresets) {
  TempDir tmp;
  const fs::path rep = tmp.path() / "bench.json";
  RunResult r = flexh2o("bench -m " + kOpt + " --prompt-len 20 --gen-len 6 --percent 0 100 0 100 100 0 "
                        "--gpu-batch-size 2 --num-gpu-batches 2 --kv-policy h2o --heavy-budget 4 --recent-budget 4 "
                        "--report " + rep.string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = read_json(rep);
  EXPECT_EQ(j["generated_tokens"], 4 * 6);  // one block of 2 x 2, EOS ignored
  EXPECT_EQ(j["workload"]["prompt_len"], 20);
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
  // KV bytes follow the budget: prefill stores 7 rows, decode loads 7 and stores 1 per step.
  const uint64_t row = 2 * 4 * 64 * 2 * 4;  // K+V, 4 kv heads x 64 dims f16, 4 layers
  EXPECT_EQ(j["offload"]["kv_bytes_moved"].get<uint64_t>(), 4 * (7 + 5 * 8) * row);
  RunResult preset = flexh2o("bench -m opt-125m --prompt-len 8 --gen-len 2 --num-prompts 2 --threads 2");
  EXPECT_EQ(preset.code, 0) << preset.err;
  RunResult too_long = flexh2o("bench -m " + kOpt + " --prompt-len 1000 --gen-len 100");
  EXPECT_EQ(too_long.code, 1);
  EXPECT_NE(too_long.err.find("is longer than a sequence of " + kOpt + " can grow"), std::string::npos) << too_long.err;
  // Sampled decoding is timed too, and its settings are in the report.
  RunResult sampled = flexh2o("bench -m " + kOpt + " --prompt-len 8 --gen-len 5 --num-prompts 3 --device cpu "
                              "--temperature 0.8 --top-p 0.9 --report " + rep.string());
  ASSERT_EQ(sampled.code, 0) << sampled.err;
  j = read_json(rep);
  EXPECT_EQ(j["generated_tokens"], 3 * 5);
  EXPECT_NEAR(j["workload"]["temperature"].get<double>(), 0.8, 1e-6);
  EXPECT_NEAR(j["workload"]["top_p"].get<double>(), 0.9, 1e-6);
  RunResult bad = flexh2o("bench -m " + kOpt + " --prompt-len 8 --gen-len 5 --top-p 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("top_p must be in (0, 1], got 0"), std::string::npos) << bad.err;
  // --policy auto without a count runs one block of the planner's own choosing (it was capped at
  // -b's default of 8 sequences).
  const std::string t4 = (fs::path(FLEXH2O_TEST_DATA) / "../../configs/hardware/t4-paper.json").string();
  RunResult planned = flexh2o("bench -m " + kOpt + " --prompt-len 8 --gen-len 2 --device cpu --policy auto --no-compress "
                              "--gpu-mem 8MiB --hardware " + t4 + " --report " + rep.string());
  ASSERT_EQ(planned.code, 0) << planned.err;
  j = read_json(rep);
  const json& pol = j["offload"]["policy"];
  EXPECT_EQ(j["workload"]["prompts"], pol["gpu_batch_size"].get<int64_t>() * pol["num_gpu_batches"].get<int64_t>());
  EXPECT_GT(j["workload"]["prompts"].get<int64_t>(), 8) << pol;
}

TEST(Cli, EvalPplMatchesReference) {
  auto ref = read_json(model_dir("tiny-opt") / "reference/perplexity_full.json");
  RunResult r = flexh2o("eval-ppl -m " + kOpt + " --max-tokens 1024 --json --device cpu " +
                  (model_dir("tiny-opt") / "reference/eval.txt").string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = json::parse(r.out);
  EXPECT_EQ(j["tokens"], 1024);
  EXPECT_NEAR(j["perplexity"].get<double>(), ref["perplexity"].get<double>(), 0.005 * ref["perplexity"].get<double>());
  // More than the model's positions: scored up to them, and said so.
  RunResult cut = flexh2o("eval-ppl -m " + kOpt + " --max-tokens 5000 --json --device cpu " +
                          (model_dir("tiny-opt") / "reference/eval.txt").string());
  ASSERT_EQ(cut.code, 0) << cut.err;
  EXPECT_EQ(json::parse(cut.out)["tokens"], 1024);
  EXPECT_NE(cut.err.find("the model has 1024 positions"), std::string::npos) << cut.err;
}

// A checkpoint that ships only tokenizer.model (Vicuna, OpenLLaMA) tokenizes from its own
// directory exactly as with --tokenizer pointing at the same files; its own tiny-llama
// tokenizer gives another text, so the perplexities differ.
TEST(Cli, ACheckpointWithOnlyTokenizerModelIsTokenized) {
  TempDir tmp;
  const fs::path llama = model_dir("tiny-llama"), spm = model_dir("tokenizers/spm-llama"), dir = tmp.path() / "m";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(llama / f, dir / f);
  for (const char* f : {"tokenizer.model", "tokenizer_config.json"}) fs::copy_file(spm / f, dir / f);
  const std::string text = (model_dir("tiny-opt") / "reference/eval.txt").string();
  auto ppl = [&](const std::string& args) {
    RunResult r = flexh2o("eval-ppl " + args + " --max-tokens 200 --json --device cpu " + text);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? json::parse(r.out) : json();
  };
  const json own = ppl("-m " + dir.string());
  const json given = ppl("-m " + llama.string() + " --tokenizer " + spm.string());
  const json llama_tok = ppl("-m " + llama.string());
  ASSERT_TRUE(own.contains("perplexity") && given.contains("perplexity") && llama_tok.contains("perplexity"));
  EXPECT_EQ(own["tokens"], 200);
  EXPECT_EQ(own["perplexity"], given["perplexity"]);
  EXPECT_NE(own["perplexity"], llama_tok["perplexity"]);
}

// Global flags that point at nothing are said as such: --configs used to be taken silently, and
// the preset it should have held then "no such model directory"; a seed past 2**64 - 1 was
// clamped to it.
TEST(Cli, AConfigsDirThatIsNotOneAndASeedPastUint64AreWrongCommandLines) {
  RunResult r = flexh2o("--configs /nonexistent info opt-30b");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--configs /nonexistent is not a directory"), std::string::npos) << r.err;
  for (const std::string& cmd :
       {"generate -m " + kOpt + " -p hi -n 1", "bench -m " + kOpt + " --prompt-len 4 --gen-len 1"}) {
    r = flexh2o(cmd + " --seed 18446744073709551616");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("taken modulo 2**64), got 18446744073709551616"), std::string::npos) << r.err;
    EXPECT_EQ(flexh2o(cmd + " --seed -1").code, 0) << cmd;
    EXPECT_EQ(flexh2o(cmd + " --seed 18446744073709551615").code, 0) << cmd;
  }
}

// --prompt alone prints just the text; its request's error is the run's, said on stderr (it was
// a JSON error line on stdout, in the middle of the text a script reads).
TEST(Cli, APromptThatCannotRunIsAnErrorOnStderr) {
  std::string long_prompt;
  for (int i = 0; i < 1100; ++i) long_prompt += "hello ";
  const RunResult r = flexh2o("generate -m " + kOpt + " -n 2 -p '" + long_prompt + "'");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("flexh2o: error: --prompt: prompt is"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("longer than the model's max_position_embeddings"), std::string::npos) << r.err;
}

}  // namespace
