// copy.h and the conversions behind it: detail/convert_math.h against src/core/dtype.h on the
// CPU (every 16-bit pattern, a sweep of f32 patterns); convert on the GPU bit for bit against
// the host conversions; gather_rows from device and pinned host tables, every copy unit.
#include <algorithm>
#include <array>
#include <cfloat>
#include <limits>

#include "kernels/cuda/copy.h"
#include "kernels/cuda/detail/convert_math.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

uint32_t f32_u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float u_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f32 patterns worth converting: specials, NaN payloads, f16/bf16 overflow, subnormal and
// rounding boundaries (each 16-bit value and the midpoints next to it), then random patterns.
std::vector<uint32_t> f32_patterns() {
  std::vector<uint32_t> v = {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u, 0xff800000u,
                             0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fc0ffffu, 0xff812345u,
                             0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu};
  for (float f : {65504.f, 65519.f, 65519.99f, 65520.f, -65520.f, 1e5f, 5.9604645e-8f /* 2^-24 */,
                  2.9802322e-8f /* 2^-25, a tie to 0 */, 2.9802326e-8f, 6.1035156e-5f, 6.0975552e-5f, 1e-10f,
                  1.00390625f /* 1 + 2^-8: bf16 tie */, 1.01171875f, 1.00048828125f /* 1 + 2^-11: f16 tie */,
                  FLT_MAX, FLT_MIN, 3.3895314e38f})
    v.push_back(f32_u(f)), v.push_back(f32_u(-f));
  for (uint32_t h = 0; h < 0x10000u; h += 7) {  // around every 7th f16 and bf16 value
    for (uint32_t base : {f32_u(f16_to_f32(uint16_t(h))), uint32_t(h) << 16})
      for (uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) v.push_back(base + d);
  }
  std::mt19937 g(60);
  for (int i = 0; i < (1 << 16); ++i) v.push_back(uint32_t(g()));
  return v;
}

// ---- CPU: the device conversion code against the host reference ----------------------------

TEST(ConvertMath, SixteenBitPatternsWidenLikeHost) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    ASSERT_EQ(f32_u(detail::f16_bits_to_f32(uint16_t(h))), f32_u(f16_to_f32(uint16_t(h)))) << std::hex << h;
    ASSERT_EQ(f32_u(detail::bf16_bits_to_f32(uint16_t(h))), f32_u(bf16_to_f32(uint16_t(h)))) << std::hex << h;
  }
}

