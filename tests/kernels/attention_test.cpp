// attention(): every output and H2O key score against a double-precision reference on every
// ISA variant: causal + left-padding masks, GQA, decode (tq=1), head_dim 64/80/128, with
// and without key_scores; padding/unwritten cache slots hold NaN and must never be read.
// Determinism: a sequence alone vs inside a padded batch gives identical bits.
#include <limits>
#include <tuple>

#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

struct AttnCase {
  int64_t B, tq, n_keys, H, KV;
  std::vector<int32_t> key_start;
};

struct AttnData {
  AttnCase c;
  int64_t d, cap;
  std::vector<float> q, k, v, out, ks;
  AttentionArgs args() {
    AttentionArgs a;
    a.q = q.data();
    a.q_stride = c.H * d + 3;  // padded rows: strides are honoured
    a.k = k.data();
    a.v = v.data();
    a.batch = c.B;
    a.tq = c.tq;
    a.n_heads = c.H;
    a.kv_heads = c.KV;
    a.head_dim = d;
    a.capacity = cap;
    a.n_keys = c.n_keys;
    a.key_start = c.key_start.empty() ? nullptr : c.key_start.data();
    a.scale = 1.f / std::sqrt(float(d));
    a.out = out.data();
    a.out_stride = c.H * d;
    a.key_scores = ks.empty() ? nullptr : ks.data();
    return a;
  }
};

int32_t kstart(const AttnCase& c, int64_t b) { return c.key_start.empty() ? 0 : c.key_start[b]; }

AttnData make(const AttnCase& c, int64_t d, bool scores, uint32_t seed) {
  AttnData t{c, d, c.n_keys + 5, {}, {}, {}, {}, {}};
  t.q = randn(size_t(c.B * c.tq * (c.H * d + 3)), seed);
  t.k = randn(size_t(c.B * c.KV * t.cap * d), seed + 1);
  t.v = randn(size_t(c.B * c.KV * t.cap * d), seed + 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t g = 0; g < c.KV; ++g)
      for (int64_t s = 0; s < t.cap; ++s)
        if (s < kstart(c, b) || s >= c.n_keys)
          for (int64_t i = 0; i < d; ++i) {
            t.k[((b * c.KV + g) * t.cap + s) * d + i] = nan;
            t.v[((b * c.KV + g) * t.cap + s) * d + i] = nan;
          }
  t.out.assign(size_t(c.B * c.tq * c.H * d), nan);
  if (scores) t.ks.assign(size_t(c.B * c.H * t.cap), 0.f);
  return t;
}

// Double-precision reference: out and key-score increments.
void reference(const AttnData& t, std::vector<double>& out, std::vector<double>& ks) {
  const AttnCase& c = t.c;
  const int64_t d = t.d;
  out.assign(t.out.size(), 0.0);
  ks.assign(size_t(c.B * c.H * t.cap), 0.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / (c.H / c.KV);
      for (int64_t tt = 0; tt < c.tq; ++tt) {
        const int64_t pos = c.n_keys - c.tq + tt, s0 = kstart(c, b);
        if (pos < s0) continue;  // padding query: output 0
        const float* qr = t.q.data() + (b * c.tq + tt) * (c.H * d + 3) + h * d;
        std::vector<double> p(size_t(pos + 1), 0.0);
        double mx = -1e300, sum = 0;
        for (int64_t j = s0; j <= pos; ++j) {
          double s = 0;
          for (int64_t i = 0; i < d; ++i) s += double(qr[i]) * t.k[((b * c.KV + g) * t.cap + j) * d + i];
          p[j] = s / std::sqrt(double(d));
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = s0; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = s0; j <= pos; ++j) {
          p[j] /= sum;
          ks[(b * c.H + h) * t.cap + j] += p[j];
          for (int64_t i = 0; i < d; ++i)
            out[(b * c.tq + tt) * c.H * d + h * d + i] += p[j] * t.v[((b * c.KV + g) * t.cap + j) * d + i];
        }
      }
    }
}

const std::vector<AttnCase>& cases() {
  static const std::vector<AttnCase> k = {
      {1, 7, 7, 4, 4, {}},             // plain causal prefill
      {3, 5, 19, 4, 2, {0, 3, 11}},    // chunked prefill over a cache, padding, GQA 2
      {2, 1, 40, 4, 1, {0, 5}},        // decode, MQA
      {2, 10, 10, 4, 2, {0, 4}},       // left-padded prompt: 4 padding queries
      {1, 70, 100, 2, 1, {}},          // several query blocks
      {2, 37, 37, 4, 2, {0, 37}},      // an all-padding sequence
  };
  return k;
}

using AttnParam = std::tuple<Isa, int64_t /*head_dim*/, int /*case*/, bool /*key_scores*/>;
class AttentionCases : public ::testing::TestWithParam<AttnParam> {};

