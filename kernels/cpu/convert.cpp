// to_f32 / from_f32: argument checks and the oneTBB split of a row conversion into fixed
// blocks. The conversions themselves are in detail/convert_impl.h (one per ISA); each
// element is converted alone, so neither the blocks nor the thread count change a bit.
#include <tbb/parallel_for.h>

#include <atomic>
#include <string>

#include "core/error.h"
#include "core/quant4.h"
#include "kernels/cpu/detail/isa.h"
#include "kernels/cpu/ops.h"

namespace flexh2o::cpu {
namespace detail {
namespace {

constexpr int64_t kConvertBlock = int64_t(1) << 16;  // elements per task

template <typename F>
void for_blocks(int64_t n, F&& f) {
  if (n <= kConvertBlock) return f(int64_t(0), n);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, (n + kConvertBlock - 1) / kConvertBlock),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      const int64_t i0 = r.begin() * kConvertBlock;
                      const int64_t i1 = r.end() * kConvertBlock < n ? r.end() * kConvertBlock : n;
                      f(i0, i1 - i0);
                    });
}

}  // namespace

void check_float_dtype(DType dtype, const char* what) {
  FH_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16, what, ": dtype ",
           dtype_name(dtype), " is not F32, F16 or BF16");
}

void check_kv_dtype(DType dtype, const char* what) {
  FH_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Q4, what,
           ": dtype ", dtype_name(dtype), " is not F32, F16, BF16 or Q4");
}

void to_f32_isa(Isa isa, DType src_dtype, const void* src, int64_t n, float* dst) {
  check_float_dtype(src_dtype, "to_f32");
  FH_CHECK(n >= 0, "to_f32: negative length ", n);
  if (n == 0) return;
  FH_CHECK(src && dst, "to_f32: null pointer");
  const KernelTable& kt = kernels(isa);
  const size_t es = dtype_size(src_dtype);
  for_blocks(n, [&](int64_t i0, int64_t len) {
    kt.to_f32(src_dtype, static_cast<const char*>(src) + size_t(i0) * es, len, dst + i0);
  });
}

void from_f32_isa(Isa isa, const float* src, int64_t n, DType dst_dtype, void* dst) {
  check_float_dtype(dst_dtype, "from_f32");
  FH_CHECK(n >= 0, "from_f32: negative length ", n);
  if (n == 0) return;
  FH_CHECK(src && dst, "from_f32: null pointer");
  const KernelTable& kt = kernels(isa);
  const size_t es = dtype_size(dst_dtype);
  for_blocks(n, [&](int64_t i0, int64_t len) {
    kt.from_f32(src + i0, len, dst_dtype, static_cast<char*>(dst) + size_t(i0) * es);
  });
}

void decode_q4_isa(Isa isa, const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  FH_CHECK(rows >= 0 && cols > 0 && dst_stride >= cols, "decode_q4: bad sizes rows=", rows, " cols=", cols,
           " dst_stride=", dst_stride);
  if (rows == 0) return;
  FH_CHECK(src && dst, "decode_q4: null pointer");
  const KernelTable& kt = kernels(isa);
  const int64_t rows_per_block = (kConvertBlock + cols - 1) / cols;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, rows_per_block), [&](const tbb::blocked_range<int64_t>& r) {
    kt.q4_decode(static_cast<const uint8_t*>(src) + r.begin() * q4::row_bytes(cols), r.end() - r.begin(), cols,
                 dst + r.begin() * dst_stride, dst_stride);
  });
}

}  // namespace detail

void encode_q4(DType src_dtype, const void* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
               const std::string& what) {
  detail::check_float_dtype(src_dtype, "encode_q4");
  FH_CHECK(rows >= 0 && cols > 0 && src_stride >= cols, "encode_q4: bad sizes rows=", rows, " cols=", cols,
           " src_stride=", src_stride);
  if (rows == 0) return;
  FH_CHECK(src && dst, "encode_q4: null pointer");
  const size_t es = dtype_size(src_dtype);
  auto encode = [&](int64_t r0, int64_t n) {
    const char* s = static_cast<const char*>(src) + size_t(r0 * src_stride) * es;
    uint8_t* d = static_cast<uint8_t*>(dst) + r0 * q4::row_bytes(cols);
    switch (src_dtype) {
      case DType::F16:
        return q4::encode_rows_f16(reinterpret_cast<const uint16_t*>(s), src_stride, n, cols, d, what);
      case DType::BF16:
        return q4::encode_rows_bf16(reinterpret_cast<const uint16_t*>(s), src_stride, n, cols, d, what);
      default: return q4::encode_rows(reinterpret_cast<const float*>(s), src_stride, n, cols, d, what);
    }
  };
  // A block's error would name its row within the block, so on any error the whole tensor is
  // encoded again serially, which throws the reference's error with the tensor's row number.
  std::atomic<bool> failed{false};
  const int64_t grain = (detail::kConvertBlock + cols - 1) / cols;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const tbb::blocked_range<int64_t>& r) {
    try {
      encode(r.begin(), r.end() - r.begin());
    } catch (const Error&) {
      failed = true;
    }
  });
  if (failed) encode(0, rows);
}

void decode_q4(const void* src, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  detail::decode_q4_isa(detail::best_isa(), src, rows, cols, dst, dst_stride);
}

void to_f32(DType src_dtype, const void* src, int64_t n, float* dst) {
  detail::to_f32_isa(detail::best_isa(), src_dtype, src, n, dst);
}

void from_f32(const float* src, int64_t n, DType dst_dtype, void* dst) {
  detail::from_f32_isa(detail::best_isa(), src, n, dst_dtype, dst);
}

}  // namespace flexh2o::cpu
