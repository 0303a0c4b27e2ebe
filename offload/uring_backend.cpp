// io_uring IoBackend: one ring per backend, at most queue_depth transfers in flight, a sliding
// window over the batch. Short transfers are requeued for the remainder, -EAGAIN/-EINTR are
// requeued, completions are matched by user_data (slot | generation) and checked.
// Thread safety: submit_pass holds a mutex, so concurrent callers are serialised on the one ring.
// Use one backend per thread for parallel rings.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "offload/detail/backends.h"

namespace flexh2o {

namespace {

constexpr size_t kMaxTransfer = size_t(1) << 30;  // fits the 32-bit SQE length
constexpr int kMaxEagain = 1000;                   // per request, then surfaced as retryable

// RAII owner of an io_uring instance.
class IoRing {
 public:
  IoRing() = default;
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;
  ~IoRing() {
    if (ok_) io_uring_queue_exit(&ring_);
  }
  // Returns 0 or -errno.
  int init(unsigned entries) {
    int rc = io_uring_queue_init(entries, &ring_, 0);
    ok_ = rc == 0;
    return rc;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool ok_ = false;
};

class UringBackend final : public IoBackend {
 public:
  explicit UringBackend(unsigned qd) : qd_(std::max(1u, qd)), slots_(qd_) {}
  int init() { return ring_.init(qd_); }

  // Submits a NOP and waits for it: some sandboxes allow setup but reject submissions.
  int probe() {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    if (!sqe) return -EBUSY;
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, 0);
    int rc = io_uring_submit_and_wait(ring_.get(), 1);
    if (rc < 0) return rc;
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_wait_cqe(ring_.get(), &cqe);
    if (rc < 0) return rc;
    int res = cqe->res;
    io_uring_cqe_seen(ring_.get(), cqe);
    return res;
  }

  Status register_buffers(std::span<const std::span<std::byte>> bufs) override {
    std::lock_guard lk(mu_);
    unregister_locked();
    if (bufs.empty()) return Status::Ok();
    std::vector<iovec> iov;
    for (auto b : bufs) iov.push_back({b.data(), b.size()});
    int rc = io_uring_register_buffers(ring_.get(), iov.data(), unsigned(iov.size()));
    if (rc < 0)
      return {StatusCode::kIoError,
              detail::concat("io_uring_register_buffers of ", iov.size(),
                             " buffers failed: ", std::strerror(-rc), " (I/O continues unregistered)")};
    registered_ = std::move(iov);
    return Status::Ok();
  }
  void unregister_buffers() override {
    std::lock_guard lk(mu_);
    unregister_locked();
  }

  std::string_view name() const override { return "io_uring"; }
  unsigned queue_depth() const override { return qd_; }

  Status submit_pass(std::span<IoRequest> reqs) override {
    std::lock_guard lk(mu_);
    std::deque<size_t> queue;  // request indices waiting for a slot
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].done < reqs[i].length) queue.push_back(i);
    std::vector<int> eagain(reqs.size(), 0);
    unsigned inflight = 0;
    Status first_error;

