// attention() over an f16 / bf16 KV cache: outputs and H2O key scores are bit-identical to
// the fp32 attention over the same values converted to fp32 (every ISA variant; decode and
// prefill; GQA 4:1 and 1:1; left padding, seq_keys 0 and 1; odd head_dim tails; key-score
// blocks crossing slot 256), the thread count changes no bit, and unwritten slots (NaN) are
// never read.
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

struct KvCase {
  int64_t B, tq, H, KV;
  std::vector<int32_t> seq_keys;  // [B]
};

const std::vector<KvCase>& kv_cases() {
  static const std::vector<KvCase> k = {
      {1, 1, 4, 1, {1}},                // decode over a 1-token cache, GQA 4:1
      {3, 1, 8, 2, {40, 1, 300}},       // decode, GQA 4:1, lengths 40 / 1 / 300
      {3, 1, 4, 4, {17, 0, 64}},        // decode 1:1 next to an idle sequence
      {3, 5, 4, 4, {5, 3, 20}},         // prefill chunk, 1:1, b=1 has 2 padding rows
      {3, 37, 8, 2, {37, 12, 290}},     // GQA 4:1, padding, b=2's scores cross slot 256
      {3, 37, 4, 1, {1, 37, 0}},        // one real query, a full prompt, an idle sequence
      {1, 1, 8, 1, {33}},               // decode, MQA 8:1, batch 1 (heads split over tasks)
  };
  return k;
}

// Q, an fp32 cache and the same cache rounded to dt (16-bit bytes plus their exact fp32
// values). Slots >= seq_keys hold NaN in every form, so a read of one shows in the output.
struct KvData {
  KvCase c;
  int64_t d, cap;
  DType dt;
  std::vector<float> q, k32, v32;     // k32/v32: the 16-bit values, widened
  std::vector<uint16_t> k16, v16;
  AttentionArgs args(bool half, float* out, float* ks) const {
    AttentionArgs a;
    a.q = q.data();
    a.q_stride = c.H * d + 5;
    a.k = half ? static_cast<const void*>(k16.data()) : k32.data();
    a.v = half ? static_cast<const void*>(v16.data()) : v32.data();
    a.kv_dtype = half ? dt : DType::F32;
    a.batch = c.B;
    a.tq = c.tq;
    a.n_heads = c.H;
    a.kv_heads = c.KV;
    a.head_dim = d;
    a.capacity = cap;
    a.seq_keys = c.seq_keys.data();
    a.scale = 1.f / std::sqrt(float(d));
    a.out = out;
    a.out_stride = c.H * d;
    a.key_scores = ks;
    return a;
  }
};

KvData make(const KvCase& c, int64_t d, DType dt, uint32_t seed) {
  int64_t mk = 0;
  for (int32_t n : c.seq_keys) mk = std::max<int64_t>(mk, n);
  KvData t{c, d, mk + 3, dt, {}, {}, {}, {}, {}};
  t.q = randn(size_t(c.B * c.tq * (c.H * d + 5)), seed);
  const size_t n = size_t(c.B * c.KV * t.cap * d);
  t.k32 = randn(n, seed + 1, 2.f);
  t.v32 = randn(n, seed + 2);
  t.k16.resize(n);
  t.v16.resize(n);
  const uint16_t nan16 = dt == DType::F16 ? 0x7e00 : 0x7fc0;
  for (int64_t r = 0; r < c.B * c.KV; ++r)
    for (int64_t s = 0; s < t.cap; ++s)
      for (int64_t i = 0; i < d; ++i) {
        const size_t e = size_t((r * t.cap + s) * d + i);
        if (s >= c.seq_keys[size_t(r / c.KV)]) {
          t.k16[e] = t.v16[e] = nan16;
        } else {
          t.k16[e] = dt == DType::F16 ? f32_to_f16(t.k32[e]) : f32_to_bf16(t.k32[e]);
          t.v16[e] = dt == DType::F16 ? f32_to_f16(t.v32[e]) : f32_to_bf16(t.v32[e]);
        }
        t.k32[e] = dt == DType::F16 ? f16_to_f32(t.k16[e]) : bf16_to_f32(t.k16[e]);
        t.v32[e] = dt == DType::F16 ? f16_to_f32(t.v16[e]) : bf16_to_f32(t.v16[e]);
      }
  return t;
}

