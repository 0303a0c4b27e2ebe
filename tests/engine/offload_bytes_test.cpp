// What the offloading engine moves and holds: bytes per link computed here from the model and
// the request shapes (not from the engine's plan), f16 KV moving half the bytes of f32, disk
// links, the schedule trace, and peaks within budgets with clear errors for small ones.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/cpu_device.h"
#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "test_util.h"
#include "policy_of.h"

namespace flexh2o {
namespace {
using test::model_dir;

Policy policy(const char* percent, int gbs, int ngb, bool cpu_attn = false) {
  return test::policy_of(percent, gbs, ngb, cpu_attn);
}

std::vector<GenerationRequest> padded(std::initializer_list<int64_t> lens, int64_t gen) {
  std::vector<GenerationRequest> reqs;
  for (int64_t n : lens) {
    GenerationRequest r;
    r.prompt_ids.assign(size_t(n), 262);
    r.prompt_ids[0] = 2;
    r.max_new_tokens = gen;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  return reqs;
}

void run(StepRunner& r, const std::vector<GenerationRequest>& reqs) {
  GenerateOptions go;
  go.ignore_eos = true;
  generate(r, reqs, go);
}

// Weights on the host, KV on the host, hidden states on the device.
TEST(OffloadBytes, MatchWhatThePolicyImplies) {
  for (bool cpu_attn : {false, true}) {
    Model model = Model::load_dir(model_dir("tiny-opt"));
    const ModelConfig& c = model.config();
    CpuDevice dev(2);
    OffloadOptions o;
    o.policy = policy("0 100 0 100 100 0", 2, 2, cpu_attn);
    OffloadEngine eng(model, dev, o);
    const int64_t lens[] = {5, 9, 2, 7}, gen = 5;
    run(eng, padded({5, 9, 2, 7}, gen));
    const uint64_t steps = gen;  // prefill + (gen - 1) decode steps
    // Every weight once per step, the tied head's table again, except that the embedding unit
    // moves only the step's token rows: 4 x 9 at the prefill, 4 per decode step.
    const uint64_t table = model.weights().embed.nbytes(), table_row = table / uint64_t(c.vocab_size);
    const uint64_t all_weights = model.weight_bytes();  // - table (gathered) + table (tied head)
    const uint64_t row = uint64_t(2 * c.n_kv_heads * c.head_dim) * 2, L = uint64_t(c.n_layers);  // f16 KV
    uint64_t h2d = steps * all_weights + (4 * 9 + (steps - 1) * 4) * table_row, d2h = 0;
    for (int64_t n : lens) {
      d2h += L * uint64_t(n) * row;  // prefill stores every prompt row
      for (int64_t j = 0; j < gen - 1; ++j) {
        if (cpu_attn) {
          d2h += L * uint64_t(c.q_dim() + 2 * c.kv_dim()) * sizeof(float);  // fp32 activations
          h2d += L * uint64_t(c.q_dim()) * sizeof(float);
        } else {
          h2d += L * uint64_t(n + j) * row;  // load the cache
          d2h += L * row;                    // store the new row
        }
      }
    }
    const OffloadReport r = eng.report();
    EXPECT_EQ(r.bytes[size_t(Link::kHostToDevice)], h2d) << "cpu_attn " << cpu_attn;
    EXPECT_EQ(r.bytes[size_t(Link::kDeviceToHost)], d2h) << "cpu_attn " << cpu_attn;
    EXPECT_EQ(r.bytes[size_t(Link::kDiskToHost)], 0u);
    EXPECT_EQ(r.bytes[size_t(Link::kHostToDisk)], 0u);
  }
}

// The KV dtype is the dtype of every tier: f16 moves exactly half of f32's KV bytes.
TEST(OffloadBytes, F16KvMovesHalfTheBytesOfF32) {
  Model model = Model::load_dir(model_dir("tiny-llama"));
  const auto reqs = padded({6, 3, 8}, 5);
  std::map<DType, uint64_t> kv;
  for (DType dt : {DType::F16, DType::F32, DType::BF16}) {
    test::TempDir dir;
    CpuDevice dev(2);
    OffloadOptions o;
    o.policy = policy("100 0 0 50 100 0", 3, 1);  // half of each micro-batch on the host, half on disk
    o.offload_dir = dir.path();
    o.kv_dtype = dt;
    OffloadEngine eng(model, dev, o);
    run(eng, reqs);
    kv[dt] = eng.report().kv_bytes;
    EXPECT_GT(kv[dt], 0u);
  }
  EXPECT_EQ(2 * kv[DType::F16], kv[DType::F32]);
  EXPECT_EQ(kv[DType::BF16], kv[DType::F16]);
}

TEST(OffloadBytes, DiskLinksCarryDiskHomedData) {
  Model model = Model::load_dir(model_dir("tiny-llama"));
  const ModelConfig& c = model.config();
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = policy("0 0 0 0 100 0", 3, 1);
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  const int64_t lens[] = {4, 6, 3}, gen = 4;
  run(eng, padded({4, 6, 3}, gen));
  const uint64_t row = uint64_t(2 * c.n_kv_heads * c.head_dim) * 2, L = uint64_t(c.n_layers);
  // Every weight from disk once per step, but only the step's rows of the token table (3 x 6
  // at the prefill, 3 per decode step).
  const uint64_t table = model.weights().embed.nbytes(), table_row = table / uint64_t(c.vocab_size);
  uint64_t d2h_disk = uint64_t(gen) * (model.weight_bytes() - table) + (3 * 6 + uint64_t(gen - 1) * 3) * table_row;
  uint64_t h2disk = 0;
  for (int64_t n : lens) {
    h2disk += L * uint64_t(n) * row;
    for (int64_t j = 0; j < gen - 1; ++j) {
      d2h_disk += L * uint64_t(n + j) * row;
      h2disk += L * row;
    }
  }
  const OffloadReport r = eng.report();
  EXPECT_EQ(r.bytes[size_t(Link::kDiskToHost)], d2h_disk);
  EXPECT_EQ(r.bytes[size_t(Link::kHostToDisk)], h2disk);
  EXPECT_EQ(r.weights_written, model.tensors().size());
  // A second engine on the same directory reuses every weight file.
  OffloadEngine again(model, dev, o);
  EXPECT_EQ(again.report().weights_reused, model.tensors().size());
  EXPECT_EQ(again.report().weights_written, 0u);
}

// The trace names every schedule step of every token step once, on its queue, and a queue's
// slices never overlap (one worker per queue).
TEST(OffloadTrace, EveryStepOnceOnItsQueue) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o;
  o.policy = policy("30 70 0 100 0 100", 2, 2, true);
  o.trace = true;
  OffloadEngine eng(model, dev, o);
  run(eng, padded({4, 4, 4}, 3));
  std::ostringstream os;
  eng.write_trace(os);
  const nlohmann::json j = nlohmann::json::parse(os.str());
  const size_t per_step = eng.last_schedule().steps.size();
  size_t slices = 0, prefill = 0;
  std::map<int, std::vector<std::pair<double, double>>> by_queue;
  std::set<std::string> names;
  for (const auto& ev : j["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    ++slices;
    const std::string name = ev["name"];
    if (name.find(" prefill") != std::string::npos) ++prefill;
    names.insert(name);
    by_queue[ev["tid"].get<int>()].push_back({ev["ts"].get<double>(), ev["ts"].get<double>() + ev["dur"].get<double>()});
  }
  // Two decode steps of the same shape; the first also loads the next step's first layer
  // unit (one LW: weights are on the host), the last (the run's last step) does not.
  EXPECT_EQ(slices - prefill, 2 * per_step + 1);
  EXPECT_GT(prefill, 0u);
  EXPECT_TRUE(names.count("C(0,0) prefill") && names.count("LW(5)") && names.count("LW(1 next) prefill") &&
              names.count("LW(1 next)") && names.count("HA(1,1)") && names.count("CR(3,0)"));
  EXPECT_EQ(eng.last_schedule().find(StepKind::kLoadWeight, 1, 0), -1);  // it was loaded by the step before
  const OffloadReport r = eng.report();
  EXPECT_GE(r.step_overlap_efficiency, r.overlap_efficiency - 1e-9);
  EXPECT_LE(r.step_overlap_efficiency, 1.0 + 1e-6);
  EXPECT_GT(r.busy[size_t(Queue::kHost)], 0.0);  // the host attention ran on its own queue
  for (auto& [q, v] : by_queue) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LE(v[i - 1].second, v[i].first + 0.2) << "queue " << q;
  }
}

// A reused engine's report of one call (what Python's last_report shows): the interval from a
// report taken before the call moves what a fresh engine moves for that call alone.
TEST(OffloadBytes, AnIntervalReportCountsWhatTheCallAloneMoves) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o;
  o.policy = policy("0 100 50 50 100 0", 2, 2);
  const auto second = padded({4, 8, 3}, 3);
  OffloadEngine alone(model, dev, o);
  const OffloadReport placed = alone.report();
  run(alone, second);
  const OffloadReport want = report_interval(alone.report(), placed);

