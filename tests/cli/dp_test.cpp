// Data-parallel generate through real mpirun jobs: 2 and 3 ranks give exactly the
// single-process results (tiny-opt and tiny-llama, full and H2O caches, offloading, Batch stop
// strings), --resume finishes a partial output, the report adds up, and a rank that is killed or
// stopped ends the job within a bounded time with a clear error while the output keeps what
// finished.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/dp_generate.h"
#include "cli/mpi_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::expect_same_lines;
using flexh2o::test::model_dir;
using flexh2o::test::mpirun;
using flexh2o::test::read_jsonl;
using flexh2o::test::write_lines;
using flexh2o::test::read_json;
using flexh2o::test::read_text;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kOpt = model_dir("tiny-opt").string();
const std::string kLlama = model_dir("tiny-llama").string();

// PREFIX + i (written so: GCC 12 warns falsely about "x" + std::to_string(i)).
std::string named(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

// 13 requests over the reference prompts: greedy and sampled (own seeds or --seed + index; min-p and
// the penalties on some), and lengths that differ so batches end at different steps.
fs::path write_input(const fs::path& dir, const std::string& model) {
  const json ref = read_json(fs::path(model) / "reference/greedy.json");
  std::vector<json> lines;
  for (int i = 0; i < 13; ++i) {
    json l{{"id", named("r", i)}, {"prompt", ref["prompts"][size_t(i % 3)]["prompt"]},
           {"max_new_tokens", 3 + (i * 5) % 9}};
    if (i % 3 == 1) l["temperature"] = 0;
    if (i % 4 == 2) l["seed"] = 77 + i;
    if (i % 5 == 3) l["top_p"] = 0.9;
    if (i % 6 == 4) l["repetition_penalty"] = 1.4, l["min_p"] = 0.05;  // ranks get every sampling field
    if (i % 6 == 5) l["presence_penalty"] = 0.7, l["frequency_penalty"] = -0.3;
    if (i % 5 == 1) l["logit_bias"] = {{"5", 3.5}, {"9", -100}};
    if (i % 4 == 1) l["logprobs"] = i % 8 == 1 ? 2 : 0;  // ranks send them back
    lines.push_back(std::move(l));
  }
  const fs::path in = dir / "in.jsonl";
  write_lines(in, lines);
  return in;
}

std::string gen(const std::string& model, const fs::path& in, const fs::path& out, const std::string& extra) {
  return "generate -m " + model + " -q --device cpu -i " + in.string() + " -o " + out.string() + " " + extra;
}

// For each model and cache: the single-process run, then mpirun over 2 and 3 ranks.
void expect_like_one_process(const std::string& model, const std::string& flags) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), model);
  const fs::path one = tmp.path() / "one.jsonl", rep1 = tmp.path() / "one.json";
  // -b 2 unless the flags set the block themselves (which -b would contradict).
  const std::string b = flags.find("--gpu-batch-size") == std::string::npos ? "-b 2 " : "";
  RunResult r = flexh2o::test::run_flexh2o(gen(model, in, one, b + flags + " --report " + rep1.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<json> want = read_jsonl(one);
  ASSERT_EQ(want.size(), 13u);
  const json want_report = read_json(rep1);
  for (int ranks : {2, 3}) {
    const std::string what = model + " " + flags + " over " + std::to_string(ranks) + " ranks";
    const fs::path out = tmp.path() / ("dp" + std::to_string(ranks) + ".jsonl");
    const fs::path rep = tmp.path() / ("dp" + std::to_string(ranks) + ".json");
    const RunResult d = mpirun(ranks, gen(model, in, out, b + flags + " --report " + rep.string()));
    ASSERT_EQ(d.code, 0) << what << "\n" << d.err;
    expect_same_lines(read_jsonl(out), want, what);
    const json j = read_json(rep);
    EXPECT_EQ(j["data_parallel_ranks"], ranks) << what;
    EXPECT_EQ(j["generated_tokens"], want_report["generated_tokens"]) << what;
    EXPECT_EQ(j["prompt_tokens"], want_report["prompt_tokens"]) << what;
    // The same batches as one process's, run on the ranks: their steps add up to its (under
    // mpirun --continuous runs static batches).
    if (flags.find("--continuous") == std::string::npos) {
      EXPECT_EQ(j["batches"], want_report["batches"]) << what;
      EXPECT_EQ(j["decode_steps"], want_report["decode_steps"]) << what;
    }
    EXPECT_EQ(j["finished_requests"], 13) << what;
    // The summary line's time is the report's, the job's wall time (the ranks' phases add up).
    std::ostringstream in_s;
    in_s << " prompts in " << j["total_seconds"].get<double>() << " s (";
    EXPECT_NE(d.err.find(in_s.str()), std::string::npos) << what << "\n" << d.err;
    EXPECT_NE(d.err.find(", summed over the ranks)"), std::string::npos) << what << "\n" << d.err;
    // Per-rank figures (device, threads, rates, memory) are only under "ranks".
    for (const char* k : {"device_name", "threads", "decode_tokens_per_s", "peak_rss_bytes", "cpu_isa"})
      EXPECT_FALSE(j.contains(k)) << what << ": " << k << " at the top level";
    ASSERT_EQ(j["ranks"].size(), size_t(ranks)) << what;
    // 7 batches of 2: batch b on rank b % ranks.
    const std::vector<int64_t> requests = ranks == 2 ? std::vector<int64_t>{7, 6} : std::vector<int64_t>{5, 4, 4};
    int64_t tokens = 0, steps = 0, batches = 0;  // each rank's own share: they add up to the job's
    for (int k = 0; k < ranks; ++k) {
      const json& rk = j["ranks"][size_t(k)];
      EXPECT_EQ(rk["rank"], k) << what;
      EXPECT_EQ(rk["requests"], requests[size_t(k)]) << what << " rank " << k;
      EXPECT_TRUE(rk.contains("host") && rk.contains("device_name") && rk.contains("prefill_seconds") &&
                  rk.contains("decode_seconds") && rk.contains("tokens_per_s"))
          << rk.dump();
      EXPECT_EQ(rk.contains("offload"), flags.find("--percent") != std::string::npos) << rk.dump();
      tokens += rk["generated_tokens"].get<int64_t>();
      steps += rk["decode_steps"].get<int64_t>();
      batches += rk["batches"].get<int64_t>();
    }
    EXPECT_EQ(tokens, want_report["generated_tokens"]) << what;
    EXPECT_EQ(steps, j["decode_steps"]) << what;
    EXPECT_EQ(batches, j["batches"]) << what;
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << what;
  }
}

// A rank takes the CPUs mpirun bound it to, else its share of the host's cores.
TEST(DataParallel, RankThreadsFollowTheLaunchersBinding) {
  using flexh2o::cli::rank_threads_of;
  EXPECT_EQ(rank_threads_of(3, 1, 8, 2), 3);  // --threads wins
  EXPECT_EQ(rank_threads_of(0, 1, 2, 1), 1);  // bound to one core of two (mpirun -np 1)
  EXPECT_EQ(rank_threads_of(0, 4, 16, 2), 4);
  EXPECT_EQ(rank_threads_of(0, 16, 16, 2), 8);  // unbound (--oversubscribe, --bind-to none)
  EXPECT_EQ(rank_threads_of(0, 16, 32, 4), 8);  // a socket for two ranks (mpirun -np 4's binding)
  EXPECT_EQ(rank_threads_of(0, 2, 2, 3), 1);
  EXPECT_EQ(rank_threads_of(0, 0, 8, 1), 8);  // affinity unknown
}

// Under mpirun every rank runs the command line; commands other than generate would each run the
// whole job (and print the same results), so each rank refuses before it loads anything. A job of
// one rank runs them.
TEST(DataParallel, CommandsOtherThanGenerateRefuseToRunUnderMpirun) {
  TempDir dir;
  const fs::path text = dir.path() / "t.txt";
  write_lines(text, {"In the beginning God created the heaven and the earth."});
  const std::vector<std::string> cmds = {"eval-ppl --json " + text.string(), "eval-choice --tasks " + text.string(),
                                         "bench --prompt-len 8 --gen-len 2"};
  for (const std::string& cmd : cmds) {
    const RunResult r = mpirun(2, cmd + " -m " + kOpt + " --device cpu");
    EXPECT_NE(r.code, 0) << cmd;
    const std::string name = cmd.substr(0, cmd.find(' '));
    const std::string want = name + " runs as one process: under mpirun each rank would run all of it";
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << cmd;
  }
  const RunResult one = mpirun(1, cmds[0] + " -m " + kOpt + " --device cpu");
  EXPECT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("\"perplexity\""), std::string::npos) << one.out;
}

