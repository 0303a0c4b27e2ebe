// Hostile input through the flexh2o program, one test per defect class of issue #14 item 1:
// deep JSON in a request line, special files as inputs (no hang), an over-long stdin line
// (bounded memory, later lines still processed), token ids beyond int32, and flag errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli_run.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using flexh2o::test::data_dir;
using flexh2o::test::model_dir;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;

const std::string kOpt = model_dir("tiny-opt").string();
const std::string kBin = std::string(FLEXH2O_BINARY_DIR) + "/flexh2o";

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args); }

std::vector<json> read_jsonl(const fs::path& p) {
  std::ifstream in(p);
  std::vector<json> v;
  for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
  return v;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// `sh -c script` with stdout/stderr in files; returns the exit code and the peak resident set
// of the whole pipeline's largest process (wait4 reports the child and its waited-for children).
struct ShellRun {
  int code = -1;
  long max_rss_kib = 0;
  std::string out, err;
};
ShellRun run_shell(const std::string& script) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out", err = tmp.path() / "err";
  const std::string cmd = "(" + script + ") >" + out.string() + " 2>" + err.string() + " </dev/null";
  ShellRun r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  rusage ru{};
  ::wait4(pid, &st, 0, &ru);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.max_rss_kib = ru.ru_maxrss;
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// A request line nested 100000 levels deep must not overflow the stack when its value is quoted
// in the error: that line is an error naming it, and the lines around it still run.
TEST(InputLimits, DeeplyNestedRequestLineIsAnErrorAndTheRestRuns) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"id": "a", "prompt": "hello"})" << "\n";
    f << R"({"id": "deep", "prompt_ids": )" << std::string(100000, '[') << std::string(100000, ']') << "}\n";
    f << R"({"id": )" << std::string(100000, '[') << std::string(100000, ']') << R"(, "prompt": "x"})" << "\n";
    f << R"({"id": "b", "prompt": "world"})" << "\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " --device cpu --greedy -n 2 --input " + in.string() + " --output " +
                        out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, in.string() + ":2: invalid JSON: the line nests arrays/objects more than");
  EXPECT_HAS(r.err, in.string() + ":3: invalid JSON");
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["id"], "a");
  EXPECT_TRUE(lines[0].contains("token_ids"));
  EXPECT_EQ(lines[1]["line"], 2);
  EXPECT_EQ(lines[2]["line"], 3);
  EXPECT_EQ(lines[3]["id"], "b");
  EXPECT_TRUE(lines[3].contains("token_ids"));
}

// A misspelt field would run with the flag's value unnoticed, and a line with two prompts would
// run one of them: each is that line's error, naming the field, and the other lines run.
TEST(InputLimits, UnknownFieldsAndTwoPromptsAreLineErrors) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"id": "a", "prompt": "hello", "temprature": 0.5})" << "\n";
    f << R"({"id": "b", "prompt": "hello", "prompt_ids": [2, 100]})" << "\n";
    f << R"({"id": "c", "prompt": "world", "max_new_tokens": 2, "temperature": 0.5, "seed": 1, "logprobs": 1})"
      << "\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " --device cpu -n 2 --input " + in.string() + " --output " +
                        out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, in.string() + ":1: unknown field \"temprature\"");
  EXPECT_HAS(r.err, in.string() + ":2: give one of \"prompt\", \"prompt_ids\" and \"messages\"");
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(lines[0].contains("error"));
  EXPECT_TRUE(lines[1].contains("error"));
  EXPECT_EQ(lines[2]["token_ids"].size(), 2u);
}

// The request reader itself, with a small cap: the over-long line is reported with its number
// and not stored, a line without a final newline still counts, and every other line is parsed.
TEST(InputLimits, RequestReaderCapIsConfigurable) {
  std::istringstream in(R"({"a": 1})" "\n" + std::string(5000, 'x') + "\n\n" + R"({"a": 3})" "\n" +
                        std::string(100, '[') + "\n" + R"({"a": 5})");
  std::vector<int64_t> good;
  std::vector<std::string> errors;
  const int64_t bad = flexh2o::cli::for_each_jsonl(
      in, [&](int64_t line, const json& j) { good.push_back(line * 10 + j["a"].get<int64_t>()); },
      [&](int64_t line, const std::string& msg) { errors.push_back(std::to_string(line) + ": " + msg); }, 1024);
  EXPECT_EQ(bad, 2);
  EXPECT_EQ(good, (std::vector<int64_t>{11, 43, 65}));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], "2: line is longer than 1024 bytes; it was skipped");
  EXPECT_HAS(errors[1], "5: invalid JSON: the line nests arrays/objects more than 64 levels deep");
}

