// Outputs as a user relies on them: a failed write (full disk) never exits 0, an output that is
// an input is refused before a byte is written, existing results are not overwritten by
// accident (nor by a run refused before it starts), and one bad line in `tokenize` does not cost the others.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "cli_run.h"
#include "jsonl.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::model_dir;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;

const std::string kOpt = model_dir("tiny-opt").string();

RunResult flexh2o(const std::string& args) { return flexh2o::test::run_flexh2o(args); }

// `flexh2o ARGS` with standard output going to `stdout_path` (the helper above captures it) and
// standard input from `stdin_path`.
RunResult flexh2o_to(const std::string& args, const std::string& stdout_path,
                     const std::string& stdin_path = "/dev/null") {
  TempDir tmp;
  const fs::path err = tmp.path() / "err";
  const std::string cmd = std::string(FLEXH2O_BINARY_DIR) + "/flexh2o " + args + " >" + stdout_path + " 2>" +
                          err.string() + " <" + stdin_path;
  const int st = std::system(cmd.c_str());
  RunResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = read_text(err);
  return r;
}

void write_file(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

const std::string kPrompts = R"({"id": "a", "prompt": "In the beginning", "max_new_tokens": 2})" "\n"
                             R"({"id": "b", "prompt": "Jesus wept.", "max_new_tokens": 2})" "\n";

// `-o -` and `-o /dev/stdout` are standard output: the JSONL lines alone, as without -o (the
// printed texts went to the same file through another offset and overwrote lines), and no file
// named "-".
TEST(CliOutput, StandardOutputAsOutputGivesTheResultLinesAlone) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", plain = tmp.path() / "plain.jsonl";
  write_file(in, kPrompts);
  const std::string args = "generate -m " + kOpt + " -i " + in.string() + " --device cpu --greedy --ignore-eos";
  ASSERT_EQ(flexh2o_to(args, plain.string()).code, 0);
  const std::string want = read_text(plain);
  ASSERT_EQ(std::count(want.begin(), want.end(), '\n'), 2) << want;
  for (const char* o : {"-", "/dev/stdout"}) {
    const fs::path got = tmp.path() / "got.jsonl";
    const std::string cmd = "cd " + tmp.path().string() + " && " + FLEXH2O_BINARY_DIR + "/flexh2o " + args + " -o " +
                            o + " >" + got.string() + " 2>/dev/null </dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << o;
    EXPECT_EQ(read_text(got), want) << o;
    EXPECT_FALSE(fs::exists(tmp.path() / "-")) << o;
  }
  // --prompt with -o -: its JSONL line, not the bare text --prompt alone prints.
  const fs::path one = tmp.path() / "one.jsonl";
  ASSERT_EQ(flexh2o_to("generate -m " + kOpt + " --prompt Hi -n 2 --device cpu --greedy -o -", one.string()).code, 0);
  EXPECT_EQ(nlohmann::json::parse(read_text(one))["token_ids"].size(), 2u) << read_text(one);
  // The file stdout is redirected to, named as a file: refused (its results would skip the
  // checks an output file gets), not written through two offsets.
  const fs::path same = tmp.path() / "same.jsonl";
  const RunResult r = flexh2o_to(args + " -o " + same.string(), same.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is the file standard output is redirected to"), std::string::npos) << r.err;
}

TEST(CliOutput, FullDiskFailsNamingThePath) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", ids = tmp.path() / "ids.jsonl", out = tmp.path() / "out.jsonl";
  write_file(in, kPrompts);
  write_file(ids, R"({"ids": [2, 100, 200]})" "\n");
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"generate -m " + kOpt + " -i " + in.string() + " -o /dev/full -q", "--output /dev/full"},
      {"generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() + " --overwrite -q --report /dev/full",
       "--report /dev/full"},
      {"tokenize -t " + kOpt + " -i " + in.string() + " -o /dev/full", "--output /dev/full"},
      {"detokenize -t " + kOpt + " -i " + ids.string() + " -o /dev/full", "--output /dev/full"},
  };
  for (const Case& c : cases) {
    RunResult r = flexh2o(c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << c.args << "\n" << r.err;
  }
  // Standard output on a full disk: results, the tokenizer's lines, an evaluation's numbers.
  for (const std::string& args :
       {"generate -m " + kOpt + " --prompt hi -n 2", "tokenize -t " + kOpt + " -i " + in.string(),
        "eval-ppl -m " + kOpt + " --max-tokens 8 --json " + (model_dir("tiny-opt") / "reference/eval.txt").string()}) {
    RunResult r = flexh2o_to(args, "/dev/full");
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("cannot write standard output"), std::string::npos) << args << "\n" << r.err;
  }
}

