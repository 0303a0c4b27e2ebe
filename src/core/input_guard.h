// Guards for untrusted input: the one place that refuses special files (FIFO, device, directory)
// before any blocking open, reads lines with a length cap, bounds JSON nesting before a value is
// parsed or printed, and turns JSON numbers and text into range-checked integers. Every parser
// (loader, model, tokenizer, planner, policy, CLI) calls these; nothing here writes a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace flexh2o {

// Deepest array/object nesting any of our JSON inputs has is under 10; 64 leaves room and stays
// far below what recursion (nlohmann's dump(), our own tree walkers) can take on a small stack.
inline constexpr int kMaxJsonDepth = 64;
// Longest line a line-oriented input (JSONL requests, texts to tokenize) may have by default.
inline constexpr size_t kMaxLineBytes = size_t(64) << 20;
// Largest whole file read into memory by read_input_file() by default (tokenizer.json of large
// vocabularies is ~20 MB; config files are kilobytes).
inline constexpr size_t kMaxInputFileBytes = size_t(1) << 30;

// Ok when `path` names an existing regular file (symlinks followed). Uses stat() only, so a FIFO,
// character/block device, socket or directory is refused without being opened: open() of a FIFO
// blocks until a writer appears. `what` names the file's role, e.g. "model config"; the message
// is a sentence such as "model config /m/config.json is a FIFO, not a regular file."
// Codes: kNotFound (missing), kInvalid (not a regular file), kIoError (stat failed otherwise).
[[nodiscard]] Status check_regular_file(const std::filesystem::path& path, std::string_view what);

// Reads a whole regular file into memory. Refuses (throws Error naming `what` and the path) a
// path that check_regular_file() refuses, a file larger than `max_bytes`, or a read error. The
// file is opened O_NONBLOCK and re-checked with fstat, so a FIFO swapped in after the stat()
// cannot block either.
std::string read_input_file(const std::filesystem::path& path, std::string_view what,
                            size_t max_bytes = kMaxInputFileBytes);
// Reads an open descriptor (a pipe, a terminal, standard input) to its end. Throws Error naming
// `what` on a read error (a closed descriptor, a directory) or past `max_bytes`. Blocks until the
// writer closes; the caller keeps the descriptor.
std::string read_input_fd(int fd, std::string_view what, size_t max_bytes = kMaxInputFileBytes);

// Splits a stream into lines without ever holding more than max_line_bytes of one line: an
// over-long line is reported as kTooLong as soon as the cap is crossed, and the next call resumes
// after that line's '\n' (its remaining bytes are skipped, not buffered). It never reads ahead of
// what the source has available, so interactive input is processed line by line.
// The source (stream or descriptor) is borrowed, must outlive the reader and is not closed.
// Not thread-safe.
class LineReader {
 public:
  enum class Result { kLine, kTooLong, kEnd };

  // `name` names the source in messages (e.g. the file path, or "standard input").
  explicit LineReader(std::istream& in, size_t max_line_bytes = kMaxLineBytes, std::string name = "input");
  explicit LineReader(int fd, size_t max_line_bytes = kMaxLineBytes, std::string name = "input");

  // kLine: `line` holds the next line without its '\n' (a '\r' before it is kept; the last line
  //        may lack a '\n'). kTooLong: the line has more than max_line_bytes bytes; `line` is
  //        empty. kEnd: no more input (`line` empty). Throws Error naming the source when the
  //        descriptor cannot be read.
  Result next(std::string& line);
  // 1-based number of the line the last kLine/kTooLong was about.
  int64_t line_number() const { return line_no_; }
  size_t max_line_bytes() const { return max_; }
  const std::string& name() const { return name_; }
  // "NAME: line N is longer than M bytes; it was skipped." for the last kTooLong.
  std::string too_long_message() const;

 private:
  bool refill();  // false at end of input

  std::istream* in_ = nullptr;
  int fd_ = -1;
  size_t max_;
  std::string name_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  int64_t line_no_ = 0;
  bool skipping_ = false;  // inside the tail of an over-long line
  bool eof_ = false;
};

// Ok when no array or object in `text` nests deeper than `max_depth` (brackets inside strings do
// not count). A linear scan with O(1) memory, run before nlohmann parses `text`: printing a
// deeply nested value (dump(), used by error messages) and walking it recursively overflow the
// stack. Code kInvalid; the message names `what` and the byte offset where the limit was crossed.
[[nodiscard]] Status check_json_depth(std::string_view text, int max_depth, std::string_view what);

// check_json_depth() then nlohmann::json::parse(). Throws Error "WHAT is not valid JSON: ..."
// (every nlohmann exception, number overflow included, names `what`) or the depth error.
nlohmann::json parse_json(std::string_view text, std::string_view what, int max_depth = kMaxJsonDepth);
// read_input_file() then parse_json(); `what` names the role, the message adds the path.
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what);

// At most `max_chars` bytes of `text` in double quotes, control and non-ASCII bytes escaped as
// \xNN, followed by "... (N bytes)" when cut. For quoting untrusted text in error messages.
std::string quote_prefix(std::string_view text, size_t max_chars = 80);
// `text` as valid UTF-8 for a terminal or a Python str: well-formed UTF-8, newlines and tabs kept;
// every other ASCII control byte (DEL too) and every byte of an ill-formed sequence escaped as
// \xNN. For whole
// error messages that may quote untrusted bytes (a JSON parser's "last read" excerpt).
std::string printable_utf8(std::string_view text);
// A JSON library error as a sentence for users: its text without nlohmann's
// "[json.exception.parse_error.101] " tag ("parse error at line 1, column 2: ...").
std::string json_error_text(const nlohmann::json::exception& e);
// A JSON value printed for an error message: compact, invalid UTF-8 replaced, at most `max_chars`
// bytes (then "..."). Only for values from parse_json() (their depth is bounded).
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 80);

// The integer value of JSON number `v` when lo <= v <= hi. Integral floats (3.0) are accepted;
// 3.5, 1e300, strings, and integers out of range (4294967298 for a 32-bit id) throw Error
// "WHAT must be an integer in [lo, hi], got V." (">= lo" when hi is INT64_MAX; no range when
// lo is INT64_MIN too). `what` should name the file and the field.
int64_t json_to_int(const nlohmann::json& v, int64_t lo, int64_t hi, std::string_view what);
// A JSON array of token ids, each an integer in [0, 2^31 - 1] (json_to_int rules). Throws
// Error "WHAT must be an array of token ids" or "WHAT[i] must be an integer in ...".
std::vector<int32_t> json_to_ids(const nlohmann::json& v, std::string_view what);
// The same for decimal text (an optional '-' and digits only, no spaces, no '+', no exponent).
int64_t parse_int(std::string_view text, int64_t lo, int64_t hi, std::string_view what);

}  // namespace flexh2o