// Token ids and integer fields are range-checked: 4294967298 must not wrap to id 2 silently.
TEST(InputLimits, TokenIdsAboveInt32AreErrorsNotWrapped) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt_ids": [4294967298, 100]})" << "\n";
    f << R"({"prompt_ids": [2.5, 100]})" << "\n";
    f << R"({"prompt_ids": [2, 100], "top_k": 4294967298})" << "\n";
    f << R"({"prompt_ids": [2, 100]})" << "\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " --device cpu --greedy -n 2 --input " + in.string() + " --output " +
                        out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_HAS(lines[0].value("error", ""),
             "field \"prompt_ids\"[0] must be an integer in [0, 2147483647], got 4294967298");
  EXPECT_HAS(lines[1].value("error", ""), "got 2.5");
  EXPECT_HAS(lines[2].value("error", ""), "field \"top_k\" must be an integer");
  EXPECT_TRUE(lines[3].contains("token_ids")) << lines[3];

  const fs::path ids = tmp.path() / "ids.jsonl";
  std::ofstream(ids) << R"({"ids": [4294967298]})" << "\n" << R"({"ids": [2]})" << "\n";
  RunResult d = flexh2o("detokenize -t " + kOpt + " --input " + ids.string());
  EXPECT_EQ(d.code, 1);
  EXPECT_HAS(d.out, "must be an integer in [0, 2147483647], got 4294967298");
  EXPECT_HAS(d.out, R"({"text":"</s>"})");  // the good line after it
}

// A line's integer fields name the range the field takes, not their C++ type's: "logprobs": true
// said "in [-2147483648, 2147483647]" and "max_new_tokens": "5" int64's bounds.
TEST(InputLimits, IntegerFieldsNameTheirOwnRange) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(in);
    for (const char* field : {R"("max_new_tokens": "5")", R"("logprobs": true)", R"("logprobs": 21)",
                              R"("top_k": -3)", R"("seed": 2.5)", R"("max_new_tokens": 1)"})
      f << R"({"prompt_ids": [2, 100], )" << field << "}\n";
  }
  RunResult r = flexh2o("generate -m " + kOpt + " --device cpu --greedy -n 2 --input " + in.string() + " --output " +
                        out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0].value("error", ""), "field \"max_new_tokens\" must be an integer >= 0, got \"5\".");
  EXPECT_EQ(lines[1].value("error", ""), "field \"logprobs\" must be an integer in [0, 20], got true.");
  EXPECT_EQ(lines[2].value("error", ""), "field \"logprobs\" must be an integer in [0, 20], got 21.");
  EXPECT_EQ(lines[3].value("error", ""), "field \"top_k\" must be an integer in [-1, 2147483647], got -3.");
  EXPECT_EQ(lines[4].value("error", ""), "field \"seed\" must be an integer, got 2.5.");
  EXPECT_EQ(lines[5]["token_ids"].size(), 1u) << lines[5];
}

// A line that asked for logprobs and generated no token still has its (empty) arrays, so that
// readers need no special case; one that did not ask has neither.
TEST(InputLimits, ZeroTokenLinesKeepTheirLogprobsArrays) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  std::ofstream(in) << R"({"prompt_ids": [2, 100], "max_new_tokens": 0, "logprobs": 2})" "\n"
                    << R"({"prompt_ids": [2, 100], "max_new_tokens": 0, "logprobs": 0})" "\n"
                    << R"({"prompt_ids": [2, 100], "max_new_tokens": 0})" "\n";
  ASSERT_EQ(flexh2o("generate -m " + kOpt + " --device cpu -o " + out.string() + " -i " + in.string()).code, 0);
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["logprobs"], json::array()) << lines[0];
  EXPECT_EQ(lines[0]["top_logprobs"], json::array()) << lines[0];
  EXPECT_EQ(lines[1]["logprobs"], json::array()) << lines[1];
  EXPECT_FALSE(lines[1].contains("top_logprobs")) << lines[1];
  EXPECT_FALSE(lines[2].contains("logprobs")) << lines[2];
}

