// Q4 reference (core/quant4.cpp): the record layout on hand-computed examples, the per-group
// round-trip bound derived from the header's math over awkward shapes, constant groups,
// refusal of NaN/Inf/beyond-fp16 values, and f16/bf16 sources.
#include "core/quant4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace flexh2o::q4 {
namespace {

uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

TEST(Quant4, SizesOfTheRowFormat) {
  EXPECT_EQ(row_bytes(1), 4 + 4);     // 1 code byte, padded to 4, one group
  EXPECT_EQ(row_bytes(3), 4 + 4);
  EXPECT_EQ(row_bytes(8), 4 + 4);
  EXPECT_EQ(row_bytes(9), 8 + 4);     // 5 code bytes -> 8
  EXPECT_EQ(row_bytes(64), 32 + 4);
  EXPECT_EQ(row_bytes(65), 36 + 8);   // 33 -> 36, two groups
  EXPECT_EQ(row_bytes(128), 64 + 8);
  EXPECT_EQ(row_bytes(4096), 2048 + 256);  // 4.5 bits per element
  EXPECT_EQ(tensor_bytes(3, 65), 3u * 44u);
}

TEST(Quant4, LayoutOnAHandComputedExample) {
  // Row 0, one group {0, 15, 7.5}: m = 0, d = 1, q = {0, 15, rint(7.5) = 8 (half to even)}.
  // Row 1, {-2, -2, 1}: m = -2, d = f16(3/15) = f16(0.2) = 0x3266, q = {0, 0, rint(3/d)}.
  const float src[6] = {0.f, 15.f, 7.5f, -2.f, -2.f, 1.f};
  std::vector<uint8_t> rec(size_t(tensor_bytes(2, 3)), 0xAB);
  encode_rows(src, 3, 2, 3, rec.data(), "t");
  const uint8_t* r0 = rec.data();
  EXPECT_EQ(r0[0], 0xF0);  // element 0 low nibble, element 1 high nibble
  EXPECT_EQ(r0[1], 0x08);  // element 2 low, odd cols leave the high nibble 0
  EXPECT_EQ(r0[2], 0);     // padding to 4 bytes
  EXPECT_EQ(r0[3], 0);
  EXPECT_EQ(le16(r0 + 4), 0x3C00);  // d = 1.0 at meta_offset(3) = 4
  EXPECT_EQ(le16(r0 + 6), 0x0000);  // m = 0
  const uint8_t* r1 = rec.data() + row_bytes(3);
  const float d1 = f16_to_f32(0x3266);
  const int q2 = int(std::nearbyint(3.0f / d1));
  EXPECT_EQ(q2, 15);
  EXPECT_EQ(r1[0], 0x00);
  EXPECT_EQ(r1[1], q2);
  EXPECT_EQ(le16(r1 + 4), 0x3266);
  EXPECT_EQ(le16(r1 + 6), 0xC000);  // -2.0
  float out[6];
  decode_rows(rec.data(), 2, 3, out, 3);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], 15.f);
  EXPECT_EQ(out[2], 8.f);
  EXPECT_EQ(out[5], std::fmaf(15.f, d1, -2.f));
}

TEST(Quant4, SecondGroupMetaAndCodesSitWhereTheHeaderSays) {
  // 65 columns: codes 33 bytes padded to 36, group 1 = element 64 alone.
  std::vector<float> x(65);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i % 16);  // m = 0, d = 1, q = i % 16
  x[64] = 3.0f;                                                // constant group: d = 0, m = 3
  std::vector<uint8_t> rec(size_t(row_bytes(65)), 0xAB);
  encode_rows(x.data(), 65, 1, 65, rec.data(), "t");
  for (int p = 0; p < 32; ++p) EXPECT_EQ(rec[size_t(p)], uint8_t((2 * p % 16) | (2 * p + 1) % 16 << 4)) << p;
  EXPECT_EQ(rec[32], 0x00);  // element 64: q = 0 (d == 0)
  for (int p = 33; p < 36; ++p) EXPECT_EQ(rec[size_t(p)], 0) << p;
  EXPECT_EQ(le16(&rec[36]), 0x3C00);
  EXPECT_EQ(le16(&rec[38]), 0x0000);
  EXPECT_EQ(le16(&rec[40]), 0x0000);  // d of group 1
  EXPECT_EQ(le16(&rec[42]), 0x4200);  // m = 3.0
}

