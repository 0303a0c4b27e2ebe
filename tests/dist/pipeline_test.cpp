// Pipeline parallelism in one process: every rank a thread over LocalChannels, each stage its
// own OffloadEngine on a Model::stage() view. Tokens and every step's logits must equal the
// single-process run bit for bit (same batches, same kernels; hidden rows travel as bytes),
// over 2 and 3 stages, 1-3 groups in flight, full cache and H2O, offloading on some stage.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <ostream>
#include <map>
#include <memory>
#include <thread>

#include "dist/pipeline.h"
#include "engine/bible_requests.h"
#include "engine/cpu_device.h"
#include "engine/forward.h"
#include "engine/forwarding_runner.h"
#include "engine/policy_of.h"
#include "engine/runner.h"
#include "planner/pipeline.h"
#include "stage_threads.h"

namespace flexh2o::test {
namespace {

using dist::Channel;
using dist::LocalChannels;

// Logits of every step, per batch (in the order batches began).
struct Steps {
  std::vector<std::vector<std::vector<float>>> by_batch;
};

class RecordingRunner final : public ForwardingRunner {
 public:
  RecordingRunner(StepRunner& r, Steps& s) : ForwardingRunner(r), s_(s) {}
  void begin_batch(int64_t B, int64_t cap) override {
    s_.by_batch.emplace_back();
    ForwardingRunner::begin_batch(B, cap);
  }
  void step(const int32_t* ids, const int32_t* pos, int64_t T, const int32_t* rr, std::vector<float>& lg) override {
    ForwardingRunner::step(ids, pos, T, rr, lg);
    s_.by_batch.back().push_back(lg);
  }
  bool can_step_rows() const override { return false; }  // every step recorded through step()
  bool can_rewind() const override { return false; }

 private:
  Steps& s_;
};

class RecordingGroups final : public GroupRunner {
 public:
  RecordingGroups(GroupRunner& r, Steps& s) : r_(r), s_(s), batch_of_(size_t(r.groups()), -1) {}
  const ModelConfig& config() const override { return r_.config(); }
  int64_t max_batch() const override { return r_.max_batch(); }
  int groups() const override { return r_.groups(); }
  void begin_batch(int g, int64_t B, int64_t cap) override {
    batch_of_[size_t(g)] = int(s_.by_batch.size());
    s_.by_batch.emplace_back();
    r_.begin_batch(g, B, cap);
  }
  void submit(int g, const int32_t* ids, const int32_t* pos, int64_t T, const int32_t* rr) override {
    r_.submit(g, ids, pos, T, rr);
  }
  int collect(std::vector<float>& lg) override {
    const int g = r_.collect(lg);
    s_.by_batch[size_t(batch_of_[size_t(g)])].push_back(lg);
    return g;
  }

 private:
  GroupRunner& r_;
  Steps& s_;
  std::vector<int> batch_of_;
};

struct Case {
  std::string model;
  int stages = 2, groups = 1;
  bool h2o = false;
  int offload_stage = -1;  // this stage offloads weights and KV to host and disk
  int64_t gbs = 2, ngb = 1;
  int requests = 4;
  std::string name() const {
    return model.substr(5) + "_S" + std::to_string(stages) + "_G" + std::to_string(groups) + (h2o ? "_h2o" : "_full") +
           (offload_stage >= 0 ? "_off" + std::to_string(offload_stage) : "") + "_b" + std::to_string(gbs) + "x" +
           std::to_string(ngb) + "_r" + std::to_string(requests);
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<GenerationRequest> requests_for(const Case& c) {
  std::vector<GenerationRequest> base = bible_requests(c.model, 6), out;
  for (int i = 0; i < c.requests; ++i) {
    GenerationRequest r = base[size_t(i) % base.size()];
    r.max_new_tokens = 3 + i % 4;  // batches end at different steps
    out.push_back(r);
  }
  return out;
}

std::unique_ptr<KvPolicy> kv_for(const Case& c) { return c.h2o ? h2o_policy(3, 3) : nullptr; }

struct StageRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<CpuDevice> dev;
  std::unique_ptr<KvPolicy> kv;
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<OffloadEngine> engine;
};

StageRun make_stage(const Model& whole, const Case& c, const std::vector<int64_t>& bounds, int s,
                    uint64_t device_mem = 0) {
  StageRun r;
  r.model = std::make_unique<Model>(whole.stage(bounds[size_t(s)], bounds[size_t(s) + 1]));
  r.dev = std::make_unique<CpuDevice>(1);
  r.kv = kv_for(c);
  OffloadOptions o;
  o.policy = policy_of(s == c.offload_stage ? "20 50 0 50 100 0" : "100 0 100 0 100 0", c.gbs, c.ngb);
  o.kv_policy = r.kv.get();
  o.device_mem = device_mem;
  if (s == c.offload_stage) {
    r.dir = std::make_unique<TempDir>();
    o.offload_dir = r.dir->path();
  }
  r.engine = std::make_unique<OffloadEngine>(*r.model, *r.dev, o);
  r.engine->set_groups(c.groups);
  return r;
}

class PipelineCase : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineCase, TokensAndLogitsEqualOneProcess) {
  const Case c = GetParam();
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto reqs = requests_for(c);
  GenerateOptions go;
  go.ignore_eos = true;

