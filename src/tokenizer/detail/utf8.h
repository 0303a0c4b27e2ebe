// UTF-8 helpers and the GPT-2 byte-level alphabet, private to the tokenizer module.
// Not a general Unicode library: no normalisation or case mapping.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flexh2o::tok {

// Length in bytes of the UTF-8 character starting at s[i] if it is complete and valid,
// otherwise 1 (an invalid or truncated sequence is treated as a single raw byte).
std::size_t utf8_char_len(std::string_view s, std::size_t i);

// Appends `in` to `out` with every invalid UTF-8 sequence replaced by U+FFFD (one per maximal
// invalid subpart, as Python's errors="replace" and Rust's from_utf8_lossy). If `final` is
// false, an incomplete but so-far-valid sequence at the end is not consumed. Returns the
// number of bytes of `in` consumed.
std::size_t append_utf8_lossy(std::string_view in, std::string& out, bool final);

// Appends the UTF-8 encoding of code point cp.
void append_codepoint(std::string& out, uint32_t cp);

// GPT-2 byte-level alphabet: each byte maps to a printable code point (e.g. ' ' -> U+0120 'Ġ').
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // the code point of each byte, UTF-8 encoded
  // Inverse: code point (< 512) -> byte, or -1 when the code point is not in the alphabet.
  std::array<int16_t, 512> cp_to_byte;
  ByteLevelAlphabet();
};
const ByteLevelAlphabet& byte_level_alphabet();

// Maps raw bytes to their byte-level string ("a b" -> "aĠb").
std::string byte_level_encode(std::string_view bytes);
// Maps a byte-level string back to bytes; characters outside the alphabet are kept as UTF-8.
std::string byte_level_decode(std::string_view s);

}  // namespace flexh2o::tok
