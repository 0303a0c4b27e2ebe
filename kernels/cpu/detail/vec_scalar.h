// Private: portable vector traits (8 emulated fp32 lanes, plain loops the compiler may
// auto-vectorise with the baseline ISA). Include only from isa_scalar.cpp. Same lane layout
// and summation tree as the AVX2 variant, but multiply-then-add instead of fused FMA.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/detail/isa.h"

namespace flexh2o::cpu::detail {
namespace {

struct VecScalar {
  struct V {
    float v[8];
  };
  static constexpr int L = 8;
  static constexpr int MR = 2, NR = 4;
  static constexpr int X_PREFETCH = 0;
  static constexpr int Q4_MQ = 4;  // x rows per Q4 direct-path tile (linear_direct_q4)
  static constexpr int q4_nq(int mq) { return mq <= 2 ? 4 : 2; }  // w rows per Q4 tile
  static constexpr int PV_Q = 2, PV_V = 2;

  template <typename F>
  static V map(F f) {
    V r;
    for (int i = 0; i < L; ++i) r.v[i] = f(i);
    return r;
  }
  static V zero() { return map([](int) { return 0.f; }); }
  static V set1(float f) { return map([f](int) { return f; }); }
  static float cvt(float f) { return f; }
  static float cvt(half_t h) { return f16_to_f32(h.bits); }
  static float cvt(bf16_t h) { return bf16_to_f32(h.bits); }
  template <typename T>
  static V load(const T* p) { return map([p](int i) { return cvt(p[i]); }); }
  template <typename T>
  static V load_tail(const T* p, int n) { return map([p, n](int i) { return i < n ? cvt(p[i]) : 0.f; }); }
  static void store(float* p, V v) { std::memcpy(p, v.v, sizeof v.v); }
  // Q4 (core/quant4.h), decoded as fmaf(q, d, m) without an FMA instruction: in double, q*d
  // and + m are exact (f16 d and m are multiples of 2^-24 below 2^16, so every value here is
  // a multiple of 2^-24 below 2^21: 45 bits), and the conversion to float is the one rounding.
  struct Q4G {
    float d, m;
  };
  static Q4G q4_group(const uint8_t* meta) {
    return {f16_to_f32(uint16_t(meta[0] | meta[1] << 8)), f16_to_f32(uint16_t(meta[2] | meta[3] << 8))};
  }
  static V q4_vec_tail(const Q4G& g, const uint8_t* codes, int n) {
    return map([&](int i) {
      if (i >= n) return 0.f;
      const int q = (codes[i / 2] >> (4 * (i & 1))) & 0xf;
      return float(double(q) * double(g.d) + double(g.m));
    });
  }
  static V q4_vec(const Q4G& g, const uint8_t* codes) { return q4_vec_tail(g, codes, L); }
  static V load_q4(const uint8_t* codes, const uint8_t* meta) { return q4_vec(q4_group(meta), codes); }
  static V load_q4_tail(const uint8_t* codes, const uint8_t* meta, int n) {
    return q4_vec_tail(q4_group(meta), codes, n);
  }
  static V load_exact(const half_t* p) { return load(p); }  // the reference itself
  static void store(half_t* p, V v) {
    for (int i = 0; i < L; ++i) p[i].bits = f32_to_f16(v.v[i]);
  }
  static void store(bf16_t* p, V v) {
    for (int i = 0; i < L; ++i) p[i].bits = f32_to_bf16(v.v[i]);
  }
  static void store_tail(float* p, V v, int n) { std::memcpy(p, v.v, size_t(n) * 4); }
  static V fma(V a, V b, V c) { return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; }); }
  static V add(V a, V b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
  static V sub(V a, V b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
  static V mul(V a, V b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
  static V div(V a, V b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
  static V max(V a, V b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
  static V min(V a, V b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
  static V round(V a) { return map([&](int i) { return std::nearbyint(a.v[i]); }); }
  static V pow2i(V n) {
    return map([&](int i) {
      uint32_t u = uint32_t(int32_t(n.v[i]) + 127) << 23;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    });
  }
  static float hmax(V a) {
    float m = a.v[0];
    for (int i = 1; i < L; ++i) m = a.v[i] > m ? a.v[i] : m;
    return m;
  }
  static float hsum(const V& a) {
    float r1[4], r2[2];
    for (int i = 0; i < 4; ++i) r1[i] = a.v[i] + a.v[i + 4];
    for (int i = 0; i < 2; ++i) r2[i] = r1[i] + r1[i + 2];
    return r2[0] + r2[1];
  }
  template <int G>
  static void reduce(const V* acc, float* out) {
    for (int o = 0; o < G; ++o) out[o] = hsum(acc[o]);
  }
};

}  // namespace
}  // namespace flexh2o::cpu::detail
