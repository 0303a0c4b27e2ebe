// The input guards one by one: special files refused without blocking, the capped line reader
// (line numbers, over-long lines skipped with bounded memory, the rest still read), the JSON
// depth scan, error-message quoting, and range-checked integers (no wrap, no float truncation).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <sstream>
#include <streambuf>

#include "core/input_guard.h"

namespace flexh2o {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(msg, part) EXPECT_NE(std::string(msg).find(part), std::string::npos) << (msg)

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("flexh2o-guard-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected flexh2o::Error";
  return "";
}

// Runs `fn` on a thread and fails (instead of hanging the suite) if it does not finish within
// two seconds; `unblock` is then called so the thread can end.
template <typename Fn, typename Unblock>
void expect_returns_quickly(Fn&& fn, Unblock&& unblock) {
  auto f = std::async(std::launch::async, std::forward<Fn>(fn));
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for more than 2 s";
    unblock();
  }
  f.get();
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

TEST(CheckRegularFile, AcceptsARegularFileAndRefusesEverythingElse) {
  TempDir d;
  std::ofstream(d / "f") << "x";
  EXPECT_TRUE(check_regular_file(d / "f", "input").ok());
  fs::create_directory(d / "dir");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);

  const Status dir = check_regular_file(d / "dir", "model config");
  EXPECT_EQ(dir.code(), StatusCode::kInvalid);
  EXPECT_HAS(dir.message(), "model config " + (d / "dir").string() + " is a directory, not a regular file");
  EXPECT_HAS(check_regular_file(d / "fifo", "input").message(), "is a FIFO (named pipe), not a regular file");
  EXPECT_HAS(check_regular_file("/dev/null", "input").message(), "is a character device");
  const Status missing = check_regular_file(d / "nope", "input");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_HAS(missing.message(), "does not exist");
}

TEST(ReadInputFile, RefusesAFifoWithoutBlocking) {
  TempDir d;
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string msg;
  expect_returns_quickly([&] { msg = error_of([&] { read_input_file(fifo, "tokenizer file"); }); },
                         [&] { ::close(::open(fifo.c_str(), O_WRONLY)); });
  EXPECT_HAS(msg, "tokenizer file " + fifo.string() + " is a FIFO");
}

TEST(ReadInputFile, ReadsAFileAndRefusesOneOverTheCap) {
  TempDir d;
  std::ofstream(d / "f") << "0123456789";
  EXPECT_EQ(read_input_file(d / "f", "input"), "0123456789");
  EXPECT_HAS(error_of([&] { read_input_file(d / "f", "input", 4); }), "is 10 bytes, more than the 4 bytes");
}

// ---------------------------------------------------------------------------------------------
// LineReader
// ---------------------------------------------------------------------------------------------

std::vector<std::string> all_lines(LineReader& r) {
  std::vector<std::string> out;
  std::string line;
  for (;;) {
    const auto res = r.next(line);
    if (res == LineReader::Result::kEnd) return out;
    out.push_back(res == LineReader::Result::kLine ? line : "<too long at " + std::to_string(r.line_number()) + ">");
  }
}

TEST(LineReader, SplitsLikeGetline) {
  std::istringstream in("a\n\nb\r\nlast");
  LineReader r(in);
  EXPECT_EQ(all_lines(r), (std::vector<std::string>{"a", "", "b\r", "last"}));
  EXPECT_EQ(r.line_number(), 4);
  std::istringstream empty("");
  LineReader e(empty);
  EXPECT_TRUE(all_lines(e).empty());
  std::istringstream one("x\n");
  LineReader o(one);
  EXPECT_EQ(all_lines(o), (std::vector<std::string>{"x"}));
}

TEST(LineReader, SkipsAnOverLongLineAndKeepsReading) {
  std::istringstream in("12345\n123456\n1234567890123\nok\n123456");
  LineReader r(in, 5, "in.txt");
  EXPECT_EQ(all_lines(r), (std::vector<std::string>{"12345", "<too long at 2>", "<too long at 3>", "ok",
                                                    "<too long at 5>"}));
  EXPECT_EQ(r.too_long_message(), "in.txt: line 5 is longer than 5 bytes; it was skipped.");
}

