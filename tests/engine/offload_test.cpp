// The offloading engine on the CPU device: token-exact equality with the in-memory run over a
// grid of policies (weights / KV / activations on device, host, disk and split; micro-batches;
// overlap; CPU attention), bytes per link equal to what the policy implies, peaks within
// budgets, and clear errors for budgets that are too small.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/generate.h"
#include "engine/offload_engine.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace flexh2o {
namespace {
using test::model_dir;

struct Case {
  const char* model;
  const char* percent;  // "w_g w_c c_g c_c a_g a_c"
  int gbs, ngb;
  bool overlap, cpu_attention;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.model << " [" << c.percent << "] " << c.gbs << "x" << c.ngb << (c.overlap ? " overlap" : "")
            << (c.cpu_attention ? " cpu-attn" : "");
}

Policy make_policy(const Case& c) {
  Policy p;
  std::istringstream is(c.percent);
  is >> p.w_gpu_percent >> p.w_cpu_percent >> p.cache_gpu_percent >> p.cache_cpu_percent >> p.act_gpu_percent >>
      p.act_cpu_percent;
  p.gpu_batch_size = c.gbs;
  p.num_gpu_batches = c.ngb;
  p.overlap = c.overlap;
  p.cpu_cache_compute = c.cpu_attention;
  return p;
}

std::vector<GenerationRequest> requests(const std::string& model) {
  Tokenizer tok = Tokenizer::load(model_dir(model));
  const char* prompts[] = {"In the beginning God created", "And", "The LORD is my shepherd; I shall not want.",
                           "Jesus wept.", "And God said, Let there be light: and there was light.",
                           "Blessed are the meek: for they shall inherit the earth.", "Amen."};
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 7; ++i) {
    GenerationRequest r;
    r.prompt_ids = tok.encode(prompts[i], true);
    r.max_new_tokens = 6 + i % 3;
    r.sampling.temperature = i == 3 ? 0.8f : 0.f;
    r.sampling.seed = 11;
    reqs.push_back(r);
  }
  return reqs;
}

class OffloadGrid : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadGrid, SameTokensAsInMemory) {
  const Case& c = GetParam();
  Model model = Model::load_dir(model_dir(c.model));
  CpuDevice dev(2);
  auto reqs = requests(c.model);
  GenerateOptions go;
  go.eos_id = model.config().eos_id;
  Forward fwd(model, dev);
  go.batch_size = 3;
  auto want = generate(fwd, reqs, go);

  test::TempDir dir;
  OffloadOptions o;
  o.policy = make_policy(c);
  o.offload_dir = dir.path() / "store";
  OffloadEngine eng(model, dev, o);
  auto got = generate(eng, reqs, go);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, OffloadGrid,
    ::testing::Values(Case{"tiny-opt", "100 0 100 0 100 0", 2, 2, true, false},
                      Case{"tiny-opt", "0 100 100 0 100 0", 2, 2, true, false},
                      Case{"tiny-opt", "0 0 100 0 100 0", 3, 1, true, false},
                      Case{"tiny-opt", "30 30 100 0 100 0", 1, 3, true, false},
                      Case{"tiny-opt", "100 0 0 100 100 0", 2, 2, true, false},
                      Case{"tiny-opt", "100 0 0 100 100 0", 2, 2, true, true},
                      Case{"tiny-opt", "100 0 0 0 100 0", 3, 2, true, false},
                      Case{"tiny-opt", "100 0 0 0 100 0", 3, 2, true, true},
                      Case{"tiny-opt", "100 0 34 33 100 0", 3, 3, true, false},
                      Case{"tiny-opt", "100 0 34 33 100 0", 3, 3, false, true},
                      Case{"tiny-opt", "100 0 100 0 0 100", 2, 3, true, false},
                      Case{"tiny-opt", "100 0 100 0 0 100", 2, 3, false, false},
                      Case{"tiny-opt", "100 0 100 0 0 100", 2, 2, true, false},
                      Case{"tiny-opt", "100 0 100 0 0 100", 3, 1, true, false},
                      Case{"tiny-opt", "100 0 100 0 100 0", 2, 3, true, false},
                      Case{"tiny-opt", "0 100 100 0 0 100", 2, 3, false, false},
                      Case{"tiny-opt", "20 30 0 50 0 100", 2, 2, false, false},
                      Case{"tiny-opt", "0 50 0 0 0 100", 4, 2, true, true},
                      Case{"tiny-llama", "30 30 100 0 100 0", 2, 2, true, false},
                      Case{"tiny-llama", "0 0 0 100 0 100", 3, 2, true, true},
                      Case{"tiny-llama", "50 0 34 33 100 0", 2, 3, true, false},
                      Case{"tiny-llama", "0 100 0 0 100 0", 1, 2, false, false}));

