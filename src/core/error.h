// Error handling for flexh2o: the two channels of the house style.
// Broken invariants / API misuse throw flexh2o::Error (FH_CHECK); expected runtime
// failures (I/O, placement) return a [[nodiscard]] Status. Only main() picks exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flexh2o {

// Thrown for invariant violations and for bad user input discovered deep in library code
// (malformed model files, shape mismatches). what() is a complete, user-facing sentence.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void throw_check(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

enum class StatusCode { kOk, kIoError, kNoSpace, kShortIo, kNotFound, kOutOfBudget, kCorrupt, kInvalid };

// Value type for expected failures. Cheap to copy; ok() when code == kOk.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string msg, bool retryable = false)
      : code_(code), msg_(std::move(msg)), retryable_(retryable) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  bool retryable() const { return retryable_; }
  // Converts a failure into an Error (for callers that cannot recover).
  void throw_if_error() const {
    if (!ok()) throw Error(msg_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
  bool retryable_ = false;
};

}  // namespace flexh2o

// FH_CHECK(cond, msg parts...): throws flexh2o::Error "msg (file:line: cond)" when cond is false.
#define FH_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::flexh2o::detail::throw_check(__FILE__, __LINE__, #cond,                               \
                                     ::flexh2o::detail::concat(__VA_ARGS__));                 \
  } while (0)

// FH_FAIL(msg parts...): throws a user-facing flexh2o::Error without source location noise.
#define FH_FAIL(...) throw ::flexh2o::Error(::flexh2o::detail::concat(__VA_ARGS__))