  CpuDevice ref_dev(1);
  Forward fwd(whole, ref_dev);
  auto ref_kv = kv_for(c);
  InMemoryRunner ref(fwd, c.gbs * c.ngb, ref_kv.get());
  Steps ref_steps;
  RecordingRunner ref_rec(ref, ref_steps);
  const auto want = generate(ref_rec, reqs, go);

  const std::vector<int64_t> bounds = even_bounds(whole.config().n_layers, c.stages);
  LocalChannels net(c.stages);
  std::vector<StageRun> stages;
  for (int s = 0; s < c.stages; ++s) stages.push_back(make_stage(whole, c, bounds, s));
  dist::PipelineOptions po;
  po.timeout_s = 60;
  StageThreads servers(net, c.stages, bounds, po, [&](int s) -> OffloadEngine& { return *stages[size_t(s)].engine; });
  Steps got_steps;
  std::vector<GenerationResult> got;
  dist::PipelineReport rep;
  {
    dist::PipelineDriver driver(net.channel(0), *stages.back().engine, c.stages, bounds[size_t(c.stages) - 1], po);
    RecordingGroups rec(driver, got_steps);
    got = generate(rec, reqs, go);
    rep = driver.finish(false);
  }
  const std::vector<dist::ServeResult>& served = servers.join();

  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_TRUE(got[i].finished);
  }
  ASSERT_EQ(got_steps.by_batch.size(), ref_steps.by_batch.size());
  for (size_t b = 0; b < ref_steps.by_batch.size(); ++b) {
    ASSERT_EQ(got_steps.by_batch[b].size(), ref_steps.by_batch[b].size()) << "batch " << b;
    for (size_t j = 0; j < ref_steps.by_batch[b].size(); ++j) {
      const auto& x = got_steps.by_batch[b][j];
      const auto& y = ref_steps.by_batch[b][j];
      ASSERT_EQ(x.size(), y.size());
      for (size_t e = 0; e < x.size(); ++e) {
        ASSERT_FALSE(std::isnan(x[e])) << "batch " << b << " step " << j << " element " << e;
        ASSERT_EQ(std::memcmp(&x[e], &y[e], 4), 0)
            << "batch " << b << " step " << j << " element " << e << ": " << x[e] << " vs " << y[e];
      }
    }
  }
  // Every stage ran every step, and the stages reported where they sit.
  ASSERT_EQ(int(rep.stages.size()), c.stages);
  int64_t steps = 0;
  for (const auto& b : ref_steps.by_batch) steps += int64_t(b.size());
  for (int s = 0; s < c.stages; ++s) {
    EXPECT_EQ(rep.stages[size_t(s)].stage, s);
    EXPECT_EQ(rep.stages[size_t(s)].rank, dist::stage_rank(s, c.stages));
    EXPECT_EQ(rep.stages[size_t(s)].first_layer, bounds[size_t(s)]);
    EXPECT_EQ(rep.stages[size_t(s)].end_layer, bounds[size_t(s) + 1]);
    EXPECT_EQ(rep.stages[size_t(s)].steps, steps) << "stage " << s;
    EXPECT_GT(rep.stages[size_t(s)].busy_s, 0);
    EXPECT_GE(rep.stages[size_t(s)].wall_s, rep.stages[size_t(s)].busy_s);
  }
  for (int rank = 1; rank < c.stages; ++rank) {
    EXPECT_FALSE(served[size_t(rank)].job_failed);
    EXPECT_TRUE(served[size_t(rank)].error.empty()) << served[size_t(rank)].error;
  }
  EXPECT_GT(rep.bytes_between_stages(), 0u);
  EXPECT_GE(rep.bubble(), 0.0);
  EXPECT_LT(rep.bubble(), 1.0);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* m : {"tiny-opt", "tiny-llama"}) {
    const std::string model = m;
    v.push_back({model, 2, 1, false, -1, 2, 1, 4});
    v.push_back({model, 2, 2, true, -1, 2, 1, 5});
    v.push_back({model, 3, 3, false, 1, 1, 2, 7});
    v.push_back({model, 3, 2, true, 2, 2, 2, 6});
    v.push_back({model, 2, 3, true, 0, 1, 1, 4});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineCase, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// A job expected to fail: the driver's error (its collect throws) and each rank's serve result;
// the driver must end in order (not broken), ending every stage.
struct FailedJob {
  std::string error;
  std::vector<dist::ServeResult> served;
};

FailedJob run_failing_job(const Case& c, const std::vector<int64_t>& bounds, std::vector<StageRun>& stages) {
  LocalChannels net(c.stages);
  dist::PipelineOptions po;
  po.timeout_s = 30;
  StageThreads servers(net, c.stages, bounds, po, [&](int s) -> OffloadEngine& { return *stages[size_t(s)].engine; });
  FailedJob job;
  {
    dist::PipelineDriver driver(net.channel(0), *stages.back().engine, c.stages, bounds[size_t(c.stages) - 1], po);
    try {
      (void)generate(driver, requests_for(c), GenerateOptions{});
    } catch (const Error& e) {
      job.error = e.what();
    }
    EXPECT_FALSE(driver.broken());
  }  // the destructor ends the stages
  job.served = servers.join();
  return job;
}

// A stage whose memory budget cannot hold its batch fails at the prefill: the driver's collect
// throws naming that stage and its message, and every stage still ends in order.
TEST(PipelineFailure, StageErrorReachesTheDriverAndEveryStageEnds) {
  const Case c{"tiny-opt", 3, 2, false, -1, 2, 1, 4};
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  std::vector<StageRun> stages;
  for (int s = 0; s < c.stages; ++s) {
    // Stage 1's budget holds its weights (placed at construction) but not a batch.
    uint64_t mem = 0;
    if (s == 1) {
      StageRun probe = make_stage(whole, c, bounds, s);
      mem = offload_memory_plan(*probe.model, *probe.dev, probe.engine->options(), BatchDims{1, 1, 0, false, false, 1,
                                                                                             true, true})
                .bytes[0];
    }
    stages.push_back(make_stage(whole, c, bounds, s, mem));
  }
  const FailedJob job = run_failing_job(c, bounds, stages);
  const std::string& error = job.error;
  const std::vector<dist::ServeResult>& served = job.served;
  EXPECT_NE(error.find("pipeline stage 1 (rank 2 of 3"), std::string::npos) << error;
  EXPECT_NE(error.find("budget"), std::string::npos) << error;
  const int failing = dist::stage_rank(1, c.stages);
  EXPECT_FALSE(served[size_t(failing)].error.empty());
  for (int rank = 1; rank < c.stages; ++rank) EXPECT_TRUE(served[size_t(rank)].job_failed) << "rank " << rank;
}

// A stage given a smaller block than rank 0's (another -b) refuses rank 0's first batch by the
// flags that differ, not by the engine's internal bound; the job still ends in order.
TEST(PipelineFailure, AStageWithASmallerBlockNamesTheFlags) {
  const Case c{"tiny-opt", 2, 1, false, -1, 2, 1, 4};
  Case small = c;
  small.gbs = 1;
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  std::vector<StageRun> stages;
  for (int s = 0; s < c.stages; ++s) stages.push_back(make_stage(whole, s == 0 ? small : c, bounds, s));
  const FailedJob job = run_failing_job(c, bounds, stages);
  const std::string& mine = job.served[size_t(dist::stage_rank(0, c.stages))].error;
  EXPECT_NE(mine.find("batches of 2 sequences and this stage's block holds 1"), std::string::npos) << mine;
  EXPECT_NE(mine.find("--gpu-batch-size"), std::string::npos) << mine;
  EXPECT_NE(job.error.find("block holds 1"), std::string::npos) << job.error;
}

// A stage that never answers (a hung rank) ends the driver's wait within the timeout, naming
// the rank it waited for; the driver is then broken (no orderly end is possible).
TEST(PipelineFailure, SilentStageTimesOut) {
  const Case c{"tiny-llama", 2, 1, false, -1, 2, 1, 2};
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  StageRun last = make_stage(whole, c, bounds, 1);
  LocalChannels net(c.stages);  // rank 1 never runs
  dist::PipelineOptions po;
  po.timeout_s = 0.5;
  dist::PipelineDriver driver(net.channel(0), *last.engine, c.stages, bounds[1], po);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)generate(driver, requests_for(c), GenerateOptions{});
    ADD_FAILURE() << "generate returned without its first stage";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no message from rank 1 of 2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(driver.broken());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
}

// A stop (Ctrl-C, SIGTERM) on one rank ends the job in order: generation stops within a step or
// two of the flag, the finished results equal the one-process run's, and every stage ends knowing
// the signal. `stopped_rank` is the rank whose flag is set once the first result is in (0: the
// driver's own).
void expect_stop_ends_in_order(int stopped_rank, int signal) {
  const Case c{"tiny-opt", 3, 2, false, -1, 1, 1, 10};
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto reqs = requests_for(c);
  GenerateOptions go;
  go.ignore_eos = true;
  CpuDevice ref_dev(1);
  Forward fwd(whole, ref_dev);
  InMemoryRunner ref(fwd, c.gbs * c.ngb);
  const auto want = generate(ref, reqs, go);

  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  std::vector<StageRun> stages;
  for (int s = 0; s < c.stages; ++s) stages.push_back(make_stage(whole, c, bounds, s));
  LocalChannels net(c.stages);
  std::atomic<bool> stop{false};
  std::atomic<int> sig{0};
  std::vector<dist::PipelineOptions> po(size_t(c.stages));
  for (int r = 0; r < c.stages; ++r) {
    po[size_t(r)].timeout_s = 30;
    po[size_t(r)].stop = r == stopped_rank ? &stop : nullptr;
    po[size_t(r)].signal = r == stopped_rank ? &sig : nullptr;
  }
  StageThreads servers(net, c.stages, bounds, po, [&](int s) -> OffloadEngine& { return *stages[size_t(s)].engine; });
  std::vector<GenerationResult> got;
  GenerateStats st;
  {
    dist::PipelineDriver driver(net.channel(0), *stages.back().engine, c.stages, bounds[size_t(c.stages) - 1], po[0]);
    go.stop = &driver.stop();
    go.on_result = [&](size_t, const GenerationResult&) {
      sig = signal;  // as StopSignals does: the signal first, then the flag
      stop = true;
    };
    got = generate(driver, reqs, go, &st);
    EXPECT_TRUE(st.interrupted);
    EXPECT_EQ(driver.stop_signal(), signal);
    EXPECT_FALSE(driver.broken());
    const dist::PipelineReport rep = driver.finish(false, driver.stop_signal());
    EXPECT_EQ(int(rep.stages.size()), c.stages);
  }
  const std::vector<dist::ServeResult>& served = servers.join();
  for (int rank = 1; rank < c.stages; ++rank) {
    EXPECT_EQ(served[size_t(rank)].stop_signal, signal) << "rank " << rank;
    EXPECT_FALSE(served[size_t(rank)].job_failed) << "rank " << rank;
    EXPECT_TRUE(served[size_t(rank)].error.empty()) << served[size_t(rank)].error;
  }
  size_t finished = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!got[i].finished) continue;
    ++finished;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_GE(finished, 1u);
  EXPECT_LE(finished, 5u) << "the stop took effect late";
}