// The cross-step prefetch puts the next step's first layer in the last layer's slot and shifts
// the slot parity (every step when the layer count is even, never when odd): both, over several
// batches, with weights streamed from the host and from disk, give the in-memory tokens.
TEST(OffloadPrefetch, OddAndEvenLayerCountsMatchInMemory) {
  ModelConfig c = Model::load_dir(model_dir("tiny-opt")).config();
  auto reqs = requests("tiny-opt");
  GenerateOptions go;
  go.ignore_eos = true;
  for (int layers : {3, 4}) {
    c.n_layers = layers;
    Model model = Model::dummy(c, 5);
    CpuDevice dev(2);
    Forward fwd(model, dev);
    go.batch_size = 3;
    const auto want = generate(fwd, reqs, go);
    for (const char* percent : {"0 100 100 0 100 0", "30 0 100 0 100 0"}) {
      test::TempDir dir;
      OffloadOptions o;
      o.policy = make_policy(Case{"tiny-opt", percent, 2, 1, true, false});
      o.offload_dir = dir.path();
      OffloadEngine eng(model, dev, o);
      const auto got = generate(eng, reqs, go);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i].tokens, want[i].tokens) << layers << " layers, " << percent << ", request " << i;
    }
  }
}

// Bytes each link must carry for weights on the host, KV on the host, hidden states on the
// device: computed here from the model and the request shapes, not from the engine's plan.
TEST(OffloadBytes, MatchWhatThePolicyImplies) {
  for (bool cpu_attn : {false, true}) {
    Model model = Model::load_dir(model_dir("tiny-opt"));
    const ModelConfig& c = model.config();
    CpuDevice dev(2);
    OffloadOptions o;
    o.policy = make_policy(Case{"tiny-opt", "0 100 0 100 100 0", 2, 2, true, cpu_attn});
    OffloadEngine eng(model, dev, o);
    std::vector<GenerationRequest> reqs;
    const int64_t lens[] = {5, 9, 2, 7}, gen = 5;
    for (int64_t n : lens) {
      GenerationRequest r;
      r.prompt_ids.assign(size_t(n), 262);
      r.prompt_ids[0] = 2;
      r.max_new_tokens = gen;
      r.sampling.temperature = 0;
      reqs.push_back(r);
    }
    GenerateOptions go;
    go.ignore_eos = true;
    generate(eng, reqs, go);
    const uint64_t steps = gen;  // prefill + (gen - 1) decode steps
    // Every weight once per step, the tied head's table again, except that the embedding unit
    // moves only the step's token rows: 4 x 9 at the prefill, 4 per decode step.
    const uint64_t table = model.weights().embed.nbytes(), table_row = table / uint64_t(c.vocab_size);
    const uint64_t all_weights = model.weight_bytes();  // - table (gathered) + table (tied head)
    const uint64_t row = uint64_t(2 * c.n_kv_heads * c.head_dim) * sizeof(float), L = uint64_t(c.n_layers);
    uint64_t h2d = steps * all_weights + (4 * 9 + (steps - 1) * 4) * table_row, d2h = 0;
    for (int64_t n : lens) {
      d2h += L * uint64_t(n) * row;  // prefill stores every prompt row
      for (int64_t j = 0; j < gen - 1; ++j) {
        if (cpu_attn) {
          d2h += L * uint64_t(c.q_dim() + 2 * c.kv_dim()) * sizeof(float);
          h2d += L * uint64_t(c.q_dim()) * sizeof(float);
        } else {
          h2d += L * uint64_t(n + j) * row;  // load the cache
          d2h += L * row;                    // store the new row
        }
      }
    }
    OffloadReport r = eng.report();
    EXPECT_EQ(r.bytes[size_t(Link::kHostToDevice)], h2d) << "cpu_attn " << cpu_attn;
    EXPECT_EQ(r.bytes[size_t(Link::kDeviceToHost)], d2h) << "cpu_attn " << cpu_attn;
    EXPECT_EQ(r.bytes[size_t(Link::kDiskToHost)], 0u);
    EXPECT_EQ(r.bytes[size_t(Link::kHostToDisk)], 0u);
  }
}