// The header's math, written independently: m = f16(min), d = f16((max - m) / 15).
struct Expected {
  float mn, mx, m, d, d_exact;
};
Expected expected_meta(const float* x, int64_t n) {
  Expected e{x[0], x[0], 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) e.mn = std::min(e.mn, x[i]), e.mx = std::max(e.mx, x[i]);
  e.m = f16_to_f32(f32_to_f16(e.mn));
  e.d_exact = (e.mx - e.m) / 15.0f;
  e.d = f16_to_f32(f32_to_f16(e.d_exact));
  return e;
}

// Checks every record's meta against the math and every element against the bound
// |x - y| <= |d|/2 + |mn - m| + 15 |d_exact - d| + fp32 slack: half a step when the code is not
// clamped; the rounding of m when x falls below m (clamped to 0); the rounding of d when x
// lies past m + 15 d (clamped to 15).
void check_round_trip(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> rec(size_t(tensor_bytes(rows, cols)));
  encode_rows(x.data(), cols, rows, cols, rec.data(), "w");
  std::vector<float> y(size_t(rows * cols));
  decode_rows(rec.data(), rows, cols, y.data(), cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* meta = rec.data() + r * row_bytes(cols) + meta_offset(cols);
    for (int64_t g = 0; g < groups(cols); ++g) {
      const int64_t b = g * kGroup, n = std::min(kGroup, cols - b);
      const float* xs = x.data() + r * cols + b;
      const Expected e = expected_meta(xs, n);
      ASSERT_EQ(f16_to_f32(le16(meta + 4 * g)), e.d) << "row " << r << " group " << g;
      ASSERT_EQ(f16_to_f32(le16(meta + 4 * g + 2)), e.m) << "row " << r << " group " << g;
      const float bound = std::fabs(e.d) / 2 + std::fabs(e.mn - e.m) + 15 * std::fabs(e.d_exact - e.d);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = xs[i], yi = y[size_t(r * cols + b + i)];
        ASSERT_FALSE(std::isnan(yi));
        const float slack = std::ldexp(std::fabs(xi) + std::fabs(e.m) + 16 * std::fabs(e.d), -20);
        ASSERT_LE(std::fabs(xi - yi), bound + slack)
            << "row " << r << " col " << b + i << " x " << xi << " y " << yi << " d " << e.d << " m " << e.m;
      }
    }
  }
}

class Quant4Shapes : public ::testing::TestWithParam<int64_t> {};

TEST_P(Quant4Shapes, RoundTripWithinTheGroupBound) {
  const int64_t cols = GetParam();
  std::mt19937 rng{uint32_t(cols)};
  for (int64_t rows : {1, 3, 17}) {
    std::vector<float> x(size_t(rows * cols));
    // Rows of different character: symmetric, shifted positive (m > 0), tiny, large, f16-exact.
    for (int64_t r = 0; r < rows; ++r) {
      const int kind = int(r % 5);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (int64_t i = 0; i < cols; ++i) {
        float v = u(rng);
        if (kind == 1) v = 3.f + 0.01f * v;
        if (kind == 2) v *= 1e-6f;
        if (kind == 3) v *= 60000.f;
        if (kind == 4) v = f16_to_f32(f32_to_f16(v));
        x[size_t(r * cols + i)] = v;
      }
    }
    check_round_trip(x, rows, cols);
  }
}

