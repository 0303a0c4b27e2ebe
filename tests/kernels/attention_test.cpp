// attention(): every output and H2O key score against a double-precision reference on every
// ISA variant: left-aligned caches with per-sequence seq_keys, causal mask, left-padding
// query rows (zeros out), GQA, decode (tq=1), sliding windows, head_dim 64/80/128, with and
// without key_scores; unwritten cache slots hold NaN and must never be read.
// Determinism: a sequence alone vs inside a batch of other lengths gives identical bits.
#include <tbb/task_arena.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

struct AttnCase {
  int64_t B, tq, H, KV;
  std::vector<int32_t> seq_keys;  // [B]
  int64_t window = 0;             // sliding window (0: none)
};

int64_t max_keys(const AttnCase& c) {
  int64_t m = 0;
  for (int32_t n : c.seq_keys) m = std::max<int64_t>(m, n);
  return m;
}

struct AttnData {
  AttnCase c;
  int64_t d, cap;
  std::vector<float> q, k, v, out, ks;
  std::vector<float> ks0;  // the key scores before the call: earlier steps' sums, which it adds to
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
    a.seq_keys = c.seq_keys.data();
    a.scale = 1.f / std::sqrt(float(d));
    a.window = c.window;
    a.out = out.data();
    a.out_stride = c.H * d;
    a.key_scores = ks.empty() ? nullptr : ks.data();
    return a;
  }
};

AttnData make(const AttnCase& c, int64_t d, bool scores, uint32_t seed) {
  AttnData t{c, d, max_keys(c) + 5, {}, {}, {}, {}, {}, {}};
  t.q = randn(size_t(c.B * c.tq * (c.H * d + 3)), seed);
  t.k = randn(size_t(c.B * c.KV * t.cap * d), seed + 1);
  t.v = randn(size_t(c.B * c.KV * t.cap * d), seed + 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t g = 0; g < c.KV; ++g)
      for (int64_t s = 0; s < t.cap; ++s)
        if (s >= c.seq_keys[b])
          for (int64_t i = 0; i < d; ++i) {
            t.k[((b * c.KV + g) * t.cap + s) * d + i] = nan;
            t.v[((b * c.KV + g) * t.cap + s) * d + i] = nan;
          }
  t.out.assign(size_t(c.B * c.tq * c.H * d), nan);
  if (scores) {  // earlier steps' sums on the valid slots, a function of (head, slot) only
    t.ks.assign(size_t(c.B * c.H * t.cap), 0.f);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t s = 0; s < c.seq_keys[b]; ++s)
          t.ks[size_t((b * c.H + h) * t.cap + s)] = 0.125f * float((h * 7 + s) % 9);
    t.ks0 = t.ks;
  }
  return t;
}