TEST(OffloadBytes, DiskLinksCarryDiskHomedData) {
  Model model = Model::load_dir(model_dir("tiny-llama"));
  const ModelConfig& c = model.config();
  CpuDevice dev(2);
  test::TempDir dir;
  OffloadOptions o;
  o.policy = make_policy(Case{"tiny-llama", "0 0 0 0 100 0", 3, 1, true, false});
  o.offload_dir = dir.path();
  OffloadEngine eng(model, dev, o);
  std::vector<GenerationRequest> reqs(3);
  const int64_t lens[] = {4, 6, 3}, gen = 4;
  for (int i = 0; i < 3; ++i) {
    reqs[size_t(i)].prompt_ids.assign(size_t(lens[i]), 100);
    reqs[size_t(i)].max_new_tokens = gen;
    reqs[size_t(i)].sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
  const uint64_t row = uint64_t(2 * c.n_kv_heads * c.head_dim) * sizeof(float), L = uint64_t(c.n_layers);
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
  OffloadReport r = eng.report();
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
  o.policy = make_policy(Case{"tiny-opt", "30 70 0 100 0 100", 2, 2, true, false});
  o.trace = true;
  OffloadEngine eng(model, dev, o);
  std::vector<GenerationRequest> reqs(3);
  for (auto& r : reqs) {
    r.prompt_ids = {2, 100, 200, 300};
    r.max_new_tokens = 3;
    r.sampling.temperature = 0;
  }
  GenerateOptions go;
  go.ignore_eos = true;
  generate(eng, reqs, go);
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
  // (one LW: weights are on the host), the last (the run's last step) does not.
  EXPECT_EQ(slices - prefill, 2 * per_step + 1);
  EXPECT_GT(prefill, 0u);
  EXPECT_TRUE(names.count("C(0,0) prefill") && names.count("LW(5)") && names.count("LW(1 next) prefill") &&
              names.count("LW(1 next)"));
  EXPECT_EQ(eng.last_schedule().find(StepKind::kLoadWeight, 1, 0), -1);  // it was loaded by the step before
  // Per step, max(queue busy) <= step wall, and a sum of maxima >= the maximum of sums.
  const OffloadReport r = eng.report();
  EXPECT_GE(r.step_overlap_efficiency, r.overlap_efficiency - 1e-9);
  EXPECT_LE(r.step_overlap_efficiency, 1.0 + 1e-6);
  for (auto& [q, v] : by_queue) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LE(v[i - 1].second, v[i].first + 0.2) << "queue " << q;
  }
}

TEST(OffloadBudgets, PeaksStayWithinBudgetsAndSmallBudgetsAreExplained) {
  Model model = Model::load_dir(model_dir("tiny-opt"));
  CpuDevice dev(2);
  OffloadOptions o;
  o.policy = make_policy(Case{"tiny-opt", "20 80 50 50 100 0", 2, 2, true, false});
  o.device_mem = 12 << 20;
  o.host_mem = 16 << 20;
  OffloadEngine eng(model, dev, o);
  auto reqs = requests("tiny-opt");
  generate(eng, reqs, GenerateOptions{});
  OffloadReport r = eng.report();
  EXPECT_LE(r.peak[0], o.device_mem);
  EXPECT_LE(r.peak[1], o.host_mem);
  EXPECT_GT(r.peak[0], 0u);

  o.device_mem = 1 << 20;  // not even the weight double buffer fits
  try {
    OffloadEngine tiny(model, dev, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("device budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs at least"), std::string::npos) << msg;
    EXPECT_NE(msg.find("weight double buffer"), std::string::npos) << msg;
  }
  o.policy.w_gpu_percent = 120;
  EXPECT_THROW(OffloadEngine(model, dev, o), Error);
  o.policy = make_policy(Case{"tiny-opt", "0 0 100 0 100 0", 2, 2, true, false});
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