bool any_nan(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

using KvParam = std::tuple<Isa, DType, int64_t /*head_dim*/, int /*case*/, bool /*key_scores*/>;
class AttentionKvDtype : public ::testing::TestWithParam<KvParam> {};

TEST_P(AttentionKvDtype, BitIdenticalToFp32OnConvertedValues) {
  const auto [isa, dt, d, ci, scores] = GetParam();
  const KvData t = make(kv_cases()[size_t(ci)], d, dt, 100 + uint32_t(ci) * 7 + uint32_t(d));
  const KvCase& c = t.c;
  const size_t nout = size_t(c.B * c.tq * c.H * d), nks = size_t(c.B * c.H * t.cap);
  // Key scores start non-zero (earlier steps' sums): the op must add to them.
  const std::vector<float> ks0 = scores ? randn(nks, 5, 0.1f) : std::vector<float>();
  std::vector<float> o32(nout, -1.f), o16(nout, -2.f), ks32 = ks0, ks16 = ks0;
  detail::attention_isa(isa, t.args(false, o32.data(), scores ? ks32.data() : nullptr));
  detail::attention_isa(isa, t.args(true, o16.data(), scores ? ks16.data() : nullptr));
  EXPECT_FALSE(any_nan(o16)) << "an unwritten (NaN) slot was read";
  EXPECT_FALSE(any_nan(o32));
  for (size_t i = 0; i < nout; ++i)
    ASSERT_EQ(std::memcmp(&o16[i], &o32[i], 4), 0) << "out[" << i << "] " << o16[i] << " vs " << o32[i];
  if (!scores) return;
  EXPECT_FALSE(any_nan(ks16));
  for (size_t i = 0; i < nks; ++i)
    ASSERT_EQ(std::memcmp(&ks16[i], &ks32[i], 4), 0) << "key_scores[" << i << "]";
  EXPECT_FALSE(ks16 == ks0) << "no key score was added";
}

INSTANTIATE_TEST_SUITE_P(All, AttentionKvDtype,
                         ::testing::Combine(::testing::ValuesIn(available_isas()),
                                            ::testing::Values(DType::F16, DType::BF16),
                                            ::testing::Values<int64_t>(64, 80, 128, 68),
                                            ::testing::Range(0, int(kv_cases().size())),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<KvParam>& i) {
                           return std::string(isa_str(std::get<0>(i.param))) +
                                  (std::get<1>(i.param) == DType::F16 ? "_f16" : "_bf16") + "_d" +
                                  std::to_string(std::get<2>(i.param)) + "_case" +
                                  std::to_string(std::get<3>(i.param)) +
                                  (std::get<4>(i.param) ? "_scores" : "");
                         });

// The 16-bit path differs from the fp32 one only in its loads, so rounding K/V must change
// the result: a guard that the comparison above is not between two runs of one path.
TEST(AttentionKvDtype, RoundedCacheDiffersFromUnroundedOne) {
  KvData t = make(kv_cases()[1], 64, DType::F16, 9);
  std::vector<float> o16(size_t(3 * 8 * 64)), o32(o16.size());
  attention(t.args(true, o16.data(), nullptr));
  const auto k_exact = randn(t.k32.size(), 9 + 1, 2.f);  // make() drew k from this stream
  for (size_t i = 0; i < t.k32.size(); ++i)
    if (!std::isnan(t.k32[i])) t.k32[i] = k_exact[i];
  attention(t.args(false, o32.data(), nullptr));
  EXPECT_FALSE(bit_equal(o16.data(), o32.data(), o16.size()));
}

class AttentionKvThreads : public ::testing::TestWithParam<DType> {};

// Thread-count independence: arenas of 1, 2 and 3 threads give the same bits (prefill with
// key-score blocks, and decode). In decode the thread count also changes how many query
// heads of a kv group one task takes (cases 1 and 6 get 4 / 2 / 2 and 2 / 1 / 1).
TEST_P(AttentionKvThreads, SameBitsForAnyThreadCount) {
  const bool half = GetParam() != DType::F32;
  for (int ci : {1, 4, 6}) {
    const KvData t = make(kv_cases()[size_t(ci)], 80, half ? GetParam() : DType::BF16, 77);
    const KvCase& c = t.c;
    const size_t nout = size_t(c.B * c.tq * c.H * 80), nks = size_t(c.B * c.H * t.cap);
    std::vector<std::vector<float>> outs, kss;
    for (int threads : {1, 2, 3}) {
      std::vector<float> o(nout, 0.f), ks(nks, 0.f);
      tbb::task_arena arena(threads);
      arena.execute([&] { attention(t.args(half, o.data(), ks.data())); });
      EXPECT_FALSE(any_nan(o));
      outs.push_back(o);
      kss.push_back(ks);
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_TRUE(bit_equal(outs[0].data(), outs[i].data(), nout)) << "case " << ci << " arena " << i;
      EXPECT_TRUE(bit_equal(kss[0].data(), kss[i].data(), nks)) << "case " << ci << " arena " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionKvThreads,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return i.param == DType::F32 ? "f32" : i.param == DType::F16 ? "f16" : "bf16";
                         });

TEST(AttentionKvDtype, RejectsNonFloatCache) {
  const KvData t = make(kv_cases()[0], 64, DType::F16, 1);
  std::vector<float> o(size_t(4 * 64));
  AttentionArgs a = t.args(true, o.data(), nullptr);
  a.kv_dtype = DType::I32;
  EXPECT_THROW(attention(a), Error);
}

}  // namespace
}  // namespace flexh2o::cpu::test
