// FaultyIo: test decorator around a real IoBackend that injects faults without touching
// production code: short reads (each read pass moves at most N bytes), an errno on the Nth read
// or write request, and added latency per pass. Counts are over requests seen by submit_pass.
#pragma once

#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "offload/io_backend.h"

namespace flexh2o::testing {

class FaultyIo final : public IoBackend {
 public:
  explicit FaultyIo(IoBackend& inner) : inner_(inner) {}

  // Reads transfer at most `max_bytes` per pass (0 = off); submit_and_wait must resubmit the rest.
  void set_short_reads(size_t max_bytes) { std::lock_guard lk(mu_); short_read_ = max_bytes; }
  // The nth (1-based, counted from now) write / read request fails with -err (e.g. ENOSPC, EIO).
  void fail_nth_write(int n, int err) { std::lock_guard lk(mu_); write_fail_at_ = writes_ + n; write_err_ = err; }
  void fail_nth_read(int n, int err) { std::lock_guard lk(mu_); read_fail_at_ = reads_ + n; read_err_ = err; }
  void set_latency(std::chrono::microseconds d) { std::lock_guard lk(mu_); latency_ = d; }
  int short_passes() const { std::lock_guard lk(mu_); return short_passes_; }

  Status submit_pass(std::span<IoRequest> reqs) override {
    std::unique_lock lk(mu_);
    if (latency_.count() > 0) std::this_thread::sleep_for(latency_);
    for (IoRequest& r : reqs) {
      if (r.done >= r.length) continue;
      if (r.op == IoOp::kWrite && ++writes_ == write_fail_at_) return io_errno_status(-write_err_, r);
      if (r.op == IoOp::kRead && ++reads_ == read_fail_at_) return io_errno_status(-read_err_, r);
    }
    if (short_read_ == 0) {
      lk.unlock();
      return inner_.submit_pass(reqs);
    }
    // Hand the inner backend truncated copies of the reads, then report partial progress.
    std::vector<IoRequest> sub(reqs.begin(), reqs.end());
    for (IoRequest& s : sub) {
      if (s.op != IoOp::kRead || s.done >= s.length) continue;
      if (s.length - s.done > short_read_) {
        s.length = s.done + short_read_;
        ++short_passes_;
      }
    }
    lk.unlock();
    Status st = inner_.submit_pass(sub);
    for (size_t i = 0; i < reqs.size(); ++i) reqs[i].done = sub[i].done;
    return st;
  }

  Status register_buffers(std::span<const std::span<std::byte>> bufs) override { return inner_.register_buffers(bufs); }
  void unregister_buffers() override { inner_.unregister_buffers(); }
  std::string_view name() const override { return inner_.name(); }
  unsigned queue_depth() const override { return inner_.queue_depth(); }

 private:
  IoBackend& inner_;
  mutable std::mutex mu_;
  size_t short_read_ = 0;
  long writes_ = 0, reads_ = 0, write_fail_at_ = -1, read_fail_at_ = -1;
  int write_err_ = ENOSPC, read_err_ = EIO;
  int short_passes_ = 0;
  std::chrono::microseconds latency_{0};
};

}  // namespace flexh2o::testing