// Double-precision reference: out, and the key scores (t.ks0 plus this call's probabilities).
void reference(const AttnData& t, std::vector<double>& out, std::vector<double>& ks) {
  const AttnCase& c = t.c;
  const int64_t d = t.d;
  out.assign(t.out.size(), 0.0);
  ks.assign(size_t(c.B * c.H * t.cap), 0.0);
  for (size_t i = 0; i < t.ks0.size(); ++i) ks[i] = t.ks0[i];
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / (c.H / c.KV);
      for (int64_t tt = 0; tt < c.tq; ++tt) {
        const int64_t pos = c.seq_keys[b] - c.tq + tt;
        const int64_t s0 = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
        if (pos < 0) continue;  // padding query: output 0
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
      {1, 7, 4, 4, {7}},             // plain causal prefill
      {3, 5, 4, 2, {19, 16, 8}},     // chunked prefill over a cache, GQA 2
      {2, 1, 4, 1, {40, 35}},        // decode, MQA, different lengths
      {2, 10, 4, 2, {10, 6}},        // left-padded prompt: 4 padding query rows
      {1, 70, 2, 1, {100}},          // several query blocks
      {2, 37, 4, 2, {37, 0}},        // an all-padding sequence (empty cache)
      {3, 6, 4, 2, {2, 6, 30}},      // chunk longer than a short sequence's cache
      {2, 1, 4, 4, {1, 0}},          // decode of a 1-token cache next to an idle slot
      {1, 300, 2, 1, {400}},         // key scores over several slot blocks (256)
      {2, 270, 2, 2, {270, 200}},    // several slot blocks, one sequence left-padded
      {1, 40, 4, 2, {40}, 9},        // sliding window shorter than the prompt
      {3, 5, 4, 2, {19, 16, 8}, 6},  // window, chunked prefill over a cache
      {2, 1, 4, 1, {40, 35}, 16},    // window, decode
      {2, 10, 4, 2, {10, 6}, 3},     // window, left-padded prompt
      {1, 300, 2, 1, {400}, 77},     // window inside several query and slot blocks
      {2, 1, 4, 4, {5, 3}, 8},       // window wider than the cache: no effect
      {1, 70, 2, 1, {100}, 1},       // window 1: each query sees itself only
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
  const AttnCase& cc = t.c;
  for (int64_t b = 0; b < cc.B; ++b)  // padding rows: exactly +0.0 (not only within tolerance)
    for (int64_t tt = 0; tt < cc.tq && cc.seq_keys[b] - cc.tq + tt < 0; ++tt)
      for (int64_t i = 0; i < cc.H * d; ++i)
        ASSERT_EQ(t.out[size_t((b * cc.tq + tt) * cc.H * d + i)], 0.f) << "padding row b=" << b << " t=" << tt;
  if (!scores) return;
  expect_close(t.ks.data(), rk.data(), rk.size(), 2e-6, 1e-4, "key_scores");
  const AttnCase& c = t.c;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      double total = 0;
      for (int64_t s = 0; s < t.cap; ++s) {
        const size_t at = size_t((b * c.H + h) * t.cap + s);
        const float v = t.ks[at];
        if (s >= c.seq_keys[b]) {
          EXPECT_EQ(v, 0.f) << "padding slot " << s;  // exactly 0
        }
        total += double(v) - t.ks0[at];
      }
      int64_t valid = 0;  // each valid query's probabilities sum to 1
      for (int64_t tt = 0; tt < c.tq; ++tt) valid += (c.seq_keys[b] - c.tq + tt >= 0);
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

// One sequence alone vs the same sequence at b=1 of a batch whose other sequences have other
// lengths (so b=1 gets left-padding query rows in prefill): outputs and key scores are
// bit-identical (prefill and decode, with and without a window), and the thread count does not
// change any bit.
TEST_P(AttentionDeterminism, SequenceAloneEqualsInBatch) {
  const Isa isa = GetParam();
  const int64_t d = 80, H = 4, KV = 2;
  for (int64_t window : {int64_t(0), int64_t(13)})
    for (int64_t L : {int64_t(45), int64_t(1), int64_t(300)}) {  // prefills of 45 and 300 (two
                                                                 // score blocks); decode step
      const int64_t keys = L == 1 ? 60 : L, pad = L == 1 ? 0 : 5;
      const int64_t tqb = L + pad;
      AttnData alone = make({1, L, H, KV, {int32_t(keys)}, window}, d, true, 3);
      AttnData batch = make({3, tqb, H, KV, {int32_t(keys + 33), int32_t(keys), int32_t(tqb)}, window}, d, true, 11);
      const int64_t cap_b = batch.cap;
      for (int64_t g = 0; g < KV; ++g)
        for (int64_t s = 0; s < keys; ++s)
          for (int64_t i = 0; i < d; ++i) {
            batch.k[((1 * KV + g) * cap_b + s) * d + i] = alone.k[((0 * KV + g) * alone.cap + s) * d + i];
            batch.v[((1 * KV + g) * cap_b + s) * d + i] = alone.v[((0 * KV + g) * alone.cap + s) * d + i];
          }
      const int64_t qs = H * d + 3;
      for (int64_t tt = 0; tt < L; ++tt)
        for (int64_t i = 0; i < qs; ++i) batch.q[size_t((1 * tqb + pad + tt) * qs + i)] = alone.q[size_t(tt * qs + i)];
      detail::attention_isa(isa, alone.args());
      detail::attention_isa(isa, batch.args());
      for (int64_t tt = 0; tt < L; ++tt)
        EXPECT_TRUE(
            bit_equal(alone.out.data() + tt * H * d, batch.out.data() + (1 * tqb + pad + tt) * H * d, size_t(H * d)))
            << "L=" << L << " query " << tt;
      for (int64_t h = 0; h < H; ++h)
        EXPECT_TRUE(bit_equal(alone.ks.data() + h * alone.cap, batch.ks.data() + (1 * H + h) * cap_b, size_t(keys)))
            << "key scores, head " << h;
      AttnData again = batch;
      std::fill(again.out.begin(), again.out.end(), -1.f);
      again.ks = again.ks0;
      tbb::task_arena one(1);
      one.execute([&] { detail::attention_isa(isa, again.args()); });
      EXPECT_TRUE(bit_equal(again.out.data(), batch.out.data(), batch.out.size())) << "threads, L=" << L;
      EXPECT_TRUE(bit_equal(again.ks.data(), batch.ks.data(), batch.ks.size())) << "threads, L=" << L;
    }
}

INSTANTIATE_TEST_SUITE_P(All, AttentionDeterminism, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& i) { return isa_str(i.param); });

TEST(Attention, RejectsBadArguments) {
  AttnData t = make({1, 4, 4, 3, {4}}, 64, false, 1);  // 4 heads over 3 kv heads
  EXPECT_THROW(attention(t.args()), Error);
  AttnData u = make({1, 4, 4, 2, {5}}, 64, false, 1);
  u.c.seq_keys[0] = int32_t(u.cap + 1);  // beyond capacity
  EXPECT_THROW(attention(u.args()), Error);
  u.c.seq_keys[0] = -1;  // negative
  EXPECT_THROW(attention(u.args()), Error);
  AttentionArgs n = u.args();
  n.seq_keys = nullptr;
  EXPECT_THROW(attention(n), Error);
  AttnData w = make({1, 4, 4, 2, {4}, -1}, 64, false, 1);  // negative window
  EXPECT_THROW(attention(w.args()), Error);
}

}  // namespace
}  // namespace flexh2o::cpu::test
