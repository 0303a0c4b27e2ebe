// Input guards (input_guard.h): special-file refusal, whole-file and capped line reading, the
// JSON nesting scan, error-message quoting and range-checked integer conversion.
#include "core/input_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <istream>
#include <streambuf>
#include <vector>

namespace flexh2o {

namespace {

// What a non-regular file is, for "X is a FIFO, not a regular file."
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

std::string refusal(std::string_view what, const std::filesystem::path& path, mode_t m) {
  return detail::concat(what, " ", path.string(), " is ", kind_of(m),
                        S_ISREG(m) ? "" : ", not a regular file", "; give a regular file.");
}

// Closes a descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

Status check_regular_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return {StatusCode::kNotFound, detail::concat(what, " ", path.string(), " does not exist.")};
    return {StatusCode::kIoError,
            detail::concat("cannot stat ", what, " ", path.string(), ": ", std::strerror(e), ".")};
  }
  if (!S_ISREG(st.st_mode)) return {StatusCode::kInvalid, refusal(what, path, st.st_mode)};
  return Status::Ok();
}

std::string read_input_file(const std::filesystem::path& path, std::string_view what, size_t max_bytes) {
  check_regular_file(path, what).throw_if_error();
  // O_NONBLOCK: if a FIFO replaced the file since the stat(), open() returns instead of waiting.
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (fd.fd < 0) {
    const int e = errno;
    FH_FAIL("cannot open ", what, " ", path.string(), ": ", std::strerror(e), ".");
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    const int e = errno;
    FH_FAIL("cannot stat ", what, " ", path.string(), ": ", std::strerror(e), ".");
  }
  if (!S_ISREG(st.st_mode)) FH_FAIL(refusal(what, path, st.st_mode));
  if (uint64_t(st.st_size) > max_bytes)
    FH_FAIL(what, " ", path.string(), " is ", st.st_size, " bytes, more than the ", max_bytes,
            " bytes a file of this kind may have.");
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd.fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      FH_FAIL("cannot read ", what, " ", path.string(), ": ", std::strerror(e), ".");
    }
    if (n == 0) break;  // shrank while reading: use what is there
    got += size_t(n);
  }
  out.resize(got);
  return out;
}

std::string read_input_fd(int fd, std::string_view what, size_t max_bytes) {
  std::string out;
  std::vector<char> buf(size_t(64) << 10);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      FH_FAIL("cannot read ", what, ": ", std::strerror(e), ".");
    }
    if (n == 0) return out;
    if (out.size() + size_t(n) > max_bytes)
      FH_FAIL(what, " holds more than the ", max_bytes, " bytes an input of this kind may have.");
    out.append(buf.data(), size_t(n));
  }
}

// ---------------------------------------------------------------------------------------------
// LineReader
// ---------------------------------------------------------------------------------------------

namespace {
constexpr size_t kChunk = 64 << 10;
}

LineReader::LineReader(std::istream& in, size_t max_line_bytes, std::string name)
    : in_(&in), max_(max_line_bytes), name_(std::move(name)), buf_(kChunk) {}

LineReader::LineReader(int fd, size_t max_line_bytes, std::string name)
    : fd_(fd), max_(max_line_bytes), name_(std::move(name)), buf_(kChunk) {}

bool LineReader::refill() {
  pos_ = len_ = 0;
  if (eof_) return false;
  if (in_ != nullptr) {
    // Take what the stream has buffered; block for one byte only when it has none, so a
    // terminal or pipe is processed line by line.
    std::streambuf* sb = in_->rdbuf();
    if (sb == nullptr) return !(eof_ = true);
    std::streamsize avail = sb->in_avail();
    if (avail <= 0) {
      const int c = sb->sbumpc();
      if (c == std::char_traits<char>::eof()) return !(eof_ = true);
      buf_[0] = char(c);
      len_ = 1;
      avail = sb->in_avail();
    }
    if (avail > 0) len_ += size_t(sb->sgetn(buf_.data() + len_, std::min<std::streamsize>(avail, kChunk - len_)));
    return true;
  }
  for (;;) {
    const ssize_t n = ::read(fd_, buf_.data(), buf_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      FH_FAIL("cannot read ", name_, " after line ", line_no_, ": ", std::strerror(e), ".");
    }
    if (n == 0) return !(eof_ = true);
    len_ = size_t(n);
    return true;
  }
}

LineReader::Result LineReader::next(std::string& line) {
  line.clear();
  while (skipping_) {  // the rest of the over-long line reported last time
    if (pos_ == len_ && !refill()) {
      skipping_ = false;
      return Result::kEnd;
    }
    const char* nl = static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', len_ - pos_));
    if (nl != nullptr) {
      pos_ = size_t(nl - buf_.data()) + 1;
      skipping_ = false;
    } else {
      pos_ = len_;
    }
  }
  if (pos_ == len_ && !refill()) return Result::kEnd;
  ++line_no_;
  for (;;) {
    const char* start = buf_.data() + pos_;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
    const size_t take = nl != nullptr ? size_t(nl - start) : len_ - pos_;
    if (take > max_ - line.size()) {
      line.clear();
      if (nl != nullptr) {
        pos_ += take + 1;
      } else {
        pos_ = len_;
        skipping_ = true;
      }
      return Result::kTooLong;
    }
    line.append(start, take);
    if (nl != nullptr) {
      pos_ += take + 1;
      return Result::kLine;
    }
    pos_ = len_;
    if (!refill()) return Result::kLine;  // a last line without '\n'
  }
}

