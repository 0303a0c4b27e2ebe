// The Q4 KV cache (core/quant4.h: one record per slot row, groups along head_dim) in the CPU
// ops: write_kv encodes exactly as q4::encode_rows into the right slots (and names the
// sequence and head on NaN); attention over Q4 K/V is bit-identical to the fp32 attention
// over q4::decode_rows of the same records (every ISA, decode and prefill, GQA, padding, odd
// head_dim, H2O key scores, any thread count) and never reads an unwritten slot; kv_gather
// moves whole records.
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/quant4.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

// ---- write_kv ---------------------------------------------------------------------------

struct KvShape {
  int64_t B, T, KV, hd, cap;
  std::vector<int32_t> seq_keys;
};

TEST(Q4WriteKv, EachSlotIsTheEncodingOfItsSourceRow) {
  const std::vector<KvShape> shapes = {
      {3, 3, 2, 5, 8, {7, 3, 2}},        // append, fill, one padding row
      {1, 1, 1, 1, 1, {1}},              // a single element
      {2, 1, 4, 80, 33, {33, 1}},        // decode into a full cache and into slot 0
      {3, 17, 3, 128, 40, {40, 5, 17}},  // prefill chunk with padding rows, head_dim 128
      {2, 9, 1, 67, 9, {0, 9}},          // an idle sequence, odd head_dim (two groups)
  };
  for (const KvShape& c : shapes) {
    const int64_t stride = c.KV * c.hd + 3, rb = q4::row_bytes(c.hd);
    auto src = randn(size_t(c.B * c.T * stride), uint32_t(c.hd * 3 + c.T), 5.f);
    std::vector<uint8_t> cache(size_t(c.B * c.KV * c.cap * rb), 0xA5);
    write_kv(src.data(), stride, c.B, c.T, c.KV, c.hd, cache.data(), DType::Q4, c.cap, c.seq_keys.data());
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t g = 0; g < c.KV; ++g)
        for (int64_t s = 0; s < c.cap; ++s) {
          const uint8_t* rec = cache.data() + ((b * c.KV + g) * c.cap + s) * rb;
          const int64_t t = s - (c.seq_keys[size_t(b)] - c.T);
          std::vector<uint8_t> want(size_t(rb), 0xA5);
          if (t >= 0 && t < c.T && s < c.seq_keys[size_t(b)])
            q4::encode_rows(src.data() + (b * c.T + t) * stride + g * c.hd, stride, 1, c.hd, want.data(), "ref");
          ASSERT_EQ(std::memcmp(rec, want.data(), size_t(rb)), 0)
              << "hd=" << c.hd << " b=" << b << " g=" << g << " slot " << s;
        }
  }
}

TEST(Q4WriteKv, NanIsRefusedNamingSequenceAndHead) {
  const int64_t hd = 64, KV = 2, cap = 4;
  std::vector<float> src(size_t(2 * KV * hd), 1.f);
  src[size_t(1 * KV * hd + 1 * hd + 3)] = std::nanf("");  // sequence 1, kv head 1
  std::vector<uint8_t> cache(size_t(2 * KV * cap * q4::row_bytes(hd)));
  const int32_t keys[2] = {1, 3};
  try {
    write_kv(src.data(), KV * hd, 2, 1, KV, hd, cache.data(), DType::Q4, cap, keys);
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sequence 1, kv head 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("slot 2"), std::string::npos) << msg;
  }
}

// ---- attention --------------------------------------------------------------------------

struct KvCase {
  int64_t B, tq, H, KV;
  std::vector<int32_t> seq_keys;
};
const std::vector<KvCase>& kv_cases() {
  static const std::vector<KvCase> k = {
      {1, 1, 4, 1, {1}},             // decode over a 1-token cache, GQA 4:1
      {3, 1, 8, 2, {40, 1, 300}},    // decode, GQA 4:1, lengths 40 / 1 / 300
      {3, 1, 4, 4, {17, 0, 64}},     // decode 1:1 next to an idle sequence
      {3, 5, 4, 4, {5, 3, 20}},      // prefill chunk, 1:1, b=1 has 2 padding rows
      {3, 37, 8, 2, {37, 12, 290}},  // GQA 4:1, padding, b=2's scores cross slot 256
  };
  return k;
}

