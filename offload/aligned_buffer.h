// AlignedBuffer: move-only owner of a host buffer aligned to kIoAlign (4096) for O_DIRECT I/O.
// The size is rounded up to a multiple of kIoAlign; the bytes are zero-filled on allocation.
// This is plain pageable memory, not the pinned host tier (that is an arena of PinnedBuffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace flexh2o {

// Alignment of offsets, lengths and addresses for O_DIRECT requests, in bytes.
inline constexpr size_t kIoAlign = 4096;

constexpr uint64_t align_up(uint64_t n, uint64_t a = kIoAlign) { return (n + a - 1) / a * a; }
constexpr uint64_t align_down(uint64_t n, uint64_t a = kIoAlign) { return n / a * a; }
inline bool is_io_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kIoAlign == 0; }
constexpr bool is_io_aligned(uint64_t n) { return n % kIoAlign == 0; }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates align_up(bytes) zeroed bytes (none for bytes == 0). Throws std::bad_alloc.
  explicit AlignedBuffer(size_t bytes) : size_(align_up(bytes)) {
    if (size_ == 0) return;
    data_ = static_cast<std::byte*>(::operator new(size_, std::align_val_t(kIoAlign)));
    std::memset(data_, 0, size_);
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }  // always a multiple of kIoAlign
  std::span<std::byte> span() { return {data_, size_}; }

 private:
  void release() noexcept {
    if (data_) ::operator delete(data_, size_, std::align_val_t(kIoAlign));
    data_ = nullptr;
    size_ = 0;
  }
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace flexh2o