// mpirun's default binding (a core a rank): the rank asks TBB for no more threads than its core,
// so TBB has nothing to warn about, and the report says one thread.
TEST(DataParallel, ARankBoundToOneCoreRunsOneThreadWithoutWarnings) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt);
  const fs::path out = tmp.path() / "out.jsonl", rep = tmp.path() / "rep.json", err = tmp.path() / "err";
  const std::string cmd = std::string(FLEXH2O_MPIEXEC) + " --allow-run-as-root --bind-to core -np 1 " +
                          FLEXH2O_BINARY_DIR + "/flexh2o " + gen(kOpt, in, out, "--report " + rep.string()) +
                          " >/dev/null 2>" + err.string() + " </dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(err);
  EXPECT_EQ(read_text(err).find("TBB"), std::string::npos) << read_text(err);
  const json r = read_json(rep);
  EXPECT_EQ(r["ranks"][0]["threads"], 1) << r.dump();
}

TEST(DataParallel, TinyOptFullCacheLikeOneProcess) { expect_like_one_process(kOpt, ""); }

// Ranks take one batch at a time (static batches); one process batches continuously: the same lines.
TEST(DataParallel, ContinuousLikeOneProcess) { expect_like_one_process(kOpt, "--continuous"); }

TEST(DataParallel, TinyOptH2OWithOffloadingLikeOneProcess) {
  TempDir store;
  expect_like_one_process(kOpt, "--kv-policy h2o --heavy-budget 4 --recent-budget 4 --percent 20 30 0 50 0 100 "
                                "--gpu-batch-size 2 --num-gpu-batches 1 --offload-dir " +
                                    store.path().string());
}

