// The CUDA Q4 kernels (kernels/cuda/q4.h) against the host reference of core/quant4.cpp: records
// and decoded values bit for bit (encode, decode, write_kv into a Q4 cache, kv_gather of records,
// embeddings), the fused GEMV and the tiled dequantize + cuBLAS path within fp32 rounding of
// dequantize + a double reference, and attention over a Q4 cache against cpu::attention on the
// decoded cache. Shapes: 1, primes, non-multiples of 64, constant groups. The shared group math
// (detail/q4_math.h) is also checked on the CPU, so it is pinned in builds without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/quant4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/detail/q4_math.h"
#include "kernels/cuda/q4.h"
#include "tests/kernels_cuda/util.h"

namespace flexh2o::gpu::test {
namespace {

// Rows of `cols` values with awkward content: random, a constant row (every group constant), a
// row with one constant group in random ones, and (cols > 1) a row with a tiny range.
std::vector<float> q4_input(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> v = randn(size_t(rows * cols), seed, 3.f);
  if (rows > 1)
    for (int64_t c = 0; c < cols; ++c) v[size_t(cols + c)] = -1.25f;
  if (rows > 2)
    for (int64_t c = 0; c < std::min<int64_t>(cols, 64); ++c) v[size_t(2 * cols + c)] = 0.5f;
  if (rows > 3)
    for (int64_t c = 0; c < cols; ++c) v[size_t(3 * cols + c)] = 1.f + float(c % 3) * 1e-4f;
  return v;
}

// Host records of fp32 values that are exactly representable in dt.
std::vector<uint8_t> host_encode(const std::vector<float>& x, int64_t rows, int64_t cols, DType dt) {
  std::vector<uint8_t> rec(q4::tensor_bytes(rows, cols));
  if (dt == DType::F32) {
    q4::encode_rows(x.data(), cols, rows, cols, rec.data(), "test");
  } else {
    const std::vector<uint16_t> b = to_bits(x, dt);
    if (dt == DType::F16) q4::encode_rows_f16(b.data(), cols, rows, cols, rec.data(), "test");
    else q4::encode_rows_bf16(b.data(), cols, rows, cols, rec.data(), "test");
  }
  return rec;
}
std::vector<float> host_decode(const std::vector<uint8_t>& rec, int64_t rows, int64_t cols) {
  std::vector<float> x(size_t(rows * cols));
  q4::decode_rows(rec.data(), rows, cols, x.data(), cols);
  return x;
}
std::vector<uint32_t> as_u32(const std::vector<uint8_t>& b) { return std::vector<uint32_t>(b.begin(), b.end()); }
std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> u(v.size());
  std::memcpy(u.data(), v.data(), v.size() * 4);
  return u;
}

const int64_t kCols[] = {1, 2, 7, 63, 64, 65, 127, 128, 131, 200};

// ---- the shared group math, on the CPU ----------------------------------------------------

// Encodes like the kernels do (group_meta, code) but on the host, for the comparison below.
std::vector<uint8_t> mirror_encode(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> rec(q4::tensor_bytes(rows, cols), 0);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = rec.data() + r * q4::row_bytes(cols);
    for (int64_t g = 0; g < q4::groups(cols); ++g) {
      const int64_t k0 = g * q4::kGroup, k1 = std::min(k0 + q4::kGroup, cols);
      float mn = x[size_t(r * cols + k0)], mx = mn;
      for (int64_t k = k0; k < k1; ++k) mn = std::min(mn, x[size_t(r * cols + k)]), mx = std::max(mx, x[size_t(r * cols + k)]);
      uint16_t d = 0, m = 0;
      EXPECT_TRUE(detail::q4m::group_meta(mn, mx, &d, &m));
      for (int64_t k = k0; k < k1; ++k)
        out[k / 2] |= uint8_t(detail::q4m::code(x[size_t(r * cols + k)], f16_to_f32(d), f16_to_f32(m)) << (4 * (k & 1)));
      uint8_t* mp = out + q4::meta_offset(cols) + 4 * g;
      mp[0] = uint8_t(d), mp[1] = uint8_t(d >> 8), mp[2] = uint8_t(m), mp[3] = uint8_t(m >> 8);
    }
  }
  return rec;
}