TEST(CliOutput, OutputThatIsAnInputIsRefusedAndTheInputKept) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", ids = tmp.path() / "ids.jsonl";
  write_file(in, kPrompts);
  write_file(ids, R"({"ids": [2, 100, 200]})" "\n");
  fs::create_directory(tmp.path() / "sub");
  fs::create_symlink(in, tmp.path() / "link.jsonl");
  fs::create_hard_link(in, tmp.path() / "hard.jsonl");
  fs::create_symlink(ids, tmp.path() / "ids-link.jsonl");
  fs::create_hard_link(ids, tmp.path() / "ids-hard.jsonl");
  const std::string gen = "generate -m " + kOpt + " -q -i " + in.string();
  const std::string tok = "tokenize -t " + kOpt + " -i " + in.string();
  const std::string detok = "detokenize -t " + kOpt + " -i " + ids.string();
  const std::string sub = (tmp.path() / "sub/../in.jsonl").string();
  const std::string absent = (tmp.path() / "new.json").string();
  const fs::path model = tmp.path() / "model";  // a copy: a regression must not clobber tests/data
  fs::create_directory(model);
  flexh2o::test::copy_model_files(model_dir("tiny-opt"), model);
  struct Case {
    std::string args, needle, stdin_path = "/dev/null";
  } cases[] = {
      {gen + " -o " + in.string(), "--output " + in.string() + " is the same file as --input"},
      {gen + " -o " + (tmp.path() / "link.jsonl").string(), "is the same file as --input"},
      {gen + " -o " + (tmp.path() / "hard.jsonl").string(), "is the same file as --input"},
      {gen + " -o " + sub, "is the same file as --input"},
      {gen + " --overwrite -o " + in.string(), "is the same file as --input"},
      {gen + " --resume -o " + in.string(), "is the same file as --input"},
      {gen + " --report " + in.string(), "--report " + in.string() + " is the same file as --input"},
      {gen + " -o " + absent + " --report " + absent, "--report " + absent + " is the same file as --output"},
      {"generate -m " + model.string() + " --prompt hi --report " + (model / "config.json").string(),
       "is the same file as --model"},
      {tok + " -o " + in.string(), "is the same file as --input"},
      {tok + " -o " + (tmp.path() / "link.jsonl").string(), "is the same file as --input"},
      {tok + " -o " + (tmp.path() / "hard.jsonl").string(), "is the same file as --input"},
      {"tokenize -t " + kOpt + " -o " + in.string(), "is the same file as standard input", in.string()},
      {detok + " -o " + ids.string(), "is the same file as --input"},
      {detok + " -o " + (tmp.path() / "ids-link.jsonl").string(), "is the same file as --input"},
      {detok + " -o " + (tmp.path() / "ids-hard.jsonl").string(), "is the same file as --input"},
  };
  const std::string in_bytes = read_text(in), ids_bytes = read_text(ids);
  const std::string config_bytes = read_text(model / "config.json");
  for (const Case& c : cases) {
    RunResult r = flexh2o_to(c.args, (tmp.path() / "stdout").string(), c.stdin_path);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(read_text(in), in_bytes) << c.args;
    EXPECT_EQ(read_text(ids), ids_bytes) << c.args;
    EXPECT_FALSE(fs::exists(absent)) << c.args;
  }
  EXPECT_EQ(read_text(model / "config.json"), config_bytes);
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "link.jsonl"));
  // Two outputs on /dev/null are not a conflict (nothing there to lose).
  RunResult ok = flexh2o(gen + " -o /dev/null --report /dev/null");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST(CliOutput, ExistingResultsAreNotOverwrittenWithoutAFlag) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_file(in, kPrompts);
  const std::string gen = "generate -m " + kOpt + " -q --greedy -i " + in.string() + " -o " + out.string();
  ASSERT_EQ(flexh2o(gen).code, 0);
  const std::string first = read_text(out);
  RunResult again = flexh2o(gen);
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("--output " + out.string() + " already holds results"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(out), first);
  RunResult over = flexh2o(gen + " --overwrite");
  EXPECT_EQ(over.code, 0) << over.err;
  EXPECT_EQ(read_text(out), first);  // replaced, not appended
  RunResult both = flexh2o(gen + " --overwrite --resume");
  EXPECT_EQ(both.code, 2);  // usage error
  // A report is replaced whole: no temporary file is left next to it.
  const fs::path rep = tmp.path() / "r.json";
  ASSERT_EQ(flexh2o(gen + " --overwrite --report " + rep.string()).code, 0);
  ASSERT_EQ(flexh2o(gen + " --overwrite --report " + rep.string()).code, 0);
  EXPECT_FALSE(json::parse(read_text(rep))["interrupted"].get<bool>());
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);  // in, out, report
}

