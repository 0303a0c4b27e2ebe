// linear(): every element against a double-precision reference over awkward shapes, all
// weight dtypes, epilogues, with/without bias, on every ISA variant of this machine; and the
// determinism contract (a row's bits do not depend on M, its neighbours, or thread count).
#include <tbb/task_arena.h>

#include <tuple>

#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

std::vector<double> ref_linear(const std::vector<float>& x, int64_t M, int64_t K,
                               const std::vector<float>& w, int64_t N) {
  std::vector<double> y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[m * K + k]) * double(w[n * K + k]);
      y[m * N + n] = s;
    }
  return y;
}

// What linear() must give: ref (x . w^T in double) + bias, then the epilogue over y0 (the
// prior contents of y).
std::vector<double> ref_epilogue(const std::vector<double>& ref, int64_t N, const std::vector<float>* bias,
                                 Epilogue ep, const std::vector<float>& y0) {
  std::vector<double> r(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    double v = ref[i] + (bias ? (*bias)[i % size_t(N)] : 0.0);
    if (ep == Epilogue::kRelu) v = v > 0 ? v : 0;
    if (ep == Epilogue::kAccumulate) v += y0[i];
    r[i] = v;
  }
  return r;
}

using LinearParam = std::tuple<Isa, DType, int64_t /*M*/, int64_t /*K*/>;
class LinearShapes : public ::testing::TestWithParam<LinearParam> {};

