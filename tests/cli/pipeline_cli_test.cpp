// generate --pipeline-stages through real mpirun jobs: 2 and 3 stages give exactly the
// single-process lines (tiny-opt and tiny-llama, full and H2O caches, offloading on every stage),
// the report's pipeline section adds up, --resume works, bad job shapes are refused on every rank,
// a stage rank that is killed or stopped ends the job in bounded time keeping finished lines, and
// a SIGTERM on any rank (kill, Slurm) ends it in order: exit 143, the report says interrupted.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "cli/mpi_run.h"

namespace {
namespace fs = std::filesystem;
using flexh2o::test::expect_same_lines;
using flexh2o::test::model_dir;
using flexh2o::test::mpirun;
using flexh2o::test::read_json;
using flexh2o::test::read_jsonl;
using flexh2o::test::RunResult;
using flexh2o::test::TempDir;
using flexh2o::test::write_lines;
using nlohmann::json;

const std::string kOpt = model_dir("tiny-opt").string();
const std::string kLlama = model_dir("tiny-llama").string();

// 11 requests: greedy and sampled (own seeds or --seed + index), lengths that end batches at
// different steps.
fs::path write_input(const fs::path& dir, const std::string& model, int n = 11) {
  const json ref = read_json(fs::path(model) / "reference/greedy.json");
  std::vector<json> lines;
  for (int i = 0; i < n; ++i) {
    json l{{"id", i}, {"prompt", ref["prompts"][size_t(i % 3)]["prompt"]}, {"max_new_tokens", 2 + (i * 5) % 9}};
    if (i % 3 == 1) l["temperature"] = 0;
    if (i % 4 == 2) l["seed"] = 50 + i;
    lines.push_back(std::move(l));
  }
  const fs::path in = dir / "in.jsonl";
  write_lines(in, lines);
  return in;
}

std::string gen(const std::string& model, const fs::path& in, const fs::path& out, const std::string& extra) {
  return "generate -m " + model + " -q --device cpu --threads 1 -i " + in.string() + " -o " + out.string() + " " +
         extra;
}

void expect_like_one_process(const std::string& model, const std::string& flags) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), model);
  const fs::path one = tmp.path() / "one.jsonl";
  // -b 2 unless the flags set the block themselves (which -b would contradict).
  const std::string b = flags.find("--gpu-batch-size") == std::string::npos ? "-b 2 " : "";
  const RunResult r = flexh2o::test::run_flexh2o(gen(model, in, one, b + flags));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<json> want = read_jsonl(one);
  int64_t tokens = 0;
  for (const json& l : want) tokens += int64_t(l["token_ids"].size());
  for (int stages : {2, 3}) {
    const std::string what = model + " " + flags + " over " + std::to_string(stages) + " stages";
    const fs::path out = tmp.path() / ("pp" + std::to_string(stages) + ".jsonl");
    const fs::path rep = tmp.path() / ("pp" + std::to_string(stages) + ".json");
    const RunResult d = mpirun(stages, gen(model, in, out, b + flags + " --pipeline-stages " +
                                                               std::to_string(stages) + " --report " + rep.string()));
    ASSERT_EQ(d.code, 0) << what << "\n" << d.err;
    expect_same_lines(read_jsonl(out), want, what);
    const json j = read_json(rep);
    EXPECT_EQ(j["generated_tokens"], tokens) << what;
    const json& p = j["pipeline"];
    EXPECT_EQ(p["stages"], stages) << what;
    // The default: one group per stage.
    EXPECT_EQ(p["groups"], flags.find("--pipeline-groups 1") != std::string::npos ? 1 : stages) << what;
    ASSERT_EQ(p["per_stage"].size(), size_t(stages)) << what;
    const std::vector<int64_t> bounds = p["bounds"];
    EXPECT_EQ(bounds.front(), 0);
    EXPECT_EQ(bounds.back(), 4);  // the tiny models' layers
    for (int s = 0; s < stages; ++s) {
      const json& st = p["per_stage"][size_t(s)];
      EXPECT_EQ(st["stage"], s) << what;
      EXPECT_EQ(st["rank"], (s + 1) % stages) << what;  // rank 0 holds the last stage
      EXPECT_EQ(st["layers"], json({bounds[size_t(s)], bounds[size_t(s) + 1]})) << what;
      EXPECT_EQ(st["steps"], p["per_stage"][0]["steps"]) << what;  // every stage runs every step
      EXPECT_GT(st["busy_seconds"].get<double>(), 0) << what;
      EXPECT_GE(st["wall_seconds"].get<double>(), st["busy_seconds"].get<double>()) << what;
      if (s + 1 < stages) {
        EXPECT_EQ(st["bytes_out"], p["per_stage"][size_t(s) + 1]["bytes_in"]) << what;
      }
    }
    // The job's KV is every stage's; the stages hold the same sequences, so the same KV a layer
    // (the tiny models' layers are alike).
    int64_t kv = 0;
    const json& first = p["per_stage"][0];
    const int64_t per_layer = first["peak_kv_bytes"].get<int64_t>() / (bounds[1] - bounds[0]);
    EXPECT_GT(per_layer, 0) << what;
    for (const json& st : p["per_stage"]) {
      const int64_t layers = st["layers"][1].get<int64_t>() - st["layers"][0].get<int64_t>();
      EXPECT_EQ(st["peak_kv_bytes"].get<int64_t>(), per_layer * layers) << what << "\n" << p.dump();
      kv += st["peak_kv_bytes"].get<int64_t>();
    }
    EXPECT_EQ(j["peak_kv_bytes"], kv) << what;
    const double bubble = p["bubble_fraction"];
    EXPECT_GE(bubble, 0) << what;
    EXPECT_LT(bubble, 1) << what;
    EXPECT_GT(p["bytes_between_stages"].get<int64_t>(), 0) << what;
  }
}

