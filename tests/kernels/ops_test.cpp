// The small CPU ops against double-precision references: layernorm, rmsnorm (with Gemma's
// 1 + gamma, and rmsnorm_add), rotary (HF rotate_half), silu_mul, gelu_tanh_mul and softcap
// (every ISA variant), embedding / add_embedding (every weight dtype, bad ids throw), write_kv
// and kv_gather/score_gather.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

class Norms : public ::testing::TestWithParam<std::tuple<DType, int64_t /*M*/, int64_t /*D*/>> {};

TEST_P(Norms, LayerNormAndRmsNorm) {
  const auto [dt, M, D] = GetParam();
  auto x = randn(size_t(M * D), 4, 3.f);
  for (auto& v : x) v += 1.5f;  // non-zero mean
  const Weights g = make_weights(dt, {D}, 5), b = make_weights(dt, {D}, 6);
  std::vector<float> y(x.size());
  std::vector<double> r(x.size());
  layernorm(x.data(), M, D, g.view, b.view, 1e-5f, y.data());
  for (int64_t m = 0; m < M; ++m) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mean += x[m * D + i];
    mean /= D;
    for (int64_t i = 0; i < D; ++i) var += (x[m * D + i] - mean) * (x[m * D + i] - mean);
    var /= D;
    for (int64_t i = 0; i < D; ++i)
      r[m * D + i] = (x[m * D + i] - mean) / std::sqrt(var + 1e-5) * g.values[i] + b.values[i];
  }
  expect_close(y.data(), r.data(), r.size(), 1e-5, 1e-4, "layernorm");
  std::vector<float> inplace = x;  // x and y may alias
  layernorm(inplace.data(), M, D, g.view, b.view, 1e-5f, inplace.data());
  EXPECT_TRUE(bit_equal(inplace.data(), y.data(), y.size()));

  rmsnorm(x.data(), M, D, g.view, 1e-6f, y.data());
  for (int64_t m = 0; m < M; ++m) {
    double ms = 0;
    for (int64_t i = 0; i < D; ++i) ms += double(x[m * D + i]) * x[m * D + i];
    ms /= D;
    for (int64_t i = 0; i < D; ++i) r[m * D + i] = x[m * D + i] / std::sqrt(ms + 1e-6) * g.values[i];
  }
  expect_close(y.data(), r.data(), r.size(), 1e-5, 1e-4, "rmsnorm");

  // Gemma: times 1 + gamma; rmsnorm_add adds that into y.
  rmsnorm(x.data(), M, D, g.view, 1e-6f, y.data(), 1.f);
  std::vector<float> acc = randn(x.size(), 7), acc0 = acc;
  rmsnorm_add(x.data(), M, D, g.view, 1e-6f, 1.f, acc.data());
  std::vector<double> ra(x.size());
  for (int64_t m = 0; m < M; ++m) {
    double ms = 0;
    for (int64_t i = 0; i < D; ++i) ms += double(x[m * D + i]) * x[m * D + i];
    ms /= D;
    for (int64_t i = 0; i < D; ++i) {
      r[m * D + i] = x[m * D + i] / std::sqrt(ms + 1e-6) * (1.0 + g.values[i]);
      ra[m * D + i] = acc0[m * D + i] + r[m * D + i];
    }
  }
  expect_close(y.data(), r.data(), r.size(), 1e-5, 1e-4, "rmsnorm offset 1");
  expect_close(acc.data(), ra.data(), ra.size(), 1e-5, 1e-4, "rmsnorm_add");
  EXPECT_THROW(rmsnorm_add(acc.data(), M, D, g.view, 1e-6f, 1.f, acc.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(All, Norms,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Values<int64_t>(1, 3, 129),
                                            ::testing::Values<int64_t>(1, 17, 768, 1031)));

// Pairs turn by position * inv_freq[i] with cos and sin times attention_factor; the table is
// the default one and, for scaled ropes, an arbitrary one (any per-pair frequency must be used
// as given, in its own pair). With partial rotary (Phi-3's partial_rotary_factor) only the
// head's first rotary_dims values turn, in pairs (i, i + rotary_dims/2); the rest pass unchanged.
TEST(Rotary, MatchesHfRotateHalf) {
  for (int64_t hd : {2, 64, 80, 128})
    for (const bool scaled : {false, true})
      for (const int64_t rd : {hd, std::max<int64_t>(2, hd * 3 / 4 / 2 * 2)}) {
        const int64_t T = 9, H = 3, stride = H * hd + 7, half = rd / 2;
        auto x = randn(size_t(T * stride), 8);
        const auto x0 = x;
        std::vector<int32_t> pos(T);
        for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t * 37 + (t % 2) * 1000);
        std::vector<double> inv(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i)
          inv[size_t(i)] =
              scaled ? 0.9 / double(1 + 3 * ((i * 7) % half)) : std::pow(10000.0, -2.0 * double(i) / double(rd));
        const double af = scaled ? 1.25 : 1.0;
        rotary(x.data(), T, H, hd, stride, pos.data(), inv.data(), rd, float(af));
        std::vector<double> r(x.begin(), x.end());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < rd; ++i) {  // q*cos + rotate_half(q)*sin, rotate_half = [-x2, x1]
              const double a = pos[t] * inv[size_t(i % half)];
              const float* v = x0.data() + t * stride + h * hd;
              const double rot = i < half ? -double(v[i + half]) : double(v[i - half]);
              r[t * stride + h * hd + i] = (v[i] * std::cos(a) + rot * std::sin(a)) * af;
            }
        expect_close(x.data(), r.data(), r.size(), 1e-5, 1e-5,
                     "rotary hd=" + std::to_string(hd) + " rd=" + std::to_string(rd) + (scaled ? " scaled" : ""));
      }
}

