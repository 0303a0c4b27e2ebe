// IoBackend: batched positional reads/writes on file descriptors, the mechanism under DiskStore.
// Two implementations: io_uring (one ring per backend) and a pread/pwrite fallback (synchronous or
// a small thread pool). make_io_backend() probes io_uring once and falls back with a reason.
// Not a file abstraction: callers own descriptors and buffers; this only moves bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"

namespace flexh2o {

enum class IoOp : uint8_t { kRead, kWrite };

// One positional transfer. Inputs are set by the caller; `done` is in/out.
struct IoRequest {
  int fd = -1;            // in: open descriptor; O_DIRECT descriptors need kIoAlign alignment below
  uint64_t offset = 0;    // in: byte offset in the file
  void* buf = nullptr;    // in: caller-owned; must stay valid until submit_and_wait returns
  size_t length = 0;      // in: bytes to transfer
  IoOp op = IoOp::kRead;  // in
  size_t done = 0;        // in/out: bytes already transferred (0 for a new request); == length on Ok
};

enum class IoBackendChoice { kAuto, kUring, kPread };

struct IoBackendOptions {
  // io_uring: max requests in flight per ring (ring size). 128, not 16: a KV step is one batch of
  // 512-2048 requests of 4-256 KiB, and on the virtio disk here (128 device tags), in three runs of
  // bench_io kv, batches of 4 KiB pages moved 1.5-2.5x faster at 128 than at 16 (256: no better),
  // 256 KiB ranges and 1 MiB sequential requests at the same speed.
  unsigned queue_depth = 128;
  unsigned pread_threads = 1; // pread: 1 = synchronous loop in the caller; N > 1 = pool of N-1 + caller
};

// Converts a negative errno from a transfer into a Status: -ENOSPC/-EDQUOT -> kNoSpace,
// -EAGAIN/-EINTR -> retryable kIoError, anything else -> kIoError. The message names op, fd, offset.
Status io_errno_status(int neg_errno, const IoRequest& r);

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  IoBackend() = default;
  IoBackend(const IoBackend&) = delete;
  IoBackend& operator=(const IoBackend&) = delete;

  // Blocks until every request has transferred `length` bytes, or returns the first failure:
  // kIoError (-EIO etc.), kNoSpace (-ENOSPC), kShortIo (a read hit end of file: no progress).
  // Short transfers are resubmitted for the remainder and -EAGAIN/-EINTR are retried, so Ok means
  // every request is complete. On failure some requests may be partly done (see `done`).
  // Throws flexh2o::Error on misuse: fd < 0, null buffer, or (for an O_DIRECT fd) offset, length or
  // buffer address not a multiple of kIoAlign. Thread safety: see each implementation.
  [[nodiscard]] Status submit_and_wait(std::span<IoRequest> reqs);

  // One pass over the requests with done < length: implementations try to complete each one but
  // may return Ok with some still short (progress is re-checked by submit_and_wait). Called only
  // by submit_and_wait and by decorators (tests/offload/faulty_io.h); arguments are validated.
  [[nodiscard]] virtual Status submit_pass(std::span<IoRequest> reqs) = 0;

  // Optionally registers long-lived buffers (io_uring fixed buffers: no per-I/O page pinning).
  // Requests whose [buf, buf+length) lies inside a registered buffer use them automatically.
  // Buffers must outlive the registration (unregister_buffers() or backend destruction).
  // Replaces any previous registration. The default does nothing and returns Ok; a failure
  // (e.g. RLIMIT_MEMLOCK) is returned as a Status and I/O keeps working unregistered.
  [[nodiscard]] virtual Status register_buffers(std::span<const std::span<std::byte>> bufs);
  virtual void unregister_buffers() {}

  virtual std::string_view name() const = 0;  // "io_uring" or "pread"
  virtual unsigned queue_depth() const = 0;   // max transfers in flight
};

// Creates a backend. kAuto probes io_uring once (ring setup + one NOP; setup can fail in containers
// and under seccomp) and falls back to pread. kUring returns nullptr when io_uring is unavailable.
// `why` (may be null) receives a one-line note on what was chosen and, for a fallback, why.
std::unique_ptr<IoBackend> make_io_backend(IoBackendChoice choice, std::string* why,
                                           const IoBackendOptions& opts = {});

}  // namespace flexh2o