// --overwrite replaces the old results only once the run is set up: a run refused before then
// (a bad flag, a placement refused after the model loads, a report path that cannot be written,
// a later batch that does not fit the budgets) leaves them as they were. An unwritable --report is refused before the work, in bench too.
TEST(CliOutput, OverwriteKeepsTheOldResultsUntilTheRunStarts) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_file(in, kPrompts);
  const std::string old = R"({"id": "a", "text": "from an earlier run"})" "\n";
  const std::string gen = "generate -m " + kOpt + " -q --greedy -i " + in.string() + " -o " + out.string() + " --overwrite ";
  const std::string nodir = (tmp.path() / "no" / "r.json").string();
  struct Case {
    std::string extra, says;
    int code;  // 2: a wrong command line; 1: a path that cannot be written
  } cases[] = {
      {"--kv-policy h2o --heavy-ratio 2", "--heavy-ratio", 2},
      {"--percent 100 0 100 0 0 0", "the last pair of --percent: 100 0 or 0 100), got 0 0 (disk; activations", 2},
      {"--percent 100 0 100 0 50 50", "activations must live on one tier, the device or the host", 2},
      {"--report " + nodir, "cannot write --report " + nodir + ": its directory", 1},
  };
  for (const Case& c : cases) {
    write_file(out, old);
    RunResult r = flexh2o(gen + c.extra);
    EXPECT_EQ(r.code, c.code) << c.extra << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(read_text(out), old) << c.extra;
  }
  // A device budget the first batch fits and the second (400 tokens a sequence) does not: the
  // run is refused before its first result, not at the second batch with the old results gone.
  const fs::path longer = tmp.path() / "longer.jsonl";
  write_file(longer, kPrompts + R"({"id": "c", "prompt": "In the beginning", "max_new_tokens": 400})" "\n"
                                R"({"id": "d", "prompt": "Jesus wept.", "max_new_tokens": 400})" "\n");
  write_file(out, old);
  // Its --report says so (an earlier run's report there would otherwise read as this run's).
  const fs::path rep = tmp.path() / "rep.json";
  write_file(rep, R"({"from": "an earlier run"})");
  RunResult r = flexh2o("generate -m " + kOpt + " -q --greedy -i " + longer.string() + " -o " + out.string() +
                        " --overwrite -b 2 --sort-window 1 --gpu-mem 10MiB --report " + rep.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("device budget 10 MiB is too small for a batch of this run (2 sequences"), std::string::npos)
      << r.err;
  EXPECT_EQ(read_text(out), old);
  const json report = json::parse(read_text(rep));
  EXPECT_NE(report.value("error", "").find("device budget 10 MiB is too small"), std::string::npos) << report.dump();
  EXPECT_EQ(report["finished_requests"], 0);
  EXPECT_FALSE(report["interrupted"].get<bool>());
  r = flexh2o("generate -m " + kOpt + " -q --greedy -i " + in.string() + " -o " + (tmp.path() / "no" / "o.jsonl").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("its directory"), std::string::npos) << r.err;
  r = flexh2o("bench -m " + kOpt + " --prompt-len 8 --gen-len 2 --report " + nodir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot write --report " + nodir), std::string::npos) << r.err;
  EXPECT_EQ((r.out + r.err).find("tok/s"), std::string::npos) << "the benchmark ran before the refusal: " << r.out;
}