// Q, a Q4 cache and its decoded fp32 twin. Unwritten slots hold records whose d and m are
// fp16 NaN (NaN in the twin), so reading one shows in the output.
struct Q4Kv {
  KvCase c;
  int64_t d, cap;
  std::vector<float> q, k32, v32;
  std::vector<uint8_t> k4, v4;
  AttentionArgs args(bool q4, float* out, float* ks) const {
    AttentionArgs a;
    a.q = q.data();
    a.q_stride = c.H * d + 5;
    a.k = q4 ? static_cast<const void*>(k4.data()) : k32.data();
    a.v = q4 ? static_cast<const void*>(v4.data()) : v32.data();
    a.kv_dtype = q4 ? DType::Q4 : DType::F32;
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

Q4Kv make(const KvCase& c, int64_t d, uint32_t seed) {
  int64_t mk = 0;
  for (int32_t n : c.seq_keys) mk = std::max<int64_t>(mk, n);
  Q4Kv t{c, d, mk + 3, {}, {}, {}, {}, {}};
  t.q = randn(size_t(c.B * c.tq * (c.H * d + 5)), seed);
  const int64_t rows = c.B * c.KV * t.cap, rb = q4::row_bytes(d);
  const auto k = randn(size_t(rows * d), seed + 1, 2.f), v = randn(size_t(rows * d), seed + 2);
  t.k4.resize(size_t(rows * rb));
  t.v4.resize(size_t(rows * rb));
  q4::encode_rows(k.data(), d, rows, d, t.k4.data(), "k");
  q4::encode_rows(v.data(), d, rows, d, t.v4.data(), "v");
  for (int64_t r = 0; r < rows; ++r)
    if (r % t.cap >= c.seq_keys[size_t(r / t.cap / c.KV)])
      for (auto* buf : {&t.k4, &t.v4})
        for (int64_t m = q4::meta_offset(d); m < rb; m += 2) {
          (*buf)[size_t(r * rb + m)] = 0x00;  // fp16 0x7e00: NaN
          (*buf)[size_t(r * rb + m + 1)] = 0x7e;
        }
  t.k32.resize(size_t(rows * d));
  t.v32.resize(size_t(rows * d));
  q4::decode_rows(t.k4.data(), rows, d, t.k32.data(), d);
  q4::decode_rows(t.v4.data(), rows, d, t.v32.data(), d);
  return t;
}

bool any_nan(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

using Q4KvParam = std::tuple<Isa, int64_t /*head_dim*/, int /*case*/, bool /*key_scores*/>;
class Q4Attention : public ::testing::TestWithParam<Q4KvParam> {};

TEST_P(Q4Attention, BitIdenticalToFp32OnDecodedRecords) {
  const auto [isa, d, ci, scores] = GetParam();
  const Q4Kv t = make(kv_cases()[size_t(ci)], d, 300 + uint32_t(ci) * 7 + uint32_t(d));
  const KvCase& c = t.c;
  ASSERT_TRUE(any_nan(t.k32)) << "the unwritten-slot guard is missing";
  const size_t nout = size_t(c.B * c.tq * c.H * d), nks = size_t(c.B * c.H * t.cap);
  const std::vector<float> ks0 = scores ? randn(nks, 5, 0.1f) : std::vector<float>();
  std::vector<float> o32(nout, -1.f), o4(nout, -2.f), ks32 = ks0, ks4 = ks0;
  detail::attention_isa(isa, t.args(false, o32.data(), scores ? ks32.data() : nullptr));
  detail::attention_isa(isa, t.args(true, o4.data(), scores ? ks4.data() : nullptr));
  EXPECT_FALSE(any_nan(o4)) << "an unwritten slot was read";
  for (size_t i = 0; i < nout; ++i)
    ASSERT_EQ(std::memcmp(&o4[i], &o32[i], 4), 0) << "out[" << i << "] " << o4[i] << " vs " << o32[i];
  if (!scores) return;
  for (size_t i = 0; i < nks; ++i) ASSERT_EQ(std::memcmp(&ks4[i], &ks32[i], 4), 0) << "key_scores[" << i << "]";
  EXPECT_FALSE(ks4 == ks0) << "no key score was added";
}

INSTANTIATE_TEST_SUITE_P(All, Q4Attention,
                         ::testing::Combine(::testing::ValuesIn(available_isas()),
                                            ::testing::Values<int64_t>(1, 7, 64, 68, 128),
                                            ::testing::Range(0, int(kv_cases().size())), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Q4KvParam>& i) {
                           return std::string(isa_str(std::get<0>(i.param))) + "_d" +
                                  std::to_string(std::get<1>(i.param)) + "_case" +
                                  std::to_string(std::get<2>(i.param)) + (std::get<3>(i.param) ? "_scores" : "");
                         });

TEST(Q4Attention, SameBitsForAnyThreadCount) {
  for (int ci : {1, 4}) {
    const Q4Kv t = make(kv_cases()[size_t(ci)], 80, 77);
    const size_t nout = size_t(t.c.B * t.c.tq * t.c.H * 80), nks = size_t(t.c.B * t.c.H * t.cap);
    std::vector<std::vector<float>> outs, kss;
    for (int threads : {1, 2, 3}) {
      std::vector<float> o(nout, 0.f), ks(nks, 0.f);
      tbb::task_arena arena(threads);
      arena.execute([&] { attention(t.args(true, o.data(), ks.data())); });
      outs.push_back(o);
      kss.push_back(ks);
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_TRUE(bit_equal(outs[0].data(), outs[i].data(), nout)) << "case " << ci;
      EXPECT_TRUE(bit_equal(kss[0].data(), kss[i].data(), nks)) << "case " << ci;
    }
  }
}

// ---- kv_gather ----------------------------------------------------------------------------

TEST(Q4KvGather, MovesWholeRecords) {
  const int64_t B = 2, KV = 2, cap = 9, hd = 67, stride = 10, rb = q4::row_bytes(hd);
  std::vector<uint8_t> before(size_t(B * KV * cap * rb));
  for (size_t i = 0; i < before.size(); ++i) before[i] = uint8_t(i * 7 + 1);  // traceable bytes
  std::vector<int32_t> keep(size_t(B * KV * stride), -99), count(size_t(B * KV));
  auto set = [&](int64_t r, std::vector<int32_t> k) {
    std::copy(k.begin(), k.end(), keep.begin() + r * stride);
    count[size_t(r)] = int32_t(k.size());
  };
  set(0, {0, 2, 3, 6, 8});           // stable compaction
  set(1, {0, 1, 2, 8, 4, 5, 6, 7});  // move-last
  set(2, {1, 2, 3, 4, 5, 6, 7, 8});  // evict slot 0
  set(3, {});
  auto cache = before;
  kv_gather(cache.data(), DType::Q4, B, KV, cap, hd, keep.data(), stride, count.data());
  for (int64_t r = 0; r < B * KV; ++r)
    for (int64_t s = 0; s < cap; ++s) {
      const int64_t from = s < count[size_t(r)] ? keep[size_t(r * stride + s)] : s;
      ASSERT_EQ(std::memcmp(cache.data() + (r * cap + s) * rb, before.data() + (r * cap + from) * rb, size_t(rb)), 0)
          << "row " << r << " slot " << s;
    }
}

TEST(Q4Kernels, ConversionsStillRefuseQ4) {
  std::vector<float> f(8);
  std::vector<uint8_t> b(64);
  EXPECT_THROW(to_f32(DType::Q4, b.data(), 8, f.data()), Error);
  EXPECT_THROW(from_f32(f.data(), 8, DType::Q4, b.data()), Error);
}

}  // namespace
}  // namespace flexh2o::cpu::test