TEST(DataParallel, TinyLlamaFullAndH2OLikeOneProcess) {
  expect_like_one_process(kLlama, "");
  expect_like_one_process(kLlama, "--kv-policy h2o --heavy-budget 4 --recent-budget 4");
}

// -b with offloading flags is the block on every rank, not only on rank 0 (each rank places its
// own engine from the command line).
TEST(DataParallel, BatchSizeIsTheOffloadedBlockOnEveryRank) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt), out = tmp.path() / "out.jsonl", rep = tmp.path() / "rep.json";
  const RunResult d = mpirun(2, gen(kOpt, in, out, "-b 3 --percent 0 100 100 0 100 0 --report " + rep.string()));
  ASSERT_EQ(d.code, 0) << d.err;
  const json j = read_json(rep);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const json& r : j["ranks"]) EXPECT_EQ(r["batch_size"], 3) << r.dump();
}

TEST(DataParallel, BatchStopStringsEndSequencesOnEveryRank) {
  TempDir tmp;
  const json ref = read_json(model_dir("tiny-opt") / "reference/greedy.json");
  std::vector<json> lines;
  for (int i = 0; i < 6; ++i)
    lines.push_back({{"custom_id", named("c", i)}, {"method", "POST"}, {"url", "/v1/completions"},
                     {"body", {{"prompt", ref["prompts"][0]["prompt"]}, {"max_tokens", 20}, {"temperature", 0},
                               {"stop", i % 2 ? json(" LORD") : json({"xyz", ", and"})}}}});
  const fs::path in = tmp.path() / "in.jsonl";
  write_lines(in, lines);
  const fs::path rep = tmp.path() / "rep.json", out = tmp.path() / "out.jsonl";
  const RunResult d = mpirun(3, gen(kOpt, in, out, "-b 2 --ignore-eos --report " + rep.string()));
  ASSERT_EQ(d.code, 0) << d.err;
  const std::vector<json> got = read_jsonl(out);
  ASSERT_EQ(got.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const json& body = got[size_t(i)]["response"]["body"];
    EXPECT_EQ(got[size_t(i)]["custom_id"], named("c", i));
    EXPECT_EQ(body["choices"][0]["text"], i % 2 ? ", and the" : "") << body.dump();
    EXPECT_EQ(body["choices"][0]["finish_reason"], "stop") << body.dump();
  }
  // ", and the LORD": 4 tokens; ", and": 2 tokens; not 20 each.
  EXPECT_EQ(read_json(rep)["generated_tokens"], 3 * 4 + 3 * 2);
}

