// The normalizers' Unicode work: utf8proc does normalization, case mapping and categories;
// this file walks valid UTF-8 runs (invalid bytes are copied as they are) and implements the
// tokenizers-specific rules (StripAccents, BertNormalizer).
#include "tokenizer/detail/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "tokenizer/detail/utf8.h"

namespace flexh2o::tok {

bool decode_codepoint(std::string_view s, std::size_t i, uint32_t* cp, std::size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  *len = utf8_char_len(s, i);
  if (c < 0x80) {
    *cp = c;
    return true;
  }
  if (*len == 1) return false;
  uint32_t v = c & (0xFF >> (*len + 1));
  for (std::size_t k = 1; k < *len; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *cp = v;
  return true;
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

// Calls fn(cp) for each valid code point, out.append(raw byte) for each invalid byte.
template <typename Fn>
std::string map_codepoints(std::string_view s, Fn&& fn) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp = 0;
  std::size_t len = 0;
  for (std::size_t i = 0; i < s.size(); i += len) {
    if (decode_codepoint(s, i, &cp, &len)) fn(cp, out);
    else out.push_back(s[i]);
  }
  return out;
}

bool is_mark(uint32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

// tokenizers' bert is_control: categories Cc/Cf/Cs/Co/Cn, except tab, LF and CR.
bool is_bert_control(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CN;
}

bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void normalize_run(std::string_view run, utf8proc_option_t opts, std::string& out) {
  if (run.empty()) return;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          static_cast<utf8proc_ssize_t>(run.size()), &dst, opts);
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  // The run was validated as UTF-8 already, so only running out of memory can fail here.
  FH_CHECK(n >= 0, "Unicode normalization failed: ", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
}

}  // namespace

std::string unicode_normalize(std::string_view s, NormForm form) {
  int opts = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::kNFC: opts |= UTF8PROC_COMPOSE; break;
    case NormForm::kNFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NormForm::kNFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::kNFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  std::string out;
  out.reserve(s.size());
  std::size_t run = 0, i = 0;
  while (i < s.size()) {
    const std::size_t len = utf8_char_len(s, i);
    if (len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {  // an invalid byte ends the run
      normalize_run(s.substr(run, i - run), static_cast<utf8proc_option_t>(opts), out);
      out.push_back(s[i]);
      run = i + 1;
    }
    i += len;
  }
  normalize_run(s.substr(run), static_cast<utf8proc_option_t>(opts), out);
  return out;
}

std::string unicode_lowercase(std::string_view s) {
  return map_codepoints(s, [](uint32_t cp, std::string& out) {
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping: "i" + U+0307
      out.append("i\xCC\x87");
      return;
    }
    append_codepoint(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  });
}

std::string strip_marks(std::string_view s) {
  return map_codepoints(s, [](uint32_t cp, std::string& out) {
    if (!is_mark(cp)) append_codepoint(out, cp);
  });
}

std::string bert_normalize(std::string_view s, const BertOptions& o) {
  std::string t(s);
  if (o.clean_text)
    t = map_codepoints(t, [](uint32_t cp, std::string& out) {
      if (cp == 0 || cp == 0xFFFD || is_bert_control(cp)) return;
      append_codepoint(out, is_white_space(cp) ? ' ' : cp);
    });
  if (o.handle_chinese_chars)
    t = map_codepoints(t, [](uint32_t cp, std::string& out) {
      if (!is_cjk(cp)) return append_codepoint(out, cp);
      out.push_back(' ');
      append_codepoint(out, cp);
      out.push_back(' ');
    });
  if (o.strip_accents)
    t = map_codepoints(unicode_normalize(t, NormForm::kNFD), [](uint32_t cp, std::string& out) {
      if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_MN) append_codepoint(out, cp);
    });
  if (o.lowercase) t = unicode_lowercase(t);
  return t;
}

}  // namespace flexh2o::tok