// A batch the budgets cannot hold is refused before any weight is placed: writing a large
// model's store to --offload-dir takes minutes, which a refusal after it wasted.
TEST(CliOutput, ABatchThatDoesNotFitIsRefusedBeforeTheWeightsArePlaced) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", dir = tmp.path() / "store";
  std::string lines;
  for (int i = 0; i < 8; ++i) lines += R"({"prompt": "In the beginning God created the heaven and the earth."})" "\n";
  write_file(in, lines);
  const std::string place = " --threads 1 --percent 0 0 0 100 100 0 --gpu-batch-size 8 --gpu-mem 7MiB --offload-dir " +
                            dir.string();
  for (const std::string& cmd : {"generate -m " + kOpt + " -q -n 200 -i " + in.string() + " -o " +
                                     (tmp.path() / "o.jsonl").string() + place,
                                 "bench -m " + kOpt + " --prompt-len 200 --gen-len 8" + place}) {
    fs::remove_all(dir);
    const RunResult r = flexh2o(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("device budget 7 MiB is too small for a batch of this run (8 sequences"), std::string::npos)
        << r.err;
    size_t weight_files = 0;
    for (const auto& f : fs::directory_iterator(dir)) weight_files += f.path().extension() == ".fhs";
    EXPECT_EQ(weight_files, 0u) << cmd;
  }
}

// The decode rate counts the tokens decode steps drew (FlexGen's (gen - 1) x batch): each
// sequence's first token comes from the prefill's logits, in the prefill's seconds.
TEST(CliOutput, TheDecodeRateCountsTheTokensOfDecodeSteps) {
  TempDir tmp;
  const std::string rep = (tmp.path() / "r.json").string();
  for (const int gen : {1, 3}) {
    const RunResult r = flexh2o("bench -m " + kOpt + " --prompt-len 8 --num-prompts 2 --device cpu --gen-len " +
                                std::to_string(gen) + " --report " + rep);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(read_text(rep));
    EXPECT_EQ(j["generated_tokens"], 2 * gen);
    EXPECT_EQ(j["decode_tokens"], 2 * (gen - 1));
    const double s = j["decode_seconds"];
    EXPECT_EQ(j["decode_tokens_per_s"].get<double>(), gen > 1 && s > 0 ? 2 * (gen - 1) / s : 0.0) << j.dump();
  }
}

// `flexh2o ARGS` with `small` a tmpfs of `size` (e.g. "3M") in a private mount namespace
// (unshare -m): its exit code and stderr; nullopt where this process may not make one.
struct Run {
  int code = -1;
  std::string err;
};
std::optional<Run> run_on_tmpfs(const fs::path& small, const std::string& size, const std::string& args) {
  fs::create_directories(small);
  const std::string mount = "mount -t tmpfs -o size=" + size + " none " + small.string();
  if (std::system(("unshare -m sh -c '" + mount + "' 2>/dev/null").c_str()) != 0) return std::nullopt;
  const fs::path err = small.parent_path() / "tmpfs_run.err";
  const std::string run = std::string(FLEXH2O_BINARY_DIR) + "/flexh2o " + args;
  const int st = std::system(("unshare -m sh -c '" + mount + " && exec " + run + "' 2>" + err.string()).c_str());
  return Run{WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_text(err)};
}

