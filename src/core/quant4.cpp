// Scalar reference of the Q4 row format (core/quant4.h): encode from fp32/f16/bf16 rows and
// decode to fp32. The kernels (CPU ISA variants, CUDA) must agree with these bit for bit on
// decode and on the records they write; this file is the one spelling of the math.
#include "core/quant4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace flexh2o::q4 {
namespace {

struct GroupMeta {
  uint16_t d;  // fp16 bits
  uint16_t m;
};

bool f16_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

// Scale and min of one group per the header's math; throws on values that fp16 cannot carry.
GroupMeta group_meta(const float* x, int64_t n, const std::string& what, int64_t row, int64_t g) {
  float mn = x[0], mx = x[0];
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || !f16_finite(f32_to_f16(x[i])))
      FH_FAIL("cannot compress ", what, " to 4 bits: row ", row, " group ", g, " (element ", g * kGroup + i,
              ") holds ", x[i], ", which is not a finite fp16 value");
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  GroupMeta gm;
  gm.m = f32_to_f16(mn);
  const float m = f16_to_f32(gm.m);
  gm.d = f32_to_f16((mx - m) / 15.0f);
  // Both are finite when every value is (|mx - m| / 15 < 65504); checked because the decoder
  // must never meet an infinite scale.
  FH_CHECK(f16_finite(gm.m) && f16_finite(gm.d), "cannot compress ", what, " to 4 bits: row ", row, " group ", g,
           " has min ", mn, " and max ", mx, ", beyond fp16's range");
  return gm;
}

void encode_row(const float* x, int64_t cols, uint8_t* rec, const std::string& what, int64_t row) {
  // Metadata first for every group, so a refused row leaves its record untouched.
  const int64_t ng = groups(cols);
  std::vector<GroupMeta> meta(static_cast<size_t>(ng));
  for (int64_t g = 0; g < ng; ++g)
    meta[size_t(g)] = group_meta(x + g * kGroup, std::min(kGroup, cols - g * kGroup), what, row, g);
  for (int64_t p = 0; p < meta_offset(cols); ++p) rec[p] = 0;
  for (int64_t g = 0; g < ng; ++g) {
    const float d = f16_to_f32(meta[size_t(g)].d), m = f16_to_f32(meta[size_t(g)].m);
    const int64_t end = std::min(g * kGroup + kGroup, cols);
    for (int64_t i = g * kGroup; i < end; ++i) {
      int q = 0;
      if (d != 0.0f) q = int(std::clamp(std::nearbyint((x[i] - m) / d), 0.0f, 15.0f));
      rec[i / 2] |= uint8_t(q << (4 * (i & 1)));
    }
    uint8_t* mp = rec + meta_offset(cols) + 4 * g;
    const uint16_t dm[2] = {meta[size_t(g)].d, meta[size_t(g)].m};
    for (int k = 0; k < 2; ++k) {  // little-endian whatever the host
      mp[2 * k] = uint8_t(dm[k] & 0xff);
      mp[2 * k + 1] = uint8_t(dm[k] >> 8);
    }
  }
}

void check_args(int64_t rows, int64_t cols, const void* src, const void* dst) {
  FH_CHECK(rows >= 0 && cols >= 1, "q4: bad shape [", rows, ", ", cols, "]");
  FH_CHECK(rows == 0 || (src && dst), "q4: null buffer");
}

template <typename Convert>
void encode_converted(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                      const std::string& what, Convert convert) {
  check_args(rows, cols, src, dst);
  std::vector<float> buf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    for (int64_t i = 0; i < cols; ++i) buf[size_t(i)] = convert(s[i]);
    encode_row(buf.data(), cols, static_cast<uint8_t*>(dst) + r * row_bytes(cols), what, r);
  }
}

}  // namespace

void encode_rows(const float* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                 const std::string& what) {
  check_args(rows, cols, src, dst);
  for (int64_t r = 0; r < rows; ++r)
    encode_row(src + r * src_stride, cols, static_cast<uint8_t*>(dst) + r * row_bytes(cols), what, r);
}

void encode_rows_f16(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                     const std::string& what) {
  encode_converted(src, src_stride, rows, cols, dst, what, f16_to_f32);
}

void encode_rows_bf16(const uint16_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                      const std::string& what) {
  encode_converted(src, src_stride, rows, cols, dst, what, bf16_to_f32);
}

void decode_rows(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  check_args(rows, cols, src, dst);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* rec = static_cast<const uint8_t*>(src) + r * row_bytes(cols);
    const uint8_t* meta = rec + meta_offset(cols);
    float* out = dst + r * dst_stride;
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t* mp = meta + 4 * (i / kGroup);
      const float d = f16_to_f32(uint16_t(mp[0] | mp[1] << 8));
      const float m = f16_to_f32(uint16_t(mp[2] | mp[3] << 8));
      const int q = (rec[i / 2] >> (4 * (i & 1))) & 0xf;
      out[i] = std::fmaf(float(q), d, m);
    }
  }
}

}  // namespace flexh2o::q4
