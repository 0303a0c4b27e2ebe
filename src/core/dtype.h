// Element types of tensors on disk and in memory, with exact scalar conversions.
// Compute is fp32 on the CPU; weights may be stored as f16, bf16 or f32.
// Scalar conversions here are the reference; kernels use vectorised equivalents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace flexh2o {

// Q4: 4-bit group-wise compressed rows (core/quant4.h); it has no element size: a Q4 tensor's
// bytes are q4::tensor_bytes(rows, cols) (TensorView::nbytes()), and dtype_size(Q4) throws.
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, Q4 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "F16", "BF16", ...
// Parses the safetensors spelling; returns false for anything else (e.g. "F8_E4M3").
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, overflow to inf, NaN preserved.
uint16_t f32_to_f16(float f);

}  // namespace flexh2o