// An --offload-dir too small for the weights homed there is refused before the first file, with
// the total needed (it failed at the file that did not fit, naming that file's size, with the
// files before it written).
TEST(CliOutput, AnOffloadDirTooSmallForTheWeightsIsRefusedWithTheTotal) {
  TempDir tmp;
  const fs::path small = tmp.path() / "small";
  const auto r = run_on_tmpfs(small, "3M", "generate -m " + kOpt + " --prompt hi -n 2 --percent 0 0 100 0 100 0 "
                                           "--offload-dir " + (small / "store").string());
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here";
  EXPECT_EQ(r->code, 1);
  EXPECT_NE(r->err.find("offload directory " + (small / "store").string() + " has 3 MiB free; the "), std::string::npos)
      << r->err;
  EXPECT_NE(r->err.find("weight files to write need 8.93 MiB"), std::string::npos) << r->err;
}

// --policy auto plans the disk tier as what --offload-dir has room for, not the profile's disk:
// it homed weights a 3 MiB tmpfs could not hold, then failed placing them (change --percent, it said).
TEST(CliOutput, PolicyAutoPlansTheRoomUnderTheOffloadDir) {
  TempDir tmp;
  const fs::path small = tmp.path() / "small";
  const auto r = run_on_tmpfs(small, "3M", "generate -m " + kOpt + " --prompt hi -n 2 --policy auto --hardware "
                                           "t4-paper --gpu-mem 3MiB --cpu-mem 4MiB --offload-dir " +
                                               (small / "store").string());
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here";
  EXPECT_EQ(r->code, 1);
  EXPECT_NE(r->err.find("the disk tier is the 3 MiB --offload-dir " + (small / "store").string() + " has room for"),
            std::string::npos) << r->err;
  EXPECT_NE(r->err.find("infeasible: tiny-opt needs at least"), std::string::npos) << r->err;
  EXPECT_NE(r->err.find("disk 0.002517 GB"), std::string::npos) << r->err;
}

// Room for the weights but not for the KV cache homed on disk: refused before the first batch,
// with --output (and the results it holds) untouched, not when the batch's KV files are made.
TEST(CliOutput, AnOffloadDirTooSmallForTheKvCacheIsRefusedBeforeTheOutput) {
  TempDir tmp;
  const fs::path small = tmp.path() / "small", in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_file(in, R"({"id": "a", "prompt": "In the beginning", "max_new_tokens": 300})" "\n"
                 R"({"id": "b", "prompt": "Jesus wept.", "max_new_tokens": 300})" "\n");
  const std::string old = R"({"id": "a", "text": "from an earlier run"})" "\n";
  write_file(out, old);
  const auto r = run_on_tmpfs(small, "10M", "generate -m " + kOpt + " -i " + in.string() + " -o " + out.string() +
                                            " --overwrite -q --greedy -b 2 --percent 0 0 0 0 100 0 --offload-dir " +
                                            (small / "store").string());
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs in a private mount namespace here";
  EXPECT_EQ(r->code, 1);
  EXPECT_NE(r->err.find("the KV cache of a batch of this run (2 sequences, capacity 306) needs 2.41 MiB there"),
            std::string::npos)
      << r->err;
  EXPECT_EQ(read_text(out), old);
}