TEST(PipelineStop, AStopOnAStageEndsTheJobInOrder) { expect_stop_ends_in_order(2, 15); }
TEST(PipelineStop, AStopOnTheDriverEndsTheJobInOrder) { expect_stop_ends_in_order(0, 2); }

// A stage's stop flag does not end its wait: it asks the driver to stop (the message is sent at
// once) and keeps waiting, up to the timeout, for the driver to end the job.
TEST(PipelineStop, AStoppedStageKeepsWaitingForTheDriver) {
  const Case c{"tiny-opt", 2, 1, false, -1, 2, 1, 2};
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  StageRun first = make_stage(whole, c, bounds, 0);
  LocalChannels net(c.stages);
  std::atomic<bool> stop{true};
  std::atomic<int> sig{15};
  dist::PipelineOptions po;
  po.timeout_s = 0.4;
  po.stop = &stop;
  po.signal = &sig;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)dist::serve_stage(net.channel(1), *first.engine, c.stages, 0, po);
    ADD_FAILURE() << "serve_stage returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0 (rank 1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no message from rank 0 of 2 (this process) in 0.4 s"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.35);
  dist::Message m;
  EXPECT_TRUE(net.channel(0).recv(1, dist::kAnyTag, 0, &m).ok()) << "no stop request reached the driver";
}

