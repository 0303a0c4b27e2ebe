// attention.h against double-precision host references written here with the seq_keys
// semantics (left-aligned cache; query t of sequence b at slot seq_keys[b]-tq+t; negative =
// padding row). write_kv and kv_gather are copies and must match bit for bit.
// The references are cross-checked against cpu::attention / write_kv / kv_gather (same API).
#include <tuple>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

// ---- host references --------------------------------------------------------------------

void write_kv_ref(const std::vector<float>& src, int64_t src_stride, int64_t B, int64_t T, int64_t kvh,
                  int64_t hd, std::vector<float>& cache, int64_t cap, const std::vector<int32_t>& seq_keys) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = seq_keys[size_t(b)] - T + t;
      if (slot < 0 || slot >= cap) continue;
      for (int64_t h = 0; h < kvh; ++h)
        for (int64_t d = 0; d < hd; ++d)
          cache[size_t(((b * kvh + h) * cap + slot) * hd + d)] = src[size_t((b * T + t) * src_stride + h * hd + d)];
    }
}

struct AttnShape {
  int64_t tq, n_heads, kv_heads, head_dim, capacity;
  std::vector<int32_t> seq_keys;
};

void attention_ref(const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, float scale, std::vector<float>& out,
                   std::vector<float>& scores) {
  const int64_t B = int64_t(s.seq_keys.size()), H = s.n_heads, hd = s.head_dim, cap = s.capacity;
  const int64_t row = H * hd, grp = H / s.kv_heads;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < s.tq; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* o = &out[size_t((b * s.tq + t) * row + h * hd)];
        const int64_t slot = s.seq_keys[size_t(b)] - s.tq + t;
        if (slot < 0) {
          for (int64_t d = 0; d < hd; ++d) o[d] = 0.f;
          continue;
        }
        const float* qr = &q[size_t((b * s.tq + t) * row + h * hd)];
        const int64_t base = (b * s.kv_heads + h / grp) * cap;
        std::vector<double> p(size_t(slot + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= slot; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += double(qr[d]) * k[size_t((base + j) * hd + d)];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= slot; ++j) acc += p[size_t(j)] * v[size_t((base + j) * hd + d)];
          o[d] = float(acc / sum);
        }
        for (int64_t j = 0; j <= slot; ++j) scores[size_t((b * H + h) * cap + j)] += float(p[size_t(j)] / sum);
      }
}

// Per (b, h) row r: new slot i <- old slot keep[r*keep_stride + i] for i < keep_count[r].
template <class E>
void kv_gather_ref(std::vector<E>& buf, int64_t rows, int64_t cap, int64_t row, const std::vector<int32_t>& keep,
                   int64_t keep_stride, const std::vector<int32_t>& keep_count) {
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<E> old(buf.begin() + r * cap * row, buf.begin() + (r + 1) * cap * row);
    for (int64_t i = 0; i < keep_count[size_t(r)]; ++i)
      for (int64_t e = 0; e < row; ++e)
        buf[size_t((r * cap + i) * row + e)] = old[size_t(keep[size_t(r * keep_stride + i)] * row + e)];
  }
}

// ---- tests ------------------------------------------------------------------------------

class KvGpu : public GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(KvGpu, WriteKvSkipsPaddingAndMatchesExactly) {
  const DType dt = GetParam();
  const int64_t B = 3, kvh = 2, hd = 5, cap = 11;
  for (int64_t T : {1, 5}) {
    const std::vector<int32_t> seq_keys = {int32_t(T), int32_t(T + 3), 2};  // b=2: T=5 -> 3 rows padding
    const int64_t stride = kvh * hd + 7;
    std::vector<float> src = round_to(randn(size_t(B * T * stride), 20), dt);
    std::vector<float> cache = round_to(randn(size_t(B * kvh * cap * hd), 21), dt);
    void* dcache = upload(cache, dt);
    std::vector<float> cpu_cache = cache;
    cpu::write_kv(src.data(), stride, B, T, kvh, hd, cpu_cache.data(), cap, seq_keys.data());
    write_kv_ref(src, stride, B, T, kvh, hd, cache, cap, seq_keys);
    ASSERT_EQ(cpu_cache, cache) << "host reference disagrees with cpu::write_kv";
    write_kv(dt, upload(src, dt), stride, B, T, kvh, hd, dcache, cap, upload_raw(seq_keys), stream());
    expect_close(download(dcache, cache.size(), dt), cache, {0.f, 0.f}, "write_kv T=" + std::to_string(T));
  }
}

