// Private: bit-level F32 <-> F16 / BF16 conversions for the CUDA kernels, the same integer
// algorithms as the host reference in src/core/dtype.h (round-to-nearest-even, overflow to
// inf, NaN kept quiet with its payload), so device and host agree bit for bit, NaNs included
// (the cvt intrinsics return a canonical NaN). Host-compilable: tested on the CPU too.
#pragma once

#include <cstdint>
#include <cstring>

#ifndef FH_HD
#if defined(__CUDACC__)
#define FH_HD __host__ __device__ __forceinline__
#else
#define FH_HD inline
#endif
#endif

namespace flexh2o::gpu::detail {

FH_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
FH_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Exact widening (every f16 / bf16 value is an f32 value).
FH_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
FH_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu, u;
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
  return f32_from_bits(u);
}

// Round-to-nearest-even narrowing.
FH_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
FH_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (absu < 0x38800000u) {                                   // subnormal or zero
    if (absu < 0x33000000u) return uint16_t(sign);            // < 2^-25 rounds to 0
    const uint32_t exp = absu >> 23, man = (absu & 0x7fffffu) | 0x800000u, shift = 126 - exp;
    uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

}  // namespace flexh2o::gpu::detail
