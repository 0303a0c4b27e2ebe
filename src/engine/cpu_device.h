// The CPU compute device: a bounded oneTBB arena that every CPU kernel runs inside.
// Owned by the caller (main / tests) and passed down explicitly; no global thread pool.
// run() blocks until the work is done. Thread-safe.
#pragma once

#include <tbb/task_arena.h>

#include <utility>

namespace flexh2o {

class CpuDevice {
 public:
  // threads <= 0 means all hardware threads.
  explicit CpuDevice(int threads = 0)
      : arena_(threads > 0 ? threads : tbb::task_arena::automatic) {
    arena_.initialize();
  }
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  int threads() const { return arena_.max_concurrency(); }

  template <typename F>
  decltype(auto) run(F&& f) {
    return arena_.execute(std::forward<F>(f));
  }

 private:
  tbb::task_arena arena_;
};

}  // namespace flexh2o
