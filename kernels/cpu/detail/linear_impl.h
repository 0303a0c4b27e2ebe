// Private: the linear (x . w^T) kernel, written once over a vector-traits type T and
// instantiated in each ISA translation unit. One task = one block of outputs; the TBB
// driver is in linear.cpp. See the reduction-order contract in detail/isa.h.
#pragma once

#include <cstdint>

#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/detail/rows_impl.h"

namespace flexh2o::cpu::detail {

// ---------------------------------------------------------------------------------------
// Micro-kernel: MR x rows against T::NR w rows over kc elements, K-vectorised: accumulator
// (m, n) holds L lane-wise FMA chains. The chains start from zero or from `in` (the state a
// previous K chunk left), and end either reduced through the fixed tree into out[m*NR + n]
// (when out is non-null) or stored to `st` to be continued by the next chunk. Since every
// chunk but the last is a multiple of L, chunking K never changes a chain.
// xr[m] points at the first element of the chunk; wr[n] is a row handle (rows_impl.h) and
// k0 the chunk's offset in that row.
template <class T, int MR, class WR>
inline void dot_tile(const float* const* xr, const WR* wr, int64_t k0, int64_t kc,
                     const typename T::V* in, typename T::V* st, float* out) {
  using V = typename T::V;
  constexpr int NR = T::NR, L = T::L;
  V acc[MR * NR];
  if (in) {
#pragma GCC unroll 32
    for (int i = 0; i < MR * NR; ++i) acc[i] = in[i];
  } else {
#pragma GCC unroll 32
    for (int i = 0; i < MR * NR; ++i) acc[i] = T::zero();
  }
  int64_t k = 0;
  for (; k + L <= kc; k += L) {
    V xv[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) xv[m] = T::load(xr[m] + k);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      V wv = wload<T>(wr[n], k0 + k);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = T::fma(xv[m], wv, acc[m * NR + n]);
    }
  }
  if (k < kc) {
    const int r = int(kc - k);
    V xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = T::load_tail(xr[m] + k, r);
    for (int n = 0; n < NR; ++n) {
      V wv = wload_tail<T>(wr[n], k0 + k, r);
      for (int m = 0; m < MR; ++m) acc[m * NR + n] = T::fma(xv[m], wv, acc[m * NR + n]);
    }
  }
  // Reduce/store from a copy: if acc's address escaped, GCC 12 keeps acc in memory and
  // stores all MR*NR accumulators on every iteration of the loops above.
  V fin[MR * NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR * NR; ++i) fin[i] = acc[i];
  if (out) {
    T::template reduce<MR * NR>(fin, out);
  } else {
#pragma GCC unroll 32
    for (int i = 0; i < MR * NR; ++i) st[i] = fin[i];
  }
}

template <class T, class WR>
inline void dot_tile_rt(int mr, const float* const* xr, const WR* wr, int64_t k0, int64_t kc,
                        const typename T::V* in, typename T::V* st, float* out) {
  static_assert(T::MR <= 4);
  switch (mr) {
    case 1: dot_tile<T, 1>(xr, wr, k0, kc, in, st, out); break;
    case 2: if constexpr (T::MR >= 2) dot_tile<T, 2>(xr, wr, k0, kc, in, st, out); break;
    case 3: if constexpr (T::MR >= 3) dot_tile<T, 3>(xr, wr, k0, kc, in, st, out); break;
    default: if constexpr (T::MR >= 4) dot_tile<T, 4>(xr, wr, k0, kc, in, st, out); break;
  }
}

// Whole dot products (one chunk, reduced): attention scores and the small-M linear path.
template <class T, class WR>
inline void dot_tile_rt(int mr, const float* const* xr, const WR* wr, int64_t kc, float* out) {
  dot_tile_rt<T>(mr, xr, wr, 0, kc, nullptr, nullptr, out);
}

