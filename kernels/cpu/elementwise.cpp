// Row-wise data movement and element-wise ops: embedding, add_embedding, rotary, write_kv,
// kv_gather/score_gather, silu_mul. Portable code except silu_mul's vector exp and
// write_kv's rounding to the cache dtype, which come from the ISA table (a Q4 cache is
// encoded by the q4 reference, one record per slot row). Parallel over rows
// (or fixed element blocks) when the work is large.
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/quant4.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/detail/rows.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {

// ---- embeddings -----------------------------------------------------------------------

namespace {

void gather_rows(const int32_t* ids, int64_t T, const TensorView& table, float* out, bool add,
                 const char* what) {
  FH_CHECK(table.shape.ndim == 2 && table.data, what, ": table must be 2-D, got ", table.shape.str());
  const int64_t V = table.shape[0], D = table.shape[1];
  for (int64_t t = 0; t < T; ++t)
    FH_CHECK(ids[t] >= 0 && ids[t] < V, what, ": row ", ids[t], " at position ", t,
             " is outside the table of ", V, " rows");
  detail::for_rows(T, D, [&](int64_t t) {
    float* o = out + t * D;
    if (!add) return detail::row_to_f32(table, ids[t], D, o);
    std::vector<float> tmp(static_cast<size_t>(D));
    detail::row_to_f32(table, ids[t], D, tmp.data());
    for (int64_t i = 0; i < D; ++i) o[i] += tmp[i];
  });
}

}  // namespace

void embedding(const int32_t* ids, int64_t T, const TensorView& table, float* out) {
  gather_rows(ids, T, table, out, false, "embedding");
}

void add_embedding(const int32_t* rows, int64_t T, const TensorView& table, float* out) {
  gather_rows(rows, T, table, out, true, "add_embedding");
}

// ---- rotary ---------------------------------------------------------------------------

void rotary(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t row_stride, const int32_t* positions,
            const double* inv_freq, int64_t rotary_dims, float attention_factor) {
  FH_CHECK(rotary_dims > 0 && rotary_dims % 2 == 0 && rotary_dims <= head_dim, "rotary: rotary_dims ", rotary_dims,
           " must be even and within head_dim ", head_dim);
  FH_CHECK(row_stride >= n_heads * head_dim, "rotary: row_stride ", row_stride, " < n_heads*head_dim");
  FH_CHECK(inv_freq != nullptr, "rotary: null inv_freq");
  const int64_t half = rotary_dims / 2;
  detail::for_rows(T, n_heads * head_dim * 4, [&](int64_t t) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const double ang = double(positions[t]) * inv_freq[i];
      c[i] = float(std::cos(ang) * attention_factor);
      s[i] = float(std::sin(ang) * attention_factor);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  });
}

// ---- KV cache -------------------------------------------------------------------------

void write_kv(const float* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, void* cache, DType cache_dtype, int64_t capacity,
              const int32_t* seq_keys) {
  detail::check_kv_dtype(cache_dtype, "write_kv");
  FH_CHECK(B >= 0 && T >= 0 && kv_heads > 0 && head_dim > 0, "write_kv: bad sizes");
  FH_CHECK(src_stride >= kv_heads * head_dim, "write_kv: src_stride ", src_stride,
           " < kv_heads*head_dim");
  if (B == 0 || T == 0) return;
  FH_CHECK(src && cache && seq_keys, "write_kv: null pointer");
  for (int64_t b = 0; b < B; ++b)
    FH_CHECK(seq_keys[b] >= 0 && seq_keys[b] <= capacity, "write_kv: seq_keys[", b, "]=",
             seq_keys[b], " outside [0, capacity=", capacity, "]");
  const detail::KernelTable& kt = detail::kernels(detail::best_isa());
  const int64_t row_bytes = int64_t(row_nbytes(cache_dtype, head_dim));
  detail::for_rows(B * kv_heads, T * head_dim, [&](int64_t bg) {
    const int64_t b = bg / kv_heads, g = bg % kv_heads;
    const int64_t first = seq_keys[b] - T;  // slot of row t = first + t
    const int64_t t0 = first < 0 ? -first : 0;
    char* dst = static_cast<char*>(cache) + bg * capacity * row_bytes;
    if (cache_dtype == DType::Q4) {  // each slot row is one record, its groups along head_dim
      if (t0 < T)
        q4::encode_rows(src + (b * T + t0) * src_stride + g * head_dim, src_stride, T - t0, head_dim,
                        dst + (first + t0) * row_bytes,
                        flexh2o::detail::concat("the KV cache of sequence ", b, ", kv head ", g, " from slot ", first + t0));
      return;
    }
    for (int64_t t = t0; t < T; ++t)
      kt.from_f32(src + (b * T + t) * src_stride + g * head_dim, head_dim, cache_dtype,
                  dst + (first + t) * row_bytes);
  });
}

