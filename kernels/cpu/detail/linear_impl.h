// Private: the linear (x . w^T) kernel, written once over a vector-traits type T and
// instantiated in each ISA translation unit. One task = one block of outputs; the TBB
// driver is in linear.cpp. See the reduction-order contract in detail/isa.h.
#pragma once

#include <cstdint>
#include <type_traits>

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
// PF: prefetch the x rows T::X_PREFETCH floats ahead (the packed path, where x streams from L2);
// a hint only, so no result depends on it.
template <class T, int MR, bool PF, class WR>
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
    if constexpr (PF && T::X_PREFETCH > 0) {
      // Near a chunk's end this points past it (at the next chunk or row, or beyond x), as
      // Eigen's and OpenBLAS's prefetches do: a prefetch never faults. A bounds check, or the
      // address formed as an integer, measured slower (each took half the gain or more).
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) __builtin_prefetch(xr[m] + k + T::X_PREFETCH, 0, 3);
    }
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
  if (!out) {  // continued by the next chunk: stored straight from the registers
#pragma GCC unroll 32
    for (int i = 0; i < MR * NR; ++i) st[i] = acc[i];
    return;
  }
  // Reduce from a copy: if acc's address escaped, GCC 12 keeps acc in memory and stores all
  // MR*NR accumulators on every iteration of the loops above.
  V fin[MR * NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR * NR; ++i) fin[i] = acc[i];
  T::template reduce<MR * NR>(fin, out);
}

template <class T, bool PF = false, class WR>
inline void dot_tile_rt(int mr, const float* const* xr, const WR* wr, int64_t k0, int64_t kc,
                        const typename T::V* in, typename T::V* st, float* out) {
  static_assert(T::MR <= 4);
  switch (mr) {
    case 1: dot_tile<T, 1, PF>(xr, wr, k0, kc, in, st, out); break;
    case 2: if constexpr (T::MR >= 2) dot_tile<T, 2, PF>(xr, wr, k0, kc, in, st, out); break;
    case 3: if constexpr (T::MR >= 3) dot_tile<T, 3, PF>(xr, wr, k0, kc, in, st, out); break;
    default: if constexpr (T::MR >= 4) dot_tile<T, 4, PF>(xr, wr, k0, kc, in, st, out); break;
  }
}

// Whole dot products (one chunk, reduced): attention scores and the small-M linear path.
template <class T, class WR>
inline void dot_tile_rt(int mr, const float* const* xr, const WR* wr, int64_t kc, float* out) {
  dot_tile_rt<T>(mr, xr, wr, 0, kc, nullptr, nullptr, out);
}

// One row of a finished tile: y[j] = ep(s[j] (+ bias[j])) for j < nr, a vector at a time.
// Per element: s + bias, then max(r, 0) (r > 0 ? r : 0, NaN to 0) or old + r; the same
// operations in the same order whatever the ISA, the tile or the path.
template <class T>
inline void epilogue_row(Epilogue ep, const float* s, const float* bias, int nr, float* y) {
  using V = typename T::V;
  constexpr int L = T::L;
  for (int j = 0; j < nr; j += L) {
    const int n = nr - j < L ? nr - j : L;
    auto ld = [n](const float* p) { return n == L ? T::load(p) : T::load_tail(p, n); };
    V r = ld(s + j);
    if (bias) r = T::add(r, ld(bias + j));
    if (ep == Epilogue::kRelu) r = T::max(r, T::zero());
    else if (ep == Epilogue::kAccumulate) r = T::add(ld(y + j), r);
    if (n == L) T::store(y + j, r);
    else T::store_tail(y + j, r, n);
  }
}

// ---------------------------------------------------------------------------------------
// Direct path (small M): w is read in its own dtype, converted in registers; each tile runs
// over all of K at once. (Q4 weights take linear_direct_q4 below.)
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
        epilogue_row<T>(t.ep, s + i * NR, t.bias ? t.bias + n : nullptr, nr, t.y + (m + i) * t.N + n);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Direct path for Q4 weights: NQ w rows x MQ x rows per tile, K walked group by group, so a
