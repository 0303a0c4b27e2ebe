// Private: causal softmax attention for one (sequence, query head, query range), written
// over a vector-traits type T and instantiated per ISA; the TBB driver is attention.cpp.
// Every sum runs over keys in slot order, from slot 0 of the sequence's left-aligned cache (with
// a window, from the first slot the query block sees, its earlier ones adding exact zeros), so a
// sequence gives the same bits whatever its batch or the query block it falls in.
// K/V elements (float, half_t or bf16_t; q4_t records decoded as q4::decode_rows does) are
// widened exactly in registers as they are loaded, so a 16-bit or Q4 cache gives the bits of
// an fp32 cache holding the same (decoded) values.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/detail/linear_impl.h"
#include "kernels/cpu/detail/math_impl.h"

namespace flexh2o::cpu::detail {

// Software prefetch into L2, this many bytes ahead of the K rows a score tile reads and of
// the V rows P.V reads. Decode streams K/V from DRAM once, and the hardware prefetcher alone
// leaves a 16-bit cache well below the bandwidth an fp32 one gets (decode, B=8, 32 heads,
// d=128, 2048 keys, 2 threads: f16 15.3 -> 12.1 ms, GQA 4:1 f16 4.8 -> 3.6 ms and fp32
// 7.5 -> 6.5 ms; fp32 MHA, already at the bandwidth, ~5% slower). Only the first tile of
// rows streams from memory, so only it prefetches. A prefetch never faults or changes a value.
constexpr int64_t kAttnPrefetchK = 12 << 10, kAttnPrefetchV = 8 << 10;


// acc[q*NV + v] += sum over j in [j0, j1) of prow[q][j] * V[j][d0 + v*L ...] (in j order);
// vb is the handle of V row 0. pf > 0: prefetch the same columns of row j + pf.
template <class T, int QN, int NV, class VR>
inline void pv_run(typename T::V* acc, const float* const* prow, const VR& vb, int64_t d0, int64_t d,
                   int tail, int64_t j0, int64_t j1, int64_t pf, int64_t pf_bytes) {
  using V = typename T::V;
  constexpr int L = T::L;
  V r[QN * NV];
  for (int i = 0; i < QN * NV; ++i) r[i] = acc[i];
  for (int64_t j = j0; j < j1; ++j) {
    const auto vp = row_at(vb, j, d);
    if (pf && j + pf < j1) prefetch_l2(elem_addr(row_at(vb, j + pf, d), d0), pf_bytes);
    V vv[NV];
    if constexpr (std::is_same_v<VR, Q4Row>) {  // the NV vectors lie in one group: one {d, m}
      static_assert(q4::kGroup % (T::PV_V * L) == 0);
      const auto g = q4_group_of<T>(vp, d0);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        vv[v] = (v == NV - 1 && tail) ? T::q4_vec_tail(g, vp.rec + (d0 + v * L) / 2, tail)
                                      : T::q4_vec(g, vp.rec + (d0 + v * L) / 2);
    } else {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        vv[v] = (v == NV - 1 && tail) ? wload_tail<T>(vp, d0 + v * L, tail) : wload<T>(vp, d0 + v * L);
    }
#pragma GCC unroll 8
    for (int q = 0; q < QN; ++q) {
      V p = T::set1(prow[q][j]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) r[q * NV + v] = T::fma(p, vv[v], r[q * NV + v]);
    }
  }
  for (int i = 0; i < QN * NV; ++i) acc[i] = r[i];
}

template <class T, int QN, class VR>
inline void pv_run_rt(int nv, typename T::V* acc, const float* const* prow, const VR& vb, int64_t d0,
                      int64_t d, int tail, int64_t j0, int64_t j1, int64_t pf, int64_t pf_bytes) {
  static_assert(T::PV_V <= 4);
  switch (nv) {
    case 1: pv_run<T, QN, 1>(acc, prow, vb, d0, d, tail, j0, j1, pf, pf_bytes); break;
    case 2: if constexpr (T::PV_V >= 2) pv_run<T, QN, 2>(acc, prow, vb, d0, d, tail, j0, j1, pf, pf_bytes); break;
    case 3: if constexpr (T::PV_V >= 3) pv_run<T, QN, 3>(acc, prow, vb, d0, d, tail, j0, j1, pf, pf_bytes); break;
    default: if constexpr (T::PV_V >= 4) pv_run<T, QN, 4>(acc, prow, vb, d0, d, tail, j0, j1, pf, pf_bytes); break;
  }
}

template <class T, class KV>
void attention_run(const AttnTask& task) {
  using V = typename T::V;
  constexpr int L = T::L, MR = T::MR, NR = T::NR, PQ = T::PV_Q, PV = T::PV_V;
  const AttentionArgs& a = *task.a;
  const int64_t b = task.b, h = task.h, nh = task.nh, d = a.head_dim;
  const int64_t g = h / (a.n_heads / a.kv_heads);
  const int64_t nk = a.seq_keys[b];
  const int64_t base = (b * a.kv_heads + g) * a.capacity;  // row of slot 0
  const auto kb = row_at(first_row<KV>(a.k, d), base, d);  // key j: row_at(kb, j, d)
  const auto vb = row_at(first_row<KV>(a.v, d), base, d);
  const int64_t ld = nk > 0 ? nk : 1;
  // Row r of the task is query t0 + r / nh of head h + r % nh: keys seen grow with r.
  auto n_of = [&](int64_t r) { return nk - a.tq + task.t0 + r / nh + 1; };  // <= 0: padding
  // First slot row r sees: a window hides the slots before n - window.
  auto lo_of = [&](int64_t r) { return a.window > 0 && n_of(r) > a.window ? n_of(r) - a.window : int64_t(0); };
  auto qrow = [&](int64_t r) {
    return a.q + (b * a.tq + task.t0 + r / nh) * a.q_stride + (h + r % nh) * d;
  };
  auto orow = [&](int64_t r) {
    return a.out + (b * a.tq + task.t0 + r / nh) * a.out_stride + (h + r % nh) * d;
  };
  const int64_t rows = (task.t1 - task.t0) * nh;
  const int64_t row_bytes = row_size<KV>(d);
  const int64_t pfk = kAttnPrefetchK / row_bytes > 0 ? kAttnPrefetchK / row_bytes : 1;
  const int64_t pfv = kAttnPrefetchV / row_bytes > 0 ? kAttnPrefetchV / row_bytes : 1;

  for (int64_t qb0 = 0; qb0 < rows; qb0 += kAttnQB) {
    const int64_t qb1 = qb0 + kAttnQB < rows ? qb0 + kAttnQB : rows;
    float* S = task.scratch;  // row i - qb0: scores, then probabilities
    // ---- scores: MR queries x NR keys per tile, dot products along d
    for (int64_t i0 = qb0; i0 < qb1; i0 += MR) {
      const int mr = int(qb1 - i0 < MR ? qb1 - i0 : MR);
      const int64_t nmax = n_of(i0 + mr - 1);
      if (nmax <= 0) continue;
      const float* xr[MR];
      for (int i = 0; i < MR; ++i) xr[i] = qrow(i0 + (i < mr ? i : mr - 1));
      for (int64_t j0 = lo_of(i0); j0 < nmax; j0 += NR) {
        const int nr = int(nmax - j0 < NR ? nmax - j0 : NR);
        if (i0 == qb0 && j0 + pfk + NR <= nmax) prefetch_l2(elem_addr(row_at(kb, j0 + pfk, d), 0), NR * row_bytes);
        typename RowOf<KV>::R wr[NR];
        for (int j = 0; j < NR; ++j) wr[j] = row_at(kb, j0 + (j < nr ? j : nr - 1), d);
        float part[MR * NR];
        dot_tile_rt<T>(mr, xr, wr, d, part);
        for (int i = 0; i < mr; ++i)
          for (int j = 0; j < nr; ++j) S[(i0 - qb0 + i) * ld + j0 + j] = part[i * NR + j] * a.scale;
      }
    }
    // ---- softmax per query (fp32, max-subtracted, after any soft cap), H2O key scores; a
    // windowed row's hidden slots from the block's first seen slot on get probability 0
    const int64_t lo_block = lo_of(qb0);
    for (int64_t i = qb0; i < qb1; ++i) {
      const int64_t n0 = n_of(i);
      if (n0 <= 0) continue;
      const int64_t lo = lo_of(i), n = n0 - lo;
      float* whole = S + (i - qb0) * ld;
      for (int64_t j = lo_block; j < lo; ++j) whole[j] = 0.f;
      float* row = whole + lo;
      if (a.softcap > 0) softcap<T>(row, n, a.softcap);
      float* kscore = task.scores ? task.scores + (i % nh) * a.capacity + lo : nullptr;
      V mv = T::set1(row[0]);
      int64_t j = 0;
      for (; j + L <= n; j += L) mv = T::max(mv, T::load(row + j));
      float mx = T::hmax(mv);
      for (; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
      const V mxv = T::set1(mx);
      V sv = T::zero();
      for (j = 0; j + L <= n; j += L) {
        V e = vexp<T>(T::sub(T::load(row + j), mxv));
        T::store(row + j, e);
        sv = T::add(sv, e);
      }
      if (j < n) {
        const int r = int(n - j);
        V e = vexp<T>(T::sub(T::load_tail(row + j, r), mxv));
        T::store_tail(row + j, e, r);
        sv = T::add(sv, T::load_tail(row + j, r));
      }
      float sum;
      T::template reduce<1>(&sv, &sum);
      const V inv = T::set1(1.f / sum);
      for (j = 0; j + L <= n; j += L) T::store(row + j, T::mul(T::load(row + j), inv));
      if (j < n) T::store_tail(row + j, T::mul(T::load_tail(row + j, int(n - j)), inv), int(n - j));
      if (kscore) {
        for (j = 0; j + L <= n; j += L)
          T::store(kscore + j, T::add(T::load(kscore + j), T::load(row + j)));
        if (j < n) {
          const int r = int(n - j);
          T::store_tail(kscore + j, T::add(T::load_tail(kscore + j, r), T::load_tail(row + j, r)), r);
        }
      }
    }
    // ---- out = P . V: PQ queries share each V row; chains run over keys in order
    for (int64_t d0 = 0; d0 < d; d0 += int64_t(PV) * L) {
      const int64_t dc = d - d0 < int64_t(PV) * L ? d - d0 : int64_t(PV) * L;
      const int nv = int((dc + L - 1) / L);
      const int tail = int(dc % L);
      // Prefetch about the bytes of columns [d0, d0 + dc) of a row (Q4: a row of dc columns).
      const int64_t pf_bytes = row_size<KV>(dc) < row_bytes ? row_size<KV>(dc) : row_bytes;
      for (int64_t i0 = qb0; i0 < qb1; i0 += PQ) {
        const int qn = int(qb1 - i0 < PQ ? qb1 - i0 : PQ);
        V acc[PQ * PV];
        for (int i = 0; i < PQ * PV; ++i) acc[i] = T::zero();
        const float* prow[PQ];
        for (int q = 0; q < qn; ++q) prow[q] = S + (i0 + q - qb0) * ld;
        int64_t done = lo_of(i0);        // the tile's first seen slot (lo grows with rows)
        if (qn == PQ && n_of(i0) > 0) {  // common key range of the tile (n grows with rows)
          const int64_t from = done;
          done = n_of(i0);
          pv_run_rt<T, PQ>(nv, acc, prow, vb, d0, d, tail, from, done, i0 == qb0 ? pfv : 0, pf_bytes);
        }
        for (int q = 0; q < qn; ++q) {  // each query finishes its own keys alone
          const int64_t n = n_of(i0 + q);
          V* aq = acc + q * nv;
          const int64_t pf = i0 == qb0 && q == 0 ? pfv : 0;
          if (n > done) pv_run_rt<T, 1>(nv, aq, prow + q, vb, d0, d, tail, done, n, pf, pf_bytes);
          float* o = orow(i0 + q) + d0;
          for (int v = 0; v < nv; ++v) {
            const V r = n > 0 ? aq[v] : T::zero();
            if (v == nv - 1 && tail) T::store_tail(o + v * L, r, tail);
            else T::store(o + v * L, r);
          }
        }
      }
    }
  }
}

template <class T>
void attention_task(const AttnTask& task) {
  switch (task.a->kv_dtype) {
    case DType::F32: return attention_run<T, float>(task);
    case DType::F16: return attention_run<T, half_t>(task);
    case DType::BF16: return attention_run<T, bf16_t>(task);
    case DType::Q4: return attention_run<T, q4_t>(task);
    default: return;  // rejected by the driver
  }
}

}  // namespace flexh2o::cpu::detail
