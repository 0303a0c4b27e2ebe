// RAII owners of resources.h: allocation, moves and logging destructors. Host code only.
#include "kernels/cuda/resources.h"

#include <cublas_v2.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace flexh2o::gpu {

size_t detail::aligned_offset(uintptr_t base, size_t used, size_t align) {
  const uintptr_t at = base + used, up = at + (align - 1);
  if (at < base || up < at) return SIZE_MAX;
  return size_t((up & ~uintptr_t(align - 1)) - base);
}

// ---- DeviceArena ------------------------------------------------------------------------

DeviceArena DeviceArena::count_only(size_t budget) {
  DeviceArena a;
  a.budget_ = budget;
  a.counting_ = true;
  return a;
}

Status DeviceArena::create(size_t budget, DeviceArena* out) {
  FH_CHECK(out, "DeviceArena::create: null out");
  void* p = nullptr;
  if (budget > 0) {
    const cudaError_t e = cudaMalloc(&p, budget);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return Status(StatusCode::kOutOfBudget,
                    flexh2o::detail::concat("device arena: cudaMalloc of ", budget, " bytes failed (out of device memory)"));
    }
    FH_CUDA_CHECK(e);
  }
  DeviceArena a;
  a.base_ = p;
  a.budget_ = budget;
  *out = std::move(a);
  return Status::Ok();
}

DeviceArena::~DeviceArena() {
  if (base_) FH_CUDA_LOG(cudaFree(base_));
}

DeviceArena::DeviceArena(DeviceArena&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      budget_(std::exchange(o.budget_, 0)),
      used_(std::exchange(o.used_, 0)),
      peak_(std::exchange(o.peak_, 0)),
      counting_(std::exchange(o.counting_, false)) {}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    if (base_) FH_CUDA_LOG(cudaFree(base_));
    base_ = std::exchange(o.base_, nullptr);
    budget_ = std::exchange(o.budget_, 0);
    used_ = std::exchange(o.used_, 0);
    peak_ = std::exchange(o.peak_, 0);
    counting_ = std::exchange(o.counting_, false);
  }
  return *this;
}

Status DeviceArena::allocate(size_t bytes, void** out, size_t align) {
  FH_CHECK(out, "DeviceArena::allocate: null out");
  FH_CHECK(align > 0 && (align & (align - 1)) == 0, "DeviceArena::allocate: alignment ", align,
           " is not a power of two");
  // cudaMalloc guarantees 256-byte alignment only: a larger `align` is of the address.
  const size_t start = detail::aligned_offset(reinterpret_cast<uintptr_t>(base_), used_, align);
  if (start == SIZE_MAX || start > budget_ || bytes > budget_ - start)
    return Status(StatusCode::kOutOfBudget,
                  flexh2o::detail::concat("device arena: ", bytes, " bytes do not fit (used ", used_,
                                 " of ", budget_, ")"));
  used_ = start + bytes;
  if (used_ > peak_) peak_ = used_;
  *out = counting_ ? nullptr : static_cast<char*>(base_) + start;
  return Status::Ok();
}

void DeviceArena::rewind(size_t mark) {
  FH_CHECK(mark <= used_, "DeviceArena::rewind: mark ", mark, " is past the used size ", used_);
  used_ = mark;
}

// ---- PinnedBuffer -----------------------------------------------------------------------

Status PinnedBuffer::create(size_t bytes, PinnedBuffer* out, size_t align, unsigned flags) {
  FH_CHECK(out, "PinnedBuffer::create: null out");
  FH_CHECK(align > 0 && (align & (align - 1)) == 0, "PinnedBuffer::create: alignment ", align,
           " is not a power of two");
  PinnedBuffer b;
  if (bytes > 0) {
    FH_CHECK(bytes <= SIZE_MAX - (align - 1), "PinnedBuffer::create: ", bytes, " bytes overflow");
    const size_t n = bytes + (align - 1);
    const cudaError_t e = cudaHostAlloc(&b.base_, n, flags);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return Status(StatusCode::kOutOfBudget,
                    flexh2o::detail::concat("pinned buffer: cudaHostAlloc of ", n, " bytes failed"));
    }
    FH_CUDA_CHECK(e);
    b.ptr_ = static_cast<char*>(b.base_) + detail::aligned_offset(reinterpret_cast<uintptr_t>(b.base_), 0, align);
    b.size_ = bytes;
  }
  *out = std::move(b);
  return Status::Ok();
}

PinnedBuffer::~PinnedBuffer() {
  if (base_) FH_CUDA_LOG(cudaFreeHost(base_));
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (base_) FH_CUDA_LOG(cudaFreeHost(base_));
    base_ = std::exchange(o.base_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

// ---- Stream / Event ---------------------------------------------------------------------

Stream::Stream() { FH_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) FH_CUDA_LOG(cudaStreamDestroy(s_));
}
Stream::Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) FH_CUDA_LOG(cudaStreamDestroy(s_));
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const { FH_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  FH_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) FH_CUDA_LOG(cudaEventDestroy(e_));
}
Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) FH_CUDA_LOG(cudaEventDestroy(e_));
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void Event::record(cudaStream_t stream) { FH_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void Event::synchronize() const { FH_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.f;
  FH_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, end.e_));
  return ms;
}

// ---- CublasHandle -----------------------------------------------------------------------

CublasHandle::CublasHandle(size_t workspace_bytes) : ws_bytes_(workspace_bytes) {
  FH_CUDA_CHECK(cublasCreate(&h_));
  // With fp16/bf16 outputs cuBLAS may otherwise add split-K partial sums in the output type;
  // this keeps every reduction in the fp32 compute type, which is what the CPU reference does.
  const cublasStatus_t m =
      cublasSetMathMode(h_, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (m != CUBLAS_STATUS_SUCCESS) {
    release();
    FH_CUDA_CHECK(m);
  }
  if (ws_bytes_ > 0) {
    const cudaError_t e = cudaMalloc(&ws_, ws_bytes_);
    if (e != cudaSuccess) {
      release();
      FH_CUDA_CHECK(e);
    }
  }
}
void CublasHandle::release() noexcept {
  if (h_) FH_CUDA_LOG(cublasDestroy(h_));
  if (ws_) FH_CUDA_LOG(cudaFree(ws_));
  h_ = nullptr;
  ws_ = nullptr;
}
CublasHandle::~CublasHandle() { release(); }
CublasHandle::CublasHandle(CublasHandle&& o) noexcept
    : h_(std::exchange(o.h_, nullptr)), ws_(std::exchange(o.ws_, nullptr)), ws_bytes_(std::exchange(o.ws_bytes_, 0)) {}
CublasHandle& CublasHandle::operator=(CublasHandle&& o) noexcept {
  if (this != &o) {
    release();
    h_ = std::exchange(o.h_, nullptr);
    ws_ = std::exchange(o.ws_, nullptr);
    ws_bytes_ = std::exchange(o.ws_bytes_, 0);
  }
  return *this;
}
void CublasHandle::bind(cudaStream_t stream) {
  FH_CHECK(h_, "CublasHandle::bind on a moved-from handle");
  FH_CUDA_CHECK(cublasSetStream(h_, stream));  // (resets the workspace to cuBLAS's own pool)
  if (ws_) FH_CUDA_CHECK(cublasSetWorkspace(h_, ws_, ws_bytes_));
}

}  // namespace flexh2o::gpu