// A stream of `n` bytes of 'x' without a newline, then "\nafter\n", generated on the fly so the
// test itself holds no big buffer.
class EndlessLine : public std::streambuf {
 public:
  explicit EndlessLine(size_t n) : left_(n), chunk_(1 << 16, 'x') {}

 protected:
  int_type underflow() override {
    if (left_ > 0) {
      const size_t k = std::min(left_, chunk_.size());
      left_ -= k;
      setg(chunk_.data(), chunk_.data(), chunk_.data() + k);
      return traits_type::to_int_type(chunk_[0]);
    }
    if (!tail_done_) {
      tail_done_ = true;
      setg(tail_, tail_, tail_ + 7);
      return traits_type::to_int_type(tail_[0]);
    }
    return traits_type::eof();
  }

 private:
  size_t left_;
  std::string chunk_;
  char tail_[8] = "\nafter\n";
  bool tail_done_ = false;
};

TEST(LineReader, AHundredMegabyteLineNeverBuffersMoreThanTheCap) {
  EndlessLine sb(size_t(100) << 20);
  std::istream in(&sb);
  LineReader r(in, 4096);
  std::string line;
  ASSERT_EQ(r.next(line), LineReader::Result::kTooLong);
  EXPECT_EQ(r.line_number(), 1);
  EXPECT_LE(line.capacity(), size_t(64) << 10);  // at most one chunk was ever appended
  ASSERT_EQ(r.next(line), LineReader::Result::kLine);
  EXPECT_EQ(line, "after");
  EXPECT_EQ(r.line_number(), 2);
  EXPECT_EQ(r.next(line), LineReader::Result::kEnd);
}

TEST(LineReader, ReadsADescriptorAsItArrives) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(p[1], "one\ntw", 6), 6);
  LineReader r(p[0], 100, "pipe");
  std::string line;
  // "one" is complete although the writer is still open: the reader does not wait for more.
  ASSERT_EQ(r.next(line), LineReader::Result::kLine);
  EXPECT_EQ(line, "one");
  ASSERT_EQ(::write(p[1], "o\n", 2), 2);
  ::close(p[1]);
  ASSERT_EQ(r.next(line), LineReader::Result::kLine);
  EXPECT_EQ(line, "two");
  EXPECT_EQ(r.next(line), LineReader::Result::kEnd);
  ::close(p[0]);
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

