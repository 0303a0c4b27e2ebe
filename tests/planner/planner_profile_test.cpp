// Hardware profiles as files: every missing, negative or mistyped field is named with the file,
// a round trip keeps the rates, and hostile files (a FIFO, a non-string name) give errors that
// name them instead of blocking or escaping as a bare JSON error. And the host's KV-policy rate:
// measured, carried through files, and charged to the host queue for every row decided.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/kv_evict.h"
#include "engine/policy_of.h"
#include "engine/test_util.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
#include "quick_profile.h"
#include "policies/kv_policy.h"

namespace flexh2o {
namespace {

using test::model_dir;

HardwareProfile big_profile() {
  return HardwareProfile::load(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "hardware" / "h200.json");
}

TEST(PlannerProfile, MissingOrNegativeFieldsAreNamed) {
  nlohmann::json good = big_profile().to_json();
  EXPECT_NO_THROW(HardwareProfile::from_json(good, "good.json"));
  const HardwareProfile back = HardwareProfile::from_json(good, "good.json");
  EXPECT_DOUBLE_EQ(back.host_to_device, big_profile().host_to_device);
  auto expect_error = [](const nlohmann::json& j, const std::string& field) {
    try {
      HardwareProfile::from_json(j, "p.json");
      ADD_FAILURE() << "accepted a profile with bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    }
  };
  nlohmann::json j = good;
  j["bandwidth_gbps"].erase("host_to_device");
  expect_error(j, "bandwidth_gbps.host_to_device");
  j = good;
  j["memory_gb"]["host"] = -3;
  expect_error(j, "memory_gb.host");
  j = good;
  j["device_tflops"]["gemm_decode"] = 0;
  expect_error(j, "device_tflops.gemm_decode");
  j = good;
  j.erase("host_tflops");
  expect_error(j, "host_tflops.attention");
  j = good;
  j["bandwidth_gbps"]["disk_to_host"] = "fast";
  expect_error(j, "bandwidth_gbps.disk_to_host");
  j = good;
  j["usable_fraction"] = 1.5;
  expect_error(j, "usable_fraction");
  j = good;
  j["host_kv_policy"]["mslots"] = -1;
  expect_error(j, "host_kv_policy.mslots");
  j = good;
  j["host_kv_policy"]["prefill_mslots"] = -1;
  expect_error(j, "host_kv_policy.prefill_mslots");
  j = good;
  j["host_kv_policy"]["group_mslots"] = "many";
  expect_error(j, "host_kv_policy.group_mslots");
}

// The KV-policy rates survive a file; a profile without them leaves decisions free (0), and one
// without the prefill's prices a prefill at the decode rate, as profiles written before each was
// measured mean.
TEST(PlannerProfile, KvPolicyRateRoundTripsAndDefaultsToFree) {
  HardwareProfile h = big_profile();
  EXPECT_GT(h.host_kv_policy, 0);
  h.host_kv_prefill = 3.3e7;
  h.host_kv_group = 2.2e9;
  h.host_kv_policy_row = 0.4e-6;
  h.host_kv_threads = 12.5;
  const HardwareProfile back = HardwareProfile::from_json(h.to_json(), "back.json");
  EXPECT_DOUBLE_EQ(back.host_kv_policy, h.host_kv_policy);
  EXPECT_DOUBLE_EQ(back.host_kv_prefill, 3.3e7);
  EXPECT_DOUBLE_EQ(back.kv_policy_rate(true), 3.3e7);
  EXPECT_DOUBLE_EQ(back.kv_policy_rate(false), h.host_kv_policy);
  EXPECT_DOUBLE_EQ(back.host_kv_group, 2.2e9);
  EXPECT_DOUBLE_EQ(back.host_kv_policy_row, h.host_kv_policy_row);
  EXPECT_DOUBLE_EQ(back.host_kv_threads, 12.5);  // a measured gain, not a count
  nlohmann::json old = h.to_json();
  old["host_kv_policy"].erase("prefill_mslots");
  const HardwareProfile decode_only = HardwareProfile::from_json(old, "decode_only.json");
  EXPECT_EQ(decode_only.host_kv_prefill, 0);
  EXPECT_DOUBLE_EQ(decode_only.kv_policy_rate(true), h.host_kv_policy);
  old.erase("host_kv_policy");
  const HardwareProfile free = HardwareProfile::from_json(old, "old.json");
  EXPECT_EQ(free.host_kv_policy, 0);
  EXPECT_EQ(free.host_kv_prefill, 0);
  EXPECT_EQ(free.host_kv_group, 0);
  EXPECT_EQ(free.host_kv_policy_row, 0);
  EXPECT_EQ(free.host_kv_threads, 1);
}

// The disk probe in the temporary directory: the probe directories of profiles that are gone
// (killed mid-probe: 256 MiB of files) and an hour old are removed, those of live processes or
// touched lately (a process of another PID namespace) kept, and its own removed at the end; an
// unusable TMPDIR is named, with what to do.
TEST(PlannerProfile, TempProbeDirsOfGoneProfilesAreRemoved) {
  test::TempDir tmp;
  struct RestoreTmpdir {  // whatever this test throws, the binary's later tests keep their TMPDIR
    const char* before = std::getenv("TMPDIR");
    std::string saved = before ? before : "";
    ~RestoreTmpdir() {
      if (before) setenv("TMPDIR", saved.c_str(), 1);
      else unsetenv("TMPDIR");
    }
  } restore;
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  const auto stale = tmp.path() / ("flexh2o-profile-" + std::to_string(gone));
  const auto recent = tmp.path() / ("flexh2o-profile-" + std::to_string(gone) + "0");  // no such pid, but new
  const auto live = tmp.path() / ("flexh2o-profile-" + std::to_string(getppid()));
  const auto other = tmp.path() / "flexh2o-profile-notes";
  for (const auto& d : {stale, recent, live, other}) {
    std::filesystem::create_directories(d);
    std::ofstream(d / "probe.fhs") << "x";
    if (d != recent)
      std::filesystem::last_write_time(d, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  }
  setenv("TMPDIR", tmp.path().c_str(), 1);
  CpuDevice dev(CpuDeviceOptions{});
  (void)measure_profile(dev, test::quick_profile_options());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(recent / "probe.fhs"));
  EXPECT_TRUE(std::filesystem::exists(live / "probe.fhs"));
  EXPECT_TRUE(std::filesystem::exists(other / "probe.fhs"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / ("flexh2o-profile-" + std::to_string(getpid()))));
  setenv("TMPDIR", (tmp.path() / "missing").c_str(), 1);
  const std::string msg = test::error_of([&] { (void)measure_profile(dev, test::quick_profile_options()); });
  EXPECT_NE(msg.find("the temporary directory (TMPDIR, else /tmp) is unusable for the disk probe"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("give --offload-dir"), std::string::npos) << msg;
}

// The profiler times the engine's own decisions on one thread.
TEST(PlannerProfile, MeasuresTheKvPolicyRate) {
  CpuDevice dev(CpuDeviceOptions{});
  const ProfileOptions o = test::quick_profile_options();
  const HardwareProfile m = measure_profile(dev, o);
  EXPECT_GT(m.host_kv_policy, 1e6) << "under a million slots a second";
  EXPECT_GT(m.host_kv_prefill, 1e6) << "under a million slots a second at a prefill";
  EXPECT_GT(m.host_kv_group, 1e6) << "a grouped query head's sum under a million slots a second";
  EXPECT_LT(m.host_kv_policy_row, 1e-3);
}

// Every (sequence, KV head, layer) row a bounded policy decides costs the host queue
// after / rate + row seconds, wherever the sequence's KV lives: the device's rows in UpdateCache,
// the host's inside host attention (decode) or UpdateCache (prefill, after the device compacts
// them); a prefill's rows at the prefill rate, and each slot (group - 1) / group rate more where
// query heads share a KV head (tiny-llama: 2 a head; tiny-opt: 1, which adds nothing). The full
// cache decides nothing. The tiny models' segments are under the parallel threshold.
class PlannerKvPolicyTimeOf : public ::testing::TestWithParam<const char*> {};

TEST_P(PlannerKvPolicyTimeOf, EveryDecidedRowCostsTheHostQueue) {
  const ModelConfig c = Model::load_dir(model_dir(GetParam())).config();
  const int64_t group = c.n_heads / c.n_kv_heads;
  HardwareProfile free = big_profile(), priced = big_profile();
  free.device = priced.device = DeviceKind::kCpu;
  free.host_kv_policy = 0;
  priced.host_kv_policy = 5e7;
  priced.host_kv_prefill = 1.5e7;
  priced.host_kv_group = 4e8;
  priced.host_kv_policy_row = 2e-6;
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_ratio = h2o.recent_ratio = 0.25;
  const int64_t prompt = 64, gen = 5;
  const Workload w{prompt, gen, h2o};
  const double kept = double(make_policy(h2o)->budget(prompt).kept(prompt + gen));
  ASSERT_EQ(kv_decision_parallelism(3, c.n_kv_heads, prompt), 1) << "the case below assumes serial decisions";
  struct Case {
    const char* percent;
    bool cpu_attn;
  };
  for (const Case& k : {Case{"100 0 100 0 100 0", false}, Case{"100 0 0 100 100 0", false}, Case{"100 0 0 100 100 0", true},
                        Case{"100 0 50 50 100 0", true}, Case{"100 0 50 0 100 0", false}, Case{"100 0 34 33 100 0", true}}) {
    SCOPED_TRACE(k.percent + std::string(k.cpu_attn ? " --cpu-cache-compute" : ""));
    const Policy p = test::policy_of(k.percent, 3, 2, k.cpu_attn);
    CostModel cf(ModelShape::from_config(c), free, w), cp(ModelShape::from_config(c), priced, w);
    const double host = cp.estimate(p).busy[size_t(Queue::kHost)] - cf.estimate(p).busy[size_t(Queue::kHost)];
    const double rows = double(p.block_size() * c.n_kv_heads * c.n_layers);
    const double sum = double(group - 1) / priced.host_kv_group;  // a slot's further heads
    const double want = rows * (double(prompt) * (1 / priced.host_kv_prefill + sum) + priced.host_kv_policy_row) +
                        double(gen - 1) * rows * ((kept + 1) * (1 / priced.host_kv_policy + sum) + priced.host_kv_policy_row);
    EXPECT_NEAR(host, want, 1e-9 * want);
    const Workload full{prompt, gen, {}};
    CostModel ff(ModelShape::from_config(c), free, full), fp(ModelShape::from_config(c), priced, full);
    EXPECT_EQ(fp.estimate(p).busy[size_t(Queue::kHost)], ff.estimate(p).busy[size_t(Queue::kHost)]);
  }
}
INSTANTIATE_TEST_SUITE_P(TinyModels, PlannerKvPolicyTimeOf, ::testing::Values("tiny-opt", "tiny-llama"));

// Segments past the engine's parallel threshold share the host's threads (OPT-30B, 48 sequences a
// micro-batch: 16 threads cost a sixteenth); one sequence a micro-batch stays on one thread.
TEST(PlannerKvPolicyTime, LargeSegmentsShareTheHostThreads) {
  const ModelConfig c = ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "opt-30b.json");
  HardwareProfile free = big_profile(), one = big_profile(), many = big_profile();
  free.host_kv_policy = 0;
  one.host_kv_threads = 1;
  many.host_kv_threads = 16;
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_ratio = h2o.recent_ratio = 0.1;
  const Workload w{512, 4, h2o};
  auto decisions = [&](const HardwareProfile& h, int gbs) {
    const Policy p = test::policy_of("20 80 0 100 0 100", gbs, 1, true);
    CostModel cm(ModelShape::from_config(c), h, w), cf(ModelShape::from_config(c), free, w);
    return cm.estimate(p).busy[size_t(Queue::kHost)] - cf.estimate(p).busy[size_t(Queue::kHost)];
  };
  ASSERT_GT(kv_decision_parallelism(48, c.n_kv_heads, 103), 16);
  EXPECT_NEAR(decisions(one, 48) / decisions(many, 48), 16.0, 1e-6);
  ASSERT_EQ(kv_decision_parallelism(1, c.n_kv_heads, 512), 1);
  EXPECT_NEAR(decisions(one, 1) / decisions(many, 1), 1.0, 1e-9);
}

// A full cache on a model with sliding-window layers: only those layers decide, over the prompt
// at the prefill and their window (plus the new row) at decode (Gemma-2-9B: 21 of 42 layers).
TEST(PlannerKvPolicyTime, SlidingLayersDecideOverTheirWindow) {
  const ModelConfig c = ModelConfig::from_file(std::filesystem::path(FLEXH2O_SOURCE_CONFIGS) / "models" / "gemma-2-9b.json");
  HardwareProfile free = big_profile(), priced = big_profile();
  free.host_kv_policy = 0;
  priced.host_kv_policy = 5e7;
  priced.host_kv_prefill = 1.5e7;
  priced.host_kv_policy_row = 2e-6;
  priced.host_kv_threads = 1;
  const int64_t prompt = 6000, gen = 5;
  const Workload w{prompt, gen, {}};
  const Policy p = test::policy_of("100 0 0 100 100 0", 2, 1, true);
  CostModel cf(ModelShape::from_config(c), free, w), cp(ModelShape::from_config(c), priced, w);
  ASSERT_EQ(cp.window_cap(), c.sliding_window);
  int64_t sliding = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) sliding += c.attention_window(l) > 0;
  ASSERT_GT(sliding, 0);
  ASSERT_LT(sliding, c.n_layers);
  const double rows = double(2 * c.n_kv_heads * sliding);
  const double sum = double(c.n_heads / c.n_kv_heads - 1) / priced.host_kv_group;  // h200.json's, group 2
  ASSERT_GT(sum, 0);
  const double want = rows * (double(prompt) * (1 / priced.host_kv_prefill + sum) + priced.host_kv_policy_row) +
                      double(gen - 1) * rows *
                          (double(c.sliding_window) * (1 / priced.host_kv_policy + sum) + priced.host_kv_policy_row);
  const double host = cp.estimate(p).busy[size_t(Queue::kHost)] - cf.estimate(p).busy[size_t(Queue::kHost)];
  EXPECT_NEAR(host, want, 1e-6 * want);
}

// A profile file that is a FIFO must not block in open(), and a "name" that is not a string must
// not escape as a bare nlohmann type_error that names no file.
TEST(PlannerProfile, HostileProfileFilesGiveErrorsNamingThem) {
  test::TempDir tmp;
  const std::filesystem::path fifo = tmp.path() / "fifo.json", odd = tmp.path() / "odd.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string msg;
  auto f = std::async(std::launch::async, [&] {
    try {
      HardwareProfile::load(fifo);
    } catch (const Error& e) {
      msg = e.what();
    }
  });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on a FIFO hardware profile for more than 2 s";
    ::close(::open(fifo.c_str(), O_WRONLY));
  }
  f.get();
  EXPECT_NE(msg.find("hardware profile " + fifo.string() + " is a FIFO"), std::string::npos) << msg;

  nlohmann::json j = big_profile().to_json();
  j["name"] = 5;
  std::ofstream(odd) << j.dump();
  msg.clear();
  try {
    HardwareProfile::load(odd);
  } catch (const Error& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a flexh2o::Error: " << e.what();
  }
  EXPECT_NE(msg.find(odd.string()), std::string::npos) << msg;
}

}  // namespace
}  // namespace flexh2o
