// DType names/sizes and the f32 -> f16 rounding conversion.
#include "core/dtype.h"

#include "core/error.h"

namespace flexh2o {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::Q4: FH_CHECK(false, "Q4 has no element size: its bytes are q4::row_bytes(cols) per row");
  }
  FH_CHECK(false, "unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::Q4: return "Q4";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr struct { std::string_view n; DType t; } kTable[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}};
  for (const auto& e : kTable) {
    if (e.n == name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (absu < 0x38800000u) {  // result is subnormal or zero
    if (absu < 0x33000000u) return uint16_t(sign);  // < 2^-25 rounds to 0
    uint32_t exp = absu >> 23;
    uint32_t man = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) ... map to 10-bit subnormal
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

}  // namespace flexh2o