// A line's "seed" is any int64, taken modulo 2**64 as Batch bodies and LLM.generate take it: -1 is
// the --seed 18446744073709551615 that the first line (seed = --seed + its index) gets by default.
TEST(InputLimits, NegativeSeedsAreTakenModulo2To64) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", def = tmp.path() / "def.jsonl", neg = tmp.path() / "neg.jsonl";
  std::ofstream(in) << R"({"prompt_ids": [2, 100], "seed": -1})" "\n";
  const std::string run = "generate -m " + kOpt + " --device cpu --temperature 1.5 -n 12 --ignore-eos --output ";
  ASSERT_EQ(flexh2o(run + neg.string() + " --input " + in.string()).code, 0);
  std::ofstream(in) << R"({"prompt_ids": [2, 100]})" "\n";
  ASSERT_EQ(flexh2o(run + def.string() + " --seed 18446744073709551615 --input " + in.string()).code, 0);
  const auto a = read_jsonl(neg), b = read_jsonl(def);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0]["token_ids"], b[0]["token_ids"]);
  std::ofstream(in) << R"({"prompt_ids": [2, 100]})" "\n";
  ASSERT_EQ(flexh2o(run + def.string() + " --overwrite --seed 0 --input " + in.string()).code, 0);
  EXPECT_NE(read_jsonl(def)[0]["token_ids"], a[0]["token_ids"]);  // the seed decides
}

// A FIFO given as an input would block forever in open(): it is refused at once. `timeout` turns
// a hang into exit code 124 instead of a stuck suite.
TEST(InputLimits, FifoInputsAreRefusedWithoutBlocking) {
  TempDir tmp;
  const fs::path fifo = tmp.path() / "in.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path model = tmp.path() / "model";
  fs::create_directory(model);
  for (const char* f : {"vocab.json", "merges.txt", "model.safetensors"})
    fs::copy_file(model_dir("tiny-opt") / f, model / f);
  ASSERT_EQ(::mkfifo((model / "config.json").c_str(), 0600), 0);

  const std::string t = "timeout 10 " + kBin + " ";
  ShellRun gen = run_shell(t + "generate -m " + kOpt + " --device cpu --input " + fifo.string());
  EXPECT_EQ(gen.code, 1) << gen.err;
  EXPECT_HAS(gen.err, "--input " + fifo.string() + " is a FIFO (named pipe), not a regular file");
  ShellRun tok = run_shell(t + "tokenize -t " + kOpt + " --input " + fifo.string());
  EXPECT_EQ(tok.code, 1) << tok.err;
  EXPECT_HAS(tok.err, "is a FIFO");
  ShellRun info = run_shell(t + "info " + model.string());
  EXPECT_EQ(info.code, 1) << info.err;
  EXPECT_HAS(info.err, "model config " + (model / "config.json").string() + " is a FIFO");
  ShellRun dir = run_shell(t + "generate -m " + kOpt + " --device cpu --input " + tmp.path().string());
  EXPECT_EQ(dir.code, 1) << dir.err;
  EXPECT_HAS(dir.err, "is a directory, not a regular file");
}

// A 400 MB "line" without a newline on standard input is not buffered whole (nor without limit
// from /dev/zero): it is reported as too long after 64 MiB, skipped without being stored, and
// the next line is still tokenized.
TEST(InputLimits, OverLongStdinLineIsSkippedWithBoundedMemory) {
  ShellRun r = run_shell("{ head -c 400000000 /dev/zero; printf '\\n{\"text\": \"hello\"}\\n'; } | " + kBin +
                         " tokenize -t " + kOpt);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "stdin:1: line is longer than 67108864 bytes; it was skipped");
  EXPECT_HAS(r.out, R"({"ids":[2,75,595,82]})");
  EXPECT_LT(r.max_rss_kib, 250 * 1024) << "peak RSS " << r.max_rss_kib << " KiB";
}