// flexh2o lines' "stop" and --stop, as in one process.
TEST(DataParallel, LineStopStringsEndSequencesOnEveryRank) {
  TempDir tmp;
  std::vector<json> lines;
  for (int i = 0; i < 6; ++i) {
    json l = {{"id", named("s", i)}, {"prompt", "In the beginning God created"}, {"max_new_tokens", 20}};
    if (i % 3 == 1) l["stop"] = json({"xyz", ", and"});
    if (i % 3 == 2) l["stop"] = "zzz";
    lines.push_back(l);
  }
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl", rep = tmp.path() / "rep.json";
  write_lines(in, lines);
  const RunResult d = mpirun(3, gen(kOpt, in, out, "-b 2 --greedy --ignore-eos --stop ' LORD' --report " + rep.string()));
  ASSERT_EQ(d.code, 0) << d.err;
  const std::vector<json> got = read_jsonl(out);
  ASSERT_EQ(got.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(got[size_t(i)]["id"], named("s", i));
    const json& g = got[size_t(i)];
    EXPECT_EQ(g["text"].get<std::string>().substr(0, 14), i % 3 == 0 ? ", and the" : i % 3 == 1 ? "" : ", and the LORD")
        << g.dump();
    EXPECT_EQ(g["token_ids"].size(), i % 3 == 0 ? 4u : i % 3 == 1 ? 2u : 20u) << g.dump();
    EXPECT_EQ(g["finish_reason"], i % 3 == 2 ? "length" : "stop") << g.dump();
  }
  EXPECT_EQ(read_json(rep)["generated_tokens"], 2 * 4 + 2 * 2 + 2 * 20);  // ", and the LORD", ", and", all 20
}

// A stop string that is a special token's text ("</s>", made likely by logit_bias, past EOS under
// --ignore-eos) ends a sequence only with skip_special_tokens false, on every rank as in one process.
TEST(DataParallel, SkipSpecialTokensDecidesStopsOnEveryRankAsInOneProcess) {
  TempDir tmp;
  std::vector<json> lines;
  for (int i = 0; i < 6; ++i)
    lines.push_back({{"custom_id", named("c", i)}, {"method", "POST"}, {"url", "/v1/completions"},
                     {"body", {{"prompt", "In the beginning"}, {"max_tokens", 6}, {"temperature", 0},
                               {"logit_bias", {{"2", 12}}}, {"stop", {"</s>"}}, {"skip_special_tokens", i % 2 == 0}}}});
  const fs::path in = tmp.path() / "in.jsonl", one = tmp.path() / "one.jsonl", out = tmp.path() / "out.jsonl";
  write_lines(in, lines);
  ASSERT_EQ(flexh2o::test::run_flexh2o(gen(kOpt, in, one, "-b 2 --ignore-eos")).code, 0);
  const RunResult d = mpirun(3, gen(kOpt, in, out, "-b 2 --ignore-eos"));
  ASSERT_EQ(d.code, 0) << d.err;
  const std::vector<json> want = read_jsonl(one), got = read_jsonl(out);
  ASSERT_EQ(got.size(), 6u);
  ASSERT_EQ(want.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const json &w = want[size_t(i)]["response"]["body"], &g = got[size_t(i)]["response"]["body"];
    EXPECT_EQ(g["choices"], w["choices"]) << i;
    EXPECT_EQ(g["usage"], w["usage"]) << i;
    EXPECT_EQ(w["choices"][0]["finish_reason"], i % 2 ? "stop" : "length") << w.dump();
  }
}