class SiluMul : public ::testing::TestWithParam<Isa> {};
TEST_P(SiluMul, MatchesReference) {
  for (int64_t n : {1, 7, 16, 1000, 100003}) {
    auto g = randn(size_t(n), 9, 6.f), u = randn(size_t(n), 10);
    if (n > 4) g[0] = 95.f, g[1] = -95.f, g[2] = 0.f;  // extremes
    const auto g0 = g;
    detail::silu_mul_isa(GetParam(), g.data(), u.data(), n);
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[i] = g0[i] / (1.0 + std::exp(-double(g0[i]))) * u[i];
    expect_close(g.data(), r.data(), r.size(), 1e-6, 1e-5, "silu_mul n=" + std::to_string(n));
  }
}
// PyTorch's gelu(approximate="tanh") times up, and cap * tanh(x / cap), against double references,
// extremes included (saturation must give the limit, not NaN).
TEST_P(SiluMul, GeluTanhAndSoftcapMatchReference) {
  for (int64_t n : {1, 7, 16, 1000, 100003}) {
    auto g = randn(size_t(n), 11, 4.f), u = randn(size_t(n), 12);
    if (n > 4) g[0] = 95.f, g[1] = -95.f, g[2] = 0.f, g[3] = -1e-4f;
    auto x = g;
    const auto g0 = g;
    detail::gelu_tanh_mul_isa(GetParam(), g.data(), u.data(), n);
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double v = g0[i];
      r[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))) * u[i];
    }
    expect_close(g.data(), r.data(), r.size(), 1e-6, 1e-5, "gelu_tanh_mul n=" + std::to_string(n));
    for (const float cap : {0.5f, 5.f, 50.f}) {
      auto y = x;
      detail::softcap_isa(GetParam(), y.data(), n, cap);
      for (int64_t i = 0; i < n; ++i) r[i] = cap * std::tanh(double(x[i]) / cap);
      expect_close(y.data(), r.data(), r.size(), 2e-7 * cap, 1e-5, "softcap " + std::to_string(cap));
    }
  }
  float one = 1.f;
  EXPECT_THROW(detail::softcap_isa(GetParam(), &one, 1, 0.f), Error);
}
INSTANTIATE_TEST_SUITE_P(All, SiluMul, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return isa_str(i.param); });

TEST(Embedding, GathersAndAddsEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const int64_t V = 50, D = 33, T = 6;
    const Weights tab = make_weights(dt, {V, D}, 12);
    const std::vector<int32_t> ids = {0, 49, 7, 7, 13, 1};
    std::vector<float> out(size_t(T * D), -1.f);
    embedding(ids.data(), T, tab.view, out.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D; ++i) ASSERT_EQ(out[t * D + i], tab.values[ids[t] * D + i]);
    const std::vector<int32_t> rows = {2, 3, 4, 5, 6, 7};
    add_embedding(rows.data(), T, tab.view, out.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D; ++i)
        ASSERT_EQ(out[t * D + i], tab.values[ids[t] * D + i] + tab.values[rows[t] * D + i]);
    const std::vector<int32_t> bad = {0, 50};
    EXPECT_THROW(embedding(bad.data(), 2, tab.view, out.data()), Error);
    const std::vector<int32_t> neg = {-1};
    EXPECT_THROW(add_embedding(neg.data(), 1, tab.view, out.data()), Error);
  }
}