TEST(Q4Math, GroupMathMatchesHostReference) {
  for (int64_t cols : kCols) {
    const int64_t rows = 5;
    const std::vector<float> x = q4_input(rows, cols, uint32_t(100 + cols));
    const std::vector<uint8_t> want = host_encode(x, rows, cols, DType::F32);
    EXPECT_EQ(as_u32(mirror_encode(x, rows, cols)), as_u32(want)) << "cols=" << cols;
    // decode_chunk (masked past cols) == decode_rows
    const std::vector<float> ref = host_decode(want, rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < detail::q4m::chunks(cols); ++c) {
        const auto ch = detail::q4m::decode_chunk(want.data() + r * q4::row_bytes(cols), q4::meta_offset(cols), c);
        for (int64_t e = 0; e < 8 && 8 * c + e < cols; ++e)
          ASSERT_EQ(float_bits({ch.v[e]})[0], float_bits({ref[size_t(r * cols + 8 * c + e)]})[0])
              << "cols=" << cols << " r=" << r << " k=" << 8 * c + e;
      }
  }
}

TEST(Q4Math, RefusedGroupsGetNanMeta) {
  uint16_t d = 0, m = 0;
  EXPECT_FALSE(detail::q4m::group_meta(NAN, 1.f, &d, &m));
  EXPECT_EQ(d, detail::q4m::kNanBits);
  EXPECT_FALSE(detail::q4m::group_meta(0.f, INFINITY, &d, &m));
  EXPECT_FALSE(detail::q4m::group_meta(0.f, 70000.f, &d, &m));  // finite fp32, not fp16: the host refuses it too
  EXPECT_THROW(q4::encode_rows(std::vector<float>{0.f, 70000.f}.data(), 2, 1, 2,
                               std::vector<uint8_t>(size_t(q4::row_bytes(2))).data(), "t"),
               Error);
  EXPECT_TRUE(detail::q4m::group_meta(-65504.f, 65504.f, &d, &m));
  EXPECT_TRUE(std::isnan(detail::q4m::decode(3, f16_to_f32(detail::q4m::kNanBits), 0.f)));
}

TEST(Q4Dispatch, AttentionTakesQ4Caches) {
  for (DType act : {DType::F16, DType::BF16})
    for (int64_t hd : {32, 64, 80, 128}) EXPECT_EQ(attention_supported(act, DType::Q4, hd), hd == 64 || hd == 128);
  EXPECT_THROW(q4_gemv(DType::F16, nullptr, 17, 64, nullptr, 4, nullptr, nullptr, DType::F16, Epilogue::kStore, nullptr),
               Error);  // M > 16, refused before CUDA is touched
  EXPECT_THROW(q4_encode_rows(DType::I32, nullptr, 4, 1, 4, nullptr, nullptr), Error);
}

// ---- encode / decode ----------------------------------------------------------------------

using RowsParam = std::tuple<DType, int64_t>;  // source dtype, cols
class Q4RowsGpu : public GpuTest, public ::testing::WithParamInterface<RowsParam> {};

TEST_P(Q4RowsGpu, EncodeAndDecodeMatchHostBitForBit) {
  const auto [dt, cols] = GetParam();
  const int64_t rows = 6, stride = cols + 3;  // a source stride wider than the row
  const std::vector<float> x = round_to(q4_input(rows, cols, uint32_t(7 * cols)), dt);
  std::vector<float> strided(size_t(rows * stride), 99.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) strided[size_t(r * stride + c)] = x[size_t(r * cols + c)];
  const std::vector<uint8_t> want = host_encode(x, rows, cols, dt);
  const std::string what = std::string(dt_str(dt)) + " cols=" + std::to_string(cols);

  std::vector<uint8_t> garbage(want.size(), 0xa5);  // padding must be rewritten
  uint8_t* rec = upload_raw(garbage);
  q4_encode_rows(dt, upload(strided, dt), stride, rows, cols, rec, stream());
  expect_bits_equal(as_u32(download_raw(rec, want.size())), as_u32(want), "q4_encode_rows " + what);

  const std::vector<float> ref = host_decode(want, rows, cols);
  // Row strides: not a multiple of 8 (element stores) and one (16-byte stores of full chunks).
  for (int64_t ds : {cols + 5, (cols + 7) / 8 * 8 + 8}) {
    for (DType out : {DType::F32, DType::F16, DType::BF16}) {
      void* d = upload(std::vector<float>(size_t(rows * ds), 7.f), out);
      q4_decode_rows(upload_raw(want), rows, cols, out, d, ds, stream());
      const std::vector<float> got = download(d, size_t(rows * ds), out);
      std::vector<float> packed(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) packed[size_t(r * cols + c)] = got[size_t(r * ds + c)];
      expect_bits_equal(float_bits(packed), float_bits(round_to(ref, out)),
                        std::string("q4_decode_rows -> ") + dt_str(out) + " stride " + std::to_string(ds) + " " + what);
      EXPECT_EQ(got[size_t(ds - 1)], 7.f) << "decode wrote past the row";
    }
  }
}

