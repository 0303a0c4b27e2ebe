// linear() and embedding() with Q4 weights (core/quant4.h) on every ISA variant of this
// machine: bit for bit the fp32 op over q4::decode_rows of the same records (the kernels
// decode inside, in registers or into the packed panel), within fp32 rounding of a double
// reference, and the determinism contract (a row's bits do not depend on M or threads).
#include <tbb/task_arena.h>

#include <tuple>

#include "core/quant4.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

// A Q4 weight [N, K] from random values (with a few constant groups), and its decoded fp32
// values as a second, F32 view.
struct Q4Weights {
  std::vector<uint8_t> rec;
  std::vector<float> dec;
  TensorView q4, f32;
};
Q4Weights make_q4(int64_t N, int64_t K, uint32_t seed, float scale) {
  Q4Weights w;
  auto v = randn(size_t(N * K), seed, scale);
  for (int64_t n = 0; n < N; n += 3)  // every third row: its first group constant
    for (int64_t k = 0; k < std::min<int64_t>(K, q4::kGroup); ++k) v[size_t(n * K + k)] = 0.25f * scale;
  w.rec.resize(size_t(q4::tensor_bytes(N, K)));
  q4::encode_rows(v.data(), K, N, K, w.rec.data(), "test weight");
  w.dec.resize(v.size());
  q4::decode_rows(w.rec.data(), N, K, w.dec.data(), K);
  w.q4 = TensorView{w.rec.data(), DType::Q4, Shape{N, K}};
  w.f32 = TensorView{w.dec.data(), DType::F32, Shape{N, K}};
  return w;
}

using Q4LinearParam = std::tuple<Isa, int64_t /*M*/, int64_t /*K*/>;
class Q4Linear : public ::testing::TestWithParam<Q4LinearParam> {};

