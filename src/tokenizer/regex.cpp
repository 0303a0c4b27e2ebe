// PCRE2 wrapper for the tokenizer: compiles with UTF, UCP and MATCH_INVALID_UTF, JIT when
// available, and enumerates matches. Not a regex engine of our own.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/detail/regex.h"

#include "core/error.h"

namespace flexh2o::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  std::string what;
  ~Code() { pcre2_code_free(code); }
};

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    FH_CHECK(md != nullptr, "out of memory creating PCRE2 match data");
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

std::string pcre2_message(int err) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(err, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view what) : code_(std::make_unique<Code>()) {
  code_->what = what;
  int err = 0;
  PCRE2_SIZE off = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (code_->code == nullptr)
    FH_FAIL(what, ": cannot compile regex '", pattern, "' at offset ", off, ": ", pcre2_message(err));
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back silently
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  MatchData md(code_->code);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // Oniguruma's iteration, as tokenizers uses it: an empty match is kept unless it sits where
  // the previous match ended; then the search resumes one character further on.
  std::size_t start = 0, last_match_end = std::string_view::npos;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, 0, md.md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_JIT, md.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) FH_FAIL(code_->what, ": regex match failed: ", pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
    const std::size_t b = ov[0], e = ov[1];
    if (e == b && e == last_match_end) {
      ++start;  // step over one (possibly multi-byte) character
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    out.emplace_back(b, e);
    start = last_match_end = e;
  }
  return out;
}

std::string replace_spans(std::string_view text, const std::vector<std::pair<std::size_t, std::size_t>>& spans,
                          std::string_view with) {
  std::string out;
  std::size_t prev = 0;
  for (auto [b, e] : spans) {
    out.append(text.substr(prev, b - prev));
    out.append(with);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

std::string Regex::replace_all(std::string_view text, std::string_view with) const {
  return replace_spans(text, find_all(text), with);
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace flexh2o::tok