// A stop while a step is out, when no step comes back (a rank died: mpirun SIGTERMs the rest),
// ends the driver's wait within the grace (0.5 s before any decode step), not the 30 s timeout,
// and says so once at the stop.
TEST(PipelineStop, AfterAStopAStepThatNeverComesEndsTheWaitSoon) {
  const Case c{"tiny-llama", 2, 1, false, -1, 2, 1, 2};
  const Model whole = Model::load_dir(model_dir(c.model));
  const auto bounds = even_bounds(whole.config().n_layers, c.stages);
  StageRun last = make_stage(whole, c, bounds, 1);
  LocalChannels net(c.stages);  // rank 1 never runs
  std::atomic<bool> stop{false};
  std::atomic<int> sig{0};
  std::vector<int> told;
  dist::PipelineOptions po;
  po.timeout_s = 30;
  po.stop = &stop;
  po.signal = &sig;
  po.on_stop = [&](int s) { told.push_back(s); };
  dist::PipelineDriver driver(net.channel(0), *last.engine, c.stages, bounds[1], po);
  std::thread signaller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    sig = 15;
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)generate(driver, requests_for(c), GenerateOptions{});
    ADD_FAILURE() << "generate returned without its first stage";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no step came back within 0.5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("of the stop (signal 15)"), std::string::npos) << e.what();
  }
  signaller.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.65);
  EXPECT_LT(waited, 5);
  EXPECT_TRUE(driver.broken());
  EXPECT_EQ(told, std::vector<int>{15});
}

