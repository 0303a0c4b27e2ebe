// Data-movement kernels of copy.h: gather_rows (one thread per copy unit of 16/8/4/2/1 bytes,
// grid-stride, 64-bit indices; pinned-host tables are read through their UVA device address)
// and convert (one thread per element, bit-level conversions of detail/convert_math.h).
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/copy.h"
#include "kernels/cuda/detail/common.cuh"

namespace flexh2o::gpu {
namespace {

// ---- gather_rows ------------------------------------------------------------------------

// U is the copy unit; a row is `units` of them. Consecutive threads take consecutive units of
// a row, so each warp reads one contiguous stretch of the table (coalesced, also over PCIe).
template <class U>
__global__ void gather_rows_kernel(const int32_t* ids, int64_t n, const U* table, int64_t rows,
                                   int64_t units, U* out) {
  const int64_t total = n * units;
  for (int64_t i = detail::global_tid(); i < total; i += detail::grid_stride()) {
    const int64_t r = i / units, u = i % units;
    const int64_t id = ids[r];
    U v{};  // zero row for an id outside the table
    if (id >= 0 && id < rows) v = table[id * units + u];
    out[i] = v;
  }
}

// The one dispatch point of gather_rows: the copy unit in bytes (16, 8, 4, 2, 1) -> type.
template <class F>
void dispatch_unit(int unit, F&& f) {
  switch (unit) {
    case 16: f(uint4{}); break;
    case 8: f(uint2{}); break;
    case 4: f(uint32_t{}); break;
    case 2: f(uint16_t{}); break;
    case 1: f(uint8_t{}); break;
    default: FH_FAIL("gather_rows: no copy unit of ", unit, " bytes");
  }
}

// Widest unit dividing row_bytes and both addresses.
int copy_unit(int64_t row_bytes, const void* a, const void* b) {
  const uint64_t m = uint64_t(row_bytes) | uint64_t(reinterpret_cast<uintptr_t>(a)) |
                     uint64_t(reinterpret_cast<uintptr_t>(b));
  for (int w : {16, 8, 4, 2})
    if (m % uint64_t(w) == 0) return w;
  return 1;
}

// The device-accessible address of `table` (itself for device memory and UVA-mapped host
// memory); throws for pageable host memory, which no kernel may read.
const void* device_address(const void* table) {
  cudaPointerAttributes at{};
  FH_CUDA_CHECK(cudaPointerGetAttributes(&at, table));
  FH_CHECK(at.type != cudaMemoryTypeUnregistered,
           "gather_rows: table is pageable host memory; it must be device memory or page-locked "
           "(cudaHostAlloc / cudaHostRegister) host memory");
  if (at.type != cudaMemoryTypeHost) return table;  // device or managed
  FH_CHECK(at.devicePointer, "gather_rows: page-locked table is not mapped into the device's address space");
  return at.devicePointer;
}

// ---- convert ----------------------------------------------------------------------------

template <class S, class D>
__global__ void convert_kernel(const S* x, int64_t n, D* y) {
  for (int64_t i = detail::global_tid(); i < n; i += detail::grid_stride()) y[i] = detail::convert_elem<D>(x[i]);
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

}  // namespace

void gather_rows(const int32_t* ids, int64_t n, const void* table, int64_t rows_in_table,
                 int64_t row_bytes, void* out, cudaStream_t stream) {
  FH_CHECK(n >= 0 && rows_in_table >= 0 && row_bytes > 0, "gather_rows: bad sizes n=", n,
           " rows_in_table=", rows_in_table, " row_bytes=", row_bytes);
  if (n == 0) return;
  FH_CHECK(ids && out && (table || rows_in_table == 0), "gather_rows: null pointer");
  // An empty table is never read (every id is out of range, every row zero).
  const void* dtable = rows_in_table > 0 ? device_address(table) : nullptr;
  const int unit = copy_unit(row_bytes, dtable, out);
  const int64_t units = row_bytes / unit;
  dispatch_unit(unit, [&](auto tag) {
    using U = decltype(tag);
    gather_rows_kernel<U><<<detail::grid_size_1d(n * units), detail::kThreads, 0, stream>>>(
        ids, n, static_cast<const U*>(dtable), rows_in_table, units, static_cast<U*>(out));
    FH_CUDA_LAUNCH_CHECK("gather_rows", stream);
  });
}

bool convert_supported(DType dt) { return detail::dispatch_float(dt, [](auto) {}); }

// The one dispatch point of convert: {F32, F16, BF16} x {F32, F16, BF16}; equal dtypes copy.
void convert(DType src, const void* x, int64_t n, DType dst, void* y, cudaStream_t stream) {
  FH_CHECK(convert_supported(src) && convert_supported(dst), "convert: unsupported dtypes ",
           dtype_name(src), " -> ", dtype_name(dst), " on CUDA (supported: F32, F16, BF16)");
  FH_CHECK(n >= 0, "convert: bad size ", n);
  if (n == 0) return;
  FH_CHECK(x && y, "convert: null pointer");
  const size_t xb = size_t(n) * dtype_size(src), yb = size_t(n) * dtype_size(dst);
  if (src == dst && x == y) return;
  FH_CHECK(!overlaps(x, xb, y, yb), "convert: x and y overlap");
  detail::dispatch_float(src, [&](auto s) {
    detail::dispatch_float(dst, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if constexpr (std::is_same_v<S, D>) {
        FH_CUDA_CHECK(cudaMemcpyAsync(y, x, xb, cudaMemcpyDeviceToDevice, stream));
      } else {
        convert_kernel<S, D><<<detail::grid_size_1d(n), detail::kThreads, 0, stream>>>(
            static_cast<const S*>(x), n, static_cast<D*>(y));
        FH_CUDA_LAUNCH_CHECK("convert", stream);
      }
    });
  });
}

}  // namespace flexh2o::gpu