// group's {d, m} is read once per row, each decoded w vector serves all MQ rows of x and each
// x vector all NQ rows of w. MQ is at most 4 (T::Q4_MQ): 8 rows of x at K = 2048 no longer
// fit L1, and on AVX-512 a 4-row tile decoding w twice for M = 8 measured 1.6x faster than
// one 8 x 2 tile (bench/RESULTS.md, 2026-12-01). The chains and the reduction are the ones
// dot_tile runs over the decoded values, so the bits equal the packed path's and the fp32
// path's over q4::decode_rows.
// Q4Prefetch: `left` bytes from `at` (a later tile's rows) go to L2, `step` per group.
struct Q4Prefetch {
  const uint8_t* at = nullptr;
  int64_t left = 0, step = 0;
};
template <class T, int MQ, int NQ>
inline void q4_dot_tile(const float* const* xr, const Q4Row* wr, int64_t K, Q4Prefetch pf, float* out) {
  using V = typename T::V;
  constexpr int L = T::L;
  V acc[MQ * NQ];
#pragma GCC unroll 32
  for (int i = 0; i < MQ * NQ; ++i) acc[i] = T::zero();
  for (int64_t g0 = 0; g0 < K; g0 += q4::kGroup) {
    const int64_t ge = g0 + q4::kGroup < K ? g0 + q4::kGroup : K;
    if (pf.left > 0) {
      const int64_t n = pf.step < pf.left ? pf.step : pf.left;
      prefetch_l2(pf.at, n);
      pf.at += n;
      pf.left -= n;
    }
    typename T::Q4G gs[NQ];
#pragma GCC unroll 8
    for (int j = 0; j < NQ; ++j) gs[j] = q4_group_of<T>(wr[j], g0);
    int64_t k = g0;
    for (; k + L <= ge; k += L) {
      V xv[MQ];
#pragma GCC unroll 8
      for (int m = 0; m < MQ; ++m) xv[m] = T::load(xr[m] + k);
#pragma GCC unroll 8
      for (int j = 0; j < NQ; ++j) {
        const V wv = T::q4_vec(gs[j], wr[j].rec + k / 2);
#pragma GCC unroll 8
        for (int m = 0; m < MQ; ++m) acc[m * NQ + j] = T::fma(xv[m], wv, acc[m * NQ + j]);
      }
    }
    if (k < ge) {
      const int r = int(ge - k);
      V xv[MQ];
      for (int m = 0; m < MQ; ++m) xv[m] = T::load_tail(xr[m] + k, r);
      for (int j = 0; j < NQ; ++j) {
        const V wv = T::q4_vec_tail(gs[j], wr[j].rec + k / 2, r);
        for (int m = 0; m < MQ; ++m) acc[m * NQ + j] = T::fma(xv[m], wv, acc[m * NQ + j]);
      }
    }
  }
  V fin[MQ * NQ];  // (see dot_tile: reduce from a copy)
#pragma GCC unroll 32
  for (int i = 0; i < MQ * NQ; ++i) fin[i] = acc[i];
  T::template reduce<MQ * NQ>(fin, out);
}

// w rows per tile for mq x rows: as many as keep the accumulators, the groups' decode state
// and the x vectors in registers (T::q4_nq).
constexpr int kQ4MaxNQ = 8;
constexpr int64_t kQ4PrefetchTiles = 2;
template <class T, int MQ>
inline void q4_dot_rt(const float* const* xr, const Q4Row* wr, int64_t K, Q4Prefetch pf, float* out) {
  constexpr int NQ = T::q4_nq(MQ);
  static_assert(NQ <= kQ4MaxNQ);
  q4_dot_tile<T, MQ, NQ>(xr, wr, K, pf, out);
}
template <class T>
inline void q4_dot_tile_rt(int mq, const float* const* xr, const Q4Row* wr, int64_t K, Q4Prefetch pf, float* out) {
  static_assert(T::Q4_MQ == 4);
  switch (mq) {
    case 1: return q4_dot_rt<T, 1>(xr, wr, K, pf, out);
    case 2: return q4_dot_rt<T, 2>(xr, wr, K, pf, out);
    case 3: return q4_dot_rt<T, 3>(xr, wr, K, pf, out);
    default: return q4_dot_rt<T, 4>(xr, wr, K, pf, out);
  }
}

