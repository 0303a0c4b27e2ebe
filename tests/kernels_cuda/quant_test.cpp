// quant.h: the layout math, the host reference (round-trip bound, packing order, constant-group
// guard, padding) on the CPU; the GPU kernels bit-identical to the host reference.
#include <algorithm>
#include <tuple>

#include "kernels/cuda/quant.h"
#include "util.h"

namespace flexh2o::gpu::test {
namespace {

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> meta;
};
Quantized quantize_host(const QuantLayout& l, const std::vector<float>& x) {
  Quantized q{std::vector<uint8_t>(size_t(l.code_bytes())), std::vector<uint16_t>(size_t(l.meta_elems()))};
  quantize_4bit_host(l, x.data(), q.codes.data(), q.meta.data());
  return q;
}

TEST(QuantLayout, ShapesFollowFlexGen) {
  // Weight [N=4096, K=1024], group_dim 0, group 64: groups run along the output rows.
  QuantLayout w = QuantLayout::of(Shape{4096, 1024}, 0, 64);
  EXPECT_EQ(w.outer, 1);
  EXPECT_EQ(w.len, 4096);
  EXPECT_EQ(w.inner, 1024);
  EXPECT_EQ(w.groups(), 64);
  EXPECT_EQ(w.code_bytes(), 4096 * 1024 / 2);
  EXPECT_EQ(w.meta_elems(), 64 * 2 * 1024);
  // 64 fp16 values -> 32 B codes + 4 B metadata = 36 B of 128 B (~72% smaller).
  EXPECT_EQ(w.code_bytes() + 2 * w.meta_elems(), w.numel() * 2 * 36 / 128);
  // KV [s, b*h, d=128], group_dim 2: two groups per vector.
  QuantLayout kv = QuantLayout::of(Shape{5, 6, 128}, 2, 64);
  EXPECT_EQ(kv.outer, 30);
  EXPECT_EQ(kv.inner, 1);
  EXPECT_EQ(kv.groups(), 2);
  // Padding: len 50 with group 64 -> one padded group.
  QuantLayout p = QuantLayout::of(Shape{3, 50, 2}, 1, 64);
  EXPECT_EQ(p.groups(), 1);
  EXPECT_EQ(p.padded_len(), 64);
  EXPECT_EQ(p.code_bytes(), 3 * 32 * 2);
  EXPECT_THROW(QuantLayout::of(Shape{4, 4}, 2, 64), Error);
  EXPECT_THROW(QuantLayout::of(Shape{4, 4}, 0, 7), Error);
}

TEST(QuantHost, PacksHighNibbleFirstWithScaleThenMin) {
  // One group of 16 values 0..15: mn 0, mx 15, scale 1, codes = values.
  QuantLayout l = QuantLayout::of(Shape{16}, 0, 16);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[size_t(i)] = float(i);
  Quantized q = quantize_host(l, x);
  ASSERT_EQ(q.codes.size(), 8u);
  EXPECT_EQ(q.codes[0], 0x01);
  EXPECT_EQ(q.codes[1], 0x23);
  EXPECT_EQ(q.codes[7], 0xEF);
  EXPECT_EQ(f16_to_f32(q.meta[0]), 1.f);  // scale
  EXPECT_EQ(f16_to_f32(q.meta[1]), 0.f);  // min
  std::vector<float> back(16);
  dequantize_4bit_host(l, q.codes.data(), q.meta.data(), back.data());
  EXPECT_EQ(back, x);
}

TEST(QuantHost, ConstantGroupIsExactAndFinite) {
  for (float c : {0.f, 1.f, -3.25f, 1000.f}) {
    QuantLayout l = QuantLayout::of(Shape{2, 64}, 1, 64);
    std::vector<float> x(128, c);
    Quantized q = quantize_host(l, x);
    for (size_t g = 0; g < 2; ++g) {
      EXPECT_EQ(f16_to_f32(q.meta[g * 2]), 65504.f);
      EXPECT_TRUE(std::isfinite(f16_to_f32(q.meta[g * 2])));
    }
    for (uint8_t b : q.codes) EXPECT_EQ(b, 0);
    std::vector<float> back(128);
    dequantize_4bit_host(l, q.codes.data(), q.meta.data(), back.data());
    for (float v : back) EXPECT_EQ(v, c);  // c is exact in fp16
  }
  // A nearly constant group (range far below 15/65504) also stays finite and close.
  QuantLayout l = QuantLayout::of(Shape{64}, 0, 64);
  std::vector<float> x(64, 0.5f);
  x[7] = 0.5f + 1e-6f;
  Quantized q = quantize_host(l, x);
  std::vector<float> back(64);
  dequantize_4bit_host(l, q.codes.data(), q.meta.data(), back.data());
  for (size_t i = 0; i < 64; ++i) EXPECT_NEAR(back[i], x[i], 1e-5f);
}

// |x - deq| <= half a step (range/30) plus fp16 rounding of min and scale, per group.
void check_round_trip(const QuantLayout& l, const std::vector<float>& x, const std::vector<float>& back) {
  const int64_t G = l.groups();
  size_t bad = 0;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < l.inner; ++i) {
        float mn = 0, mx = 0;
        bool first = true;
        for (int64_t k = 0; k < l.group_size; ++k) {
          const int64_t li = g * l.group_size + k;
          const float v = li < l.len ? x[size_t((o * l.len + li) * l.inner + i)] : 0.f;  // padding counts
          mn = first ? v : std::min(mn, v);
          mx = first ? v : std::max(mx, v);
          first = false;
        }
        const float bound = (mx - mn) / 30.f * 1.01f + 2e-3f * std::max(std::fabs(mn), std::fabs(mx)) + 1e-6f;
        for (int64_t k = 0; k < l.group_size; ++k) {
          const int64_t li = g * l.group_size + k;
          if (li >= l.len) continue;
          const size_t idx = size_t((o * l.len + li) * l.inner + i);
          if (!(std::fabs(back[idx] - x[idx]) <= bound) && ++bad <= 5)
            ADD_FAILURE() << "element " << idx << ": " << back[idx] << " vs " << x[idx] << " bound " << bound;
        }
      }
  EXPECT_EQ(bad, 0u);
}

