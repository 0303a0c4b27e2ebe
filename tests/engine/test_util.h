// Helpers shared by the engine tests: reference files, temp dirs, model loading, error messages.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>

namespace flexh2o::test {

// The message of the exception (flexh2o::Error is one) `f` throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

inline std::filesystem::path data_dir() { return FLEXH2O_TEST_DATA; }
inline std::filesystem::path model_dir(const std::string& name) { return data_dir() / name; }

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "cannot read " << p;
  return nlohmann::json::parse(in);
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("flexh2o-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Copies a model directory's small files (config, tokenizer) into `dst`, without weights.
inline void copy_model_files(const std::filesystem::path& src, const std::filesystem::path& dst) {
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    if (e.is_regular_file() && e.path().extension() != ".safetensors")
      std::filesystem::copy_file(e.path(), dst / e.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace flexh2o::test
