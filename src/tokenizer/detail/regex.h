// Thin RAII wrapper over a compiled PCRE2 pattern (UTF + UCP), private to the tokenizer.
// Immutable after construction; find_all/replace_all allocate their own match data, so one
// Regex may be used from many threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flexh2o::tok {

class Regex {
 public:
  // Throws flexh2o::Error naming `what` (e.g. "tokenizer.json pre_tokenizer Split") on a bad pattern.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Non-overlapping matches, left to right, as [begin, end) byte offsets. Empty matches are
  // included except one at the end of the previous match (Oniguruma's rule, which tokenizers'
  // Split and Replace follow). Invalid UTF-8 in `text` never matches (PCRE2_MATCH_INVALID_UTF).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;
  // Replaces every match with `with` (literal).
  std::string replace_all(std::string_view text, std::string_view with) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

// Escapes a literal string for use inside a PCRE2 pattern.
// text with every [begin, end) span (sorted, disjoint) replaced by `with`.
std::string replace_spans(std::string_view text, const std::vector<std::pair<std::size_t, std::size_t>>& spans,
                          std::string_view with);

std::string regex_escape(std::string_view literal);

}  // namespace flexh2o::tok