TEST(WriteKv, CopiesRowsIntoSequenceSlots) {
  // seq_keys: b=0 appends 3 rows after 4 cached ones; b=1 fills [0,3); b=2 has only 2 real
  // rows (row 0 is padding and is skipped).
  const int64_t B = 3, T = 3, KV = 2, hd = 5, cap = 8, stride = KV * hd + 1;
  const std::vector<int32_t> seq_keys = {7, 3, 2};
  const auto src = randn(size_t(B * T * stride), 13);
  std::vector<float> cache(size_t(B * KV * cap * hd), -7.f);
  write_kv(src.data(), stride, B, T, KV, hd, cache.data(), cap, seq_keys.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < KV; ++g)
      for (int64_t s = 0; s < cap; ++s)
        for (int64_t i = 0; i < hd; ++i) {
          const float v = cache[((b * KV + g) * cap + s) * hd + i];
          const int64_t t = s - (seq_keys[b] - T);  // source row of slot s
          if (t >= 0 && t < T && s < seq_keys[b])
            ASSERT_EQ(v, src[(b * T + t) * stride + g * hd + i]) << b << " " << g << " " << s;
          else
            ASSERT_EQ(v, -7.f) << b << " " << g << " " << s;
        }
  const std::vector<int32_t> over = {9, 3, 2}, neg = {7, -1, 2};
  EXPECT_THROW(write_kv(src.data(), stride, B, T, KV, hd, cache.data(), cap, over.data()), Error);
  EXPECT_THROW(write_kv(src.data(), stride, B, T, KV, hd, cache.data(), cap, neg.data()), Error);
}

// A cache whose element (row r, slot s, i) encodes r, s and i, so every move is traceable.
std::vector<float> traced_cache(int64_t rows, int64_t cap, int64_t hd) {
  std::vector<float> c(size_t(rows * cap * hd));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < cap; ++s)
      for (int64_t i = 0; i < hd; ++i) c[size_t((r * cap + s) * hd + i)] = float(r * 10000 + s * 100 + i);
  return c;
}

TEST(KvGather, StableCompactionAndSwapRemovePerHead) {
  const int64_t B = 2, KV = 2, cap = 9, hd = 3, stride = 10;
  std::vector<int32_t> keep(size_t(B * KV * stride), -99);
  std::vector<int32_t> count(size_t(B * KV));
  auto set = [&](int64_t r, std::vector<int32_t> k) {
    std::copy(k.begin(), k.end(), keep.begin() + r * stride);
    count[size_t(r)] = int32_t(k.size());
  };
  set(0, {0, 2, 3, 6, 8});                 // stable compaction: evict 1, 4, 5, 7
  set(1, {0, 1, 2, 8, 4, 5, 6, 7});        // swap-remove: victim 3 <- last slot 8
  set(2, {0, 1, 2, 3, 4, 5, 6, 7, 8});     // keep everything (identity)
  set(3, {});                              // evict everything
  const auto before = traced_cache(B * KV, cap, hd);
  auto cache = before;
  kv_gather(cache.data(), B, KV, cap, hd, keep.data(), stride, count.data());
  for (int64_t r = 0; r < B * KV; ++r)
    for (int64_t s = 0; s < cap; ++s)
      for (int64_t i = 0; i < hd; ++i) {
        const int64_t from = s < count[size_t(r)] ? keep[size_t(r * stride + s)] : s;  // tail unchanged
        ASSERT_EQ(cache[size_t((r * cap + s) * hd + i)], before[size_t((r * cap + from) * hd + i)])
            << "row " << r << " slot " << s;
      }
  // Scores (head_dim 1) through score_gather: same moves.
  auto sc = traced_cache(B * KV, cap, 1), sc0 = sc;
  score_gather(sc.data(), B, KV, cap, keep.data(), stride, count.data());
  for (int64_t r = 0; r < B * KV; ++r)
    for (int64_t s = 0; s < cap; ++s) {
      const int64_t from = s < count[size_t(r)] ? keep[size_t(r * stride + s)] : s;
      ASSERT_EQ(sc[size_t(r * cap + s)], sc0[size_t(r * cap + from)]);
    }
}

TEST(KvGather, RejectsBadKeepListsBeforeMovingAnything) {
  const int64_t B = 1, KV = 2, cap = 6, hd = 2, stride = 6;
  const auto before = traced_cache(B * KV, cap, hd);
  auto run = [&](std::vector<int32_t> k0, std::vector<int32_t> k1) {
    std::vector<int32_t> keep(size_t(KV * stride), 0), count = {int32_t(k0.size()), int32_t(k1.size())};
    std::copy(k0.begin(), k0.end(), keep.begin());
    std::copy(k1.begin(), k1.end(), keep.begin() + stride);
    auto cache = before;
    bool threw = false;
    try {
      kv_gather(cache.data(), B, KV, cap, hd, keep.data(), stride, count.data());
    } catch (const Error&) {
      threw = true;
    }
    if (threw) {
      EXPECT_TRUE(cache == before) << "cache modified by a rejected call";
    }
    return threw;
  };
  EXPECT_FALSE(run({0, 2, 4}, {5, 1}));  // valid (the guard of this test itself)
  // Row 0 is valid and would move data; row 1 breaks keep[i] >= i: nothing may move.
  EXPECT_TRUE(run({1, 2, 5}, {0, 2, 1}));
  EXPECT_TRUE(run({1, 2, 5}, {0, 6}));            // keep beyond capacity
  EXPECT_TRUE(run({1, 2, 5}, {-1}));              // negative
  EXPECT_TRUE(run({0, 1, 2, 3, 4, 5, 5}, {}));    // keep_count > capacity / keep_stride
}

}  // namespace
}  // namespace flexh2o::cpu::test
