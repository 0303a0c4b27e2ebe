// CUDA ops, part 3: data movement — gather_rows (rows of a device or pinned-host table by id)
// and convert (element-wise F32 / F16 / BF16). Host-only declarations; kernels in copy.cu.
// Both are asynchronous on `stream` (enqueue only); argument errors throw flexh2o::Error
// before anything is enqueued. Not for the KV cache (attention.h) nor for math (ops.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace flexh2o::gpu {

// out row i = table row ids[i] for i < n, rows of row_bytes bytes copied as-is (any element
// type). ids: device int32 [n]; an id outside [0, rows_in_table) gives a zero row (validate ids
// on the host; a kernel cannot throw). out: device memory [n, row_bytes], must not overlap table.
// The copy moves 16-byte units when row_bytes and both pointers are 16-byte aligned, else the
// widest of 8, 4, 2, 1 bytes that they all allow.
// table: device memory, or page-locked host memory read in place over PCIe (zero-copy; the
// engine streams only a step's rows of a host-homed embedding table this way). That relies on
// unified virtual addressing (64-bit Linux): memory from cudaHostAlloc / cudaMallocHost is
// device-accessible at its host address; memory from cudaHostRegister is used through its
// device alias (cudaHostGetDevicePointer, the same address on devices with
// cudaDevAttrCanUseHostPointerForRegisteredMem, e.g. A100/H100/H200 on x86-64). A pageable
// pointer (plain malloc/new) is a contract violation; it is detected and throws. The host
// memory must stay allocated and unmodified until the copy has completed on `stream`.
void gather_rows(const int32_t* ids, int64_t n, const void* table, int64_t rows_in_table,
                 int64_t row_bytes, void* out, cudaStream_t stream);

// y[i] = x[i] converted from `src` to `dst` for i < n; x, y device memory, not overlapping
// (except x == y with src == dst, a no-op). Pairs of F32, F16, BF16, bit for bit like the host
// conversions of src/core/dtype.h: widening is exact; narrowing rounds to nearest even,
// overflows to inf and keeps NaN a (quiet) NaN with its sign and top payload bits. src == dst
// copies the bytes as-is. Other dtypes throw.
void convert(DType src, const void* x, int64_t n, DType dst, void* y, cudaStream_t stream);
// True for the dtypes convert() takes (F32, F16, BF16), as src or dst.
bool convert_supported(DType dt);

}  // namespace flexh2o::gpu
