// Hardware profiles as files: every missing, negative or mistyped field is named with the file,
// a round trip keeps the rates, and hostile files (a FIFO, a non-string name) give errors that
// name them instead of blocking or escaping as a bare JSON error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/test_util.h"
#include "planner/profile.h"

namespace flexh2o {
namespace {

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
