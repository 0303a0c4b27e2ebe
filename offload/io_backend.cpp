// IoBackend common parts: argument checks, the progress loop of submit_and_wait, errno mapping,
// the pread/pwrite fallback backend and make_io_backend(). The io_uring backend is in
// uring_backend.cpp.
#include "offload/io_backend.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "offload/aligned_buffer.h"
#include "offload/detail/backends.h"

namespace flexh2o {

namespace {

// Largest single transfer handed to the kernel (Linux caps one read/write at ~2 GiB anyway).
constexpr size_t kMaxTransfer = size_t(1) << 30;

const char* op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// Misuse checks (throw). O_DIRECT descriptors additionally need kIoAlign-aligned offset, length
// and buffer; the flag is looked up once per distinct descriptor in the batch.
void validate(std::span<const IoRequest> reqs) {
  int last_fd = -1;
  bool direct = false;
  for (const IoRequest& r : reqs) {
    FH_CHECK(r.fd >= 0, "IoRequest with invalid descriptor ", r.fd);
    FH_CHECK(r.buf != nullptr || r.length == 0, "IoRequest with null buffer, length ", r.length);
    FH_CHECK(r.done <= r.length, "IoRequest done ", r.done, " > length ", r.length);
    if (r.fd != last_fd) {
      int fl = ::fcntl(r.fd, F_GETFL);
      FH_CHECK(fl >= 0, "fcntl(F_GETFL) on fd ", r.fd, ": ", std::strerror(errno));
      direct = (fl & O_DIRECT) != 0;
      last_fd = r.fd;
    }
    if (direct) {
      FH_CHECK(is_io_aligned(r.offset) && is_io_aligned(uint64_t(r.length)) && is_io_aligned(r.buf),
               "O_DIRECT ", op_name(r.op), " on fd ", r.fd, " is not ", kIoAlign,
               "-byte aligned: offset ", r.offset, ", length ", r.length, ", buffer ", r.buf);
    }
  }
}

}  // namespace

Status io_errno_status(int neg_errno, const IoRequest& r) {
  int e = -neg_errno;
  std::string msg = detail::concat(op_name(r.op), " of ", r.length - r.done, " bytes at offset ",
                                   r.offset + r.done, " (fd ", r.fd, ") failed: ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return {StatusCode::kNoSpace, msg};
  if (e == EAGAIN || e == EINTR) return {StatusCode::kIoError, msg, /*retryable=*/true};
  return {StatusCode::kIoError, msg};
}

Status IoBackend::submit_and_wait(std::span<IoRequest> reqs) {
  validate(reqs);
  std::vector<size_t> before(reqs.size());
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      before[i] = reqs[i].done;
      pending |= reqs[i].done < reqs[i].length;
    }
    if (!pending) return Status::Ok();
    Status st = submit_pass(reqs);
    if (!st.ok()) return st;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const IoRequest& r = reqs[i];
      FH_CHECK(r.done <= r.length, name(), " backend overran request: done ", r.done, " > ", r.length);
      if (r.done < r.length && r.done == before[i]) {
        return {StatusCode::kShortIo,
                detail::concat(op_name(r.op), " on fd ", r.fd, " stopped at offset ", r.offset + r.done,
                               " after ", r.done, " of ", r.length,
                               r.op == IoOp::kRead ? " bytes (end of file)" : " bytes (no progress)")};
      }
    }
  }
}

Status IoBackend::register_buffers(std::span<const std::span<std::byte>>) { return Status::Ok(); }

// --------------------------------------------------------------------------------------------
// pread/pwrite backend
// --------------------------------------------------------------------------------------------

namespace {

// Transfers what it can of one request; stops early only at end of file (return 0). Retries
// EINTR always and EAGAIN a bounded number of times.
Status transfer_one(IoRequest& r) {
  int eagain = 0;
  while (r.done < r.length) {
    size_t n = std::min(r.length - r.done, kMaxTransfer);
    auto* p = static_cast<std::byte*>(r.buf) + r.done;
    off_t off = off_t(r.offset + r.done);
    ssize_t got = r.op == IoOp::kRead ? ::pread(r.fd, p, n, off) : ::pwrite(r.fd, p, n, off);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN && ++eagain < 1000) {
        std::this_thread::yield();
        continue;
      }
      return io_errno_status(-errno, r);
    }
    if (got == 0) return Status::Ok();  // EOF: submit_and_wait reports the lack of progress
    r.done += size_t(got);
  }
  return Status::Ok();
}

// Synchronous when threads <= 1 (thread-safe without locking: no shared state). With N > 1 a pool
// of N-1 workers plus the calling thread share each batch; batches from concurrent callers are
// serialised by batch_mu_.
class PreadBackend final : public IoBackend {
 public:
  explicit PreadBackend(unsigned threads) : threads_(std::max(1u, threads)) {
    try {
      for (unsigned i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
    } catch (...) {  // a thread the system refused: the started ones must be joined, not destroyed
      stop_workers();
      throw;
    }
  }
  ~PreadBackend() override { stop_workers(); }

  Status submit_pass(std::span<IoRequest> reqs) override {
    if (workers_.empty() || reqs.size() == 1) {
      for (IoRequest& r : reqs)
        if (Status st = transfer_one(r); !st.ok()) return st;
      return Status::Ok();
    }
    std::lock_guard batch(batch_mu_);
    {
      std::lock_guard lk(mu_);
      batch_ = reqs;
      next_.store(0);
      error_ = Status::Ok();
      busy_ = unsigned(workers_.size());
      ++generation_;
    }
    work_cv_.notify_all();
    drain();
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return busy_ == 0; });
    batch_ = {};
    return error_;
  }

  std::string_view name() const override { return "pread"; }
  unsigned queue_depth() const override { return threads_; }

 private:
  void drain() {
    for (;;) {
      size_t i = next_.fetch_add(1);
      if (i >= batch_.size()) return;
      Status st = transfer_one(batch_[i]);
      if (!st.ok()) {
        std::lock_guard lk(mu_);
        if (error_.ok()) error_ = st;
        next_.store(batch_.size());  // stop handing out work
      }
    }
  }
  void worker() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard lk(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
    }
  }

  void stop_workers() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  const unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex batch_mu_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::span<IoRequest> batch_;
  std::atomic<size_t> next_{0};
  Status error_;
  unsigned busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace

namespace detail {
std::unique_ptr<IoBackend> make_pread_backend(const IoBackendOptions& opts) {
  return std::make_unique<PreadBackend>(opts.pread_threads);
}
}  // namespace detail

std::unique_ptr<IoBackend> make_io_backend(IoBackendChoice choice, std::string* why,
                                           const IoBackendOptions& opts) {
  std::string note;
  std::unique_ptr<IoBackend> b;
  if (choice == IoBackendChoice::kPread) {
    note = "pread backend (requested)";
    b = detail::make_pread_backend(opts);
  } else {
    std::string fail;
    b = detail::make_uring_backend(opts, &fail);
    if (b) {
      note = detail::concat("io_uring backend, queue depth ", b->queue_depth());
    } else if (choice == IoBackendChoice::kUring) {
      note = "io_uring requested but unavailable: " + fail;
    } else {
      note = "io_uring unavailable (" + fail + "); using pread backend";
      b = detail::make_pread_backend(opts);
    }
  }
  if (why) *why = note;
  return b;
}

}  // namespace flexh2o
