// to_f32 / from_f32: argument checks and the oneTBB split of a row conversion into fixed
// blocks. The conversions themselves are in detail/convert_impl.h (one per ISA); each
// element is converted alone, so neither the blocks nor the thread count change a bit.
#include <tbb/parallel_for.h>

#include "core/error.h"
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

}  // namespace detail

void to_f32(DType src_dtype, const void* src, int64_t n, float* dst) {
  detail::to_f32_isa(detail::best_isa(), src_dtype, src, n, dst);
}

void from_f32(const float* src, int64_t n, DType dst_dtype, void* dst) {
  detail::from_f32_isa(detail::best_isa(), src, n, dst_dtype, dst);
}

}  // namespace flexh2o::cpu