TEST_P(KvGpu, KvGatherCompactsInPlace) {
  const DType dt = GetParam();
  const int64_t B = 2, heads = 3, cap = 10, row = 5, ks = 8, rows = B * heads;
  // Per (b, h) row: stable compactions, a swap-remove (slot 2 <- last), identity, empty.
  const std::vector<int32_t> keep = {0, 2, 3, 7, 9, 0, 0, 0,   1, 4, 5, 6, 8, 9, 0, 0,
                                     0, 1, 9, 3, 4, 5, 6, 7,   0, 1, 2, 3, 0, 0, 0, 0,
                                     9, 0, 0, 0, 0, 0, 0, 0,   0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<int32_t> keep_count = {5, 6, 8, 4, 1, 0};
  std::vector<float> buf = round_to(randn(size_t(rows * cap * row), 22), dt);
  void* d = upload(buf, dt);
  kv_gather_ref(buf, rows, cap, row, keep, ks, keep_count);
  kv_gather(dt, d, B, heads, cap, row, upload_raw(keep), ks, upload_raw(keep_count), stream());
  expect_close(download(d, buf.size(), dt), buf, {0.f, 0.f}, "kv_gather cache");
  // key_scores: fp32 [B, n_heads, cap], one element per slot
  std::vector<float> sc = randn(size_t(rows * cap), 23);
  float* dsc = upload_raw(sc);
  std::vector<float> cpu_sc = sc;
  cpu::kv_gather(cpu_sc.data(), B, heads, cap, 1, keep.data(), ks, keep_count.data());
  kv_gather_ref(sc, rows, cap, 1, keep, ks, keep_count);
  ASSERT_EQ(cpu_sc, sc) << "host reference disagrees with cpu::kv_gather";
  kv_gather(DType::F32, dsc, B, heads, cap, 1, upload_raw(keep), ks, upload_raw(keep_count), stream());
  expect_close(download_raw(dsc, sc.size()), sc, {0.f, 0.f}, "kv_gather scores");
}

// (dtype, head_dim, shape)
using AttnParam = std::tuple<DType, int64_t, int>;
class AttnGpu : public GpuTest, public ::testing::WithParamInterface<AttnParam> {};

AttnShape attn_shape(int which, int64_t hd) {
  switch (which) {
    case 0: return {7, 4, 4, hd, 13, {7, 4, 1}};          // prefill, padding rows in b=1,2
    case 1: return {1, 4, 4, hd, 37, {13, 1, 29, 37}};    // decode, one full cache
    case 2: return {5, 6, 2, hd, 23, {23, 5, 3}};         // GQA prefill continuing a cache
    default: return {1, 3, 1, hd, 300, {257, 300}};       // decode, MQA, longer keys
  }
}

// CPU-only: the seq_keys host reference above agrees with cpu::attention on every test shape.
TEST(AttentionReference, AgreesWithCpuKernel) {
  for (int which = 0; which < 4; ++which) {
    const AttnShape s = attn_shape(which, 64);
    const int64_t B = int64_t(s.seq_keys.size()), row = s.n_heads * s.head_dim;
    const size_t cache_n = size_t(B * s.kv_heads * s.capacity * s.head_dim);
    std::vector<float> q = randn(size_t(B * s.tq * row), 50), k = randn(cache_n, 51), v = randn(cache_n, 52);
    std::vector<float> out(q.size()), scores(size_t(B * s.n_heads * s.capacity));
    std::vector<float> cout(q.size(), 7.f), cscores = scores;
    attention_ref(s, q, k, v, 0.125f, out, scores);
    cpu::AttentionArgs c;
    c.q = q.data();
    c.q_stride = c.out_stride = row;
    c.k = k.data();
    c.v = v.data();
    c.batch = B;
    c.tq = s.tq;
    c.n_heads = s.n_heads;
    c.kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.capacity = s.capacity;
    c.seq_keys = s.seq_keys.data();
    c.scale = 0.125f;
    c.out = cout.data();
    c.key_scores = cscores.data();
    cpu::attention(c);
    expect_close(cout, out, {1e-5f, 1e-4f}, "cpu::attention shape " + std::to_string(which));
    expect_close(cscores, scores, {1e-5f, 1e-4f}, "cpu key_scores shape " + std::to_string(which));
  }
}

TEST_P(AttnGpu, MatchesReferenceWithKeyScores) {
  const auto [dt, hd, which] = GetParam();
  const AttnShape s = attn_shape(which, hd);
  const int64_t B = int64_t(s.seq_keys.size()), row = s.n_heads * s.head_dim;
  const size_t cache_n = size_t(B * s.kv_heads * s.capacity * hd);
  std::vector<float> q = round_to(randn(size_t(B * s.tq * row), 30), dt);
  std::vector<float> k = round_to(randn(cache_n, 31), dt), v = round_to(randn(cache_n, 32), dt);
  const float scale = 1.f / std::sqrt(float(hd));
  std::vector<float> out(q.size()), scores = randn(size_t(B * s.n_heads * s.capacity), 33);
  std::vector<float> dscore_init = scores;
  attention_ref(s, q, k, v, scale, out, scores);
  {  // the double-precision reference agrees with the CPU kernel
    std::vector<float> cout(q.size()), cscores = dscore_init;
    cpu::AttentionArgs c;
    c.q = q.data();
    c.q_stride = c.out_stride = row;
    c.k = k.data();
    c.v = v.data();
    c.batch = B;
    c.tq = s.tq;
    c.n_heads = s.n_heads;
    c.kv_heads = s.kv_heads;
    c.head_dim = hd;
    c.capacity = s.capacity;
    c.seq_keys = s.seq_keys.data();
    c.scale = scale;
    c.out = cout.data();
    c.key_scores = cscores.data();
    cpu::attention(c);
    expect_close(cout, out, {1e-5f, 1e-4f}, "cpu::attention vs reference");
    expect_close(cscores, scores, {1e-5f, 1e-4f}, "cpu::attention key_scores vs reference");
  }

  AttentionArgs a;
  a.dtype = dt;
  a.q = upload(q, dt);
  a.q_stride = row;
  a.k = upload(k, dt);
  a.v = upload(v, dt);
  a.batch = B;
  a.tq = s.tq;
  a.n_heads = s.n_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = hd;
  a.capacity = s.capacity;
  a.seq_keys = upload_raw(s.seq_keys);
  a.scale = scale;
  a.out = upload(std::vector<float>(q.size(), 7.f), dt);  // garbage that must be overwritten
  a.out_stride = row;
  a.key_scores = upload_raw(dscore_init);
  attention(a, stream());
  const std::string what = std::string("attention ") + dt_str(dt) + " hd=" + std::to_string(hd) +
                           " shape=" + std::to_string(which);
  expect_close(download(a.out, out.size(), dt), out, tol_for(dt), what + " out");
  expect_close(download_raw(a.key_scores, scores.size()), scores, {1e-5f, 1e-4f}, what + " key_scores");
}

TEST_P(AttnGpu, MaxKeysBoundViolationGivesNaN) {
  const auto [dt, hd, which] = GetParam();
  if (which != 1) GTEST_SKIP() << "one shape suffices";
  const AttnShape s = attn_shape(which, hd);
  const int64_t B = int64_t(s.seq_keys.size()), row = s.n_heads * hd;
  AttentionArgs a;
  a.dtype = dt;
  a.q = upload(std::vector<float>(size_t(B * row), 0.5f), dt);
  a.q_stride = a.out_stride = row;
  a.k = a.v = upload(std::vector<float>(size_t(B * s.kv_heads * s.capacity * hd), 1.f), dt);
  a.batch = B;
  a.tq = 1;
  a.n_heads = s.n_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = hd;
  a.capacity = s.capacity;
  a.max_keys = 13;  // sequences 2 and 3 exceed it
  a.seq_keys = upload_raw(s.seq_keys);
  a.scale = 1.f;
  a.out = alloc<uint16_t>(size_t(B * row));
  attention(a, stream());
  auto o = download(a.out, size_t(B * row), dt);
  for (int64_t b = 0; b < B; ++b)
    EXPECT_EQ(std::isnan(o[size_t(b * row)]), s.seq_keys[size_t(b)] > 13) << "b=" << b;
  EXPECT_NEAR(o[0], 1.f, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvGpu, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& i) { return std::string(dt_str(i.param)); });
INSTANTIATE_TEST_SUITE_P(Shapes, AttnGpu,
                         ::testing::Combine(::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values(int64_t(64), int64_t(128)),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const auto& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_hd" +
                                  std::to_string(std::get<1>(i.param)) + "_s" +
                                  std::to_string(std::get<2>(i.param));
                         });

}  // namespace
}  // namespace flexh2o::gpu::test