TEST(InputLimits, FlagErrorsSaySomethingUseful) {
  const std::string gen = "generate -m " + kOpt + " --device cpu --prompt hi -n 1 ";
  RunResult half = flexh2o(gen + "--gpu-mem 0.5");  // not 0 bytes, which is unlimited
  EXPECT_EQ(half.code, 2);  // sizes are checked as the flags are parsed
  EXPECT_HAS(half.err, "--gpu-mem: \"0.5\" is a fraction of a byte");
  EXPECT_HAS(half.err, "KiB");
  EXPECT_EQ(flexh2o(gen + "--gpu-mem 0.5GiB --percent 100 0 100 0 100 0").code, 0);
  RunResult huge = flexh2o(gen + "--cpu-mem 1e30GiB");
  EXPECT_EQ(huge.code, 2);
  EXPECT_HAS(huge.err, "--cpu-mem: \"1e30GiB\" has an unknown unit");
  RunResult exa = flexh2o(gen + "--disk-mem 2000000TiB");
  EXPECT_EQ(exa.code, 2);
  EXPECT_HAS(exa.err, "more than 1 EiB");
  RunResult no_dir = flexh2o(gen + "--disk-mem 1GiB");  // it bounded nothing and ran offloaded
  EXPECT_EQ(no_dir.code, 2);  // flags that contradict: a wrong command line
  EXPECT_HAS(no_dir.err, "--disk-mem bounds what --offload-dir holds: give --offload-dir DIR too");
  for (const std::string& cmd : {gen, "bench -m " + kOpt + " --device cpu --prompt-len 4 --gen-len 1 "}) {
    RunResult hw = flexh2o(cmd + "--hardware t4-paper");  // read by nothing without --policy auto
    EXPECT_EQ(hw.code, 2) << cmd;
    EXPECT_HAS(hw.err, "--hardware t4-paper is the profile --policy auto plans for");
  }
  // A mistyped command is named, with the nearest one (CLI11 said "A subcommand is required").
  RunResult typo = flexh2o("genrate -m " + kOpt);
  EXPECT_EQ(typo.code, 2);
  EXPECT_HAS(typo.err, "unknown command \"genrate\" (did you mean generate?); the commands are generate, bench");
  RunResult far = flexh2o("translate");
  EXPECT_EQ(far.code, 2);
  EXPECT_EQ(far.err.find("did you mean"), std::string::npos) << far.err;
  EXPECT_HAS(far.err, "unknown command \"translate\"; the commands are");
  // Huge KV budgets must not overflow their sum (an "internal: zero KV budget").
  RunResult kv = flexh2o(gen + "--kv-policy h2o --heavy-budget 9223372036854775807 --recent-budget 4");
  EXPECT_EQ(kv.code, 2);
  EXPECT_HAS(kv.err, "--heavy-budget must be at most 2147483647 tokens");
  EXPECT_EQ(kv.err.find("internal"), std::string::npos) << kv.err;
  TempDir tmp;
  RunResult pol = flexh2o(gen + "--policy " + tmp.path().string());  // not "basic_filebuf::underflow"
  EXPECT_EQ(pol.code, 2);
  EXPECT_HAS(pol.err, "--policy file " + tmp.path().string() + " is a directory, not a regular file");
  std::ofstream(tmp.path() / "p.json") << R"({"gpu_batch_size": 2.5})";
  RunResult frac = flexh2o(gen + "--policy " + (tmp.path() / "p.json").string());
  EXPECT_EQ(frac.code, 2);
  EXPECT_HAS(frac.err, "\"gpu_batch_size\" must be an integer in [1, 1048576], got 2.5");
}

// What still runs out of memory (a model larger than the machine) says so in words instead of
// "std::bad_alloc". Address-space limits and sanitizers' shadow memory do not mix: skipped there.
TEST(InputLimits, OutOfMemoryIsASentence) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ulimit -v breaks sanitizer runtimes";
#endif
  // opt-1.3b dummy weights (2.6 GB, less than the RAM: the check against the RAM lets them
  // through) under a 2 GB address space. Not lower: the CUDA libraries the binary links
  // (cuBLASLt above all) need about 0.8 GB of address space just to load.
  ShellRun r = run_shell("ulimit -v 2000000; " + kBin + " bench -m opt-1.3b --device cpu --prompt-len 8 --gen-len 1");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "flexh2o: error: out of memory while running `bench`");
}