// A store built once, then mounted read-only (a shared, prebuilt --offload-dir): its weight files
// serve the same tokens; a run that would write there (KV files, weights of other flags) is
// refused naming the directory, before --output is touched; nothing is written. A read-only bind
// mount in a private mount namespace: skipped where this process may not make one.
TEST(CliOutput, AReadOnlyOffloadDirServesItsWeightsAndRefusesWrites) {
  TempDir tmp;
  const fs::path store = tmp.path() / "store", out = tmp.path() / "out.jsonl", err = tmp.path() / "err";
  const std::string bin = std::string(FLEXH2O_BINARY_DIR) + "/flexh2o";
  const std::string gen = bin + " generate -m " + kOpt + " --prompt \"In the beginning\" -n 6 --greedy -q " +
                          "--offload-dir " + store.string() + " -o " + out.string() + " --overwrite ";
  RunResult built = flexh2o(gen.substr(bin.size() + 1) + "--percent 0 0 100 0 100 0");
  ASSERT_EQ(built.code, 0) << built.err;
  const std::string want = read_text(out);
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(store)) files.insert(e.path().filename().string());
  const std::string ro = "mount --bind " + store.string() + " " + store.string() + " && mount -o remount,ro,bind " +
                         store.string();
  if (std::system(("unshare -m sh -c '" + ro + "' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot make a read-only bind mount in a private mount namespace here";
  auto run = [&](const std::string& flags) {
    const std::string cmd = ro + " && exec " + gen + flags;
    const int st = std::system(("unshare -m sh -c '" + cmd + "' 2>" + err.string()).c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  write_file(out, "old\n");
  EXPECT_EQ(run("--percent 0 0 100 0 100 0"), 0) << read_text(err);
  EXPECT_EQ(read_text(out), want);
  write_file(out, "old\n");
  EXPECT_EQ(run("--percent 0 0 0 0 100 0"), 1);  // the KV cache on disk
  EXPECT_NE(read_text(err).find("offload directory " + store.string() +
                                " is not writable by this process (a read-only mount, or another user's); "
                                "this run homes "),
            std::string::npos)
      << read_text(err);
  EXPECT_EQ(read_text(out), "old\n");
  EXPECT_EQ(run("--percent 0 0 100 0 100 0 --compress-weight"), 1);  // weight files of another identity
  EXPECT_NE(read_text(err).find(" and 68 of the 68 weight files this run reads there cannot be used: store "
                                "parameters changed (weights: compress_weight) (42 files there could not be "
                                "reused, 26 were missing)"),
            std::string::npos)
      << read_text(err);
  EXPECT_EQ(read_text(out), "old\n");
  std::set<std::string> after;
  for (const auto& e : fs::directory_iterator(store)) after.insert(e.path().filename().string());
  EXPECT_EQ(after, files);
}

// "-" is standard input for --input and standard output for --output, as in generate; a --report
// of "-" is refused rather than written to a file named "-".
TEST(CliOutput, TokenizeTakesDashForTheStandardStreams) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", want = tmp.path() / "want.jsonl", got = tmp.path() / "got.jsonl";
  write_file(in, "{\"text\": \"In the beginning\"}\n{\"text\": \"Jesus wept.\"}\n");
  ASSERT_EQ(flexh2o("tokenize -t " + kOpt + " -i " + in.string() + " -o " + want.string()).code, 0);
  const std::string bin = std::string(FLEXH2O_BINARY_DIR) + "/flexh2o";
  const std::string cmd = "cd " + tmp.path().string() + " && " + bin + " tokenize -t " + kOpt + " -i - -o - < " +
                          in.string() + " > " + got.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(read_text(got), read_text(want));
  EXPECT_FALSE(fs::exists(tmp.path() / "-"));
  RunResult r = flexh2o("generate -m " + kOpt + " -p hi -n 1 --report -");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--report - takes a file name"), std::string::npos) << r.err;
}

// --trace is checked before the run without being emptied: a run that fails before it (or writes no
// trace) leaves an earlier trace as it was.
TEST(CliOutput, ATraceFileIsNotEmptiedBeforeTheRun) {
  TempDir tmp;
  const fs::path trace = tmp.path() / "t.json";
  write_file(trace, "{\"keep\": 1}\n");
  // A run that fails (its tokenizer), and one in memory (no offloading flag), where the engine
  // that writes traces does not run: refused naming the flag, not silently ignored.
  for (const std::string& extra : {" --percent 100 0 100 0 100 0 --tokenizer " + (tmp.path() / "none").string(),
                                   std::string()}) {
    RunResult r = flexh2o("generate -m " + kOpt + " -p hi -n 2 --trace " + trace.string() + extra);
    EXPECT_EQ(r.code, extra.empty() ? 2 : 1) << r.err;
    if (extra.empty()) {
      EXPECT_NE(r.err.find("--trace is the offloading engine's"), std::string::npos) << r.err;
    }
    EXPECT_EQ(read_text(trace), "{\"keep\": 1}\n") << extra;
  }
  for (const char* flag : {"--overlap false", "--sep-layer false", "--io pread", "--trust-store"}) {
    RunResult r = flexh2o(std::string("eval-ppl -m ") + kOpt + " " + flag + " " + trace.string());
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.err;
    EXPECT_NE(r.err.find(std::string(flag).substr(0, std::string(flag).find(' ')) + " is the offloading engine's"),
              std::string::npos) << r.err;
  }
}

TEST(CliOutput, TokenizeKeepsGoingPastAnInvalidUtf8Line) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", good = tmp.path() / "good.jsonl";
  write_file(in, "{\"text\": \"In the beginning\"}\n{\"text\": \"bad \xff\xfe bytes\"}\n{\"text\": \"Jesus wept.\"}\n");
  write_file(good, "{\"text\": \"In the beginning\"}\n{\"text\": \"Jesus wept.\"}\n");
  RunResult r = flexh2o("tokenize -t " + kOpt + " -i " + in.string() + " -o " + out.string());
  EXPECT_EQ(r.code, 1) << r.err;  // a line failed
  EXPECT_NE(r.err.find("in.jsonl:2:"), std::string::npos) << r.err;
  RunResult ref = flexh2o("tokenize -t " + kOpt + " -i " + good.string());
  ASSERT_EQ(ref.code, 0) << ref.err;
  std::istringstream got(read_text(out)), want(ref.out);
  std::string line;
  std::vector<json> lines, wanted;
  while (std::getline(got, line)) lines.push_back(json::parse(line));
  while (std::getline(want, line)) wanted.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 3u) << read_text(out);
  EXPECT_EQ(lines[0], wanted[0]);
  EXPECT_EQ(lines[1]["line"], 2);
  EXPECT_TRUE(lines[1].contains("error"));
  EXPECT_EQ(lines[2], wanted[1]);
  // Lines without a string "text" say which it is.
  write_file(in, "{\"text\": 5}\n{\"txt\": \"x\"}\n");
  r = flexh2o("tokenize -t " + kOpt + " -i " + in.string());
  EXPECT_EQ(r.code, 1) << r.err;
  std::istringstream bad(r.out);
  std::vector<json> errors;
  while (std::getline(bad, line)) errors.push_back(json::parse(line));
  ASSERT_EQ(errors.size(), 2u) << r.out;
  EXPECT_EQ(errors[0]["error"], "\"text\" must be a string, got number");
  EXPECT_EQ(errors[1]["error"], "line has no \"text\" field");
}

}  // namespace