TEST(DataParallel, ResumeFinishesAPartialOutput) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt);
  const fs::path one = tmp.path() / "one.jsonl";
  ASSERT_EQ(flexh2o::test::run_flexh2o(gen(kOpt, in, one, "-b 2")).code, 0);
  const std::vector<json> want = read_jsonl(one);
  // Lines 0-2 and 5 done, and a line cut off while it was written.
  const fs::path out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(out);
    for (size_t i : {0, 1, 2, 5}) f << want[i].dump() << "\n";
    f << want[3].dump().substr(0, 20);
  }
  const RunResult d = mpirun(2, gen(kOpt, in, out, "-b 2 --resume"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("--resume: 4 of 13 requests already in"), std::string::npos) << d.err;
  std::vector<json> got = read_jsonl(out);
  ASSERT_EQ(got.size(), 13u);
  std::vector<json> order = {want[0], want[1], want[2], want[5]};
  for (size_t i = 0; i < want.size(); ++i)
    if (i != 0 && i != 1 && i != 2 && i != 5) order.push_back(want[i]);
  expect_same_lines(got, order, "resumed");
}

TEST(DataParallel, Rank0sErrorEndsTheWorkers) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt), out = tmp.path() / "out.jsonl";
  write_lines(out, {json{{"id", "r0"}, {"token_ids", {1}}}});
  const auto t0 = Clock::now();
  const RunResult d = mpirun(3, gen(kOpt, in, out, "-b 2"));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30);
  EXPECT_EQ(d.code, 1) << d.err;
  EXPECT_NE(d.err.find("already holds results"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("rank 0 of 3 ("), std::string::npos) << d.err;
  EXPECT_NE(d.err.find(") ended the job: it stopped with an error"), std::string::npos) << d.err;
}

// A device budget the first batches fit and the last (400 tokens a sequence) does not: rank 0
// refuses the job before --overwrite empties the old results, not when a rank reaches that batch.
TEST(DataParallel, ABatchThatDoesNotFitIsRefusedBeforeTheOutputIsOpened) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  std::vector<json> lines;
  for (int i = 0; i < 6; ++i)
    lines.push_back(json{{"id", named("r", i)}, {"prompt", "Jesus wept."}, {"max_new_tokens", i < 4 ? 2 : 400}});
  write_lines(in, lines);
  write_lines(out, {json{{"id", "old"}, {"token_ids", {1}}}});
  const std::string old = read_text(out);
  const RunResult d = mpirun(2, gen(kOpt, in, out, "--greedy --overwrite -b 2 --sort-window 1 --gpu-mem 10MiB"));
  EXPECT_EQ(d.code, 1) << d.err;
  EXPECT_NE(d.err.find("device budget 10 MiB is too small for a batch of this run (2 sequences"), std::string::npos)
      << d.err;
  EXPECT_EQ(read_text(out), old);
  // The same job with room for it runs.
  const RunResult ok = mpirun(2, gen(kOpt, in, out, "--greedy --overwrite -b 2 --sort-window 1 --gpu-mem 64MiB"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(read_jsonl(out).size(), 6u);
}

TEST(DataParallel, AFailedRankEndsTheJobWithItsError) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt), out = tmp.path() / "out.jsonl", file = tmp.path() / "file";
  std::ofstream(file) << "x";
  // One program per rank (mpirun's MPMD form): rank 1 cannot make its offload directory.
  const std::string args = gen(kOpt, in, out, "--gpu-batch-size 2 --percent 0 0 0 100 0 100 --offload-dir ");
  const std::string cmd = std::string(FLEXH2O_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 1 " +
                          FLEXH2O_BINARY_DIR + "/flexh2o " + args + (tmp.path() / "store").string() + " : -np 1 " +
                          FLEXH2O_BINARY_DIR + "/flexh2o " + args + (file / "store").string() + " 2>" +
                          (tmp.path() / "err").string() + " </dev/null";
  const auto t0 = Clock::now();
  const int st = std::system(cmd.c_str());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30);
  const std::string err = read_text(tmp.path() / "err");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << err;
  EXPECT_NE(err.find("flexh2o: error: offload directory '" + (file / "store").string() + "' cannot be created"),
            std::string::npos)
      << err;
}

