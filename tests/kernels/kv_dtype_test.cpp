// The 16-bit KV cache ops against the scalar conversions of core/dtype.h, bit for bit:
// to_f32 / from_f32 (every f16 and bf16 pattern, every rounding tie, subnormal boundaries,
// overflow, NaN payloads; odd lengths at unaligned addresses; every ISA variant), write_kv
// into an f16/bf16 cache, and kv_gather on 2-byte rows (moves, and bad keep lists throw
// before anything moves).
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "kernels/cpu/ops.h"
#include "tests/kernels/ref.h"

namespace flexh2o::cpu::test {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t ref_from_f32(DType dt, float f) { return dt == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f); }
float ref_to_f32(DType dt, uint16_t h) { return dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h); }
const char* dt_str(DType dt) { return dt == DType::F16 ? "f16" : dt == DType::BF16 ? "bf16" : "f32"; }

// f32 inputs that decide a rounding: for every 16-bit pattern h, its value, the midpoint to
// the next pattern (a tie: exact in f32) and the f32 neighbours of that midpoint; plus
// explicit specials and a sweep over all f32 exponents.
std::vector<float> rounding_inputs(DType dt) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0xffff; ++h) {
    const float a = ref_to_f32(dt, uint16_t(h)), b = ref_to_f32(dt, uint16_t(h + 1));
    if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
    const float mid = float((double(a) + double(b)) / 2);
    EXPECT_EQ(double(mid), (double(a) + double(b)) / 2) << "midpoint not exact";
    v.insert(v.end(), {a, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 2 * mid)});
  }
  const float inf = std::numeric_limits<float>::infinity();
  v.insert(v.end(), {0.f, -0.f, inf, -inf, 65504.f, 65519.99f, 65520.f, -65520.f, 1e38f, 3.4e38f,
                     std::ldexp(1.f, -24), std::ldexp(1.f, -25), std::ldexp(1.f, -26),
                     std::nextafter(std::ldexp(1.f, -25), 1.f), std::ldexp(1.5f, -24),
                     std::ldexp(1.f, -14), std::nextafter(std::ldexp(1.f, -14), 0.f),
                     std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                     -std::numeric_limits<float>::denorm_min()});
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0xff80ffffu, 0x7fffffffu,
                     0x7f802000u, 0x7f801fffu, 0x7fbfffffu, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                     0x7f7f8000u, 0x7f7f7fffu, 0x7f7f8001u, 0xff7f8000u})  // bf16 overflow tie
    v.push_back(from_bits(u));
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 0x70007u)  // every exponent, both signs
    v.push_back(from_bits(uint32_t(u)));
  return v;
}

class Convert : public ::testing::TestWithParam<std::tuple<Isa, DType>> {};

TEST_P(Convert, EveryPatternToF32MatchesReference) {
  const auto [isa, dt] = GetParam();
  // All 65536 patterns, three times and one element off alignment: large enough for the
  // parallel blocks, and the block boundaries fall at unaligned addresses.
  const int64_t n = 3 * 65536;
  std::vector<uint16_t> src(size_t(n + 1));
  for (int64_t i = 0; i < n; ++i)  // 40503 is odd: each 65536 block is a permutation
    src[size_t(i + 1)] = uint16_t(i * 40503 + i / 65536);
  std::vector<float> dst(size_t(n + 2), -3.f);
  detail::to_f32_isa(isa, dt, src.data() + 1, n, dst.data() + 1);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = src[size_t(i + 1)];
    if (bits_of(dst[size_t(i + 1)]) != bits_of(ref_to_f32(dt, h)) && bad++ < 5)
      ADD_FAILURE() << dt_str(dt) << " pattern " << std::hex << h << " -> "
                    << bits_of(dst[size_t(i + 1)]) << ", reference " << bits_of(ref_to_f32(dt, h));
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(dst[0], -3.f);
  EXPECT_EQ(dst[size_t(n + 1)], -3.f);
}