TEST(ConvertMath, F32PatternsNarrowLikeHost) {
  for (uint32_t u : f32_patterns()) {
    const float f = u_f32(u);
    ASSERT_EQ(detail::f32_to_f16_bits(f), f32_to_f16(f)) << std::hex << u;
    ASSERT_EQ(detail::f32_to_bf16_bits(f), f32_to_bf16(f)) << std::hex << u;
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {  // a sweep over all exponents (checked exhaustively once by hand)
    const float f = u_f32(uint32_t(u));
    ASSERT_EQ(detail::f32_to_f16_bits(f), f32_to_f16(f)) << std::hex << u;
    ASSERT_EQ(detail::f32_to_bf16_bits(f), f32_to_bf16(f)) << std::hex << u;
  }
}

TEST(ConvertDispatch, RejectsBadArgumentsBeforeTouchingCuda) {
  EXPECT_TRUE(convert_supported(DType::F32));
  EXPECT_TRUE(convert_supported(DType::F16));
  EXPECT_TRUE(convert_supported(DType::BF16));
  EXPECT_FALSE(convert_supported(DType::I32));
  EXPECT_FALSE(convert_supported(DType::U8));
  alignas(16) static uint8_t buf[64];
  EXPECT_THROW(convert(DType::I32, buf, 4, DType::F32, buf + 32, nullptr), Error);
  EXPECT_THROW(convert(DType::F32, buf, 4, DType::F16, buf + 8, nullptr), Error);  // overlap
  EXPECT_THROW(convert(DType::F16, buf, 4, DType::F32, buf + 4, nullptr), Error);  // overlap
  EXPECT_THROW(convert(DType::F16, buf, -1, DType::F32, buf + 32, nullptr), Error);
  convert(DType::F16, buf, 0, DType::F32, buf, nullptr);   // empty: nothing to do
  convert(DType::BF16, buf, 8, DType::BF16, buf, nullptr);  // same dtype in place: no-op
  EXPECT_THROW(gather_rows(nullptr, 1, buf, 1, 4, buf + 32, nullptr), Error);
  EXPECT_THROW(gather_rows(reinterpret_cast<int32_t*>(buf), 1, buf, 1, 0, buf + 32, nullptr), Error);
  gather_rows(nullptr, 0, nullptr, 0, 4, nullptr, nullptr);  // empty
}

// ---- GPU: convert ------------------------------------------------------------------------

class ConvertGpu : public GpuTest {
 protected:
  void check(DType src, const std::vector<uint32_t>& bits, DType dst) {
    const void* x = upload_bits(bits, src);
    void* y = alloc<uint32_t>(bits.size());
    convert(src, x, int64_t(bits.size()), dst, y, stream());
    std::vector<uint32_t> want(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) want[i] = host_convert_bits(bits[i], src, dst);
    expect_bits_equal(download_bits(y, bits.size(), dst), want, std::string("convert ") + dt_str(src) + "->" + dt_str(dst));
  }
};

TEST_F(ConvertGpu, Every16BitPatternMatchesHost) {
  std::vector<uint32_t> all(0x10000u);
  for (uint32_t h = 0; h < 0x10000u; ++h) all[h] = h;
  for (DType src : {DType::F16, DType::BF16})
    for (DType dst : {DType::F32, DType::F16, DType::BF16}) check(src, all, dst);
}

TEST_F(ConvertGpu, SelectedF32ValuesMatchHost) {
  const std::vector<uint32_t> v = f32_patterns();
  for (DType dst : {DType::F16, DType::BF16, DType::F32}) check(DType::F32, v, dst);
}

TEST_F(ConvertGpu, OddLengthsAndSubRanges) {
  for (int64_t n : {1, 3, 257}) {
    const std::vector<uint32_t> bits = random_bits(size_t(n), DType::F32, uint32_t(n));
    check(DType::F32, bits, DType::BF16);
    check(DType::BF16, random_bits(size_t(n), DType::BF16, uint32_t(n)), DType::F16);
  }
}

// ---- GPU: gather_rows --------------------------------------------------------------------

class GatherRowsGpu : public GpuTest, public ::testing::WithParamInterface<bool> {};  // pinned table?

TEST_P(GatherRowsGpu, CopiesRowsAndZerosOutOfRangeIds) {
  const bool pinned = GetParam();
  const int64_t rows = 17;
  const std::vector<int32_t> ids = {3, 0, 16, -1, 17, 5, 5, std::numeric_limits<int32_t>::max(), 9};
  const int64_t n = int64_t(ids.size());
  const int32_t* dids = upload_raw(ids);
  // (row_bytes, table offset, out offset): every copy unit 1..16 bytes, and misaligned pointers.
  const std::vector<std::array<int64_t, 3>> cases = {{2, 0, 0},  {6, 0, 0},   {130, 0, 0}, {1, 0, 0}, {3, 0, 0},
                                                     {4, 0, 0},  {24, 0, 0},  {64, 0, 0},  {4096, 0, 0},
                                                     {64, 2, 0}, {64, 0, 8},  {48, 4, 4},  {130, 1, 0}};
  const int64_t max_bytes = 4096 + 16;
  PinnedBuffer host;
  ASSERT_TRUE(PinnedBuffer::create(size_t(rows * max_bytes), &host).ok());
  uint8_t* dev_table = alloc<uint8_t>(size_t(rows * max_bytes));
  uint8_t* dev_out = alloc<uint8_t>(size_t(n * max_bytes));
  for (const auto& [row_bytes, toff, ooff] : cases) {
    std::vector<uint8_t> table(size_t(rows * row_bytes));
    std::mt19937 g(uint32_t(row_bytes * 31 + toff));
    for (auto& b : table) b = uint8_t(g());
    uint8_t* t = (pinned ? static_cast<uint8_t*>(host.data()) : dev_table) + toff;
    if (pinned)
      std::memcpy(t, table.data(), table.size());
    else
      FH_CUDA_CHECK(cudaMemcpyAsync(t, table.data(), table.size(), cudaMemcpyHostToDevice, stream()));
    const size_t out_n = size_t(n * row_bytes);
    FH_CUDA_CHECK(cudaMemsetAsync(dev_out, 0xab, out_n + size_t(ooff) + 16, stream()));  // garbage + guard tail
    gather_rows(dids, n, t, rows, row_bytes, dev_out + ooff, stream());
    const std::vector<uint8_t> got = download_raw(dev_out, out_n + size_t(ooff) + 16);
    std::vector<uint8_t> want(got.size(), 0xab);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < row_bytes; ++b) {
        const int64_t id = ids[size_t(i)];
        want[size_t(ooff + i * row_bytes + b)] = (id >= 0 && id < rows) ? table[size_t(id * row_bytes + b)] : 0;
      }
    EXPECT_EQ(got, want) << (pinned ? "pinned" : "device") << " row_bytes=" << row_bytes << " table+" << toff
                         << " out+" << ooff;
  }
}

class GatherRowsArgsGpu : public GpuTest {};

TEST_F(GatherRowsArgsGpu, RejectsPageableTable) {
  std::vector<uint8_t> pageable(64, 1);
  const int32_t* ids = upload_raw(std::vector<int32_t>{0});
  EXPECT_THROW(gather_rows(ids, 1, pageable.data(), 4, 16, alloc<uint8_t>(16), stream()), Error);
}

INSTANTIATE_TEST_SUITE_P(Tables, GatherRowsGpu, ::testing::Values(false, true),
                         [](const auto& i) { return std::string(i.param ? "pinned_host" : "device"); });

}  // namespace
}  // namespace flexh2o::gpu::test
