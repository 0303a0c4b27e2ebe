// Private: element-wise vector math over a traits type T (exp, silu, tanh GELU, soft cap).
// Instantiated per ISA.
// exp is the Cephes single-precision scheme (max error ~2 ulp on [-87, 88]); inputs are
// clamped to that range, so exp(x) for x < -87.3 returns ~1e-38 rather than 0.
#pragma once

#include <cstdint>

namespace flexh2o::cpu::detail {

template <class T>
inline typename T::V vexp(typename T::V x) {
  using V = typename T::V;
  x = T::min(T::max(x, T::set1(-87.3f)), T::set1(88.7f));
  V n = T::round(T::mul(x, T::set1(1.44269504088896341f)));
  V r = T::fma(n, T::set1(-0.693359375f), x);
  r = T::fma(n, T::set1(2.12194440e-4f), r);
  V p = T::set1(1.9875691500E-4f);
  p = T::fma(p, r, T::set1(1.3981999507E-3f));
  p = T::fma(p, r, T::set1(8.3334519073E-3f));
  p = T::fma(p, r, T::set1(4.1665795894E-2f));
  p = T::fma(p, r, T::set1(1.6666665459E-1f));
  p = T::fma(p, r, T::set1(5.0000001201E-1f));
  p = T::fma(p, T::mul(r, r), r);
  p = T::add(p, T::set1(1.f));
  // n can reach 128 at the top of the range: scale in two steps to stay representable.
  V half = T::round(T::mul(n, T::set1(0.5f)));
  return T::mul(T::mul(p, T::pow2i(half)), T::pow2i(T::sub(n, half)));
}

// gate[i] = f(gate[i], up[i]) for i < n, a vector at a time.
template <class T, class F>
inline void gated_apply(float* gate, const float* up, int64_t n, F f) {
  constexpr int L = T::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) T::store(gate + i, f(T::load(gate + i), T::load(up + i)));
  if (i < n) {
    const int r = int(n - i);
    T::store_tail(gate + i, f(T::load_tail(gate + i, r), T::load_tail(up + i, r)), r);
  }
}

template <class T>
void silu_mul(float* gate, const float* up, int64_t n) {
  using V = typename T::V;
  gated_apply<T>(gate, up, n, [](V g, V u) {
    V e = vexp<T>(T::sub(T::zero(), g));
    return T::mul(T::div(g, T::add(T::set1(1.f), e)), u);
  });
}

// GELU with the tanh approximation (gelu_pytorch_tanh): 0.5 g (1 + tanh(a)) with
// a = sqrt(2/pi) (g + 0.044715 g^3), computed as g / (1 + exp(-2a)), the same value.
template <class T>
void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  using V = typename T::V;
  gated_apply<T>(gate, up, n, [](V g, V u) {
    const V inner = T::fma(T::mul(T::set1(0.044715f), T::mul(g, g)), g, g);
    V e = vexp<T>(T::mul(T::set1(-1.5957691216057308f), inner));
    return T::mul(T::div(g, T::add(T::set1(1.f), e)), u);
  });
}

// x = cap * tanh(x / cap), tanh(y) as 1 - 2 / (exp(2y) + 1) (saturating at +-1 where exp is
// clamped); absolute error ~1e-7 * cap.
template <class T>
inline typename T::V vsoftcap(typename T::V x, float cap) {
  using V = typename T::V;
  const V e = vexp<T>(T::mul(x, T::set1(2.f / cap)));
  const V t = T::sub(T::set1(1.f), T::div(T::set1(2.f), T::add(e, T::set1(1.f))));
  return T::mul(t, T::set1(cap));
}
template <class T>
void softcap(float* x, int64_t n, float cap) {
  constexpr int L = T::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) T::store(x + i, vsoftcap<T>(T::load(x + i), cap));
  if (i < n) T::store_tail(x + i, vsoftcap<T>(T::load_tail(x + i, int(n - i)), cap), int(n - i));
}

}  // namespace flexh2o::cpu::detail