TEST_P(Convert, FromF32MatchesReferenceAndRoundTrips) {
  const auto [isa, dt] = GetParam();
  std::vector<float> in = rounding_inputs(dt);
  for (uint32_t h = 0; h < 65536; ++h) in.push_back(ref_to_f32(dt, uint16_t(h)));  // round trip
  const int64_t n = int64_t(in.size());
  in.insert(in.begin(), 0.f);  // src one float off alignment
  std::vector<uint16_t> out(size_t(n + 2), 0xabcd);
  detail::from_f32_isa(isa, in.data() + 1, n, dt, out.data() + 1);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float f = in[size_t(i + 1)];
    const uint16_t got = out[size_t(i + 1)], want = ref_from_f32(dt, f);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << dt_str(dt) << " " << f << " (bits " << std::hex << bits_of(f) << ") -> " << got
                    << ", reference " << want;
  }
  EXPECT_EQ(bad, 0);
  for (uint32_t h = 0; h < 65536; ++h) {  // the tail of `in`: every value round-trips
    const uint16_t got = out[size_t(n - 65536 + h + 1)];
    const bool nan = std::isnan(ref_to_f32(dt, uint16_t(h)));
    if (!nan) ASSERT_EQ(got, h) << dt_str(dt) << " round trip of " << std::hex << h;
    else ASSERT_TRUE(std::isnan(ref_to_f32(dt, got))) << "NaN must stay NaN: " << std::hex << h;
  }
  EXPECT_EQ(out[0], 0xabcd);
  EXPECT_EQ(out[size_t(n + 1)], 0xabcd);
}