// --device cuda without a GPU is refused before a preset's dummy weights are made (opt-175b:
// 350 GB, which under a 2 GB address space would end in "out of memory" instead; on a GPU
// machine of this project's kind, OPT-30B's 60 GB took a minute before the refusal).
TEST(InputLimits, DeviceCudaWithoutAGpuIsRefusedBeforeTheWeights) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ulimit -v breaks sanitizer runtimes";
#endif
  ShellRun probe = run_shell(kBin + " bench -m opt-125m --device auto --prompt-len 4 --gen-len 1 --num-prompts 1");
  if (probe.err.find("using the GPU") != std::string::npos) GTEST_SKIP() << "a GPU is present";
  for (const char* cmd : {" bench -m opt-175b --prompt-len 8 --gen-len 1", " generate -m opt-175b --prompt hi",
                          " eval-ppl -m opt-175b /etc/hostname"}) {
    ShellRun r = run_shell("ulimit -v 2000000; " + kBin + cmd + " --device cuda");
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.err;
    EXPECT_HAS(r.err, "--device cuda: ");
    EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << cmd << ": " << r.err;
  }
}

// Engine flags that need no model (the KV policy and its budgets, --kv-dtype, the offloading
// percentages) are refused before a preset's dummy weights are made (opt-175b: 350 GB, which under
// a 2 GB address space would end in "out of memory").
TEST(InputLimits, EngineFlagErrorsComeBeforeTheWeights) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ulimit -v breaks sanitizer runtimes";
#endif
  const std::pair<const char*, const char*> cases[] = {
      {"--kv-policy h20", "unknown --kv-policy"},
      {"--kv-dtype fp8", "--kv-dtype must be auto, f16, bf16, f32 or q4"},
      {"--percent 50 60 0 100 0 100", "110"},
      {"--kv-policy h2o --heavy-ratio 1.5", "--heavy-ratio"},
      {"--compress-cache --kv-dtype f16", "--compress-cache stores the KV cache as q4, but --kv-dtype f16"}};
  for (const char* cmd : {" bench -m opt-175b --prompt-len 8 --gen-len 1 ", " generate -m opt-175b --prompt hi ",
                          " eval-ppl -m opt-175b /etc/hostname ", " eval-choice -m opt-175b --tasks /etc/hostname "})
    for (const auto& [flags, says] : cases) {
      ShellRun r = run_shell("ulimit -v 2000000; " + kBin + cmd + flags);
      EXPECT_EQ(r.code, 2) << cmd << flags << ": " << r.err;  // a wrong command line
      EXPECT_HAS(r.err, says);
      EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << cmd << flags << ": " << r.err;
      EXPECT_EQ(r.err.find("loaded in"), std::string::npos) << cmd << flags << ": " << r.err;
    }
}

// `--input -` reads the requests from standard input (a pipe: FIFOs given by name are refused
// above), with the file's results, its line numbers in errors, and Batch files detected alike.
TEST(InputLimits, DashReadsTheRequestsFromStandardInput) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", batch = tmp.path() / "batch.jsonl";
  std::ofstream(in) << R"({"id": "a", "prompt": "In the beginning"})" "\n\n" R"({"prompt": "And God"})" "\nnot json\n";
  std::ofstream(batch) << R"({"custom_id": "q", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 2, "temperature": 0}})" "\n";
  const std::string gen = kBin + " generate -m " + kOpt + " --device cpu -q -n 4 --greedy ";
  for (const fs::path& f : {in, batch}) {
    ShellRun file = run_shell(gen + "-i " + f.string());
    ShellRun piped = run_shell("cat " + f.string() + " | " + gen + "-i -");
    EXPECT_EQ(piped.code, file.code) << piped.err;
    // The results (a Batch line's ids are fresh on every run: its choices are compared).
    auto results = [](const std::string& out) {
      std::vector<nlohmann::json> r;
      std::istringstream lines(out);
      for (std::string l; std::getline(lines, l);) {
        nlohmann::json j = nlohmann::json::parse(l);
        r.push_back(j.contains("response") ? j["response"]["body"]["choices"] : j);
      }
      return r;
    };
    EXPECT_EQ(results(piped.out), results(file.out));
    EXPECT_EQ(results(piped.out).size(), f == in ? 3u : 1u);
  }
  ShellRun bad = run_shell("cat " + in.string() + " | " + gen + "-i -");
  EXPECT_EQ(bad.code, 1);
  EXPECT_HAS(bad.err, "standard input:4: invalid JSON");
  // Nothing to run is not an error, but it is said (an empty file is usually the wrong one).
  ShellRun none = run_shell("printf '\\n\\n' | " + gen + "-i -");
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_HAS(none.err, "standard input holds no requests");
}

