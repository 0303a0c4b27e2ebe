// Private: the per-group math of the Q4 row format (core/quant4.h) for the CUDA kernels, in the
// same fp32 operations as the host reference (src/core/quant4.cpp): explicit round-to-nearest
// subtract/divide/fma on the device (no contraction, whatever nvcc's flags), so codes, meta and
// decoded values are bit-identical to the host's. Host-compilable, so the CPU tests can pin it.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/detail/convert_math.h"

namespace flexh2o::gpu::detail::q4m {

inline constexpr uint16_t kNanBits = 0x7e00;  // fp16 quiet NaN: the meta of a refused group

FH_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FH_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FH_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}
FH_HD bool finite16(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

// {d, m} of a group with min mn and max mx: m = f16(mn), d = f16((mx - m) / 15). False (and
// NaN meta) when a value is not finite in fp16 (the group's values lie in [mn, mx] and rounding
// is monotonic, so checking f16(mn) and f16(mx) covers them all; pass NaN for a group holding
// a NaN) or d is not: the host refuses such a group with an error; a kernel cannot throw, so
// the group decodes to NaN, which is visible.
FH_HD bool group_meta(float mn, float mx, uint16_t* d_bits, uint16_t* m_bits) {
  const uint16_t m = f32_to_f16_bits(mn);
  const uint16_t d = f32_to_f16_bits(div_rn(sub_rn(mx, f16_bits_to_f32(m)), 15.f));
  const bool ok = isfinite(mn) && isfinite(mx) && finite16(m) && finite16(f32_to_f16_bits(mx)) && finite16(d);
  *m_bits = ok ? m : kNanBits;
  *d_bits = ok ? d : kNanBits;
  return ok;
}
// q = d == 0 ? 0 : clamp(rint((x - m) / d), 0, 15).
FH_HD uint32_t code(float x, float d, float m) {
  if (d == 0.f) return 0;
  float q = rintf(div_rn(sub_rn(x, m), d));
  q = q < 0.f ? 0.f : (q > 15.f ? 15.f : q);
  return uint32_t(q);
}
// x = fmaf(float(q), d, m).
FH_HD float decode(uint32_t q, float d, float m) { return fma_rn(float(q), d, m); }

FH_HD uint32_t load32(const uint8_t* p) {  // p 4-byte aligned
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
#endif
}

// The eight values of chunk c (elements [8c, 8c+8)) of a record whose meta starts at moff,
// decoded to fp32: one 32-bit word of codes (element 8c+e in bits [4e, 4e+4), the nibble order
// of the format read little-endian) and the {d, m} word of group c/8 (8 divides 64, so a chunk
// never straddles groups). Chunks past the codes read the zero padding; callers mask them.
struct Chunk {
  float v[8];
};
FH_HD int64_t chunks(int64_t cols) { return (cols + 7) / 8; }
FH_HD Chunk decode_chunk(const uint8_t* rec, int64_t moff, int64_t c) {
  const uint32_t q = load32(rec + 4 * c), md = load32(rec + moff + 4 * (c >> 3));
  const float d = f16_bits_to_f32(uint16_t(md & 0xffffu)), m = f16_bits_to_f32(uint16_t(md >> 16));
  Chunk r;
  for (int e = 0; e < 8; ++e) r.v[e] = decode((q >> (4 * e)) & 15u, d, m);
  return r;
}

}  // namespace flexh2o::gpu::detail::q4m
