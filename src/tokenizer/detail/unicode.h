// Unicode text transforms behind the tokenizer.json normalizers (NFC/NFD/NFKC/NFKD via
// utf8proc, lowercase, accent stripping, BertNormalizer) and character classes the
// pre-tokenizers need. Pure functions on UTF-8 strings; bytes that are not valid UTF-8 pass
// through unchanged (Hugging Face never sees them: its input is always valid text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flexh2o::tok {

enum class NormForm { kNFC, kNFD, kNFKC, kNFKD };

// Unicode normalization of every valid UTF-8 run of `s`.
std::string unicode_normalize(std::string_view s, NormForm form);
// Per-character full lowercase mapping, as Rust's char::to_lowercase (no context rules).
std::string unicode_lowercase(std::string_view s);
// Drops combining marks (general category M*), as tokenizers' StripAccents.
std::string strip_marks(std::string_view s);

struct BertOptions {
  bool clean_text = true, handle_chinese_chars = true, strip_accents = false, lowercase = true;
};
// tokenizers' BertNormalizer: drop NUL/U+FFFD/control characters and map whitespace to ' ',
// pad CJK ideographs with spaces, NFD + drop non-spacing marks, lowercase (in that order).
std::string bert_normalize(std::string_view s, const BertOptions& opts);

// White_Space property (Rust's char::is_whitespace).
bool is_white_space(uint32_t cp);
// Decodes the code point at s[i] (length *len); false for an invalid or truncated sequence,
// in which case *len is 1.
bool decode_codepoint(std::string_view s, std::size_t i, uint32_t* cp, std::size_t* len);

}  // namespace flexh2o::tok