TEST_P(AttentionCases, MatchesReference) {
  const auto [isa, d, ci, scores] = GetParam();
  AttnData t = make(cases()[size_t(ci)], d, scores, 7 + uint32_t(ci));
  detail::attention_isa(isa, t.args());
  std::vector<double> ro, rk;
  reference(t, ro, rk);
  expect_close(t.out.data(), ro.data(), ro.size(), 2e-5, 1e-4, "out");
  if (!scores) return;
  expect_close(t.ks.data(), rk.data(), rk.size(), 2e-6, 1e-4, "key_scores");
  const AttnCase& c = t.c;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      double total = 0;
      for (int64_t s = 0; s < t.cap; ++s) {
        const float v = t.ks[size_t((b * c.H + h) * t.cap + s)];
        if (s < kstart(c, b) || s >= c.n_keys) {
          EXPECT_EQ(v, 0.f) << "padding slot " << s;  // exactly 0
        }
        total += v;
      }
      int64_t valid = 0;  // each valid query's probabilities sum to 1
      for (int64_t tt = 0; tt < c.tq; ++tt) valid += (c.n_keys - c.tq + tt >= kstart(c, b));
      EXPECT_NEAR(total, double(valid), 1e-4 * double(valid + 1));
    }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionCases,
                         ::testing::Combine(::testing::ValuesIn(available_isas()),
                                            ::testing::Values<int64_t>(64, 80, 128),
                                            ::testing::Range(0, int(cases().size())),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<AttnParam>& i) {
                           return std::string(isa_str(std::get<0>(i.param))) + "_d" +
                                  std::to_string(std::get<1>(i.param)) + "_case" +
                                  std::to_string(std::get<2>(i.param)) +
                                  (std::get<3>(i.param) ? "_scores" : "");
                         });

class AttentionDeterminism : public ::testing::TestWithParam<Isa> {};

// One sequence alone vs the same sequence at b=1 of a batch, left-padded by 5 slots, next to
// sequences with other padding: outputs and key scores are bit-identical (prefill and decode).
TEST_P(AttentionDeterminism, SequenceAloneEqualsInBatch) {
  const Isa isa = GetParam();
  const int64_t d = 80, H = 4, KV = 2;
  for (int64_t L : {int64_t(45), int64_t(1)}) {  // prefill of 45; decode step over 60 keys
    const int64_t keys = L == 1 ? 60 : L, pad = 5;
    AttnData alone = make({1, L, keys, H, KV, {0}}, d, true, 3);
    AttnData batch = make({3, L + (L == 1 ? 0 : pad), keys + pad, H, KV, {2, pad, 0}}, d, true, 11);
    const int64_t cap_b = batch.cap, tqb = batch.c.tq;
    // Copy the sequence into slot range [pad, pad+keys) of b=1 and its queries to the tail rows.
    for (int64_t g = 0; g < KV; ++g)
      for (int64_t s = 0; s < keys; ++s)
        for (int64_t i = 0; i < d; ++i) {
          batch.k[((1 * KV + g) * cap_b + pad + s) * d + i] = alone.k[((0 * KV + g) * alone.cap + s) * d + i];
          batch.v[((1 * KV + g) * cap_b + pad + s) * d + i] = alone.v[((0 * KV + g) * alone.cap + s) * d + i];
        }
    const int64_t qs = H * d + 3;
    for (int64_t tt = 0; tt < L; ++tt)
      for (int64_t i = 0; i < qs; ++i)
        batch.q[size_t((1 * tqb + tqb - L + tt) * qs + i)] = alone.q[size_t(tt * qs + i)];
    detail::attention_isa(isa, alone.args());
    detail::attention_isa(isa, batch.args());
    for (int64_t tt = 0; tt < L; ++tt)
      EXPECT_TRUE(bit_equal(alone.out.data() + tt * H * d, batch.out.data() + (1 * tqb + tqb - L + tt) * H * d,
                            size_t(H * d)))
          << "L=" << L << " query " << tt;
    for (int64_t h = 0; h < H; ++h)
      EXPECT_TRUE(bit_equal(alone.ks.data() + h * alone.cap, batch.ks.data() + (1 * H + h) * cap_b + pad,
                            size_t(keys)))
          << "key scores, head " << h;
  }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionDeterminism, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return isa_str(i.param); });

TEST(Attention, RejectsBadArguments) {
  AttnData t = make({1, 4, 4, 4, 3, {}}, 64, false, 1);  // 4 heads over 3 kv heads
  EXPECT_THROW(attention(t.args()), Error);
  AttnData u = make({1, 4, 4, 4, 2, {5}}, 64, false, 1);  // key_start beyond n_keys
  EXPECT_THROW(attention(u.args()), Error);
}

}  // namespace
}  // namespace flexh2o::cpu::test