// Whole dot products against Q4 rows (attention scores over a Q4 K cache): the same bits as
// the generic dot_tile_rt over decoded rows, with each group's {d, m} read once per row.
template <class T>
inline void dot_tile_rt(int mr, const float* const* xr, const Q4Row* wr, int64_t kc, float* out) {
  constexpr int NR = T::NR;
  static_assert(T::MR <= 4);
  switch (mr) {
    case 1: return q4_dot_tile<T, 1, NR>(xr, wr, kc, Q4Prefetch{}, out);
    case 2: if constexpr (T::MR >= 2) q4_dot_tile<T, 2, NR>(xr, wr, kc, Q4Prefetch{}, out); return;
    case 3: if constexpr (T::MR >= 3) q4_dot_tile<T, 3, NR>(xr, wr, kc, Q4Prefetch{}, out); return;
    default: if constexpr (T::MR >= 4) q4_dot_tile<T, 4, NR>(xr, wr, kc, Q4Prefetch{}, out); return;
  }
}

template <class T>
void linear_direct_q4(const LinearTask& t) {
  constexpr int MQ = T::Q4_MQ;
  const int64_t K = t.K;
  const Q4Row w = first_row<q4_t>(t.w, K);
  for (int64_t m = t.m0; m < t.m1; m += MQ) {
    const int mq = int(t.m1 - m < MQ ? t.m1 - m : MQ), nq = T::q4_nq(mq);
    const float* xr[MQ];
    for (int i = 0; i < MQ; ++i) xr[i] = t.x + (m + (i < mq ? i : 0)) * K;
    for (int64_t n = t.n0; n < t.n1; n += nq) {
      const int nr = int(t.n1 - n < nq ? t.n1 - n : nq);
      Q4Row wr[kQ4MaxNQ];
      for (int j = 0; j < nq; ++j) wr[j] = row_at(w, n + (j < nr ? j : 0), K);
      // Rows of a tile are short (K/2 bytes), too short for the hardware prefetcher to ramp
      // up on, so each tile prefetches the tile kQ4PrefetchTiles ahead, spread over its groups.
      Q4Prefetch pf;
      const int64_t pf_row = n + kQ4PrefetchTiles * nq;
      if (pf_row < t.n1) {
        pf.at = row_at(w, pf_row, K).rec;
        pf.left = (pf_row + nq < t.n1 ? nq : t.n1 - pf_row) * q4::row_bytes(K);
        pf.step = (pf.left + q4::groups(K) - 1) / q4::groups(K);
      }
      float s[MQ * kQ4MaxNQ];
      q4_dot_tile_rt<T>(mq, xr, wr, K, pf, s);
      for (int i = 0; i < mq; ++i)
        epilogue_row<T>(t.ep, s + i * nq, t.bias ? t.bias + n : nullptr, nr, t.y + (m + i) * t.N + n);
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
      if constexpr (std::is_same_v<E, q4_t>) {
        static_assert(kLinearKC % q4::kGroup == 0, "a K chunk must start a group");
        q4_decode_span<T>(src, k0, kc, dst);
        continue;
      }
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
          dot_tile_rt<T, true>(mr, xr, wr, 0, kc, first ? nullptr : st, st, nullptr);
          continue;
        }
        float s[MR * NR];
        dot_tile_rt<T, true>(mr, xr, wr, 0, kc, first ? nullptr : st, nullptr, s);
        for (int i = 0; i < mr; ++i)
          epilogue_row<T>(t.ep, s + i * NR, t.bias ? t.bias + t.n0 + n : nullptr, nr,
                          t.y + (t.m0 + m + i) * t.N + t.n0 + n);
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
      return t.packed ? linear_packed<T, q4_t>(t) : linear_direct_q4<T>(t);
    default: return;  // rejected by the driver
  }
}

}  // namespace flexh2o::cpu::detail