// A preset's dummy weights are made in host RAM whatever the placement: more than the machine has
// is refused before any is made (it ended in the OOM killer, with no message); so is a bench
// workload longer than the model's positions.
TEST(InputLimits, PresetsLargerThanTheRamOrTheirPositionsAreRefusedBeforeTheWeights) {
  for (const char* cmd : {" bench -m opt-175b --prompt-len 8 --gen-len 1", " generate -m opt-175b --prompt hi",
                          " bench -m opt-175b --prompt-len 8 --gen-len 1 --percent 0 0 0 100 100 0 --offload-dir /tmp"}) {
    ShellRun r = run_shell(kBin + cmd + " --device cpu");
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.err;
    EXPECT_HAS(r.err, "preset opt-175b: its dummy weights take ");
    EXPECT_HAS(r.err, "is available");
  }
  ShellRun r = run_shell(kBin + " bench -m opt-175b --prompt-len 4096 --gen-len 1 --device cpu");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "--prompt-len 4096 + --gen-len 1 is longer than a sequence of opt-175b can grow (2048 "
                    "positions: 2049 tokens, the last drawn");
}

// An empty --prompt (or "prompt": "") is the BOS alone, as in transformers: given, not missing.
TEST(InputLimits, AnEmptyPromptGeneratesFromTheBos) {
  const std::string g = kBin + " generate -m " + kOpt + " --device cpu -n 3 --greedy --ignore-eos";
  ShellRun empty = run_shell(g + " --prompt ''");
  ShellRun bos = run_shell("echo '{\"prompt_ids\": [2]}' | " + g + " -i - -q");
  EXPECT_EQ(empty.code, 0) << empty.err;
  ASSERT_EQ(bos.code, 0) << bos.err;
  const nlohmann::json line = nlohmann::json::parse(bos.out);
  EXPECT_EQ(line["token_ids"].size(), 3u);
  EXPECT_EQ(empty.out, line["text"].get<std::string>() + "\n");
  EXPECT_EQ(empty.err.find("failed"), std::string::npos) << empty.err;
}

// A request the model's positions end before its max_new_tokens keeps finish_reason "length"
// (as vLLM) and the run says so once (transformers warns); one that fits says nothing.
TEST(InputLimits, RequestsCutByThePositionsAreCounted) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  std::ofstream(in) << json{{"prompt_ids", std::vector<int>(1020, 5)}, {"max_new_tokens", 10}} << "\n"
                    << json{{"prompt_ids", std::vector<int>(1020, 5)}, {"max_new_tokens", 5}} << "\n"
                    << json{{"prompt_ids", {2, 5}}, {"max_new_tokens", 3}} << "\n";
  ShellRun r = run_shell(kBin + " generate -m " + kOpt + " --device cpu --greedy --ignore-eos -i " + in.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_HAS(r.err, "flexh2o: 1 request(s) reached the model's 1024 positions before their max_new_tokens");
  std::istringstream lines(r.out);
  std::vector<size_t> n;
  for (std::string l; std::getline(lines, l);) n.push_back(json::parse(l)["token_ids"].size());
  EXPECT_EQ(n, (std::vector<size_t>{5, 5, 3}));
}