    while (!queue.empty() || inflight > 0) {
      // Fill free slots, unless a failure means we only drain what is in flight.
      while (first_error.ok() && !queue.empty() && inflight < qd_) {
        size_t i = queue.front();
        io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
        if (!sqe) break;
        queue.pop_front();
        prep(sqe, reqs[i], claim_slot(i));
        ++inflight;
      }
      if (inflight == 0) break;  // failure with nothing in flight
      int rc;
      do {
        rc = io_uring_submit_and_wait(ring_.get(), 1);
      } while (rc == -EINTR || rc == -EAGAIN);
      if (rc < 0) {
        // The ring itself is broken; slots stay claimed, so poison them to avoid stale matches.
        reset_slots();
        return {StatusCode::kIoError, detail::concat("io_uring_submit_and_wait failed: ",
                                                     std::strerror(-rc))};
      }
      // Reap everything that is ready.
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(ring_.get(), &cqe) == 0 && cqe) {
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(ring_.get(), cqe);
        size_t i = release_slot(ud, reqs.size());
        --inflight;
        IoRequest& r = reqs[i];
        if (res == -EINTR || (res == -EAGAIN && ++eagain[i] < kMaxEagain)) {
          queue.push_front(i);
        } else if (res < 0) {
          if (first_error.ok()) first_error = io_errno_status(res, r);
        } else if (res > 0) {
          FH_CHECK(size_t(res) <= r.length - r.done, "io_uring completion overran request");
          r.done += size_t(res);
          if (r.done < r.length) queue.push_front(i);  // short transfer: requeue the remainder
        }
        // res == 0: end of file; leave it short, submit_and_wait reports it.
      }
    }
    return first_error;
  }

 private:
  struct Slot {
    bool busy = false;
    uint32_t gen = 0;
    size_t req = 0;
  };

  void prep(io_uring_sqe* sqe, const IoRequest& r, uint64_t user_data) {
    auto* p = static_cast<std::byte*>(r.buf) + r.done;
    unsigned n = unsigned(std::min(r.length - r.done, kMaxTransfer));
    uint64_t off = r.offset + r.done;
    int idx = registered_index(p, n);
    if (r.op == IoOp::kRead) {
      if (idx >= 0)
        io_uring_prep_read_fixed(sqe, r.fd, p, n, off, idx);
      else
        io_uring_prep_read(sqe, r.fd, p, n, off);
    } else {
      if (idx >= 0)
        io_uring_prep_write_fixed(sqe, r.fd, p, n, off, idx);
      else
        io_uring_prep_write(sqe, r.fd, p, n, off);
    }
    io_uring_sqe_set_data64(sqe, user_data);
  }

  int registered_index(const std::byte* p, size_t n) const {
    for (size_t k = 0; k < registered_.size(); ++k) {
      auto* b = static_cast<const std::byte*>(registered_[k].iov_base);
      if (p >= b && p + n <= b + registered_[k].iov_len) return int(k);
    }
    return -1;
  }

  // user_data = generation << 32 | slot index; generation 0 is never used (NOP probe uses 0).
  uint64_t claim_slot(size_t req) {
    for (uint32_t s = 0; s < qd_; ++s) {
      if (!slots_[s].busy) {
        Slot& sl = slots_[s];
        sl.busy = true;
        sl.req = req;
        if (++sl.gen == 0) sl.gen = 1;
        return uint64_t(sl.gen) << 32 | s;
      }
    }
    FH_CHECK(false, "io_uring: no free slot with ", qd_, " in flight");
    return 0;
  }
  size_t release_slot(uint64_t ud, size_t nreqs) {
    uint32_t s = uint32_t(ud & 0xffffffffu);
    uint32_t gen = uint32_t(ud >> 32);
    FH_CHECK(s < qd_ && slots_[s].busy && slots_[s].gen == gen && slots_[s].req < nreqs,
             "io_uring completion with unknown user_data 0x", std::hex, ud);
    slots_[s].busy = false;  // poisoned: the generation moves on at the next claim
    return slots_[s].req;
  }
  void reset_slots() {
    for (Slot& s : slots_) s.busy = false;
  }
  void unregister_locked() {
    if (!registered_.empty()) io_uring_unregister_buffers(ring_.get());
    registered_.clear();
  }

  const unsigned qd_;
  std::mutex mu_;
  IoRing ring_;
  std::vector<Slot> slots_;
  std::vector<iovec> registered_;
};

}  // namespace

namespace detail {
std::unique_ptr<IoBackend> make_uring_backend(const IoBackendOptions& opts, std::string* why) {
  auto b = std::make_unique<UringBackend>(opts.queue_depth);
  if (int rc = b->init(); rc < 0) {
    if (why) *why = concat("io_uring_queue_init(", opts.queue_depth, ") failed: ", std::strerror(-rc));
    return nullptr;
  }
  if (int rc = b->probe(); rc < 0) {
    if (why) *why = concat("io_uring NOP probe failed: ", std::strerror(-rc));
    return nullptr;
  }
  return b;
}
}  // namespace detail

}  // namespace flexh2o