TEST(PipelineGenerate, TinyOptFullCacheLikeOneProcess) { expect_like_one_process(kOpt, ""); }

TEST(PipelineGenerate, TinyOptH2OWithOffloadingLikeOneProcess) {
  TempDir store;
  expect_like_one_process(kOpt, "--kv-policy h2o --heavy-budget 4 --recent-budget 4 --percent 20 30 0 50 0 100 "
                                "--gpu-batch-size 1 --num-gpu-batches 2 --offload-dir " +
                                    store.path().string());
}

TEST(PipelineGenerate, TinyLlamaFullAndH2OLikeOneProcess) {
  expect_like_one_process(kLlama, "");
  expect_like_one_process(kLlama, "--kv-policy h2o --heavy-budget 4 --recent-budget 4 --pipeline-groups 1");
}

// A stage holds every group's batch at once: two groups of equal batches hold twice one's KV.
TEST(PipelineGenerate, AStagesPeakKvHoldsEveryGroupsBatch) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  std::vector<json> lines;
  for (int i = 0; i < 8; ++i) lines.push_back({{"prompt", "In the beginning"}, {"max_new_tokens", 6}});
  write_lines(in, lines);
  std::vector<int64_t> peak;
  for (int groups : {1, 2}) {
    const fs::path out = tmp.path() / "out.jsonl", rep = tmp.path() / "r.json";
    const RunResult d = mpirun(2, gen(kOpt, in, out, "-b 2 --overwrite --pipeline-stages 2 --pipeline-groups " +
                                                         std::to_string(groups) + " --report " + rep.string()));
    ASSERT_EQ(d.code, 0) << d.err;
    peak.push_back(read_json(rep)["pipeline"]["per_stage"][0]["peak_kv_bytes"].get<int64_t>());
  }
  EXPECT_GT(peak[0], 0);
  EXPECT_EQ(peak[1], 2 * peak[0]);
}

// A plan made for the whole model runs on its stages without a warning: each stage compared its
// own layers with the plan's and warned "another shape", which planning again could not silence.
TEST(PipelineGenerate, APlanFileIsComparedAsTheWholeModel) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt, 3), out = tmp.path() / "out.jsonl", plan = tmp.path() / "p.json";
  const RunResult p = flexh2o::test::run_flexh2o("plan -m " + kOpt + " --hardware t4-paper --prompt-len 64 "
                                                 "--gen-len 16 --gpu-mem 60MiB --json");
  ASSERT_EQ(p.code, 0) << p.err;
  std::ofstream(plan) << p.out;
  const RunResult d = mpirun(2, gen(kOpt, in, out, "--pipeline-stages 2 --policy " + plan.string()));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.err.find("another shape"), std::string::npos) << d.err;
  EXPECT_EQ(read_jsonl(out).size(), 3u);
}

