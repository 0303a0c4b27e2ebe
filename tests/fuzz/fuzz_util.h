// Shared by the libFuzzer targets in this folder: a scratch directory per process (the product's
// parsers read files, so each input is written to a file there, never to a fixed path), and the
// one rule every target enforces: bad input may only throw flexh2o::Error with a message.
// Anything else escaping a parser (std::bad_alloc, a nlohmann exception, ...) is a finding.
#pragma once

#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/error.h"

namespace flexh2o::fuzz {

// A fresh directory under the system temp directory, removed with its contents at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "flexh2o-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("flexh2o fuzz: mkdtemp");
      std::abort();
    }
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// This process's scratch directory (created on first use).
inline const std::filesystem::path& scratch() {
  static ScratchDir dir;
  return dir.path();
}

// Writes exactly `bytes` to a new `file`; aborts when it cannot: a harness failure. The old
// file is unlinked, not truncated: ext4 flushes a truncated-and-rewritten file on close.
inline void write_file(const std::filesystem::path& file, std::string_view bytes) {
  ::unlink(file.c_str());
  std::FILE* f = std::fopen(file.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr) ok &= std::fclose(f) == 0;
  if (!ok) {
    std::perror(file.c_str());
    std::abort();
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Aborts with `why` (a broken promise of the parser under test): libFuzzer saves the input.
[[noreturn]] inline void finding(std::string_view why) {
  std::fprintf(stderr, "flexh2o fuzz finding: %.*s\n", int(why.size()), why.data());
  std::abort();
}

// Runs fn(); a flexh2o::Error whose message contains `must_name` (the file or directory the
// parser read: the user must learn which file is bad) is the expected outcome of bad input.
// Any other exception is a finding, reported with its type and message before aborting.
template <typename Fn>
void expect_clean(std::string_view must_name, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(must_name) == std::string_view::npos) {
      std::fprintf(stderr, "flexh2o fuzz finding: error does not name %.*s: %s\n", int(must_name.size()),
                   must_name.data(), e.what());
      std::abort();
    }
  } catch (const std::exception& e) {
    int status = 0;
    char* type = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
    std::fprintf(stderr, "flexh2o fuzz finding: %s escaped the parser: %s\n",
                 status == 0 ? type : typeid(e).name(), e.what());
    std::abort();
  }
}

}  // namespace flexh2o::fuzz