std::string LineReader::too_long_message() const {
  return detail::concat(name_, ": line ", line_no_, " is longer than ", max_, " bytes; it was skipped.");
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

Status check_json_depth(std::string_view text, int max_depth, std::string_view what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return {StatusCode::kInvalid, detail::concat(what, " nests arrays/objects more than ", max_depth,
                                                     " levels deep (at byte ", i, "); refusing it.")};
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // unbalanced text is the parser's to report
    }
  }
  return Status::Ok();
}

nlohmann::json parse_json(std::string_view text, std::string_view what, int max_depth) {
  check_json_depth(text, max_depth, what).throw_if_error();
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    FH_FAIL(what, " is not valid JSON: ", json_error_text(e));
  }
}

std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string_view w = e.what();
  if (w.starts_with("[json.exception.")) {
    if (const size_t end = w.find("] "); end != std::string_view::npos) return std::string(w.substr(end + 2));
  }
  return std::string(w);
}

nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what) {
  const std::string text = read_input_file(path, what);
  return parse_json(text, detail::concat(what, " ", path.string()));
}

std::string quote_prefix(std::string_view text, size_t max_chars) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  const size_t n = std::min(text.size(), max_chars);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  out += '"';
  if (n < text.size()) out += detail::concat("... (", text.size(), " bytes)");
  return out;
}

std::string printable_utf8(std::string_view text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      if ((c >= 0x20 && c != 0x7f) || c == '\n' || c == '\t') out += char(c);
      else escape(c);
      ++i;
      continue;
    }
    // The length and the first continuation byte's range of a well-formed sequence (RFC 3629:
    // no overlong forms, no surrogates, nothing past U+10FFFF); 0: no sequence starts here.
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c == 0xe0) n = 3, lo = 0xa0;
    else if (c == 0xed) n = 3, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef) n = 3;
    else if (c == 0xf0) n = 4, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3) n = 4;
    else if (c == 0xf4) n = 4, hi = 0x8f;
    bool ok = n > 0 && i + n <= text.size() && byte(i + 1) >= lo && byte(i + 1) <= hi;
    for (size_t k = 2; ok && k < n; ++k) ok = byte(i + k) >= 0x80 && byte(i + k) <= 0xbf;
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string json_excerpt(const nlohmann::json& v, size_t max_chars) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) {
    s.resize(max_chars);
    s += "...";
  }
  return s;
}

namespace {
// int64's own bounds are no limit the field sets: "an integer >= 0" reads better than
// "in [0, 9223372036854775807]", and "an integer" than both bounds.
[[noreturn]] void int_range_error(std::string_view what, int64_t lo, int64_t hi, const std::string& got) {
  if (lo == INT64_MIN && hi == INT64_MAX) FH_FAIL(what, " must be an integer, got ", got, ".");
  if (hi == INT64_MAX) FH_FAIL(what, " must be an integer >= ", lo, ", got ", got, ".");
  FH_FAIL(what, " must be an integer in [", lo, ", ", hi, "], got ", got, ".");
}
}  // namespace

int64_t json_to_int(const nlohmann::json& v, int64_t lo, int64_t hi, std::string_view what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (hi >= 0 && u <= uint64_t(hi) && int64_t(u) >= lo) return int64_t(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= lo && i <= hi) return i;
  } else if (v.is_number_float()) {
    // Integral and inside [lo, hi] as a double; the bounds are compared in double so that
    // 2^63 and beyond never reach the int64 conversion (undefined behaviour).
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= double(lo) && d <= double(hi) && d < 9223372036854775808.0) {
      const auto i = int64_t(d);
      if (i >= lo && i <= hi) return i;
    }
  }
  // An integer past int64 where any int64 is taken (a seed): say which integers.
  const bool integral = v.is_number_unsigned() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                   v.get<double>() == std::floor(v.get<double>()));
  if (integral && lo == INT64_MIN && hi == INT64_MAX)
    FH_FAIL(what, " must be an integer that fits in 64 bits (", lo, " to ", hi, "), got ", json_excerpt(v), ".");
  int_range_error(what, lo, hi, json_excerpt(v));
}

std::vector<int32_t> json_to_ids(const nlohmann::json& v, std::string_view what) {
  if (!v.is_array()) FH_FAIL(what, " must be an array of token ids, got ", json_excerpt(v), ".");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(int32_t(json_to_int(v[i], 0, INT32_MAX, detail::concat(what, "[", i, "]"))));
  return ids;
}

int64_t parse_int(std::string_view text, int64_t lo, int64_t hi, std::string_view what) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < lo || v > hi)
    int_range_error(what, lo, hi, quote_prefix(text, 40));
  return v;
}

}  // namespace flexh2o
