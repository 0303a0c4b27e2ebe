// Hardware profiles as files: every missing, negative or mistyped field is named with the file,
// a round trip keeps the rates, and hostile files (a FIFO, a non-string name) give errors that
// name them instead of blocking or escaping as a bare JSON error. And the host's KV-policy rate:
// measured, carried through files, and charged to the host queue for every row decided.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/policy_of.h"
#include "engine/test_util.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
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
}

// The KV-policy rate survives a file, and a profile without it leaves decisions free (0), as
// profiles written before it was measured mean.
TEST(PlannerProfile, KvPolicyRateRoundTripsAndDefaultsToFree) {
  HardwareProfile h = big_profile();
  EXPECT_GT(h.host_kv_policy, 0);
  h.host_kv_policy_row = 0.4e-6;
  const HardwareProfile back = HardwareProfile::from_json(h.to_json(), "back.json");
  EXPECT_DOUBLE_EQ(back.host_kv_policy, h.host_kv_policy);
  EXPECT_DOUBLE_EQ(back.host_kv_policy_row, h.host_kv_policy_row);
  nlohmann::json old = h.to_json();
  old.erase("host_kv_policy");
  const HardwareProfile free = HardwareProfile::from_json(old, "old.json");
  EXPECT_EQ(free.host_kv_policy, 0);
  EXPECT_EQ(free.host_kv_policy_row, 0);
}

// The profiler times the engine's own decisions; a rate of zero or a negative fixed part would
// leave H2O's host work unpriced. A CPU's decode GEMM streams and multiplies on the same cores:
// its time is the sum of the two (the max put OPT-125M decode steps 25-45% under on 2 vCPUs).
TEST(PlannerProfile, MeasuresTheKvPolicyRateAndSumsDecodeGemms) {
  CpuDevice dev(CpuDeviceOptions{});
  ProfileOptions o;
  o.copy_bytes = 1 << 20;
  o.disk_bytes = 4 << 20;
  o.weight_read_rows = 1024;
  o.gemm_dim = 64;
  o.min_seconds = 0.001;
  const HardwareProfile m = measure_profile(dev, o);
  EXPECT_GT(m.host_kv_policy, 1e6) << "under a million slots a second";
  EXPECT_LT(m.host_kv_policy, 1e12);
  EXPECT_GE(m.host_kv_policy_row, 0);
  EXPECT_LT(m.host_kv_policy_row, 1e-3);
  EXPECT_TRUE(m.gemm_time_sum);
}

// Every (sequence, KV head, layer) row a bounded policy decides costs the host queue
// after / rate + row seconds, wherever the sequence's KV lives: the device's rows in UpdateCache,
// the host's inside host attention (decode) or UpdateCache (prefill, after the device compacts
// them). The full cache decides nothing.
TEST(PlannerKvPolicyTime, EveryDecidedRowCostsTheHostQueue) {
  const ModelConfig c = Model::load_dir(model_dir("tiny-opt")).config();
  HardwareProfile free = big_profile(), priced = big_profile();
  free.device = priced.device = DeviceKind::kCpu;
  free.host_kv_policy = 0;
  priced.host_kv_policy = 5e7;
  priced.host_kv_policy_row = 2e-6;
  KvPolicyConfig h2o;
  h2o.kind = KvPolicyKind::kH2o;
  h2o.heavy_ratio = h2o.recent_ratio = 0.25;
  const int64_t prompt = 64, gen = 5;
  const Workload w{prompt, gen, h2o};
  const double kept = double(make_policy(h2o)->budget(prompt).kept(prompt + gen));
  struct Case {
    const char* percent;
    bool cpu_attn;
  };
  for (const Case& k : {Case{"100 0 100 0 100 0", false}, Case{"100 0 0 100 100 0", false}, Case{"100 0 0 100 100 0", true},
                        Case{"100 0 50 50 100 0", true}, Case{"100 0 50 0 100 0", false}}) {
    SCOPED_TRACE(k.percent + std::string(k.cpu_attn ? " --cpu-cache-compute" : ""));
    const Policy p = test::policy_of(k.percent, 3, 2, k.cpu_attn);
    CostModel cf(ModelShape::from_config(c), free, w), cp(ModelShape::from_config(c), priced, w);
    const double host = cp.estimate(p).busy[size_t(Queue::kHost)] - cf.estimate(p).busy[size_t(Queue::kHost)];
    const double rows = double(p.block_size() * c.n_kv_heads * c.n_layers);
    const double want = rows * (double(prompt) / priced.host_kv_policy + priced.host_kv_policy_row) +
                        double(gen - 1) * rows * ((kept + 1) / priced.host_kv_policy + priced.host_kv_policy_row);
    EXPECT_NEAR(host, want, 1e-9 * want);
    const Workload full{prompt, gen, {}};
    CostModel ff(ModelShape::from_config(c), free, full), fp(ModelShape::from_config(c), priced, full);
    EXPECT_EQ(fp.estimate(p).busy[size_t(Queue::kHost)], ff.estimate(p).busy[size_t(Queue::kHost)]);
  }
}

// A profile file that is a FIFO used to block in open(); a "name" that is not a string used to
// escape as a bare nlohmann type_error that named no file.
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