// Flags that would be ignored or meaningless are refused, naming what to do.
TEST(InputLimits, PlanAndBatchFlagsOutsideTheirUseAreRefused) {
  struct Case {
    const char* cmd;
    const char* says;
  };
  for (const Case& c : {Case{" plan -m opt-30b --hardware t4-paper --prompt-len 2000 --gen-len 50",
                             "--prompt-len 2000 + --gen-len 50 is longer than a sequence of opt-30b can grow (2048 "
                             "positions: 2049 tokens"},
                        Case{" plan -m opt-30b --hardware t4-paper --gpu-batch-size 4", "given with --percent"},
                        Case{" generate -m TINY --prompt hi --gpu-batch-size 0",
                             "--gpu-batch-size: must be at least 1, got 0"},
                        Case{" eval-choice -m TINY --tasks x --batch-size 0",
                             "--batch-size: must be at least 1, got 0"},
                        Case{" generate -m TINY --prompt hi --threads -2", "--threads: must be at least 0, got -2"},
                        Case{" bench -m TINY --threads 100000", "--threads: must be at most "},
                        Case{" profile --threads 100000", "the hardware threads here; got 100000"},
                        Case{" profile --offload-dir /proc -o -",
                             "cannot create the disk probe's directory /proc/flexh2o-profile: No such file or "
                             "directory; give --offload-dir a writable directory"},
                        Case{" generate -m TINY --prompt hi --disk-mem ''", "--disk-mem: \"\" is not a size"},
                        Case{" plan -m opt-30b --hardware t4-paper --cpu-mem 3XB",
                             "--cpu-mem: \"3XB\" has an unknown unit \"XB\""}}) {
    std::string cmd = c.cmd;
    if (const size_t at = cmd.find("TINY"); at != std::string::npos) cmd.replace(at, 4, kOpt);
    ShellRun r = run_shell(kBin + cmd);
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_HAS(r.err, c.says);
  }
  EXPECT_EQ(run_shell(kBin + " generate -m " + kOpt + " --prompt hi -n 1 --threads 0").code, 0);  // 0: all
  // The longest workload generate runs: 2049 tokens, the last drawn from position 2047.
  ShellRun r = run_shell(kBin + " plan -m opt-30b --hardware t4-paper --prompt-len 2000 --gen-len 49");
  EXPECT_EQ(r.code, 0) << r.err;
}

// A budget one byte short of the need: the message gives both in bytes where the rounded sizes
// read the same.
TEST(InputLimits, ABudgetJustShortSaysByHowMuch) {
  TempDir tmp;
  const std::string run = kBin + " bench -m " + model_dir("tiny-llama").string() + " --prompt-len 64 --gen-len 17 " +
                          "--percent 0 0 0 50 100 0 --gpu-batch-size 5 --offload-dir " + (tmp.path() / "s").string();
  ShellRun r = run_shell(run + " --disk-mem 10496511");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_HAS(r.err, "disk budget 10 MiB (10496511 bytes) is too small for a batch of this run");
  EXPECT_HAS(r.err, "it needs 10 MiB (10496512 bytes)");
  EXPECT_EQ(run_shell(run + " --disk-mem 10496512").code, 0);
}