// A number of seconds above 0 (inf: wait for ever); nan was taken, and no wait ever timed out.
TEST(DataParallel, RankTimeoutMustBePositive) {
  for (const char* bad : {"0", "-3", "nan", "5s"}) {
    const RunResult r = flexh2o::test::run_flexh2o("generate -m " + kOpt + " --prompt hi --rank-timeout " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    EXPECT_NE(r.err.find(std::string("--rank-timeout: must be a positive number of seconds, got ") + bad),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(flexh2o::test::run_flexh2o("generate -m " + kOpt + " --prompt hi -n 1 --rank-timeout inf").code, 0);
}

struct Faulted {
  int code = -1;
  double seconds_after_signal = 0;
  std::string err;
  std::vector<json> lines;
};

// mpirun -np 3 on 60 long requests; once the first result is in `out`, `sig` goes to rank `rank`.
Faulted run_and_signal(const fs::path& dir, int rank, int sig, const std::string& extra) {
  std::vector<json> lines;
  for (int i = 0; i < 60; ++i) lines.push_back({{"id", i}, {"prompt", named("Hello number ", i)}});
  write_lines(dir / "big.jsonl", lines);
  const fs::path out = dir / "out.jsonl";
  const flexh2o::test::Signalled s = flexh2o::test::run_and_signal(
      3, gen(kOpt, dir / "big.jsonl", out, "-b 1 --greedy --ignore-eos -n 64 " + extra), out, dir / "err", rank, sig);
  Faulted f;
  f.code = s.code;
  f.seconds_after_signal = s.seconds_after_signal;
  f.err = s.err;
  f.lines = read_jsonl(out);
  return f;
}

// What a single process writes for the 60 requests, by id.
std::vector<json> reference_of_big(const fs::path& dir) {
  const fs::path out = dir / "ref.jsonl";
  EXPECT_EQ(flexh2o::test::run_flexh2o(gen(kOpt, dir / "big.jsonl", out, "-b 1 --greedy --ignore-eos -n 64")).code, 0);
  return read_jsonl(out);
}

void expect_finished_lines_kept(const Faulted& f, const std::vector<json>& want) {
  EXPECT_GE(f.lines.size(), 1u) << f.err;
  EXPECT_LT(f.lines.size(), want.size()) << f.err;
  std::vector<bool> seen(want.size(), false);
  for (const json& l : f.lines) {
    const size_t id = l["id"].get<size_t>();
    ASSERT_LT(id, want.size());
    EXPECT_FALSE(seen[id]) << "id " << id << " twice";
    seen[id] = true;
    EXPECT_EQ(l["token_ids"], want[id]["token_ids"]) << "id " << id;
  }
}

// --resume over `ranks` ranks completes the stopped run in `dir`: every request once, as `want`.
void expect_resume_finishes(const fs::path& dir, int ranks, const std::vector<json>& want, const std::string& what) {
  const RunResult d =
      mpirun(ranks, gen(kOpt, dir / "big.jsonl", dir / "out.jsonl", "-b 1 --greedy --ignore-eos -n 64 --resume"));
  ASSERT_EQ(d.code, 0) << what << "\n" << d.err;
  std::vector<json> got = read_jsonl(dir / "out.jsonl");
  ASSERT_EQ(got.size(), want.size()) << what;
  std::sort(got.begin(), got.end(), [](const json& a, const json& b) { return a["id"] < b["id"]; });
  expect_same_lines(got, want, what);
}

TEST(DataParallel, AKilledRankEndsTheJobAndResumeFinishesIt) {
  TempDir tmp;
  const Faulted f = run_and_signal(tmp.path(), 1, SIGKILL, "");
  EXPECT_NE(f.code, 0) << f.err;
  EXPECT_LT(f.seconds_after_signal, 20) << f.err;
  // mpirun sends SIGTERM to the others, then SIGKILL about a second later: rank 0 says at once
  // that it stops and where the finished results are.
  EXPECT_NE(f.err.find("signal 15: the job stops at the next token step on every rank; finished results are in "
                       "--output (rerun with --resume to finish)"),
            std::string::npos)
      << f.err;
  const std::vector<json> want = reference_of_big(tmp.path());
  expect_finished_lines_kept(f, want);
  expect_resume_finishes(tmp.path(), 2, want, "resumed after the kill");
}

// SIGTERM on a worker or on rank 0 (as `kill`, or a batch system, sends it): every rank stops at
// its next token step, the workers' last results and reports reach rank 0, and every rank exits
// 143 with the report written.
TEST(DataParallel, ASigtermOnAnyRankEndsTheJobInOrder) {
  for (int rank : {1, 0}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    TempDir tmp;
    const fs::path rep = tmp.path() / "rep.json";
    const Faulted f = run_and_signal(tmp.path(), rank, SIGTERM, "--report " + rep.string());
    EXPECT_EQ(f.code, 143) << f.err;
    EXPECT_LT(f.seconds_after_signal, 20) << f.err;
    EXPECT_EQ(f.err.find("ending every rank of the job"), std::string::npos) << f.err;
    EXPECT_NE(f.err.find("signal 15: the job stops at the next token step on every rank; finished results are in "
                         "--output (rerun with --resume to finish)"),
              std::string::npos)
        << f.err;
    EXPECT_NE(f.err.find("rank 0 of 3 ("), std::string::npos) << f.err;
    EXPECT_NE(f.err.find("the job was stopped by signal 15 at a token step"), std::string::npos) << f.err;
    EXPECT_NE(f.err.find(named("rank ", rank) + " of 3 (" ), std::string::npos) << f.err;
    const std::vector<json> want = reference_of_big(tmp.path());
    expect_finished_lines_kept(f, want);
    const json report = read_json(rep);
    EXPECT_EQ(report["interrupted"], true) << report.dump();
    EXPECT_EQ(report["finished_requests"], f.lines.size()) << report.dump();
    ASSERT_EQ(report["ranks"].size(), 3u) << report.dump();
    for (size_t k = 0; k < 3; ++k) {
      const json& rk = report["ranks"][k];
      EXPECT_FALSE(rk.contains("finished")) << "rank " << k << " sent no report: " << rk.dump();
      EXPECT_GT(rk.value("generated_tokens", int64_t(0)), 0) << rk.dump();
      if (k > 0) {
        EXPECT_EQ(rk["interrupted"], true) << rk.dump();
      }
    }
    // Tokens of unfinished requests count too; those of finished ones must all be there.
    EXPECT_GE(report["generated_tokens"].get<int64_t>(), int64_t(64 * f.lines.size())) << report.dump();
    expect_resume_finishes(tmp.path(), 3, want, "resumed after SIGTERM");
  }
}

TEST(DataParallel, AStoppedRankEndsTheJobWithinTheTimeout) {
  TempDir tmp;
  const fs::path rep = tmp.path() / "rep.json";
  const Faulted f = run_and_signal(tmp.path(), 2, SIGSTOP, "--rank-timeout 3 --report " + rep.string());
  EXPECT_EQ(f.code, 1) << f.err;
  // The lost rank's tokens count as far as they are known (its beats, the results it sent), so
  // the job generated at least the tokens its written results hold; rank 0's entry is its own.
  const json r = read_json(rep);
  EXPECT_GE(r["generated_tokens"].get<int64_t>(), r["kept_tokens"].get<int64_t>()) << r.dump();
  EXPECT_EQ(r["ranks"][2]["finished"], false) << r.dump();
  EXPECT_TRUE(r["ranks"][2].contains("generated_tokens")) << r.dump();
  EXPECT_FALSE(r["ranks"][0].contains("kept_tokens")) << r.dump();
  EXPECT_LT(f.seconds_after_signal, 15) << f.err;
  EXPECT_NE(f.err.find("rank 2 of 3 ("), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("sent nothing for 3"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("(--rank-timeout 3 s): it hangs or was stopped; ending the job"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("the job failed on a rank (below): "), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("once that is fixed, --resume finishes"), std::string::npos) << f.err;
  expect_finished_lines_kept(f, reference_of_big(tmp.path()));
}

TEST(DataParallel, AStoppedRank0EndsTheWorkersWithinTheTimeout) {
  TempDir tmp;
  const Faulted f = run_and_signal(tmp.path(), 0, SIGSTOP, "--rank-timeout 3");
  EXPECT_NE(f.code, 0) << f.err;
  EXPECT_LT(f.seconds_after_signal, 20) << f.err;
  EXPECT_NE(f.err.find("heard nothing from rank 0 of 3 ("), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("in 3 s (--rank-timeout 3 s): it hangs or was stopped; ending the job"), std::string::npos)
      << f.err;
  expect_finished_lines_kept(f, reference_of_big(tmp.path()));
}

}  // namespace