namespace {
// A second run writing the same --output (a requeued job, --overwrite beside a live run) is
// refused while the first holds the file: both used to append, every result twice. The holder
// here is this test, with the same flock(2) a run takes; a run that fails before writing
// leaves no empty output behind.
TEST(CliOutput, ASecondRunWritingTheSameOutputIsRefused) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  write_file(in, kPrompts);
  const std::string run = "generate -m " + kOpt + " -i " + in.string() + " --device cpu --greedy -o " + out.string();
  {
    const int fd = ::open(out.c_str(), O_RDONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    for (const char* extra : {"", " --resume", " --overwrite"}) {
      const RunResult r = flexh2o(run + extra);
      EXPECT_EQ(r.code, 1) << extra << "\n" << r.err;
      EXPECT_NE(r.err.find("another run is writing --output " + out.string() + " (pid " +
                           std::to_string(::getpid()) + ")"),
                std::string::npos)
          << r.err;
      EXPECT_EQ(read_text(out), "") << extra;
    }
    ::close(fd);
  }
  const RunResult r = flexh2o(run + " --resume");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(flexh2o::test::read_jsonl(out).size(), 2u);
  // --overwrite names the output it replaces: without one it did nothing, silently.
  const RunResult lone = flexh2o("generate -m " + kOpt + " -i " + in.string() + " --device cpu --overwrite");
  EXPECT_EQ(lone.code, 2) << lone.err;
  EXPECT_NE(lone.err.find("--overwrite replaces the results an --output FILE holds, and no --output is given"),
            std::string::npos)
      << lone.err;

  // The lock creates the output as the run would: through a dangling symlink, 0666 less the umask.
  const fs::path target = tmp.path() / "target.jsonl", link = tmp.path() / "link.jsonl";
  fs::create_symlink(target, link);
  const std::string umask_run = "umask 002 && " + std::string(FLEXH2O_BINARY_DIR) + "/flexh2o " +
                                run.substr(0, run.find(" -o ")) + " -o " + link.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(umask_run.c_str()), 0);
  EXPECT_EQ(flexh2o::test::read_jsonl(target).size(), 2u);
  EXPECT_EQ(fs::status(target).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::group_write |
                fs::perms::others_read);
  // A model directory whose config.json is no JSON: the run fails after taking its lock.
  const fs::path fresh = tmp.path() / "fresh.jsonl", bad = tmp.path() / "bad-model";
  fs::create_directories(bad);
  write_file(bad / "config.json", "{");
  const RunResult failed = flexh2o("generate -m " + bad.string() + " -i " + in.string() + " -o " + fresh.string());
  EXPECT_EQ(failed.code, 1) << failed.err;
  EXPECT_NE(failed.err.find("config.json"), std::string::npos) << failed.err;
  EXPECT_FALSE(fs::exists(fresh));
}
}  // namespace