TEST(CheckJsonDepth, RefusesDeepNestingAndIgnoresBracketsInStrings) {
  EXPECT_TRUE(check_json_depth("[[[1]]]", 3, "x").ok());
  const Status deep = check_json_depth(std::string(100000, '['), 64, "request line 3");
  EXPECT_EQ(deep.code(), StatusCode::kInvalid);
  EXPECT_HAS(deep.message(), "request line 3 nests arrays/objects more than 64 levels deep (at byte 64)");
  EXPECT_FALSE(check_json_depth(R"({"a":{"b":[{}]}})", 3, "x").ok());
  EXPECT_TRUE(check_json_depth(R"(["[[[[", "\"[[[[", {"k]": "{{{"}])", 2, "x").ok());
}

TEST(ParseJson, NamesTheSourceForEveryFailure) {
  EXPECT_EQ(parse_json(R"({"a": [1, 2]})", "f.json")["a"][1], 2);
  EXPECT_HAS(error_of([] { parse_json("[1e999]", "config f.json"); }), "config f.json is not valid JSON");
  EXPECT_HAS(error_of([] { parse_json("{", "f.json"); }), "f.json is not valid JSON");
  EXPECT_HAS(error_of([] { parse_json(std::string(100000, '['), "f.json"); }), "f.json nests");
}

TEST(Quoting, QuotePrefixEscapesAndCuts) {
  EXPECT_EQ(quote_prefix("ab\"c\n\xff", 80), "\"ab\\\"c\\x0a\\xff\"");
  EXPECT_EQ(quote_prefix(std::string(100, 'a'), 3), "\"aaa\"... (100 bytes)");
}

TEST(Quoting, PrintableUtf8KeepsWellFormedTextAndEscapesTheRest) {
  // Kept: ASCII, newlines and tabs, 2-, 3- and 4-byte sequences (é, 語, U+10FFFF, 😀).
  const std::string good = "a\tb\nc \xc3\xa9 \xe8\xaa\x9e \xf4\x8f\xbf\xbf \xf0\x9f\x98\x80";
  EXPECT_EQ(printable_utf8(good), good);
  // Escaped: a stray byte, a truncated sequence, overlong forms, a surrogate, past U+10FFFF, a
  // lone continuation byte, control bytes.
  EXPECT_EQ(printable_utf8("ll\xff"), "ll\\xff");
  EXPECT_EQ(printable_utf8("\xe2\x82"), "\\xe2\\x82");
  EXPECT_EQ(printable_utf8("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable_utf8("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");
  EXPECT_EQ(printable_utf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(printable_utf8("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(printable_utf8("\x80"), "\\x80");
  EXPECT_EQ(printable_utf8(std::string("a\x01\x1b\0b\x7f", 6)), "a\\x01\\x1b\\x00b\\x7f");
  // A good sequence right after a bad byte is kept.
  EXPECT_EQ(printable_utf8("\xff\xc3\xa9"), "\\xff\xc3\xa9");
}

TEST(Quoting, JsonExcerptSurvivesInvalidUtf8AndIsBounded) {
  const nlohmann::json bad = std::string("\xff\xfe");
  EXPECT_NO_THROW(json_excerpt(bad));
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(1000, 'a')), 10), "\"aaaaaaaaa...");
}

// ---------------------------------------------------------------------------------------------
// Integers
// ---------------------------------------------------------------------------------------------

TEST(JsonToInt, RangeCheckedWithoutWrapOrTruncation) {
  using nlohmann::json;
  const int64_t i32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(json_to_int(json::parse("7"), 0, i32, "id"), 7);
  EXPECT_EQ(json_to_int(json::parse("-7"), -10, 10, "id"), -7);
  EXPECT_EQ(json_to_int(json::parse("3.0"), 0, i32, "id"), 3);
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("4294967298"), 0, i32, "t.json: id of \"a\""); }),
             "t.json: id of \"a\" must be an integer in [0, 2147483647], got 4294967298.");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("3.5"), 0, i32, "id"); }), "got 3.5");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("-1"), 0, i32, "id"); }), "got -1");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("1e300"), 0, i32, "id"); }), "must be an integer");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("9.3e18"), INT64_MIN, INT64_MAX, "id"); }), "must be an integer");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("18446744073709551615"), 0, INT64_MAX, "id"); }),
             "must be an integer");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("\"5\""), 0, i32, "id"); }), "got \"5\"");
  EXPECT_HAS(error_of([&] { json_to_int(json::parse("true"), 0, i32, "id"); }), "got true");
}

// int64's own bounds are no limit a field sets, and are not printed as one.
TEST(JsonToInt, Int64BoundsAreNotPrintedAsARange) {
  using nlohmann::json;
  EXPECT_EQ(error_of([&] { json_to_int(json::parse("\"5\""), 0, INT64_MAX, "n"); }),
            "n must be an integer >= 0, got \"5\".");
  EXPECT_EQ(error_of([&] { json_to_int(json::parse("true"), INT64_MIN, INT64_MAX, "seed"); }),
            "seed must be an integer, got true.");
  EXPECT_EQ(error_of([&] { json_to_int(json::parse("9223372036854775808"), INT64_MIN, INT64_MAX, "seed"); }),
            "seed must be an integer that fits in 64 bits (-9223372036854775808 to 9223372036854775807), got "
            "9223372036854775808.");
  EXPECT_EQ(error_of([&] { parse_int("x", -1, INT64_MAX, "k"); }), "k must be an integer >= -1, got \"x\".");
}

TEST(ParseInt, StrictDecimalText) {
  EXPECT_EQ(parse_int("123", 0, 1000, "key"), 123);
  EXPECT_EQ(parse_int("-5", -5, 0, "key"), -5);
  for (const char* bad : {"", " 1", "1 ", "+1", "12abc", "1.0", "1e3", "99999999999999999999", "1001", "-1"})
    EXPECT_HAS(error_of([&] { parse_int(bad, 0, 1000, "key"); }), "key must be an integer in [0, 1000]") << bad;
}

}  // namespace
}  // namespace flexh2o