  OffloadEngine reused(model, dev, o);
  run(reused, padded({6, 2, 5, 9}, 5));
  const OffloadReport base = reused.report();
  run(reused, second);
  const OffloadReport got = report_interval(reused.report(), base);
  for (int l = 0; l < kNumLinks; ++l) EXPECT_EQ(got.bytes[size_t(l)], want.bytes[size_t(l)]) << link_name(Link(l));
  EXPECT_GT(got.bytes[size_t(Link::kHostToDevice)], 0u);
  EXPECT_EQ(got.kv_bytes, want.kv_bytes);
  EXPECT_EQ(got.token_steps, want.token_steps);
  EXPECT_LT(got.token_steps, reused.report().token_steps);
  EXPECT_GT(got.wall, 0.0);
  EXPECT_LT(got.wall, reused.report().wall);
  EXPECT_GT(got.overlap_efficiency, 0.0);
  EXPECT_GE(got.step_overlap_efficiency, got.overlap_efficiency - 1e-9);
  EXPECT_LE(got.step_overlap_efficiency, 1.0 + 1e-6);
}

TEST(OffloadBudgets, PeaksStayWithinBudgetsAndSmallBudgetsAreExplained) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o;
  o.policy = policy("20 80 50 50 100 0", 2, 2);
  o.device_mem = 12 << 20;
  o.host_mem = 16 << 20;
  OffloadEngine eng(model, dev, o);
  run(eng, padded({5, 9, 2, 7, 3}, 6));
  const OffloadReport r = eng.report();
  EXPECT_LE(r.peak[0], o.device_mem);
  EXPECT_LE(r.peak[1], o.host_mem);
  EXPECT_GT(r.peak[0], 0u);
  // What the run held stays within the plan the planner uses for the same batch.
  BatchDims d;
  d.rows = 9, d.capacity = 9 + 6;
  const MemoryPlan plan = offload_memory_plan(model, dev, o, d);
  EXPECT_LE(r.peak[0], plan.bytes[0]);
  EXPECT_LE(r.peak[1], plan.bytes[1]);

  o.device_mem = 1 << 20;  // not even the weight double buffer fits
  try {
    OffloadEngine tiny(model, dev, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("device budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs at least"), std::string::npos) << msg;
    EXPECT_NE(msg.find("for a block of one-token prompts"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weight double buffer"), std::string::npos) << msg;
  }
  o.policy.w_gpu_percent = 120;
  EXPECT_THROW(OffloadEngine(model, dev, o), Error);
  o.policy = policy("0 0 100 0 100 0", 2, 2);
  o.device_mem = 0;
  try {
    OffloadEngine no_dir(model, dev, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flexh2o