TEST(PipelineRanks, TheLastStageIsRankZero) {
  for (int S = 1; S <= 5; ++S)
    for (int r = 0; r < S; ++r) EXPECT_EQ(dist::rank_stage(dist::stage_rank(r, S), S), r);
  EXPECT_EQ(dist::stage_rank(2, 3), 0);  // the last stage is rank 0 (the driver)
}

TEST(StageModel, SliceKeepsTheRightTensors) {
  const Model whole = Model::load_dir(model_dir("tiny-opt"));
  const int64_t L = whole.config().n_layers;
  EXPECT_THROW(whole.stage(1, 1), Error);
  EXPECT_THROW(whole.stage(0, L + 1), Error);
  const Model mid = whole.stage(1, L);
  EXPECT_EQ(mid.config().n_layers, L - 1);
  EXPECT_FALSE(mid.stage_range().embed());
  EXPECT_TRUE(mid.stage_range().head());
  for (const BoundTensor& t : mid.tensors()) {
    EXPECT_EQ(t.spec.name.find("embed_"), std::string::npos) << t.spec.name;
    if (t.spec.layer < 0) continue;
    const std::string layer = "layers." + std::to_string(t.spec.layer + 1) + ".";  // renumbered from 1
    EXPECT_NE(t.spec.name.find(layer), std::string::npos) << t.spec.name;
  }
  EXPECT_EQ(mid.weights().layers[0].q_w.data, whole.weights().layers[1].q_w.data);
  const Model first = whole.stage(0, 1);
  EXPECT_TRUE(first.weights().final_norm_w.empty());
  EXPECT_FALSE(first.weights().embed.empty());
  const Model inner = mid.stage(0, 1);  // a stage of a stage keeps global layer numbers
  EXPECT_EQ(inner.stage_range().first, 1);
  EXPECT_EQ(inner.stage_range().end, 2);
  EXPECT_NE(inner.signature(), whole.signature());
}

}  // namespace
}  // namespace flexh2o::test
