// Q4 row kernels of q4.h: encode (one thread per group of 64, two passes over it: min/max, then
// codes), decode and embedding rows (one thread per 8-element chunk: one 32-bit word of codes
// and the group's {d, m}), and the Q4 KV-cache write (encode of the new rows into their slots).
// The group math is detail/q4_math.h, shared bit for bit with the host reference.
#include "core/quant4.h"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/q4_math.h"
#include "kernels/cuda/q4.h"

namespace flexh2o::gpu {
namespace {

using detail::exact_f;
using detail::f16_bits_to_f32;
using detail::from_f;
using detail::round_f;
using detail::to_f;

// Encodes group g of the row of `cols` values at x into the record at rec; the thread of the
// last group also zeroes the padding between the codes and the meta.
template <class S>
__device__ void encode_group(const S* x, int64_t cols, int64_t g, uint8_t* rec) {
  const int64_t k0 = g * q4::kGroup, k1 = min(k0 + q4::kGroup, cols);
  float mn = exact_f(x[k0]), mx = mn;
  bool finite = isfinite(mn);
  for (int64_t k = k0 + 1; k < k1; ++k) {
    const float v = exact_f(x[k]);
    finite = finite && isfinite(v);
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  uint16_t db = 0, mb = 0;
  const bool ok = detail::q4m::group_meta(finite ? mn : NAN, mx, &db, &mb);
  const float d = f16_bits_to_f32(db), m = f16_bits_to_f32(mb);
  for (int64_t k = k0; k < k1; k += 2) {
    const uint32_t lo = ok ? detail::q4m::code(exact_f(x[k]), d, m) : 0u;
    const uint32_t hi = ok && k + 1 < k1 ? detail::q4m::code(exact_f(x[k + 1]), d, m) : 0u;
    rec[k / 2] = uint8_t(lo | hi << 4);
  }
  uint16_t* meta = reinterpret_cast<uint16_t*>(rec + q4::meta_offset(cols)) + 2 * g;
  meta[0] = db;
  meta[1] = mb;
  if (g == q4::groups(cols) - 1)
    for (int64_t p = q4::code_bytes(cols); p < q4::meta_offset(cols); ++p) rec[p] = 0;
}

template <class S>
__global__ void encode_rows_kernel(const S* src, int64_t stride, int64_t rows, int64_t cols, uint8_t* dst) {
  const int64_t G = q4::groups(cols), rb = q4::row_bytes(cols), n = rows * G;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int64_t r = i / G, g = i % G;
    encode_group(src + r * stride, cols, g, dst + r * rb);
  }
}

template <class S>
__global__ void write_kv_q4_kernel(const S* src, int64_t src_stride, int64_t B, int64_t T_, int64_t kvh, int64_t hd,
                                   uint8_t* cache, int64_t capacity, const int32_t* seq_keys) {
  const int64_t G = q4::groups(hd), rb = q4::row_bytes(hd), n = B * T_ * kvh * G;
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) {
    const int64_t g = i % G, h = (i / G) % kvh, bt = i / (G * kvh), b = bt / T_, t = bt % T_;
    const int64_t slot = int64_t(seq_keys[b]) - T_ + t;
    if (slot < 0 || slot >= capacity) continue;
    encode_group(src + bt * src_stride + h * hd, hd, g, cache + ((b * kvh + h) * capacity + slot) * rb);
  }
}

using detail::q4m::Chunk;
using detail::q4m::decode_chunk;

// Rounds a chunk's eight values to D and stores them; `vec` (2-byte D, out 16-byte aligned):
// as one 16-byte store, so a warp writes 512 contiguous bytes per instruction.
template <class D>
__device__ __forceinline__ void store8(D* out, const Chunk& x, bool vec) {
  if constexpr (sizeof(D) == 2) {
    if (vec) {
      union {
        uint4 u;
        D h[8];
      } p;
#pragma unroll
      for (int e = 0; e < 8; ++e) p.h[e] = round_f<D>(x.v[e]);
      *reinterpret_cast<uint4*>(out) = p.u;
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = round_f<D>(x.v[e]);
}

template <class D>
__global__ void decode_rows_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t cols, D* __restrict__ dst,
                                   int64_t stride, bool vec) {
  const int64_t C = detail::q4m::chunks(cols), rb = q4::row_bytes(cols), moff = q4::meta_offset(cols);
  for (int64_t i = detail::global_tid(); i < rows * C; i += detail::grid_stride()) {
    const int64_t r = i / C, c = i % C;
    const Chunk x = decode_chunk(src + r * rb, moff, c);
    D* out = dst + r * stride + 8 * c;
    if (8 * c + 8 <= cols) {
      store8(out, x, vec);
    } else {
      for (int64_t e = 0; e < cols - 8 * c; ++e) out[e] = round_f<D>(x.v[e]);
    }
  }
}

template <class T, bool kAdd>
__global__ void embedding_q4_kernel(const int32_t* ids, int64_t T_, const uint8_t* table, int64_t V, int64_t D_,
                                    T* out) {
  const int64_t C = detail::q4m::chunks(D_), rb = q4::row_bytes(D_), moff = q4::meta_offset(D_);
  for (int64_t i = detail::global_tid(); i < T_ * C; i += detail::grid_stride()) {
    const int64_t t = i / C, c = i % C, id = ids[t];
    Chunk x{};
    if (id >= 0 && id < V) x = decode_chunk(table + id * rb, moff, c);
    T* o = out + t * D_ + 8 * c;
    const int64_t e_end = min(int64_t(8), D_ - 8 * c);
    for (int64_t e = 0; e < e_end; ++e) o[e] = from_f<T>(kAdd ? to_f(o[e]) + x.v[e] : x.v[e]);
  }
}

void check_aligned(const void* p, const char* op) {
  FH_CHECK(reinterpret_cast<uintptr_t>(p) % 4 == 0, op, ": Q4 records must start 4-byte aligned");
}

}  // namespace

void q4_encode_rows(DType src_dtype, const void* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                    cudaStream_t stream) {
  FH_CHECK(rows >= 0 && cols > 0 && src_stride >= cols, "q4_encode_rows: bad sizes rows=", rows, " cols=", cols,
           " stride=", src_stride);
  if (rows == 0) return;
  FH_CHECK(src && dst, "q4_encode_rows: null pointer");
  check_aligned(dst, "q4_encode_rows");
  const bool ok = detail::dispatch_float(src_dtype, [&](auto tag) {
    using S = decltype(tag);
    encode_rows_kernel<S><<<detail::grid_size_1d(rows * q4::groups(cols)), detail::kThreads, 0, stream>>>(
        static_cast<const S*>(src), src_stride, rows, cols, static_cast<uint8_t*>(dst));
    FH_CUDA_LAUNCH_CHECK("q4_encode_rows", stream);
  });
  FH_CHECK(ok, "q4_encode_rows: unsupported source dtype ", dtype_name(src_dtype), " (F32, F16, BF16)");
}

void q4_decode_rows(const void* src, int64_t rows, int64_t cols, DType dst_dtype, void* dst, int64_t dst_stride,
                    cudaStream_t stream) {
  FH_CHECK(rows >= 0 && cols > 0 && dst_stride >= cols, "q4_decode_rows: bad sizes rows=", rows, " cols=", cols,
           " stride=", dst_stride);
  if (rows == 0) return;
  FH_CHECK(src && dst, "q4_decode_rows: null pointer");
  check_aligned(src, "q4_decode_rows");
  const bool ok = detail::dispatch_float(dst_dtype, [&](auto tag) {
    using D = decltype(tag);
    const bool vec = sizeof(D) == 2 && dst_stride % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    decode_rows_kernel<D><<<detail::grid_size_1d(rows * detail::ceil_div(cols, 8)), detail::kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(src), rows, cols, static_cast<D*>(dst), dst_stride, vec);
    FH_CUDA_LAUNCH_CHECK("q4_decode_rows", stream);
  });
  FH_CHECK(ok, "q4_decode_rows: unsupported destination dtype ", dtype_name(dst_dtype), " (F32, F16, BF16)");
}

