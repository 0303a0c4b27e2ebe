// Private to offload/: Fd, the move-only owner of a POSIX file descriptor (closed on destruction;
// a failed close is logged, never thrown, since destructors must not throw).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace flexh2o::detail {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0 && ::close(fd_) != 0) std::fprintf(stderr, "flexh2o: close(%d): %s\n", fd_, std::strerror(errno));
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace flexh2o::detail