TEST_P(Convert, OddLengthsAtUnalignedAddressesTouchNothingElse) {
  const auto [isa, dt] = GetParam();
  for (int64_t n : {1, 7, 15, 16, 17, 31, 33, 1023})
    for (int64_t off : {0, 1, 3}) {
      auto f = randn(size_t(n + off), uint32_t(n * 7 + off), 300.f);
      for (int64_t i = 0; i < n; i += 5) f[size_t(off + i)] *= 1e-6f;  // some f16 subnormals
      std::vector<uint16_t> h(size_t(n + off + 1), 0x5555);
      detail::from_f32_isa(isa, f.data() + off, n, dt, h.data() + off);
      std::vector<float> back(size_t(n + off + 1), -9.f);
      detail::to_f32_isa(isa, dt, h.data() + off, n, back.data() + off);
      for (int64_t i = 0; i < off; ++i) ASSERT_TRUE(h[size_t(i)] == 0x5555 && back[size_t(i)] == -9.f);
      ASSERT_EQ(h[size_t(n + off)], 0x5555) << "wrote past n=" << n;
      ASSERT_EQ(back[size_t(n + off)], -9.f) << "wrote past n=" << n;
      for (int64_t i = 0; i < n; ++i) {
        const float x = f[size_t(off + i)];
        ASSERT_EQ(h[size_t(off + i)], ref_from_f32(dt, x)) << "n=" << n << " off=" << off << " i=" << i;
        ASSERT_EQ(bits_of(back[size_t(off + i)]), bits_of(ref_to_f32(dt, ref_from_f32(dt, x))));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(All, Convert,
                         ::testing::Combine(::testing::ValuesIn(available_isas()),
                                            ::testing::Values(DType::F16, DType::BF16)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, DType>>& i) {
                           return std::string(isa_str(std::get<0>(i.param))) + "_" +
                                  dt_str(std::get<1>(i.param));
                         });

TEST(ConvertPublic, F32CopiesBitsOthersThrowAndThreadsDoNotMatter) {
  const int64_t n = 200003;  // several parallel blocks
  auto f = randn(size_t(n), 21, 1e3f);
  f[5] = from_bits(0x7fa00001u);  // a signalling NaN is copied as is
  std::vector<float> g(static_cast<size_t>(n));
  to_f32(DType::F32, f.data(), n, g.data());
  EXPECT_TRUE(bit_equal(f.data(), g.data(), size_t(n)));
  std::fill(g.begin(), g.end(), 0.f);
  from_f32(f.data(), n, DType::F32, g.data());
  EXPECT_TRUE(bit_equal(f.data(), g.data(), size_t(n)));
  std::vector<uint16_t> h1(static_cast<size_t>(n)), h2(static_cast<size_t>(n));
  tbb::task_arena one(1), two(2);
  one.execute([&] { from_f32(f.data(), n, DType::F16, h1.data()); });
  two.execute([&] { from_f32(f.data(), n, DType::F16, h2.data()); });
  EXPECT_TRUE(h1 == h2);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h1[size_t(i)], f32_to_f16(f[size_t(i)])) << i;
  int32_t i32[4] = {};
  EXPECT_THROW(to_f32(DType::I32, i32, 4, g.data()), Error);
  EXPECT_THROW(from_f32(g.data(), 4, DType::U8, i32), Error);
  EXPECT_THROW(to_f32(DType::F16, h1.data(), -1, g.data()), Error);
  EXPECT_NO_THROW(to_f32(DType::F16, nullptr, 0, nullptr));
}

// ---- write_kv ---------------------------------------------------------------------------

struct KvShape {
  int64_t B, T, KV, hd, cap;
  std::vector<int32_t> seq_keys;
};
class WriteKvDtype : public ::testing::TestWithParam<std::tuple<DType, int>> {};

const std::vector<KvShape>& kv_shapes() {
  static const std::vector<KvShape> k = {
      {3, 3, 2, 5, 8, {7, 3, 2}},          // append, fill, one padding row
      {1, 1, 1, 1, 1, {1}},                // a single element
      {2, 1, 4, 80, 33, {33, 1}},          // decode into a full cache and into slot 0
      {3, 17, 3, 128, 40, {40, 5, 17}},    // prefill chunk with 12 padding rows, head_dim 128
      {2, 9, 1, 67, 9, {0, 9}},            // an idle sequence (all rows padding), odd head_dim
  };
  return k;
}

TEST_P(WriteKvDtype, EveryElementIsTheReferenceRoundingOfItsSourceRow) {
  const auto [dt, si] = GetParam();
  const KvShape& c = kv_shapes()[size_t(si)];
  const int64_t stride = c.KV * c.hd + 3, es = int64_t(dtype_size(dt));
  auto src = randn(size_t(c.B * c.T * stride), 31 + uint32_t(si), 50.f);
  for (size_t i = 0; i < src.size(); i += 11) src[i] *= 1e-7f;  // f16 subnormals and zeros
  for (size_t i = 3; i < src.size(); i += 97) src[i] = 7e4f;    // f16 overflow
  std::vector<uint8_t> cache(size_t(c.B * c.KV * c.cap * c.hd * es), 0xA5);
  write_kv(src.data(), stride, c.B, c.T, c.KV, c.hd, cache.data(), dt, c.cap, c.seq_keys.data());
  int bad = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t g = 0; g < c.KV; ++g)
      for (int64_t s = 0; s < c.cap; ++s)
        for (int64_t i = 0; i < c.hd; ++i) {
          const uint8_t* e = cache.data() + (((b * c.KV + g) * c.cap + s) * c.hd + i) * es;
          const int64_t t = s - (c.seq_keys[b] - c.T);  // source row of slot s
          std::vector<uint8_t> want(size_t(es), 0xA5);  // untouched unless a row lands here
          if (t >= 0 && t < c.T && s < c.seq_keys[b]) {
            const float x = src[size_t((b * c.T + t) * stride + g * c.hd + i)];
            if (dt == DType::F32) {
              std::memcpy(want.data(), &x, 4);
            } else {
              const uint16_t h = ref_from_f32(dt, x);
              std::memcpy(want.data(), &h, 2);
            }
          }
          if (std::memcmp(e, want.data(), size_t(es)) != 0 && bad++ < 5)
            ADD_FAILURE() << "b=" << b << " g=" << g << " slot " << s << " i=" << i;
        }
  EXPECT_EQ(bad, 0);
  if (dt == DType::F32) {  // the fp32 overload is the same op
    std::vector<float> f(size_t(c.B * c.KV * c.cap * c.hd));
    std::memcpy(f.data(), cache.data(), cache.size());
    std::vector<float> g(f.size());
    std::memcpy(g.data(), std::vector<uint8_t>(cache.size(), 0xA5).data(), cache.size());
    write_kv(src.data(), stride, c.B, c.T, c.KV, c.hd, g.data(), c.cap, c.seq_keys.data());
    EXPECT_TRUE(bit_equal(f.data(), g.data(), f.size()));
  }
  std::vector<int32_t> over = c.seq_keys;
  over.back() = int32_t(c.cap + 1);
  const auto before = cache;
  EXPECT_THROW(write_kv(src.data(), stride, c.B, c.T, c.KV, c.hd, cache.data(), dt, c.cap, over.data()),
               Error);
  EXPECT_TRUE(cache == before) << "a rejected write_kv wrote something";
}

INSTANTIATE_TEST_SUITE_P(All, WriteKvDtype,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Range(0, int(kv_shapes().size()))),
                         [](const ::testing::TestParamInfo<std::tuple<DType, int>>& i) {
                           return std::string(dt_str(std::get<0>(i.param))) + "_shape" +
                                  std::to_string(std::get<1>(i.param));
                         });

