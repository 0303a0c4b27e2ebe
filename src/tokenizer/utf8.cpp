// UTF-8 validation/lossy repair and the GPT-2 byte <-> printable-code-point alphabet.
// See detail/utf8.h; used by encoding (byte-level mapping) and by both decoders.
#include "tokenizer/detail/utf8.h"

namespace flexh2o::tok {

namespace {

// Valid range of the second byte for a given lead byte (Unicode Table 3-7).
bool second_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

// Expected length for a lead byte, 0 when it cannot start a sequence.
std::size_t lead_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Number of leading bytes at s[i..] forming a valid prefix of the sequence (up to its length).
std::size_t valid_prefix(std::string_view s, std::size_t i, std::size_t n) {
  std::size_t k = 1;
  while (k < n && i + k < s.size()) {
    auto b = static_cast<unsigned char>(s[i + k]);
    bool ok = (k == 1) ? second_ok(static_cast<unsigned char>(s[i]), b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace

std::size_t utf8_char_len(std::string_view s, std::size_t i) {
  std::size_t n = lead_len(static_cast<unsigned char>(s[i]));
  if (n <= 1) return 1;
  return valid_prefix(s, i, n) == n ? n : 1;
}

std::size_t append_utf8_lossy(std::string_view in, std::string& out, bool final) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::size_t i = 0;
  while (i < in.size()) {
    auto c = static_cast<unsigned char>(in[i]);
    std::size_t n = lead_len(c);
    if (n == 1) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (n == 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    std::size_t k = valid_prefix(in, i, n);
    if (k == n) {
      out.append(in.substr(i, n));
      i += n;
    } else if (i + k == in.size() && !final) {
      break;  // truncated but may still complete: hold back
    } else {
      out.append(kReplacement);
      i += k;
    }
  }
  return i;
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  cp_to_byte.fill(-1);
  // Printable bytes map to themselves; the rest are shifted to 256, 257, ... in byte order.
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
    append_codepoint(byte_to_utf8[b], cp);
    cp_to_byte[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;  // immutable after first use; init is thread-safe
  return alphabet;
}

std::string byte_level_encode(std::string_view bytes) {
  const auto& a = byte_level_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(a.byte_to_utf8[static_cast<unsigned char>(c)]);
  return out;
}

std::string byte_level_decode(std::string_view s) {
  const auto& a = byte_level_alphabet();
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_char_len(s, i);
    uint32_t cp = static_cast<unsigned char>(s[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
    if (n <= 2 && cp < 512 && a.cp_to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(a.cp_to_byte[cp]));
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace flexh2o::tok
