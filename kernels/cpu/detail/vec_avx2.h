// Private: AVX2 + FMA + F16C vector traits (8 fp32 lanes) for the kernel templates.
// Include only from isa_avx2.cpp (compiled with -mavx2 -mfma -mf16c); everything here has
// internal linkage so no AVX2 code can leak into other translation units.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/detail/isa.h"

namespace flexh2o::cpu::detail {
namespace {

struct VecAvx2 {
  using V = __m256;
  static constexpr int L = 8;
  static constexpr int MR = 3, NR = 4;  // linear register tile: 12 accumulators
  // No x prefetch in the packed linear: 256 B ahead gained nothing on the same Xeon (-2% to
  // +1%; RESULTS, 2026-12-03).
  static constexpr int X_PREFETCH = 0;
  static constexpr int Q4_MQ = 4;  // x rows per Q4 direct-path tile (linear_direct_q4)
  static constexpr int q4_nq(int mq) { return mq <= 2 ? 4 : 2; }  // w rows per Q4 tile
  static constexpr int PV_Q = 2, PV_V = 4;

  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float f) { return _mm256_set1_ps(f); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const half_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V load(const bf16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // n in [1, L): lanes >= n are 0 and their memory is not touched.
  static V load_tail(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  template <typename T16>
  static V load_tail(const T16* p, int n) {
    T16 buf[8] = {};
    std::memcpy(buf, p, size_t(n) * sizeof(T16));
    return load(buf);
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // Q4 (core/quant4.h): 8 codes (4 bytes, low nibble first) broadcast to every lane, lane i
  // shifted to nibble i, then fmaf(q, d, m) with the group's {d, m} (q4_group, once per
  // group); one rounding, so bit-identical to q4::decode_rows.
  struct Q4G {
    V d, m;
  };
  static Q4G q4_group(const uint8_t* meta) {
    int32_t dm;
    std::memcpy(&dm, meta, 4);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));  // lanes: d, m
    return {_mm256_broadcastss_ps(f), _mm256_broadcastss_ps(_mm_movehdup_ps(f))};
  }
  static V q4_decode(const Q4G& g, int32_t bytes4) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(bytes4), sh), _mm256_set1_epi32(0xf));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), g.d, g.m);
  }
  static V q4_vec(const Q4G& g, const uint8_t* codes) {
    int32_t c;
    std::memcpy(&c, codes, 4);
    return q4_decode(g, c);
  }
  static V q4_vec_tail(const Q4G& g, const uint8_t* codes, int n) {
    int32_t c = 0;
    std::memcpy(&c, codes, size_t(n + 1) / 2);
    return _mm256_and_ps(q4_decode(g, c), _mm256_castsi256_ps(mask(n)));
  }
  static V load_q4(const uint8_t* codes, const uint8_t* meta) { return q4_vec(q4_group(meta), codes); }
  static V load_q4_tail(const uint8_t* codes, const uint8_t* meta, int n) {
    return q4_vec_tail(q4_group(meta), codes, n);
  }
  // Conversions for to_f32/from_f32, bit-identical to core/dtype.h. vcvtph2ps quiets
  // signalling NaNs (sets bit 22); the reference keeps them, so those lanes flip it back.
  static V load_exact(const half_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i w = _mm256_cvtepu16_epi32(h), f = _mm256_castps_si256(_mm256_cvtph_ps(h));
    const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)),
                                           _mm256_set1_epi32(0x7c00));
    const __m256i quiet_or_inf = _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x1ff)),
                                                    _mm256_setzero_si256());
    const __m256i snan = _mm256_andnot_si256(quiet_or_inf, nan);
    return _mm256_castsi256_ps(_mm256_xor_si256(f, _mm256_and_si256(snan, _mm256_set1_epi32(0x00400000))));
  }
  static void store(half_t* p, V v) {  // round to nearest even, as f32_to_f16
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store(bf16_t* p, V v) {  // f32_to_bf16: round to nearest even, NaN -> quiet NaN
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                 _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Every lane is in [0, 0xffff], so the saturating pack is exact.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  static void store_tail(float* p, V v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2i(V n) {
    __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
  }
  static float hmax(V a) {
    alignas(32) float f[8];
    store(f, a);
    float m = f[0];
    for (int i = 1; i < 8; ++i) m = f[i] > m ? f[i] : m;
    return m;
  }

  // Fixed tree per lane: 256->128 halves, {0+2,1+3}, {0+1}; grouping never changes bits.
  static V lvl1(V a, V b) {
    return add(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  static V lvl3(V a, V b) {
    return add(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  static V lvl4(V a, V b) {
    return add(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  template <int G>  // G in {1, 2, 4, 8}
  static void reduce_group(const V* acc, float* out) {
    static_assert(G == 1 || G == 2 || G == 4 || G == 8);
    V t[4], v[2];
    constexpr int n1 = G > 1 ? G / 2 : 1, n3 = n1 > 1 ? n1 / 2 : 1;
    for (int i = 0; i < n1; ++i) t[i] = lvl1(acc[2 * i], acc[G > 1 ? 2 * i + 1 : 0]);
    for (int i = 0; i < n3; ++i) v[i] = lvl3(t[2 * i], t[n1 > 1 ? 2 * i + 1 : 0]);
    const V r = lvl4(v[0], v[n3 > 1 ? 1 : 0]);
    // Accumulator o's sum is in lane 4 * (o % 2) + o / 2.
    const V p = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if constexpr (G == 8) store(out, p);
    else store_tail(out, p, G);
  }
  template <int G>
  static void reduce(const V* acc, float* out) {
    constexpr int P = G >= 8 ? 8 : G >= 4 ? 4 : G >= 2 ? 2 : 1;
    reduce_group<P>(acc, out);
    if constexpr (G > P) reduce<G - P>(acc + P, out + P);
  }
};

}  // namespace
}  // namespace flexh2o::cpu::detail
