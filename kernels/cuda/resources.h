// RAII owners of CUDA handles: DeviceArena (one cudaMalloc slab, carved with alignment),
// PinnedBuffer (cudaHostAlloc), Stream, Event, CublasHandle. All move-only; destructors
// never throw (failures are logged to stderr). None of them is thread-safe: one owner
// thread at a time. No globals: each object is created by and passed down from the engine.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace flexh2o::gpu {

namespace detail {
// The smallest offset >= `used` at which base + offset is a multiple of `align` (a power of
// two); SIZE_MAX when that overflows. DeviceArena aligns addresses, not offsets, with it.
size_t aligned_offset(uintptr_t base, size_t used, size_t align);
}  // namespace detail

// One device slab of `budget` bytes with bump sub-allocation (default 256-byte alignment).
// Count-only mode allocates nothing: allocate() hands out nullptr and only tracks offsets, so
// a planner can size the slab (peak()) with the same code path that later allocates for real.
class DeviceArena {
 public:
  DeviceArena() = default;  // empty: budget 0
  // Count-only arena; allocate() fails beyond `budget` exactly as a real one would.
  static DeviceArena count_only(size_t budget = SIZE_MAX);
  // cudaMalloc of `budget` bytes on the current device. kOutOfBudget when the device has
  // no room (the CUDA error is cleared); throws Error on other CUDA failures.
  static Status create(size_t budget, DeviceArena* out);
  ~DeviceArena();
  DeviceArena(DeviceArena&& o) noexcept;
  DeviceArena& operator=(DeviceArena&& o) noexcept;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Sub-allocates `bytes` at an address aligned to `align` (a power of two; count-only: the
  // offset, as from base 0). kOutOfBudget, with *out
  // untouched, when it would pass the budget. Memory is uninitialised. Valid until
  // rewind()/reset() below its offset or the arena's destruction.
  Status allocate(size_t bytes, void** out, size_t align = 256);
  template <class T>
  Status allocate_n(size_t n, T** out, size_t align = 256) {
    void* p = nullptr;
    Status s = allocate(n * sizeof(T), &p, align);
    if (s.ok()) *out = static_cast<T*>(p);
    return s;
  }
  size_t offset() const { return used_; }  // a mark for rewind()
  void rewind(size_t mark);                // frees everything allocated after `mark`
  void reset() { rewind(0); }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t budget() const { return budget_; }
  bool counting() const { return counting_; }
  void* base() const { return base_; }

 private:
  void* base_ = nullptr;
  size_t budget_ = 0, used_ = 0, peak_ = 0;
  bool counting_ = false;
};

// Page-locked host memory (cudaHostAlloc), the staging area of async H2D/D2H copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // data() is a multiple of `align` (a power of two). cudaHostAlloc's own pointer need not be
  // page-aligned (small allocations have been seen 2 KiB into a page), so a larger `align` is
  // had by pinning align - 1 bytes more. kOutOfBudget when the OS refuses to pin them (the CUDA
  // error is cleared).
  static Status create(size_t bytes, PinnedBuffer* out, size_t align = 1, unsigned flags = cudaHostAllocDefault);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;  // what cudaHostAlloc returned (cudaFreeHost's)
  void* ptr_ = nullptr;   // base_, aligned up
  size_t size_ = 0;
};

// A non-blocking stream (never synchronises with the legacy default stream). Throws on failure.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;  // blocks the host; throws on an asynchronous kernel error

 private:
  cudaStream_t s_ = nullptr;
};

// A CUDA event; `timing` false creates it with cudaEventDisableTiming (cheaper for syncs).
class Event {
 public:
  explicit Event(bool timing = true);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream);
  void synchronize() const;  // blocks the host until the recorded work is done
  // Milliseconds between two recorded, completed timing events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t e_ = nullptr;
};

// A cuBLAS handle with its own device workspace (tensor-core math on by default).
// bind(stream) points handle and workspace at `stream`; the ops in ops.h call it.
class CublasHandle {
 public:
  explicit CublasHandle(size_t workspace_bytes = size_t(32) << 20);
  ~CublasHandle();
  CublasHandle(CublasHandle&& o) noexcept;
  CublasHandle& operator=(CublasHandle&& o) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }
  void bind(cudaStream_t stream);
  size_t workspace_bytes() const { return ws_bytes_; }

 private:
  void release() noexcept;
  cublasHandle_t h_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
};

}  // namespace flexh2o::gpu