// Ranks started with another model or other KV flags ran silently (the job's lines then mixed two
// models' tokens), and --pipeline-stages on some ranks only waited for --rank-timeout: each now
// ends the job at once, saying what differs.
TEST(PipelineGenerate, RanksThatDisagreeEndTheJobSayingHow) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt, 4), out = tmp.path() / "out.jsonl";
  const std::string h2o = " --kv-policy h2o --heavy-budget 4 --recent-budget 4";
  struct Case {
    std::string rank0, rank1, says;
  };
  for (const Case& c : {Case{gen(kOpt, in, out, "-b 2"), gen(kLlama, in, out, "-b 2"),
                             "runs another job than rank 0 (ffn_dim 1024 on rank 0, 688 here, kv_heads 4 on rank 0, 2 "
                             "here, model_type \"opt\" on rank 0, \"llama\" here)"},
                        Case{gen(kOpt, in, out, "-b 2 --pipeline-stages 2"),
                             gen(kOpt, in, out, "-b 2 --pipeline-stages 2" + h2o), "kv_policy \"full\" on rank 0, "},
                        Case{gen(kOpt, in, out, "-b 2 --pipeline-stages 2"), gen(kOpt, in, out, "-b 2"),
                             "was not given --pipeline-stages and rank 0 was"},
                        Case{gen(kOpt, in, out, "-b 2"), gen(kOpt, in, out, "-b 2 --pipeline-stages 2"),
                             "was given --pipeline-stages and rank 0 was not"},
                        Case{gen(kOpt, in, out, "-b 2 --pipeline-stages 2"),
                             gen(kOpt, in, out, "-b 2 --pipeline-stages 3"),
                             "rank 1 was given --pipeline-stages 3 and rank 0 runs 2 stages"}}) {
    const RunResult r = mpirun(1, c.rank0 + " --overwrite --rank-timeout 60 : -np 1 " + FLEXH2O_BINARY_DIR +
                                      "/flexh2o " + c.rank1 + " --overwrite --rank-timeout 60");
    EXPECT_NE(r.code, 0) << c.rank1;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.says << "\n" << r.err;
  }
  // A worker's failure is the job's error in rank 0's report (it read "interrupted").
  const fs::path rep = tmp.path() / "rep.json";
  const RunResult r = mpirun(1, gen(kOpt, in, out, "-b 2 --overwrite --report " + rep.string()) + " : -np 1 " +
                                    FLEXH2O_BINARY_DIR + "/flexh2o " + gen(kLlama, in, out, "-b 2 --overwrite"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(read_json(rep).value("error", std::string()).find("runs another job than rank 0"), std::string::npos)
      << read_json(rep).dump();
  EXPECT_NE(r.err.find("the job failed on a rank (below): "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of 4 requests finished this run; once that is fixed, --resume finishes"), std::string::npos)
      << r.err;
  // Flags that mean the same job are one job: --kv-dtype auto is f16 on this f16 checkpoint, and
  // --compress-cache is --kv-dtype q4.
  for (const auto& [a, b] : {std::pair<std::string, std::string>{"", " --kv-dtype f16"},
                             {" --compress-cache", " --kv-dtype q4"}}) {
    const RunResult same = mpirun(1, gen(kOpt, in, out, "-b 2 --overwrite" + a) + " : -np 1 " + FLEXH2O_BINARY_DIR +
                                         "/flexh2o " + gen(kOpt, in, out, "-b 2 --overwrite" + b));
    EXPECT_EQ(same.code, 0) << a << " vs" << b << "\n" << same.err;
  }
}

// An output that fails mid-job (here /dev/full) still leaves the report, with the error, in both
// modes; only a single process wrote one.
TEST(PipelineGenerate, AFailedOutputStillWritesTheReport) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt, 4), rep = tmp.path() / "rep.json";
  for (const std::string mode : {"", " --pipeline-stages 2"}) {
    const RunResult r = mpirun(2, gen(kOpt, in, "/dev/full", "-b 1 --report " + rep.string() + mode));
    EXPECT_NE(r.code, 0) << mode;
    ASSERT_TRUE(fs::exists(rep)) << mode << "\n" << r.err;
    const json j = read_json(rep);
    EXPECT_NE(j["error"].get<std::string>().find("cannot write --output /dev/full"), std::string::npos) << mode;
    EXPECT_GT(j["generated_tokens"].get<int64_t>(), 0) << mode;  // the batch that failed ran: not zeros
    fs::remove(rep);
  }
}

// Rank 0 decides the end-of-sequence rule, as it does sampling: a worker without --ignore-eos
// stopped its requests at EOS while rank 0's ran on.
TEST(PipelineGenerate, DataParallelWorkersEndSequencesAsRankZeroDoes) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl", out = tmp.path() / "out.jsonl";
  std::vector<json> lines;
  for (int i = 0; i < 4; ++i)
    lines.push_back({{"id", i}, {"prompt", "a"}, {"max_new_tokens", 5}, {"logit_bias", {{"2", 100}}}});
  write_lines(in, lines);
  const RunResult r = mpirun(1, gen(kOpt, in, out, "-b 1 --ignore-eos") + " : -np 1 " + FLEXH2O_BINARY_DIR +
                                    "/flexh2o " + gen(kOpt, in, out, "-b 1"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const json& l : read_jsonl(out)) EXPECT_EQ(l["token_ids"].size(), 5u) << l.dump();
}

TEST(PipelineGenerate, ResumeFinishesAPartialOutput) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kLlama), one = tmp.path() / "one.jsonl";
  ASSERT_EQ(flexh2o::test::run_flexh2o(gen(kLlama, in, one, "-b 2")).code, 0);
  const std::vector<json> want = read_jsonl(one);
  const fs::path out = tmp.path() / "out.jsonl";
  {
    std::ofstream f(out);
    for (size_t i : {0, 3}) f << want[i].dump() << "\n";
  }
  const RunResult d = mpirun(2, gen(kLlama, in, out, "-b 2 --resume --pipeline-stages 2"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("--resume: 2 of 11 requests already in"), std::string::npos) << d.err;
  std::vector<json> got = read_jsonl(out);
  std::sort(got.begin(), got.end(), [](const json& a, const json& b) { return a["id"] < b["id"]; });
  expect_same_lines(got, want, "resumed");
}

