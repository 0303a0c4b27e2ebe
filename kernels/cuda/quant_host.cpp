// QuantLayout and the host reference of quant.h: the same per-group math as the kernels
// (detail/quant_math.h), written as plain loops. Blocking, single-threaded.
#include "core/error.h"
#include "kernels/cuda/detail/quant_math.h"
#include "kernels/cuda/quant.h"

namespace flexh2o::gpu {

QuantLayout QuantLayout::of(const Shape& s, int group_dim, int64_t group_size) {
  FH_CHECK(s.ndim > 0 && group_dim >= 0 && group_dim < s.ndim, "QuantLayout: group_dim ", group_dim,
           " outside shape ", s.str());
  FH_CHECK(group_size > 0 && group_size % 2 == 0, "QuantLayout: group_size ", group_size,
           " must be positive and even");
  QuantLayout l;
  for (int i = 0; i < group_dim; ++i) l.outer *= s[i];
  l.len = s[group_dim];
  for (int i = group_dim + 1; i < s.ndim; ++i) l.inner *= s[i];
  l.group_size = group_size;
  return l;
}

namespace {
void check_layout(const QuantLayout& l) {
  FH_CHECK(l.outer >= 0 && l.len >= 0 && l.inner >= 0, "quantize: bad layout");
  FH_CHECK(l.group_size > 0 && l.group_size % 2 == 0, "quantize: group_size ", l.group_size,
           " must be positive and even");
}
}  // namespace

void quantize_4bit_host(const QuantLayout& l, const float* x, uint8_t* codes, uint16_t* meta) {
  check_layout(l);
  const int64_t G = l.groups(), half = l.padded_len() / 2, gs = l.group_size;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < l.inner; ++i) {
        auto at = [&](int64_t k) {
          const int64_t li = g * gs + k;
          return li < l.len ? x[(o * l.len + li) * l.inner + i] : 0.f;
        };
        float mn = at(0), mx = mn;
        for (int64_t k = 1; k < gs; ++k) {
          const float v = at(k);
          mn = v < mn ? v : mn;
          mx = v > mx ? v : mx;
        }
        const uint16_t sh = f32_to_f16(detail::quant_scale(mn, mx)), mh = f32_to_f16(mn);
        const float sc = f16_to_f32(sh), m = f16_to_f32(mh);
        meta[((o * G + g) * 2 + 0) * l.inner + i] = sh;
        meta[((o * G + g) * 2 + 1) * l.inner + i] = mh;
        for (int64_t k = 0; k < gs; k += 2) {
          const uint32_t hi = detail::quant_code(at(k), sc, m), lo = detail::quant_code(at(k + 1), sc, m);
          codes[(o * half + (g * gs + k) / 2) * l.inner + i] = uint8_t(hi << 4 | lo);
        }
      }
}

void dequantize_4bit_host(const QuantLayout& l, const uint8_t* codes, const uint16_t* meta, float* x) {
  check_layout(l);
  const int64_t G = l.groups(), half = l.padded_len() / 2;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t li = 0; li < l.len; ++li)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t g = li / l.group_size;
        const uint8_t byte = codes[(o * half + li / 2) * l.inner + i];
        const uint32_t q = (li & 1) ? (byte & 15u) : (byte >> 4);
        const float sc = f16_to_f32(meta[((o * G + g) * 2 + 0) * l.inner + i]);
        const float m = f16_to_f32(meta[((o * G + g) * 2 + 1) * l.inner + i]);
        x[(o * l.len + li) * l.inner + i] = detail::dequant_code(q, sc, m);
      }
}

}  // namespace flexh2o::gpu