class Q4RefusedGpu : public GpuTest {};

TEST_F(Q4RefusedGpu, NonFiniteGroupDecodesToNan) {
  const int64_t cols = 130;
  std::vector<float> x = randn(size_t(cols), 5);
  x[70] = NAN;  // group 1 only
  uint8_t* rec = alloc<uint8_t>(size_t(q4::row_bytes(cols)));
  q4_encode_rows(DType::F32, upload(x, DType::F32), cols, 1, cols, rec, stream());
  float* d = alloc<float>(size_t(cols));
  q4_decode_rows(rec, 1, cols, DType::F32, d, cols, stream());
  const std::vector<float> got = download_raw(d, size_t(cols));
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(std::isnan(got[size_t(c)]), c >= 64 && c < 128) << c;
}

// ---- linear ------------------------------------------------------------------------------

// y = ep(x w^T + b) in double from fp32 copies (x, b, y0 in dt; w the decoded weight).
std::vector<float> linear_ref(const std::vector<float>& x, int64_t M, int64_t K, const std::vector<float>& w, int64_t N,
                              const std::vector<float>& b, const std::vector<float>& y0, Epilogue ep) {
  std::vector<float> y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b.empty() ? 0 : b[size_t(n)];
      for (int64_t k = 0; k < K; ++k) s += double(x[size_t(m * K + k)]) * w[size_t(n * K + k)];
      if (ep == Epilogue::kAccumulate) s += y0[size_t(m * N + n)];
      if (ep == Epilogue::kRelu) s = std::max(s, 0.0);
      y[size_t(m * N + n)] = float(s);
    }
  return y;
}

// Tolerance of a length-K fp32 dot product of O(1) terms plus one rounding of the output to dt.
Tol dot_tol(DType out, int64_t K) {
  const float acc = 1e-5f * std::sqrt(float(K)) * 4.f;
  if (out == DType::F32) return {acc, 1e-5f};
  const Tol t = tol_for(out, 1.f);
  return {t.atol + acc, t.rtol};
}

using LinParam = std::tuple<DType, int64_t, int64_t, int64_t>;  // dt, M, K, N
class Q4LinearGpu : public GpuTest, public ::testing::WithParamInterface<LinParam> {};