TEST(PipelineGenerate, BadShapesAreRefusedOnEveryRank) {
  TempDir tmp;
  const fs::path in = write_input(tmp.path(), kOpt, 2), out = tmp.path() / "out.jsonl";
  const RunResult plain = flexh2o::test::run_flexh2o(gen(kOpt, in, out, "--pipeline-stages 2"));
  EXPECT_EQ(plain.code, 1) << plain.err;
  EXPECT_NE(plain.err.find("mpirun -np 2 flexh2o generate ... --pipeline-stages 2"), std::string::npos) << plain.err;
  const RunResult ranks = mpirun(2, gen(kOpt, in, out, "--pipeline-stages 3 --overwrite"));
  EXPECT_EQ(ranks.code, 1) << ranks.err;
  const std::string misfit = "--pipeline-stages 3 needs as many ranks (mpirun -np 3), this job has 2";
  const size_t at = ranks.err.find(misfit);
  EXPECT_NE(at, std::string::npos) << ranks.err;
  // One message for the job, not one a rank.
  EXPECT_EQ(ranks.err.find(misfit, at + 1), std::string::npos) << ranks.err;
  EXPECT_EQ(ranks.err.find("error:"), ranks.err.rfind("error:")) << ranks.err;
  // Rank 0 fails before the job starts (--output holds results): the stage ranks end at once.
  write_lines(out, {json{{"id", 0}, {"token_ids", {1}}}});
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult busy = mpirun(3, gen(kOpt, in, out, "--pipeline-stages 3"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
  EXPECT_EQ(busy.code, 1) << busy.err;
  EXPECT_NE(busy.err.find("already holds results"), std::string::npos) << busy.err;
  EXPECT_NE(busy.err.find("rank 0 stopped with an error before the job started"), std::string::npos) << busy.err;
  // A stage that cannot hold its batch: its error reaches rank 0, every rank ends in order.
  const RunResult small = mpirun(2, gen(kOpt, in, out, "--pipeline-stages 2 --overwrite --gpu-mem 1MiB -n 4"));
  EXPECT_EQ(small.code, 1) << small.err;
  EXPECT_NE(small.err.find("budget"), std::string::npos) << small.err;
}

// 40 long requests over 3 stages; rank `rank` gets `sig` once the first line is written.
flexh2o::test::Signalled fault(const fs::path& dir, int rank, int sig, const std::string& extra) {
  std::vector<json> lines;
  for (int i = 0; i < 40; ++i) lines.push_back({{"id", i}, {"prompt", "Hello number " + std::to_string(i)}});
  write_lines(dir / "big.jsonl", lines);
  return flexh2o::test::run_and_signal(
      3, gen(kOpt, dir / "big.jsonl", dir / "out.jsonl", "-b 1 --greedy --ignore-eos -n 64 --pipeline-stages 3 " + extra),
      dir / "out.jsonl", dir / "err", rank, sig);
}

void expect_finished_lines_kept(const fs::path& dir) {
  const fs::path ref = dir / "ref.jsonl";
  ASSERT_EQ(flexh2o::test::run_flexh2o(gen(kOpt, dir / "big.jsonl", ref, "-b 1 --greedy --ignore-eos -n 64")).code, 0);
  const std::vector<json> want = read_jsonl(ref), got = read_jsonl(dir / "out.jsonl");
  EXPECT_GE(got.size(), 1u);
  EXPECT_LT(got.size(), want.size());
  for (const json& l : got) EXPECT_EQ(l["token_ids"], want[l["id"].get<size_t>()]["token_ids"]) << l.dump();
}

TEST(PipelineGenerate, AKilledStageEndsTheJobKeepingFinishedLines) {
  TempDir tmp;
  const auto f = fault(tmp.path(), 1, SIGKILL, "");
  EXPECT_NE(f.code, 0) << f.err;
  EXPECT_LT(f.seconds_after_signal, 20) << f.err;
  // mpirun SIGTERMs the other ranks and kills them 1 s later: rank 0 says at once that it stops
  // (and, if the second comes in time, that no step came back and it ends every rank).
  EXPECT_NE(f.err.find("the pipeline stops at the next token step; finished results are in --output (rerun with "
                       "--resume"),
            std::string::npos)
      << f.err;
  expect_finished_lines_kept(tmp.path());
}

TEST(PipelineGenerate, AStoppedStageEndsTheJobWithinTheTimeout) {
  TempDir tmp;
  const auto f = fault(tmp.path(), 2, SIGSTOP, "--rank-timeout 2");
  EXPECT_NE(f.code, 0) << f.err;
  EXPECT_LT(f.seconds_after_signal, 15) << f.err;
  EXPECT_NE(f.err.find("rank 2 of 3 ("), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("ending every rank of the job"), std::string::npos) << f.err;
  expect_finished_lines_kept(tmp.path());
}

// SIGTERM on one rank, as `kill` or a batch system sends it: every rank ends in order at a token
// step with 143, the report is written and says interrupted, the finished lines are the
// single-process ones, and --resume finishes the rest. (Ctrl-C on mpirun itself makes mpirun
// exit 1 and kill the ranks 1 s after its SIGTERM, whatever they do.)
TEST(PipelineGenerate, ASigtermOnAnyRankEndsTheJobInOrder) {
  for (int rank : {1, 0}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    TempDir tmp;
    const fs::path rep = tmp.path() / "rep.json";
    const auto f = fault(tmp.path(), rank, SIGTERM, "--report " + rep.string());
    EXPECT_EQ(f.code, 143) << f.err;
    EXPECT_LT(f.seconds_after_signal, 20) << f.err;
    EXPECT_EQ(f.err.find("ending every rank of the job"), std::string::npos) << f.err;
    EXPECT_NE(f.err.find("interrupted: "), std::string::npos) << f.err;
    EXPECT_NE(f.err.find("the job was stopped by signal 15"), std::string::npos) << f.err;
    const json report = read_json(rep);
    EXPECT_EQ(report["interrupted"], true) << report.dump();
    EXPECT_EQ(report["pipeline"]["per_stage"].size(), 3u) << report.dump();
    expect_finished_lines_kept(tmp.path());
    const RunResult resumed = mpirun(3, gen(kOpt, tmp.path() / "big.jsonl", tmp.path() / "out.jsonl",
                                            "-b 1 --greedy --ignore-eos -n 64 --pipeline-stages 3 --resume"));
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    std::vector<json> got = read_jsonl(tmp.path() / "out.jsonl");
    std::sort(got.begin(), got.end(), [](const json& a, const json& b) { return a["id"] < b["id"]; });
    expect_same_lines(got, read_jsonl(tmp.path() / "ref.jsonl"), "resumed after SIGTERM");
  }
}

}  // namespace