// A sampling flag out of range stops the run before the model loads and before --output exists
// (it was every line's "error", which --resume then took as done); one from the model's
// generation_config.json is refused naming the file, before the model loads too.
TEST(InputLimits, BadSamplingDefaultsStopTheRunBeforeAnyLine) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", model = tmp.path() / "m";
  std::ofstream(in) << "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n";
  const std::string run = "generate -i " + in.string() + " -o " + out.string() + " -n 2 --device cpu ";
  const std::pair<std::string, std::string> flags[] = {{"--top-p 1.5", "top_p must be in (0, 1], got 1.5 (--top-p)"},
                                                       {"--temperature -1", "temperature must be >= 0, got -1"},
                                                       {"--top-k -3", "top_k must be a count of tokens, or 0 or -1 (off), got -3 (--top-k)"},
                                                       {"--min-p 1.5", "(--min-p)"},
                                                       {"--repetition-penalty 0", "(--repetition-penalty)"},
                                                       {"--presence-penalty 5", "(--presence-penalty)"}};
  for (const auto& [flag, want] : flags) {
    const RunResult r = flexh2o(run + "-m " + kOpt + " " + flag);
    EXPECT_EQ(r.code, 2) << flag;  // a wrong command line
    EXPECT_NE(r.err.find(want), std::string::npos) << flag << ": " << r.err;
    EXPECT_EQ(r.err.find("loaded in"), std::string::npos) << flag << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << flag;
  }
  fs::copy(model_dir("tiny-llama"), model, fs::copy_options::recursive);
  std::ofstream(model / "generation_config.json") << R"({"top_p": 2})";
  const RunResult r = flexh2o(run + "-m " + model.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("top_p must be in (0, 1], got 2 (the model's generation_config.json; --generation-config "
                       "none ignores it)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("loaded in"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(flexh2o(run + "-m " + model.string() + " --generation-config none").code, 0);
}

// What `plan --json` writes is a --policy file: its "policy" runs, the prediction beside it is
// not read as policy keys (it was "unknown policy key").
// `flexh2o plan --json` for tiny-opt, 8 + 4 tokens, into dir/plan.json (with `extra` flags).
fs::path tiny_opt_plan(const TempDir& dir, const std::string& extra = "") {
  const fs::path plan = dir.path() / "plan.json";
  const ShellRun p = run_shell(kBin + " plan -m " + kOpt + " --hardware t4-paper --prompt-len 8 --gen-len 4 " +
                               "--gpu-mem 60MiB --json" + extra + " > " + plan.string());
  EXPECT_EQ(p.code, 0) << p.err;
  return plan;
}

TEST(InputLimits, APlanJsonIsAPolicyFile) {
  TempDir tmp;
  const fs::path plan = tiny_opt_plan(tmp);
  const std::string flags = json::parse(read_text(plan))["policy_flags"];
  const RunResult r = flexh2o("generate -m " + kOpt + " --prompt hi -n 2 --device cpu --policy " + plan.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find(flags.substr(0, flags.find(" --num-gpu-batches"))), std::string::npos) << flags << "\n" << r.err;
}

// A plan made for a KV policy runs only under that policy: its block and placement were sized for
// that cache, so a run under another must not take the file silently with the full cache.
TEST(InputLimits, APlanJsonRunsUnderTheKvPolicyItWasPlannedFor) {
  TempDir tmp;
  const std::string h2o = " --kv-policy h2o --heavy-ratio 0.2 --recent-ratio 0.2";
  const fs::path plan = tiny_opt_plan(tmp, h2o);
  const fs::path text = tmp.path() / "t.txt", tasks = data_dir() / "tasks" / "bible_cloze.jsonl";
  std::ofstream(text) << "In the beginning God created the heaven and the earth.\n";
  for (const std::string cmd : {"generate -m " + kOpt + " --prompt hi -n 2",
                                "eval-ppl -m " + kOpt + " " + text.string(),
                                "eval-choice -m " + kOpt + " --limit 2 --tasks " + tasks.string()}) {
    const std::string run = cmd + " --device cpu --policy " + plan.string();
    const RunResult full = flexh2o(run);
    EXPECT_EQ(full.code, 1) << cmd;
    EXPECT_NE(full.err.find("was planned (flexh2o plan --json) for KV policy \"h2o heavy=0.2*prompt "
                            "recent=0.2*prompt\", but this run's is \"full\""),
              std::string::npos)
        << full.err;
    EXPECT_EQ(flexh2o(run + h2o).code, 0) << cmd;
  }
}

// A plan made for another model, or for shorter sequences, still runs (the budgets decide what
// fits) but says so, naming what differs; the model and lengths it was made for run quietly.
TEST(InputLimits, APlanJsonForAnotherModelOrLongerSequencesWarns) {
  TempDir tmp;
  const fs::path plan = tiny_opt_plan(tmp);
  const std::string tail = " --device cpu --policy " + plan.string();
  const RunResult same = flexh2o("generate -m " + kOpt + " --prompt hi -n 4" + tail);
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(same.err.find("warning"), std::string::npos) << same.err;
  const RunResult other = flexh2o("generate -m " + model_dir("tiny-llama").string() + " --prompt hi -n 2" + tail);
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_NE(other.err.find("was planned for tiny-opt, another shape than tiny-llama (ffn_dim 1024 -> 688, "
                           "kv_heads 4 -> 2, model_type \"opt\" -> \"llama\")"),
            std::string::npos)
      << other.err;
  const RunResult longer = flexh2o("generate -m " + kOpt + " --prompt hi -n 20" + tail);
  ASSERT_EQ(longer.code, 0) << longer.err;
  EXPECT_NE(longer.err.find("was planned for sequences of 8 + 4 tokens; this run's reach "), std::string::npos)
      << longer.err;
  EXPECT_EQ(longer.err.find("another shape"), std::string::npos) << longer.err;
  // A longer prompt alone, with a shorter generation: the prefill's activations grow with it.
  const RunResult prompt = flexh2o("generate -m " + kOpt + " --prompt 'one two three four five six seven eight nine "
                                   "ten eleven' -n 1" + tail);
  ASSERT_EQ(prompt.code, 0) << prompt.err;
  EXPECT_NE(prompt.err.find("was planned for sequences of 8 + 4 tokens; this run's reach "), std::string::npos)
      << prompt.err;
}

}  // namespace