TEST_P(Quant4Shapes, ConstantGroupsDecodeExactlyToTheirFp16Value) {
  const int64_t cols = GetParam();
  for (float c : {0.f, -0.f, 1.f, -2.5f, 65504.f, -65504.f, f16_to_f32(0x0003) /* fp16 subnormal */, 1234.f}) {
    ASSERT_EQ(f16_to_f32(f32_to_f16(c)), c);
    std::vector<float> x(size_t(cols), c);
    std::vector<uint8_t> rec(size_t(row_bytes(cols)));
    encode_rows(x.data(), cols, 1, cols, rec.data(), "c");
    std::vector<float> y(static_cast<size_t>(cols));
    decode_rows(rec.data(), 1, cols, y.data(), cols);
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(y[size_t(i)], c) << "col " << i << " of constant " << c;
  }
  // A constant that fp16 cannot hold: m rounds, d carries the difference; within the bound.
  std::vector<float> x(size_t(cols), 1.0006f);
  check_round_trip(x, 1, cols);
}

INSTANTIATE_TEST_SUITE_P(Cols, Quant4Shapes,
                         ::testing::Values(1, 2, 3, 7, 63, 64, 65, 127, 128, 131, 4096 + 5));

TEST(Quant4, BadValuesAreRefusedNamingTensorRowAndGroupAndLeaveTheRowUntouched) {
  const int64_t cols = 131;  // 3 groups
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), 70000.f, -65520.f}) {
    std::vector<float> x(size_t(3 * cols), 0.5f);
    x[size_t(1 * cols + 130)] = bad;  // row 1, group 2
    std::vector<uint8_t> rec(size_t(tensor_bytes(3, cols)), 0xAB);
    try {
      encode_rows(x.data(), cols, 3, cols, rec.data(), "layers.3.q_proj");
      FAIL() << "accepted " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("layers.3.q_proj"), std::string::npos) << msg;
      EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("group 2"), std::string::npos) << msg;
    }
    for (int64_t b = row_bytes(cols); b < 2 * row_bytes(cols); ++b) ASSERT_EQ(rec[size_t(b)], 0xAB) << b;
  }
  // Just inside fp16's range is fine.
  std::vector<float> ok = {65519.f, -65519.f};
  std::vector<uint8_t> rec(size_t(row_bytes(2)));
  EXPECT_NO_THROW(encode_rows(ok.data(), 2, 1, 2, rec.data(), "ok"));
}

TEST(Quant4, F16AndBf16SourcesEqualConvertingThenEncoding) {
  for (int64_t cols : {1, 63, 65, 300}) {
    const int64_t rows = 5, stride = cols + 3;  // a source stride wider than the row
    std::mt19937 rng{uint32_t(cols)};
    std::uniform_int_distribution<int> bits(0, 65535);
    std::vector<uint16_t> h(size_t(rows * stride)), b(size_t(rows * stride));
    std::vector<float> hf(size_t(rows * cols)), bfv(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < stride; ++i) {
        uint16_t v;
        do v = uint16_t(bits(rng)); while (!std::isfinite(f16_to_f32(v)));
        h[size_t(r * stride + i)] = v;
        // bf16 values within fp16's range: small exponents only
        b[size_t(r * stride + i)] = uint16_t((v & 0x8000u) | 0x3c00u | (v & 0x03ffu));
        if (i < cols) {
          hf[size_t(r * cols + i)] = f16_to_f32(h[size_t(r * stride + i)]);
          bfv[size_t(r * cols + i)] = bf16_to_f32(b[size_t(r * stride + i)]);
        }
      }
    std::vector<uint8_t> a1(size_t(tensor_bytes(rows, cols))), a2(a1.size()), b1(a1.size()), b2(a1.size());
    encode_rows_f16(h.data(), stride, rows, cols, a1.data(), "h");
    encode_rows(hf.data(), cols, rows, cols, a2.data(), "h");
    EXPECT_EQ(a1, a2) << cols;
    encode_rows_bf16(b.data(), stride, rows, cols, b1.data(), "b");
    encode_rows(bfv.data(), cols, rows, cols, b2.data(), "b");
    EXPECT_EQ(b1, b2) << cols;
  }
  // A bf16 value beyond fp16's range is refused.
  const uint16_t big = f32_to_bf16(1e6f);
  std::vector<uint8_t> rec(size_t(row_bytes(1)));
  EXPECT_THROW(encode_rows_bf16(&big, 1, 1, 1, rec.data(), "big"), Error);
}

}  // namespace
}  // namespace flexh2o::q4