TEST(QuantHost, RoundTripWithinHalfStep) {
  for (auto [shape, dim] : {std::tuple{Shape{130, 7}, 0}, {Shape{2, 3, 5, 128}, 3}, {Shape{3, 50, 2}, 1}}) {
    QuantLayout l = QuantLayout::of(shape, dim, 64);
    std::vector<float> x = randn(size_t(l.numel()), 40, 2.f);
    Quantized q = quantize_host(l, x);
    std::vector<float> back(x.size());
    dequantize_4bit_host(l, q.codes.data(), q.meta.data(), back.data());
    check_round_trip(l, x, back);
  }
}

class QuantGpu : public GpuTest, public ::testing::WithParamInterface<DType> {};

TEST_P(QuantGpu, BitIdenticalToHostReference) {
  const DType dt = GetParam();
  for (auto [shape, dim] : {std::tuple{Shape{130, 7}, 0}, {Shape{2, 3, 5, 128}, 3}, {Shape{3, 50, 2}, 1},
                            {Shape{1, 64}, 1}}) {
    QuantLayout l = QuantLayout::of(shape, dim, 64);
    std::vector<float> x = round_to(randn(size_t(l.numel()), 41, 2.f), dt);
    if (l.numel() == 64) std::fill(x.begin(), x.end(), 0.75f);  // constant group on the GPU
    Quantized q = quantize_host(l, x);
    uint8_t* dcodes = alloc<uint8_t>(q.codes.size());
    uint16_t* dmeta = alloc<uint16_t>(q.meta.size());
    quantize_4bit(l, dt, upload(x, dt), dcodes, dmeta, stream());
    EXPECT_EQ(download_raw(dcodes, q.codes.size()), q.codes) << shape.str();
    EXPECT_EQ(download_raw(dmeta, q.meta.size()), q.meta) << shape.str();
    std::vector<float> back(x.size());
    dequantize_4bit_host(l, q.codes.data(), q.meta.data(), back.data());
    void* dout = alloc<uint16_t>(x.size());
    dequantize_4bit(l, dcodes, dmeta, dt, dout, stream());
    expect_close(download(dout, x.size(), dt), round_to(back, dt), {0.f, 0.f}, "dequantize " + shape.str());
  }
}

// A NaN first element of a group makes its min NaN: the meta must carry the host's NaN bits
// (the cvt intrinsics would canonicalise them), and the codes of the group are all 0.
TEST_P(QuantGpu, NanGroupMetaBitsMatchHost) {
  const DType dt = GetParam();
  QuantLayout l = QuantLayout::of(Shape{2, 64}, 1, 64);
  std::vector<float> x = round_to(randn(size_t(l.numel()), 42), dt);
  x[0] = round_to({NAN}, dt)[0];  // group 0 only; group 1 stays finite
  Quantized q = quantize_host(l, x);
  uint8_t* dcodes = alloc<uint8_t>(q.codes.size());
  uint16_t* dmeta = alloc<uint16_t>(q.meta.size());
  quantize_4bit(l, dt, upload(x, dt), dcodes, dmeta, stream());
  EXPECT_EQ(download_raw(dcodes, q.codes.size()), q.codes);
  EXPECT_EQ(download_raw(dmeta, q.meta.size()), q.meta);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantGpu, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& i) { return std::string(dt_str(i.param)); });

}  // namespace
}  // namespace flexh2o::gpu::test