namespace {
// A reader that closes its pipe (`| head`): with --output the run goes on, says once that the
// texts stop and exits 0 with every result in the file; with the results on standard output it
// stops with an error and still writes its report. Both used to die by SIGPIPE, silently.
TEST(CliOutput, AClosedStandardOutputIsSaidAndTheRunEndsInOrder) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", rep = tmp.path() / "rep.json";
  {
    std::ofstream f(in);
    for (int i = 0; i < 200; ++i) f << json{{"id", i}, {"prompt", "In the beginning"}, {"max_new_tokens", 4}} << "\n";
  }
  for (const bool to_file : {true, false}) {
    SCOPED_TRACE(to_file ? "--output" : "standard output");
    fs::remove(rep);
    const fs::path err = tmp.path() / "err", rc = tmp.path() / "rc";
    const std::string cmd = "(" + std::string(FLEXH2O_BINARY_DIR) + "/flexh2o generate -m " + kOpt +
                            " --device cpu --greedy -b 4 -i " + in.string() + " --report " + rep.string() +
                            (to_file ? " -o " + out.string() : std::string()) + " 2>" + err.string() +
                            "; echo $? >" + rc.string() + ") | head -c 1 >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    const std::string said = read_text(err);
    const json report = json::parse(read_text(rep));
    if (to_file) {
      EXPECT_EQ(read_text(rc), "0\n") << said;
      EXPECT_NE(said.find("standard output failed (Broken pipe): the texts are no longer printed"), std::string::npos)
          << said;
      EXPECT_EQ(flexh2o::test::read_jsonl(out).size(), 200u);
      EXPECT_FALSE(report.contains("error")) << report.dump();
    } else {
      EXPECT_EQ(read_text(rc), "1\n") << said;
      EXPECT_NE(said.find("error: cannot write standard output (Broken pipe): the results printed there stop"),
                std::string::npos)
          << said;
      EXPECT_EQ(said.find("error: cannot write standard output\n"), std::string::npos) << "said twice: " << said;
      EXPECT_TRUE(report.contains("error")) << report.dump();
    }
  }
}
}  // namespace