TEST_P(Q4LinearGpu, MatchesDequantizeThenReference) {
  const auto [dt, M, K, N] = GetParam();
  const std::vector<float> w = q4_input(N, K, uint32_t(K + N));
  const std::vector<uint8_t> rec = host_encode(w, N, K, DType::F32);
  const std::vector<float> wd = host_decode(rec, N, K);
  // x and bias scaled so |y| stays O(1..10): the tolerance is per output rounding.
  const std::vector<float> x = round_to(randn(size_t(M * K), 11, 1.f / std::sqrt(float(K))), dt);
  const std::vector<float> b = round_to(randn(size_t(N), 12), dt), y0 = round_to(randn(size_t(M * N), 13), dt);
  const uint8_t* dw = upload_raw(rec);
  const void* dx = upload(x, dt);
  // Scratch for three weight rows: the tiled path runs several tiles, the last one partial.
  const size_t scratch_bytes = size_t(3 * K) * dtype_size(dt);
  void* scratch = alloc<uint8_t>(scratch_bytes);
  CublasHandle cublas;
  for (Epilogue ep : {Epilogue::kStore, Epilogue::kRelu, Epilogue::kAccumulate}) {
    const std::string what = std::string(dt_str(dt)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                             " N=" + std::to_string(N) + " ep=" + std::to_string(int(ep));
    // The tiled path multiplies the weight rounded to dt (the scratch dtype), the fused one the
    // fp32 decode: each is compared with its own reference.
    const bool fused = M <= kQ4FusedMaxRows;
    const std::vector<float> ref = linear_ref(x, M, K, fused ? wd : round_to(wd, dt), N, b, y0, ep);
    void* y = upload(y0, dt);
    linear_q4(cublas, dt, dx, M, K, dw, N, upload(b, dt), y, ep, scratch, scratch_bytes, stream());
    expect_close(download(y, ref.size(), dt), ref, dot_tol(dt, K), "linear_q4 " + what);
    if (M <= 16) {  // the fused kernel itself, whatever the switch point
      void* y2 = upload(y0, dt);
      q4_gemv(dt, dx, M, K, dw, N, upload(b, dt), y2, dt, ep, stream());
      expect_close(download(y2, ref.size(), dt), linear_ref(x, M, K, wd, N, b, y0, ep), dot_tol(dt, K),
                   "q4_gemv " + what);
    }
  }
  // lm_head form: fp32 logits, no bias.
  const std::vector<float> ref = linear_ref(x, M, K, M <= kQ4FusedMaxRows ? wd : round_to(wd, dt), N, {}, {},
                                            Epilogue::kStore);
  float* y = alloc<float>(ref.size());
  linear_q4_f32out(cublas, dt, dx, M, K, dw, N, y, scratch, scratch_bytes, stream());
  expect_close(download_raw(y, ref.size()), ref, dot_tol(DType::F32, K), std::string("linear_q4_f32out ") + dt_str(dt));
}

// ---- embeddings, the Q4 KV cache ---------------------------------------------------------

using DtParam = DType;
class Q4EmbedGpu : public GpuTest, public ::testing::WithParamInterface<DtParam> {};

TEST_P(Q4EmbedGpu, RowsDecodeLikeHost) {
  const DType dt = GetParam();
  const int64_t V = 11, D = 131;
  const std::vector<uint8_t> rec = host_encode(q4_input(V, D, 3), V, D, DType::F32);
  const std::vector<float> table = host_decode(rec, V, D);
  const std::vector<int32_t> ids = {3, 0, 10, -1, 11, 3, 1};  // -1 and 11: outside -> zeros
  const int64_t T = int64_t(ids.size());
  const std::vector<float> base = round_to(randn(size_t(T * D), 4), dt);
  std::vector<float> want(base.size()), want_add(base.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      const int32_t id = ids[size_t(t)];
      const float e = id >= 0 && id < V ? table[size_t(id * D + d)] : 0.f;
      want[size_t(t * D + d)] = e;
      want_add[size_t(t * D + d)] = base[size_t(t * D + d)] + e;
    }
  const uint8_t* dt_rec = upload_raw(rec);
  void* out = upload(base, dt);
  q4_embedding(dt, upload_raw(ids), T, dt_rec, V, D, out, false, stream());
  expect_bits_equal(float_bits(download(out, base.size(), dt)), float_bits(round_to(want, dt)), "q4_embedding");
  void* out2 = upload(base, dt);
  q4_embedding(dt, upload_raw(ids), T, dt_rec, V, D, out2, true, stream());
  expect_bits_equal(float_bits(download(out2, base.size(), dt)), float_bits(round_to(want_add, dt)),
                    "q4_embedding add");
}

using KvParam = std::tuple<DType, int64_t>;  // activation dtype, head_dim
class Q4KvGpu : public GpuTest, public ::testing::WithParamInterface<KvParam> {};

// write_kv into a Q4 cache gives the host's records; attention over it gives cpu::attention on
// the decoded cache; kv_gather moves whole records.
TEST_P(Q4KvGpu, WriteAttendGather) {
  const auto [act, hd] = GetParam();
  const int64_t B = 3, kvh = 2, H = 4, cap = 41, T = 37, stride = kvh * hd + 6, rb = q4::row_bytes(hd);
  const std::vector<int32_t> seq_keys = {37, 20, 41};  // b=1: 17 rows of left padding; b=2 continues
  const std::vector<float> src = round_to(randn(size_t(B * T * stride), 60), act);
  // The old cache: random records; the slots write_kv skips must keep them.
  std::vector<uint8_t> cache(size_t(B * kvh * cap * rb));
  {
    const std::vector<float> old = q4_input(B * kvh * cap, hd, 61);
    cache = host_encode(old, B * kvh * cap, hd, DType::F32);
  }
  uint8_t* dk = upload_raw(cache);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = seq_keys[size_t(b)] - T + t;
      if (slot < 0) continue;
      for (int64_t h = 0; h < kvh; ++h) {
        std::vector<float> row(src.begin() + (b * T + t) * stride + h * hd, src.begin() + (b * T + t) * stride + (h + 1) * hd);
        const std::vector<uint8_t> r = host_encode(row, 1, hd, act);
        std::copy(r.begin(), r.end(), cache.begin() + ((b * kvh + h) * cap + slot) * rb);
      }
    }
  const int32_t* dkeys = upload_raw(seq_keys);
  write_kv(act, upload(src, act), stride, B, T, kvh, hd, dk, DType::Q4, cap, dkeys, stream());
  const std::string what = std::string(dt_str(act)) + " hd=" + std::to_string(hd);
  expect_bits_equal(as_u32(download_raw(dk, cache.size())), as_u32(cache), "write_kv Q4 " + what);

  // attention (prefill tq = T, GQA 2:1) with K = V = this cache, scores on.
  const std::vector<float> kv = host_decode(cache, B * kvh * cap, hd);
  const std::vector<float> q = round_to(randn(size_t(B * T * H * hd), 62), act);
  const float scale = 1.f / std::sqrt(float(hd));
  std::vector<float> out(q.size()), scores(size_t(B * H * cap), 0.f);
  cpu::AttentionArgs c;
  c.q = q.data();
  c.q_stride = c.out_stride = H * hd;
  c.k = c.v = kv.data();
  c.batch = B, c.tq = T, c.n_heads = H, c.kv_heads = kvh, c.head_dim = hd, c.capacity = cap;
  c.seq_keys = seq_keys.data();
  c.scale = scale;
  c.out = out.data();
  c.key_scores = scores.data();
  cpu::attention(c);
  AttentionArgs a;
  a.dtype = act;
  a.kv_dtype = DType::Q4;
  a.q = upload(q, act);
  a.q_stride = a.out_stride = H * hd;
  a.k = a.v = dk;
  a.batch = B, a.tq = T, a.n_heads = H, a.kv_heads = kvh, a.head_dim = hd, a.capacity = cap;
  a.seq_keys = dkeys;
  a.scale = scale;
  // Both kernels read Q4 rows through the same loader; each is forced once.
  for (const AttentionPath path : {AttentionPath::kShared, AttentionPath::kStreamed}) {
    const std::string how = what + (path == AttentionPath::kShared ? " shared" : " streamed");
    a.path = path;
    a.out = upload(std::vector<float>(q.size(), 7.f), act);
    a.key_scores = upload_raw(std::vector<float>(scores.size(), 0.f));
    attention(a, stream());
    // Values are O(3) (q4_input's scale): the output tolerance of the F16/BF16 tests, scaled.
    expect_close(download(a.out, out.size(), act), out, tol_for(act, 3.f), "attention Q4 " + how);
    expect_close(download_raw(a.key_scores, scores.size()), scores, {1e-5f, 1e-4f}, "key_scores Q4 " + how);
  }

  // kv_gather: per (b, h) row keep every other slot of the first 20.
  const int64_t rows = B * kvh, ks = 10;
  std::vector<int32_t> keep(size_t(rows * ks)), count(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    count[size_t(r)] = int32_t(r % 2 ? ks : 3);
    for (int64_t i = 0; i < ks; ++i) keep[size_t(r * ks + i)] = int32_t(2 * i);
  }
  std::vector<uint8_t> gathered = cache;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < count[size_t(r)]; ++i)
      std::copy_n(cache.begin() + (r * cap + keep[size_t(r * ks + i)]) * rb, rb, gathered.begin() + (r * cap + i) * rb);
  kv_gather(DType::Q4, dk, B, kvh, cap, hd, upload_raw(keep), ks, upload_raw(count), stream());
  expect_bits_equal(as_u32(download_raw(dk, cache.size())), as_u32(gathered), "kv_gather Q4 " + what);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Q4RowsGpu,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::ValuesIn(kCols)),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_c" + std::to_string(std::get<1>(i.param));
                         });
INSTANTIATE_TEST_SUITE_P(Shapes, Q4LinearGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(int64_t(1), int64_t(3), int64_t(8), int64_t(16),
                                                              int64_t(37)),
                                            ::testing::Values(int64_t(1), int64_t(7), int64_t(64), int64_t(131),
                                                              int64_t(256)),
                                            ::testing::Values(int64_t(1), int64_t(5), int64_t(33))),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_M" + std::to_string(std::get<1>(i.param)) +
                                  "_K" + std::to_string(std::get<2>(i.param)) + "_N" +
                                  std::to_string(std::get<3>(i.param));
                         });
INSTANTIATE_TEST_SUITE_P(Dtypes, Q4EmbedGpu, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& i) { return std::string(dt_str(i.param)); });
INSTANTIATE_TEST_SUITE_P(Shapes, Q4KvGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(int64_t(64), int64_t(128), int64_t(256))),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_hd" + std::to_string(std::get<1>(i.param));
                         });

}  // namespace
}  // namespace flexh2o::gpu::test