TEST_P(LinearShapes, MatchesReference) {
  const auto [isa, dt, M, K] = GetParam();
  const auto x = randn(size_t(M * K), 1 + uint32_t(M * 31 + K));
  for (int64_t N : {1, 5, 33, 256, 1031}) {
    const Weights w = make_weights(dt, {N, K}, uint32_t(N * 7 + K), 1.f / std::sqrt(float(K)));
    const Weights bias = make_weights(dt, {N}, uint32_t(N + 3));
    const auto ref = ref_linear(x, M, K, w.values, N);
    const auto y0 = randn(size_t(M * N), 99);  // prior contents (kAccumulate adds to them)
    for (Epilogue ep : {Epilogue::kStore, Epilogue::kRelu, Epilogue::kAccumulate})
      for (bool with_bias : {false, true}) {
        std::vector<float> y = y0;
        detail::linear_isa(isa, x.data(), M, K, w.view, with_bias ? &bias.view : nullptr, y.data(), ep);
        const auto r = ref_epilogue(ref, N, with_bias ? &bias.values : nullptr, ep, y0);
        // Weights are compared in their stored precision, so only fp32 accumulation error
        // remains; outputs are O(1) by construction.
        const double atol = 2e-5, rtol = 1e-4;
        expect_close(y.data(), r.data(), r.size(), atol, rtol,
                     "N=" + std::to_string(N) + " ep=" + std::to_string(int(ep)) + " bias=" +
                         std::to_string(with_bias));
      }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, LinearShapes,
    ::testing::Combine(::testing::ValuesIn(available_isas()),
                       ::testing::Values(DType::F32, DType::F16, DType::BF16),
                       ::testing::Values<int64_t>(1, 2, 3, 7, 64, 129),
                       ::testing::Values<int64_t>(1, 17, 64, 255, 1000)),
    [](const ::testing::TestParamInfo<LinearParam>& i) {
      return std::string(isa_str(std::get<0>(i.param))) + "_" +
             std::string(dtype_name(std::get<1>(i.param))) + "_M" + std::to_string(std::get<2>(i.param)) +
             "_K" + std::to_string(std::get<3>(i.param));
    });

class LinearDeterminism : public ::testing::TestWithParam<Isa> {};

// Rows computed alone (M=1, the decode path) equal the same rows inside larger batches
// (the packed path, several row blocks), bit for bit, and the thread count does not matter.
TEST_P(LinearDeterminism, RowBitsIndependentOfBatch) {
  const Isa isa = GetParam();
  const int64_t K = 1000, N = 257;
  for (DType dt : {DType::F16, DType::BF16, DType::F32}) {
    const Weights w = make_weights(dt, {N, K}, 5, 0.03f);
    const Weights b = make_weights(DType::F32, {N}, 6);
    for (int64_t M : {37, 300}) {
      const auto x = randn(size_t(M * K), uint32_t(M));
      std::vector<float> y(static_cast<size_t>(M * N));
      detail::linear_isa(isa, x.data(), M, K, w.view, &b.view, y.data(), Epilogue::kStore);
      std::vector<float> y1(static_cast<size_t>(M * N));
      tbb::task_arena one(1);
      one.execute([&] {
        detail::linear_isa(isa, x.data(), M, K, w.view, &b.view, y1.data(), Epilogue::kStore);
      });
      EXPECT_TRUE(bit_equal(y.data(), y1.data(), y.size())) << "thread count changed bits";
      for (int64_t m : {int64_t(0), int64_t(5), M / 2, M - 1}) {
        std::vector<float> row(static_cast<size_t>(N));
        detail::linear_isa(isa, x.data() + m * K, 1, K, w.view, &b.view, row.data(), Epilogue::kStore);
        EXPECT_TRUE(bit_equal(row.data(), y.data() + m * N, size_t(N)))
            << dtype_name(dt) << " row " << m << " of M=" << M;
        std::vector<float> rows3(static_cast<size_t>(3 * N));  // a small batch too (direct path, MR tiles)
        const int64_t m3 = m + 3 <= M ? m : M - 3;
        detail::linear_isa(isa, x.data() + m3 * K, 3, K, w.view, &b.view, rows3.data(), Epilogue::kStore);
        EXPECT_TRUE(bit_equal(rows3.data(), y.data() + m3 * N, size_t(3 * N)));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, LinearDeterminism, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return isa_str(i.param); });

// K long enough for first, middle and last chunks of the packed path (and a masked tail):
// the carried chains must end where one pass over all of K (M = 1, the direct path) ends, and
// near the double-precision reference, for every epilogue.
TEST_P(LinearDeterminism, ChainsCarriedOverManyKChunksEqualOnePass) {
  const Isa isa = GetParam();
  const int64_t K = 3 * detail::kLinearKC + 37, N = 70, M = 2 * detail::kLinearMB + 5;
  for (DType dt : {DType::F32, DType::BF16}) {
    const Weights w = make_weights(dt, {N, K}, 11, 1.f / std::sqrt(float(K)));
    const Weights b = make_weights(DType::F32, {N}, 12);
    const auto x = randn(size_t(M * K), 13);
    const auto y0 = randn(size_t(M * N), 14);
    const auto ref = ref_linear(x, M, K, w.values, N);
    for (Epilogue ep : {Epilogue::kStore, Epilogue::kRelu, Epilogue::kAccumulate}) {
      std::vector<float> y = y0;
      detail::linear_isa(isa, x.data(), M, K, w.view, &b.view, y.data(), ep);
      const auto r = ref_epilogue(ref, N, &b.values, ep, y0);
      expect_close(y.data(), r.data(), r.size(), 2e-5, 1e-4, std::string(dtype_name(dt)));
      for (int64_t m : {int64_t(0), detail::kLinearMB + 1, M - 1}) {
        std::vector<float> row(y0.begin() + m * N, y0.begin() + (m + 1) * N);
        detail::linear_isa(isa, x.data() + m * K, 1, K, w.view, &b.view, row.data(), ep);
        EXPECT_TRUE(bit_equal(row.data(), y.data() + m * N, size_t(N)))
            << dtype_name(dt) << " ep " << int(ep) << " row " << m;
      }
    }
  }
}

TEST(Linear, RejectsBadArguments) {
  const Weights w = make_weights(DType::F32, {4, 8}, 1);
  std::vector<float> x(16), y(8);
  EXPECT_THROW(linear(x.data(), 2, 7, w.view, nullptr, y.data(), Epilogue::kStore), Error);
  const Weights b = make_weights(DType::F32, {3}, 1);
  EXPECT_THROW(linear(x.data(), 2, 8, w.view, &b.view, y.data(), Epilogue::kStore), Error);
}

TEST(Linear, PublicEntryUsesBestIsa) {
  EXPECT_STRNE(cpu_isa_name(), "");
  const Weights w = make_weights(DType::F16, {33, 64}, 2);
  const auto x = randn(5 * 64, 3);
  std::vector<float> a(5 * 33), b(5 * 33);
  linear(x.data(), 5, 64, w.view, nullptr, a.data(), Epilogue::kStore);
  detail::linear_isa(detail::best_isa(), x.data(), 5, 64, w.view, nullptr, b.data(), Epilogue::kStore);
  EXPECT_TRUE(bit_equal(a.data(), b.data(), a.size()));
}

}  // namespace
}  // namespace flexh2o::cpu::test
