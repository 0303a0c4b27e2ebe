// Helpers shared by the loader tests: a per-test temporary directory and raw file writers for
// hand-made (often deliberately broken) safetensors files. Test-only; not part of any library.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace flexh2o::test {

// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "flexh2o_loader_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    if (info) name += std::string("_") + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

inline std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

// u64 length + `header` padded with spaces to a multiple of 8 + `data_bytes` zero bytes.
inline void write_raw_safetensors(const std::filesystem::path& p, std::string header, size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  write_bytes(p, u64_le(header.size()) + header + std::string(data_bytes, '\0'));
}

// Runs `fn`, expects a flexh2o::Error, and returns its message ("" and a failure otherwise).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected flexh2o::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected flexh2o::Error, nothing was thrown";
  return "";
}

}  // namespace flexh2o::test