TEST_P(Q4Linear, EqualsF32LinearOverDecodedWeightsAndTheDoubleReference) {
  const auto [isa, M, K] = GetParam();
  const auto x = randn(size_t(M * K), 7 + uint32_t(M * 131 + K));
  for (int64_t N : {1, 5, 33, 97}) {
    const Q4Weights w = make_q4(N, K, uint32_t(N * 11 + K), 1.f / std::sqrt(float(K)));
    const Weights bias = make_weights(DType::F32, {N}, uint32_t(N + 5));
    const auto y0 = randn(size_t(M * N), 17);
    for (Epilogue ep : {Epilogue::kStore, Epilogue::kAccumulate}) {
      std::vector<float> yq = y0, yf = y0;
      detail::linear_isa(isa, x.data(), M, K, w.q4, &bias.view, yq.data(), ep);
      detail::linear_isa(isa, x.data(), M, K, w.f32, &bias.view, yf.data(), ep);
      EXPECT_TRUE(bit_equal(yq.data(), yf.data(), yq.size())) << "N=" << N << " ep=" << int(ep);
      // Independently of the f32 kernel: |y - ref| within fp32 accumulation error, relative
      // to sum |x||w| (K terms, each rounding at most 2^-24 relative, plus slack).
      int bad = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = double(x[size_t(m * K + k)]) * double(w.dec[size_t(n * K + k)]);
            s += p;
            mag += std::fabs(p);
          }
          double ref = s + bias.values[size_t(n)];
          if (ep == Epilogue::kAccumulate) ref += y0[size_t(m * N + n)];
          const double got = yq[size_t(m * N + n)];
          const double tol = double(K + 4) * std::ldexp(1.0, -23) * (mag + std::fabs(ref) + 1.0);
          if ((std::isnan(got) || std::fabs(got - ref) > tol) && bad++ < 5)
            ADD_FAILURE() << "m=" << m << " n=" << n << " got " << got << " ref " << ref;
        }
      EXPECT_EQ(bad, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Q4Linear,
                         ::testing::Combine(::testing::ValuesIn(available_isas()),
                                            ::testing::Values<int64_t>(1, 3, 17, 64, 200),
                                            ::testing::Values<int64_t>(1, 63, 65, 127, 300, 1100)),
                         [](const ::testing::TestParamInfo<Q4LinearParam>& i) {
                           return std::string(isa_str(std::get<0>(i.param))) + "_M" +
                                  std::to_string(std::get<1>(i.param)) + "_K" +
                                  std::to_string(std::get<2>(i.param));
                         });

class Q4LinearDeterminism : public ::testing::TestWithParam<Isa> {};

TEST_P(Q4LinearDeterminism, RowBitsIndependentOfBatchAndThreads) {
  const Isa isa = GetParam();
  const int64_t K = 1000, N = 257;
  const Q4Weights w = make_q4(N, K, 5, 0.03f);
  for (int64_t M : {37, 300}) {
    const auto x = randn(size_t(M * K), uint32_t(M));
    std::vector<float> y(size_t(M * N)), y1(size_t(M * N));
    detail::linear_isa(isa, x.data(), M, K, w.q4, nullptr, y.data(), Epilogue::kStore);
    tbb::task_arena one(1);
    one.execute([&] { detail::linear_isa(isa, x.data(), M, K, w.q4, nullptr, y1.data(), Epilogue::kStore); });
    EXPECT_TRUE(bit_equal(y.data(), y1.data(), y.size())) << "thread count changed bits";
    for (int64_t m : {int64_t(0), int64_t(5), M / 2, M - 1}) {
      std::vector<float> row(static_cast<size_t>(N));
      detail::linear_isa(isa, x.data() + m * K, 1, K, w.q4, nullptr, row.data(), Epilogue::kStore);
      EXPECT_TRUE(bit_equal(row.data(), y.data() + m * N, size_t(N))) << "row " << m << " of M=" << M;
      const int64_t m8 = m + 8 <= M ? m : M - 8;  // the largest direct-path batch
      std::vector<float> rows8(static_cast<size_t>(8 * N));
      detail::linear_isa(isa, x.data() + m8 * K, 8, K, w.q4, nullptr, rows8.data(), Epilogue::kStore);
      EXPECT_TRUE(bit_equal(rows8.data(), y.data() + m8 * N, size_t(8 * N)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Q4LinearDeterminism, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return isa_str(i.param); });

TEST(Q4Linear, RejectsAWeightWhoseRowsDoNotMatchK) {
  const Q4Weights w = make_q4(4, 65, 1, 1.f);
  std::vector<float> x(2 * 64), y(8);
  EXPECT_THROW(linear(x.data(), 2, 64, w.q4, nullptr, y.data(), Epilogue::kStore), Error);
}

TEST(Q4Embedding, ChosenRowsDecodeExactlyAndAddEmbeddingAdds) {
  for (int64_t D : {1, 7, 64, 65, 300}) {
    const int64_t V = 11;
    const Q4Weights t = make_q4(V, D, uint32_t(D), 2.f);
    const std::vector<int32_t> ids = {3, 0, 10, 3, 7};
    const int64_t T = int64_t(ids.size());
    std::vector<float> out(size_t(T * D), -1.f);
    embedding(ids.data(), T, t.q4, out.data());
    for (int64_t i = 0; i < T; ++i)
      EXPECT_TRUE(bit_equal(out.data() + i * D, t.dec.data() + ids[size_t(i)] * D, size_t(D))) << "D=" << D;
    const auto base = randn(size_t(T * D), 3);
    std::vector<float> sum = base;
    add_embedding(ids.data(), T, t.q4, sum.data());
    for (int64_t i = 0; i < T; ++i)
      for (int64_t k = 0; k < D; ++k)
        ASSERT_EQ(sum[size_t(i * D + k)], base[size_t(i * D + k)] + t.dec[size_t(ids[size_t(i)] * D + k)]);
    const int32_t bad = int32_t(V);
    EXPECT_THROW(embedding(&bad, 1, t.q4, out.data()), Error);
  }
}

}  // namespace
}  // namespace flexh2o::cpu::test