TEST(WriteKvDtype, RejectsNonFloatCache) {
  const std::vector<float> src(8, 1.f);
  std::vector<int32_t> cache(8);
  const int32_t keys[1] = {1};
  EXPECT_THROW(write_kv(src.data(), 8, 1, 1, 1, 8, cache.data(), DType::I32, 1, keys), Error);
}

// ---- kv_gather on 16-bit rows -------------------------------------------------------------

// Element (row r, slot s, i) holds a distinct 16-bit pattern, so every move is traceable.
std::vector<uint16_t> traced16(int64_t rows, int64_t cap, int64_t hd) {
  std::vector<uint16_t> c(size_t(rows * cap * hd));
  for (size_t i = 0; i < c.size(); ++i) c[i] = uint16_t(i * 7 + 1);
  return c;
}

class KvGather16 : public ::testing::TestWithParam<DType> {};

TEST_P(KvGather16, StableCompactionAndMoveLastPerHead) {
  const DType dt = GetParam();
  const int64_t B = 2, KV = 2, cap = 9, hd = 67, stride = 10;  // rows of 134 bytes
  std::vector<int32_t> keep(size_t(B * KV * stride), -99);
  std::vector<int32_t> count(size_t(B * KV));
  auto set = [&](int64_t r, std::vector<int32_t> k) {
    std::copy(k.begin(), k.end(), keep.begin() + r * stride);
    count[size_t(r)] = int32_t(k.size());
  };
  set(0, {0, 2, 3, 6, 8});              // stable compaction: evict 1, 4, 5, 7
  set(1, {0, 1, 2, 8, 4, 5, 6, 7});     // move-last: victim 3 <- last slot 8
  set(2, {1, 2, 3, 4, 5, 6, 7, 8});     // evict slot 0: every row moves down one
  set(3, {});                           // evict everything
  const auto before = traced16(B * KV, cap, hd);
  auto cache = before;
  kv_gather(cache.data(), dt, B, KV, cap, hd, keep.data(), stride, count.data());
  for (int64_t r = 0; r < B * KV; ++r)
    for (int64_t s = 0; s < cap; ++s) {
      const int64_t from = s < count[size_t(r)] ? keep[size_t(r * stride + s)] : s;  // tail unchanged
      for (int64_t i = 0; i < hd; ++i)
        ASSERT_EQ(cache[size_t((r * cap + s) * hd + i)], before[size_t((r * cap + from) * hd + i)])
            << "row " << r << " slot " << s << " i=" << i;
    }
}

TEST_P(KvGather16, RejectsBadKeepListsBeforeMovingAnything) {
  const DType dt = GetParam();
  const int64_t B = 1, KV = 2, cap = 6, hd = 3, stride = 6;
  const auto before = traced16(B * KV, cap, hd);
  auto run = [&](std::vector<int32_t> k0, std::vector<int32_t> k1) {
    std::vector<int32_t> keep(size_t(KV * stride), 0), count = {int32_t(k0.size()), int32_t(k1.size())};
    std::copy(k0.begin(), k0.end(), keep.begin());
    std::copy(k1.begin(), k1.end(), keep.begin() + stride);
    auto cache = before;
    bool threw = false;
    try {
      kv_gather(cache.data(), dt, B, KV, cap, hd, keep.data(), stride, count.data());
    } catch (const Error&) {
      threw = true;
    }
    if (threw) {
      EXPECT_TRUE(cache == before) << "cache modified by a rejected call";
    } else {
      EXPECT_FALSE(cache == before) << "a valid call moved nothing";
    }
    return threw;
  };
  EXPECT_FALSE(run({0, 2, 4}, {5, 1}));  // valid (the guard of this test itself)
  // Row 0 is valid and would move data; row 1 breaks keep[i] >= i: nothing may move.
  EXPECT_TRUE(run({1, 2, 5}, {0, 2, 1}));
  EXPECT_TRUE(run({1, 2, 5}, {0, 6}));          // keep beyond capacity
  EXPECT_TRUE(run({1, 2, 5}, {-1}));            // negative
  EXPECT_TRUE(run({0, 1, 2, 3, 4, 5, 5}, {}));  // keep_count > capacity / keep_stride
  std::vector<int32_t> keep(size_t(KV * stride), 0), count(2, 1);
  auto cache = before;
  EXPECT_THROW(kv_gather(cache.data(), DType::I64, B, KV, cap, hd, keep.data(), stride, count.data()),
               Error);
}

INSTANTIATE_TEST_SUITE_P(All, KvGather16, ::testing::Values(DType::F16, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return dt_str(i.param); });

}  // namespace
}  // namespace flexh2o::cpu::test
