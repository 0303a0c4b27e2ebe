// Private: AVX-512 vector traits (16 fp32 lanes) for the kernel templates.
// Include only from isa_avx512.cpp (compiled with -mavx512f/bw/vl -mfma -mf16c); everything
// here has internal linkage so no AVX-512 code can leak into other translation units.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/detail/isa.h"

namespace flexh2o::cpu::detail {
namespace {

struct VecAvx512 {
  using V = __m512;
  static constexpr int L = 16;
  static constexpr int MR = 4, NR = 6;  // linear register tile: 24 accumulators
  // Floats ahead that the packed linear prefetches its x rows (256 B): the 4 x streams come
  // from L2, and on an AVX-512 Xeon this was 3-9% faster at prefill shapes (bench/RESULTS.md,
  // 2026-12-03; not measured on Zen 4).
  static constexpr int X_PREFETCH = 64;
  static constexpr int Q4_MQ = 4;  // x rows per Q4 direct-path tile (linear_direct_q4)
  static constexpr int q4_nq(int mq) { return mq <= 2 ? 8 : 4; }  // w rows per Q4 tile
  static constexpr int PV_Q = 4, PV_V = 4;  // attention P.V tile: queries x vectors of d

  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float f) { return _mm512_set1_ps(f); }
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const half_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load(const bf16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // n in [1, L): lanes >= n are 0 and their memory is not touched.
  static V load_tail(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static V load_tail(const half_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p));
  }
  static V load_tail(const bf16_t* p, int n) {
    __m256i h = _mm256_maskz_loadu_epi16(mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // Q4 (core/quant4.h). A group's 16 possible values fmaf(q, d, m), q = 0..15, are one
  // vector (the table; one rounding each, so bit-identical to q4::decode_rows); a vector of
  // 16 codes (8 bytes, low nibble first) is then a lookup: lane i's dword holds the code
  // bytes shifted so that nibble i is its low 4 bits, and vpermps reads only those.
  using Q4G = V;
  static Q4G q4_group(const uint8_t* meta) {
    int32_t dm;
    std::memcpy(&dm, meta, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));  // lanes: d, m
    const V iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(iota, _mm512_broadcastss_ps(f), _mm512_broadcastss_ps(_mm_movehdup_ps(f)));
  }
  static __m512i q4_index(__m128i bytes8) {  // lanes 0-7: code bytes 0-3, lanes 8-15: 4-7
    const __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    return _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, _mm512_castsi128_si512(bytes8)), sh);
  }
  static V q4_vec(const Q4G& g, const uint8_t* codes) {
    return _mm512_permutexvar_ps(q4_index(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))), g);
  }
  static V q4_vec_tail(const Q4G& g, const uint8_t* codes, int n) {
    const __m128i b = _mm_maskz_loadu_epi8(__mmask16((1u << ((n + 1) / 2)) - 1u), codes);
    return _mm512_maskz_permutexvar_ps(mask(n), q4_index(b), g);
  }
  static V load_q4(const uint8_t* codes, const uint8_t* meta) { return q4_vec(q4_group(meta), codes); }
  static V load_q4_tail(const uint8_t* codes, const uint8_t* meta, int n) {
    return q4_vec_tail(q4_group(meta), codes, n);
  }
  // Conversions for to_f32/from_f32, bit-identical to core/dtype.h. vcvtph2ps quiets
  // signalling NaNs (sets bit 22); the reference keeps them, so those lanes flip it back.
  static V load_exact(const half_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512i w = _mm512_cvtepu16_epi32(h), f = _mm512_castps_si512(_mm512_cvtph_ps(h));
    const __mmask16 snan =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7e00)), _mm512_set1_epi32(0x7c00)) &
        _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x1ff));
    return _mm512_castsi512_ps(_mm512_mask_xor_epi32(f, snan, f, _mm512_set1_epi32(0x00400000)));
  }
  static void store(half_t* p, V v) {  // round to nearest even, as f32_to_f16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(bf16_t* p, V v) {  // f32_to_bf16: round to nearest even, NaN -> quiet NaN
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static void store_tail(float* p, V v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2i(V n) {  // 2^n for integral n in [-126, 127]
    __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(i, 23));
  }
  static float hmax(V a) { return _mm512_reduce_max_ps(a); }  // exact in any order

  // Fixed summation tree, applied to groups of accumulators at once. Per lane it is always
  // 512->256 halves, 256->128 halves, {0+2,1+3}, {0+1}, so pairing accumulators (or pairing
  // one with itself) never changes an output's bits.
  static V lvl1(V a, V b) {
    return add(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  static V lvl2(V a, V b) {
    return add(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  }
  static V lvl3(V a, V b) {
    return add(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  static V lvl4(V a, V b) {
    return add(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  // Reduces G (1, 2, 4, 8 or 16) accumulators; out[i] = sum of acc[i].
  template <int G>
  static void reduce_group(const V* acc, float* out) {
    static_assert(G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
    V t[8], u[4], v[2];
    constexpr int n1 = G > 1 ? G / 2 : 1, n2 = n1 > 1 ? n1 / 2 : 1, n3 = n2 > 1 ? n2 / 2 : 1;
    for (int i = 0; i < n1; ++i) t[i] = lvl1(acc[2 * i], acc[G > 1 ? 2 * i + 1 : 0]);
    for (int i = 0; i < n2; ++i) u[i] = lvl2(t[2 * i], t[n1 > 1 ? 2 * i + 1 : 0]);
    for (int i = 0; i < n3; ++i) v[i] = lvl3(u[2 * i], u[n2 > 1 ? 2 * i + 1 : 0]);
    const V r = lvl4(v[0], v[n3 > 1 ? 1 : 0]);
    // Accumulator o's sum is in lane 4 * (o % 4) + o / 4.
    const __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const V p = _mm512_permutexvar_ps(at, r);
    if constexpr (G == 16) store(out, p);
    else store_tail(out, p, G);
  }
  template <int G>
  static void reduce(const V* acc, float* out) {
    if constexpr (G >= 16) {
      reduce_group<16>(acc, out);
      if constexpr (G > 16) reduce<G - 16>(acc + 16, out + 16);
    } else {
      constexpr int P = G >= 8 ? 8 : G >= 4 ? 4 : G >= 2 ? 2 : 1;
      reduce_group<P>(acc, out);
      if constexpr (G > P) reduce<G - P>(acc + P, out + P);
    }
  }
};

}  // namespace
}  // namespace flexh2o::cpu::detail
