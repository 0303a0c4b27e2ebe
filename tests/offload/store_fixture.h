// Shared helpers of the offload tests: random payloads, per-test directories, the backend and
// directory grid (io_uring / pread x real disk with O_DIRECT / tmpfs / forced buffered I/O), and
// the StoreTest fixture: a DiskStore over a FaultyIo decorator (faulty_io.h) over a real backend.
#pragma once

#include <gtest/gtest.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "offload/disk_store.h"
#include "offload/faulty_io.h"
#include "offload/io_backend.h"

namespace flexh2o::testing {

namespace fs = std::filesystem;

inline constexpr long kTmpfsMagic = 0x01021994;

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

inline TensorView u8_view(const std::vector<uint8_t>& v) {
  return TensorView{v.data(), DType::U8, Shape{int64_t(v.size())}};
}

// base / <suite>_<test>_<pid>: one directory per test and process.
inline fs::path unique_dir(const fs::path& base) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string n = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : n)
    if (c == '/') c = '_';
  return base / (n + "_" + std::to_string(::getpid()));
}

// A tmpfs directory for the buffered fallback, or empty when none exists.
inline fs::path tmpfs_base() {
  for (const char* p : {"/dev/shm", "/tmp"}) {
    struct statfs sf {};
    if (::statfs(p, &sf) == 0 && long(sf.f_type) == kTmpfsMagic && ::access(p, W_OK) == 0) return p;
  }
  return {};
}

// Queue depth 8 and 3 pread threads: batches in the tests are larger than both.
inline std::unique_ptr<IoBackend> backend(IoBackendChoice c, std::string* why) {
  IoBackendOptions o;
  o.queue_depth = 8;
  o.pread_threads = 3;
  return make_io_backend(c, why, o);
}

inline const char* choice_name(IoBackendChoice c) { return c == IoBackendChoice::kUring ? "uring" : "pread"; }

enum class Where { kDisk, kTmpfs, kDiskBuffered };

struct StoreParam {
  IoBackendChoice backend;
  Where where;
};

inline const char* where_name(Where w) {
  return w == Where::kDisk ? "_disk" : w == Where::kTmpfs ? "_tmpfs" : "_buffered";
}

// Every backend x directory kind, for INSTANTIATE_TEST_SUITE_P(..., ValuesIn(store_params()), store_param_name).
inline std::vector<StoreParam> store_params() {
  std::vector<StoreParam> ps;
  for (Where w : {Where::kDisk, Where::kTmpfs, Where::kDiskBuffered})
    for (IoBackendChoice c : {IoBackendChoice::kUring, IoBackendChoice::kPread}) ps.push_back({c, w});
  return ps;
}

inline std::string store_param_name(const ::testing::TestParamInfo<StoreParam>& i) {
  return std::string(choice_name(i.param.backend)) + where_name(i.param.where);
}

class StoreTest : public ::testing::TestWithParam<StoreParam> {
 protected:
  void SetUp() override {
    std::string why;
    real_ = backend(GetParam().backend, &why);
    if (!real_) GTEST_SKIP() << why;
    fs::path base = fs::path(FLEXH2O_BINARY_DIR) / "offload_test_tmp";
    if (GetParam().where == Where::kTmpfs) {
      base = tmpfs_base();
      if (base.empty()) GTEST_SKIP() << "no tmpfs directory (/dev/shm, /tmp)";
    }
    dir_ = unique_dir(base);
    faulty_ = std::make_unique<FaultyIo>(*real_);
    opts_.use_direct_io = GetParam().where != Where::kDiskBuffered;
    store_ = DiskStore::open(dir_, "opt-125m@cfg1", *faulty_, opts_);
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  void reopen(const std::string& identity = "opt-125m@cfg1") {
    store_.reset();
    store_ = DiskStore::open(dir_, identity, *faulty_, opts_);
  }
  std::vector<uint8_t> read_all(const std::string& name, size_t n) {
    std::vector<uint8_t> out(n);
    Status st = store_->read(name, 0, n, out.data());
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }
  // Every file but the lock files (flexh2o.lock and open stores' run leases, store_dir.h).
  std::vector<std::string> files() const {
    std::vector<std::string> f;
    for (const auto& de : fs::directory_iterator(dir_))
      if (de.path().extension() != ".lock") f.push_back(de.path().filename().string());
    std::sort(f.begin(), f.end());
    return f;
  }

  std::unique_ptr<IoBackend> real_;
  std::unique_ptr<FaultyIo> faulty_;
  std::unique_ptr<DiskStore> store_;
  DiskStoreOptions opts_;
  fs::path dir_;
};

}  // namespace flexh2o::testing