template <class T>
inline float apply_epilogue(Epilogue ep, float s, float bias, bool has_bias, float old) {
  float r = has_bias ? s + bias : s;
  switch (ep) {
    case Epilogue::kStore: return r;
    case Epilogue::kRelu: return r > 0.f ? r : 0.f;
    case Epilogue::kAccumulate: return old + r;
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Direct path (small M): w is read in its own dtype (Q4: decoded), converted in registers;
// each tile runs over all of K at once.
template <class T, class E>
void linear_direct(const LinearTask& t) {
  constexpr int MR = T::MR, NR = T::NR;
  const int64_t K = t.K;
  const auto w = first_row<E>(t.w, K);
  for (int64_t n = t.n0; n < t.n1; n += NR) {
    const int nr = int(t.n1 - n < NR ? t.n1 - n : NR);
    typename RowOf<E>::R wr[NR];
    for (int j = 0; j < NR; ++j) wr[j] = row_at(w, n + (j < nr ? j : 0), K);
    for (int64_t m = t.m0; m < t.m1; m += MR) {
      const int mr = int(t.m1 - m < MR ? t.m1 - m : MR);
      float s[MR * NR];
      const float* xr[MR];
      for (int i = 0; i < MR; ++i) xr[i] = t.x + (m + (i < mr ? i : 0)) * K;
      dot_tile_rt<T>(mr, xr, wr, K, s);
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) {
          float* yp = t.y + (m + i) * t.N + n + j;
          *yp = apply_epilogue<T>(t.ep, s[i * NR + j], t.bias ? t.bias[n + j] : 0.f, t.bias, *yp);
        }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Packed path (large M): per K chunk, the task's w rows are converted (exactly) into an
// fp32 panel that stays in L2 while MR-row strips of x stream past it. Between chunks each
// tile's accumulator vectors wait in `state` (L2), so the chains continue over all of K.
template <class T, class E>
void linear_packed(const LinearTask& t) {
  using V = typename T::V;
  constexpr int MR = T::MR, NR = T::NR, L = T::L;
  const int64_t K = t.K, nb = t.n1 - t.n0, mb = t.m1 - t.m0;
  const auto w = first_row<E>(t.w, K);
  float* panel = t.scratch;  // [nb, kLinearKC]
  V* state = reinterpret_cast<V*>(t.scratch + kLinearNB * kLinearKC);  // [ngroups][mtiles][MR*NR]
  const int64_t mtiles = (mb + MR - 1) / MR;
  for (int64_t k0 = 0; k0 < K; k0 += kLinearKC) {
    const int64_t kc = K - k0 < kLinearKC ? K - k0 : kLinearKC;
    const bool first = k0 == 0, last = k0 + kc == K;
    for (int64_t j = 0; j < nb; ++j) {
      const auto src = row_at(w, t.n0 + j, K);
      float* dst = panel + j * kLinearKC;
      int64_t k = 0;
      for (; k + L <= kc; k += L) T::store(dst + k, wload<T>(src, k0 + k));
      if (k < kc) T::store_tail(dst + k, wload_tail<T>(src, k0 + k, int(kc - k)), int(kc - k));
    }
    for (int64_t n = 0; n < nb; n += NR) {
      const int nr = int(nb - n < NR ? nb - n : NR);
      const float* wr[NR];
      for (int j = 0; j < NR; ++j) wr[j] = panel + (n + (j < nr ? j : 0)) * kLinearKC;
      V* st = state + (n / NR) * mtiles * (MR * NR);
      for (int64_t m = 0; m < mb; m += MR, st += MR * NR) {
        const int mr = int(mb - m < MR ? mb - m : MR);
        const float* xr[MR];
        for (int i = 0; i < MR; ++i) xr[i] = t.x + (t.m0 + m + (i < mr ? i : 0)) * K + k0;
        if (!last) {
          dot_tile_rt<T>(mr, xr, wr, 0, kc, first ? nullptr : st, st, nullptr);
          continue;
        }
        float s[MR * NR];
        dot_tile_rt<T>(mr, xr, wr, 0, kc, first ? nullptr : st, nullptr, s);
        for (int i = 0; i < mr; ++i)
          for (int j = 0; j < nr; ++j) {
            const int64_t nn = t.n0 + n + j;
            float* yp = t.y + (t.m0 + m + i) * t.N + nn;
            *yp = apply_epilogue<T>(t.ep, s[i * NR + j], t.bias ? t.bias[nn] : 0.f, t.bias, *yp);
          }
      }
    }
  }
}

template <class T>
void linear_task(const LinearTask& t) {
  switch (t.wdtype) {
    case DType::F32:
      return t.packed ? linear_packed<T, float>(t) : linear_direct<T, float>(t);
    case DType::F16:
      return t.packed ? linear_packed<T, half_t>(t) : linear_direct<T, half_t>(t);
    case DType::BF16:
      return t.packed ? linear_packed<T, bf16_t>(t) : linear_direct<T, bf16_t>(t);
    case DType::Q4:
      return t.packed ? linear_packed<T, q4_t>(t) : linear_direct<T, q4_t>(t);
    default: return;  // rejected by the driver
  }
}

}  // namespace flexh2o::cpu::detail