void write_kv(const float* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
              int64_t head_dim, float* cache, int64_t capacity, const int32_t* seq_keys) {
  write_kv(src, src_stride, B, T, kv_heads, head_dim, cache, DType::F32, capacity, seq_keys);
}

void kv_gather(void* cache, DType dtype, int64_t B, int64_t kv_heads, int64_t capacity,
               int64_t head_dim, const int32_t* keep, int64_t keep_stride,
               const int32_t* keep_count) {
  detail::check_kv_dtype(dtype, "kv_gather");
  FH_CHECK(B >= 0 && kv_heads > 0 && capacity >= 0 && head_dim > 0 && keep_stride >= 0,
           "kv_gather: bad sizes");
  const int64_t rows = B * kv_heads;
  if (rows == 0) return;
  FH_CHECK(keep_count && (cache || capacity == 0), "kv_gather: null pointer");
  for (int64_t r = 0; r < rows; ++r) {  // validate everything before moving anything
    const int64_t n = keep_count[r];
    FH_CHECK(n >= 0 && n <= capacity && n <= keep_stride, "kv_gather: keep_count[", r, "]=", n,
             " outside [0, min(capacity=", capacity, ", keep_stride=", keep_stride, ")]");
    const int32_t* k = keep + r * keep_stride;
    for (int64_t i = 0; i < n; ++i)
      FH_CHECK(k[i] >= i && k[i] < capacity, "kv_gather: row ", r, ": keep[", i, "]=", k[i],
               " must be in [", i, ", capacity=", capacity, ") (in-place gather needs keep[i] >= i)");
  }
  // Ascending i: slot keep[i] >= i has not been overwritten yet (earlier steps wrote slots < i).
  const int64_t row_bytes = int64_t(row_nbytes(dtype, head_dim));  // Q4: whole records
  detail::for_rows(rows, capacity * head_dim, [&](int64_t r) {
    const int32_t* k = keep + r * keep_stride;
    char* base = static_cast<char*>(cache) + r * capacity * row_bytes;
    for (int64_t i = 0; i < keep_count[r]; ++i)
      if (k[i] != i)
        std::memcpy(base + i * row_bytes, base + int64_t(k[i]) * row_bytes, size_t(row_bytes));
  });
}

void kv_gather(float* cache, int64_t B, int64_t kv_heads, int64_t capacity, int64_t head_dim,
               const int32_t* keep, int64_t keep_stride, const int32_t* keep_count) {
  kv_gather(cache, DType::F32, B, kv_heads, capacity, head_dim, keep, keep_stride, keep_count);
}

void score_gather(float* scores, int64_t B, int64_t heads, int64_t capacity, const int32_t* keep,
                  int64_t keep_stride, const int32_t* keep_count) {
  kv_gather(scores, B, heads, capacity, 1, keep, keep_stride, keep_count);
}

// ---- SwiGLU, GeGLU, soft cap -----------------------------------------------------------

namespace detail {
namespace {

// f over [0, n) in fixed blocks, so results never depend on the thread count.
template <class F>
void blocks(int64_t n, F f) {
  constexpr int64_t kBlock = int64_t(1) << 15;
  if (n <= kBlock) return f(int64_t(0), n);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, (n + kBlock - 1) / kBlock),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      const int64_t i0 = r.begin() * kBlock;
                      const int64_t i1 = r.end() * kBlock < n ? r.end() * kBlock : n;
                      f(i0, i1 - i0);
                    });
}

}  // namespace

void silu_mul_isa(Isa isa, float* gate, const float* up, int64_t n) {
  const KernelTable& kt = kernels(isa);
  blocks(n, [&](int64_t i0, int64_t m) { kt.silu_mul(gate + i0, up + i0, m); });
}

void gelu_tanh_mul_isa(Isa isa, float* gate, const float* up, int64_t n) {
  const KernelTable& kt = kernels(isa);
  blocks(n, [&](int64_t i0, int64_t m) { kt.gelu_tanh_mul(gate + i0, up + i0, m); });
}

void softcap_isa(Isa isa, float* x, int64_t n, float cap) {
  FH_CHECK(cap > 0, "softcap: cap must be positive, got ", cap);
  const KernelTable& kt = kernels(isa);
  blocks(n, [&](int64_t i0, int64_t m) { kt.softcap(x + i0, m, cap); });
}

}  // namespace detail

void silu_mul(float* gate, const float* up, int64_t n) { detail::silu_mul_isa(detail::best_isa(), gate, up, n); }
void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  detail::gelu_tanh_mul_isa(detail::best_isa(), gate, up, n);
}
void softcap(float* x, int64_t n, float cap) { detail::softcap_isa(detail::best_isa(), x, n, cap); }

}  // namespace flexh2o::cpu
