// Fuzz target: a JSONL request file read by cli::for_each_jsonl, the line reader of generate,
// tokenize, detokenize and eval. Bad lines must be reported one by one (line number, message)
// while the others are still processed: every non-blank line reaches exactly one callback, in
// order. (The per-field request parse of generate is private to cmd_generate.cpp.)
#include <sstream>

#include "cli/common.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flexh2o;
  const std::string_view text = fuzz::as_text(data, size);
  // The lines the reader must visit: numbered from 1, split at '\n', blank = only " \t\r".
  std::vector<int64_t> expect;
  int64_t lineno = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    ++lineno;
    if (text.substr(pos, nl - pos).find_first_not_of(" \t\r") != std::string_view::npos) expect.push_back(lineno);
    pos = nl + 1;
  }
  std::vector<int64_t> seen;
  int64_t errors = 0;
  std::istringstream in{std::string(text)};
  int64_t bad = 0;
  fuzz::expect_clean("", [&] {
    bad = cli::for_each_jsonl(
        in,
        [&](int64_t line, const nlohmann::json& j) {
          if (!j.is_object()) fuzz::finding("a line that is not a JSON object reached the request callback");
          seen.push_back(line);
        },
        [&](int64_t line, const std::string& msg) {
          if (msg.empty()) fuzz::finding("a bad line was reported with an empty message");
          seen.push_back(line);
          ++errors;
        });
  });
  if (bad != errors) fuzz::finding("for_each_jsonl's bad-line count differs from its on_error calls");
  if (seen != expect) fuzz::finding("for_each_jsonl did not visit every non-blank line exactly once, in order");
  return 0;
}