void q4_write_kv(DType src_dtype, const void* src, int64_t src_stride, int64_t B, int64_t T, int64_t kv_heads,
                 int64_t head_dim, void* cache, int64_t capacity, const int32_t* seq_keys, cudaStream_t stream) {
  FH_CHECK(B >= 0 && T >= 0 && kv_heads > 0 && head_dim > 0 && capacity >= 0, "write_kv (Q4): bad sizes");
  FH_CHECK(src_stride >= kv_heads * head_dim, "write_kv (Q4): src_stride ", src_stride, " < kv_heads*head_dim");
  if (B == 0 || T == 0) return;
  FH_CHECK(src && cache && seq_keys, "write_kv (Q4): null pointer");
  check_aligned(cache, "write_kv (Q4)");
  detail::dispatch_half(src_dtype, "write_kv (Q4)", [&](auto tag) {
    using S = decltype(tag);
    const int64_t n = B * T * kv_heads * q4::groups(head_dim);
    write_kv_q4_kernel<S><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
        static_cast<const S*>(src), src_stride, B, T, kv_heads, head_dim, static_cast<uint8_t*>(cache), capacity,
        seq_keys);
    FH_CUDA_LAUNCH_CHECK("write_kv (Q4)", stream);
  });
}

void q4_embedding(DType dt, const int32_t* ids, int64_t T, const void* table, int64_t V, int64_t D, void* out,
                  bool add, cudaStream_t stream) {
  const char* op = add ? "add_embedding (Q4)" : "embedding (Q4)";
  FH_CHECK(T >= 0 && V > 0 && D > 0, op, ": bad sizes T=", T, " V=", V, " D=", D);
  if (T == 0) return;
  FH_CHECK(ids && table && out, op, ": null pointer");
  check_aligned(table, op);
  detail::dispatch_half(dt, op, [&](auto tag) {
    using E = decltype(tag);
    const unsigned grid = detail::grid_size_1d(T * detail::ceil_div(D, 8));
    const auto* tb = static_cast<const uint8_t*>(table);
    if (add)
      embedding_q4_kernel<E, true><<<grid, detail::kThreads, 0, stream>>>(ids, T, tb, V, D, static_cast<E*>(out));
    else
      embedding_q4_kernel<E, false><<<grid, detail::kThreads, 0, stream>>>(ids, T, tb, V, D, static_cast<E*>(out));
    FH_CUDA_LAUNCH_CHECK(op, stream);
  });
}

}  // namespace flexh2o::gpu
